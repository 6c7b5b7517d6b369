//! `POST /tokenize` and `POST /detokenize` (vLLM's extensions), run on the bounded tokeniser
//! pool. As in vLLM and llama.cpp, `add_special_tokens: false` only leaves BOS out: special-token
//! text is parsed unless `parse_special: false` (llama.cpp's option); `with_pieces: true`
//! answers each id with its piece.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;

use crate::admission::check_prompt_chars;
use crate::error::ApiError;
use crate::extract::JsonObject;
use crate::openai::tokenize::{
    DetokenizeRequest, DetokenizeResponse, TokenList, TokenizeRequest, TokenizeResponse,
};
use crate::validate::resolve_model;
use crate::AppState;

/// `POST /tokenize`.
pub async fn tokenize(
    State(state): State<AppState>,
    JsonObject(body): JsonObject,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let req = TokenizeRequest::from_json(body)?;
    let model = resolve_model(&state.backend, &state.options, &req.model)?;
    let max_model_len = state.backend.max_context(&model)?;
    check_prompt_chars(req.prompt.chars().count(), max_model_len, "prompt")?;
    let backend = Arc::clone(&state.backend);
    let tokens = state
        .admission
        .tokenize(move || {
            let (text, add) = (&req.prompt, req.add_special_tokens);
            let ids = if req.parse_special {
                backend.tokenize(&model, text, add)?
            } else {
                backend.tokenize_literal(&model, text, add)?
            };
            let pieces = req
                .with_pieces
                .then(|| backend.token_bytes(&model, &ids))
                .transpose()?;
            Ok(TokenList::new(ids, pieces))
        })
        .await?;
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        tokens,
        max_model_len,
    }))
}

/// `POST /detokenize`.
pub async fn detokenize(
    State(state): State<AppState>,
    JsonObject(body): JsonObject,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let req = DetokenizeRequest::from_json(body)?;
    let model = resolve_model(&state.backend, &state.options, &req.model)?;
    let backend = Arc::clone(&state.backend);
    let prompt = state
        .admission
        .tokenize(move || backend.detokenize(&model, &req.tokens))
        .await?;
    Ok(Json(DetokenizeResponse { prompt }))
}
