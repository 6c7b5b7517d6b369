//! Request handlers, one file per endpoint family, plus what they share: submitting a validated
//! request (its `n` choices) to the backend and collecting a non-streamed generation.

pub mod chat;
pub mod completions;
pub mod embeddings;
pub mod health;
pub mod models;
pub mod responses;
pub mod tokenize;

use axum::http::{Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use tokio::sync::mpsc;

use super::error::ApiError;
use super::openai::common::choices_usage;
use super::sse::{self, ChunkFormatter};
use super::validate::ValidRequest;
use super::AppState;
use ferry_engine::{EngineError, FinishReason, GenerationEvent, TokenOutput, Usage};

/// An endpoint's formatter: the chunks of a streamed answer, and the whole non-streamed one.
pub trait ResponseFormatter: ChunkFormatter {
    /// The non-streamed response body.
    type Full: Serialize;
    /// The whole response for finished choices (`done[i]` is choice `i`); the usage counts the
    /// prompt once ([`choices_usage`]).
    fn full(&self, done: &[Collected]) -> Self::Full;
}

/// Submits `valid`'s `n` choices to the backend and answers with SSE chunks (`stream: true`)
/// or, once every choice finished, the whole response.
pub async fn respond<F: ResponseFormatter>(
    state: &AppState,
    valid: &ValidRequest,
    formatter: F,
) -> Result<Response, ApiError> {
    let receivers = state
        .backend
        .submit_choices(valid.generation_request(), valid.n())?;
    if valid.stream() {
        let keep_alive = state.options.sse_keep_alive;
        return Ok(sse::response(
            receivers,
            formatter,
            keep_alive,
            state.lifecycle.clone(),
        ));
    }
    let choices = futures::future::try_join_all(receivers.into_iter().map(collect));
    let done = tokio::select! {
        done = choices => done?,
        () = state.lifecycle.deadline() => return Err(ApiError::shutting_down()),
    };
    Ok(Json(formatter.full(&done)).into_response())
}

/// The usage of finished choices: the prompt once, every choice's completion.
pub fn usage_of(done: &[Collected]) -> Usage {
    let usages: Vec<Usage> = done.iter().map(|c| c.usage).collect();
    choices_usage(&usages)
}

/// A finished non-streamed generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Collected {
    /// Every generated token, in order.
    pub tokens: Vec<TokenOutput>,
    /// Why it ended.
    pub reason: FinishReason,
    /// Token counts.
    pub usage: Usage,
    /// Text released at the end (see `GenerationEvent::Finished`).
    pub trailing_text: String,
}

impl Collected {
    /// The whole generated text.
    pub fn text(&self) -> String {
        let mut text: String = self.tokens.iter().map(|t| t.text.as_str()).collect();
        text.push_str(&self.trailing_text);
        text
    }
}

/// Waits for a generation to finish. If the client goes away, the handler future (and with it
/// the receiver) is dropped, which cancels the request in the engine.
pub async fn collect(mut rx: mpsc::Receiver<GenerationEvent>) -> Result<Collected, ApiError> {
    let mut tokens = Vec::new();
    while let Some(event) = rx.recv().await {
        match event {
            GenerationEvent::Token(out) => tokens.push(out),
            GenerationEvent::Finished {
                reason,
                usage,
                trailing_text,
            } => {
                return Ok(Collected {
                    tokens,
                    reason,
                    usage,
                    trailing_text,
                })
            }
            GenerationEvent::Failed(err) => return Err(err.into()),
        }
    }
    Err(EngineError::Unavailable.into())
}

/// Fallback for paths no route serves: 404 in our error shape.
pub async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::route_not_found(method.as_str(), uri.path())
}

/// Fallback for known paths called with the wrong method: 405 in our error shape.
pub async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}
