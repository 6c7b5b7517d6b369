"""Step 5: Hugging Face accelerate (``device_map="auto"``) on the same weights and the same
``max_memory`` budget as ferry's mode auto: decode tok/s at batch 1, greedy, and the ratio
ferry / accelerate.

Tokens come from ``model.generate`` (greedy, KV cache) with a streamer that timestamps each one;
the rate is (tokens - 1) / (time of last token - time of first token), the same definition the
ferry client uses. On the CPU (dry run) ``device_map`` can only be "cpu": the run goes end to
end but the ratio is reported as not comparable.
"""

import argparse
import os
import sys
import time

import report
from common import (REPORTED, log, perf_verdict, read_json, run_step, torch_dtype,
                    transformers_dtype_kwarg)

STEP = "f accelerate"
RATIO_GOAL = 4.0


class TokenClock:
    """A generate() streamer that timestamps each new token. generate() calls ``put`` with the
    prompt first, then once per generated token with a host tensor (so the device has synced)."""

    def __init__(self):
        self.times = []
        self._prompt_seen = False

    def put(self, _value):
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())

    def end(self):
        pass


def checkpoint_bytes(model_dir):
    return sum(os.path.getsize(os.path.join(model_dir, f)) for f in os.listdir(model_dir)
               if f.endswith(".safetensors"))


def main():
    p = argparse.ArgumentParser(description="accelerate device_map=auto decode (step f)")
    p.add_argument("--out", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--decode-data", required=True, help="step d's JSON (budget, ferry rates)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "f16", "f32"))
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--cpu", action="store_true", help="dry run: device_map='cpu'")
    p.add_argument("--cpu-memory", default="110GiB")
    args = p.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    ferry = read_json(args.decode_data, {})
    budget = ferry.get("budget_bytes")
    budget_note = "ferry's auto budget"
    if not budget:
        # Step 4 did not plan: half the checkpoint, so that accelerate still offloads about half.
        budget = checkpoint_bytes(args.model) // 2
        budget_note = "half the checkpoint (no budget from step d)"
    if args.cpu:
        device_map, max_memory, device = "cpu", None, "cpu"
    else:
        device_map, max_memory, device = "auto", {0: int(budget), "cpu": args.cpu_memory}, "cuda:0"
    t0 = time.monotonic()
    kwargs = dict(device_map=device_map, **transformers_dtype_kwarg(torch_dtype(args.dtype)))
    if max_memory:
        kwargs["max_memory"] = max_memory
    model = AutoModelForCausalLM.from_pretrained(args.model, **kwargs)
    model.eval()
    load_s = time.monotonic() - t0
    placement = getattr(model, "hf_device_map", {}) or {}
    on_gpu = ("0", "cuda:0")
    on_device = sum(1 for k, v in placement.items() if ".layers." in k and str(v) in on_gpu)
    n_layers = model.config.num_hidden_layers
    if placement and not any(".layers." in k for k in placement):
        # Whole-model entries (e.g. {"": "cpu"} or {"": 0}).
        on_device = n_layers if str(placement.get("", "")) in on_gpu else 0
    log(f"accelerate loaded in {load_s:.1f} s; placement {placement}")

    ids = torch.tensor([[1000 + (37 * i) % 48000 for i in range(16)]], device=device)
    times = TokenClock()
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                       max_new_tokens=args.tokens, min_new_tokens=args.tokens,
                       streamer=times, pad_token_id=0)
    times = times.times
    if len(times) < 2:
        raise RuntimeError(f"generate produced {len(times)} tokens")
    rate = (len(times) - 1) / (times[-1] - times[0])
    where = (f"{on_device}/{n_layers} layers on {device}, max_memory {max_memory} "
             f"({budget_note})" if not args.cpu else "device_map='cpu'")
    report.append_row(args.out, STEP, "accelerate decode b1 tok/s", round(rate, 3),
                      verdict="INFO",
                      note=f"{where}; {args.tokens} greedy tokens, KV cache; load {load_s:.1f} s")
    ferry_rate = ferry.get("modes", {}).get("auto", {}).get("b1_tok_s")
    if ferry_rate is None:
        report.append_row(args.out, STEP, "ferry/accelerate (auto, b1)", None, verdict="SKIP",
                          goal=f">= {RATIO_GOAL}x", note="no ferry auto b1 rate from step d")
        return REPORTED
    ratio = ferry_rate / rate
    if args.cpu:
        verdict, note = "INFO", "not comparable on CPU (device_map can only be 'cpu'); "
    else:
        verdict, note = perf_verdict(ratio >= RATIO_GOAL)
    report.append_row(args.out, STEP, "ferry/accelerate (auto, b1)", round(ratio, 2),
                      goal=f">= {RATIO_GOAL}x", verdict=verdict,
                      note=f"{note}ferry {ferry_rate:.2f} tok/s vs accelerate {rate:.3f} tok/s")
    return 0


if __name__ == "__main__":
    out_dir = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "."
    sys.exit(run_step(out_dir, STEP, main))
