#!/usr/bin/env python3
r"""Writes tests/fixtures/kv-perplexity/expected.json: the default model's perplexity on a fixed
text (the first 2048 tokens of docs/ARCHITECTURE.md as committed when this fixture was made,
stored as token ids), through llama.cpp (llama-cpp-python) with its KV cache in f16, q8_0 and
q4_0 (`type_k` / `type_v`, with flash attention, which llama.cpp needs for a quantized V).
tests/suite/kv_perplexity.rs computes ferry's perplexity on the same ids with each `kv_dtype`
and compares the changes.

Usage: /work/venv-oracle/bin/python scripts/make-kv-perplexity-fixture.py
Needs llama-cpp-python 0.3.36 (built from source) and the default model in models/.
"""

import json
import math
import os

import llama_cpp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(ROOT, "tests", "fixtures", "kv-perplexity", "expected.json")
TOKENS = 2048
TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2}  # ggml_type ids


def perplexity(ids, type_id):
    llm = llama_cpp.Llama(
        model_path=MODEL, n_ctx=TOKENS, n_batch=512, n_threads=2, logits_all=True,
        flash_attn=True, type_k=type_id, type_v=type_id, verbose=False,
    )
    llm.eval(ids)
    logits = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
    nll = 0.0
    for i in range(len(ids) - 1):
        row = logits[i]
        top = row.max()
        log_z = top + math.log(np.exp(row - top).sum())
        nll += log_z - row[ids[i + 1]]
    return math.exp(nll / (len(ids) - 1))


def main():
    text = open(os.path.join(ROOT, "docs", "ARCHITECTURE.md"), encoding="utf-8").read()
    probe = llama_cpp.Llama(model_path=MODEL, n_ctx=64, vocab_only=True, verbose=False)
    ids = probe.tokenize(text.encode("utf-8"), add_bos=False, special=False)[:TOKENS]
    assert len(ids) == TOKENS, len(ids)
    result = {name: perplexity(ids, t) for name, t in TYPES.items()}
    for name, value in result.items():
        print(f"llama.cpp kv {name}: perplexity {value:.4f}")
    with open(OUT, "w") as f:
        json.dump({"llama_cpp_python": llama_cpp.__version__, "tokens": ids,
                   "llama_cpp_perplexity": result}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
