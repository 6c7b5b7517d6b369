"""Step h: speculative decoding on the card (issue 31): batch-1 decode tok/s of the large model
with every layer streamed (offload ``sequential``), without speculation and with each method,
against the PCIe bound, plus the acceptance and whether the greedy tokens are the plain ones.

Cases, one ``ferry serve`` each (started, used, stopped before the next), all on one prompt (a
random block of ids written twice, so prompt lookup has something to find):

- ``plain``: no speculation, the baseline and the reference tokens;
- ``ngram``: prompt lookup (``speculative.tokens`` 6);
- ``draft self``: the draft is the same checkpoint, every layer resident: acceptance is 1 by
  construction (the same weights compute the same greedy choices), so this row measures the
  mechanism's ceiling, tokens per streamed pass, not a real draft's quality;
- ``draft small``: the draft is the small generated model (same tokenizer, independent random
  weights): acceptance near 0, so the adaptive length must back off to (almost) plain speed.

Generated checkpoints are independent random models, so no pair of them behaves like a real
draft and target; a real pair (a model and a tenth-size sibling) needs real weights, which a
device run does not have. The PCIe bound is the link bandwidth (step c's measurement, capped by
an emulated ``link_bandwidth``) over the plan's streamed bytes per step.
"""

import argparse
import http.client
import os
import random
import re
import sys

import report
from common import REPORTED, log, perf_verdict, read_json, run_step, write_json
from ferry_proc import Server, ServeConfig, add_bench_args, free_port, plan
from sse_client import decode_rate, stream_completion

STEP = "h speculation"
SELF_GOAL = 2.0  # issue 31: decode >= 2x the non-speculative rate ...
BOUND_GOAL = 1.5  # ... and >= 1.5x the link bound
BACKOFF_GOAL = 0.9  # a useless draft costs at most a tenth


def prompt_ids(n, seed):
    rng = random.Random(seed)
    block = [rng.randrange(1000, 49000) for _ in range(n // 2)]
    return block + block


def body(ids, max_tokens):
    return {"model": "bench", "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}


def spec_counters(port):
    """(drafted, accepted) from /metrics (ferry_spec_*_tokens_total, summed over models)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode(errors="replace")
    finally:
        conn.close()

    def total(name):
        return sum(float(m) for m in re.findall(rf"^{name}{{[^}}]*}} ([0-9.e+]+)$", text, re.M))

    return total("ferry_spec_draft_tokens_total"), total("ferry_spec_accepted_tokens_total")


def main():
    p = argparse.ArgumentParser(description="ferry speculative decoding on the card (step h)")
    add_bench_args(p)
    p.add_argument("--draft-model", required=True, help="the small generated model")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--ready-timeout", type=float, default=240)
    args = p.parse_args()

    base = dict(model_dir=args.model, name="bench", device=args.device, dtype=args.dtype,
                prefetch=args.prefetch, max_batch=1, max_context=512, mode="sequential",
                tier="stream",
                link_bandwidth=args.link_bandwidth)
    cases = [
        ("plain", {}),
        ("ngram", dict(speculative="ngram", spec_tokens=6)),
        ("draft self", dict(speculative="draft", draft=args.model, spec_tokens=6)),
        ("draft small", dict(speculative="draft", draft=args.draft_model, spec_tokens=6)),
    ]
    cfg_dir = os.path.join(args.logs, "configs")
    seq_plan = plan(args.ferry, ServeConfig(**base).write(os.path.join(cfg_dir, "spec-plan.toml")),
                    os.path.join(args.logs, "spec-plan.log"))
    streamed = seq_plan.get("streamed_bytes_per_step")
    bw = read_json(args.bandwidth_json, {}).get("bytes_per_s")
    link = seq_plan.get("link_bandwidth") if args.link_bandwidth else None
    bound_bw = min(x for x in (bw, link) if x) if (bw or link) else None
    bound_src = ("measured bandwidth" if bw and (not link or bw <= link)
                 else f"emulated link {args.link_bandwidth}" if link else "none")
    bound = bound_bw / streamed if bound_bw and streamed else None

    data = {"streamed_bytes_per_step": streamed, "bound_tok_s": bound, "bound_source": bound_src,
            "tokens": args.tokens, "cases": {}}
    write_json(args.data, data)
    prompt = prompt_ids(48, 11)
    reference = None
    failed = False
    for name, extra in cases:
        result = data["cases"].setdefault(name, {})
        tag = "spec-" + name.replace(" ", "-")
        cfg = ServeConfig(**base, **extra)
        cfg.port = free_port()
        path = cfg.write(os.path.join(cfg_dir, f"{tag}.toml"))
        try:
            with Server(args.ferry, path, os.path.join(args.logs, f"ferry-serve-{tag}.log")) as srv:
                srv.start(cfg.port)
                result["ready_s"] = srv.wait_ready(args.ready_timeout)
                stream_completion(cfg.port, body(prompt, 2))  # warm-up
                before = spec_counters(cfg.port)
                run = stream_completion(cfg.port, body(prompt, args.tokens))
                after = spec_counters(cfg.port)
                result["b1_tok_s"] = decode_rate(run)
                result["texts"] = run["texts"]
                result["drafted"] = after[0] - before[0]
                result["accepted"] = after[1] - before[1]
                result["exit_code"] = srv.stop()
        except Exception as e:  # noqa: BLE001 - one case failing must not hide the others
            failed = True
            report.append_row(args.out, STEP, f"{name}: error", None, verdict="ERROR",
                              note=f"{type(e).__name__}: {e}"[:400])
            write_json(args.data, data)
            continue
        write_json(args.data, data)
        rate = result["b1_tok_s"]
        log(f"{name}: {rate} tok/s, drafted {result['drafted']}, accepted {result['accepted']}")
        _rows(args, name, result, data["cases"].get("plain", {}), bound, bound_src, streamed)
        if name == "plain":
            reference = result["texts"]
        elif reference is not None:
            same = result["texts"] == reference
            failed |= not same
            first = next((i for i, (a, b) in enumerate(zip(result["texts"], reference))
                          if a != b), min(len(result["texts"]), len(reference)))
            report.append_row(
                args.out, STEP, f"{name} greedy tokens = plain", "yes" if same else "no",
                verdict="PASS" if same else "FAIL", goal="identical",
                note=f"{len(result['texts'])} tokens" if same else
                f"first difference at token {first}")
    return REPORTED if failed else 0


def _rows(args, name, result, plain, bound, bound_src, streamed):
    rate = result.get("b1_tok_s")
    drafted, accepted = result.get("drafted", 0), result.get("accepted", 0)
    acceptance = accepted / drafted if drafted else None
    report.append_row(
        args.out, STEP, f"{name} decode b1 tok/s", None if rate is None else round(rate, 2),
        verdict="INFO",
        note=f"every layer streamed; {args.tokens} tokens, greedy; drafted {drafted:.0f}, "
             f"accepted {accepted:.0f}"
             + (f" (acceptance {acceptance:.2f})" if acceptance is not None else "")
             + f"; ready in {result.get('ready_s', 0):.1f} s")
    base_rate = plain.get("b1_tok_s")
    if name != "plain" and rate and base_rate:
        ratio = rate / base_rate
        goal = {"draft self": SELF_GOAL, "draft small": BACKOFF_GOAL}.get(name)
        if goal is None:
            verdict, prefix = "INFO", ""
        else:
            verdict, prefix = perf_verdict(ratio >= goal)
        report.append_row(args.out, STEP, f"{name} / plain", round(ratio, 3),
                          goal=f">= {goal}" if goal else "-", verdict=verdict,
                          note=f"{prefix}plain {base_rate:.2f} tok/s")
    if rate and bound:
        ratio = rate / bound
        goal = BOUND_GOAL if name == "draft self" else None
        verdict, prefix = perf_verdict(ratio >= goal) if goal else ("INFO", "")
        report.append_row(
            args.out, STEP, f"{name} achieved/PCIe bound", round(ratio, 3),
            goal=f">= {goal}" if goal else "-", verdict=verdict,
            note=f"{prefix}bound {bound:.2f} tok/s = link ({bound_src}) / "
                 f"{streamed / (1 << 20):.1f} MiB streamed per step")


if __name__ == "__main__":
    out_dir = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "."
    sys.exit(run_step(out_dir, STEP, main))
