//! The model layer's error type: everything that can fail while finding, reading or running a model.

use std::path::PathBuf;

use thiserror::Error;

/// Result alias for the model layer.
pub type Result<T> = std::result::Result<T, ModelError>;

/// Failures while locating, loading or running a model.
#[derive(Debug, Error)]
pub enum ModelError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The model source does not name anything usable.
    #[error("{0}")]
    Source(String),
    /// A file was expected in the hub cache but is not there (offline, or never downloaded).
    #[error("{file} of {repo} is not in the Hugging Face cache at {cache}{hint}")]
    NotCached {
        /// Hub repo id.
        repo: String,
        /// File name inside the repo.
        file: String,
        /// The cache directory that was searched.
        cache: PathBuf,
        /// Extra advice (e.g. "HF_HUB_OFFLINE=1 is set").
        hint: String,
    },
    /// Talking to the hub failed.
    #[error("cannot fetch {file} of {repo}: {message}")]
    Hub {
        /// Hub repo id.
        repo: String,
        /// File name inside the repo.
        file: String,
        /// What went wrong.
        message: String,
    },
    /// The model's configuration or metadata is missing a field or has a bad value.
    #[error("invalid model configuration: {0}")]
    Config(String),
    /// The architecture, dtype or quantization is not supported.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A tensor the architecture needs is not in the weights.
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    /// A tensor has an unexpected shape.
    #[error("tensor `{name}` has shape {actual:?}, expected {expected:?}")]
    BadShape {
        /// Tensor name.
        name: String,
        /// Shape found.
        actual: Vec<usize>,
        /// Shape expected.
        expected: Vec<usize>,
    },
    /// The tokenizer could not be built or failed on input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template could not be compiled or rendered.
    #[error("chat template: {0}")]
    Template(String),
    /// A sequence would grow past the key/value cache's limit.
    #[error("context overflow: {needed} positions needed, the limit is {max}")]
    ContextOverflow {
        /// Positions the sequence would occupy after this step.
        needed: usize,
        /// The cache's limit (at most the model's `max_context`).
        max: usize,
    },
    /// A forward pass was asked to run on no tokens.
    #[error("no input tokens")]
    EmptyInput,
    /// A token id is outside the vocabulary.
    #[error("token id {token} is outside the vocabulary of {vocab_size}")]
    TokenOutOfRange {
        /// The offending id.
        token: u32,
        /// The model's vocabulary size.
        vocab_size: usize,
    },
    /// A key/value cache built for another model was passed in.
    #[error("key/value cache has {cache} layers, the model has {model}")]
    CacheMismatch {
        /// Layers in the cache.
        cache: usize,
        /// Layers in the model.
        model: usize,
    },
    /// A tensor operation failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}
