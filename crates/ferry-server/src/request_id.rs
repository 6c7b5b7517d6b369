//! `x-request-id`: every request gets an id, the one the client sent when it is usable (1 to
//! 128 visible ASCII characters, what proxies and gateways send), else a fresh random one
//! (32 hex digits). The id is returned on the response, travels to the engine as the
//! request's [`RequestContext`] (so the engine's "request finished" line names it), and a
//! generation request refused before it reached the engine (400, 401, 413, 503, ...) gets a
//! "request rejected" line of its own here, so every generation request leaves one line.

use axum::extract::Request;
use axum::http::{HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

use super::metrics::{ModelLabel, UNKNOWN_MODEL};
use ferry_metrics::RequestContext;

/// The header's name.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client-sent id that is kept.
const MAX_ID_LEN: usize = 128;

/// The client's id when usable, else a new one.
fn request_id(request: &Request) -> String {
    request
        .headers()
        .get(&X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|id| {
            (1..=MAX_ID_LEN).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
        })
        .map_or_else(|| format!("{:032x}", rand::random::<u128>()), str::to_owned)
}

/// Routes whose requests run a generation.
fn is_generation(path: &str) -> bool {
    matches!(path, "/v1/completions" | "/v1/chat/completions")
}

/// The middleware (outermost layer of [`super::app`]).
pub async fn assign(request: Request, next: Next) -> Response {
    let id = request_id(&request);
    let generation = is_generation(request.uri().path());
    let context = RequestContext::new(id.as_str());
    let mut response = context.clone().scope(next.run(request)).await;
    let status = response.status();
    if generation && status.as_u16() >= 400 && !context.reached_engine() {
        let model = response
            .extensions()
            .get::<ModelLabel>()
            .map_or(UNKNOWN_MODEL, |l| l.0.as_str());
        tracing::info!(
            request_id = %id,
            model = %model,
            status = status.as_u16(),
            "request rejected"
        );
    }
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(X_REQUEST_ID.clone(), value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn with_header(value: Option<&str>) -> Request {
        let mut builder = Request::builder().uri("/v1/models");
        if let Some(v) = value {
            builder = builder.header("x-request-id", v);
        }
        builder.body(Body::empty()).expect("request")
    }

    #[test]
    fn keeps_usable_ids_and_replaces_the_rest() {
        assert_eq!(request_id(&with_header(Some("abc-123_X"))), "abc-123_X");
        let long = "a".repeat(MAX_ID_LEN);
        assert_eq!(request_id(&with_header(Some(&long))), long);
        for bad in [
            None,
            Some(""),
            Some("has space"),
            Some(&*"b".repeat(MAX_ID_LEN + 1)),
        ] {
            let id = request_id(&with_header(bad));
            assert_eq!(id.len(), 32, "{bad:?} -> {id}");
            assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
        }
        assert_ne!(
            request_id(&with_header(None)),
            request_id(&with_header(None))
        );
    }
}
