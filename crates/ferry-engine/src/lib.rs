//! # ferry-engine
//!
//! Layer 1 of ferry (docs/ARCHITECTURE.md, "Crates"): generation. It depends on `ferry-chat`
//! (the chat message its requests carry) and `ferry-metrics`, and may know nothing of the
//! model crate, the offload engine, devices or HTTP: a model is anything that implements
//! [`LanguageModel`], a tokenizer anything that implements [`TextCodec`] (the `ferry` package's
//! runtime adapts the real ones), and the HTTP layer sees the engine only through the
//! [`Backend`] trait.
//!
//! A reuser implements those two traits for its model and tokenizer, starts an
//! [`EngineHandle`] with [`EngineOptions`], and submits [`GenerationRequest`]s, receiving
//! [`GenerationEvent`]s on a channel.
//!
//! The engine: owns loaded models on a dedicated thread and serves generation requests.
//!
//! The HTTP layer talks to it only through the [`Backend`] trait ([`backend`]); the request and
//! event types it exchanges are plain data ([`request`]).
//!
//! Generation is written against two small traits ([`traits`]): [`LanguageModel`] (tokens in,
//! last-position logits out, with per-sequence KV state) and [`TextCodec`] (tokenizer and chat
//! template). [`worker`] runs one thread per model and implements [`Backend`] as
//! [`EngineHandle`]; each thread batches its requests continuously (`serve_loop`, with the
//! plain-state [`scheduler`], whose step budget [`pacer`] fits to a time target); [`queue`] is a job in transit. [`generate`] is the per-request
//! state machine, built from [`sampling`] (with
//! [`penalties`]), [`logprobs`], [`detokenize`] (incremental, UTF-8 safe) and [`stop`].
//! [`tool_calls`] reads function calls out of replies and builds the grammar that enforces
//! them; [`reasoning`] reads a reasoning model's thinking apart from its answer (think blocks,
//! gpt-oss's harmony channels) and puts both readers behind one `ReplyReader`. [`embed`] carries embedding requests to the model's thread, which runs them between
//! its generation steps, one input at a time.

mod backend;
mod detokenize;
pub mod embed;
mod error;
mod generate;
pub mod grammar;
mod logprobs;
mod pacer;
mod penalties;
pub mod placement;
pub mod prefix_cache;
mod queue;
pub mod reasoning;
mod request;
pub mod sampling;
mod scheduler;
mod serve_loop;
pub mod speculative;
mod stop;
#[cfg(test)]
pub(crate) mod test_support;
pub mod tool_calls;
pub mod traits;
pub mod worker;

pub use backend::{no_embeddings, Backend, ModelCard, ModelStatus, Residency};
pub use embed::{EmbeddingReply, EmbeddingRequest};
pub use error::{EngineError, EngineResult};
pub use grammar::{Grammar, GrammarCompiler, GrammarSpec};
pub use placement::ModelPlacement;
pub use prefix_cache::PrefixCacheOptions;
pub use request::{
    ChatMessage, CompletionTokensDetails, FinishReason, GenerationEvent, GenerationParams,
    GenerationRequest, PromptTokensDetails, SamplingParams, TokenLogprob, TokenOutput, Usage,
    RESERVED_TEMPLATE_VARIABLES,
};
pub use speculative::{Speculation, SpeculationMethod};
pub use traits::{LanguageModel, TextCodec};
pub use worker::{EngineHandle, EngineOptions};
