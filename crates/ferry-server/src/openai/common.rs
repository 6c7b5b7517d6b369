//! Wire pieces shared by `/v1/completions` and `/v1/chat/completions`: the sampling and streaming
//! fields (read with their JSON types checked, ranges are checked later by validation), response
//! ids and timestamps.

use rand::distr::{Alphanumeric, SampleString};
use serde_json::Value;

use super::fields::{as_integer, Fields};
use crate::error::ApiError;
use ferry_engine::{CompletionTokensDetails, Usage};

/// Most stop sequences a request may give (OpenAI allows 4; we allow more).
pub const MAX_STOP_SEQUENCES: usize = 16;

/// Fields accepted and ignored by every generation endpoint. The rule: a field OpenAI defines
/// that only steers OpenAI's own service (caching, abuse monitoring, billing tier) and never
/// changes what is generated is accepted and ignored; a field that would change the output and
/// is not implemented is `unsupported_parameter`; a field nobody defines is
/// `unknown_parameter`.
pub const IGNORED_FIELDS: &[&str] = &[
    "user",
    "prompt_cache_key",
    "safety_identifier",
    "service_tier",
];

/// Fields every generation endpoint accepts (read by [`SamplingWire::read`]).
pub const SAMPLING_FIELDS: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "stop",
    "ignore_eos",
    "stream",
    "stream_options",
    "n",
    "logit_bias",
    "cache_salt",
    "user",
    "prompt_cache_key",
    "safety_identifier",
    "service_tier",
];

/// Sampling, stop and streaming fields as sent, types checked, ranges not yet.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingWire {
    /// `temperature`.
    pub temperature: Option<f64>,
    /// `top_p`.
    pub top_p: Option<f64>,
    /// `top_k` (vLLM extension; -1 or 0 disable it).
    pub top_k: Option<i64>,
    /// `min_p` (vLLM extension).
    pub min_p: Option<f64>,
    /// `seed` (negative seeds are taken as their two's complement bits).
    pub seed: Option<u64>,
    /// `presence_penalty`.
    pub presence_penalty: Option<f64>,
    /// `frequency_penalty`.
    pub frequency_penalty: Option<f64>,
    /// `repetition_penalty` (vLLM extension).
    pub repetition_penalty: Option<f64>,
    /// `stop`, a string or an array of strings.
    pub stop: Vec<String>,
    /// `ignore_eos` (vLLM extension).
    pub ignore_eos: bool,
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `n`: how many choices to generate.
    pub n: Option<i64>,
    /// `logit_bias` as sent: token id text -> bias (keys and ranges checked by validation).
    pub logit_bias: Vec<(String, f64)>,
    /// `cache_salt` (vLLM): prompts with another salt (or none) never share prefix-cache blocks
    /// with this one.
    pub cache_salt: Option<String>,
}

const NUMBER: &str = "a number";
const INTEGER: &str = "an integer";
const BOOLEAN: &str = "a boolean";

impl SamplingWire {
    /// Reads the [`SAMPLING_FIELDS`] out of a request object. The [`IGNORED_FIELDS`] must be
    /// strings and are ignored.
    pub fn read(f: &mut Fields) -> Result<Self, ApiError> {
        for field in IGNORED_FIELDS {
            let _ignored: Option<String> = f.optional(field, "a string")?;
        }
        let stream = f.optional("stream", BOOLEAN)?.unwrap_or(false);
        let include_usage = read_stream_options(f, stream)?;
        Ok(Self {
            temperature: f.optional("temperature", NUMBER)?,
            top_p: f.optional("top_p", NUMBER)?,
            top_k: f.optional("top_k", INTEGER)?,
            min_p: f.optional("min_p", NUMBER)?,
            seed: read_seed(f)?,
            presence_penalty: f.optional("presence_penalty", NUMBER)?,
            frequency_penalty: f.optional("frequency_penalty", NUMBER)?,
            repetition_penalty: f.optional("repetition_penalty", NUMBER)?,
            stop: read_stop(f)?,
            ignore_eos: f.optional("ignore_eos", BOOLEAN)?.unwrap_or(false),
            stream,
            include_usage,
            n: f.optional("n", INTEGER)?,
            logit_bias: read_logit_bias(f)?,
            cache_salt: read_cache_salt(f)?,
        })
    }
}

/// `cache_salt`: a non-empty string (vLLM's rule).
fn read_cache_salt(f: &mut Fields) -> Result<Option<String>, ApiError> {
    let salt: Option<String> = f.optional("cache_salt", "a string")?;
    if salt.as_deref() == Some("") {
        return Err(ApiError::invalid_value(
            &f.param("cache_salt"),
            "`cache_salt` must not be empty.",
        ));
    }
    Ok(salt)
}

/// `logit_bias`: an object of numbers (keys are checked as token ids by validation).
fn read_logit_bias(f: &mut Fields) -> Result<Vec<(String, f64)>, ApiError> {
    let param = f.param("logit_bias");
    let map = match f.take_raw("logit_bias") {
        None => return Ok(Vec::new()),
        Some(Value::Object(map)) => map,
        Some(other) => return Err(ApiError::invalid_type(&param, "an object", &other)),
    };
    map.into_iter()
        .map(|(key, value)| match value.as_f64() {
            Some(bias) => Ok((key, bias)),
            None => Err(ApiError::invalid_type(
                &format!("{param}.{key}"),
                NUMBER,
                &value,
            )),
        })
        .collect()
}

fn read_seed(f: &mut Fields) -> Result<Option<u64>, ApiError> {
    let Some(value) = f.take_raw("seed") else {
        return Ok(None);
    };
    let seed = match &value {
        Value::Number(n) => n.as_u64().or_else(|| as_integer(&value).map(|i| i as u64)),
        _ => None,
    };
    seed.map(Some)
        .ok_or_else(|| ApiError::invalid_type(&f.param("seed"), INTEGER, &value))
}

fn read_stop(f: &mut Fields) -> Result<Vec<String>, ApiError> {
    let param = f.param("stop");
    let stop = match f.take_raw("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(s) => Ok(s),
                other => Err(ApiError::invalid_type(
                    &format!("{param}[{i}]"),
                    "a string",
                    &other,
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(ApiError::invalid_type(
                &param,
                "a string or an array of strings",
                &other,
            ))
        }
    };
    if stop.len() > MAX_STOP_SEQUENCES {
        return Err(ApiError::invalid_value(
            &param,
            format!("At most {MAX_STOP_SEQUENCES} stop sequences are allowed."),
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid_value(
            &param,
            "Stop sequences must not be empty.",
        ));
    }
    Ok(stop)
}

fn read_stream_options(f: &mut Fields, stream: bool) -> Result<bool, ApiError> {
    let param = f.param("stream_options");
    let Some(value) = f.take_raw("stream_options") else {
        return Ok(false);
    };
    if !stream {
        return Err(ApiError::invalid_value(
            &param,
            "`stream_options` is only allowed when `stream` is true.",
        ));
    }
    let mut options = Fields::from_value(value, &param)?;
    options.reject_others(&["include_usage"], &[])?;
    Ok(options.optional("include_usage", BOOLEAN)?.unwrap_or(false))
}

/// The usage of the choices of one request (`n` of them, one prompt): the prompt counted once,
/// as OpenAI counts it, and the completions of every choice.
pub fn choices_usage(usages: &[Usage]) -> Usage {
    let prompt_tokens = usages.first().map_or(0, |u| u.prompt_tokens);
    let completion_tokens = usages.iter().map(|u| u.completion_tokens).sum();
    Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
        // The prompt's breakdown is the first choice's, which computed it.
        prompt_tokens_details: usages.first().and_then(|u| u.prompt_tokens_details),
        completion_tokens_details: usages
            .iter()
            .filter_map(|u| u.completion_tokens_details)
            .reduce(|a, b| CompletionTokensDetails {
                reasoning_tokens: a.reasoning_tokens + b.reasoning_tokens,
            }),
    }
}

/// A fresh response id: `prefix` followed by 24 random alphanumerics (`cmpl-`, `chatcmpl-`).
pub fn new_id(prefix: &str) -> String {
    format!(
        "{prefix}{}",
        Alphanumeric.sample_string(&mut rand::rng(), 24)
    )
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(v: Value) -> Result<SamplingWire, ApiError> {
        let Value::Object(map) = v else { panic!() };
        SamplingWire::read(&mut Fields::new(map, ""))
    }

    #[test]
    fn reads_fields() {
        let s = read(
            json!({"temperature": 0, "stop": "x", "seed": -1, "stream": true,
            "stream_options": {"include_usage": true}, "n": 1.0, "user": "u",
            "prompt_cache_key": "k", "safety_identifier": "s", "service_tier": "auto"}),
        )
        .unwrap();
        assert_eq!(s.temperature, Some(0.0));
        assert_eq!(s.stop, vec!["x".to_owned()]);
        assert_eq!(s.seed, Some(u64::MAX));
        assert!(s.stream && s.include_usage);
    }

    #[test]
    fn rejects_bad_shapes() {
        let e = read(json!({"stop": [1]})).unwrap_err();
        assert_eq!(e.param(), Some("stop[0]"));
        let e = read(json!({"stream_options": {"include_usage": true}})).unwrap_err();
        assert_eq!(e.param(), Some("stream_options"));
        let e = read(json!({"stream": true, "stream_options": {"x": 1}})).unwrap_err();
        assert_eq!(e.param(), Some("stream_options.x"));
        let e = read(json!({"n": "3"})).unwrap_err();
        assert_eq!((e.param(), e.code()), (Some("n"), Some("invalid_type")));
        let e = read(json!({"logit_bias": [1]})).unwrap_err();
        assert_eq!(e.param(), Some("logit_bias"));
        let e = read(json!({"logit_bias": {"5": "up"}})).unwrap_err();
        assert_eq!(e.param(), Some("logit_bias.5"));
        let s = read(json!({"logit_bias": {"5": 2, "x": -1.5}, "n": 2})).unwrap();
        assert_eq!(s.n, Some(2));
        assert_eq!(
            s.logit_bias,
            [("5".to_owned(), 2.0), ("x".to_owned(), -1.5)]
        );
    }

    #[test]
    fn ids_are_prefixed_and_random() {
        let (a, b) = (new_id("cmpl-"), new_id("cmpl-"));
        assert!(a.starts_with("cmpl-") && a.len() == 29);
        assert_ne!(a, b);
    }
}
