//! Cross-origin requests from browsers (`server.cors_origins`), off by default.
//!
//! With origins configured, tower-http's [`CorsLayer`] sits outside the `Host` and API key
//! checks: it answers preflights (`OPTIONS` with `Access-Control-Request-Method`) itself, since
//! browsers send them without credentials, and adds `Access-Control-Allow-Origin` to every
//! response for an allowed origin, errors included, so a browser client can read our error
//! bodies. Requests themselves still pass the `Host` and key checks. `*` allows any origin;
//! otherwise only the listed ones (exact `scheme://host[:port]`) are echoed back.

use axum::http::{header, HeaderValue, Method};
use tower_http::cors::{AllowOrigin, Any, CorsLayer};

use super::request_id::X_REQUEST_ID;

/// How long browsers may cache a preflight answer.
const PREFLIGHT_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// The layer for `origins`, or `None` when CORS is off (no origins). Origins that are not
/// valid header values are skipped with a warning.
pub fn layer(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let values: Vec<HeaderValue> = origins
            .iter()
            .filter_map(|o| match HeaderValue::from_str(o.trim_end_matches('/')) {
                Ok(value) => Some(value),
                Err(_) => {
                    tracing::warn!(origin = %o, "ignoring a CORS origin that is not a header value");
                    None
                }
            })
            .collect();
        AllowOrigin::list(values)
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
            .allow_headers(Any)
            .expose_headers([X_REQUEST_ID.clone(), header::RETRY_AFTER])
            .max_age(PREFLIGHT_MAX_AGE),
    )
}
