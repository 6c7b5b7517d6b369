"""Host-to-device copy bandwidth, the yardstick for ferry's PCIe-bound decode rate.

GPU: a pinned host tensor (1 GiB by default) copied to the device with ``non_blocking=True``,
timed with CUDA events, best of N. Dry run (no GPU): a host memcpy of the same kind of buffer
(torch if importable, else numpy), best of N, reported as the CPU stand-in. GB/s are decimal
(1e9 bytes/s), as link speeds are quoted. Writes ``--json`` = {"bytes_per_s", "method"}.
"""

import argparse
import sys
import time

import report
from common import run_step, write_json

STEP = "c bandwidth"


def pinned_h2d(nbytes, reps):
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    src.fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)  # warm-up
    torch.cuda.synchronize()
    best = 0.0
    samples = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
        rate = nbytes / seconds
        samples.append(rate)
        best = max(best, rate)
    return best, samples


def host_memcpy(nbytes, reps):
    try:
        import torch

        src = torch.ones(nbytes, dtype=torch.uint8)
        dst = torch.empty(nbytes, dtype=torch.uint8)

        def copy():
            dst.copy_(src)
        how = "torch"
    except ImportError:
        import numpy as np

        src = np.ones(nbytes, dtype=np.uint8)
        dst = np.empty(nbytes, dtype=np.uint8)

        def copy():
            np.copyto(dst, src)
        how = "numpy"
    copy()  # warm-up (page faults)
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        copy()
        samples.append(nbytes / (time.perf_counter() - t0))
    return max(samples), samples, how


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--json", required=True, help="where to write the measured bandwidth")
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--cpu", action="store_true", help="dry run: host memcpy stand-in")
    args = p.parse_args()
    nbytes = args.mib << 20
    if args.cpu:
        best, samples, how = host_memcpy(nbytes, args.reps)
        method = f"host memcpy ({how}, {args.mib} MiB, best of {args.reps}); dry-run stand-in"
        metric = "host memcpy GB/s"
    else:
        best, samples = pinned_h2d(nbytes, args.reps)
        method = (f"pinned H2D (torch, {args.mib} MiB, non_blocking, cuda events, best of "
                  f"{args.reps})")
        metric = "pinned H2D GB/s"
    write_json(args.json, {"bytes_per_s": best, "method": method,
                           "samples_bytes_per_s": samples})
    report.append_row(args.out, STEP, metric, round(best / 1e9, 2), verdict="INFO",
                      note=method + "; samples " + ", ".join(f"{s / 1e9:.1f}" for s in samples))
    return 0


if __name__ == "__main__":
    out_dir = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "."
    sys.exit(run_step(out_dir, STEP, main))
