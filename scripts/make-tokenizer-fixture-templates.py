#!/usr/bin/env python3
r"""Writes tests/fixtures/chat_templates/renders.json: the real chat templates of the families ferry
serves (tests/fixtures/chat_templates/*.jinja), rendered by Jinja2 set up the way Hugging Face
transformers' `_compile_jinja_template` sets it up. tests/suite/chat_templates.rs renders the same
templates with ferry's minijinja environment and expects the same text (or the same
raise_exception message).

Usage: /work/venv-oracle/bin/python scripts/make-tokenizer-fixture-templates.py
(needs only Jinja2; made with Jinja2 3.1.6).

The environment, as transformers builds it (utils/chat_template_utils.py): an
ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, the loopcontrols extension and its
AssistantTracker extension (the `{% generation %}` block; here it renders its body, which is all
apply_chat_template(tokenize=False) shows), a `tojson` filter that is
json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys), and
the globals raise_exception(message) and strftime_now(format). Templates are rendered with
messages, tools=None, documents=None, add_generation_prompt and the model's special tokens, like
apply_chat_template does. strftime_now reads a fixed clock (CLOCK below) so the file is
reproducible; the Rust test renders with the same fixed clock.

Where the templates come from (they are data; none is changed):
- llama.cpp's models/templates/ at commit 1eeb523c3e0c7ffbd59469f5463dcbdecba3535e (a public
  mirror, github.com/ye-NX/llama.cpp), which llama.cpp fetches from each model's Hugging Face
  tokenizer_config.json with scripts/get_chat_template.py: Qwen/Qwen3-0.6B,
  meta-llama/Llama-3.1-8B-Instruct, meta-llama/Llama-3.2-3B-Instruct,
  microsoft/Phi-3.5-mini-instruct, mistralai/Mistral-Nemo-Instruct-2407,
  mistralai/Mistral-Small-3.2-24B-Instruct-2506, openai/gpt-oss-120b, google/gemma-2-2b-it.
- google-gemma-3-it.jinja: the chat_template of Google's Gemma 3 instruct models
  (google/gemma-3-*-it tokenizer_config.json), transcribed from a public copy of it (the model hub
  is not reachable from this machine); the same text ships in Gemma 3 GGUFs.
"""

import datetime
import json
import os

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DIR = os.path.join(ROOT, "tests", "fixtures", "chat_templates")
CLOCK = datetime.datetime(2026, 1, 15, 9, 30, 0)

TOKENS = {
    "qwen3": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "phi3": {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>", "pad_token": "<|endoftext|>"},
    "mistral": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"},
    "gpt-oss": {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"},
    "gemma": {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>"},
}

TEMPLATES = {
    "Qwen-Qwen3-0.6B.jinja": "qwen3",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3",
    "microsoft-Phi-3.5-mini-instruct.jinja": "phi3",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "mistral",
    "openai-gpt-oss-120b.jinja": "gpt-oss",
    "google-gemma-2-2b-it.jinja": "gemma",
    "google-gemma-3-it.jinja": "gemma",
}


def m(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = [
    ([m("system", "You are a concise assistant."), m("user", "What is the capital of France?")], True),
    ([m("user", "Hi there"), m("assistant", "Hello! How can I help?"), m("user", "Count: 1 2 3")], False),
    ([m("user", "Hi there"), m("assistant", "Hello! How can I help?"), m("user", "Count: 1 2 3")], True),
    ([m("user", "  Spaces around, ünïcödé, 日本語, emoji 😀, \"quotes\" and a\nnewline  ")], True),
    (
        [
            m("user", "Think first: 2+2?"),
            m("assistant", "<think>\nadding\n</think>\n\n4"),
            m("user", "And 3+3?"),
        ],
        True,
    ),
    ([m("system", "Only a system prompt.")], True),
]


class GenerationBlock(Extension):
    """transformers' AssistantTracker tag, `{% generation %}...{% endgeneration %}`, rendering its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return CLOCK.strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    env = environment()
    cases = []
    for name, family in TEMPLATES.items():
        with open(os.path.join(DIR, name), encoding="utf-8") as f:
            template = env.from_string(f.read())
        for messages, add_generation_prompt in CONVERSATIONS:
            case = {
                "template": name,
                "tokens": TOKENS[family],
                "messages": messages,
                "add_generation_prompt": add_generation_prompt,
            }
            try:
                case["rendered"] = template.render(
                    messages=messages,
                    tools=None,
                    documents=None,
                    add_generation_prompt=add_generation_prompt,
                    **TOKENS[family],
                )
            except jinja2.exceptions.TemplateError as e:
                case["error"] = str(e)
            cases.append(case)
    out = {
        "generated_by": "scripts/make-tokenizer-fixture-templates.py",
        "reference": "Jinja2 with transformers' chat-template environment (see the script header)",
        "jinja2": jinja2.__version__,
        "clock": CLOCK.isoformat(),
        "cases": cases,
    }
    with open(os.path.join(DIR, "renders.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum(1 for c in cases if "error" in c)
    print(f"wrote {len(cases)} renders ({errors} raise_exception) to {DIR}/renders.json")


if __name__ == "__main__":
    main()
