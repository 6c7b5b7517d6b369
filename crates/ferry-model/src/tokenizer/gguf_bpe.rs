//! Byte-level BPE vocabularies in GGUF (`tokenizer.ggml.model = "gpt2"`: Llama 3, Qwen2/3,
//! gpt-oss, GLM, SmolLM): the vocabulary and `tokenizer.ggml.merges` become a BPE model, the
//! pre-tokenizer comes from `tokenizer.ggml.pre` ([`super::pretokenizers`]) and the decoder maps
//! GPT-2's byte alphabet back to bytes.

use std::borrow::Cow;

use super::pipeline::{Pipeline, SharedModel};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Merges, Vocab, BPE};

use super::gguf_meta::Meta;
use super::gguf_vocab::GgufVocab;
use super::pretokenizers::{for_gguf_pre, is_byte_level, spell_bytes, PreDefaults};
use crate::error::{ModelError, Result};

/// The BPE pipeline (model, pre-tokenizer, decoder; no added tokens yet) and what the pre type
/// implies.
pub(super) fn build(meta: &Meta<'_>, vocab: &GgufVocab<'_>) -> Result<(Pipeline, PreDefaults)> {
    let (pre_tokenizer, defaults) = for_gguf_pre(meta.str("tokenizer.ggml.pre")?)?;

    // Tokens are stored in the byte alphabet; the odd one that is not (raw text) is respelled so
    // the BPE model can reach it, as Hugging Face's GGUF conversion does. Later duplicates win.
    // The two tables (tens of thousands of strings each) are made one after the other: the
    // process has one allocator heap (`server::limits::ARENAS`), and two threads making small
    // strings at once wait on its lock (measured: the load took 1.25x as long on two threads).
    let spelled = |t: &str| {
        if is_byte_level(t) {
            t.to_string()
        } else {
            spell_bytes(t)
        }
    };
    let merges = meta
        .strings("tokenizer.ggml.merges")?
        .ok_or_else(|| {
            ModelError::Config("byte-level GGUF tokenizer has no `tokenizer.ggml.merges`".into())
        })
        .and_then(|m| split_merges(&m));
    let bpe_vocab: Vocab = vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (spelled(t), id as u32))
        .collect();
    let merges = merges?;
    let bpe = BPE::builder()
        .vocab_and_merges(bpe_vocab, merges)
        .ignore_merges(defaults.ignore_merges)
        .build()
        .map_err(|e| ModelError::Tokenizer(format!("cannot build BPE from GGUF vocab: {e}")))?;

    let mut tokenizer = Pipeline::new(SharedModel::new(bpe));
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    Ok((tokenizer, defaults))
}

/// `tokenizer.ggml.merges` entries (`"a b"`) as pairs.
fn split_merges(merges: &[Cow<'_, str>]) -> Result<Merges> {
    merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| ModelError::Config(format!("GGUF merge `{m}` is not `a b`")))
        })
        .collect()
}

/// Whether an added token can be matched: ones spelled outside the byte alphabet are llama.cpp
/// mislabels that BPE could not produce anyway; they are skipped (as Hugging Face does).
pub(super) fn is_spelled(token: &str) -> bool {
    is_byte_level(token)
}
