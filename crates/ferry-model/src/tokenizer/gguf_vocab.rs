//! A GGUF vocabulary's tokens and their roles, read the way llama.cpp reads them
//! (`llama_vocab::impl::load`): `tokenizer.ggml.token_type` per token, then llama.cpp's fixes by
//! token text (end-of-generation and fill-in-the-middle tokens become control tokens), the
//! end-of-generation set, and the
//! per-model token attributes llama.cpp sets by name (Phi-3's special tokens eat the whitespace
//! after them).

use std::borrow::Cow;

use tokenizers::AddedToken;

use super::gguf_meta::Meta;
use crate::error::{ModelError, Result};

/// A token's type as `tokenizer.ggml.token_type` stores it (llama.cpp's `LLAMA_TOKEN_TYPE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TokenKind {
    Normal,
    /// The unknown token (`<unk>`); matched in text like a control token.
    Unknown,
    /// Control tokens (`<s>`, `<|im_start|>`): matched in text only when special tokens are
    /// parsed, dropped by `decode(.., skip_special_tokens = true)`.
    Control,
    /// User-defined tokens (`<think>`, Gemma's whitespace runs): always matched whole in the text.
    UserDefined,
    Unused,
    /// `<0x0A>`-style byte-fallback tokens of SentencePiece vocabularies.
    Byte,
    Undefined,
}

impl TokenKind {
    fn from_type(ty: i64) -> Self {
        match ty {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Undefined,
        }
    }
}

/// Texts llama.cpp treats as "end of generation" whatever their type (and turns into control
/// tokens).
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
];

/// Fill-in-the-middle tokens llama.cpp finds by text when the GGUF has no id for them: the key,
/// the texts, and whether the token also ends generation (pad, repo and file separator do).
const FIM_TOKENS: &[(&str, &[&str], bool)] = &[
    (
        "tokenizer.ggml.fim_pre_token_id",
        &[
            "<|fim_prefix|>",
            "<fim-prefix>",
            "<fim_prefix>",
            "<｜fim▁begin｜>",
            "<PRE>",
            "▁<PRE>",
            "<|code_prefix|>",
            "<|prefix|>",
        ],
        false,
    ),
    (
        "tokenizer.ggml.fim_suf_token_id",
        &[
            "<|fim_suffix|>",
            "<fim-suffix>",
            "<fim_suffix>",
            "<｜fim▁hole｜>",
            "<SUF>",
            "▁<SUF>",
            "<|code_suffix|>",
            "<|suffix|>",
        ],
        false,
    ),
    (
        "tokenizer.ggml.fim_mid_token_id",
        &[
            "<|fim_middle|>",
            "<fim-middle>",
            "<fim_middle>",
            "<｜fim▁end｜>",
            "<MID>",
            "▁<MID>",
            "<|code_middle|>",
            "<|middle|>",
        ],
        false,
    ),
    (
        "tokenizer.ggml.fim_pad_token_id",
        &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
        true,
    ),
    (
        "tokenizer.ggml.fim_rep_token_id",
        &[
            "<|fim_repo|>",
            "<|repo_name|>",
            "<fim-repo>",
            "<REPO>",
            "<reponame>",
        ],
        true,
    ),
    ("tokenizer.ggml.fim_sep_token_id", &["<|file_sep|>"], true),
];

/// Whether `text` starts as every text of [`END_OF_GENERATION_TEXTS`] and [`FIM_TOKENS`] does.
fn starts_like_special(text: &str) -> bool {
    matches!(text.as_bytes().first(), Some(b'<' | b'[' | b'_' | 0xE2))
}

/// The tokens of a GGUF vocabulary with their (fixed) kinds.
pub(super) struct GgufVocab<'a> {
    /// The token texts, borrowed from the file where they can be.
    pub tokens: Vec<Cow<'a, str>>,
    pub kinds: Vec<TokenKind>,
    /// Special tokens that swallow the whitespace after them (llama.cpp's RSTRIP attribute).
    rstrip: Vec<bool>,
    /// End-of-generation tokens found by text (and the FIM pad/repo/separator tokens), in id order,
    /// after the gpt-oss rule.
    pub end_of_generation: Vec<u32>,
}

impl<'a> GgufVocab<'a> {
    pub fn read(meta: &Meta<'a>) -> Result<Self> {
        let tokens = meta.strings("tokenizer.ggml.tokens")?.ok_or_else(|| {
            ModelError::Config("GGUF tokenizer has no `tokenizer.ggml.tokens`".into())
        })?;
        let types = meta.ints("tokenizer.ggml.token_type")?;
        if let Some(types) = &types {
            if types.len() < tokens.len() {
                return Err(ModelError::Config(format!(
                    "GGUF tokenizer has {} token types for {} tokens",
                    types.len(),
                    tokens.len()
                )));
            }
        }
        let mut kinds: Vec<TokenKind> = match &types {
            Some(types) => types.iter().map(|t| TokenKind::from_type(*t)).collect(),
            None => vec![TokenKind::Normal; tokens.len()],
        };
        kinds.truncate(tokens.len());

        // Every text looked for below starts with one of these bytes (`▁` with 0xE2): scanning a
        // large vocabulary once for them keeps the searches off its other tokens.
        let candidates: Vec<usize> = tokens
            .iter()
            .enumerate()
            .filter(|(_, t)| starts_like_special(t))
            .map(|(id, _)| id)
            .collect();
        let mut end_of_generation = Vec::new();
        for (key, texts, ends) in FIM_TOKENS {
            let id = match meta.u32(key)?.filter(|&i| (i as usize) < tokens.len()) {
                Some(id) => Some(id as usize),
                None => {
                    let found = candidates
                        .iter()
                        .copied()
                        .find(|&id| texts.contains(&&*tokens[id]));
                    // Found by text: llama.cpp makes it a control token.
                    if let Some(id) = found {
                        kinds[id] = TokenKind::Control;
                    }
                    found
                }
            };
            if let (Some(id), true) = (id, ends) {
                end_of_generation.push(id as u32);
            }
        }
        for &id in &candidates {
            if END_OF_GENERATION_TEXTS.contains(&&*tokens[id]) {
                end_of_generation.push(id as u32);
                if !matches!(kinds[id], TokenKind::Control) {
                    kinds[id] = TokenKind::Control;
                }
            }
        }
        end_of_generation.sort_unstable();
        end_of_generation.dedup();
        // gpt-oss (o200k_harmony): `<|end|>` closes a message but generation goes on; `<|return|>`
        // and `<|call|>` end it. llama.cpp drops `<|end|>` from the set when both are present.
        let has = |text: &str| {
            end_of_generation
                .iter()
                .any(|&id| tokens[id as usize] == text)
        };
        if (has("<|return|>") && has("<|call|>")) || (has("<|calls|>") && has("<|flush|>")) {
            end_of_generation.retain(|&id| tokens[id as usize] != "<|end|>");
        }

        let mut vocab = Self {
            rstrip: vec![false; tokens.len()],
            tokens,
            kinds,
            end_of_generation,
        };
        vocab.set_attributes_by_model_name(meta.str("general.name")?.unwrap_or(""));
        Ok(vocab)
    }

    /// llama.cpp's attributes by model name: for Phi-3 every special token but `<unk>`, `<s>` and
    /// `<|endoftext|>` (and `</s>` too) strips the whitespace that follows it.
    fn set_attributes_by_model_name(&mut self, name: &str) {
        let name = name.to_ascii_lowercase();
        if !(name.contains("phi-3") || name.contains("phi3")) {
            return;
        }
        for id in 0..self.tokens.len() {
            self.rstrip[id] = match &*self.tokens[id] {
                "<unk>" | "<s>" | "<|endoftext|>" => false,
                "</s>" => true,
                _ => self.is_matched_whole(id),
            };
        }
    }

    /// Whether llama.cpp cuts this token out of the text before tokenizing the rest
    /// (its "special tokens cache": control, user-defined and unknown tokens).
    fn is_matched_whole(&self, id: usize) -> bool {
        matches!(
            self.kinds[id],
            TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown
        )
    }

    /// The tokens matched whole in the text, as added tokens for the `tokenizers` pipeline:
    /// control and unknown ones as special tokens (matched when special tokens are parsed,
    /// skipped by `decode(.., true)`), user-defined ones as plain added tokens (always matched).
    /// `spelled` says whether a token's text can be matched (byte-level vocabularies skip tokens
    /// spelled outside their byte alphabet).
    pub fn added_tokens(
        &self,
        spelled: impl Fn(&str) -> bool,
    ) -> (Vec<AddedToken>, Vec<AddedToken>) {
        let mut special = Vec::new();
        let mut user = Vec::new();
        for (id, text) in self.tokens.iter().enumerate() {
            if !self.is_matched_whole(id) || !spelled(text) {
                continue;
            }
            let is_special = !matches!(self.kinds[id], TokenKind::UserDefined);
            let token = AddedToken::from(text.to_string(), is_special)
                .normalized(false)
                .rstrip(self.rstrip[id]);
            if is_special {
                special.push(token);
            } else {
                user.push(token);
            }
        }
        (special, user)
    }

    /// The text of token `id`, if it is in the vocabulary.
    pub fn text(&self, id: Option<u32>) -> Option<String> {
        id.and_then(|i| self.tokens.get(i as usize))
            .map(|t| t.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_searched_text_passes_the_first_byte_filter() {
        let texts = END_OF_GENERATION_TEXTS
            .iter()
            .chain(FIM_TOKENS.iter().flat_map(|(_, texts, _)| texts.iter()));
        for text in texts {
            assert!(starts_like_special(text), "{text}");
        }
        assert!(!starts_like_special("hello") && !starts_like_special(""));
    }
}
