"""Writes a synthetic Qwen3-MoE checkpoint as a Hugging Face directory for step g: the layer
shapes of Qwen3-30B-A3B (hidden 2048, 32/4 heads of 128, 128 experts of width 768, top 8) with
fewer layers, seeded random weights, SmolLM2's tokenizer (vocab 49152).

    make_moe_model.py --out REPORT_DIR --model 30B-A3B-4L:DIR --dtype bf16 \
        --tokenizer tests/fixtures/smollm2-hf-tokenizer

config.json is transformers' own ``Qwen3MoeConfig`` (``to_dict``), so the keys are what
transformers writes. Weights are drawn like make_model.py's (one seed per tensor, on the GPU
when one is present), the router with a larger spread so tokens pick different experts; without
torch (a CPU dry run with only numpy, safetensors and transformers) numpy draws them, seeded the
same way. A marker file records what was generated; a directory whose marker matches is reused.
"""

import argparse
import json
import math
import os
import sys
import time

import report
from common import REPORTED, run_step
from make_model import VOCAB, dir_bytes, draw, plan_shards, reuse_or_clear, write_side_files

GENERATOR_VERSION = 2

SHAPES = {
    # Qwen3-30B-A3B's layer shapes, 4 of its 48 layers.
    "30B-A3B-4L": dict(hidden=2048, layers=4, heads=32, kv_heads=4, head_dim=128,
                       experts=128, top_k=8, expert_ff=768, like="Qwen3-30B-A3B, 4 of 48 layers"),
    # Scaled down for the CPU dry run (same structure, top 4 of 32).
    "tiny-moe": dict(hidden=256, layers=4, heads=8, kv_heads=2, head_dim=32,
                     experts=32, top_k=4, expert_ff=128, like="scaled-down Qwen3-30B-A3B"),
}


def hf_config(shape, dtype):
    from transformers import Qwen3MoeConfig

    s = SHAPES[shape]
    config = Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=s["hidden"],
        intermediate_size=s["expert_ff"] * 8,
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        head_dim=s["head_dim"],
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_theta=1000000.0,
        tie_word_embeddings=False,
        decoder_sparse_step=1,
        moe_intermediate_size=s["expert_ff"],
        num_experts=s["experts"],
        num_experts_per_tok=s["top_k"],
        norm_topk_prob=True,
        mlp_only_layers=[],
        bos_token_id=1,
        eos_token_id=2,
    )
    d = config.to_dict()
    # transformers >= 5 writes `num_local_experts` and `rope_parameters`; the checkpoints people
    # bring (and ferry) use the classic keys, so both are written.
    d["num_experts"] = s["experts"]
    d["rope_theta"] = 1000000.0
    d["architectures"] = ["Qwen3MoeForCausalLM"]
    d["torch_dtype"] = {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[dtype]
    return d


def tensor_specs(shape):
    """(name, shape, kind) in checkpoint order; kind is "linear", "router", "embed" or "norm"."""
    s = SHAPES[shape]
    h, hd, ff = s["hidden"], s["head_dim"], s["expert_ff"]
    q, kv = s["heads"] * hd, s["kv_heads"] * hd
    specs = [("model.embed_tokens.weight", (VOCAB, h), "embed")]
    for layer in range(s["layers"]):
        p = f"model.layers.{layer}."
        specs += [
            (p + "input_layernorm.weight", (h,), "norm"),
            (p + "self_attn.q_proj.weight", (q, h), "linear"),
            (p + "self_attn.k_proj.weight", (kv, h), "linear"),
            (p + "self_attn.v_proj.weight", (kv, h), "linear"),
            (p + "self_attn.o_proj.weight", (h, q), "linear"),
            (p + "self_attn.q_norm.weight", (hd,), "norm"),
            (p + "self_attn.k_norm.weight", (hd,), "norm"),
            (p + "post_attention_layernorm.weight", (h,), "norm"),
            (p + "mlp.gate.weight", (s["experts"], h), "router"),
        ]
        for e in range(s["experts"]):
            x = f"{p}mlp.experts.{e}."
            specs += [
                (x + "gate_proj.weight", (ff, h), "linear"),
                (x + "up_proj.weight", (ff, h), "linear"),
                (x + "down_proj.weight", (h, ff), "linear"),
            ]
    specs.append(("model.norm.weight", (h,), "norm"))
    specs.append(("lm_head.weight", (VOCAB, h), "embed"))
    return specs


def draw_numpy(name_index, shape, kind, seed, dtype, std):
    import numpy as np

    if dtype != "f32":
        raise ValueError("without torch only f32 checkpoints can be drawn")
    rng = np.random.default_rng(seed * 100003 + name_index)
    x = rng.standard_normal(shape, dtype=np.float32)
    if kind == "linear":
        x *= std
    elif kind == "embed":
        x *= 0.1
    else:
        x = x * 0.05 + 1.0
    return np.ascontiguousarray(x, dtype=np.float32)


def generate(shape, dtype, dest, tokenizer_dir, seed, device):
    if device == "numpy":
        from safetensors.numpy import save_file
    else:
        from safetensors.torch import save_file

    marker = {"generator": GENERATOR_VERSION, "shape": shape, "dtype": dtype, "seed": seed,
              "vocab": VOCAB, "dims": SHAPES[shape], "family": "qwen3_moe"}
    if reuse_or_clear(shape, dest, marker):
        return "cached", 0.0
    started = time.monotonic()
    specs = tensor_specs(shape)
    elem = {"bf16": 2, "f16": 2, "f32": 4}[dtype]
    shards = plan_shards([elem * math.prod(t) for _, t, _ in specs])
    total = sum(elem * math.prod(t) for _, t, _ in specs)
    weight_map = {}
    for no, members in enumerate(shards, start=1):
        fname = f"model-{no:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for index in members:
            name, tshape, kind = specs[index]
            # The router gets the embedding's spread (0.1): distinct top-k per token.
            draw_kind = "embed" if kind == "router" else kind
            if device == "numpy":
                tensors[name] = draw_numpy(index, tshape, draw_kind, seed, dtype, 0.06)
            else:
                tensors[name] = draw(index, tshape, draw_kind, seed, device, dtype, 0.06)
            weight_map[name] = fname
        save_file(tensors, os.path.join(dest, fname), metadata={"format": "pt"})
    write_side_files(dest, total, weight_map, hf_config(shape, dtype), tokenizer_dir, marker)
    return "generated", time.monotonic() - started


def main():
    p = argparse.ArgumentParser(description="Generate a synthetic Qwen3-MoE HF checkpoint.")
    p.add_argument("--out", required=True, help="report folder")
    p.add_argument("--model", required=True, metavar="SHAPE:DIR",
                   help=f"shape ({', '.join(SHAPES)}) and destination")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "f16", "f32"))
    p.add_argument("--tokenizer", required=True, help="folder with tokenizer.json etc.")
    p.add_argument("--seed", type=int, default=4321)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | numpy")
    args = p.parse_args()

    device = args.device
    if device == "auto":
        try:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            device = "numpy"
    shape, sep, dest = args.model.partition(":")
    if not sep or shape not in SHAPES:
        raise ValueError(f"--model {args.model!r}: expected SHAPE:DIR with SHAPE in {list(SHAPES)}")
    s = SHAPES[shape]
    try:
        how, seconds = generate(shape, args.dtype, dest, args.tokenizer, args.seed, device)
    except Exception as e:  # noqa: BLE001 - becomes a row
        report.append_row(args.out, "0 moe model", f"{shape} checkpoint", None, verdict="ERROR",
                          note=f"{type(e).__name__}: {e}"[:400])
        return REPORTED
    gib = dir_bytes(dest) / (1 << 30)
    note = (f"{s['like']} shapes (hidden {s['hidden']}, {s['layers']} layers, "
            f"{s['heads']}/{s['kv_heads']} heads of {s['head_dim']}, {s['experts']} experts of "
            f"width {s['expert_ff']}, top {s['top_k']}), transformers Qwen3MoeConfig, vocab "
            f"{VOCAB}, {args.dtype}, random weights seed {args.seed}; "
            + (f"generated on {device} in {seconds:.1f} s" if how == "generated" else "cached"))
    report.append_row(args.out, "0 moe model", f"{shape} checkpoint GiB", round(gib, 3),
                      verdict="INFO", note=note, data={"dir": dest, "shape": s})
    return 0


if __name__ == "__main__":
    out_dir = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "."
    sys.exit(run_step(out_dir, "0 moe model", main))
