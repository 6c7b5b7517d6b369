//! The `tokenizers` pipeline ferry keeps per model ([`Pipeline`]), with its vocabulary model
//! behind an `Arc` ([`SharedModel`]): the chat encoder's literal copy of the tokenizer
//! ([`super::chat_encode`]) clones the pipeline (normalizer, pre-tokenizer, added tokens) but
//! not the model's tables (the vocabulary, its reverse and the merges: 8-9 MiB for a 49k-token
//! BPE, several times that for 150k-token ones), which it shares. The model is the crate's
//! (`tokenizer.json`) or, for GGUF vocabularies (byte-level BPE and SentencePiece),
//! [`CompactBpe`], which tokenizes the same and builds several times faster.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::ser::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokenizers::models::bpe::BpeTrainer;
use tokenizers::{
    DecoderWrapper, Model, ModelWrapper, NormalizerWrapper, PostProcessorWrapper,
    PreTokenizerWrapper, Token, TokenizerImpl,
};

use super::compact_bpe::CompactBpe;

/// A tokenizer whose model is shared between its clones.
pub type Pipeline = TokenizerImpl<
    SharedModel,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

/// A vocabulary model (BPE, Unigram, ...) that clones by reference.
#[derive(Debug, Clone)]
pub struct SharedModel(Arc<Vocabulary>);

/// The models a [`SharedModel`] holds.
#[derive(Debug)]
enum Vocabulary {
    /// One of the crate's.
    Crate(ModelWrapper),
    /// A byte-level BPE from a GGUF.
    Compact(CompactBpe),
}

impl SharedModel {
    /// `model`, shared from now on.
    pub fn new(model: impl Into<ModelWrapper>) -> Self {
        Self(Arc::new(Vocabulary::Crate(model.into())))
    }

    /// A byte-level BPE made from a GGUF, shared from now on.
    pub(crate) fn compact(model: CompactBpe) -> Self {
        Self(Arc::new(Vocabulary::Compact(model)))
    }

    /// Whether `self` and `other` are the same model (not a copy).
    #[cfg(test)]
    pub(crate) fn same_as(&self, other: &SharedModel) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Model for SharedModel {
    type Trainer = <ModelWrapper as Model>::Trainer;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        match &*self.0 {
            Vocabulary::Crate(m) => m.tokenize(sequence),
            Vocabulary::Compact(m) => Ok(m.tokenize(sequence)),
        }
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        match &*self.0 {
            Vocabulary::Crate(m) => m.token_to_id(token),
            Vocabulary::Compact(m) => m.id(token),
        }
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        match &*self.0 {
            Vocabulary::Crate(m) => m.id_to_token(id),
            Vocabulary::Compact(m) => m.token(id).map(str::to_owned),
        }
    }

    fn get_vocab(&self) -> HashMap<String, u32> {
        match &*self.0 {
            Vocabulary::Crate(m) => m.get_vocab(),
            Vocabulary::Compact(m) => m.vocab(),
        }
    }

    fn get_vocab_size(&self) -> usize {
        match &*self.0 {
            Vocabulary::Crate(m) => m.get_vocab_size(),
            // As the crate's BPE: the entries of its vocabulary map.
            Vocabulary::Compact(m) => m.vocab_len(),
        }
    }

    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        match &*self.0 {
            Vocabulary::Crate(m) => m.save(folder, prefix),
            Vocabulary::Compact(m) => m.to_crate_bpe()?.save(folder, prefix),
        }
    }

    fn get_trainer(&self) -> Self::Trainer {
        match &*self.0 {
            Vocabulary::Crate(m) => m.get_trainer(),
            Vocabulary::Compact(_) => BpeTrainer::default().into(),
        }
    }
}

/// As the model it wraps (a `tokenizer.json`'s `"model"`; a [`CompactBpe`] as the crate's BPE
/// with its vocabulary and merges).
impl Serialize for SharedModel {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &*self.0 {
            Vocabulary::Crate(m) => m.serialize(serializer),
            Vocabulary::Compact(m) => {
                ModelWrapper::from(m.to_crate_bpe().map_err(S::Error::custom)?)
                    .serialize(serializer)
            }
        }
    }
}

/// As the model it wraps (a `tokenizer.json`'s `"model"`).
impl<'de> Deserialize<'de> for SharedModel {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        ModelWrapper::deserialize(deserializer).map(SharedModel::new)
    }
}
