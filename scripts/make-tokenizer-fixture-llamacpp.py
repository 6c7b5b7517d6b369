#!/usr/bin/env python3
r"""Writes the llama.cpp tokenizer-parity fixtures in tests/fixtures/tokenizer-llamacpp/: vocabulary-only
GGUFs and, for each, the token ids llama.cpp (through llama-cpp-python) gives an awkward-strings list.
tests/suite/tokenizer_llamacpp.rs loads the same GGUFs with ferry and expects the same ids.

Usage: /work/venv-oracle/bin/python scripts/make-tokenizer-fixture-llamacpp.py
Needs llama-cpp-python 0.3.36 (llama.cpp built from source), gguf 0.19, sentencepiece 0.2 and the
`tokenizers` package (0.23) for training the small BPE vocabularies; no network, no torch.

The vocabularies (each GGUF is written once; "variants" change only metadata keys, which the
Rust test applies to the same file):
- ggml-vocab-phi-3.gguf: a real SentencePiece vocabulary, Phi-3's (Llama 2's 32000 pieces with
  their scores and byte tokens, plus Phi-3's control tokens), copied unchanged from llama.cpp's
  models/ggml-vocab-phi-3.gguf (commit 1eeb523c3e0c7ffbd59469f5463dcbdecba3535e, via the public
  mirror github.com/ye-NX/llama.cpp). Variants: as shipped (general.name "Phi3": llama.cpp's
  Phi-3 rule makes special tokens strip the whitespace after them) and renamed to "llama-spm"
  (Llama 2 behaviour: no stripping).
- spm-gemma.gguf: a SentencePiece BPE vocabulary trained here on corpus.txt, laid out as Gemma's
  (<pad> <eos> <bos> <unk> first, control <start_of_turn>/<end_of_turn>/<unusedN>, byte tokens,
  user-defined whitespace runs stored with real spaces as llama.cpp's converter stores them, no
  space prefix). Variants: Gemma (add_space_prefix false) and with the space prefix (Llama style,
  so byte fallback for characters the small vocabulary lacks is tested with the prefix too).
- bpe-qwen2.gguf: byte-level BPE trained on corpus.txt with Qwen2's split regex, Qwen2's special
  tokens (<|endoftext|>, <|im_start|>, <|im_end|>, FIM and repo tokens as control, <think> and
  <tool_call> pairs as user-defined).
- bpe-probe.gguf: byte-level BPE trained without any word split (whole lines of corpus.txt and
  of the test strings), so its merges cross spaces, punctuation, digits and case changes: any
  difference in where a pre-tokenizer cuts words shows in the ids. Variants over
  `tokenizer.ggml.pre`: qwen2, qwen35, llama-bpe, smollm, gpt-2, default, glm4, dbrx, gpt-4o,
  tekken.
- bpe-llama3.gguf: byte-level BPE trained with Llama 3's regex, Llama 3's special tokens after the
  vocabulary (<|begin_of_text|> ... <|eot_id|>), add_bos, and two whole-word tokens no merge
  sequence reaches (so `ignore_merges` is exercised). Variants: llama-bpe, and gpt-4o with
  gpt-oss's harmony tokens (<|start|>, <|channel|>, <|message|>, <|end|>, <|return|>, <|call|>).

For each variant and string the fixture records llama_tokenize with (add_special, parse_special) =
(false, true), (true, true) and (false, false), llama_detokenize(ids, remove_special=false,
unparse_special=true), the concatenated pieces (llama_token_to_piece(special=true) of each id) and
the end-of-generation set (llama_vocab_is_eog). For byte-level variants it also records the ids
Hugging Face's `tokenizers` gives with the model's original split regex (same vocabulary, merges
and special tokens); where llama.cpp and that differ (llama.cpp approximates some regexes) the case
lists both, and the test expects ferry to follow the original regex there.
"""

import ctypes
import hashlib
import json
import os
import sys
import tempfile

import gguf
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer-llamacpp")
CORPUS = os.path.join(OUT, "corpus.txt")

# ---------------------------------------------------------------------------------------------
# Strings. The first list is llama.cpp's own tokenizer test input (models/ggml-vocab-*.gguf.inp).
LLAMACPP_INP = [
    "ied 4 ½ months", "Äpfel", "", " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\t\n",
    "Hello world", " Hello world", "Hello World", " Hello World", " Hello World!", "Hello, world!",
    " Hello, world!", " this is 🦙.cpp", "w048 7tuijk dsdfhu", "нещо на Български",
    "កាន់តែពិសេសអាចខលចេញ",
    "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ (only emoji that has its own token)",
    "Hello", " Hello", "  Hello", "   Hello", "    Hello", "    Hello\n    Hello", " (", "\n =",
    "' era", "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～", "!!!!!!", "3", "33", "333",
    "3333", "33333", "333333", "3333333", "33333333", "333333333", "Cửa Việt", " discards",
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL",
]

AWKWARD = [
    "The capital of France is",
    " leading space",
    "  two leading spaces",
    "trailing spaces   ",
    "multiple     spaces  inside",
    "0",
    "42",
    "1234567890",
    "x=12345678901234567890;",
    "3.14159 and 2.71828",
    "1,000,000 people in 2024.",
    " 7 8  9",
    "Total:  100  items\n  42\t\t7",
    "café naïve résumé à la carte",
    "Ünïcödé ÀÇÇÉNTS",
    "ÀÇÇÉNTS and ÉCOLE, ÉcoleNormale, HTTPServer, iPhone, McDonald's",
    "e\u0301te\u0301 (combining accents)",
    "日本語のテキストです。",
    "中文测试，标点符号！",
    "한국어 텍스트",
    "Привет, мир!",
    "مرحبا بالعالم",
    "ß ẞ ﬁ ＦＵＬＬＷＩＤＴＨ",
    "😀",
    "👨‍👩‍👧‍👦 family",
    "🏳️‍🌈 flag and 👍🏽 thumbs and 🇫🇷",
    "😀😀😀",
    "def f(x):\n\treturn x  # comment\r\n",
    "if (a &&  b) {\n    return;\n}\n",
    "\t\tindented\ttabs\t",
    "a\r\nb\r\n\r\nc",
    "line with trailing spaces   \nnext",
    "```rust\nfn main() { println!(\"hi\"); }\n```",
    "I'm sure they'll say we've done what THEY'RE doing, don't you?",
    "nbsp\u00a0here and zero\u200bwidth and ideographic\u3000space",
    "abcabcabc ababab aaaa bbbbbbbb",
    "<s>",
    "</s>",
    "<unk>",
    "<|endoftext|>",
    "text<|endoftext|>more text",
]

# Strings with each vocabulary's own special tokens inside text.
SPECIAL_STRINGS = {
    "phi-3": [
        "<s><|user|>\nHello!<|end|>\n<|assistant|>\n",
        "<|user|>   spaces after a special token<|end|>  \n  <|assistant|>",
        "<|system|>\tBe brief.<|end|>\n<|user|>\nHi</s> after",
        "a<|endoftext|> b<|placeholder1|>  c",
        "[PAD32011] padded [PAD32063]",
        "<|user",
    ],
    "spm-gemma": [
        "<bos><start_of_turn>user\nHello!<end_of_turn>\n<start_of_turn>model\n",
        "<start_of_turn>user\n\n\n  two spaces and newlines<end_of_turn>",
        "a<unused0>b<unused1> c",
        "<table>cell</table>   three spaces",
        "<start_of_turn",
    ],
    "bpe-qwen2": [
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "<think>\nreasoning\n</think>\n\nanswer",
        "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
        "<|fim_prefix|>def f(<|fim_suffix|>):<|fim_middle|>",
        "<|im_start",
    ],
    "bpe-probe": [
        "<|im_start|>user\nHi<|im_end|>",
    ],
    "bpe-llama3": [
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        "unmergeable zzzz unmergeable",
        "<|start|>assistant<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>",
        "<|reserved_special_token_0|> reserved",
    ],
}

# ---------------------------------------------------------------------------------------------
# GGUF writing.

ARCH = "llama"
HPARAMS = [
    ("llama.context_length", 256, gguf.GGUFValueType.UINT32),
    ("llama.embedding_length", 16, gguf.GGUFValueType.UINT32),
    ("llama.block_count", 1, gguf.GGUFValueType.UINT32),
    ("llama.feed_forward_length", 32, gguf.GGUFValueType.UINT32),
    ("llama.attention.head_count", 2, gguf.GGUFValueType.UINT32),
    ("llama.attention.head_count_kv", 2, gguf.GGUFValueType.UINT32),
    ("llama.attention.layer_norm_rms_epsilon", 1e-5, gguf.GGUFValueType.FLOAT32),
]
T = gguf.GGUFValueType


def write_gguf(path, kv):
    """kv: list of (key, value, type, subtype). general.architecture first."""
    arch = next(v for k, v, _, _ in kv if k == "general.architecture")
    w = gguf.GGUFWriter(path, arch)
    for key, value, vtype, sub in kv:
        if key == "general.architecture":
            continue
        w.add_key_value(key, value, vtype, sub_type=sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def read_gguf_kv(path):
    reader = gguf.GGUFReader(path)
    kv = []
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == T.ARRAY else None
        value = field.contents()
        kv.append((key, value, vtype, sub))
    return kv


def with_overrides(kv, overrides):
    out = []
    done = set()
    for key, value, vtype, sub in kv:
        if key in overrides:
            value = overrides[key]
            done.add(key)
        out.append((key, value, vtype, sub))
    for key, value in overrides.items():
        if key not in done:
            vtype = T.BOOL if isinstance(value, bool) else T.STRING
            out.append((key, value, vtype, None))
    return out


def tokenizer_kv(name, model, pre, tokens, types, scores=None, merges=None, ids=None, flags=None):
    kv = [("general.architecture", ARCH, T.STRING, None), ("general.name", name, T.STRING, None)]
    kv += [(k, v, t, None) for k, v, t in HPARAMS]
    kv += [
        ("tokenizer.ggml.model", model, T.STRING, None),
        ("tokenizer.ggml.pre", pre, T.STRING, None),
        ("tokenizer.ggml.tokens", tokens, T.ARRAY, T.STRING),
        ("tokenizer.ggml.token_type", types, T.ARRAY, T.INT32),
    ]
    if scores is not None:
        kv.append(("tokenizer.ggml.scores", scores, T.ARRAY, T.FLOAT32))
    if merges is not None:
        kv.append(("tokenizer.ggml.merges", merges, T.ARRAY, T.STRING))
    for key, value in (ids or {}).items():
        kv.append((f"tokenizer.ggml.{key}", value, T.UINT32, None))
    for key, value in (flags or {}).items():
        kv.append((f"tokenizer.ggml.{key}", value, T.BOOL, None))
    return kv


# ---------------------------------------------------------------------------------------------
# Vocabularies.

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
EOG_TEXTS = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>",
}


def spm_gemma_kv():
    import sentencepiece as spm

    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "spm")
        spm.SentencePieceTrainer.train(
            input=CORPUS, model_prefix=prefix, vocab_size=900, model_type="bpe",
            byte_fallback=True, character_coverage=0.9995, split_digits=True,
            add_dummy_prefix=False, remove_extra_whitespaces=False, normalization_rule_name="identity",
            allow_whitespace_only_pieces=True, minloglevel=2, num_threads=1,
            unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1,
        )
        sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    head = [
        ("<pad>", CONTROL), ("<eos>", CONTROL), ("<bos>", CONTROL), ("<unk>", UNKNOWN), ("<mask>", USER_DEFINED),
        ("<start_of_turn>", CONTROL), ("<end_of_turn>", CONTROL), ("<unused0>", CONTROL), ("<unused1>", CONTROL),
    ]
    tokens = [t for t, _ in head]
    types = [k for _, k in head]
    scores = [0.0] * len(head)
    for i in range(sp.get_piece_size()):
        if sp.is_unknown(i):
            continue
        tokens.append(sp.id_to_piece(i))
        types.append(BYTE if sp.is_byte(i) else NORMAL)
        scores.append(float(sp.get_score(i)))
    # Gemma's user-defined tokens: whitespace runs (stored with real spaces) and a few tags.
    for text in ["\n", "\n\n", "\n\n\n", "  ", "   ", "\t\t", "<table>", "</table>"]:
        assert text not in tokens, text
        tokens.append(text)
        types.append(USER_DEFINED)
        scores.append(0.0)
    assert len(set(tokens)) == len(tokens)
    return tokenizer_kv(
        "gemma-3-tiny-vocab", "llama", "default", tokens, types, scores=scores,
        ids={"bos_token_id": 2, "eos_token_id": 1, "unknown_token_id": 3, "padding_token_id": 0},
        flags={"add_bos_token": True, "add_eos_token": False, "add_space_prefix": False},
    )


QWEN2_REGEX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN35_REGEX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
GPT4O_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TEKKEN_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
DEFAULT_REGEXES = [r"[\p{P}\$\+<=>\^~\|]+", GPT2_REGEX, r"\p{N}+", r"[0-9][0-9][0-9]"]

# The original (Hugging Face) pre-tokenizer of each pre type: (list of split regexes, digits first).
PRE_ORIGINAL = {
    "qwen2": [QWEN2_REGEX], "qwen35": [QWEN35_REGEX], "llama-bpe": [LLAMA3_REGEX], "glm4": [LLAMA3_REGEX],
    "dbrx": [LLAMA3_REGEX], "gpt-4o": [GPT4O_REGEX], "tekken": [TEKKEN_REGEX], "gpt-2": [GPT2_REGEX],
    "smollm": [r"\p{N}", GPT2_REGEX], "default": DEFAULT_REGEXES,
}
# llama.cpp's clean_spaces (decode-time cleanup) per pre type: on for these.
CLEAN_SPACES = {"gpt-2", "default", "llama-bpe", "glm4", "dbrx"}


def byte_level_pre(regexes):
    from tokenizers import Regex, pre_tokenizers

    steps = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)


def train_byte_bpe(regex, vocab_size, extra_texts=()):
    """Byte-level BPE on corpus.txt (one word per regex match, or whole lines when regex is None)."""
    from tokenizers import Tokenizer, models, trainers, pre_tokenizers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = byte_level_pre([regex] if regex else [])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    with open(CORPUS, encoding="utf-8") as f:
        lines = f.read().splitlines()
    # The test strings twice each, so their pairs reach min_frequency.
    lines += [t for t in extra_texts for _ in range(2)]
    tok.train_from_iterator(lines, trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    return tokens, merges


def bpe_probe_kv(texts):
    tokens, merges = train_byte_bpe(None, 2500, extra_texts=texts)
    types = [NORMAL] * len(tokens)
    for text in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]:
        if text in tokens:  # learned from the test strings
            types[tokens.index(text)] = CONTROL
        else:
            tokens.append(text)
            types.append(CONTROL)
    return tokenizer_kv(
        "regex-probe-vocab", "gpt2", "qwen2", tokens, types, merges=merges,
        ids={"bos_token_id": tokens.index("<|endoftext|>"), "eos_token_id": tokens.index("<|im_end|>")},
        flags={"add_bos_token": False},
    )


def bpe_qwen2_kv():
    tokens, merges = train_byte_bpe(QWEN2_REGEX, 1200)
    types = [NORMAL] * len(tokens)
    for text, kind in [
        ("<|endoftext|>", CONTROL), ("<|im_start|>", CONTROL), ("<|im_end|>", CONTROL),
        ("<|fim_prefix|>", CONTROL), ("<|fim_middle|>", CONTROL), ("<|fim_suffix|>", CONTROL),
        ("<|fim_pad|>", CONTROL), ("<|repo_name|>", CONTROL), ("<|file_sep|>", CONTROL),
        ("<tool_call>", USER_DEFINED), ("</tool_call>", USER_DEFINED), ("<think>", USER_DEFINED),
        ("</think>", USER_DEFINED),
    ]:
        tokens.append(text)
        types.append(kind)
    eot = tokens.index("<|endoftext|>")
    return tokenizer_kv(
        "qwen3-tiny-vocab", "gpt2", "qwen2", tokens, types, merges=merges,
        ids={"bos_token_id": eot, "eos_token_id": tokens.index("<|im_end|>"), "padding_token_id": eot},
        flags={"add_bos_token": False},
    )


def bpe_llama3_kv():
    tokens, merges = train_byte_bpe(LLAMA3_REGEX, 1200)
    types = [NORMAL] * len(tokens)
    # Whole words no merge sequence reaches: only `ignore_merges` produces them.
    for word in ["Ġunmergeable", "Ġzzzz"]:
        assert word not in tokens
        tokens.append(word)
        types.append(NORMAL)
    specials = [
        "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
        "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
        "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
        # gpt-oss's harmony tokens (o200k_harmony), for the gpt-4o variant.
        "<|startoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>", "<|end|>",
        "<|message|>", "<|call|>",
    ]
    for text in specials:
        tokens.append(text)
        types.append(CONTROL)
    return tokenizer_kv(
        "llama-3-tiny-vocab", "gpt2", "llama-bpe", tokens, types, merges=merges,
        ids={"bos_token_id": tokens.index("<|begin_of_text|>"), "eos_token_id": tokens.index("<|eot_id|>")},
        flags={"add_bos_token": True},
    )


# ---------------------------------------------------------------------------------------------
# llama.cpp.


def load_llama_cpp():
    import llama_cpp.llama_cpp as L

    # ggml's AMX extra buffers segfault on some VMs (benches/llama_cpp_peer.py); vocab_only loads
    # no weights anyway.
    default = L.llama_model_default_params

    def plain():
        params = default()
        params.use_extra_bufts = False
        params.vocab_only = True
        return params

    L.llama_model_default_params = plain
    L.llama_backend_init()
    return L


class LlamaVocab:
    def __init__(self, L, path):
        self.L = L
        params = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(path.encode(), params)
        assert self.model, path
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n = L.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text, add_special, parse_special):
        data = text.encode("utf-8")
        cap = 4 * len(data) + 16
        arr = (self.L.llama_token * cap)()
        n = self.L.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, parse_special)
        assert n >= 0, (text, n)
        return list(arr[:n])

    def detokenize(self, ids, remove_special, unparse_special):
        arr = (self.L.llama_token * max(1, len(ids)))(*ids)
        cap = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(cap)
        n = self.L.llama_detokenize(self.vocab, arr, len(ids), buf, cap, remove_special, unparse_special)
        assert n >= 0
        return buf.raw[:n]

    def piece(self, token):
        buf = ctypes.create_string_buffer(256)
        n = self.L.llama_token_to_piece(self.vocab, token, buf, 256, 0, True)
        assert n >= 0
        return buf.raw[:n]

    def eog(self):
        return [i for i in range(self.n) if self.L.llama_vocab_is_eog(self.vocab, i)]

    def close(self):
        self.L.llama_model_free(self.model)


def hf_ids(kv, regexes, texts):
    """Ids from Hugging Face tokenizers with the original regexes (byte-level vocabularies)."""
    from tokenizers import AddedToken, Tokenizer, models, decoders

    fields = {k: v for k, v, _, _ in kv}
    tokens = fields["tokenizer.ggml.tokens"]
    # llama.cpp makes its end-of-generation texts control tokens whatever their type; that is a
    # vocabulary rule, not a regex one, so the reference applies it too.
    types = [CONTROL if t in EOG_TEXTS else k for t, k in zip(tokens, fields["tokenizer.ggml.token_type"])]
    merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
    vocab = {t: i for i, t in enumerate(tokens)}
    ignore = fields["tokenizer.ggml.pre"] in ("llama-bpe", "tekken")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore))
    tok.pre_tokenizer = byte_level_pre(regexes)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t, k in zip(tokens, types) if k == CONTROL])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t, k in zip(tokens, types) if k == USER_DEFINED])
    return [tok.encode(t, add_special_tokens=False).ids for t in texts]


def run_variant(L, base_path, base_kv, overrides, texts, byte_level):
    kv = with_overrides(base_kv, overrides)
    with tempfile.TemporaryDirectory() as tmp:
        path = base_path
        if overrides:
            path = os.path.join(tmp, "variant.gguf")
            write_gguf(path, kv)
        v = LlamaVocab(L, path)
        cases = []
        for text in texts:
            ids = v.tokenize(text, False, True)
            pieces = b"".join(v.piece(i) for i in ids)
            plain = v.tokenize(text, False, False)
            case = {
                "text": text,
                "ids": ids,
                "ids_add_special": v.tokenize(text, True, True),
                "ids_plain": plain,
            }
            if byte_level:
                # Byte-level pieces always spell the text; llama.cpp's detokenize may clean spaces.
                assert pieces.decode("utf-8") == text, (text, pieces)
            else:
                case["detok"] = v.detokenize(ids, False, True).decode("utf-8")
                case["detok_plain"] = v.detokenize(plain, False, True).decode("utf-8")
                case["pieces"] = pieces.decode("utf-8")
            cases.append(case)
        eog = v.eog()
        v.close()
    pre = next((val for k, val, _, _ in kv if k == "tokenizer.ggml.pre"), None)
    if byte_level:
        reference = hf_ids(kv, PRE_ORIGINAL[pre], texts)
        for case, ref in zip(cases, reference):
            if ref != case["ids"]:
                case["ids_original_regex"] = ref
    return {"overrides": overrides, "eog": eog, "cases": cases,
            "clean_spaces": byte_level and pre in CLEAN_SPACES}


def main():
    L = load_llama_cpp()
    texts = LLAMACPP_INP + AWKWARD
    os.makedirs(OUT, exist_ok=True)

    phi3_path = os.path.join(OUT, "ggml-vocab-phi-3.gguf")
    phi3_kv = read_gguf_kv(phi3_path)
    gemma_kv = spm_gemma_kv()
    qwen_kv = bpe_qwen2_kv()
    llama_kv = bpe_llama3_kv()
    probe_kv = bpe_probe_kv(texts)
    written = {}
    for name, kv in [("spm-gemma", gemma_kv), ("bpe-qwen2", qwen_kv), ("bpe-llama3", llama_kv), ("bpe-probe", probe_kv)]:
        path = os.path.join(OUT, f"{name}.gguf")
        write_gguf(path, kv)
        written[name] = path

    plan = [
        ("phi-3", phi3_path, phi3_kv, False, [
            ("phi-3", {}),
            ("llama-2", {"general.name": "llama-spm"}),
        ]),
        ("spm-gemma", written["spm-gemma"], gemma_kv, False, [
            ("gemma", {}),
            ("space-prefix", {"tokenizer.ggml.add_space_prefix": True}),
        ]),
        ("bpe-qwen2", written["bpe-qwen2"], qwen_kv, True, [("qwen2", {})]),
        ("bpe-probe", written["bpe-probe"], probe_kv, True, [
            (pre, {} if pre == "qwen2" else {"tokenizer.ggml.pre": pre})
            for pre in ["qwen2", "qwen35", "llama-bpe", "smollm", "gpt-2", "default", "glm4", "dbrx", "gpt-4o", "tekken"]
        ]),
        ("bpe-llama3", written["bpe-llama3"], llama_kv, True, [
            ("llama-bpe", {}),
            ("gpt-4o", {"tokenizer.ggml.pre": "gpt-4o"}),
        ]),
    ]
    import llama_cpp

    for name, path, kv, byte_level, variants in plan:
        strings = texts + SPECIAL_STRINGS[name]
        with open(path, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        fixture = {
            "generated_by": "scripts/make-tokenizer-fixture-llamacpp.py",
            "reference": "llama.cpp through llama-cpp-python (llama_tokenize / llama_detokenize / llama_vocab_is_eog)",
            "versions": {"llama_cpp_python": llama_cpp.__version__, "gguf": "0.19.0"},
            "gguf_file": os.path.basename(path),
            "gguf_sha256": sha,
            "byte_level": byte_level,
            "variants": {},
        }
        for vname, overrides in variants:
            fixture["variants"][vname] = run_variant(L, path, kv, overrides, strings, byte_level)
            diffs = [c["text"] for c in fixture["variants"][vname]["cases"] if "ids_original_regex" in c]
            print(f"{name}/{vname}: {len(strings)} strings; llama.cpp differs from the original regex on {len(diffs)}: {diffs[:4]}")
        with open(os.path.join(OUT, f"{name}.json"), "w", encoding="utf-8") as f:
            f.write("{\n")
            items = list(fixture.items())
            for k, (key, value) in enumerate(items):
                if key != "variants":
                    f.write(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)},\n")
            f.write(' "variants": {\n')
            vitems = list(fixture["variants"].items())
            for j, (vname, var) in enumerate(vitems):
                f.write(f"  {json.dumps(vname)}: {{\n")
                f.write(f"   \"overrides\": {json.dumps(var['overrides'], ensure_ascii=False)},\n")
                f.write(f"   \"clean_spaces\": {json.dumps(var['clean_spaces'])},\n")
                f.write(f"   \"eog\": {json.dumps(var['eog'])},\n")
                f.write("   \"cases\": [\n")
                for i, case in enumerate(var["cases"]):
                    sep = "," if i + 1 < len(var["cases"]) else ""
                    f.write(f"    {json.dumps(case, ensure_ascii=False)}{sep}\n")
                f.write("   ]\n")
                f.write("  }" + ("," if j + 1 < len(vitems) else "") + "\n")
            f.write(" }\n}\n")


if __name__ == "__main__":
    sys.exit(main())
