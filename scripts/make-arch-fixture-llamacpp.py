#!/usr/bin/env python3
r"""Writes the llama.cpp architecture-parity fixtures in tests/fixtures/arch-llamacpp/: one tiny
random-weight GGUF per architecture family ferry implements, and expected.json with the logits
llama.cpp (through llama-cpp-python) gives for the last position of five fixed token-id prompts.
tests/suite/arch_llamacpp.rs loads the same GGUFs with ferry and compares.

Usage: /work/venv-oracle/bin/python scripts/make-arch-fixture-llamacpp.py [--write-only]
           [--only NAME,NAME]
Needs gguf 0.19 and numpy to write the files, llama-cpp-python 0.3.36 for the expected logits
(`--write-only` skips that step; `--only` writes the named fixtures and replaces only their
entries in an existing expected.json). No network, no torch.

The files follow the tensor names and metadata keys llama.cpp's convert_hf_to_gguf writes for
each architecture (checked against llama.cpp's src/models/<arch>.cpp, the version vendored in
llama-cpp-python 0.3.36):
- llama: Llama control (GQA, untied head, interleaved RoPE as GGUF stores it).
- llama-q8: the same shapes with Q8_0 matrices (embedding and head too).
- mixtral: `llama` with `expert_count`/`expert_used_count` and stacked `ffn_*_exps` experts
  (their width is feed_forward_length, as Mixtral's converter writes it).
- qwen2: q/k/v biases, tied head, NEOX RoPE.
- qwen3: q/k norms, head_dim (key_length) 32 != hidden / heads, tied head.
- qwen3moe: Qwen3 attention with routed experts (`expert_feed_forward_length`).
- gemma2: norms stored as 1 + w, post-attention / post-ffw norms, tied head, attention and final
  logit soft-capping (attention cap small enough to bite), sliding window 4 on layer 0.
- gemma3: q/k norms, sliding window 4 on layer 0 (`sliding_window_pattern` 2), the local layer's
  RoPE base from `rope.freq_base_swa` (50000 rather than the usual 10000, so a reader that
  ignores the key and assumes 10000 shows).
- gemma3-swa: gemma3's shape with its own weights and a 4160-token window; the first prompt,
  and 4,000 seeded random tokens with llama.cpp's top choice (and its margin) after each one
  (issue 32: window layers that forget what their window no longer sees must still choose as
  llama.cpp does).
- phi3: fused attn_qkv and gate/up (`ffn_up` 2 * ff rows), GQA.
- gpt-oss: q/k/v/o biases, `attn_sinks` (one logit per head, large enough to take a real share
  of the softmax), sliding window 4 on the even layers (`gpt-oss` alternates with pattern 2),
  YaRN RoPE with gpt-oss's own numbers (base 150000, factor 32, original context 4096), the
  MLP pre-norm named `post_attention_norm`, a router with a bias, experts with stacked biases,
  gate/up weights large enough that the clamped SwiGLU's limits (gate <= 7, |up| <= 7) bite.
- gpt-oss-mxfp4: the same with the experts stored as MXFP4 (what gpt-oss ships).
- qwen2moe: Qwen2 attention (q/k/v biases), routed experts plus a shared expert
  (`ffn_*_shexp`, `expert_shared_feed_forward_length`) gated by `sigmoid(ffn_gate_inp_shexp . h)`.
- glm4moe: q/k/v biases, q/k norms (GLM-4.5's; the Air has none), partial NEOX RoPE (16 of 32 head
  dims rotated), the MLP pre-norm named `post_attention_norm`, one leading dense layer
  (`leading_dense_block_count`), then routed experts with sigmoid scores, a selection-only
  correction bias (`exp_probs_b`, large enough to change the choice), the chosen weights
  normalised and scaled by `expert_weights_scale` 2.5, plus an ungated shared expert
  (`expert_shared_count` 1: the experts' width); and a trailing multi-token-prediction block
  (`nextn_predict_layers` 1, with its `nextn.*` tensors) that llama.cpp loads but never runs.
- glm4moe-q8: the same with Q8_0 matrices and no q/k norms (GLM-4.5-Air's attention).
- qwen35moe: Qwen3.5's hybrid layers (issue 29): four layers, every fourth full attention
  (`full_attention_interval` left out: llama.cpp's default 4), so layers 0-2 are Gated DeltaNet
  layers (`attn_qkv` into a 4-tap `ssm_conv1d`, `attn_gate` z, `ssm_beta`, `ssm_alpha`,
  `ssm_dt.bias`, `ssm_a` = -exp(A_log), `ssm_norm`, `ssm_out`; 2 key heads serving 4 value
  heads of 16) and layer 3 gated attention (`attn_q` with a query and an output gate per head,
  q/k norms, RoPE on 8 of 16 head dims with IMRoPE sections [2, 1, 1, 0]); the MLP pre-norm
  named `post_attention_norm`; routed experts (softmax, renormalised) plus a shared expert
  gated by `sigmoid(ffn_gate_inp_shexp . h)`.
- qwen35moe-q8: the same shapes with Q8_0 matrices (the convolution stays f32, as llama.cpp's
  quantizer leaves it).
- qwen35: the dense Qwen3.5 (SwiGLU MLP), `full_attention_interval` 2 (layers 1 and 3 attend).
- qwen35moe-long: qwen35moe's shape with its own weights; 364 seeded random tokens with
  llama.cpp's top choice after each (fed to llama.cpp in 64-token batches; ferry feeds the
  first 300 in 128-token prefill chunks and steps through the last 64), so the recurrent state
  must carry across chunk boundaries and steps.
- deepseek2: DeepSeek-V2-Lite's layout (`deepseek2`, multi-head latent attention): no query
  compression (`attention.q_lora_rank` 0: `attn_q`), `attn_kv_a_mqa` giving the latent
  (`kv_lora_rank` wide, normed by `attn_kv_a_norm`) and one RoPE part shared by the heads,
  the split `attn_k_b` / `attn_v_b` (llama.cpp's absorbed form; `key_length` / `value_length`
  the latent cache's widths, `key_length_mla` / `value_length_mla` the heads', a value width
  other than the key's no-RoPE width), interleaved RoPE with YaRN (factor 40 and DeepSeek's
  `yarn_log_multiplier`, which scales the scores), one leading dense layer, softmax routing
  (no `expert_gating_func`, as V2 GGUFs have none) not renormalised, scaled by
  `expert_weights_scale` 2, and a shared expert. Greedy continuations, and `long`: a 300-token
  seeded random prompt with llama.cpp's top choice (and margin) after each prompt token and
  its 64 greedy tokens after the prompt.
- deepseek2-v3: DeepSeek-V3's layout with Q8_0 matrices (the 3-D `attn_k_b` / `attn_v_b` too):
  query compression (`attn_q_a` -> `attn_q_a_norm` -> `attn_q_b`), sigmoid routing with the
  selection-only `exp_probs_b`, group-limited choice (`expert_group_count` 4, 2 used), the
  weights normalised and scaled by 2.5.
Fixtures with `greedy` also record the ids llama.cpp decodes greedily after each prompt (8
tokens, through its cache). All share one small SentencePiece-style vocabulary (llama.cpp needs tokenizer keys to load a
model; the prompts are token ids, so nothing is tokenized). Prompts up to 8 tokens, so the
windowed layers really drop keys.
"""

import json
import os
import sys

import gguf
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "tests", "fixtures", "arch-llamacpp")

VOCAB = 384
CONTEXT = 64
PROMPTS = [
    [1, 17, 200, 45],
    [1, 5, 9, 300, 301, 77, 12, 8],
    [42],
    [1, 100, 250, 3, 3, 3],
    [1, 383, 7, 64, 128, 256, 90],
]

BASE = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, ff=128, layers=2, eps=1e-5,
            rope_base=10000.0, tied=False, qk_norm=False, experts=0, used=0, expert_ff=0,
            qkv_bias=False, dtype="f32", o_bias=False, sinks=False, expert_bias=False,
            expert_gain=1.0, shared_ff=0, ffn_norm="ffn_norm", expert_dtype="f32",
            rope_dim=None, dense_lead=0, nextn=0, shared_gate=True, probs_bias=False)
FIXTURES = {
    "llama": dict(arch="llama"),
    "llama-q8": dict(arch="llama", dtype="q8_0"),
    "mixtral": dict(arch="llama", experts=4, used=2, ff=64, expert_ff=64),
    "qwen2": dict(arch="qwen2", qkv_bias=True, tied=True, eps=1e-6, rope_base=1_000_000.0),
    "qwen3": dict(arch="qwen3", head_dim=32, qk_norm=True, tied=True, eps=1e-6,
                  rope_base=1_000_000.0),
    "qwen3moe": dict(arch="qwen3moe", qk_norm=True, eps=1e-6, rope_base=1_000_000.0,
                     experts=4, used=2, expert_ff=64),
    "gemma2": dict(arch="gemma2", tied=True, eps=1e-6, window=4, attn_softcap=5.0,
                   final_softcap=30.0),
    "gemma3": dict(arch="gemma3", tied=True, eps=1e-6, qk_norm=True, window=4,
                   window_pattern=2, rope_base=1_000_000.0, rope_base_swa=50000.0),
    # Issue 32: 4,000 seeded random tokens fed one by one, far past the window (4 on every other
    # layer): llama.cpp's top choice after every one, so the window layers' forgetting is checked
    # against llama.cpp's SWA cache on varied input (a tiny random model's own greedy output
    # repeats one token).
    "gemma3-swa": dict(arch="gemma3", tied=False, eps=1e-6, qk_norm=True, window=4,
                       window_pattern=2, rope_base=1_000_000.0, rope_base_swa=50000.0,
                       context=4160, forced=4000, prompts=1),
    "phi3": dict(arch="phi3", eps=1e-5),
    "gpt-oss": dict(arch="gpt-oss", qkv_bias=True, o_bias=True, sinks=True, window=4,
                    rope_base=150000.0, yarn=(32.0, 4096), experts=4, used=2, expert_ff=64,
                    expert_bias=True, expert_gain=5.0, ffn_norm="post_attention_norm"),
    "gpt-oss-mxfp4": dict(arch="gpt-oss", qkv_bias=True, o_bias=True, sinks=True, window=4,
                          rope_base=150000.0, yarn=(32.0, 4096), experts=4, used=2,
                          expert_ff=64, expert_bias=True, expert_gain=5.0,
                          ffn_norm="post_attention_norm", expert_dtype="mxfp4"),
    "qwen2moe": dict(arch="qwen2moe", qkv_bias=True, eps=1e-6, rope_base=1_000_000.0,
                     experts=4, used=2, expert_ff=64, shared_ff=96),
    "glm4moe": dict(arch="glm4moe", qkv_bias=True, qk_norm=True, head_dim=32, rope_dim=16,
                    eps=1e-5, rope_base=1_000_000.0, experts=8, used=2, expert_ff=48,
                    shared_ff=48, shared_gate=False, probs_bias=True, dense_lead=1, nextn=1,
                    layers=3, ffn_norm="post_attention_norm", greedy=8),
    "qwen35moe": dict(arch="qwen35moe", eps=1e-6, rope_base=1_000_000.0, rope_dim=8, layers=4,
                      experts=4, used=2, expert_ff=32, shared_ff=64,
                      ffn_norm="post_attention_norm", greedy=8),
    "qwen35moe-q8": dict(arch="qwen35moe", eps=1e-6, rope_base=1_000_000.0, rope_dim=8,
                         layers=4, experts=4, used=2, expert_ff=32, shared_ff=64,
                         ffn_norm="post_attention_norm", dtype="q8_0", greedy=8),
    "qwen35": dict(arch="qwen35", eps=1e-6, rope_base=1_000_000.0, rope_dim=8, layers=4,
                   full_attention_interval=2, ffn_norm="post_attention_norm", greedy=8),
    "qwen35moe-long": dict(arch="qwen35moe", eps=1e-6, rope_base=1_000_000.0, rope_dim=8,
                           layers=4, experts=4, used=2, expert_ff=32, shared_ff=64,
                           ffn_norm="post_attention_norm", context=512, forced=364, prompts=1),
    "glm4moe-q8": dict(arch="glm4moe", qkv_bias=True, head_dim=32, rope_dim=16, eps=1e-5,
                       rope_base=1_000_000.0, experts=8, used=2, expert_ff=64, shared_ff=64,
                       shared_gate=False, probs_bias=True, dense_lead=1, nextn=1, layers=3,
                       ffn_norm="post_attention_norm", dtype="q8_0", greedy=8),
    "deepseek2": dict(arch="deepseek2", mla=dict(q_lora=0, kv_lora=32, nope=16, rope=8, v=20),
                      kv_heads=1, eps=1e-6, experts=8, used=2, expert_ff=32, shared_ff=32,
                      shared_gate=False, dense_lead=1, layers=3, yarn=(40.0, 4096),
                      yarn_log_mul=0.0707, weights_scale=2.0, greedy=8, context=400,
                      long=(300, 64)),
    "deepseek2-v3": dict(arch="deepseek2", mla=dict(q_lora=32, kv_lora=32, nope=32, rope=16,
                                                    v=24),
                         kv_heads=1, eps=1e-6, experts=8, used=2, expert_ff=32, shared_ff=32,
                         shared_gate=False, probs_bias=True, dense_lead=1, layers=3,
                         yarn=(40.0, 4096), yarn_log_mul=0.1, weights_scale=2.5, norm_w=True,
                         gating="sigmoid", groups=(4, 2), dtype="q8_0", greedy=8),
}


def vocab():
    """`<unk>`, `<s>`, `</s>`, letters, `▁`letters, then letter pairs (as tests/suite/tiny.rs)."""
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    tokens = ["<unk>", "<s>", "</s>"] + letters + ["\u2581" + c for c in letters]
    pairs = (a + b for a in letters for b in letters)
    while len(tokens) < VOCAB:
        tokens.append(next(pairs))
    types = [2, 3, 3] + [1] * (VOCAB - 3)
    return tokens, [-float(i) for i in range(VOCAB)], types


# Qwen3.5's Gated DeltaNet shape in the qwen35 fixtures: 2 key heads and 4 value heads of 16,
# a 4-tap convolution.
DELTA = dict(k_heads=2, v_heads=4, head=16, conv=4)


def delta_net_layer(tensors, p, h, mat, norm, rng):
    """A Gated DeltaNet layer's tensors as llama.cpp's converter names and shapes them."""
    kh, vh, d, conv = DELTA["k_heads"], DELTA["v_heads"], DELTA["head"], DELTA["conv"]
    channels = 2 * kh * d + vh * d
    tensors[p + "attn_qkv.weight"] = mat(channels, h)
    tensors[p + "attn_gate.weight"] = mat(vh * d, h)
    # numpy (channels, taps) is GGUF ne {taps, channels}.
    tensors[p + "ssm_conv1d.weight"] = (0.5 * rng.standard_normal((channels, conv))).astype(np.float32)
    tensors[p + "ssm_dt.bias"] = (0.5 * rng.standard_normal(vh)).astype(np.float32)
    # -exp(A_log), as the converter stores it: decays between about e^-0.1 and e^-3 per token.
    tensors[p + "ssm_a"] = (-np.exp(rng.uniform(-2.0, 0.5, vh))).astype(np.float32)
    tensors[p + "ssm_beta.weight"] = mat(vh, h, 2.0)
    tensors[p + "ssm_alpha.weight"] = mat(vh, h, 2.0)
    tensors[p + "ssm_norm.weight"] = norm(d)
    tensors[p + "ssm_out.weight"] = mat(h, vh * d)


def write(name, cfg):
    c = dict(BASE, **cfg)
    arch, h, nh, nkv, hd, ff = c["arch"], c["hidden"], c["heads"], c["kv_heads"], c["head_dim"], c["ff"]
    gemma = arch.startswith("gemma")
    rng = np.random.default_rng(sum(map(ord, name)) * 7919)

    def mat(rows, cols, gain=1.0):
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def norm(n):
        # llama.cpp's converter stores Gemma's (1 + w) already added: both are near 1 here.
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    tensors = {"token_embd.weight": rng.standard_normal((VOCAB, h)).astype(np.float32),
               "output_norm.weight": norm(h)}
    if not c["tied"]:
        tensors["output.weight"] = mat(VOCAB, h, 2.0)
    qk_gain = 2.0 if gemma else 1.0
    qwen35 = arch in ("qwen35", "qwen35moe")
    interval = c.get("full_attention_interval", 4)
    for i in range(c["layers"] + c["nextn"]):
        p = f"blk.{i}."
        tensors[p + "attn_norm.weight"] = norm(h)
        q, k, v = mat(nh * hd, h, qk_gain), mat(nkv * hd, h, qk_gain), mat(nkv * hd, h)
        if qwen35 and (i + 1) % interval != 0:
            delta_net_layer(tensors, p, h, mat, norm, rng)
        elif qwen35:
            # Per head, its query then its output gate.
            gate = mat(nh * hd, h)
            tensors[p + "attn_q.weight"] = np.stack(
                [q.reshape(nh, hd, h), gate.reshape(nh, hd, h)], axis=1).reshape(2 * nh * hd, h)
            tensors[p + "attn_k.weight"], tensors[p + "attn_v.weight"] = k, v
        elif "mla" in c:
            m = c["mla"]
            qk = m["nope"] + m["rope"]
            if m["q_lora"]:
                tensors[p + "attn_q_a.weight"] = mat(m["q_lora"], h)
                tensors[p + "attn_q_a_norm.weight"] = norm(m["q_lora"])
                tensors[p + "attn_q_b.weight"] = mat(nh * qk, m["q_lora"], 2.0)
            else:
                tensors[p + "attn_q.weight"] = mat(nh * qk, h, 2.0)
            tensors[p + "attn_kv_a_mqa.weight"] = mat(m["kv_lora"] + m["rope"], h, 2.0)
            tensors[p + "attn_kv_a_norm.weight"] = norm(m["kv_lora"])
            # llama.cpp's split of kv_b: per head, k_b `[kv_lora, nope]` (transposed) and v_b
            # `[v, kv_lora]` (ggml's {nope, kv_lora, heads} and {kv_lora, v, heads}).
            tensors[p + "attn_k_b.weight"] = np.stack(
                [mat(m["nope"], m["kv_lora"], 2.0).T.copy() for _ in range(nh)])
            tensors[p + "attn_v_b.weight"] = np.stack(
                [mat(m["v"], m["kv_lora"]) for _ in range(nh)])
            tensors[p + "attn_output.weight"] = mat(h, nh * m["v"])
        elif arch == "phi3":
            tensors[p + "attn_qkv.weight"] = np.concatenate([q, k, v])
        else:
            tensors[p + "attn_q.weight"], tensors[p + "attn_k.weight"] = q, k
            tensors[p + "attn_v.weight"] = v
        if c["qkv_bias"]:
            for part, n in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
                tensors[p + f"attn_{part}.bias"] = (0.5 * rng.standard_normal(n)).astype(np.float32)
        if "mla" not in c and (not qwen35 or (i + 1) % interval == 0):
            tensors[p + "attn_output.weight"] = mat(h, nh * hd)
        if c["o_bias"]:
            tensors[p + "attn_output.bias"] = (0.5 * rng.standard_normal(h)).astype(np.float32)
        if c["sinks"]:
            # Around the scores' size, so the sinks take a real share of each softmax.
            tensors[p + "attn_sinks.weight"] = (1.0 + rng.standard_normal(nh)).astype(np.float32)
        if c["qk_norm"] or (qwen35 and (i + 1) % interval == 0):
            tensors[p + "attn_q_norm.weight"] = norm(hd)
            tensors[p + "attn_k_norm.weight"] = norm(hd)
        if gemma:
            tensors[p + "post_attention_norm.weight"] = norm(h)
            tensors[p + "post_ffw_norm.weight"] = norm(h)
        tensors[p + c["ffn_norm"] + ".weight"] = norm(h)
        if c["experts"] and i >= c["dense_lead"]:
            e, eff, gain = c["experts"], c["expert_ff"], c["expert_gain"]
            tensors[p + "ffn_gate_inp.weight"] = mat(e, h, 2.0)
            tensors[p + "ffn_gate_exps.weight"] = np.stack([mat(eff, h, gain) for _ in range(e)])
            tensors[p + "ffn_up_exps.weight"] = np.stack([mat(eff, h, gain) for _ in range(e)])
            tensors[p + "ffn_down_exps.weight"] = np.stack([mat(h, eff) for _ in range(e)])
            if c["expert_bias"]:
                def bias(*shape):
                    return (0.5 * rng.standard_normal(shape)).astype(np.float32)
                tensors[p + "ffn_gate_inp.bias"] = bias(e)
                tensors[p + "ffn_gate_exps.bias"] = bias(e, eff)
                tensors[p + "ffn_up_exps.bias"] = bias(e, eff)
                tensors[p + "ffn_down_exps.bias"] = bias(e, h)
            if c["shared_ff"]:
                sff = c["shared_ff"]
                if c["shared_gate"]:
                    tensors[p + "ffn_gate_inp_shexp.weight"] = mat(1, h, 2.0)[0]
                tensors[p + "ffn_gate_shexp.weight"] = mat(sff, h)
                tensors[p + "ffn_up_shexp.weight"] = mat(sff, h)
                tensors[p + "ffn_down_shexp.weight"] = mat(h, sff)
            if c["probs_bias"]:
                # Around the spread of the sigmoid scores, so it changes which experts win.
                tensors[p + "exp_probs_b.bias"] = (0.3 * rng.standard_normal(e)).astype(np.float32)
        elif arch == "phi3":
            tensors[p + "ffn_up.weight"] = np.concatenate([mat(ff, h), mat(ff, h)])
            tensors[p + "ffn_down.weight"] = mat(h, ff)
        else:
            tensors[p + "ffn_gate.weight"] = mat(ff, h)
            tensors[p + "ffn_up.weight"] = mat(ff, h)
            tensors[p + "ffn_down.weight"] = mat(h, ff)
        if i >= c["layers"]:
            # A multi-token-prediction block: llama.cpp loads it and runs only the layers before.
            tensors[p + "nextn.eh_proj.weight"] = mat(h, 2 * h)
            tensors[p + "nextn.enorm.weight"] = norm(h)
            tensors[p + "nextn.hnorm.weight"] = norm(h)
            tensors[p + "nextn.shared_head_norm.weight"] = norm(h)

    path = os.path.join(OUT, f"{name}.gguf")
    w = gguf.GGUFWriter(path, arch)
    # No architecture in the name: llama.cpp's vocabulary loader applies Phi-3 rules (which need
    # Phi-3's special tokens) to any model named "phi3".
    w.add_name("ferry tiny random")
    w.add_context_length(c.get("context", CONTEXT))
    w.add_embedding_length(h)
    w.add_feed_forward_length(ff)
    w.add_block_count(c["layers"] + c["nextn"])
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    if "mla" in c:
        # The converter's MLA numbers: the cached latent's widths, then the heads'.
        m = c["mla"]
        w.add_q_lora_rank(m["q_lora"])
        w.add_kv_lora_rank(m["kv_lora"])
        w.add_key_length(m["kv_lora"] + m["rope"])
        w.add_value_length(m["kv_lora"])
        w.add_key_length_mla(m["nope"] + m["rope"])
        w.add_value_length_mla(m["v"])
        w.add_rope_dimension_count(m["rope"])
    else:
        w.add_key_length(hd)
        w.add_value_length(hd)
        w.add_rope_dimension_count(c["rope_dim"] or hd)
    w.add_rope_freq_base(c["rope_base"])
    w.add_layer_norm_rms_eps(c["eps"])
    w.add_vocab_size(VOCAB)
    if c["experts"]:
        w.add_expert_count(c["experts"])
        w.add_expert_used_count(c["used"])
        if arch != "llama":
            # llama.cpp's `llama` sizes experts by feed_forward_length (Mixtral's converter
            # writes no expert width).
            w.add_expert_feed_forward_length(c["expert_ff"])
        if c["shared_ff"] and arch in ("glm4moe", "deepseek2"):
            # GLM's shared experts are `expert_shared_count` experts wide.
            w.add_expert_shared_count(c["shared_ff"] // c["expert_ff"])
        elif c["shared_ff"]:
            w.add_expert_shared_feed_forward_length(c["shared_ff"])
    if arch in ("qwen35", "qwen35moe"):
        kh, vh, d = DELTA["k_heads"], DELTA["v_heads"], DELTA["head"]
        w.add_ssm_conv_kernel(DELTA["conv"])
        w.add_ssm_inner_size(vh * d)
        w.add_ssm_state_size(d)
        w.add_ssm_time_step_rank(vh)
        w.add_ssm_group_count(kh)
        w.add_rope_dimension_sections([2, 1, 1, 0])
        if "full_attention_interval" in c:
            w.add_full_attention_interval(c["full_attention_interval"])
    if arch == "glm4moe":
        w.add_leading_dense_block_count(c["dense_lead"])
        w.add_expert_weights_scale(2.5)
        w.add_expert_weights_norm(True)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_nextn_predict_layers(c["nextn"])
    if arch == "deepseek2":
        w.add_leading_dense_block_count(c["dense_lead"])
        w.add_expert_weights_scale(c["weights_scale"])
        if c.get("norm_w"):
            w.add_expert_weights_norm(True)
        if c.get("gating") == "sigmoid":
            w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        if "groups" in c:
            w.add_expert_group_count(c["groups"][0])
            w.add_expert_group_used_count(c["groups"][1])
    if "yarn_log_mul" in c:
        # 0.1 * mscale_all_dim, as DeepSeek's converter writes it.
        w.add_rope_scaling_yarn_log_mul(c["yarn_log_mul"])
    if "window" in c:
        w.add_sliding_window(c["window"])
    if "window_pattern" in c:
        w.add_uint32(f"{arch}.attention.sliding_window_pattern", c["window_pattern"])
    if "yarn" in c:
        factor, original = c["yarn"]
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(original)
    if "rope_base_swa" in c:
        w.add_rope_freq_base_swa(c["rope_base_swa"])
    if "attn_softcap" in c:
        w.add_attn_logit_softcapping(c["attn_softcap"])
    if "final_softcap" in c:
        w.add_final_logit_softcapping(c["final_softcap"])
    tokens, scores, types = vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    for tname in sorted(tensors):
        t = tensors[tname]
        if c["dtype"] == "q8_0" and t.ndim >= 2 and "ssm_conv1d" not in tname:
            q = gguf.quants.quantize(t, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(tname, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        elif c["expert_dtype"] == "mxfp4" and tname.endswith("_exps.weight"):
            q = gguf.quants.quantize(t, gguf.GGMLQuantizationType.MXFP4)
            w.add_tensor(tname, q, raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            w.add_tensor(tname, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def open_llama(path, context):
    """A llama.cpp context on `path` with every position's logits kept and an f32 key/value cache
    (llama.cpp's default is f16; ferry keeps f32 on the CPU for these checks), its weights in
    plain CPU buffers (see benches/llama_cpp_peer.py: AMX tiles segfault in VMs that do not grant
    the tile state)."""
    GGML_TYPE_F32 = 0
    import llama_cpp.llama_cpp as api
    from llama_cpp import Llama

    default_params = api.llama_model_default_params

    def plain():
        params = default_params()
        params.use_extra_bufts = False
        return params

    api.llama_model_default_params = plain
    try:
        return Llama(model_path=path, n_ctx=context, n_batch=CONTEXT, n_threads=2,
                     n_threads_batch=2, logits_all=True, verbose=False,
                     type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32)
    finally:
        api.llama_model_default_params = default_params


def forced_oracle(path, n, context):
    """llama.cpp's top choice and its margin over the second after each of `n` seeded random
    tokens (one context, evaluated in batches, every position's logits kept)."""
    rng = np.random.default_rng(32)
    ids = [int(i) for i in rng.integers(3, VOCAB, size=n)]
    llm = open_llama(path, context)
    llm.eval(ids)
    scores = np.array(llm.scores[:n], dtype=np.float32)
    llm.close()
    order = np.argsort(-scores, axis=1, kind="stable")
    top = order[:, 0]
    margin = scores[np.arange(n), top] - scores[np.arange(n), order[:, 1]]
    return {"ids": ids, "top1": [int(t) for t in top], "margin": [float(m) for m in margin]}


def long_oracle(path, n, greedy, context):
    """A seeded random prompt of `n` tokens (evaluated in batches of `CONTEXT`): llama.cpp's top
    choice and margin after each prompt token, then the `greedy` ids it decodes after the
    prompt (one at a time, through the context's cache)."""
    rng = np.random.default_rng(29)
    ids = [int(i) for i in rng.integers(3, VOCAB, size=n)]
    llm = open_llama(path, context)
    llm.eval(ids)
    scores = np.array(llm.scores[:n], dtype=np.float32)
    order = np.argsort(-scores, axis=1, kind="stable")
    top = order[:, 0]
    margin = scores[np.arange(n), top] - scores[np.arange(n), order[:, 1]]
    decoded, last = [], scores[n - 1]
    for _ in range(greedy):
        token = int(np.argmax(last))
        decoded.append(token)
        llm.eval([token])
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    llm.close()
    return {"ids": ids, "top1": [int(t) for t in top], "margin": [float(m) for m in margin],
            "greedy": decoded}


def oracle(path, greedy, context=CONTEXT, prompts=None):
    """llama.cpp's last-position logits for each prompt, each prompt in a fresh context, and
    with `greedy` the ids of that many tokens decoded greedily after it (one at a time, through
    the context's cache)."""
    out = []
    for ids in PROMPTS[:prompts]:
        llm = open_llama(path, context)
        llm.eval(ids)
        logits = np.array(llm.scores[len(ids) - 1], dtype=np.float32)
        top = np.argsort(-logits, kind="stable")[:10]
        result = {
            "ids": ids,
            "top10_ids": [int(i) for i in top],
            "top10_logits": [float(logits[i]) for i in top],
            "logits": [float(x) for x in logits],
        }
        if greedy:
            decoded, last = [], logits
            for _ in range(greedy):
                token = int(np.argmax(last))
                decoded.append(token)
                llm.eval([token])
                last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            result["greedy"] = decoded
        out.append(result)
        llm.close()
    return out


def main():
    args = sys.argv[1:]
    write_only = "--write-only" in args
    only = args[args.index("--only") + 1].split(",") if "--only" in args else list(FIXTURES)
    os.makedirs(OUT, exist_ok=True)
    expected = {"vocab": VOCAB, "prompts": PROMPTS, "models": {}}
    existing = os.path.join(OUT, "expected.json")
    if "--only" in args and os.path.exists(existing):
        with open(existing) as f:
            expected = json.load(f)
    for name in only:
        cfg = FIXTURES[name]
        path = write(name, cfg)
        print(f"wrote {path} ({os.path.getsize(path)} bytes)")
        if not write_only:
            expected["models"][name] = {"gguf_file": f"{name}.gguf", "arch": cfg["arch"],
                                        "results": oracle(path, cfg.get("greedy", 0),
                                                          cfg.get("context", CONTEXT),
                                                          cfg.get("prompts"))}
            if cfg.get("long"):
                n, greedy = cfg["long"]
                expected["models"][name]["long"] = long_oracle(
                    path, n, greedy, cfg.get("context", CONTEXT))
            if cfg.get("forced"):
                expected["models"][name]["forced"] = forced_oracle(
                    path, cfg["forced"], cfg.get("context", CONTEXT))
    if not write_only:
        import llama_cpp
        expected["llama_cpp_python"] = llama_cpp.__version__
        with open(os.path.join(OUT, "expected.json"), "w") as f:
            json.dump(expected, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
