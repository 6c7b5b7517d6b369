//! `/v1/completions` wire types: the request as read from JSON (types checked, unsupported
//! fields rejected) and the response / stream chunk (`object: "text_completion"` for both).
//!
//! Accepted: `model`, `prompt`, `max_tokens`, `logprobs`, the shared sampling fields
//! ([`super::common::SAMPLING_FIELDS`], which include the ignored ones of
//! [`super::common::IGNORED_FIELDS`], and `n` and `logit_bias`), `echo` (false only), `best_of`
//! (equal to `n`: ferry returns every candidate, it does not rank them). Rejected as unsupported: `suffix`, `max_completion_tokens`, `response_format`; any
//! other field is unknown.

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use serde_json::Value;

use super::common::{SamplingWire, SAMPLING_FIELDS};
use super::fields::{as_integer, Fields};
use crate::error::ApiError;
use ferry_engine::{FinishReason, TokenOutput, Usage};

/// What the client asked to complete.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptWire {
    /// Text, tokenised by the server (special tokens added).
    Text(String),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
}

/// A `/v1/completions` request body, types checked.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest {
    /// `model`.
    pub model: String,
    /// `prompt`.
    pub prompt: PromptWire,
    /// `max_tokens` (OpenAI's default is 16).
    pub max_tokens: Option<i64>,
    /// `logprobs`: how many top alternatives to report per token.
    pub logprobs: Option<i64>,
    /// Sampling, stop and streaming fields.
    pub sampling: SamplingWire,
}

const OWN_FIELDS: &[&str] = &[
    "model",
    "prompt",
    "max_tokens",
    "logprobs",
    "echo",
    "best_of",
];
const UNSUPPORTED: &[&str] = &["suffix", "max_completion_tokens", "response_format"];

impl CompletionRequest {
    /// Reads a request body.
    pub fn from_json(map: serde_json::Map<String, Value>) -> Result<Self, ApiError> {
        let mut f = Fields::new(map, "");
        let known: Vec<&str> = OWN_FIELDS.iter().chain(SAMPLING_FIELDS).copied().collect();
        f.reject_others(&known, UNSUPPORTED)?;
        f.only("echo", "a boolean", false)?;
        let best_of: Option<i64> = f.optional("best_of", "an integer")?;
        let model = f.required("model", "a string")?;
        let prompt = match f.take_raw("prompt") {
            Some(value) => read_prompt(value)?,
            None => return Err(ApiError::missing("prompt")),
        };
        let max_tokens = f.optional("max_tokens", "an integer")?;
        let logprobs = f.optional("logprobs", "an integer")?;
        let sampling = SamplingWire::read(&mut f)?;
        // `best_of` candidates of which the `n` best come back: equal to `n`, that is all of
        // them, which ferry does; more would need ranking by logprob, which it does not do.
        let n = sampling.n.unwrap_or(1);
        if let Some(best_of) = best_of.filter(|&b| b != n) {
            return Err(ApiError::unsupported_value(
                "best_of",
                format!(
                    "`best_of` = {best_of} is not supported by this server; only best_of equal \
                     to n ({n}) is (every candidate is returned, none is ranked)."
                ),
            ));
        }
        Ok(Self {
            model,
            prompt,
            max_tokens,
            logprobs,
            sampling,
        })
    }
}

fn read_prompt(value: Value) -> Result<PromptWire, ApiError> {
    const EXPECTED: &str = "a string, an array of one string, or an array of token ids";
    let batch = || {
        ApiError::unsupported_value(
            "prompt",
            "Batched prompts are not supported; send one prompt per request.",
        )
    };
    let items = match value {
        Value::String(s) => return Ok(PromptWire::Text(s)),
        Value::Array(items) => items,
        other => return Err(ApiError::invalid_type("prompt", EXPECTED, &other)),
    };
    match items.first() {
        None => Err(ApiError::invalid_value(
            "prompt",
            "The prompt must not be empty.",
        )),
        Some(Value::String(_)) | Some(Value::Array(_)) if items.len() > 1 => Err(batch()),
        Some(Value::String(s)) => Ok(PromptWire::Text(s.clone())),
        Some(Value::Array(inner)) => token_ids(inner),
        Some(_) => token_ids(&items),
    }
}

fn token_ids(items: &[Value]) -> Result<PromptWire, ApiError> {
    let ids = items
        .iter()
        .map(|v| as_integer(v).and_then(|id| u32::try_from(id).ok()))
        .collect::<Option<Vec<u32>>>();
    match ids {
        Some(ids) if !ids.is_empty() => Ok(PromptWire::Tokens(ids)),
        Some(_) => Err(ApiError::invalid_value(
            "prompt",
            "The prompt must not be empty.",
        )),
        None => Err(ApiError::invalid_type(
            "prompt",
            "an array of token ids (integers 0..2^32)",
            &Value::Array(items.to_vec()),
        )),
    }
}

/// A completion response, or one stream chunk of it.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionResponse {
    /// `cmpl-...`, the same in every chunk.
    pub id: String,
    /// Always `"text_completion"`.
    pub object: &'static str,
    /// Unix seconds, the same in every chunk.
    pub created: u64,
    /// The model name as the client sent it.
    pub model: String,
    /// One choice per `n` (in chunks: one of them, or none in the final usage chunk).
    pub choices: Vec<CompletionChoice>,
    /// Token counts: always in a full response; in chunks `null`, except the final usage chunk,
    /// when `stream_options.include_usage`; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// One completion choice.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    /// Its place among the `n` choices.
    pub index: u32,
    /// Generated text (the whole text, or this chunk's part).
    pub text: String,
    /// Logprobs when asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// Set on the last choice only.
    pub finish_reason: Option<FinishReason>,
}

/// The legacy completions logprobs object.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CompletionLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's logprob.
    pub token_logprobs: Vec<Option<f32>>,
    /// Each token's top alternatives, as `{token: logprob}`, most likely first.
    pub top_logprobs: Vec<TopLogprobMap>,
    /// Each token's character offset in the generated text.
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// Appends one generated token that starts at character `offset` of the output text.
    pub fn push(&mut self, out: &TokenOutput, offset: usize) {
        let token = out
            .logprob
            .as_ref()
            .map(|l| l.token.clone())
            .unwrap_or_default();
        self.tokens.push(token);
        self.token_logprobs
            .push(out.logprob.as_ref().map(|l| l.logprob));
        let top = out
            .top_logprobs
            .iter()
            .map(|l| (l.token.clone(), l.logprob))
            .collect();
        self.top_logprobs.push(TopLogprobMap(top));
        self.text_offset.push(offset);
    }
}

/// `{token: logprob}` keeping the engine's order (most likely first); a token text that occurs
/// twice keeps its first (larger) value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopLogprobMap(pub Vec<(String, f32)>);

impl Serialize for TopLogprobMap {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seen = std::collections::HashSet::new();
        let mut map = serializer.serialize_map(None)?;
        for (token, logprob) in &self.0 {
            if seen.insert(token.as_str()) {
                map.serialize_entry(token, logprob)?;
            }
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(v: Value) -> Result<CompletionRequest, ApiError> {
        let Value::Object(map) = v else { panic!() };
        CompletionRequest::from_json(map)
    }

    #[test]
    fn prompt_forms() {
        let p = |v| req(json!({"model": "m", "prompt": v})).map(|r| r.prompt);
        assert_eq!(p(json!("hi")).unwrap(), PromptWire::Text("hi".into()));
        assert_eq!(p(json!(["hi"])).unwrap(), PromptWire::Text("hi".into()));
        assert_eq!(p(json!([1, 2])).unwrap(), PromptWire::Tokens(vec![1, 2]));
        assert_eq!(p(json!([[3]])).unwrap(), PromptWire::Tokens(vec![3]));
        assert_eq!(
            p(json!(["a", "b"])).unwrap_err().code(),
            Some("unsupported_value")
        );
        assert_eq!(p(json!([])).unwrap_err().code(), Some("invalid_value"));
        assert_eq!(p(json!([1, "a"])).unwrap_err().code(), Some("invalid_type"));
        assert_eq!(p(json!(5)).unwrap_err().param(), Some("prompt"));
    }

    #[test]
    fn unsupported_fields() {
        let e = req(json!({"model": "m", "prompt": "x", "suffix": "y"})).unwrap_err();
        assert_eq!(
            (e.param(), e.code()),
            (Some("suffix"), Some("unsupported_parameter"))
        );
        let e = req(json!({"model": "m", "prompt": "x", "echo": true})).unwrap_err();
        assert_eq!(e.param(), Some("echo"));
        let e = req(json!({"model": "m", "prompt": "x", "logit_bias": [1, 2]})).unwrap_err();
        assert_eq!(e.param(), Some("logit_bias"));
        assert!(req(json!({"model": "m", "prompt": "x", "logit_bias": {}, "echo": false})).is_ok());
        // best_of: equal to n (default 1) only.
        assert!(req(json!({"model": "m", "prompt": "x", "best_of": 1})).is_ok());
        assert!(req(json!({"model": "m", "prompt": "x", "n": 3, "best_of": 3})).is_ok());
        for bad in [json!({"best_of": 2}), json!({"n": 2, "best_of": 3})] {
            let mut body = json!({"model": "m", "prompt": "x"});
            body.as_object_mut()
                .unwrap()
                .extend(bad.as_object().unwrap().clone());
            let e = req(body).unwrap_err();
            assert_eq!(
                (e.param(), e.code()),
                (Some("best_of"), Some("unsupported_value"))
            );
        }
    }

    #[test]
    fn top_logprob_map_keeps_order_and_first() {
        let m = TopLogprobMap(vec![
            ("b".into(), -0.5),
            ("a".into(), -1.0),
            ("b".into(), -2.0),
        ]);
        assert_eq!(serde_json::to_string(&m).unwrap(), r#"{"b":-0.5,"a":-1.0}"#);
    }
}
