//! `/v1/embeddings` wire types: the request as read from JSON (types checked, unknown fields
//! rejected) and the response (`object: "list"` of `object: "embedding"`).
//!
//! Accepted: `model`, `input` (a string, an array of strings, an array of token ids, or an
//! array of arrays of token ids), `encoding_format` (`float`, the default, or `base64`:
//! little-endian f32 bytes), `dimensions` (checked against the model's width by the handler:
//! ferry does not shorten vectors) and `user` (read and ignored). Any other field is unknown.

use serde::Serialize;
use serde_json::Value;

use super::base64;
use super::fields::{as_integer, Fields};
use crate::error::ApiError;

/// What the client asked to embed, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum EmbeddingInput {
    /// Texts, tokenised by the server (special tokens added).
    Texts(Vec<String>),
    /// Token ids, used as they are.
    Tokens(Vec<Vec<u32>>),
}

impl EmbeddingInput {
    /// How many inputs.
    pub fn len(&self) -> usize {
        match self {
            EmbeddingInput::Texts(texts) => texts.len(),
            EmbeddingInput::Tokens(lists) => lists.len(),
        }
    }
}

/// How the vectors are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EncodingFormat {
    /// JSON numbers.
    #[default]
    Float,
    /// base64 of the little-endian f32 bytes.
    Base64,
}

/// A `/v1/embeddings` request body, types checked.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingsRequest {
    /// `model`.
    pub model: String,
    /// `input`.
    pub input: EmbeddingInput,
    /// `encoding_format`.
    pub encoding_format: EncodingFormat,
    /// `dimensions`.
    pub dimensions: Option<i64>,
}

const FIELDS: &[&str] = &["model", "input", "encoding_format", "dimensions", "user"];

impl EmbeddingsRequest {
    /// Reads a request body.
    pub fn from_json(map: serde_json::Map<String, Value>) -> Result<Self, ApiError> {
        let mut f = Fields::new(map, "");
        f.reject_others(FIELDS, &[])?;
        let model = f.required("model", "a string")?;
        let input = match f.take_raw("input") {
            Some(value) => read_input(value)?,
            None => return Err(ApiError::missing("input")),
        };
        let encoding_format = match f
            .optional::<String>("encoding_format", "a string")?
            .as_deref()
        {
            None | Some("float") => EncodingFormat::Float,
            Some("base64") => EncodingFormat::Base64,
            Some(other) => {
                return Err(ApiError::invalid_value(
                    "encoding_format",
                    format!("`encoding_format` must be \"float\" or \"base64\", not {other:?}."),
                ))
            }
        };
        let dimensions = f.optional("dimensions", "an integer")?;
        let _user: Option<String> = f.optional("user", "a string")?;
        Ok(Self {
            model,
            input,
            encoding_format,
            dimensions,
        })
    }
}

const EXPECTED: &str =
    "a string, an array of strings, an array of token ids, or an array of arrays of token ids";

fn empty() -> ApiError {
    ApiError::invalid_value("input", "The input must not be empty.")
}

fn read_input(value: Value) -> Result<EmbeddingInput, ApiError> {
    let items = match value {
        Value::String(s) => return Ok(EmbeddingInput::Texts(vec![s])),
        Value::Array(items) => items,
        other => return Err(ApiError::invalid_type("input", EXPECTED, &other)),
    };
    let wrong = |items: Vec<Value>| ApiError::invalid_type("input", EXPECTED, &Value::Array(items));
    match items.first() {
        None => Err(empty()),
        Some(Value::String(_)) => {
            let texts: Option<Vec<String>> = items
                .iter()
                .map(|v| v.as_str().map(str::to_owned))
                .collect();
            texts.map(EmbeddingInput::Texts).ok_or_else(|| wrong(items))
        }
        Some(Value::Array(_)) => {
            let lists: Option<Vec<Vec<u32>>> = items
                .iter()
                .map(|v| v.as_array().and_then(|inner| token_ids(inner)))
                .collect();
            lists
                .map(EmbeddingInput::Tokens)
                .ok_or_else(|| wrong(items))
        }
        Some(_) => match token_ids(&items) {
            Some(ids) => Ok(EmbeddingInput::Tokens(vec![ids])),
            None => Err(wrong(items)),
        },
    }
}

fn token_ids(items: &[Value]) -> Option<Vec<u32>> {
    items
        .iter()
        .map(|v| as_integer(v).and_then(|id| u32::try_from(id).ok()))
        .collect()
}

/// One vector as the client asked for it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum EmbeddingVector {
    /// JSON numbers.
    Float(Vec<f32>),
    /// base64 of the little-endian f32 bytes.
    Base64(String),
}

impl EmbeddingVector {
    /// `values` in `format`.
    pub fn new(values: Vec<f32>, format: EncodingFormat) -> Self {
        match format {
            EncodingFormat::Float => Self::Float(values),
            EncodingFormat::Base64 => Self::Base64(base64::encode_f32_le(&values)),
        }
    }
}

/// One input's embedding.
#[derive(Debug, Clone, Serialize)]
pub struct EmbeddingData {
    /// Always `"embedding"`.
    pub object: &'static str,
    /// The input's position in the request.
    pub index: usize,
    /// The vector.
    pub embedding: EmbeddingVector,
}

/// Tokens the request's inputs held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct EmbeddingUsage {
    /// Tokens over every input.
    pub prompt_tokens: usize,
    /// The same (embeddings generate nothing).
    pub total_tokens: usize,
}

/// The response body.
#[derive(Debug, Clone, Serialize)]
pub struct EmbeddingsResponse {
    /// Always `"list"`.
    pub object: &'static str,
    /// One entry per input, in input order.
    pub data: Vec<EmbeddingData>,
    /// The model name as the client sent it.
    pub model: String,
    /// Token counts.
    pub usage: EmbeddingUsage,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(body: Value) -> Result<EmbeddingsRequest, ApiError> {
        match body {
            Value::Object(map) => EmbeddingsRequest::from_json(map),
            _ => unreachable!("tests pass objects"),
        }
    }

    fn input(value: Value) -> Result<EmbeddingInput, ApiError> {
        read(json!({"model": "m", "input": value})).map(|r| r.input)
    }

    #[test]
    fn reads_every_input_form() {
        assert_eq!(
            input(json!("a")).unwrap(),
            EmbeddingInput::Texts(vec!["a".into()])
        );
        assert_eq!(
            input(json!(["a", "b"])).unwrap(),
            EmbeddingInput::Texts(vec!["a".into(), "b".into()])
        );
        assert_eq!(
            input(json!([1, 2.0])).unwrap(),
            EmbeddingInput::Tokens(vec![vec![1, 2]])
        );
        assert_eq!(
            input(json!([[1], [2, 3]])).unwrap(),
            EmbeddingInput::Tokens(vec![vec![1], vec![2, 3]])
        );
        for bad in [
            json!(["a", 1]),
            json!([[1], "a"]),
            json!([-1]),
            json!(3),
            json!([{}]),
        ] {
            let err = input(bad.clone()).unwrap_err();
            assert_eq!(
                (err.param(), err.code()),
                (Some("input"), Some("invalid_type")),
                "{bad}"
            );
        }
        assert_eq!(input(json!([])).unwrap_err().code(), Some("invalid_value"));
    }

    #[test]
    fn reads_the_other_fields() {
        let r = read(json!({"model": "m", "input": "a", "user": "u"})).unwrap();
        assert_eq!(
            (r.encoding_format, r.dimensions),
            (EncodingFormat::Float, None)
        );
        let r = read(
            json!({"model": "m", "input": "a", "encoding_format": "base64",
                            "dimensions": 8}),
        )
        .unwrap();
        assert_eq!(
            (r.encoding_format, r.dimensions),
            (EncodingFormat::Base64, Some(8))
        );
        let err = read(json!({"model": "m", "input": "a", "encoding_format": "int8"})).unwrap_err();
        assert_eq!(err.param(), Some("encoding_format"));
        let err = read(json!({"model": "m", "input": "a", "temperature": 1})).unwrap_err();
        assert_eq!(err.code(), Some("unknown_parameter"));
        let err = read(json!({"model": "m"})).unwrap_err();
        assert_eq!(err.code(), Some("missing_required_parameter"));
    }

    #[test]
    fn writes_vectors_as_asked() {
        let v = EmbeddingVector::new(vec![1.0, -2.0], EncodingFormat::Base64);
        assert_eq!(serde_json::to_value(v).unwrap(), json!("AACAPwAAAMA="));
        let v = EmbeddingVector::new(vec![0.5], EncodingFormat::Float);
        assert_eq!(serde_json::to_value(v).unwrap(), json!([0.5]));
    }
}
