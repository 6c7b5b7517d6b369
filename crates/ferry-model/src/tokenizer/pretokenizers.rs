//! Pre-tokenizers for byte-level BPE vocabularies read from GGUF, chosen by `tokenizer.ggml.pre`,
//! and the GPT-2 byte <-> character alphabet those vocabularies are spelled in.
//!
//! llama.cpp names the way a model's text is cut into words before BPE (the "pre" type); each one
//! is the split regex of the model's original `tokenizer.json`. We rebuild the same pipeline the
//! original `tokenizer.json` has (its regexes, run by fancy-regex), so ids match Hugging Face's
//! tokenizer for that model and llama.cpp's (tests/suite/tokenizer_llamacpp.rs). Known
//! difference: for `gpt-4o` and `tekken` llama.cpp approximates the case classes
//! (`\p{Lu}`, `\p{Ll}`, ...) by ASCII, so a run of non-ASCII capitals (`ÀÇÇÉNTS`) is cut
//! differently there; ferry keeps the model's own regex.

use std::sync::OnceLock;

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

use crate::error::{ModelError, Result};

/// Llama 3's split (llama.cpp's `LLAMA3` pre type, also DBRX, Smaug and GLM-4): numbers in
/// groups of up to three digits.
const LLAMA3_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// Qwen2's split (Qwen2, Qwen2.5, Qwen3): every digit on its own.
const QWEN2_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// Qwen3.5's split: Qwen2's with combining marks kept in words.
const QWEN35_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}",
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// o200k's split (`gpt-4o`: gpt-oss, Llama 4): words cut at lower-to-upper case changes, numbers
/// in groups of up to three digits.
const GPT4O_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// Mistral's Tekken split (Mistral Nemo, Small 3): o200k's case rule, every digit on its own, no
/// contractions.
const TEKKEN_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// GPT-2's word regex (what `ByteLevel` splits with when its regex is on).
const GPT2_SPLIT: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// How a pre type cuts text into words before BPE.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// GPT-2's regex.
    Gpt2,
    /// Every digit on its own, then GPT-2's regex (StarCoder, SmolLM).
    DigitsThenGpt2,
    /// llama.cpp's `default`: punctuation runs, GPT-2's regex, digit runs, then three-digit groups.
    LlamaCppDefault,
    /// One regex (the model's tokenizer.json `Split`).
    Regex(&'static str),
}

/// A `tokenizer.ggml.pre` family: its names in llama.cpp, how it cuts words and its defaults.
struct PreType {
    names: &'static [&'static str],
    cut: Cut,
    defaults: PreDefaults,
}

const PLAIN: PreDefaults = PreDefaults {
    add_bos: false,
    ignore_merges: false,
};
const BOS_AND_WHOLE_WORDS: PreDefaults = PreDefaults {
    add_bos: true,
    ignore_merges: true,
};

/// The pre types ferry knows, as llama.cpp groups them (`llama_vocab::impl::load`).
const PRE_TYPES: &[PreType] = &[
    PreType {
        names: &["default"],
        cut: Cut::LlamaCppDefault,
        defaults: PLAIN,
    },
    PreType {
        names: &[
            "gpt-2",
            "gpt2",
            "phi-2",
            "mpt",
            "olmo",
            "jais",
            "exaone4",
            "gigachat",
            "mellum",
            "trillion",
            "granite-docling",
            "a.x-4.0",
            "modern-bert",
        ],
        cut: Cut::Gpt2,
        defaults: PLAIN,
    },
    PreType {
        names: &[
            "smollm",
            "starcoder",
            "refact",
            "command-r",
            "codeshell",
            "exaone",
            "minerva-7b",
            "mellum2",
        ],
        cut: Cut::DigitsThenGpt2,
        defaults: PLAIN,
    },
    PreType {
        names: &[
            "llama-bpe",
            "llama3",
            "llama-v3",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
        ],
        cut: Cut::Regex(LLAMA3_SPLIT),
        defaults: BOS_AND_WHOLE_WORDS,
    },
    PreType {
        names: &["dbrx", "smaug-bpe", "glm4", "chatglm-bpe"],
        cut: Cut::Regex(LLAMA3_SPLIT),
        defaults: PLAIN,
    },
    PreType {
        names: &[
            "qwen2",
            "deepseek-r1-qwen",
            "kormo",
            "f2llmv2",
            "megrez",
            "stablelm2",
            "hunyuan",
            "solar-open",
        ],
        cut: Cut::Regex(QWEN2_SPLIT),
        defaults: PLAIN,
    },
    PreType {
        names: &["qwen35"],
        cut: Cut::Regex(QWEN35_SPLIT),
        defaults: PLAIN,
    },
    PreType {
        names: &["gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"],
        cut: Cut::Regex(GPT4O_SPLIT),
        defaults: PLAIN,
    },
    PreType {
        names: &["tekken"],
        cut: Cut::Regex(TEKKEN_SPLIT),
        defaults: BOS_AND_WHOLE_WORDS,
    },
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
/// which llama.cpp reads as `default`). An unknown pre type is [`ModelError::Unsupported`],
/// naming it and the known ones.
pub fn for_gguf_pre(pre: Option<&str>) -> Result<(PreTokenizerWrapper, PreDefaults)> {
    let name = pre.unwrap_or("default");
    let Some(pre_type) = PRE_TYPES.iter().find(|t| t.names.contains(&name)) else {
        let known: Vec<&str> = PRE_TYPES
            .iter()
            .flat_map(|t| t.names.iter().copied())
            .collect();
        return Err(ModelError::Unsupported(format!(
            "GGUF tokenizer pre-tokenizer `tokenizer.ggml.pre = {name}` (supported: {})",
            known.join(", ")
        )));
    };
    let pre_tokenizer = match pre_type.cut {
        Cut::Gpt2 => byte_level(true).into(),
        Cut::DigitsThenGpt2 => {
            Sequence::new(vec![Digits::new(true).into(), byte_level(true).into()]).into()
        }
        Cut::LlamaCppDefault => splits_then_bytes(&[
            r"[\p{P}\$\+<=>\^~\|]+",
            GPT2_SPLIT,
            r"\p{N}+",
            r"[0-9][0-9][0-9]",
        ])?,
        Cut::Regex(regex) => splits_then_bytes(&[regex])?,
    };
    Ok((pre_tokenizer, pre_type.defaults))
}

/// Byte-level mapping without leading space, with or without GPT-2's own word regex.
fn byte_level(use_regex: bool) -> ByteLevel {
    ByteLevel::default()
        .add_prefix_space(false)
        .trim_offsets(true)
        .use_regex(use_regex)
}

/// `Split(regex, isolated)` for each regex in turn (each cuts the pieces of the one before, as
/// llama.cpp applies its regex list), then byte-level mapping without its own regex.
fn splits_then_bytes(regexes: &[&str]) -> Result<PreTokenizerWrapper> {
    let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
    for regex in regexes {
        let split = Split::new(
            SplitPattern::Regex(regex.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| ModelError::Tokenizer(format!("bad split regex `{regex}`: {e}")))?;
        steps.push(split.into());
    }
    steps.push(byte_level(false).into());
    Ok(Sequence::new(steps).into())
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
pub fn char_to_byte() -> &'static [Option<u8>; ALPHABET_END] {
    static TABLE: OnceLock<[Option<u8>; ALPHABET_END]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = [None; ALPHABET_END];
        for (b, c) in byte_to_char().iter().enumerate() {
            table[*c as usize] = Some(b as u8);
        }
        table
    })
}

/// One past the largest character of the byte alphabet (the shifted bytes end below U+0200).
const ALPHABET_END: usize = 512;

/// The byte a character of the byte alphabet stands for (`None` outside the alphabet): a table
/// lookup, as every token of a vocabulary goes through it at load.
fn byte_of(c: char) -> Option<u8> {
    char_to_byte().get(c as usize).copied().flatten()
}

/// The raw bytes a byte-level token stands for, or `None` when it uses a character outside the
/// byte alphabet (such tokens, e.g. added ones, stand for their own UTF-8 text).
pub fn byte_level_bytes(token: &str) -> Option<Vec<u8>> {
    token.chars().map(byte_of).collect()
}

/// Whether `token` is spelled in the byte alphabet ([`byte_level_bytes`] is `Some`), without
/// building the bytes.
pub fn is_byte_level(token: &str) -> bool {
    token.chars().all(|c| byte_of(c).is_some())
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
        assert_eq!(char_to_byte().iter().flatten().count(), 256);
        assert!(is_byte_level("ĠÃ©") && !is_byte_level("\n") && !is_byte_level("a日"));
        assert!(is_byte_level("<|im_start|>"));
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
