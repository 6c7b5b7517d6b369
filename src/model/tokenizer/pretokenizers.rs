//! Pre-tokenizers for byte-level BPE vocabularies read from GGUF, chosen by `tokenizer.ggml.pre`,
//! and the GPT-2 byte <-> character alphabet those vocabularies are spelled in.
//!
//! llama.cpp names the way a model's text is cut into words before BPE (the "pre" type); each one
//! is the split regex of the model's original `tokenizer.json`. We rebuild the same pipeline the
//! original `tokenizer.json` has, so ids match Hugging Face's tokenizer for that model.

use std::collections::HashMap;
use std::sync::OnceLock;

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::model::error::{ModelError, Result};

/// Llama 3's split (`llama-bpe` in llama.cpp): numbers in groups of up to three digits.
const LLAMA3_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// Qwen2's split: every digit on its own.
const QWEN2_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// The `tokenizer.ggml.pre` values this module understands, for error messages.
pub const SUPPORTED_PRE: &[&str] = &[
    "default",
    "gpt-2",
    "gpt2",
    "smollm",
    "qwen2",
    "deepseek-r1-qwen",
    "llama-bpe",
    "llama3",
    "llama-v3",
];

/// What a pre type implies besides the pre-tokenizer itself (llama.cpp's per-type defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreDefaults {
    /// Add BOS when the file has no `tokenizer.ggml.add_bos_token`.
    pub add_bos: bool,
    /// BPE emits a whole word that is in the vocabulary without merging (Llama 3's `ignore_merges`).
    pub ignore_merges: bool,
}

/// The pre-tokenizer for the GGUF pre type `pre` (`None` when the file has no `tokenizer.ggml.pre`,
/// treated as llama.cpp's "default": the GPT-2 regex).
pub fn for_gguf_pre(pre: Option<&str>) -> Result<(PreTokenizerWrapper, PreDefaults)> {
    let plain = PreDefaults {
        add_bos: false,
        ignore_merges: false,
    };
    match pre.unwrap_or("default") {
        // GPT-2: byte-level with its own regex.
        "default" | "gpt-2" | "gpt2" => Ok((byte_level(true).into(), plain)),
        // SmolLM's tokenizer.json: every digit on its own, then GPT-2's byte-level regex.
        "smollm" => {
            let seq = Sequence::new(vec![Digits::new(true).into(), byte_level(true).into()]);
            Ok((seq.into(), plain))
        }
        "qwen2" | "deepseek-r1-qwen" => Ok((split_then_bytes(QWEN2_SPLIT)?, plain)),
        "llama-bpe" | "llama3" | "llama-v3" => Ok((
            split_then_bytes(LLAMA3_SPLIT)?,
            PreDefaults {
                add_bos: true,
                ignore_merges: true,
            },
        )),
        other => Err(ModelError::Unsupported(format!(
            "GGUF tokenizer pre-tokenizer `tokenizer.ggml.pre = {other}` (supported: {})",
            SUPPORTED_PRE.join(", ")
        ))),
    }
}

/// Byte-level mapping without leading space, with or without GPT-2's own word regex.
fn byte_level(use_regex: bool) -> ByteLevel {
    ByteLevel::default()
        .add_prefix_space(false)
        .trim_offsets(true)
        .use_regex(use_regex)
}

/// `Split(regex, isolated)` followed by byte-level mapping without its own regex.
fn split_then_bytes(regex: &str) -> Result<PreTokenizerWrapper> {
    let split = Split::new(
        SplitPattern::Regex(regex.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| ModelError::Tokenizer(format!("bad split regex: {e}")))?;
    Ok(Sequence::new(vec![split.into(), byte_level(false).into()]).into())
}

/// GPT-2's byte -> printable character table (bytes that print stand for themselves; the rest
/// are shifted to U+0100 and up).
pub fn byte_to_char() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let printable =
            |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
        let mut table = ['\0'; 256];
        let mut shifted = 0u32;
        for b in 0..=255u8 {
            table[b as usize] = if printable(b) {
                char::from(b)
            } else {
                shifted += 1;
                // 256 + n stays below 512: always a valid scalar value.
                char::from_u32(255 + shifted).unwrap_or(char::REPLACEMENT_CHARACTER)
            };
        }
        table
    })
}

/// The inverse of [`byte_to_char`].
pub fn char_to_byte() -> &'static HashMap<char, u8> {
    static MAP: OnceLock<HashMap<char, u8>> = OnceLock::new();
    MAP.get_or_init(|| {
        byte_to_char()
            .iter()
            .enumerate()
            .map(|(b, c)| (*c, b as u8))
            .collect()
    })
}

/// The raw bytes a byte-level token stands for, or `None` when it uses a character outside the
/// byte alphabet (such tokens, e.g. added ones, stand for their own UTF-8 text).
pub fn byte_level_bytes(token: &str) -> Option<Vec<u8>> {
    let map = char_to_byte();
    token.chars().map(|c| map.get(&c).copied()).collect()
}

/// Spell raw text in the byte alphabet (how byte-level vocabularies store tokens).
pub fn spell_bytes(text: &str) -> String {
    let table = byte_to_char();
    text.bytes().map(|b| table[b as usize]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_matches_gpt2() {
        // Space is the 33rd non-printable byte: U+0120 'Ġ'; newline U+010A 'Ċ'.
        assert_eq!(byte_to_char()[b' ' as usize], 'Ġ');
        assert_eq!(byte_to_char()[b'\n' as usize], 'Ċ');
        assert_eq!(byte_to_char()[b'a' as usize], 'a');
        assert_eq!(char_to_byte().len(), 256);
        assert_eq!(spell_bytes(" é"), "ĠÃ©");
        assert_eq!(byte_level_bytes("ĠÃ©"), Some(" é".as_bytes().to_vec()));
        assert_eq!(byte_level_bytes("\n"), None);
    }

    #[test]
    fn unknown_pre_is_named_in_the_error() {
        let err = for_gguf_pre(Some("mystery-pre"))
            .err()
            .map(|e| e.to_string());
        let msg = err.unwrap_or_default();
        assert!(
            msg.contains("mystery-pre") && msg.contains("smollm"),
            "{msg}"
        );
    }

    #[test]
    fn llama3_defaults_add_bos_and_ignore_merges() {
        let (_, d) = for_gguf_pre(Some("llama-bpe"))
            .map_err(|e| e.to_string())
            .unwrap();
        assert!(d.add_bos && d.ignore_merges);
        let (_, d) = for_gguf_pre(Some("smollm"))
            .map_err(|e| e.to_string())
            .unwrap();
        assert!(!d.add_bos && !d.ignore_merges);
    }
}
