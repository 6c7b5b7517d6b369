"""llama.cpp (through llama-cpp-python) on the same GGUF, token ids and thread count as
benches/decode.rs: prefill the prompt ids, then greedy-decode N tokens; prints one JSON line per run,
with the load time (the `Llama` constructor: file to ready) and the resident set after it.

Usage: python benches/llama_cpp_peer.py MODEL.gguf PROMPT_IDS_JSON GEN_TOKENS RUNS THREADS
"""
import json
import os
import sys
import time

import llama_cpp.llama_cpp as llama_cpp_api
import numpy as np
from llama_cpp import Llama

# ggml's "extra buffer types" put weights in AMX tiles on CPUs that report AMX; in VMs that do not
# grant the AMX tile state that path segfaults (seen in ggml_backend_amx_mul_mat). The wrapper has
# no switch for it, so default model params are patched to keep weights in plain CPU buffers.
# (ggml's other extra buffer, weight repacking, has no Q4_1 layout, so Q4_1 runs the same kernels.)
# FERRY_PEER_EXTRA_BUFTS=1 keeps them on: for a llama.cpp built without AMX (the AVX2-only mode of
# benches/compare-llama-cpp.sh), where they are the repacked Q4_0 / IQ4_NL / Q4_K GEMM layouts.
_default_model_params = llama_cpp_api.llama_model_default_params


def _plain_buffers():
    params = _default_model_params()
    params.use_extra_bufts = False
    return params


if os.environ.get("FERRY_PEER_EXTRA_BUFTS") != "1":
    llama_cpp_api.llama_model_default_params = _plain_buffers


def resident_bytes() -> int:
    """VmRSS of this process (the Python interpreter and numpy included), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def last_logits(llm: Llama) -> np.ndarray:
    """The logits of the last token evaluated. Without `logits_all`, llama-cpp-python 0.3.36's
    `eval` no longer copies them into `llm.scores` (that array then holds stale memory), so
    they are read from the context, where llama.cpp keeps only the last token's row."""
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))


def main() -> None:
    model, ids_json, gen_tokens, runs, threads = sys.argv[1:6]
    prompt = json.loads(ids_json)
    gen_tokens, runs, threads = int(gen_tokens), int(runs), int(threads)
    load_started = time.perf_counter()
    # The context holds the prompt and the generated tokens; 512-token batches (llama.cpp's
    # default micro-batch) for the prompt.
    llm = Llama(model_path=model, n_ctx=len(prompt) + gen_tokens + 16, n_batch=512,
                n_threads=threads, n_threads_batch=threads, verbose=False)
    load_seconds = time.perf_counter() - load_started
    rss_after_load = resident_bytes()
    for run in range(runs):
        llm.reset()
        started = time.perf_counter()
        llm.eval(prompt)
        prefill = time.perf_counter() - started
        next_id = int(last_logits(llm).argmax())
        decode_started = time.perf_counter()
        for _ in range(gen_tokens):
            llm.eval([next_id])
            next_id = int(last_logits(llm).argmax())
        decode = time.perf_counter() - decode_started
        print(json.dumps({
            "engine": "llama.cpp", "run": run, "prompt_tokens": len(prompt),
            "gen_tokens": gen_tokens, "prefill_tok_s": round(len(prompt) / prefill, 2),
            "decode_tok_s": round(gen_tokens / decode, 2),
            "load_s": round(load_seconds, 4), "rss_after_load": rss_after_load,
        }))


if __name__ == "__main__":
    main()
