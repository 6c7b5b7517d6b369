//! SentencePiece-style vocabularies in GGUF (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral
//! 7B, Mixtral, Phi-3, Gemma), tokenized as llama.cpp's SPM tokenizer does.
//!
//! llama.cpp (`llm_tokenizer_spm_session`) escapes spaces as `▁`, puts one `▁` in front of each
//! run of text when `tokenizer.ggml.add_space_prefix` is on (the default; Gemma turns it off),
//! splits the text into UTF-8 characters and repeatedly merges the adjacent pair whose
//! concatenation is the vocabulary token with the highest score, leftmost first on equal scores;
//! a character that ends up in no token becomes its `<0xNN>` byte tokens. That is BPE with merges
//! ranked by the score of the token they make, which is how the vocabulary becomes a BPE model
//! here ([`super::compact_bpe`], which merges as [`tokenizers`]' BPE does): a merge `(a, b)` for
//! every token `a + b` whose halves are tokens, ranked by score (ties by the ids of the halves),
//! with byte fallback. The text is not split into words first (llama.cpp merges across the
//! whole run, `▁` included). The only order llama.cpp
//! can take that this cannot: two different pairs that make the same token, both present at
//! once, are merged leftmost first there and in rank order here.
//!
//! Decoding is Hugging Face's for these vocabularies: `▁` back to spaces, byte tokens back to
//! bytes, and with the space prefix on, one leading space of the text dropped.

use std::borrow::Cow;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::{DecoderWrapper, NormalizerWrapper};

use super::compact_bpe::CompactBpe;
use super::pipeline::{Pipeline, SharedModel};

use super::gguf_meta::Meta;
use super::gguf_vocab::GgufVocab;
use crate::error::{ModelError, Result};

/// SentencePiece's escaped space.
const SPACE: &str = "\u{2581}";

/// The SPM pipeline (normalizer, BPE-by-score model, decoder; no added tokens yet).
/// `unk` is the unknown token, used when a character has neither a token nor byte tokens.
pub(super) fn build(meta: &Meta<'_>, vocab: &GgufVocab<'_>, unk: Option<u32>) -> Result<Pipeline> {
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
    let texts: Vec<Cow<'_, str>> = vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(id, t)| match t.is_empty() {
            true => Cow::Owned(format!("[EMPTY_{id}]")),
            false => Cow::Borrowed(t.as_ref()),
        })
        .collect();
    let vocabulary = CompactBpe::vocabulary(&texts)?;
    refuse_duplicates(&texts, &vocabulary)?;
    let merges = merges_by_score(&texts, &scores, |t| vocabulary.id(t));
    let bpe = vocabulary.with_sentencepiece(&merges, unk)?;

    let mut tokenizer = Pipeline::new(SharedModel::compact(bpe));
    tokenizer
        .with_normalizer(Some(normalizer(add_space_prefix)?))
        .map_err(|e| ModelError::Tokenizer(format!("space normalizer: {e}")))?;
    tokenizer.with_decoder(Some(decoder(add_space_prefix)));
    Ok(tokenizer)
}

/// An error naming a token spelled twice (`vocabulary` finds the last id of a text).
fn refuse_duplicates(texts: &[Cow<'_, str>], vocabulary: &CompactBpe) -> Result<()> {
    for (id, text) in texts.iter().enumerate() {
        match vocabulary.id(text) {
            Some(last) if last != id as u32 => {
                return Err(ModelError::Config(format!(
                    "GGUF vocabulary has the token `{text}` twice (ids {id} and {last})"
                )))
            }
            _ => {}
        }
    }
    Ok(())
}

/// A merge `(a, b)` for every token `a + b` whose halves are both tokens, as `(a, b, a + b)`
/// ids, ranked by the score of `a + b` (highest first; a stable sort keeps token order, then
/// the halves' ids, on ties).
pub(super) fn merges_by_score(
    texts: &[Cow<'_, str>],
    scores: &[f32],
    id_of: impl Fn(&str) -> Option<u32>,
) -> Vec<(u32, u32, u32)> {
    // (score, left, right, token).
    let mut ranked: Vec<(f32, u32, u32, u32)> = Vec::new();
    let mut local: Vec<(u32, u32)> = Vec::new();
    for (id, text) in texts.iter().enumerate() {
        local.clear();
        for (cut, _) in text.char_indices().skip(1) {
            let (left, right) = text.split_at(cut);
            if let (Some(l), Some(r)) = (id_of(left), id_of(right)) {
                local.push((l, r));
            }
        }
        local.sort_unstable();
        ranked.extend(local.iter().map(|&(l, r)| (scores[id], l, r, id as u32)));
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    ranked.into_iter().map(|(_, l, r, id)| (l, r, id)).collect()
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
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn merges_rank_by_the_score_of_what_they_make() {
        let texts: Vec<Cow<'_, str>> = ["a", "b", "c", "ab", "bc", "abc"]
            .into_iter()
            .map(Cow::Borrowed)
            .collect();
        let scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0];
        let ids: HashMap<&str, u32> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| (t.as_ref(), i as u32))
            .collect();
        let merges = merges_by_score(&texts, &scores, |t| ids.get(t).copied());
        // bc (-1) before ab (-2) before the two ways to make abc (-3), `a bc` first (lower ids).
        assert_eq!(merges, [(1, 2, 4), (0, 1, 3), (0, 4, 5), (3, 2, 5)]);
    }

    #[test]
    fn a_token_spelled_twice_is_refused_with_both_ids() {
        let texts: Vec<Cow<'_, str>> = ["a", "b", "a", "c"]
            .into_iter()
            .map(Cow::Borrowed)
            .collect();
        let vocabulary = CompactBpe::vocabulary(&texts).unwrap();
        let error = refuse_duplicates(&texts, &vocabulary)
            .unwrap_err()
            .to_string();
        assert!(error.contains("`a` twice (ids 0 and 2)"), "{error}");
        let unique = &texts[..2];
        assert!(refuse_duplicates(unique, &CompactBpe::vocabulary(unique).unwrap()).is_ok());
    }
}
