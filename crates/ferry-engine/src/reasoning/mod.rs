//! Reasoning output: which markup a model writes its thinking in, and how to read it apart
//! from the answer, whole or as the text arrives.
//!
//! The format ([`ReasoningFormat`]) is chosen from the chat template's source
//! ([`ReasoningFormat::from_template`]): gpt-oss's harmony (`<|channel|>`), else a
//! `<think>...</think>` block (Qwen3, QwQ, DeepSeek-R1); a template with neither is not a
//! reasoning one. [`think`] reads think blocks, [`harmony`] reads harmony's channels (its
//! `commentary` calls included), and [`reply`] puts a reasoning reader in front of the
//! tool-call reader ([`crate::tool_calls`]) so one [`ReplyReader`] turns a reply into
//! reasoning, content and calls. As with tool calls, every decision depends only on the text
//! seen so far (what could still be markup is held back), so a whole reply reads to exactly
//! what its streamed pieces add up to.

pub(crate) use crate::tool_calls::stream::held_back;

pub mod harmony;
pub mod reply;
pub mod think;

pub use reply::{ParsedReply, ReplyEvent, ReplyReader};

/// The markup a model writes its reasoning in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// `<think>reasoning</think>answer` (Qwen3, QwQ, DeepSeek-R1); the block may be opened by
    /// the prompt, so the reply starts inside it.
    Think,
    /// gpt-oss's harmony: `<|channel|>analysis<|message|>..<|end|>` messages before the
    /// `final` one; calls in `commentary` messages addressed `to=functions.NAME`. Its markers
    /// are special tokens, so a harmony reply is decoded with special tokens kept.
    Harmony,
}

impl ReasoningFormat {
    /// The format a chat template's source implies, if it is a reasoning one.
    pub fn from_template(source: Option<&str>) -> Option<Self> {
        let src = source?;
        if src.contains("<|channel|>") {
            Some(Self::Harmony)
        } else if src.contains("<think>") || src.contains("</think>") {
            Some(Self::Think)
        } else {
            None
        }
    }

    /// The format a model's replies are read in: the template's, except that think blocks
    /// stay in the content unless `split_think` (the `reasoning_format` setting's `auto`);
    /// harmony is always read, its markup being special tokens no client could use.
    pub fn settle(source: Option<&str>, split_think: bool) -> Option<Self> {
        Self::from_template(source).filter(|f| split_think || *f == Self::Harmony)
    }

    /// The format's name, as logs and docs spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Think => "think",
            Self::Harmony => "harmony",
        }
    }
}

/// How one reply's reasoning is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningParsing {
    /// The markup.
    pub format: ReasoningFormat,
    /// The prompt ends inside an open think block (DeepSeek-R1 and QwQ templates end the
    /// generation prompt with `<think>`), so the reply starts as reasoning.
    pub starts_inside: bool,
}

impl ReasoningParsing {
    /// The parsing of a reply to a prompt whose text ends with `prompt_tail` (the last few
    /// prompt tokens decoded with special tokens kept).
    pub fn for_prompt(format: ReasoningFormat, prompt_tail: &str) -> Self {
        Self {
            format,
            starts_inside: format == ReasoningFormat::Think && opens_think(prompt_tail),
        }
    }

    /// Whether the reply must be decoded with special tokens kept (harmony's markers are).
    pub fn keeps_special_tokens(&self) -> bool {
        self.format == ReasoningFormat::Harmony
    }
}

/// Whether `text` leaves a think block open: its last `<think>` has no `</think>` after it.
pub fn opens_think(text: &str) -> bool {
    text.rfind(think::OPEN)
        .is_some_and(|at| !text[at..].contains(think::CLOSE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let path = format!(
            "{}/../../tests/fixtures/chat_templates/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn real_templates_pick_their_format() {
        let cases = [
            ("openai-gpt-oss-120b.jinja", Some(ReasoningFormat::Harmony)),
            ("Qwen-Qwen3-0.6B.jinja", Some(ReasoningFormat::Think)),
            ("meta-llama-Llama-3.1-8B-Instruct.jinja", None),
            ("Mistral-Small-3.2-24B-Instruct-2506.jinja", None),
            ("google-gemma-3-it.jinja", None),
        ];
        for (name, format) in cases {
            assert_eq!(
                ReasoningFormat::from_template(Some(&fixture(name))),
                format,
                "{name}"
            );
        }
        assert_eq!(ReasoningFormat::from_template(None), None);
        // No DeepSeek-R1 template file is in the fixtures: these are the parts of its template
        // that decide (the history drops what precedes `</think>`, the generation prompt opens
        // the block).
        let deepseek_r1 = "{% if '</think>' in content %}{% set content = \
            content.split('</think>')[-1] %}{% endif %}{{'<｜Assistant｜>' + content + \
            '<｜end▁of▁sentence｜>'}}{% if add_generation_prompt and not ns.is_tool %}\
            {{'<｜Assistant｜><think>\\n'}}{% endif %}";
        assert_eq!(
            ReasoningFormat::from_template(Some(deepseek_r1)),
            Some(ReasoningFormat::Think)
        );
    }

    #[test]
    fn the_setting_leaves_think_blocks_but_never_harmony() {
        let (think, harmony) = (Some("<think>"), Some("<|channel|>"));
        assert_eq!(
            ReasoningFormat::settle(think, true),
            Some(ReasoningFormat::Think)
        );
        assert_eq!(ReasoningFormat::settle(think, false), None);
        assert_eq!(
            ReasoningFormat::settle(harmony, false),
            Some(ReasoningFormat::Harmony)
        );
        assert_eq!(ReasoningFormat::settle(Some("{{ x }}"), true), None);
    }

    #[test]
    fn an_open_think_block_in_the_prompt_starts_the_reply_inside() {
        let think = ReasoningFormat::Think;
        let cases = [
            ("<｜Assistant｜><think>\n", true),
            ("<|im_start|>assistant\n<think>\n", true),
            ("<|im_start|>assistant\n", false),
            ("<|im_start|>assistant\n<think>\n\n</think>\n\n", false),
            ("</think>x<think>", true),
        ];
        for (tail, inside) in cases {
            assert_eq!(
                ReasoningParsing::for_prompt(think, tail).starts_inside,
                inside,
                "{tail:?}"
            );
        }
        let harmony = ReasoningParsing::for_prompt(ReasoningFormat::Harmony, "<think>");
        assert!(!harmony.starts_inside);
        assert!(harmony.keeps_special_tokens());
    }

    #[test]
    fn held_back_is_a_marker_prefix_at_the_end() {
        assert_eq!(held_back("abc</th", &["</think>"]), 4);
        assert_eq!(held_back("abc<", &["</think>", "<|end|>"]), 1);
        assert_eq!(held_back("abc<|e", &["</think>", "<|end|>"]), 3);
        assert_eq!(held_back("abc</x", &["</think>"]), 0);
        assert_eq!(held_back("", &["</think>"]), 0);
    }
}
