//! The `tokenizers` pipeline ferry keeps per model ([`Pipeline`]), with its vocabulary model
//! behind an `Arc` ([`SharedModel`]): the chat encoder's literal copy of the tokenizer
//! ([`super::chat_encode`]) clones the pipeline (normalizer, pre-tokenizer, added tokens) but
//! not the model's tables (the vocabulary, its reverse and the merges: 8-9 MiB for a 49k-token
//! BPE, several times that for 150k-token ones), which it shares.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokenizers::{
    DecoderWrapper, Model, ModelWrapper, NormalizerWrapper, PostProcessorWrapper,
    PreTokenizedString, PreTokenizerWrapper, Token, TokenizerImpl, TruncationDirection,
};

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
pub struct SharedModel(Arc<ModelWrapper>);

impl SharedModel {
    /// `model`, shared from now on.
    pub fn new(model: impl Into<ModelWrapper>) -> Self {
        Self(Arc::new(model.into()))
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
        self.0.tokenize(sequence)
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.0.token_to_id(token)
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        self.0.id_to_token(id)
    }

    fn get_vocab(&self) -> HashMap<String, u32> {
        self.0.get_vocab()
    }

    fn get_vocab_size(&self) -> usize {
        self.0.get_vocab_size()
    }

    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        self.0.save(folder, prefix)
    }

    fn get_trainer(&self) -> Self::Trainer {
        self.0.get_trainer()
    }

    fn tokenize_in_pretokenized(
        &self,
        pretokenized: &mut PreTokenizedString,
        truncation: Option<(usize, TruncationDirection)>,
    ) -> tokenizers::Result<()> {
        self.0.tokenize_in_pretokenized(pretokenized, truncation)
    }
}

/// As the model it wraps (a `tokenizer.json`'s `"model"`).
impl Serialize for SharedModel {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

/// As the model it wraps (a `tokenizer.json`'s `"model"`).
impl<'de> Deserialize<'de> for SharedModel {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        ModelWrapper::deserialize(deserializer).map(SharedModel::new)
    }
}
