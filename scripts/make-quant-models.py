#!/usr/bin/env python3
r"""Makes the quantized test and benchmark models of issue 11, with llama.cpp's own quantizer
(llama-cpp-python's `llama_model_quantize`), and caches them (nothing here is committed):

(a) the default model (SmolLM2-135M-Instruct Q4_1, models/) requantized (`allow_requantize`) to
    Q4_0, Q5_0, Q5_1, Q8_0, Q4_K_M and Q6_K. SmolLM2's width (576) is not a multiple of 256, so
    llama.cpp stores most tensors of its k-quant files in its fallback types (q5_0, q8_0, ...).
(b) a synthetic Llama whose dimensions are multiples of 256 (hidden 2048, MLP 5632, 4 layers,
    16 heads of 128, 4 key/value heads; seeded random weights) written with the `gguf` package
    as F16 (norms F32), with SmolLM2's tokenizer copied from its GGUF metadata, then quantized
    to Q4_K_M, Q5_K_M, Q6_K, Q8_0, IQ4_XS, IQ4_NL, MXFP4, Q2_K and Q3_K_M (the last two mostly
    Q2_K / Q3_K tensors). llama.cpp's quantizer offers
    MXFP4 only as MXFP4_MOE, which writes MXFP4 for expert tensors and Q8_0 for every other
    one, so a dense model gets none; the MXFP4 file here is MXFP4_MOE with a tensor-type
    override (`tt_overrides`, `--tensor-type` on the command line) putting every decoder
    matrix in MXFP4.
(c) a Qwen2.5-0.5B-shaped synthetic Llama (hidden 896; SYNTH896 below) as F16, quantized to
    Q4_K_M: 896 is not a multiple of 256, so llama.cpp writes its fallback types for most
    matrices (Q5_0, Q8_0), the mix of real 0.5B Q4_K_M files (synth896-q4_k_m).
A model is only re-made when its file is missing (`--force` re-makes).

Usage: /work/venv-oracle/bin/python scripts/make-quant-models.py [--out DIR] [--force]
           [--only NAME[,NAME...]] [--list]
Default DIR: $FERRY_QUANT_MODELS or ~/.cache/ferry/quant-models. Names: smollm2-q4_0, ...,
synth-f16, synth-q4_k_m, ..., synth896-q4_k_m (`--list` prints them with their paths). Needs numpy, gguf 0.19 and
llama-cpp-python 0.3.36; no network. scripts/make-quant-fixture-llamacpp.py reuses the writer
and quantizer below for the tiny committed fixtures.
"""

import argparse
import ctypes
import os
import sys

import gguf
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

# llama.cpp's file types (llama.h `llama_ftype`), by the names its quantize tool uses.
FTYPES = {
    "q4_0": 2, "q4_1": 3, "q8_0": 7, "q5_0": 8, "q5_1": 9, "q2_k": 10, "q3_k_m": 12,
    "q4_k_m": 15, "q5_k_m": 17, "q6_k": 18, "iq4_nl": 25, "iq4_xs": 30, "mxfp4_moe": 38,
}
GGML_TYPE_MXFP4 = 39

SMOLLM2_VARIANTS = ["q4_0", "q5_0", "q5_1", "q8_0", "q4_k_m", "q6_k"]
SYNTH_VARIANTS = ["q4_k_m", "q5_k_m", "q6_k", "q8_0", "iq4_xs", "iq4_nl", "mxfp4", "q2_k",
                  "q3_k_m"]
SYNTH896_VARIANTS = ["q4_k_m"]

# The benchmark/test synthetic model.
SYNTH = dict(hidden=2048, ff=5632, layers=4, heads=16, kv_heads=4, head_dim=128,
             context=8192, rope_base=10000.0, eps=1e-5, seed=2048)

# A Qwen2.5-0.5B-shaped one (hidden 896, MLP 4864, 14 heads of 64, 2 key/value heads; half
# its 24 layers): 896-wide rows are not whole 256-element blocks, so its Q4_K_M file holds
# llama.cpp's fallback mix, Q5_0 and Q8_0 for every matrix read along 896 (issue 27).
SYNTH896 = dict(hidden=896, ff=4864, layers=12, heads=14, kv_heads=2, head_dim=64,
                context=8192, rope_base=1000000.0, eps=1e-6, seed=896)


def out_dir(arg=None):
    return arg or os.environ.get("FERRY_QUANT_MODELS") or os.path.expanduser(
        "~/.cache/ferry/quant-models")


def smollm2_tokenizer(path=DEFAULT_MODEL):
    """The `tokenizer.*` metadata of the default model's GGUF, as (key, type, value) triples."""
    reader = gguf.GGUFReader(path)
    out = []
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            sub = field.types[1]
            if sub == gguf.GGUFValueType.STRING:
                value = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                value = [field.parts[i].tolist()[0] for i in field.data]
            out.append((field.name, kind, value, sub))
        elif kind == gguf.GGUFValueType.STRING:
            out.append((field.name, kind, bytes(field.parts[field.data[0]]).decode("utf-8"), None))
        else:
            out.append((field.name, kind, field.parts[field.data[0]].tolist()[0], None))
    return out


def write_llama(path, c, tokenizer, vocab_size, name="ferry synthetic random"):
    """Writes a random-weight Llama GGUF with shape `c` (see SYNTH): matrices F16, norms F32.

    `tokenizer` is a list of (key, GGUFValueType, value, array element type) triples."""
    h, ff, nh, nkv, hd = c["hidden"], c["ff"], c["heads"], c["kv_heads"], c["head_dim"]
    rng = np.random.default_rng(c["seed"])

    def mat(rows, cols, gain=1.0):
        m = rng.standard_normal((rows, cols), dtype=np.float32)
        m *= gain / np.sqrt(cols)
        return m.astype(np.float16)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = gguf.GGUFWriter(path, "llama")
    w.add_name(name)
    w.add_context_length(c["context"])
    w.add_embedding_length(h)
    w.add_feed_forward_length(ff)
    w.add_block_count(c["layers"])
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(c["rope_base"])
    w.add_layer_norm_rms_eps(c["eps"])
    w.add_vocab_size(vocab_size)
    w.add_file_type(1)  # mostly F16
    for key, kind, value, sub in tokenizer:
        if kind == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, value, kind, sub_type=sub)
        else:
            w.add_key_value(key, value, kind)
    tensors = {"token_embd.weight": mat(vocab_size, h, np.sqrt(h)),
               "output_norm.weight": norm(h), "output.weight": mat(vocab_size, h, 2.0)}
    for i in range(c["layers"]):
        p = f"blk.{i}."
        tensors[p + "attn_norm.weight"] = norm(h)
        tensors[p + "attn_q.weight"] = mat(nh * hd, h)
        tensors[p + "attn_k.weight"] = mat(nkv * hd, h)
        tensors[p + "attn_v.weight"] = mat(nkv * hd, h)
        tensors[p + "attn_output.weight"] = mat(h, nh * hd)
        tensors[p + "ffn_norm.weight"] = norm(h)
        tensors[p + "ffn_gate.weight"] = mat(ff, h)
        tensors[p + "ffn_up.weight"] = mat(ff, h)
        tensors[p + "ffn_down.weight"] = mat(h, ff)
    for tname in sorted(tensors):
        w.add_tensor(tname, tensors[tname])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize(src, dst, kind, threads=2):
    """llama.cpp's quantizer: `src` to `dst` as file type `kind` (a FTYPES name, or "mxfp4":
    MXFP4_MOE with every decoder matrix overridden to MXFP4)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = threads
    params.allow_requantize = True
    keep = None
    if kind == "mxfp4":
        params.ftype = FTYPES["mxfp4_moe"]
        Override = llama_cpp.llama_cpp.llama_model_tensor_override
        keep = (Override * 2)()
        keep[0].pattern = rb"blk\..*\.weight"
        keep[0].type = GGML_TYPE_MXFP4
        keep[1].pattern = None
        params.tt_overrides = ctypes.cast(keep, type(params.tt_overrides))
    else:
        params.ftype = FTYPES[kind]
    tmp = dst + ".part"
    rc = llama_cpp.llama_model_quantize(src.encode(), tmp.encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({src} -> {kind}) returned {rc}")
    os.replace(tmp, dst)
    return dst


def tensor_types(path):
    """{GGML type name: tensor count} of a GGUF."""
    counts = {}
    for t in gguf.GGUFReader(path).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


def catalogue(directory):
    """name -> (path, maker) for every model this script makes, in build order."""
    models = {}
    for kind in SMOLLM2_VARIANTS:
        path = os.path.join(directory, f"smollm2-{kind}.gguf")
        models[f"smollm2-{kind}"] = (path, lambda p=path, k=kind: quantize(DEFAULT_MODEL, p, k))
    synth_f16 = os.path.join(directory, "synth-f16.gguf")

    def make_synth(p=synth_f16):
        tok = smollm2_tokenizer()
        vocab = next(len(v) for k, _, v, _ in tok if k == "tokenizer.ggml.tokens")
        write_llama(p, SYNTH, tok, vocab)
        return p

    models["synth-f16"] = (synth_f16, make_synth)
    for kind in SYNTH_VARIANTS:
        path = os.path.join(directory, f"synth-{kind}.gguf")
        models[f"synth-{kind}"] = (path, lambda p=path, k=kind: quantize(synth_f16, p, k))
    synth896_f16 = os.path.join(directory, "synth896-f16.gguf")

    def make_synth896(p=synth896_f16):
        tok = smollm2_tokenizer()
        vocab = next(len(v) for k, _, v, _ in tok if k == "tokenizer.ggml.tokens")
        write_llama(p, SYNTH896, tok, vocab, name="ferry synthetic random 896")
        return p

    models["synth896-f16"] = (synth896_f16, make_synth896)
    for kind in SYNTH896_VARIANTS:
        path = os.path.join(directory, f"synth896-{kind}.gguf")
        models[f"synth896-{kind}"] = (path,
                                      lambda p=path, k=kind: quantize(synth896_f16, p, k))
    return models


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--only", help="comma-separated names")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    directory = out_dir(args.out)
    os.makedirs(directory, exist_ok=True)
    models = catalogue(directory)
    wanted = args.only.split(",") if args.only else list(models)
    unknown = [n for n in wanted if n not in models]
    if unknown:
        sys.exit(f"unknown model(s) {unknown}; known: {', '.join(models)}")
    if args.list:
        for name in wanted:
            print(name, models[name][0])
        return
    # A quantized synthetic model needs its F16 source.
    for family in ("synth", "synth896"):
        if any(n.startswith(family + "-") for n in wanted) and family + "-f16" not in wanted:
            wanted.insert(0, family + "-f16")
    for name in models:
        if name not in wanted:
            continue
        path, make = models[name]
        if os.path.exists(path) and not args.force:
            print(f"{name}: cached {path}", file=sys.stderr)
            continue
        print(f"{name}: making {path} ...", file=sys.stderr)
        make()
        print(f"{name}: {os.path.getsize(path) / 2**20:.1f} MiB {tensor_types(path)}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
