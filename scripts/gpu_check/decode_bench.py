"""Step 4: ferry decode tok/s at batch 1 and batch 8 for offload modes none, auto and sequential,
against the PCIe bound, and prefill time-to-first-token with half the layers offloaded vs none.

For each mode one ``ferry serve`` is started from a generated config, used, and stopped (SIGTERM)
before the next. Mode ``auto`` gets the ``gpu_memory`` budget that keeps exactly the first half
of the layers resident (computed from ``ferry plan --json`` of mode none with the same batch and
context, see ferry_proc.budget_for_resident). The PCIe bound of a mode is
``bandwidth / streamed_bytes_per_step`` (its plan's field), with the bandwidth measured by step c
(and capped by ``link_bandwidth`` when one emulates the link on the CPU); batch 8 shares one copy
of each layer per step, so its bound is 8x that. Decode tok/s are measured by the client from
SSE token chunks: (tokens - 1) / (last - first).

Writes ``--data`` (JSON) for step f: the auto budget and ferry's numbers.
"""

import argparse
import os
import random
import subprocess
import sys

import report
from common import REPORTED, log, perf_verdict, read_json, run_step, write_json
from ferry_proc import Server, ServeConfig, add_bench_args, budget_for_resident, free_port, plan
from sse_client import aggregate_rate, concurrent_streams, decode_rate, stream_completion, ttft

STEP = "d decode"
PREFILL_STEP = "e prefill"
PCIE_GOAL = 0.9  # issue 5: streamed decode >= 90% of the PCIe bound
PREFILL_GOAL = 1.15


def prompt_ids(n, seed):
    rng = random.Random(seed)
    # Plain vocabulary ids (SmolLM2's special tokens sit below 20).
    return [rng.randrange(1000, 49000) for _ in range(n)]


def body(name, ids, max_tokens):
    return {"model": name, "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}


def mib(nbytes):
    return f"{nbytes / (1 << 20):.1f} MiB"


def round_up(n, to):
    return -(-n // to) * to


def driver_used_bytes(pid):
    """Device memory the driver reports for process `pid` (nvidia-smi), or None."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=15).stdout
    except Exception:  # noqa: BLE001 - no nvidia-smi (dry run) or it failed: no number
        return None
    for line in out.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and int(parts[0]) == pid and parts[1].isdigit():
            return int(parts[1]) << 20
    return None


def main():
    p = argparse.ArgumentParser(description="ferry decode/prefill benchmark (steps d and e)")
    add_bench_args(p)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--prefill-tokens", type=int, default=2000)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--ready-timeout", type=float, default=300)
    p.add_argument("--modes", default=None,
                   help="default: none,auto,sequential (decode), none,auto (prefill)")
    p.add_argument("--phase", choices=("decode", "prefill"), default="decode",
                   help="decode: (d) tok/s at batch 1 and N; prefill: (e) TTFT auto vs none")
    args = p.parse_args()
    global STEP
    if args.phase == "prefill":
        STEP = PREFILL_STEP
    if args.modes is None:
        args.modes = "none,auto,sequential" if args.phase == "decode" else "none,auto"

    max_context = round_up(max(args.prefill_tokens, 16) + args.tokens + 64, 256)
    base = dict(model_dir=args.model, name="bench", device=args.device, dtype=args.dtype,
                prefetch=args.prefetch, max_batch=args.batch, max_context=max_context,
                link_bandwidth=args.link_bandwidth)
    cfg_dir = os.path.join(args.logs, "configs")

    none_plan = plan(args.ferry, ServeConfig(mode="none", **base).write(
        os.path.join(cfg_dir, "plan-none.toml")), os.path.join(args.logs, "plan-none.json.log"))
    n = len(none_plan["layers"])
    k = n // 2
    budget = budget_for_resident(none_plan, k, args.prefetch)
    configs = {
        "none": ServeConfig(mode="none", **base),
        "auto": ServeConfig(mode="auto", gpu_memory=str(budget), **base),
        "sequential": ServeConfig(mode="sequential", **base),
    }
    plans = {"none": none_plan}
    for mode in ("auto", "sequential"):
        path = configs[mode].write(os.path.join(cfg_dir, f"plan-{mode}.toml"))
        plans[mode] = plan(args.ferry, path, os.path.join(args.logs, f"plan-{mode}.json.log"))
    auto_resident = sum(1 for layer in plans["auto"]["layers"] if layer["home"] == "device")
    report.append_row(
        args.out, STEP, "auto budget GiB", round(budget / (1 << 30), 3),
        verdict="PASS" if auto_resident == k else "FAIL", goal=f"{k}/{n} layers resident",
        note=f"plan: {auto_resident}/{n} layers resident, "
             f"{mib(plans['auto']['streamed_bytes_per_step'])} streamed per step; "
             f"max_batch {args.batch}, max_context {max_context}, prefetch {args.prefetch}")

    bw = read_json(args.bandwidth_json, {}).get("bytes_per_s")
    link = plans["none"].get("link_bandwidth") if args.link_bandwidth else None
    bound_bw = min(x for x in (bw, link) if x) if (bw or link) else None
    bound_src = ("measured bandwidth" if bw and (not link or bw <= link)
                 else f"emulated link {args.link_bandwidth}" if link else "none")

    data = {"budget_bytes": budget, "n_layers": n, "resident_layers_auto": k,
            "bound_bytes_per_s": bound_bw, "bound_source": bound_src, "max_context": max_context,
            "tokens": args.tokens, "batch": args.batch, "modes": {}}
    write_json(args.data, data)
    failed = False
    short_prompts = [prompt_ids(16, seed) for seed in range(args.batch)]
    long_prompt = prompt_ids(args.prefill_tokens, 99)
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        result = {}
        data["modes"][mode] = result
        streamed = plans[mode]["streamed_bytes_per_step"]
        try:
            cfg = configs[mode]
            cfg.port = free_port()
            path = cfg.write(os.path.join(cfg_dir, f"serve-{mode}.toml"))
            server_log = os.path.join(args.logs, f"ferry-serve-{mode}.log")
            with Server(args.ferry, path, server_log) as srv:
                srv.start(cfg.port)
                result["ready_s"] = srv.wait_ready(args.ready_timeout)
                stream_completion(cfg.port, body("bench", short_prompts[0], 4))  # warm-up
                if args.phase == "decode":
                    one = stream_completion(cfg.port, body("bench", short_prompts[0], args.tokens))
                    result["b1_tok_s"] = decode_rate(one)
                    log(f"{mode}: batch 1 {result['b1_tok_s']}")
                    many = concurrent_streams(
                        cfg.port, [body("bench", ids, args.tokens) for ids in short_prompts])
                    agg, window, how = aggregate_rate(many)
                    result["b%d_tok_s" % args.batch] = agg
                    log(f"{mode}: batch {args.batch} {agg} ({how}, {window:.2f} s)")
                    used = driver_used_bytes(srv.proc.pid) if srv.proc else None
                    if used is not None:
                        planned = plans[mode]["device_bytes"]
                        result["driver_used_bytes"] = used
                        report.append_row(
                            args.out, STEP, f"{mode} device memory driver/plan",
                            round(used / planned, 3), goal="<= 1",
                            verdict="PASS" if used <= planned else "FAIL",
                            note=f"nvidia-smi {mib(used)} used by ferry after batch {args.batch}, "
                                 f"plan {mib(planned)} (CUDA context in the plan's reserve)")
                if args.phase == "prefill":
                    times = []
                    for _ in range(2):
                        s = stream_completion(cfg.port, body("bench", long_prompt, 2))
                        times.append(ttft(s))
                    result["prefill_ttft_s"] = min(times)
                    log(f"{mode}: prefill TTFT {times}")
                write_json(args.data, data)
                result["exit_code"] = srv.stop()
        except Exception as e:  # noqa: BLE001 - one mode failing must not hide the others
            failed = True
            report.append_row(args.out, STEP, f"{mode}: error", None, verdict="ERROR",
                              note=f"{type(e).__name__}: {e}"[:400])
            write_json(args.data, data)
            continue
        _mode_rows(args, mode, result, streamed, bound_bw, bound_src, plans[mode])
        write_json(args.data, data)

    none_t = data["modes"].get("none", {}).get("prefill_ttft_s")
    auto_t = data["modes"].get("auto", {}).get("prefill_ttft_s")
    if none_t and auto_t:
        ratio = auto_t / none_t
        verdict, prefix = perf_verdict(ratio <= PREFILL_GOAL)
        report.append_row(
            args.out, STEP, f"prefill TTFT auto/none ({args.prefill_tokens} tokens)",
            round(ratio, 3), goal=f"<= {PREFILL_GOAL}", verdict=verdict,
            note=f"{prefix}none {none_t:.3f} s, auto ({k}/{n} resident) {auto_t:.3f} s; "
                 "best of 2")
        data["prefill_ratio"] = ratio
        write_json(args.data, data)
    return REPORTED if failed else 0


def _mode_rows(args, mode, result, streamed, bound_bw, bound_src, mode_plan):
    resident = sum(1 for layer in mode_plan["layers"] if layer["home"] == "device")
    where = f"{resident}/{len(mode_plan['layers'])} layers resident"
    b = args.batch
    decode = ((1, "b1_tok_s"), (b, f"b{b}_tok_s")) if args.phase == "decode" else ()
    for batch, key in decode:
        rate = result.get(key)
        label = "b1" if batch == 1 else f"b{batch} aggregate"
        report.append_row(args.out, STEP, f"{mode} decode {label} tok/s",
                          None if rate is None else round(rate, 2), verdict="INFO",
                          note=f"{where}; {args.tokens} tokens/request, greedy, ignore_eos; "
                               f"ready in {result.get('ready_s', 0):.1f} s")
        if streamed and bound_bw and rate:
            bound = bound_bw / streamed
            ratio = (rate / batch) / bound
            verdict, prefix = perf_verdict(ratio >= PCIE_GOAL)
            result[f"b{batch}_bound_tok_s"] = bound * batch
            result[f"b{batch}_achieved_over_bound"] = ratio
            report.append_row(
                args.out, STEP, f"{mode} {label} achieved/PCIe bound", round(ratio, 3),
                goal=f">= {PCIE_GOAL}", verdict=verdict,
                note=f"{prefix}bound {bound * batch:.2f} tok/s = {bound_bw / 1e9:.2f} GB/s "
                     f"({bound_src}) / {mib(streamed)} streamed per step"
                     + (f" x {batch} sequences" if batch > 1 else ""))
    if "prefill_ttft_s" in result:
        report.append_row(args.out, STEP, f"{mode} prefill TTFT s ({args.prefill_tokens} tokens)",
                          round(result["prefill_ttft_s"], 4), verdict="INFO", note=where)


if __name__ == "__main__":
    out_dir = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "."
    label = PREFILL_STEP if "prefill" in sys.argv else STEP
    sys.exit(run_step(out_dir, label, main))
