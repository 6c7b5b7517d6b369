//! `POST /v1/chat/completions`: validate, submit, then answer with one `chat.completion` or an
//! SSE stream of `chat.completion.chunk`s (first one role chunk per choice; every chunk names
//! its choice by `index`).

use axum::extract::State;
use axum::response::Response;
use serde_json::{Map, Value};

use super::{respond, usage_of, Collected, ResponseFormatter};
use crate::engine::{FinishReason, TokenOutput, Usage};
use crate::server::error::ApiError;
use crate::server::extract::JsonObject;
use crate::server::metrics::ModelLabel;
use crate::server::openai::chat::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionResponse, ChatDelta,
    ChatLogprobs, ChatRequest, ChatResponseMessage, ChatTokenLogprob,
};
use crate::server::openai::common::{new_id, unix_now};
use crate::server::sse::{to_data, ChunkFormatter};
use crate::server::validate::{self, ValidRequest};
use crate::server::AppState;

/// The handler; its response carries the model label for `ferry_requests_total`.
pub async fn chat_completions(
    State(state): State<AppState>,
    JsonObject(body): JsonObject,
) -> Response {
    let label = ModelLabel::of(&state, &body);
    label.attach(run(state, body).await)
}

async fn run(state: AppState, body: Map<String, Value>) -> Result<Response, ApiError> {
    let req = ChatRequest::from_json(body)?;
    let valid = validate::chat(&state, req).await?;
    respond(&state, &valid, Formatter::new(&valid)).await
}

/// Builds the response or the chunks of one chat completion.
struct Formatter {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    logprobs: bool,
    /// How many choices (`n`).
    choices: u32,
}

impl Formatter {
    fn new(valid: &ValidRequest) -> Self {
        Self {
            id: new_id("chatcmpl-"),
            created: unix_now(),
            model: valid.served_name().to_owned(),
            include_usage: valid.include_usage(),
            logprobs: valid.params().logprobs.is_some(),
            choices: u32::try_from(valid.n()).unwrap_or(u32::MAX),
        }
    }

    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Option<Usage>>) -> String {
        to_data(&ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        })
    }

    fn choice(
        &self,
        index: u32,
        delta: ChatDelta,
        logprobs: Option<ChatLogprobs>,
    ) -> ChatChunkChoice {
        ChatChunkChoice {
            index,
            delta,
            logprobs,
            finish_reason: None,
        }
    }

    /// Usage field of a non-final chunk: `null` with include_usage, absent otherwise.
    fn chunk_usage(&self) -> Option<Option<Usage>> {
        self.include_usage.then_some(None)
    }
}

impl ResponseFormatter for Formatter {
    type Full = ChatCompletionResponse;

    fn full(&self, done: &[Collected]) -> ChatCompletionResponse {
        let choices = done
            .iter()
            .enumerate()
            .map(|(index, choice)| ChatChoice {
                index: index as u32,
                message: ChatResponseMessage {
                    role: "assistant",
                    content: choice.text(),
                    refusal: None,
                },
                logprobs: self.logprobs.then(|| ChatLogprobs {
                    content: choice
                        .tokens
                        .iter()
                        .filter_map(ChatTokenLogprob::from_output)
                        .collect(),
                }),
                finish_reason: Some(choice.reason),
            })
            .collect();
        ChatCompletionResponse {
            id: self.id.clone(),
            object: "chat.completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: usage_of(done),
        }
    }
}

impl ChunkFormatter for Formatter {
    /// One role chunk per choice.
    fn start(&mut self) -> Vec<String> {
        (0..self.choices)
            .map(|index| {
                let delta = ChatDelta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                };
                self.chunk(vec![self.choice(index, delta, None)], self.chunk_usage())
            })
            .collect()
    }

    fn token(&mut self, index: u32, out: &TokenOutput) -> Vec<String> {
        if out.text.is_empty() && !self.logprobs {
            return Vec::new();
        }
        let logprobs = self.logprobs.then(|| ChatLogprobs {
            content: ChatTokenLogprob::from_output(out).into_iter().collect(),
        });
        let delta = ChatDelta {
            role: None,
            content: Some(out.text.clone()),
        };
        vec![self.chunk(
            vec![self.choice(index, delta, logprobs)],
            self.chunk_usage(),
        )]
    }

    fn finish(&mut self, index: u32, reason: FinishReason, trailing_text: &str) -> Vec<String> {
        let delta = ChatDelta {
            role: None,
            content: (!trailing_text.is_empty()).then(|| trailing_text.to_owned()),
        };
        let mut last = self.choice(index, delta, None);
        last.finish_reason = Some(reason);
        vec![self.chunk(vec![last], self.chunk_usage())]
    }

    fn usage(&mut self, usage: Usage) -> Vec<String> {
        self.include_usage
            .then(|| self.chunk(Vec::new(), Some(Some(usage))))
            .into_iter()
            .collect()
    }
}
