//! `POST /v1/embeddings`: read the request, check it (the model gives embeddings, `dimensions`
//! is its width, at most [`MAX_EMBEDDING_INPUTS`] inputs, none empty, each within the context),
//! tokenise the texts on the bounded tokeniser pool, queue the inputs on the model's engine
//! thread (`Backend::embed`) and answer with one vector per input, in input order.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{Map, Value};

use crate::admission::check_prompt_chars;
use crate::error::ApiError;
use crate::extract::JsonObject;
use crate::metrics::ModelLabel;
use crate::openai::embeddings::{
    EmbeddingData, EmbeddingInput, EmbeddingUsage, EmbeddingVector, EmbeddingsRequest,
    EmbeddingsResponse,
};
use crate::validate::resolve_model;
use crate::AppState;
use ferry_engine::{EmbeddingRequest, EngineError};

/// Most inputs one request may carry (OpenAI's limit).
pub const MAX_EMBEDDING_INPUTS: usize = 2048;

/// The handler; its response carries the model label for `ferry_requests_total`.
pub async fn embeddings(State(state): State<AppState>, JsonObject(body): JsonObject) -> Response {
    let label = ModelLabel::of(&state, &body);
    label.attach(run(state, body).await)
}

async fn run(state: AppState, body: Map<String, Value>) -> Result<Response, ApiError> {
    let req = EmbeddingsRequest::from_json(body)?;
    let model = resolve_model(&state.backend, &state.options, &req.model)?;
    let width = state.backend.embedding_size(&model)?;
    if let Some(d) = req.dimensions.filter(|&d| d != width as i64) {
        return Err(ApiError::unsupported_value(
            "dimensions",
            format!(
                "`dimensions` = {d} is not supported: this model's embeddings have {width} \
                 dimensions, and ferry does not shorten them."
            ),
        ));
    }
    let count = req.input.len();
    if count > MAX_EMBEDDING_INPUTS {
        return Err(ApiError::invalid_value(
            "input",
            format!("{count} inputs are more than one request may embed ({MAX_EMBEDDING_INPUTS})."),
        ));
    }
    let max_context = state.backend.max_context(&model)?;
    let inputs = match req.input {
        EmbeddingInput::Tokens(lists) => lists,
        EmbeddingInput::Texts(texts) => {
            for (i, text) in texts.iter().enumerate() {
                if text.is_empty() {
                    return Err(empty_input(i));
                }
                check_prompt_chars(text.chars().count(), max_context, "input")?;
            }
            state.backend.check_capacity(&model)?;
            let (backend, m) = (Arc::clone(&state.backend), model.clone());
            state
                .admission
                .tokenize(move || {
                    texts
                        .iter()
                        .map(|text| backend.tokenize(&m, text, true))
                        .collect::<Result<Vec<_>, _>>()
                })
                .await?
        }
    };
    check_inputs(&inputs, max_context)?;
    let request = EmbeddingRequest { model, inputs };
    let tokens = request.tokens();
    let reply = state.backend.embed(request)?;
    let vectors = tokio::select! {
        reply = reply => reply.map_err(|_| EngineError::Unavailable)??,
        () = state.lifecycle.deadline() => return Err(ApiError::shutting_down()),
    };
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, values)| EmbeddingData {
            object: "embedding",
            index,
            embedding: EmbeddingVector::new(values, req.encoding_format),
        })
        .collect();
    Ok(Json(EmbeddingsResponse {
        object: "list",
        data,
        model: req.model,
        usage: EmbeddingUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    })
    .into_response())
}

/// Every input holds tokens and fits the context (400 naming `input` otherwise).
fn check_inputs(inputs: &[Vec<u32>], max_context: usize) -> Result<(), ApiError> {
    for (i, input) in inputs.iter().enumerate() {
        if input.is_empty() {
            return Err(empty_input(i));
        }
        if input.len() > max_context {
            return Err(ApiError::input_too_long(i, input.len(), max_context));
        }
    }
    Ok(())
}

fn empty_input(index: usize) -> ApiError {
    ApiError::invalid_value(
        "input",
        format!("Input {index} is empty; every input must hold at least one token."),
    )
}
