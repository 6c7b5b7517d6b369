"""Step 2: the bundle's GPU test binary (``ferry-gpu-tests --test-threads=1``) with
``FERRY_GPU_TEST_MODEL`` set to the synthetic 1B checkpoint; records passed / failed / ignored
counts from libtest's ``test result:`` lines, the failing test names and the output's tail.
The full output is kept under logs/. A missing binary is a SKIP row ("not in bundle")."""

import argparse
import os
import re
import subprocess
import sys

import report
from common import run_step

STEP = "a gpu tests"
RESULT = re.compile(r"test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored")
FAILED = re.compile(r"^test (\S+) \.\.\. FAILED", re.MULTILINE)


def main():
    p = argparse.ArgumentParser(description="run the GPU test binary (step a)")
    p.add_argument("--out", required=True)
    p.add_argument("--binary", required=True)
    p.add_argument("--model", default="", help="FERRY_GPU_TEST_MODEL (a 1B HF dir)")
    p.add_argument("--log", required=True)
    # Inside gpu-check.sh's own timeout (GPU_CHECK_STEP_TIMEOUT), leaving time to report.
    step_limit = float(os.environ.get("GPU_CHECK_STEP_TIMEOUT", "160"))
    p.add_argument("--timeout", type=float, default=max(10.0, step_limit - 10))
    args = p.parse_args()

    if not os.path.isfile(args.binary):
        report.append_row(args.out, STEP, "gpu tests", None, verdict="SKIP",
                          note=f"not in bundle ({args.binary})")
        return 0
    env = dict(os.environ)
    if args.model:
        env["FERRY_GPU_TEST_MODEL"] = os.path.abspath(args.model)
    cmd = [args.binary, "--test-threads=1"]
    timed_out = False
    os.makedirs(os.path.dirname(os.path.abspath(args.log)), exist_ok=True)
    with open(args.log, "wb") as logf:
        logf.write(("$ FERRY_GPU_TEST_MODEL=" + env.get("FERRY_GPU_TEST_MODEL", "")
                    + " " + " ".join(cmd) + "\n").encode())
        logf.flush()
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            code = proc.wait()
    with open(args.log, encoding="utf-8", errors="replace") as f:
        text = f.read()
    passed = failed = ignored = 0
    for m in RESULT.finditer(text):
        passed += int(m.group(2))
        failed += int(m.group(3))
        ignored += int(m.group(4))
    failing = FAILED.findall(text)
    tail = [line for line in text.strip().splitlines() if line.strip()][-15:]
    ok = code == 0 and failed == 0 and passed > 0 and not timed_out
    why = ("timed out after %.0f s" % args.timeout if timed_out
           else f"exit {code}" + ("" if passed or failed else " (no test result line)"))
    data = {"exit_code": code, "timed_out": timed_out, "failing": failing, "tail": tail}
    note = why + ("; failing: " + ", ".join(failing[:8]) if failing else "")
    if not ok:
        note += "; tail: " + " / ".join(tail[-3:])
    report.append_row(args.out, STEP, "gpu tests passed/failed/ignored",
                      f"{passed}/{failed}/{ignored}", goal="all pass",
                      verdict="PASS" if ok else "FAIL", note=note[:600], data=data)
    return 0


if __name__ == "__main__":
    out_dir = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "."
    sys.exit(run_step(out_dir, STEP, main))
