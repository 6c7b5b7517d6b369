//! ferry's own chat templates, for models that ship none (a GGUF without
//! `tokenizer.chat_template`, an HF directory without a `chat_template`): Gemma's turns, Llama 3's
//! headers, Mistral's `[INST]` and ChatML, each a Jinja file under `templates/`.
//!
//! The family is read off the model: Gemma architectures take Gemma's turns; otherwise the
//! vocabulary's special tokens say which markup the model was trained on (`<start_of_turn>`,
//! `<|start_header_id|>`, `[INST]`, `<|im_start|>`); Mistral and Mixtral architectures without
//! such tokens take Mistral's; anything else ChatML, as llama.cpp falls back to. The templates
//! write no BOS: [`BuiltinTemplate::source`] puts `bos_token` first when the tokenizer adds BOS
//! to a prompt, so a chat starts as the model's plain prompts do.

use crate::spec::Architecture;

/// One of ferry's built-in chat templates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuiltinTemplate {
    /// `<|im_start|>role\n...<|im_end|>\n` (Qwen, SmolLM, the fallback).
    ChatMl,
    /// `<start_of_turn>user|model\n...<end_of_turn>\n`.
    Gemma,
    /// `<|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>`.
    Llama3,
    /// `[INST] ...[/INST]` and the reply closed by EOS.
    Mistral,
}

impl BuiltinTemplate {
    /// Every built-in template.
    pub const ALL: [BuiltinTemplate; 4] = [
        BuiltinTemplate::ChatMl,
        BuiltinTemplate::Gemma,
        BuiltinTemplate::Llama3,
        BuiltinTemplate::Mistral,
    ];

    /// The name the load log gives it: `chatml`, `gemma`, `llama3`, `mistral`.
    pub fn name(self) -> &'static str {
        match self {
            Self::ChatMl => "chatml",
            Self::Gemma => "gemma",
            Self::Llama3 => "llama3",
            Self::Mistral => "mistral",
        }
    }

    /// The template's Jinja as written in its file (no BOS).
    pub fn jinja(self) -> &'static str {
        match self {
            Self::ChatMl => include_str!("templates/chatml.jinja"),
            Self::Gemma => include_str!("templates/gemma.jinja"),
            Self::Llama3 => include_str!("templates/llama3.jinja"),
            Self::Mistral => include_str!("templates/mistral.jinja"),
        }
    }

    /// The source to compile: [`Self::jinja`], with `bos_token` first when the tokenizer adds
    /// BOS (`adds_bos`).
    pub fn source(self, adds_bos: bool) -> String {
        if adds_bos {
            format!("{{{{- bos_token -}}}}\n{}", self.jinja())
        } else {
            self.jinja().to_owned()
        }
    }

    /// The template for a model of `architecture` whose vocabulary has the tokens `has_token`
    /// says it has.
    pub fn choose(architecture: Architecture, has_token: impl Fn(&str) -> bool) -> Self {
        let has_all = |tokens: &[&str]| tokens.iter().all(|t| has_token(t));
        if matches!(architecture, Architecture::Gemma2 | Architecture::Gemma3)
            || has_all(&["<start_of_turn>", "<end_of_turn>"])
        {
            Self::Gemma
        } else if has_all(&["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]) {
            Self::Llama3
        } else if has_all(&["[INST]", "[/INST]"]) {
            Self::Mistral
        } else if has_all(&["<|im_start|>", "<|im_end|>"]) {
            Self::ChatMl
        } else if matches!(architecture, Architecture::Mistral | Architecture::Mixtral) {
            Self::Mistral
        } else {
            Self::ChatMl
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::chat_template::{ChatMessage, ChatTemplate, TemplateContext};

    fn message(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..ChatMessage::default()
        }
    }

    fn conversation() -> Vec<ChatMessage> {
        vec![
            message("system", "Be brief."),
            message("user", "Hi!"),
            message("assistant", "Hello."),
            message("user", "Bye?"),
        ]
    }

    fn render(template: BuiltinTemplate, adds_bos: bool, messages: &[ChatMessage]) -> String {
        ChatTemplate::new(&template.source(adds_bos))
            .unwrap()
            .render(&TemplateContext {
                messages,
                add_generation_prompt: true,
                bos_token: "<BOS>",
                eos_token: "<EOS>",
                unk_token: None,
                pad_token: None,
                tools: None,
                variables: None,
            })
            .unwrap()
    }

    fn vocabulary(tokens: &'static [&'static str]) -> impl Fn(&str) -> bool {
        move |t| tokens.contains(&t)
    }

    #[test]
    fn the_special_tokens_choose_the_family() {
        let llama = Architecture::Llama;
        let cases: [(&[&str], BuiltinTemplate); 4] = [
            (
                &["<start_of_turn>", "<end_of_turn>"],
                BuiltinTemplate::Gemma,
            ),
            (
                &["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                BuiltinTemplate::Llama3,
            ),
            (&["[INST]", "[/INST]"], BuiltinTemplate::Mistral),
            (&["<|im_start|>", "<|im_end|>"], BuiltinTemplate::ChatMl),
        ];
        for (tokens, expected) in cases {
            assert_eq!(BuiltinTemplate::choose(llama, vocabulary(tokens)), expected);
        }
    }

    #[test]
    fn the_architecture_decides_gemma_and_mistral_and_chatml_is_the_rest() {
        let none = vocabulary(&[]);
        let chatml = vocabulary(&["<|im_start|>", "<|im_end|>"]);
        let gemma = BuiltinTemplate::Gemma;
        assert_eq!(BuiltinTemplate::choose(Architecture::Gemma3, &none), gemma);
        assert_eq!(
            BuiltinTemplate::choose(Architecture::Gemma2, &chatml),
            gemma
        );
        let mistral = BuiltinTemplate::Mistral;
        assert_eq!(
            BuiltinTemplate::choose(Architecture::Mistral, &none),
            mistral
        );
        assert_eq!(
            BuiltinTemplate::choose(Architecture::Mixtral, &none),
            mistral
        );
        assert_eq!(
            BuiltinTemplate::choose(Architecture::Mistral, &chatml),
            BuiltinTemplate::ChatMl,
            "the vocabulary's markup first"
        );
        for arch in [Architecture::Llama, Architecture::Qwen2, Architecture::Phi3] {
            assert_eq!(
                BuiltinTemplate::choose(arch, &none),
                BuiltinTemplate::ChatMl
            );
        }
        // Half a family's tokens is not that family.
        assert_eq!(
            BuiltinTemplate::choose(Architecture::Llama, vocabulary(&["<|start_header_id|>"])),
            BuiltinTemplate::ChatMl
        );
    }

    #[test]
    fn chatml_writes_im_start_blocks() {
        assert_eq!(
            render(BuiltinTemplate::ChatMl, false, &conversation()),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n\
             <|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye?<|im_end|>\n\
             <|im_start|>assistant\n"
        );
    }

    #[test]
    fn gemma_writes_turns_with_the_system_text_in_the_first() {
        assert_eq!(
            render(BuiltinTemplate::Gemma, true, &conversation()),
            "<BOS><start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n<start_of_turn>model\n\
             Hello.<end_of_turn>\n<start_of_turn>user\nBye?<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            render(BuiltinTemplate::Gemma, true, &[message("user", " Hi ")]),
            "<BOS><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn llama3_writes_headers_and_eot() {
        assert_eq!(
            render(BuiltinTemplate::Llama3, true, &conversation()),
            "<BOS><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nBye?<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn mistral_writes_inst_blocks_and_closes_replies_with_eos() {
        assert_eq!(
            render(BuiltinTemplate::Mistral, true, &conversation()),
            "<BOS>[INST] Be brief.\n\nHi![/INST]Hello.<EOS>[INST] Bye?[/INST]"
        );
    }

    #[test]
    fn every_template_compiles_and_writes_no_bos_of_its_own() {
        for template in BuiltinTemplate::ALL {
            let one = [message("user", "x")];
            let without = render(template, false, &one);
            assert!(!without.contains("<BOS>"), "{}: {without}", template.name());
            assert_eq!(render(template, true, &one), format!("<BOS>{without}"));
        }
    }
}
