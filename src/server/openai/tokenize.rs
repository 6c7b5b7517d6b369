//! Wire types of vLLM's `/tokenize` and `/detokenize` extensions and of `GET /v1/models`.

use serde::Serialize;
use serde_json::{Map, Value};

use super::fields::Fields;
use crate::server::error::ApiError;

/// `POST /tokenize` body: `{"model", "prompt", "add_special_tokens" (default true)}`.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizeRequest {
    /// `model`.
    pub model: String,
    /// `prompt`.
    pub prompt: String,
    /// `add_special_tokens`.
    pub add_special_tokens: bool,
}

impl TokenizeRequest {
    /// Reads a request body.
    pub fn from_json(map: Map<String, Value>) -> Result<Self, ApiError> {
        let mut f = Fields::new(map, "");
        f.reject_others(&["model", "prompt", "add_special_tokens"], &["messages"])?;
        Ok(Self {
            model: f.required("model", "a string")?,
            prompt: f.required("prompt", "a string")?,
            add_special_tokens: f
                .optional("add_special_tokens", "a boolean")?
                .unwrap_or(true),
        })
    }
}

/// `POST /tokenize` response.
#[derive(Debug, Clone, Serialize)]
pub struct TokenizeResponse {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// `tokens.len()`.
    pub count: usize,
    /// The model's context window.
    pub max_model_len: usize,
}

/// `POST /detokenize` body: `{"model", "tokens"}`.
#[derive(Debug, Clone, PartialEq)]
pub struct DetokenizeRequest {
    /// `model`.
    pub model: String,
    /// `tokens`.
    pub tokens: Vec<u32>,
}

impl DetokenizeRequest {
    /// Reads a request body.
    pub fn from_json(map: Map<String, Value>) -> Result<Self, ApiError> {
        let mut f = Fields::new(map, "");
        f.reject_others(&["model", "tokens"], &[])?;
        Ok(Self {
            model: f.required("model", "a string")?,
            tokens: f.required("tokens", "an array of token ids")?,
        })
    }
}

/// `POST /detokenize` response.
#[derive(Debug, Clone, Serialize)]
pub struct DetokenizeResponse {
    /// The decoded text.
    pub prompt: String,
}

/// `GET /v1/models` response.
#[derive(Debug, Clone, Serialize)]
pub struct ModelList {
    /// Always `"list"`.
    pub object: &'static str,
    /// One entry per served model and per alias.
    pub data: Vec<ModelObject>,
}

/// One model in the list.
#[derive(Debug, Clone, Serialize)]
pub struct ModelObject {
    /// The name clients send as `model`.
    pub id: String,
    /// Always `"model"`.
    pub object: &'static str,
    /// Unix seconds when the server registered it.
    pub created: u64,
    /// Always `"ferry"`.
    pub owned_by: &'static str,
    /// The served model this name resolves to (itself unless an alias).
    pub root: String,
    /// Context window, once loaded.
    pub max_model_len: Option<usize>,
    /// `loading`, `ready` or `failed` (ferry extension).
    pub status: crate::engine::ModelStatus,
    /// Offload mode `model`: `device`, `host` or `moving` (ferry extension; absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
}
