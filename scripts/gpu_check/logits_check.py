"""Step 6: ferry's logprobs against transformers on the same checkpoint.

Each prompt (as token ids) goes through transformers in f32 (the reference), greedy for N tokens,
taking a log-softmax of each step's logits; then through ``ferry serve`` (mode none) on the
completions endpoint with ``logprobs: 5``, ``temperature: 0`` and the same ids. Compared per
generated token, up to the first disagreement: the greedy token (by text: ferry reports each
token as ``decode([id])``, as the `tokenizers` library does here), and the logprobs of the
chosen token and of ferry's top-5 alternatives against the reference's values for the same
token texts.

When ferry computes in bf16/f16, transformers in that dtype is run too on the same token
sequence as a yardstick: the goal is a max abs difference within twice what transformers'
own low-precision run shows (and at least 0.05); in f32 the goal is 1e-3.
"""

import argparse
import os
import sys

import report
from common import (load_tokenizer, log, run_step, torch_dtype,
                    transformers_dtype_kwarg)
from ferry_proc import Server, ServeConfig, free_port
from sse_client import post_json

STEP = "b logits"
PROMPTS = (
    "The ferry left the harbour at dawn, carrying forty passengers, two cars and a crate of",
    "def add(a, b):\n    return",
    "Q: What is the capital of France?\nA:",
)
TOP = 5
REF_TOP = 20


def _load(model_dir, device, dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        model_dir, **transformers_dtype_kwarg(torch_dtype(dtype))).to(device).eval()


def reference(model_dir, prompts, n_tokens, device):
    """Greedy from the f32 model, per prompt: (steps, full sequence), each step the chosen id
    and the top REF_TOP (id, logprob)."""
    import torch

    model = _load(model_dir, device, "f32")
    out = []
    with torch.no_grad():
        for ids in prompts:
            seq, steps = list(ids), []
            for _ in range(n_tokens):
                logits = model(input_ids=torch.tensor([seq], device=device)).logits[0, -1]
                vals, idx = torch.log_softmax(logits.float(), dim=-1).topk(REF_TOP)
                top = list(zip(idx.tolist(), vals.tolist()))
                steps.append({"id": top[0][0], "top": top})
                seq.append(top[0][0])
            out.append((steps, seq))
    del model
    _free(device)
    return out


def yardstick(model_dir, prompts, refs, device, dtype):
    """Max |logprob| difference of transformers in ``dtype`` vs the f32 reference on the same
    sequences (teacher forced), over the reference's top-5 of every step."""
    import torch

    model = _load(model_dir, device, dtype)
    worst = 0.0
    with torch.no_grad():
        for ids, (steps, seq) in zip(prompts, refs):
            logits = model(input_ids=torch.tensor([seq[:-1]], device=device)).logits[0]
            lp = torch.log_softmax(logits.float(), dim=-1)
            for i, step in enumerate(steps):
                row = lp[len(ids) - 1 + i]
                for tid, ref in step["top"][:TOP]:
                    worst = max(worst, abs(row[tid].item() - ref))
    del model
    _free(device)
    return worst


def _free(device):
    import gc

    gc.collect()
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def ferry_logprobs(args, ids):
    """Ferry's (tokens, chosen logprobs, top logprobs) for ``ids``, from the running server."""
    resp = post_json(args.port, "/v1/completions", {
        "model": "ref", "prompt": ids, "max_tokens": args.tokens, "temperature": 0,
        "logprobs": TOP, "ignore_eos": True})
    lp = resp["choices"][0]["logprobs"]
    return lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]


def start_ferry(args):
    """A mode-none ``ferry serve`` of the model (caller stops it); sets ``args.port``."""
    cfg = ServeConfig(model_dir=args.model, name="ref", device=args.ferry_device,
                      dtype=args.ferry_dtype, mode="none", max_batch=1,
                      max_context=512, port=free_port())
    path = cfg.write(os.path.join(args.logs, "configs", "serve-logits.toml"))
    srv = Server(args.ferry, path, os.path.join(args.logs, "ferry-serve-logits.log"))
    srv.start(cfg.port)
    args.port = cfg.port
    try:
        srv.wait_ready(args.ready_timeout)
    except BaseException:
        srv.stop()
        raise
    return srv


def compare(tok, steps, f_tokens, f_chosen, f_top):
    """(greedy matches, compared steps, max abs diff, unmatched alternatives, detail)."""
    matches, worst, unmatched, detail = 0, 0.0, 0, []
    for i, step in enumerate(steps):
        if i >= len(f_tokens):
            break
        texts = [(tok.decode([tid], skip_special_tokens=False), lp) for tid, lp in step["top"]]
        ref_text = texts[0][0]
        ref_by_text = {}
        for text, lp in texts:
            ref_by_text.setdefault(text, lp)
        same = f_tokens[i] == ref_text
        diffs = []
        if f_chosen[i] is not None and same:
            diffs.append(abs(f_chosen[i] - texts[0][1]))
        for text, lp in (f_top[i] or {}).items():
            if text in ref_by_text:
                diffs.append(abs(lp - ref_by_text[text]))
            else:
                unmatched += 1
        step_worst = max(diffs) if diffs else 0.0
        worst = max(worst, step_worst)
        detail.append({"ferry": f_tokens[i], "reference": ref_text, "max_diff": step_worst})
        if not same:
            break
        matches += 1
    return matches, worst, unmatched, detail


def main():
    p = argparse.ArgumentParser(description="ferry logprobs vs transformers (step b)")
    p.add_argument("--out", required=True)
    p.add_argument("--ferry", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--logs", required=True)
    p.add_argument("--ferry-device", default="cuda:0")
    p.add_argument("--ferry-dtype", default="bf16", choices=("bf16", "f16", "f32"))
    p.add_argument("--torch-device", default="cuda")
    p.add_argument("--tokens", type=int, default=4)
    p.add_argument("--ready-timeout", type=float, default=300)
    args = p.parse_args()

    tok = load_tokenizer(args.model)
    prompts = [tok.encode(text, add_special_tokens=False).ids for text in PROMPTS]
    refs = reference(args.model, prompts, args.tokens, args.torch_device)
    log("reference greedy: " + "; ".join(str([s["id"] for s in steps]) for steps, _ in refs))
    if args.ferry_dtype != "f32":
        yard = yardstick(args.model, prompts, refs, args.torch_device, args.ferry_dtype)
        goal = max(0.05, 2 * yard)
        goal_text = (f"<= {goal:.3g} (2x transformers {args.ferry_dtype} vs f32 = {yard:.3g}, "
                     f"at least 0.05)")
    else:
        goal, goal_text = 1e-3, "<= 0.001 (f32)"
    matches = total = unmatched = compared = 0
    worst = 0.0
    details = []
    with start_ferry(args):
        for ids, (steps, _) in zip(prompts, refs):
            f_tokens, f_chosen, f_top = ferry_logprobs(args, ids)
            m, w, u, detail = compare(tok, steps, f_tokens, f_chosen, f_top)
            matches, total, unmatched = matches + m, total + len(steps), unmatched + u
            worst, compared = max(worst, w), compared + len(detail)
            details.append(detail)
    shown = "; ".join("".join(d["ferry"] for d in detail) + (
        "" if all(d["ferry"] == d["reference"] for d in detail)
        else " vs " + "".join(d["reference"] for d in detail)) for detail in details)
    report.append_row(args.out, STEP, "greedy tokens equal", f"{matches}/{total}",
                      goal=f"{total}/{total}", verdict="PASS" if matches == total else "FAIL",
                      note=f"{len(prompts)} prompts x {args.tokens} tokens; ferry "
                           f"{args.ferry_dtype} on {args.ferry_device} vs transformers f32 on "
                           f"{args.torch_device}; ferry's text: {shown!r}"[:600],
                      data=details)
    report.append_row(args.out, STEP, "max |logprob diff| (chosen + top-5)", round(worst, 6),
                      goal=goal_text, verdict="PASS" if worst <= goal else "FAIL",
                      note=f"over {compared} compared steps; {unmatched} ferry alternatives "
                           f"outside the reference top-{REF_TOP} (not compared)")
    return 0


if __name__ == "__main__":
    out_dir = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "."
    sys.exit(run_step(out_dir, STEP, main))
