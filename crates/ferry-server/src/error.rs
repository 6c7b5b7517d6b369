//! [`ApiError`]: every failure the HTTP layer reports, and the one place where an error becomes an
//! HTTP response (`IntoResponse`) or an SSE error event ([`ApiError::body`]).
//!
//! The body always has OpenAI's shape `{"error":{"message","type","param","code"}}`. `type` is
//! `invalid_request_error` for 4xx statuses (`authentication_error` for 401) and `server_error`
//! for 5xx. Codes used here:
//!
//! | status | code | when |
//! |---|---|---|
//! | 400 | `invalid_json` | the body is not JSON, or not a JSON object |
//! | 400 | `missing_required_parameter` | a required field is absent or null |
//! | 400 | `invalid_type` | a field has the wrong JSON type |
//! | 400 | `invalid_value` | a field is out of range or otherwise wrong |
//! | 400 | `unsupported_parameter` | a known OpenAI field this server does not implement |
//! | 400 | `unsupported_value` | a known field with a value we do not implement (`echo: true`) |
//! | 400 | `unknown_parameter` | a field OpenAI does not define either |
//! | 400 | `context_length_exceeded` | prompt + max_tokens (or an embedding input) beyond the model's context |
//! | 401 | `invalid_api_key` | missing or wrong bearer token |
//! | 403 | `host_not_allowed` | the `Host` header is not in `server.allowed_hosts` |
//! | 404 | `model_not_found` / `not_found` | unknown model / unknown route |
//! | 404 | `previous_response_not_found` / `response_not_found` | a Responses id not (or no longer) stored |
//! | 405 | `method_not_allowed` | the route exists, the method does not |
//! | 408 | `request_timeout` | the body took longer than `server.body_read_timeout` |
//! | 413 | `request_too_large` | the body is over `server.body_limit` |
//! | 415 | `unsupported_media_type` | `Content-Type` missing or not JSON |
//! | 500 | `internal_error` | a failure inside the engine or the server |
//! | 503 | `model_not_ready` / `model_failed` / `overloaded` / `engine_unavailable` / `out_of_memory` | retry later |
//! | 503 | `too_many_connections` | every connection under `server.max_connections` is busy |
//! | 503 | `shutting_down` | the server stopped before the request finished |

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use ferry_engine::EngineError;

/// Seconds a client is told to wait (`Retry-After`) when the server is overloaded.
pub const OVERLOADED_RETRY_AFTER_SECS: u64 = 1;

/// An error on its way to the client, with its HTTP status and OpenAI error fields.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    param: Option<String>,
    code: Option<String>,
    retry_after_secs: Option<u64>,
}

/// The `{"error": {...}}` wrapper.
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    /// The error details.
    pub error: ErrorDetail<'a>,
}

/// OpenAI's error object.
#[derive(Debug, Serialize)]
pub struct ErrorDetail<'a> {
    /// Human readable explanation.
    pub message: &'a str,
    /// `invalid_request_error`, `authentication_error` or `server_error`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The request field at fault, if any.
    pub param: Option<&'a str>,
    /// A machine readable code (see the module table).
    pub code: Option<&'a str>,
}

impl ApiError {
    /// A general constructor; prefer the named ones below.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            code: Some(code.to_owned()),
            retry_after_secs: None,
        }
    }

    /// Sets the request field at fault.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    fn bad_request(code: &str, param: &str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message).with_param(param)
    }

    /// 400 `invalid_value`: a field is out of range or otherwise unacceptable.
    pub fn invalid_value(param: &str, message: impl Into<String>) -> Self {
        Self::bad_request("invalid_value", param, message)
    }

    /// 400 `invalid_type`: a field has the wrong JSON type.
    pub fn invalid_type(param: &str, expected: &str, got: &serde_json::Value) -> Self {
        let message = format!(
            "Invalid type for `{param}`: expected {expected}, but got {}.",
            json_type_name(got)
        );
        Self::bad_request("invalid_type", param, message)
    }

    /// 400 `missing_required_parameter`.
    pub fn missing(param: &str) -> Self {
        let message = format!("Missing required parameter: `{param}`.");
        Self::bad_request("missing_required_parameter", param, message)
    }

    /// 400 `unsupported_parameter`: a field OpenAI defines that this server does not implement.
    pub fn unsupported_parameter(param: &str) -> Self {
        let message = format!("The parameter `{param}` is not supported by this server.");
        Self::bad_request("unsupported_parameter", param, message)
    }

    /// 400 `unknown_parameter`: a field nobody defines.
    pub fn unknown_parameter(param: &str) -> Self {
        let message = format!("Unrecognized request argument supplied: `{param}` (not supported).");
        Self::bad_request("unknown_parameter", param, message)
    }

    /// 400 `unsupported_value`: a known field whose value this server does not implement.
    pub fn unsupported_value(param: &str, message: impl Into<String>) -> Self {
        Self::bad_request("unsupported_value", param, message)
    }

    /// 400 `invalid_json`: the body is not a JSON object.
    pub fn invalid_json(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_json", message)
    }

    /// 413: the body is over the configured limit.
    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!(
                "The request body is larger than this server's limit of {limit} bytes \
                 (`server.body_limit`)."
            ),
        )
    }

    /// 408: the client took too long to send the body.
    pub fn body_read_timeout(timeout: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!(
                "The request body was not received within {timeout:?} \
                 (`server.body_read_timeout`)."
            ),
        )
    }

    /// 403: the `Host` header names a host this server does not answer to.
    pub fn host_not_allowed(host: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "host_not_allowed",
            format!(
                "This server does not answer to the host `{host}`; add it to \
                 `server.allowed_hosts` (a server without an API key on a loopback address \
                 answers to localhost only)."
            ),
        )
    }

    /// 503 sent on a new connection when every connection is busy.
    pub fn too_many_connections() -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_connections",
            "Every connection this server accepts (`server.max_connections`) has a request in \
             flight; retry later.",
        );
        e.retry_after_secs = Some(OVERLOADED_RETRY_AFTER_SECS);
        e
    }

    /// 503 for a request the server ended because it is shutting down.
    pub fn shutting_down() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "The server is shutting down and its grace period for requests in flight \
             (`server.shutdown_timeout`) is over; retry on another replica or later.",
        )
    }

    /// 400 `context_length_exceeded` with OpenAI's wording; `param` (`prompt` or `messages`)
    /// says what the prompt was.
    pub fn context_length_exceeded(
        max_context: usize,
        prompt_tokens: usize,
        max_tokens: usize,
        param: &str,
    ) -> Self {
        let what = if param == "messages" {
            "the messages"
        } else {
            "the prompt"
        };
        let requested = prompt_tokens.saturating_add(max_tokens);
        Self::bad_request(
            "context_length_exceeded",
            param,
            format!(
                "This model's maximum context length is {max_context} tokens. However, you \
                 requested {requested} tokens ({prompt_tokens} in {what}, {max_tokens} in the \
                 completion). Please reduce the length of {what} or completion."
            ),
        )
    }

    /// 400 `context_length_exceeded` for embedding input `index`, `tokens` long.
    pub fn input_too_long(index: usize, tokens: usize, max_context: usize) -> Self {
        Self::bad_request(
            "context_length_exceeded",
            "input",
            format!(
                "This model's maximum context length is {max_context} tokens. However, input \
                 {index} is {tokens} tokens long. Please reduce the length of the input."
            ),
        )
    }

    /// 400 `context_length_exceeded` for a prompt rejected by its length in characters before
    /// tokenising.
    pub fn prompt_too_long_to_tokenize(
        chars: usize,
        max_context: usize,
        chars_per_token: usize,
        param: &str,
    ) -> Self {
        let what = if param == "messages" {
            "The messages are"
        } else {
            "The prompt is"
        };
        Self::bad_request(
            "context_length_exceeded",
            param,
            format!(
                "{what} {chars} characters long, which cannot fit this model's maximum context \
                 length of {max_context} tokens (a token stands for at most {chars_per_token} \
                 characters). Please reduce its length."
            ),
        )
    }

    /// 415: `Content-Type` missing or not JSON.
    pub fn unsupported_media_type() -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "Expected a request with `Content-Type: application/json`.",
        )
    }

    /// 404 for a path no route serves.
    pub fn route_not_found(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("Invalid URL ({method} {path})."),
        )
    }

    /// 405 for a known path with the wrong method.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("Method {method} is not allowed for {path}."),
        )
    }

    /// 401: missing or wrong API key.
    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            "Missing or incorrect API key; send `Authorization: Bearer <key>`.",
        )
    }

    /// 503 for a model that failed to load.
    pub fn model_failed(model: &str) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "model_failed",
            format!("The model `{model}` failed to load; see the server log."),
        )
    }

    /// 503 for a model whose engine stopped after loading.
    pub fn engine_stopped(model: &str) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "engine_unavailable",
            format!(
                "The engine of model `{model}` stopped; see the server log. Restart the server."
            ),
        )
    }

    /// 500 for a failure inside the server itself.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", message)
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The human readable message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The field at fault, if any.
    pub fn param(&self) -> Option<&str> {
        self.param.as_deref()
    }

    /// The machine readable code, if any.
    pub fn code(&self) -> Option<&str> {
        self.code.as_deref()
    }

    /// OpenAI's error `type` for this status.
    pub fn kind(&self) -> &'static str {
        if self.status == StatusCode::UNAUTHORIZED {
            "authentication_error"
        } else if self.status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        }
    }

    /// The JSON body, also used for the SSE error event of a failed stream.
    pub fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            error: ErrorDetail {
                message: &self.message,
                kind: self.kind(),
                param: self.param.as_deref(),
                code: self.code.as_deref(),
            },
        }
    }

    /// The body serialised (infallible for this shape; falls back to a fixed string).
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.body()).unwrap_or_else(|_| {
            r#"{"error":{"message":"internal error","type":"server_error","param":null,"code":"internal_error"}}"#
                .to_owned()
        })
    }
}

impl From<EngineError> for ApiError {
    fn from(err: EngineError) -> Self {
        let message = err.to_string();
        match err {
            EngineError::ModelNotFound(_) => {
                Self::new(StatusCode::NOT_FOUND, "model_not_found", message).with_param("model")
            }
            EngineError::NotReady(_) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "model_not_ready", message)
            }
            EngineError::Overloaded(_) => {
                let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded", message);
                e.retry_after_secs = Some(OVERLOADED_RETRY_AFTER_SECS);
                e
            }
            EngineError::InvalidRequest { param, .. } => Self {
                param,
                ..Self::new(StatusCode::BAD_REQUEST, "invalid_value", message)
            },
            EngineError::ContextLengthExceeded { .. } => {
                Self::new(StatusCode::BAD_REQUEST, "context_length_exceeded", message)
            }
            EngineError::Unavailable => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "engine_unavailable",
                message,
            ),
            EngineError::OutOfMemory(_) => {
                let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, "out_of_memory", message);
                e.retry_after_secs = Some(OVERLOADED_RETRY_AFTER_SECS);
                e
            }
            EngineError::LoadFailed(_) => Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "model_load_failed",
                message,
            ),
            EngineError::Internal(_) => Self::internal(message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            self.to_json(),
        )
            .into_response();
        if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// A JSON type's name for error messages.
pub fn json_type_name(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_map_to_statuses() {
        let cases = [
            (
                EngineError::ModelNotFound("m".into()),
                404,
                "model_not_found",
            ),
            (EngineError::NotReady("m".into()), 503, "model_not_ready"),
            (EngineError::Overloaded("q".into()), 503, "overloaded"),
            (EngineError::Unavailable, 503, "engine_unavailable"),
            (
                EngineError::OutOfMemory("CUDA".into()),
                503,
                "out_of_memory",
            ),
            (
                EngineError::LoadFailed("x".into()),
                503,
                "model_load_failed",
            ),
            (EngineError::Internal("x".into()), 500, "internal_error"),
        ];
        for (err, status, code) in cases {
            let api = ApiError::from(err);
            assert_eq!(api.status().as_u16(), status);
            assert_eq!(api.code(), Some(code));
        }
        let overloaded = ApiError::from(EngineError::Overloaded("q".into())).into_response();
        assert_eq!(overloaded.headers()[header::RETRY_AFTER], "1");
    }

    #[test]
    fn body_has_openai_shape() {
        let err = ApiError::invalid_value("temperature", "too hot");
        let v: serde_json::Value = serde_json::from_str(&err.to_json()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"error": {"message": "too hot", "type": "invalid_request_error",
                "param": "temperature", "code": "invalid_value"}})
        );
        assert_eq!(ApiError::internal("x").kind(), "server_error");
    }
}
