//! Wire types of vLLM's `/tokenize` and `/detokenize` extensions (with llama.cpp's
//! `parse_special` and `with_pieces` on `/tokenize`) and of `GET /v1/models`.

use serde::Serialize;
use serde_json::{Map, Value};

use super::fields::Fields;
use crate::error::ApiError;

/// `POST /tokenize` body: `{"model", "prompt", "add_special_tokens" (default true),
/// "parse_special" (default true), "with_pieces" (default false)}`.
///
/// As in vLLM and llama.cpp, `add_special_tokens` only decides whether BOS (etc.) is added;
/// special-token text in the prompt (`<|im_start|>`) becomes its control token unless
/// `parse_special` is false.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenizeRequest {
    /// `model`.
    pub model: String,
    /// `prompt`.
    pub prompt: String,
    /// `add_special_tokens`: add BOS when the model wants it.
    pub add_special_tokens: bool,
    /// `parse_special`: special-token text becomes control tokens.
    pub parse_special: bool,
    /// `with_pieces`: answer each token with its piece of text.
    pub with_pieces: bool,
}

impl TokenizeRequest {
    /// Reads a request body.
    pub fn from_json(map: Map<String, Value>) -> Result<Self, ApiError> {
        let mut f = Fields::new(map, "");
        f.reject_others(
            &[
                "model",
                "prompt",
                "add_special_tokens",
                "parse_special",
                "with_pieces",
            ],
            &["messages"],
        )?;
        Ok(Self {
            model: f.required("model", "a string")?,
            prompt: f.required("prompt", "a string")?,
            add_special_tokens: f
                .optional("add_special_tokens", "a boolean")?
                .unwrap_or(true),
            parse_special: f.optional("parse_special", "a boolean")?.unwrap_or(true),
            with_pieces: f.optional("with_pieces", "a boolean")?.unwrap_or(false),
        })
    }
}

/// `POST /tokenize` response.
#[derive(Debug, Clone, Serialize)]
pub struct TokenizeResponse {
    /// Token ids, or with `with_pieces` each id with its piece.
    pub tokens: TokenList,
    /// The number of tokens.
    pub count: usize,
    /// The model's context window.
    pub max_model_len: usize,
}

/// The `tokens` of a `/tokenize` response.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum TokenList {
    /// `[id, ...]`.
    Ids(Vec<u32>),
    /// `[{"id", "piece"}, ...]` (llama.cpp's `with_pieces`).
    Pieces(Vec<TokenPiece>),
}

impl TokenList {
    /// The ids, with their pieces when `pieces` is given (one byte string per id).
    pub fn new(ids: Vec<u32>, pieces: Option<Vec<Vec<u8>>>) -> Self {
        match pieces {
            None => Self::Ids(ids),
            Some(pieces) => Self::Pieces(
                ids.into_iter()
                    .zip(pieces)
                    .map(|(id, bytes)| TokenPiece {
                        id,
                        piece: Piece::from_bytes(bytes),
                    })
                    .collect(),
            ),
        }
    }

    /// The number of tokens.
    pub fn len(&self) -> usize {
        match self {
            Self::Ids(ids) => ids.len(),
            Self::Pieces(pieces) => pieces.len(),
        }
    }
}

/// One token of a `with_pieces` answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenPiece {
    /// The token id.
    pub id: u32,
    /// What it stands for.
    pub piece: Piece,
}

/// A token's piece: its text when its bytes are valid UTF-8, else the byte values (a token
/// holding part of a character), as llama.cpp answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Piece {
    /// Valid UTF-8.
    Text(String),
    /// Anything else.
    Bytes(Vec<u8>),
}

impl Piece {
    /// The text of `bytes`, or the bytes themselves when they are not UTF-8.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        match String::from_utf8(bytes) {
            Ok(text) => Self::Text(text),
            Err(err) => Self::Bytes(err.into_bytes()),
        }
    }
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
    pub status: ferry_engine::ModelStatus,
    /// Offload mode `model`: `device`, `host` or `moving` (ferry extension; absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(body: Value) -> Result<TokenizeRequest, ApiError> {
        match body {
            Value::Object(map) => TokenizeRequest::from_json(map),
            _ => unreachable!(),
        }
    }

    #[test]
    fn defaults_parse_special_tokens_and_add_bos_without_pieces() {
        let req = request(json!({"model": "m", "prompt": "p"})).unwrap();
        assert!(req.add_special_tokens && req.parse_special && !req.with_pieces);
        let req = request(
            json!({"model": "m", "prompt": "p", "add_special_tokens": false,
            "parse_special": false, "with_pieces": true}),
        )
        .unwrap();
        assert!(!req.add_special_tokens && !req.parse_special && req.with_pieces);
    }

    #[test]
    fn a_flag_of_the_wrong_type_names_it() {
        let err =
            request(json!({"model": "m", "prompt": "p", "parse_special": "yes"})).unwrap_err();
        assert_eq!(err.param(), Some("parse_special"));
        let err = request(json!({"model": "m", "prompt": "p", "with_pieces": 1})).unwrap_err();
        assert_eq!(err.param(), Some("with_pieces"));
    }

    #[test]
    fn pieces_are_text_when_utf8_and_byte_values_otherwise() {
        let list = TokenList::new(vec![7, 8], Some(vec![b"hi".to_vec(), vec![0xE2, 0x82]]));
        assert_eq!(
            serde_json::to_value(&list).unwrap(),
            json!([{"id": 7, "piece": "hi"}, {"id": 8, "piece": [226, 130]}])
        );
        assert_eq!(list.len(), 2);
        let ids = TokenList::new(vec![1, 2, 3], None);
        assert_eq!(serde_json::to_value(&ids).unwrap(), json!([1, 2, 3]));
    }
}
