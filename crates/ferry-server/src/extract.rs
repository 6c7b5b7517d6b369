//! [`JsonObject`]: the request-body extractor. It replaces axum's `Json` so that every body
//! failure gets our error shape: a missing or non-JSON `Content-Type` is 415, a body over the
//! limit 413 (at once when its declared `Content-Length` is over it), a body not received
//! within `body_read_timeout` 408, malformed JSON or a non-object body 400 (`invalid_json`).
//!
//! It yields the raw JSON object; the wire types ([`super::openai`]) read it field by field so
//! that a wrong type or an unsupported field is reported with `param` naming it.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::header;
use serde_json::{Map, Value};

use super::error::ApiError;
use super::AppState;

/// A request body that was a JSON object.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonObject(pub Map<String, Value>);

/// Whether a `Content-Type` value names JSON (`application/json` or `application/*+json`,
/// parameters such as `charset` allowed).
pub fn is_json_content_type(value: &str) -> bool {
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

impl FromRequest<AppState> for JsonObject {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let content_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        if !content_type.is_some_and(is_json_content_type) {
            return Err(ApiError::unsupported_media_type());
        }
        let (limit, timeout) = (state.options.body_limit, state.options.body_read_timeout);
        // A declared length over the limit is refused before a byte of the body is waited for.
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|length| length > limit as u64) {
            return Err(ApiError::payload_too_large(limit));
        }
        let read = tokio::time::timeout(timeout, Bytes::from_request(req, state));
        let bytes = read
            .await
            .map_err(|_| ApiError::body_read_timeout(timeout))?
            .map_err(|rejection| {
                if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                    ApiError::payload_too_large(limit)
                } else {
                    ApiError::invalid_json(format!("Could not read the request body: {rejection}"))
                }
            })?;
        parse_object(&bytes).map(JsonObject)
    }
}

/// Parses a body that must be a JSON object.
pub fn parse_object(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(ApiError::invalid_json(format!(
            "The request body must be a JSON object, but it is {}.",
            super::error::json_type_name(&other)
        ))),
        Err(e) => Err(ApiError::invalid_json(format!(
            "We could not parse the JSON body of your request ({e})."
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types() {
        assert!(is_json_content_type("application/json"));
        assert!(is_json_content_type("Application/JSON; charset=utf-8"));
        assert!(is_json_content_type("application/merge-patch+json"));
        assert!(!is_json_content_type("text/plain"));
        assert!(!is_json_content_type("application/x-www-form-urlencoded"));
    }

    #[test]
    fn bodies() {
        assert!(parse_object(br#"{"a":1}"#).is_ok());
        assert_eq!(
            parse_object(b"[1]").unwrap_err().code(),
            Some("invalid_json")
        );
        assert_eq!(parse_object(b"{").unwrap_err().status().as_u16(), 400);
    }
}
