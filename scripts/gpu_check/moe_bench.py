"""Step g: decode tok/s of a Qwen3-30B-A3B-shaped MoE model (make_moe_model.py) with part of it
offloaded, per tier, against the PCIe bound.

Cases, one ``ferry serve`` each (started, used, stopped before the next):

- experts as placement units (``offload.experts = true``), half the experts offloaded (the
  budget of mode none less half the expert bytes plus the expert pool), ``offload.tier`` =
  stream / host / auto;
- the same with the weights quantized to q8_0 at load (``dtype = "q8_0"``): experts of GGUF
  blocks, which have a host tier on CUDA too (issue 30: their pinned slabs computed in place by
  the CPU kernels while the GPU runs the rest), so host and auto rows there are the CUDA host
  tier's;
- whole layers (``offload.experts = false``), half the layers offloaded, tier stream / host /
  auto.

The PCIe bound of a case is the link bandwidth (step c's measurement, capped by an emulated
``link_bandwidth``) over the bytes its plan moves per decode token: the routed-expert estimate
(``experts.bytes_per_token``) with experts, ``streamed_bytes_per_step`` with whole layers. The
host tier moves only activations, so it has no such bound (its row says so). A case ferry
refuses to load (e.g. a tier not implemented on this device: on CUDA a forced host tier for
whole layers, and for experts held dense, as this bf16 model's are) is a SKIP row with ferry's
reason. On CUDA ``offload.experts`` places experts (the CUDA expert pool; dense experts always
stream there, so tier auto streams too; q8_0 ones are decided per expert and step); each row
names what its plan placed.
"""

import argparse
import json
import os
import random
import sys

import report
from common import REPORTED, log, read_json, run_step, write_json
from ferry_proc import Server, ServeConfig, add_bench_args, budget_for_resident, free_port, plan
from sse_client import decode_rate, stream_completion

STEP = "g moe"
ELEM = {"bf16": 2, "f16": 2, "f32": 4, "auto": 2, "q8_0": 34 / 32}


def prompt_ids(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(1000, 49000) for _ in range(n)]


def body(ids, max_tokens):
    return {"model": "moe", "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}


def mib(nbytes):
    return f"{nbytes / (1 << 20):.1f} MiB"


def main():
    p = argparse.ArgumentParser(description="ferry MoE decode per tier (step g)")
    add_bench_args(p)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--prefetch", type=int, default=1)
    p.add_argument("--ready-timeout", type=float, default=240)
    args = p.parse_args()

    with open(os.path.join(args.model, "config.json"), encoding="utf-8") as f:
        hf = json.load(f)
    n_layers = hf["num_hidden_layers"]
    n_experts = hf.get("num_experts") or hf["num_local_experts"]
    expert_bytes = 3 * hf["hidden_size"] * hf["moe_intermediate_size"] * ELEM[args.dtype]
    base = dict(model_dir=args.model, name="moe", device=args.device, dtype=args.dtype,
                prefetch=args.prefetch, max_batch=1, max_context=512,
                link_bandwidth=args.link_bandwidth)
    cfg_dir = os.path.join(args.logs, "configs")
    none_plan = plan(args.ferry, ServeConfig(mode="none", experts=False, **base).write(
        os.path.join(cfg_dir, "moe-plan-none.toml")), os.path.join(args.logs, "moe-plan-none.log"))
    half = n_layers * n_experts // 2
    pool = hf["num_experts_per_tok"]
    experts_budget = none_plan["device_bytes"] - half * expert_bytes + pool * expert_bytes
    # Half the layers resident; with few layers the ring would hold the rest (k resident and
    # prefetch p offload anything only when k + p + 1 < n), so whole layers prefetch less.
    layers_prefetch = max(0, min(args.prefetch, n_layers - n_layers // 2 - 2))
    # A quarter layer of slack: slot padding fits, another layer does not.
    layer_bytes = max(layer["bytes"] for layer in none_plan["layers"])
    layers_budget = (budget_for_resident(none_plan, n_layers // 2, layers_prefetch)
                     + layer_bytes // 4)

    bw = read_json(args.bandwidth_json, {}).get("bytes_per_s")
    link = none_plan.get("link_bandwidth") if args.link_bandwidth else None
    bound_bw = min(x for x in (bw, link) if x) if (bw or link) else None
    bound_src = ("measured bandwidth" if bw and (not link or bw <= link)
                 else f"emulated link {args.link_bandwidth}" if link else "none")

    # q8_0 experts: the budget of mode none at q8_0 less half its expert bytes, plus the pool.
    q8_bytes = int(3 * hf["hidden_size"] * hf["moe_intermediate_size"] * ELEM["q8_0"])
    q8_none = plan(args.ferry, ServeConfig(mode="none", experts=False,
                                           **dict(base, dtype="q8_0")).write(
        os.path.join(cfg_dir, "moe-plan-none-q8_0.toml")),
        os.path.join(args.logs, "moe-plan-none-q8_0.log"))
    q8_budget = q8_none["device_bytes"] - half * q8_bytes + pool * q8_bytes
    cases = []
    for experts, budget, prefetch, dtype in ((True, experts_budget, args.prefetch, args.dtype),
                                             (True, q8_budget, args.prefetch, "q8_0"),
                                             (False, layers_budget, layers_prefetch, args.dtype)):
        for tier in ("stream", "host", "auto"):
            cases.append((experts, tier, budget, prefetch, dtype))
    data = {"n_layers": n_layers, "n_experts": n_experts, "expert_bytes": expert_bytes,
            "bound_bytes_per_s": bound_bw, "bound_source": bound_src, "cases": {}}
    write_json(args.data, data)
    prompt = prompt_ids(16, 7)
    failed = False
    for experts, tier, budget, prefetch, dtype in cases:
        unit = "experts" if experts else "layers"
        if dtype != args.dtype:
            unit = f"{unit} {dtype}"
        name = f"{unit} {tier}"
        result = data["cases"].setdefault(name, {})
        cfg = ServeConfig(mode="auto", gpu_memory=str(budget), tier=tier, experts=experts,
                          **dict(base, prefetch=prefetch, dtype=dtype))
        tag = f"moe-{unit.replace(' ', '-')}-{tier}"
        try:
            case_plan = plan(args.ferry, cfg.write(os.path.join(cfg_dir, f"{tag}-plan.toml")),
                             os.path.join(args.logs, f"{tag}-plan.log"))
        except Exception as e:  # noqa: BLE001 - one case failing must not hide the others
            failed = True
            report.append_row(args.out, STEP, f"{name}: plan", None, verdict="ERROR",
                              note=f"{type(e).__name__}: {e}"[:400])
            continue
        ex = case_plan.get("experts") or {}
        if ex:
            on_device = sum(layer["device_experts"] for layer in ex.get("layers", []))
            where = f"{on_device}/{n_layers * n_experts} experts on the device"
            moved = ex.get("bytes_per_token")
        else:
            resident = sum(1 for layer in case_plan["layers"] if layer["home"] == "device")
            where = f"{resident}/{n_layers} layers on the device, prefetch {prefetch}"
            moved = case_plan.get("streamed_bytes_per_step")
        result.update(where=where, bytes_moved_per_token=moved)
        cfg.port = free_port()
        path = cfg.write(os.path.join(cfg_dir, f"{tag}-serve.toml"))
        try:
            with Server(args.ferry, path, os.path.join(args.logs, f"ferry-serve-{tag}.log")) as srv:
                srv.start(cfg.port)
                try:
                    result["ready_s"] = srv.wait_ready(args.ready_timeout)
                except RuntimeError as e:
                    # ferry exited: it refused this placement (the reason is in its log).
                    report.append_row(args.out, STEP, f"{name} decode b1 tok/s", None,
                                      verdict="SKIP", note=f"ferry refused: {e}"[:400])
                    result["refused"] = str(e)[:400]
                    write_json(args.data, data)
                    continue
                stream_completion(cfg.port, body(prompt, 2))  # warm-up
                rate = decode_rate(stream_completion(cfg.port, body(prompt, args.tokens)))
                result["b1_tok_s"] = rate
                result["exit_code"] = srv.stop()
        except Exception as e:  # noqa: BLE001
            failed = True
            report.append_row(args.out, STEP, f"{name}: error", None, verdict="ERROR",
                              note=f"{type(e).__name__}: {e}"[:400])
            write_json(args.data, data)
            continue
        log(f"{name}: {rate} tok/s ({where})")
        report.append_row(args.out, STEP, f"{name} decode b1 tok/s",
                          None if rate is None else round(rate, 2), verdict="INFO",
                          note=f"{where}; {args.tokens} tokens, greedy, ignore_eos; ready in "
                               f"{result.get('ready_s', 0):.1f} s")
        if tier == "host":
            note = "host tier: only activations cross the link, no PCIe bound"
            report.append_row(args.out, STEP, f"{name} achieved/PCIe bound", None,
                              verdict="INFO", note=note)
        elif moved and bound_bw and rate:
            bound = bound_bw / moved
            result["bound_tok_s"] = bound
            report.append_row(
                args.out, STEP, f"{name} achieved/PCIe bound", round(rate / bound, 3),
                verdict="INFO",
                note=f"bound {bound:.2f} tok/s = {bound_bw / 1e9:.2f} GB/s ({bound_src}) / "
                     f"{mib(moved)} moved per token (plan; auto may compute some on the host)")
        write_json(args.data, data)
    return REPORTED if failed else 0


if __name__ == "__main__":
    out_dir = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "."
    sys.exit(run_step(out_dir, STEP, main))
