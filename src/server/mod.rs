//! The HTTP layer (axum): OpenAI-compatible endpoints over an [`crate::engine::Backend`].
//!
//! It holds an `Arc<dyn Backend>` and nothing else from the engine, so it is testable with a
//! test double. Routes:
//!
//! | route | handler |
//! |---|---|
//! | `POST /v1/completions` | [`handlers::completions`] |
//! | `POST /v1/chat/completions` | [`handlers::chat`] |
//! | `GET /v1/models` | [`handlers::models`] |
//! | `POST /tokenize`, `POST /detokenize` | [`handlers::tokenize`] (vLLM's extensions) |
//! | `GET /health` | [`handlers::health`] (never behind the API key) |
//! | `GET /metrics` | [`metrics::render`] (Prometheus text; never behind the API key) |
//!
//! A request flows: [`extract::JsonObject`] (content type, size, JSON syntax) -> the wire type in
//! [`openai`] (field types, unsupported fields) -> [`validate`] (ranges, model, tokenisation,
//! context) -> `Backend::submit` -> a JSON response or an SSE stream ([`sse`]). Every failure is
//! an [`error::ApiError`], which alone decides the HTTP status and body.

pub mod error;
pub mod extract;
pub mod handlers;
pub mod metrics;
pub mod openai;
pub mod sse;
pub mod validate;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tower_http::trace::{DefaultOnFailure, DefaultOnResponse, TraceLayer};

use crate::engine::Backend;
use crate::metrics::Metrics;
use error::ApiError;

/// Default [`ServerOptions::body_limit`]: 16 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 16 * 1024 * 1024;

/// Default [`ServerOptions::sse_keep_alive`]: 15 seconds.
pub const DEFAULT_SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// How the HTTP layer behaves. Build with `ServerOptions::default()` and the `with_*` setters.
/// Its `Debug` output hides the API key.
#[derive(Clone, PartialEq)]
pub struct ServerOptions {
    /// Largest request body in bytes; larger bodies get 413. Default [`DEFAULT_BODY_LIMIT`].
    pub body_limit: usize,
    /// Extra names clients may send as `model`, each mapped to a served model id. They are
    /// listed by `GET /v1/models` (with `root` naming the target). Default: none.
    pub served_name_aliases: BTreeMap<String, String>,
    /// When set, every route except `/health` requires `Authorization: Bearer <key>`
    /// (401 otherwise). Default: none (no authentication).
    pub api_key: Option<String>,
    /// How often an idle SSE stream sends a keep-alive comment. Default
    /// [`DEFAULT_SSE_KEEP_ALIVE`].
    pub sse_keep_alive: Duration,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            body_limit: DEFAULT_BODY_LIMIT,
            served_name_aliases: BTreeMap::new(),
            api_key: None,
            sse_keep_alive: DEFAULT_SSE_KEEP_ALIVE,
        }
    }
}

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerOptions")
            .field("body_limit", &self.body_limit)
            .field("served_name_aliases", &self.served_name_aliases)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("sse_keep_alive", &self.sse_keep_alive)
            .finish()
    }
}

impl ServerOptions {
    /// Sets [`ServerOptions::body_limit`] (default 16 MiB).
    pub fn with_body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// Adds an alias: clients may send `alias` as `model` to reach `model_id` (default none).
    pub fn with_alias(mut self, alias: impl Into<String>, model_id: impl Into<String>) -> Self {
        self.served_name_aliases
            .insert(alias.into(), model_id.into());
        self
    }

    /// Sets [`ServerOptions::api_key`] (default none).
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Sets [`ServerOptions::sse_keep_alive`] (default 15 s).
    pub fn with_sse_keep_alive(mut self, interval: Duration) -> Self {
        self.sse_keep_alive = interval;
        self
    }
}

/// What every handler can reach. Every field is read-only and shared (`Arc`, or a handle over
/// atomics for the metrics), so no lock.
#[derive(Clone)]
pub struct AppState {
    /// The engine, behind its trait.
    pub backend: Arc<dyn Backend>,
    /// The options the router was built with.
    pub options: Arc<ServerOptions>,
    /// The backend's metrics registry (request counts are added here).
    pub metrics: Metrics,
}

/// The router with every endpoint, the body limit, the API key check, tracing and the
/// 404/405 fallbacks in our error shape.
pub fn app(backend: Arc<dyn Backend>, options: ServerOptions) -> Router {
    let body_limit = options.body_limit;
    let state = AppState {
        metrics: backend.metrics(),
        backend,
        options: Arc::new(options),
    };
    let generation = Router::new()
        .route("/v1/completions", post(handlers::completions::completions))
        .route(
            "/v1/chat/completions",
            post(handlers::chat::chat_completions),
        )
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            metrics::count_requests,
        ));
    let api = Router::new()
        .merge(generation)
        .route("/v1/models", get(handlers::models::list_models))
        .route("/tokenize", post(handlers::tokenize::tokenize))
        .route("/detokenize", post(handlers::tokenize::detokenize))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    Router::new()
        .route("/health", get(handlers::health::health))
        .route("/metrics", get(metrics::render))
        .merge(api)
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(DefaultBodyLimit::max(body_limit))
        // Per-request lines at DEBUG: a 503 while loading or overloaded is an answer, not a fault.
        .layer(
            TraceLayer::new_for_http()
                .on_response(DefaultOnResponse::new().level(tracing::Level::DEBUG))
                .on_failure(DefaultOnFailure::new().level(tracing::Level::DEBUG)),
        )
        .with_state(state)
}

/// Serves `router` on `listener` until `shutdown` completes, then lets in-flight requests finish.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Rejects requests without the configured bearer token (a no-op when none is configured).
async fn require_api_key(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let Some(key) = state.options.api_key.as_deref() else {
        return next.run(request).await;
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    if presented == Some(key) {
        next.run(request).await
    } else {
        ApiError::unauthorized().into_response()
    }
}
