"""Plumbing shared by the GPU-check steps: SIGTERM handling, the "already reported" exit code,
reading the JSON files steps hand each other, and the few torch/transformers helpers that differ
between library versions."""

import json
import os
import signal
import sys
import time
import traceback

import report

# Exit code of a step that failed and already wrote its own error row (gpu-check.sh adds none).
REPORTED = 3


def _exit_on_sigterm(signum, _frame):
    # SystemExit unwinds through `finally`/`with`, so servers started by the step get stopped.
    raise SystemExit(128 + signum)


def run_step(out_dir, step, main):
    """Runs ``main()`` (returning an exit code); an exception becomes an ERROR row and REPORTED."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        return main() or 0
    except SystemExit:
        raise
    except KeyboardInterrupt:
        return 130
    except BaseException as e:  # noqa: BLE001 - every failure must become a row
        traceback.print_exc()
        report.append_row(out_dir, step, "error", None, verdict="ERROR",
                          note=f"{type(e).__name__}: {e}"[:400])
        return REPORTED


def perf_verdict(ok):
    """(verdict, note prefix) for a performance goal. In a dry run (FERRY_GPU_CHECK_DRY_RUN=1)
    CPU numbers say nothing about the GPU goals, so they are INFO with what they would be."""
    verdict = "PASS" if ok else "FAIL"
    if os.environ.get("FERRY_GPU_CHECK_DRY_RUN") == "1":
        return "INFO", f"dry run, not judged (would be {verdict}); "
    return verdict, ""


def read_json(path, default=None):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return default


def write_json(path, value):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def torch_dtype(name):
    import torch

    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[name]


def transformers_dtype_kwarg(dtype):
    """``{"dtype": d}`` on transformers >= 4.56 (where ``torch_dtype`` is deprecated), else
    ``{"torch_dtype": d}`` (older versions silently ignore ``dtype``)."""
    import transformers

    parts = transformers.__version__.split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        major, minor = 5, 0
    if (major, minor) >= (4, 56):
        return {"dtype": dtype}
    return {"torch_dtype": dtype}


def load_tokenizer(model_dir):
    """The model's tokenizer.json through the `tokenizers` library (what ferry uses too), so
    token texts compare exactly and no transformers tokenizer class needs to resolve."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))


def sync(device):
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize()
