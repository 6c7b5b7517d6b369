//! Errors the engine reports to its callers. The server maps each variant to an HTTP status in
//! exactly one place (`server::error`).

use thiserror::Error;

/// Result alias for engine operations.
pub type EngineResult<T> = std::result::Result<T, EngineError>;

/// What can go wrong between accepting a request and finishing its generation.
#[derive(Debug, Clone, Error, PartialEq)]
pub enum EngineError {
    /// The request named a model this server does not serve.
    #[error("The model `{0}` does not exist")]
    ModelNotFound(String),
    /// The model is still loading.
    #[error("the model `{0}` is still loading; retry when /health returns 200")]
    NotReady(String),
    /// Too many requests are waiting already.
    #[error("the server is overloaded: {0}")]
    Overloaded(String),
    /// The request is well formed but cannot be served as asked (e.g. a token id out of range).
    #[error("{message}")]
    InvalidRequest {
        /// Human readable reason.
        message: String,
        /// The request field at fault, if one is.
        param: Option<String>,
    },
    /// The prompt plus the requested completion does not fit the model's context.
    #[error("This model's maximum context length is {max_context} tokens. However, you requested {requested} tokens ({prompt_tokens} in the prompt, {max_tokens} in the completion). Please reduce the length of the prompt or completion.")]
    ContextLengthExceeded {
        /// The model's context window.
        max_context: usize,
        /// prompt_tokens + max_tokens.
        requested: usize,
        /// Tokens in the prompt.
        prompt_tokens: usize,
        /// Tokens requested for the completion.
        max_tokens: usize,
    },
    /// The device ran out of memory during this request's step. The request fails; the server
    /// and other requests go on (a retry may fit once other requests finish).
    #[error("the device ran out of memory while serving this request: {0}")]
    OutOfMemory(String),
    /// The engine thread is gone (shutdown or a crash); the request cannot be served.
    #[error("the engine is not running")]
    Unavailable,
    /// The model could not be brought up (a user's file, a refused setting, a panic in the
    /// loader): the message is the loader's own, without an "internal error" prefix.
    #[error("{0}")]
    LoadFailed(String),
    /// A failure inside the model or tokenizer while serving the request.
    #[error("internal error: {0}")]
    Internal(String),
}
