//! SentencePiece-style vocabularies in GGUF (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral
//! 7B, Mixtral, Phi-3, Gemma), tokenized as llama.cpp's SPM tokenizer does.
//!
//! llama.cpp (`llm_tokenizer_spm_session`) escapes spaces as `▁`, puts one `▁` in front of each
//! run of text when `tokenizer.ggml.add_space_prefix` is on (the default; Gemma turns it off),
//! splits the text into UTF-8 characters and repeatedly merges the adjacent pair whose
//! concatenation is the vocabulary token with the highest score, leftmost first on equal scores;
//! a character that ends up in no token becomes its `<0xNN>` byte tokens. That is BPE with merges
//! ranked by the score of the token they make, which is how the vocabulary becomes a
//! [`tokenizers`] BPE model here: a merge `(a, b)` for every token `a + b` whose halves are tokens,
//! ranked by score (ties by the ids of the halves), with byte fallback. The text is not split into
//! words first (llama.cpp merges across the whole run, `▁` included). The only order llama.cpp
//! can take that this cannot: two different pairs that make the same token, both present at
//! once, are merged leftmost first there and in rank order here.
//!
//! Decoding is Hugging Face's for these vocabularies: `▁` back to spaces, byte tokens back to
//! bytes, and with the space prefix on, one leading space of the text dropped.

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Merges, Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::{DecoderWrapper, NormalizerWrapper};

use super::pipeline::{Pipeline, SharedModel};

use super::gguf_meta::Meta;
use super::gguf_vocab::GgufVocab;
use crate::error::{ModelError, Result};

/// SentencePiece's escaped space.
const SPACE: &str = "\u{2581}";

/// The SPM pipeline (normalizer, BPE-by-score model, decoder; no added tokens yet).
/// `unk_text` is the unknown token, used when a character has neither a token nor byte tokens.
pub(super) fn build(
    meta: &Meta<'_>,
    vocab: &GgufVocab<'_>,
    unk_text: Option<String>,
) -> Result<Pipeline> {
    let n = vocab.tokens.len();
    let scores = match meta.floats("tokenizer.ggml.scores")? {
        Some(scores) if scores.len() < n => {
            return Err(ModelError::Config(format!(
                "GGUF tokenizer has {} scores for {n} tokens",
                scores.len()
            )))
        }
        Some(scores) => scores,
        None => vec![0.0; n],
    };
    let add_space_prefix = meta
        .bool("tokenizer.ggml.add_space_prefix")?
        .unwrap_or(true);

    // llama.cpp names empty tokens `[EMPTY_<id>]` and refuses duplicates; so do we.
    let texts: Vec<String> = vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(id, t)| {
            if t.is_empty() {
                format!("[EMPTY_{id}]")
            } else {
                t.to_string()
            }
        })
        .collect();
    let mut ids: HashMap<&str, u32> = HashMap::with_capacity(n);
    for (id, text) in texts.iter().enumerate() {
        if let Some(first) = ids.insert(text, id as u32) {
            return Err(ModelError::Config(format!(
                "GGUF vocabulary has the token `{text}` twice (ids {first} and {id})"
            )));
        }
    }

    let merges = merges_by_score(&texts, &scores, &ids);
    let bpe_vocab: Vocab = texts
        .iter()
        .enumerate()
        .map(|(id, t)| (t.clone(), id as u32))
        .collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(bpe_vocab, merges)
        .byte_fallback(true);
    if let Some(unk) = unk_text {
        builder = builder.unk_token(unk);
    }
    let bpe = builder.build().map_err(|e| {
        ModelError::Tokenizer(format!("cannot build SPM model from GGUF vocab: {e}"))
    })?;

    let mut tokenizer = Pipeline::new(SharedModel::new(bpe));
    tokenizer
        .with_normalizer(Some(normalizer(add_space_prefix)?))
        .map_err(|e| ModelError::Tokenizer(format!("space normalizer: {e}")))?;
    tokenizer.with_decoder(Some(decoder(add_space_prefix)));
    Ok(tokenizer)
}

/// A merge `(a, b)` for every token `a + b` whose halves are both tokens, ranked by the score of
/// `a + b` (highest first; a stable sort keeps token order, then the halves' ids, on ties).
fn merges_by_score(texts: &[String], scores: &[f32], ids: &HashMap<&str, u32>) -> Merges {
    // (score, token, cut): the halves are only spelled out once the order is known.
    let mut ranked: Vec<(f32, u32, u32)> = Vec::new();
    let mut local: Vec<(u32, u32, u32)> = Vec::new();
    for (id, text) in texts.iter().enumerate() {
        local.clear();
        for (cut, _) in text.char_indices().skip(1) {
            let (left, right) = text.split_at(cut);
            if let (Some(&l), Some(&r)) = (ids.get(left), ids.get(right)) {
                local.push((l, r, cut as u32));
            }
        }
        local.sort_unstable();
        ranked.extend(
            local
                .iter()
                .map(|&(_, _, cut)| (scores[id], id as u32, cut)),
        );
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    ranked
        .into_iter()
        .map(|(_, id, cut)| {
            let (left, right) = texts[id as usize].split_at(cut as usize);
            (left.to_string(), right.to_string())
        })
        .collect()
}

/// Spaces become `▁`, with one `▁` in front of each run of text between matched tokens when
/// `add_space_prefix` is on (llama.cpp adds it at the start and after every special token).
fn normalizer(add_space_prefix: bool) -> Result<NormalizerWrapper> {
    let escape = Replace::new(" ", SPACE)
        .map_err(|e| ModelError::Tokenizer(format!("space normalizer: {e}")))?;
    if !add_space_prefix {
        return Ok(escape.into());
    }
    Ok(NormalizerSequence::new(vec![Prepend::new(SPACE.into()).into(), escape.into()]).into())
}

/// `▁` back to spaces, byte tokens to bytes, and the prefix space dropped again.
fn decoder(add_space_prefix: bool) -> DecoderWrapper {
    let mut steps: Vec<DecoderWrapper> = vec![
        tokenizers::decoders::DecoderWrapper::Replace(
            Replace::new(SPACE, " ").expect("a plain string pattern always compiles"),
        ),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        steps.push(Strip::new(' ', 1, 0).into());
    }
    DecoderSequence::new(steps).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_rank_by_the_score_of_what_they_make() {
        let texts: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0];
        let ids: HashMap<&str, u32> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| (t.as_str(), i as u32))
            .collect();
        let merges = merges_by_score(&texts, &scores, &ids);
        let pairs: Vec<(&str, &str)> = merges
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        // bc (-1) before ab (-2) before the two ways to make abc (-3), `a bc` first (lower ids).
        assert_eq!(pairs, [("b", "c"), ("a", "b"), ("a", "bc"), ("ab", "c")]);
    }
}
