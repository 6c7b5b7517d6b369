//! Byte-level BPE vocabularies in GGUF (`tokenizer.ggml.model = "gpt2"`: Llama 3, Qwen2/3,
//! gpt-oss, GLM, SmolLM): the vocabulary and `tokenizer.ggml.merges` become a BPE model, the
//! pre-tokenizer comes from `tokenizer.ggml.pre` ([`super::pretokenizers`]) and the decoder maps
//! GPT-2's byte alphabet back to bytes.

use std::borrow::Cow;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;

use super::compact_bpe::CompactBpe;
use super::gguf_meta::Meta;
use super::gguf_vocab::GgufVocab;
use super::pipeline::{Pipeline, SharedModel};
use super::pretokenizers::{for_gguf_pre, is_byte_level, spell_bytes, PreDefaults};
use crate::error::{ModelError, Result};

/// The BPE pipeline (model, pre-tokenizer, decoder; no added tokens yet) and what the pre type
/// implies.
pub(super) fn build(meta: &Meta<'_>, vocab: &GgufVocab<'_>) -> Result<(Pipeline, PreDefaults)> {
    let (pre_tokenizer, defaults) = for_gguf_pre(meta.str("tokenizer.ggml.pre")?)?;

    // Tokens are stored in the byte alphabet; the odd one that is not (raw text) is respelled so
    // the BPE model can reach it, as Hugging Face's GGUF conversion does. Later duplicates win.
    let tokens: Vec<Cow<'_, str>> = vocab
        .tokens
        .iter()
        .map(|t| match is_byte_level(t) {
            true => Cow::Borrowed(t.as_ref()),
            false => Cow::Owned(spell_bytes(t)),
        })
        .collect();
    let merges = meta.strings("tokenizer.ggml.merges")?.ok_or_else(|| {
        ModelError::Config("byte-level GGUF tokenizer has no `tokenizer.ggml.merges`".into())
    })?;
    let bpe = CompactBpe::new(&tokens, &merges, defaults.ignore_merges)?;

    let mut tokenizer = Pipeline::new(SharedModel::compact(bpe));
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    Ok((tokenizer, defaults))
}

/// Whether an added token can be matched: ones spelled outside the byte alphabet are llama.cpp
/// mislabels that BPE could not produce anyway; they are skipped (as Hugging Face does).
pub(super) fn is_spelled(token: &str) -> bool {
    is_byte_level(token)
}
