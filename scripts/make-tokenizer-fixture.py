#!/usr/bin/env python3
r"""Writes tests/fixtures/tokenizer_smollm2.json: reference token ids, decodes and chat-template
renderings for SmolLM2-135M-Instruct's GGUF, made by Hugging Face transformers' own GGUF tokenizer
conversion (an implementation independent of ferry's). Also saves that tokenizer with
save_pretrained into tests/fixtures/smollm2-hf-tokenizer/ (tokenizer.json + tokenizer_config.json)
for the from_hf_files test.

Usage (no torch needed):
    python3 -m venv /work/venv-tok && /work/venv-tok/bin/pip install transformers gguf tokenizers jinja2
    scripts/fetch-model.sh
    /work/venv-tok/bin/python scripts/make-tokenizer-fixture.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]

Made with transformers 5.24.0, tokenizers 0.23.3, gguf 0.19.0 (versions are written into the
fixture).

Notes and decisions:
- transformers' AutoTokenizer needs the model config for a GGUF, and its GGUF metadata reader
  imports torch at module level only for tensor dtypes. We load through
  PreTrainedTokenizerFast.from_pretrained(dir, gguf_file=name), which runs the same tokenizer
  conversion (integrations/gguf/gguf_tokenizer_mapping.py), and put a placeholder `torch` module in
  sys.modules after transformers has decided torch is absent, so the reader can be imported. No
  tensor is read.
- Disagreement found: transformers' GGUF conversion has no entry for `tokenizer.ggml.pre = "smollm"`,
  so it splits with plain GPT-2 byte-level regex, while SmolLM2's original tokenizer.json and
  llama.cpp's "smollm" pre type first split every digit on its own (Digits(individual_digits) then
  the GPT-2 byte-level regex). That changes ids where whitespace sits between digits: " 7 8  9" is
  [216, 39, 216, 40, 216, 216, 41] after HF's conversion but [216, 39, 216, 40, 256, 41] ("  " as
  one token) with the original pipeline and in llama.cpp (which applies "\p{N}" first, then the
  GPT-2 regex to each piece). ferry follows the original model and llama.cpp. So the reference ids
  here come from transformers' converted tokenizer with its pre-tokenizer replaced by the original
  one (everything else -- vocabulary, merges, special tokens, decoder, chat template -- is
  transformers' conversion), and every string where the unpatched conversion differs is listed in
  the fixture under "hf_gguf_disagreements". The saved HF tokenizer uses the original pipeline too.
- add_bos: the GGUF sets tokenizer.ggml.add_bos_token = false, HF and llama.cpp agree (no BOS).
  The GGUF's BOS id is 1 (<|im_start|>), which HF also reports as bos_token.
- Both with and without special tokens are recorded; for this model they are equal.
"""

import hashlib
import json
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FIXTURES = os.path.join(ROOT, "tests", "fixtures")

STRINGS = [
    "The capital of France is",
    "",
    " ",
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
    "\n\n\n",
    "```rust\nfn main() { println!(\"hi\"); }\n```",
    "I'm sure they'll say we've done what THEY'RE doing, don't you?",
    "nbsp\u00a0here and zero\u200bwidth",
    "<|im_start|>user\nHello!<|im_end|>\n",
    "text<|endoftext|>more text",
    "<|im_start|><|im_end|><|endoftext|>",
    "<|im_start",
    "<|endoftext|>",
    "a<repo_name>b <file_sep> c",
]

CHATS = [
    {
        "messages": [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        "add_generation_prompt": True,
    },
    {
        "messages": [
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Count: 1 2 3"},
        ],
        "add_generation_prompt": False,
    },
]


def load_hf(gguf_path):
    import transformers
    from transformers import PreTrainedTokenizerFast

    try:
        import torch  # noqa: F401
    except ImportError:

        class _Placeholder(types.ModuleType):
            def __getattr__(self, name):
                if name.startswith("__"):
                    raise AttributeError(name)
                return type(name, (), {})

        sys.modules["torch"] = _Placeholder("torch")
    tok = PreTrainedTokenizerFast.from_pretrained(
        os.path.dirname(os.path.abspath(gguf_path)), gguf_file=os.path.basename(gguf_path)
    )
    return transformers, tok


def use_smollm_original_pre_tokenizer(tok):
    """Switch tok to SmolLM2's original pre-tokenizer (Digits + ByteLevel); return an unswitched
    copy of the converted backend for comparison."""
    from tokenizers import Tokenizer, pre_tokenizers

    converted = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    return converted


def main():
    gguf_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
    transformers, tok = load_hf(gguf_path)
    import gguf
    import tokenizers

    converted = use_smollm_original_pre_tokenizer(tok)
    vocab = tok.get_vocab()
    id_to_token = {i: t for t, i in vocab.items()}

    # Sanity against the GGUF's own vocabulary.
    sanity = tok.encode("The capital of France is", add_special_tokens=False)
    assert sanity == [504, 3575, 282, 4649, 314], sanity
    assert [id_to_token[i] for i in sanity] == ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"]

    cases, disagreements = [], []
    for text in STRINGS:
        ids = tok.encode(text, add_special_tokens=False)
        ids_special = tok.encode(text, add_special_tokens=True)
        decoded = tok.decode(ids, skip_special_tokens=False)
        assert decoded == text, (text, decoded)
        unpatched = converted.encode(text, add_special_tokens=False).ids
        if unpatched != ids:
            disagreements.append({"text": text, "hf_gguf_conversion": unpatched, "original_pre_tokenizer": ids})
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_with_special_tokens": ids_special,
                "decoded": decoded,
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            }
        )

    chats = []
    for chat in CHATS:
        rendered = tok.apply_chat_template(
            chat["messages"], tokenize=False, add_generation_prompt=chat["add_generation_prompt"]
        )
        chats.append(dict(chat, rendered=rendered, ids=tok.encode(rendered, add_special_tokens=False)))

    with open(gguf_path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    fixture = {
        "generated_by": "scripts/make-tokenizer-fixture.py",
        "reference": "Hugging Face transformers GGUF tokenizer conversion, with SmolLM2's original pre-tokenizer (see script header)",
        "versions": {
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
            "gguf": getattr(gguf, "__version__", "unknown"),
        },
        "gguf_file": os.path.basename(gguf_path),
        "gguf_sha256": sha,
        "vocab_size": len(tok),
        "bos_token": tok.bos_token,
        "bos_token_id": tok.bos_token_id,
        "eos_token": tok.eos_token,
        "eos_token_id": tok.eos_token_id,
        "cases": cases,
        "chats": chats,
        "hf_gguf_disagreements": disagreements,
    }
    os.makedirs(FIXTURES, exist_ok=True)
    with open(os.path.join(FIXTURES, "tokenizer_smollm2.json"), "w", encoding="utf-8") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")

    hf_dir = os.path.join(FIXTURES, "smollm2-hf-tokenizer")
    tok.save_pretrained(hf_dir)
    print(f"wrote {len(cases)} cases, {len(chats)} chats; saved HF tokenizer to {hf_dir}")
    for d in disagreements:
        print(f"HF GGUF conversion differs from the original pre-tokenizer on {d['text']!r}")


if __name__ == "__main__":
    main()
