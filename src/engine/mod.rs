//! The engine: owns loaded models on a dedicated thread and serves generation requests.
//!
//! The HTTP layer talks to it only through the [`Backend`] trait ([`backend`]); the request and
//! event types it exchanges are plain data ([`request`]).

pub mod backend;
pub mod error;
pub mod request;

pub use backend::{Backend, ModelCard, ModelStatus};
pub use error::{EngineError, EngineResult};
pub use request::{
    ChatMessage, FinishReason, GenerationEvent, GenerationParams, GenerationRequest, PromptInput,
    SamplingParams, TokenLogprob, TokenOutput, Usage,
};
