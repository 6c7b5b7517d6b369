//! The checks every request passes before routing (so an unknown path without a key is 401,
//! not 404): the `Host` allow-list, then the API key.
//!
//! - `Host`: when [`ServerOptions::allowed_hosts`] names hosts, a request whose `Host` (port
//!   dropped, case ignored) is not one of them is 403 `host_not_allowed`. A request without
//!   `Host` passes (browsers, which DNS rebinding needs, always send one).
//! - Key: when [`ServerOptions::api_keys`] names any, `Authorization: Bearer <key>` (scheme in
//!   any case) is required, compared in constant time (`subtle`) with every key, else 401
//!   `invalid_api_key`. With several keys the request carries its key's [`Caller`] (an
//!   extension), so the handlers keep each key's prompts in a prefix-cache partition of its own:
//!   one client cannot time another's cache hits.
//!
//! `/health` is exempt from both (orchestrators probe it by address); `/metrics` is exempt from
//! the key unless [`ServerOptions::metrics_auth`].

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::error::ApiError;
use super::{AppState, ServerOptions};

/// The middleware (installed on the whole router, fallbacks included).
pub async fn guard(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    match check(&state.options, &request) {
        Ok(caller) => {
            if let Some(caller) = caller {
                request.extensions_mut().insert(caller);
            }
            next.run(request).await
        }
        Err(err) => err.into_response(),
    }
}

/// Which of several configured keys a request presented (its index among
/// [`ServerOptions::api_keys`]); absent with one key or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller(pub usize);

fn check(options: &ServerOptions, request: &Request) -> Result<Option<Caller>, ApiError> {
    let path = request.uri().path();
    if path == "/health" {
        return Ok(None);
    }
    if !options.allowed_hosts.is_empty() {
        if let Some(host) = request_host(request) {
            if !options
                .allowed_hosts
                .iter()
                .any(|allowed| host_matches(allowed, &host))
            {
                return Err(ApiError::host_not_allowed(&host));
            }
        }
    }
    if options.api_keys.is_empty() || (path == "/metrics" && !options.metrics_auth) {
        return Ok(None);
    }
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .ok_or_else(ApiError::unauthorized)?;
    // Every key is compared, so the time taken does not tell which one (or none) matched.
    let mut matched = None;
    for (index, key) in options.api_keys.iter().enumerate() {
        if bool::from(presented.as_bytes().ct_eq(key.as_bytes())) {
            matched = Some(index);
        }
    }
    match matched {
        Some(index) if options.api_keys.len() > 1 => Ok(Some(Caller(index))),
        Some(_) => Ok(None),
        None => Err(ApiError::unauthorized()),
    }
}

/// The token of an `Authorization: Bearer <token>` value (scheme in any case).
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(char::is_whitespace)?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The request's host name, lower-cased, without port or trailing dot: from `Host`, else from
/// an absolute request URI.
fn request_host(request: &Request) -> Option<String> {
    let raw = match request.headers().get(header::HOST) {
        Some(value) => value.to_str().unwrap_or("\u{fffd}").to_owned(),
        None => request.uri().authority()?.as_str().to_owned(),
    };
    Some(host_name(&raw))
}

/// `host[:port]`, `[v6][:port]` -> the bare host, lower-cased, trailing dot dropped.
fn host_name(authority: &str) -> String {
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if let Some(rest) = authority.strip_prefix('[') {
        rest.split_once(']').map_or(rest, |(v6, _)| v6)
    } else if authority.matches(':').count() == 1 {
        authority.split_once(':').map_or(authority, |(h, _)| h)
    } else {
        authority
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

fn host_matches(allowed: &str, host: &str) -> bool {
    allowed == "*" || host_name(allowed) == host
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_scheme_in_any_case() {
        assert_eq!(bearer_token("Bearer k1"), Some("k1"));
        assert_eq!(bearer_token("bearer k1"), Some("k1"));
        assert_eq!(bearer_token("BEARER   k1 "), Some("k1"));
        assert_eq!(bearer_token("Basic k1"), None);
        assert_eq!(bearer_token("Bearer"), None);
        assert_eq!(bearer_token("Bearer "), None);
    }

    #[test]
    fn host_names() {
        assert_eq!(host_name("LocalHost:8080"), "localhost");
        assert_eq!(host_name("[::1]:8080"), "::1");
        assert_eq!(host_name("::1"), "::1");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
        assert_eq!(host_name("localhost."), "localhost");
        assert!(host_matches("localhost", "localhost"));
        assert!(host_matches("*", "evil.example"));
        assert!(!host_matches("localhost", "localhost.evil.example"));
    }
}
