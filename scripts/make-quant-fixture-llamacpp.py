#!/usr/bin/env python3
r"""Writes the quantized-type parity fixtures in tests/fixtures/quant-llamacpp/: a tiny version of
scripts/make-quant-models.py's synthetic Llama (hidden 256, MLP 256, 2 layers, 4 heads of 64,
one key/value head, a 128-token vocabulary; every row a whole 256-element k-quant super-block)
written as F16 with the `gguf` package and quantized by llama.cpp's own quantizer to each type
below, and expected.json with llama.cpp's top-10 ids and logits (and the log-sum-exp of all
logits) at the last position of five token-id prompts on each file. tests/suite/quant_llamacpp.rs
serves the same files with ferry through the HTTP API and compares.

Types: Q4_K_M, Q5_K_M, Q6_K, Q8_0, IQ4_XS, IQ4_NL, MXFP4 (MXFP4_MOE with the decoder matrices
overridden to MXFP4, see make-quant-models.py), about 0.45-0.85 MB each (3.8 MB in all, under
the fixtures' 5 MB budget; Q4_0/Q5_0 files would push it over, and those types are the default
model's requantized variants in make-quant-models.py). The requantized default-model variants
are 90-140 MB each, far over the budget, so they are benchmark models only.

The vocabulary is `<unk>`, `<s>`, `</s>` then letter pairs, with no `▁` and no byte tokens, so
every token's text is distinct and the HTTP API's token strings map back to ids.

Usage: /work/venv-oracle/bin/python scripts/make-quant-fixture-llamacpp.py
Needs numpy, gguf 0.19 and llama-cpp-python 0.3.36; no network.
"""

import importlib.util
import json
import os
import tempfile

import gguf
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "tests", "fixtures", "quant-llamacpp")

spec = importlib.util.spec_from_file_location("quant_models",
                                              os.path.join(HERE, "make-quant-models.py"))
qm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(qm)

VOCAB = 128
TINY = dict(hidden=256, ff=256, layers=2, heads=4, kv_heads=1, head_dim=64, context=64,
            rope_base=10000.0, eps=1e-5, seed=256)
KINDS = ["q4_k_m", "q5_k_m", "q6_k", "q8_0", "iq4_xs", "iq4_nl", "mxfp4"]
PROMPTS = [
    [1, 17, 100, 45],
    [1, 5, 9, 120, 121, 77, 12, 8],
    [42],
    [1, 100, 50, 3, 3, 3],
    [1, 127, 7, 64, 33, 90],
]


def vocab():
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens = ["<unk>", "<s>", "</s>"]
    pairs = (a + b for a in letters for b in letters)
    while len(tokens) < VOCAB:
        tokens.append(next(pairs))
    return tokens


def tokenizer_meta(tokens):
    T = gguf.GGUFValueType
    types = [2, 3, 3] + [1] * (len(tokens) - 3)
    return [
        ("tokenizer.ggml.model", T.STRING, "llama", None),
        ("tokenizer.ggml.tokens", T.ARRAY, tokens, T.STRING),
        ("tokenizer.ggml.scores", T.ARRAY, [-float(i) for i in range(len(tokens))], T.FLOAT32),
        ("tokenizer.ggml.token_type", T.ARRAY, types, T.INT32),
        ("tokenizer.ggml.unknown_token_id", T.UINT32, 0, None),
        ("tokenizer.ggml.bos_token_id", T.UINT32, 1, None),
        ("tokenizer.ggml.eos_token_id", T.UINT32, 2, None),
        ("tokenizer.ggml.add_bos_token", T.BOOL, False, None),
    ]


def oracle(path):
    """llama.cpp's top-10 ids/logits and log-sum-exp at the last position of each prompt."""
    GGML_TYPE_F32 = 0
    import llama_cpp.llama_cpp as api
    from llama_cpp import Llama

    # Plain CPU buffers (AMX tiles segfault in some VMs; see benches/llama_cpp_peer.py).
    default_params = api.llama_model_default_params

    def plain():
        params = default_params()
        params.use_extra_bufts = False
        return params

    api.llama_model_default_params = plain
    out = []
    try:
        for ids in PROMPTS:
            llm = Llama(model_path=path, n_ctx=TINY["context"], n_batch=TINY["context"],
                        n_threads=2, n_threads_batch=2, logits_all=True, verbose=False,
                        type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
            llm.eval(ids)
            logits = np.array(llm.scores[len(ids) - 1], dtype=np.float64)
            top = np.argsort(-logits, kind="stable")[:10]
            m = logits.max()
            out.append({
                "ids": ids,
                "top10_ids": [int(i) for i in top],
                "top10_logits": [round(float(logits[i]), 5) for i in top],
                "logsumexp": round(float(m + np.log(np.exp(logits - m).sum())), 5),
            })
            llm.close()
    finally:
        api.llama_model_default_params = default_params
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    tokens = vocab()
    expected = {"vocab": tokens, "prompts": PROMPTS, "shape": TINY, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "tiny-f16.gguf")
        qm.write_llama(src, TINY, tokenizer_meta(tokens), VOCAB, name="ferry tiny random")
        for kind in KINDS:
            path = os.path.join(OUT, f"tiny-{kind}.gguf")
            qm.quantize(src, path, kind)
            types = qm.tensor_types(path)
            print(f"wrote {path} ({os.path.getsize(path)} bytes) {types}")
            expected["models"][kind] = {"gguf_file": os.path.basename(path),
                                        "tensor_types": types, "results": oracle(path)}
    import llama_cpp
    expected["llama_cpp_python"] = llama_cpp.__version__
    with open(os.path.join(OUT, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
