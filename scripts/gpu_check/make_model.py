"""Writes a synthetic Llama checkpoint as a Hugging Face directory: real Llama-3.x layer shapes,
seeded random weights, SmolLM2's tokenizer (vocab 49152, so every sampled id decodes).

    make_model.py --out REPORT_DIR --model 8B:DIR [--model 1B:DIR2] --dtype bf16 \
        --tokenizer tests/fixtures/smollm2-hf-tokenizer

Weights are drawn on the GPU when one is present (fast), one seed per tensor, and written as
safetensors shards of about 2 GiB (plus model.safetensors.index.json) by a small thread pool
while the next shard is drawn. Linear weights have std 0.02 (Llama's initializer_range; 0.06 in
the scaled-down shapes, so that their narrower layers still outweigh the embedding in the
residual stream and a tied model does not just repeat its last token), the embedding / output
head std 0.1 so logits are peaked enough for a greedy comparison, norms 1 + N(0, 0.05).
A marker file records what was generated; a directory whose marker matches is kept as it is
(cache), any other content is replaced.
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import sys
import time

import report
from common import REPORTED, log, run_step, torch_dtype

GENERATOR_VERSION = 1
MARKER = ".ferry-gpu-check.json"
VOCAB = 49152
SHARD_BYTES = 2 << 30

# Real shapes of Llama-3.2-1B and Llama-3.1-8B (except the vocabulary), and scaled-down
# stand-ins for the CPU dry run.
SHAPES = {
    "1B": dict(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, tied=True,
               rope_factor=32.0, like="Llama-3.2-1B"),
    "8B": dict(hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, tied=False,
               rope_factor=8.0, like="Llama-3.1-8B"),
    # Fewer layers of the same real shapes, so generation, loading and decoding fit a short run
    # (every per-layer number is that of the full model; the plan scales by the layer count).
    "1B-4L": dict(hidden=2048, layers=4, heads=32, kv_heads=8, intermediate=8192, tied=True,
                  rope_factor=32.0, like="Llama-3.2-1B, 4 of 16 layers"),
    "8B-8L": dict(hidden=4096, layers=8, heads=32, kv_heads=8, intermediate=14336, tied=False,
                  rope_factor=8.0, like="Llama-3.1-8B, 8 of 32 layers"),
    "8B-16L": dict(hidden=4096, layers=16, heads=32, kv_heads=8, intermediate=14336, tied=False,
                   rope_factor=8.0, like="Llama-3.1-8B, 16 of 32 layers"),
    "tiny-1B": dict(hidden=256, layers=4, heads=8, kv_heads=2, intermediate=1024, tied=True,
                    rope_factor=32.0, like="scaled-down Llama-3.2-1B", std=0.06),
    "tiny-8B": dict(hidden=256, layers=12, heads=8, kv_heads=2, intermediate=768, tied=False,
                    rope_factor=8.0, like="scaled-down Llama-3.1-8B", std=0.06),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def hf_config(shape, dtype):
    s = SHAPES[shape]
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": s["hidden"],
        "intermediate_size": s["intermediate"],
        "num_hidden_layers": s["layers"],
        "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"],
        "head_dim": s["hidden"] // s["heads"],
        "vocab_size": VOCAB,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": s["rope_factor"],
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "tie_word_embeddings": s["tied"],
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}[dtype],
        "use_cache": True,
    }


def tensor_specs(shape):
    """(name, shape, kind) in checkpoint order; kind is "linear", "embed" or "norm"."""
    s = SHAPES[shape]
    h, i = s["hidden"], s["intermediate"]
    hd = h // s["heads"]
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
            (p + "post_attention_layernorm.weight", (h,), "norm"),
            (p + "mlp.gate_proj.weight", (i, h), "linear"),
            (p + "mlp.up_proj.weight", (i, h), "linear"),
            (p + "mlp.down_proj.weight", (h, i), "linear"),
        ]
    specs.append(("model.norm.weight", (h,), "norm"))
    if not s["tied"]:
        specs.append(("lm_head.weight", (VOCAB, h), "embed"))
    return specs


def marker_for(shape, dtype, seed):
    return {"generator": GENERATOR_VERSION, "shape": shape, "dtype": dtype, "seed": seed,
            "vocab": VOCAB, "dims": SHAPES[shape]}


def is_cached(dest, marker):
    try:
        with open(os.path.join(dest, MARKER), encoding="utf-8") as f:
            return json.load(f) == marker
    except (FileNotFoundError, json.JSONDecodeError):
        return False


def reuse_or_clear(shape, dest, marker):
    """True when dest already holds the checkpoint marker describes; otherwise dest is emptied
    (created) for a fresh one."""
    if is_cached(dest, marker):
        log(f"{shape}: cached at {dest}")
        return True
    if os.path.exists(dest):
        shutil.rmtree(dest)
    os.makedirs(dest)
    return False


def write_side_files(dest, total, weight_map, config, tokenizer_dir, marker):
    """Everything of a HF checkpoint but the shards: the shard index, config.json,
    generation_config.json, the tokenizer files, and last the marker (so an interrupted run is
    never taken as cached)."""
    with open(os.path.join(dest, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(dest, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(dest, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump({"bos_token_id": 1, "eos_token_id": 2, "do_sample": False}, f, indent=2)
    for name in TOKENIZER_FILES:
        src = os.path.join(tokenizer_dir, name)
        if os.path.exists(src):
            shutil.copy(src, os.path.join(dest, name))
    with open(os.path.join(dest, MARKER), "w", encoding="utf-8") as f:
        json.dump(marker, f)


def draw(name_index, shape, kind, seed, device, dtype, std):
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(seed * 100003 + name_index)
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    if kind == "linear":
        x.mul_(std)
    elif kind == "embed":
        x.mul_(0.1)
    else:
        x.mul_(0.05).add_(1.0)
    return x.to(torch_dtype(dtype)).cpu().contiguous()


def generate(shape, dtype, dest, tokenizer_dir, seed, device):
    from safetensors.torch import save_file

    marker = marker_for(shape, dtype, seed)
    if reuse_or_clear(shape, dest, marker):
        return "cached", 0.0
    started = time.monotonic()
    specs = tensor_specs(shape)
    elem = {"bf16": 2, "f16": 2, "f32": 4}[dtype]
    std = SHAPES[shape].get("std", 0.02)
    shards = plan_shards([elem * _count(tshape) for _, tshape, _ in specs])
    n_shards = len(shards)
    total = sum(elem * _count(tshape) for _, tshape, _ in specs)
    weight_map, pending = {}, []
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        for no, members in enumerate(shards, start=1):
            fname = f"model-{no:05d}-of-{n_shards:05d}.safetensors"
            tensors = {}
            for index in members:
                name, tshape, kind = specs[index]
                tensors[name] = draw(index, tshape, kind, seed, device, dtype, std)
                weight_map[name] = fname
            pending.append(pool.submit(save_file, tensors, os.path.join(dest, fname),
                                       metadata={"format": "pt"}))
            # Bound host memory: at most a few shards drawn but not yet written.
            busy = [f for f in pending if not f.done()]
            if len(busy) > 3:
                concurrent.futures.wait(busy, return_when=concurrent.futures.FIRST_COMPLETED)
        for fut in pending:
            fut.result()
    write_side_files(dest, total, weight_map, hf_config(shape, dtype), tokenizer_dir, marker)
    return "generated", time.monotonic() - started


def plan_shards(sizes):
    """Tensor indices per shard, in order: a shard is closed before a tensor would take it past
    SHARD_BYTES (a tensor larger than that gets a shard of its own)."""
    shards, current, used = [], [], 0
    for index, size in enumerate(sizes):
        if current and used + size > SHARD_BYTES:
            shards.append(current)
            current, used = [], 0
        current.append(index)
        used += size
    if current:
        shards.append(current)
    return shards


def _count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def dir_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
               if f.endswith(".safetensors"))


def main():
    p = argparse.ArgumentParser(description="Generate synthetic Llama HF checkpoints.")
    p.add_argument("--out", required=True, help="report folder")
    p.add_argument("--model", action="append", required=True, metavar="SHAPE:DIR",
                   help=f"shape ({', '.join(SHAPES)}) and destination; repeatable")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "f16", "f32"))
    p.add_argument("--tokenizer", required=True, help="folder with tokenizer.json etc.")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    args = p.parse_args()

    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not os.path.exists(os.path.join(args.tokenizer, "tokenizer.json")):
        raise FileNotFoundError(f"no tokenizer.json in {args.tokenizer}")
    failed = False
    for item in args.model:
        shape, sep, dest = item.partition(":")
        if not sep or shape not in SHAPES:
            raise ValueError(f"--model {item!r}: expected SHAPE:DIR with SHAPE in {list(SHAPES)}")
        s = SHAPES[shape]
        try:
            how, seconds = generate(shape, args.dtype, dest, args.tokenizer, args.seed, device)
        except Exception as e:  # noqa: BLE001 - one model failing must not hide the other
            report.append_row(args.out, "0 models", f"{shape} checkpoint", None, verdict="ERROR",
                              note=f"{type(e).__name__}: {e}"[:400])
            failed = True
            continue
        gib = dir_bytes(dest) / (1 << 30)
        note = (f"{s['like']} shapes (hidden {s['hidden']}, {s['layers']} layers, "
                f"{s['heads']}/{s['kv_heads']} heads, ffn {s['intermediate']}, "
                f"{'tied' if s['tied'] else 'untied'}), vocab {VOCAB} (SmolLM2 tokenizer, not "
                f"Llama's 128256), {args.dtype}, random weights seed {args.seed}; "
                + (f"{how} on {device} in {seconds:.1f} s" if how == "generated" else "cached"))
        report.append_row(args.out, "0 models", f"{shape} checkpoint GiB", round(gib, 3),
                          verdict="INFO", note=note, data={"dir": dest, "shape": s})
    return REPORTED if failed else 0


if __name__ == "__main__":
    out_dir = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "."
    sys.exit(run_step(out_dir, "0 models", main))
