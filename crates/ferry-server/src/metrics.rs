//! The HTTP side of the metrics: `GET /metrics` (the whole registry in the Prometheus text
//! format) and the middleware that counts every generation request by model and HTTP status
//! (`ferry_requests_total`). Tokens, queue depth and latencies are counted by the engine.
//!
//! The model label is the served model id a request named (an alias counts as its target), or
//! `unknown` when it named none that is served, so clients cannot create label values at will.
//! The handlers know the model; they attach it to their response as a [`ModelLabel`]
//! extension, which the middleware reads after the handler ran.

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

use super::AppState;
use ferry_metrics::CONTENT_TYPE;

/// The label for requests that named no served model.
pub const UNKNOWN_MODEL: &str = "unknown";

/// The served model a generation request was for, carried as a response extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelLabel(pub String);

impl ModelLabel {
    /// The served model id named by a request body's `model` field (aliases resolved), or
    /// [`UNKNOWN_MODEL`].
    pub fn of(state: &AppState, body: &Map<String, Value>) -> Self {
        let label = body
            .get("model")
            .and_then(Value::as_str)
            .map(|name| {
                state
                    .options
                    .served_name_aliases
                    .get(name)
                    .map_or(name, String::as_str)
            })
            .filter(|id| state.backend.models().iter().any(|c| c.id == *id))
            .unwrap_or(UNKNOWN_MODEL);
        Self(label.to_owned())
    }

    /// `response` with this label attached.
    pub fn attach(self, response: impl IntoResponse) -> Response {
        let mut response = response.into_response();
        response.extensions_mut().insert(self);
        response
    }
}

/// `GET /metrics`.
pub async fn render(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        state.metrics.render(),
    )
        .into_response()
}

/// Counts each request that passes through in `ferry_requests_total{model,status}` once its
/// response (or, when streaming, its response head) is ready.
pub async fn count_requests(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let response = next.run(request).await;
    let model = response
        .extensions()
        .get::<ModelLabel>()
        .map_or(UNKNOWN_MODEL, |l| l.0.as_str());
    state
        .metrics
        .record_request(model, response.status().as_u16());
    response
}
