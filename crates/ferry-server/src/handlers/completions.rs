//! `POST /v1/completions`: validate, submit (`n` choices), then answer with one JSON response
//! or an SSE stream of `text_completion` chunks (each carrying its choice's `index`).

use axum::extract::State;
use axum::response::Response;
use axum::Extension;
use serde_json::{Map, Value};

use super::{respond, usage_of, Collected, ResponseFormatter};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::JsonObject;
use crate::metrics::ModelLabel;
use crate::openai::common::{new_id, unix_now};
use crate::openai::completions::{
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse,
};
use crate::sse::{to_data, ChunkFormatter};
use crate::validate::{self, ValidRequest};
use crate::AppState;
use ferry_engine::{FinishReason, TokenOutput, Usage};

/// The handler; its response carries the model label for `ferry_requests_total`.
pub async fn completions(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    JsonObject(body): JsonObject,
) -> Response {
    let label = ModelLabel::of(&state, &body);
    label.attach(run(state, caller.map(|c| c.0), body).await)
}

async fn run(
    state: AppState,
    caller: Option<Caller>,
    body: Map<String, Value>,
) -> Result<Response, ApiError> {
    let req = CompletionRequest::from_json(body)?;
    let valid = validate::completion(&state, req, caller).await?;
    respond(&state, &valid, Formatter::new(&valid)).await
}

/// Builds responses and chunks; tracks each choice's character offset for `text_offset`.
struct Formatter {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    logprobs: bool,
    /// Per choice: characters streamed so far.
    offsets: Vec<usize>,
}

impl Formatter {
    fn new(valid: &ValidRequest) -> Self {
        Self {
            id: new_id("cmpl-"),
            created: unix_now(),
            model: valid.served_name().to_owned(),
            include_usage: valid.include_usage(),
            logprobs: valid.params().logprobs.is_some(),
            offsets: vec![0; valid.n()],
        }
    }

    fn response(
        &self,
        choices: Vec<CompletionChoice>,
        usage: Option<Option<Usage>>,
    ) -> CompletionResponse {
        CompletionResponse {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }

    /// Usage field of a non-final chunk: `null` with include_usage, absent otherwise.
    fn chunk_usage(&self) -> Option<Option<Usage>> {
        self.include_usage.then_some(None)
    }
}

impl ResponseFormatter for Formatter {
    type Full = CompletionResponse;

    fn full(&self, done: &[Collected]) -> CompletionResponse {
        let choices = done
            .iter()
            .enumerate()
            .map(|(index, choice)| CompletionChoice {
                index: index as u32,
                text: choice.text(),
                logprobs: self.logprobs.then(|| {
                    let mut lp = CompletionLogprobs::default();
                    let mut offset = 0;
                    for out in &choice.tokens {
                        lp.push(out, offset);
                        offset += out.text.chars().count();
                    }
                    lp
                }),
                finish_reason: Some(choice.reason),
            })
            .collect();
        self.response(choices, Some(Some(usage_of(done))))
    }
}

impl ChunkFormatter for Formatter {
    fn start(&mut self) -> Vec<String> {
        Vec::new()
    }

    fn token(&mut self, index: u32, out: &TokenOutput) -> Vec<String> {
        if out.text.is_empty() && !self.logprobs {
            return Vec::new();
        }
        let Some(offset) = self.offsets.get_mut(index as usize) else {
            return Vec::new();
        };
        let logprobs = self.logprobs.then(|| {
            let mut lp = CompletionLogprobs::default();
            lp.push(out, *offset);
            lp
        });
        *offset += out.text.chars().count();
        let choice = CompletionChoice {
            index,
            text: out.text.clone(),
            logprobs,
            finish_reason: None,
        };
        vec![to_data(&self.response(vec![choice], self.chunk_usage()))]
    }

    fn finish(&mut self, index: u32, reason: FinishReason, trailing_text: &str) -> Vec<String> {
        let choice = CompletionChoice {
            index,
            text: trailing_text.to_owned(),
            logprobs: None,
            finish_reason: Some(reason),
        };
        vec![to_data(&self.response(vec![choice], self.chunk_usage()))]
    }

    fn usage(&mut self, usage: Usage) -> Vec<String> {
        self.include_usage
            .then(|| to_data(&self.response(Vec::new(), Some(Some(usage)))))
            .into_iter()
            .collect()
    }
}
