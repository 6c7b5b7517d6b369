//! # ferry-server
//!
//! Layer 2 of ferry (docs/ARCHITECTURE.md, "Crates"): the OpenAI-compatible HTTP server. It
//! depends on `ferry-engine` (its [`ferry_engine::Backend`] trait and plain request/event types),
//! `ferry-metrics`, and `ferry-config` for the sampling ranges a request shares with the
//! settings, and may know nothing of models, weights, devices or the offload engine:
//! it is tested against a small deterministic backend, no model needed.
//!
//! A reuser builds the router with [`app`] over any `Arc<dyn Backend>` and [`ServerOptions`],
//! or serves it on a listener with [`run`] until a [`ShutdownSignal`] stops it.
//!
//! The HTTP layer (axum): OpenAI-compatible endpoints over an [`ferry_engine::Backend`].
//!
//! It holds an `Arc<dyn Backend>` and nothing else from the engine, so it is testable with a
//! test double. Routes:
//!
//! | route | handler |
//! |---|---|
//! | `POST /v1/completions` | [`handlers::completions`] |
//! | `POST /v1/chat/completions` | [`handlers::chat`] |
//! | `POST /v1/embeddings` | [`handlers::embeddings`] |
//! | `POST /v1/responses`, `GET`/`DELETE /v1/responses/{id}` | [`handlers::responses`] (OpenAI's Responses API over the chat path; stored ones in [`response_store`]) |
//! | `GET /v1/models`, `GET /v1/models/{id}` | [`handlers::models`] |
//! | `POST /tokenize`, `POST /detokenize` | [`handlers::tokenize`] (vLLM's extensions) |
//! | `GET /health` | [`handlers::health`] (never behind the API key or the `Host` check) |
//! | `GET /metrics` | [`metrics::render`] (Prometheus text; behind the key only with `metrics_auth`) |
//! | `GET /v1/ferry/status` | [`status::status`] (placement per model and live numbers, JSON) |
//! | `GET /`, `GET /page/style.css`, `GET /page/app.js` | [`page::serve`] (the status and chat page; 404 with `web_ui` off) |
//!
//! Every response carries an `x-request-id` ([`request_id`]: the client's, or a new one). With
//! `server.cors_origins` set, [`cors`] answers browsers' preflights and marks responses for
//! the allowed origins.
//!
//! A request flows: [`listen`] (connection limits and timeouts) -> [`auth`] (`Host` allow-list,
//! API key, before routing) -> [`extract::JsonObject`] (content type, size, JSON syntax, body
//! read timeout) -> the wire type in [`openai`] (field types, unsupported fields) ->
//! [`validate`] (ranges, model, the [`admission`] checks, tokenisation, context) ->
//! `Backend::submit` -> a JSON response or an SSE stream ([`sse`]). Every failure is an
//! [`error::ApiError`], which alone decides the HTTP status and body.
//!
//! [`run`] serves on a TCP listener until a [`shutdown::ShutdownSignal`] stops it (see
//! [`listen`] for the stop sequence). The server imports the engine's `Backend` trait and
//! nothing that loads models; the `ferry` package's `runtime::serve` builds the engine from a
//! configuration and hands it to [`run`].

pub mod admission;
mod auth;
mod connections;
mod cors;
mod error;
mod extract;
mod handlers;
pub mod limits;
mod listen;
mod metrics;
mod openai;
pub mod options;
mod page;
mod request_id;
pub mod response_store;
mod shutdown;
mod sse;
pub mod status;
mod validate;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;
use tower_http::trace::{DefaultOnFailure, DefaultOnResponse, TraceLayer};

use ferry_engine::Backend;
use ferry_metrics::Metrics;
pub use listen::ServeReport;
pub use options::{ServerOptions, DEFAULT_BODY_LIMIT, DEFAULT_SSE_KEEP_ALIVE};
pub use shutdown::{shutdown_channel, Lifecycle, ShutdownSignal, ShutdownTrigger};

/// What every handler can reach. Every field is shared and safe to read from any task without a
/// lock: `Arc`s of read-only data, a handle over atomics for the metrics, a `watch` channel for
/// the lifecycle, a semaphore for the tokeniser slots.
#[derive(Clone)]
pub struct AppState {
    /// The engine, behind its trait.
    pub backend: Arc<dyn Backend>,
    /// The options the router was built with.
    pub options: Arc<ServerOptions>,
    /// The backend's metrics registry (request counts are added here).
    pub metrics: Metrics,
    /// Where the server is in its life (generations end at the shutdown deadline).
    pub lifecycle: Lifecycle,
    /// Admission before work: tokeniser slots.
    pub admission: admission::Admission,
    /// The Responses API's stored responses (bounded by `options.response_store`).
    pub responses: response_store::ResponseStore,
    /// The counters' rates between polls of `GET /v1/ferry/status`.
    pub rates: status::rates::RateMeter,
}

/// The router with every endpoint, the body limit, the `Host` and API key checks, tracing and
/// the 404/405 fallbacks in our error shape, for a server that is never stopped (tests with
/// `oneshot`); [`run`] builds its own.
pub fn app(backend: Arc<dyn Backend>, options: ServerOptions) -> Router {
    app_with_lifecycle(backend, options, Lifecycle::new())
}

/// [`app`] whose handlers watch `lifecycle`.
pub fn app_with_lifecycle(
    backend: Arc<dyn Backend>,
    options: ServerOptions,
    lifecycle: Lifecycle,
) -> Router {
    let body_limit = options.body_limit;
    let state = AppState {
        metrics: backend.metrics(),
        admission: admission::Admission::new(options.tokenize_concurrency),
        responses: response_store::ResponseStore::new(options.response_store),
        rates: status::rates::RateMeter::default(),
        backend,
        options: Arc::new(options),
        lifecycle,
    };
    let generation = Router::new()
        .route("/v1/completions", post(handlers::completions::completions))
        .route(
            "/v1/chat/completions",
            post(handlers::chat::chat_completions),
        )
        .route("/v1/embeddings", post(handlers::embeddings::embeddings))
        .route("/v1/responses", post(handlers::responses::create))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            metrics::count_requests,
        ));
    let guarded = Router::new()
        .route("/health", get(handlers::health::health))
        .route("/metrics", get(metrics::render))
        .route("/v1/ferry/status", get(status::status))
        .route("/", get(page::serve))
        .route("/page/style.css", get(page::serve))
        .route("/page/app.js", get(page::serve))
        .route("/v1/models", get(handlers::models::list_models))
        .route("/v1/models/{*id}", get(handlers::models::retrieve_model))
        .route(
            "/v1/responses/{id}",
            get(handlers::responses::retrieve).delete(handlers::responses::delete),
        )
        .route("/tokenize", post(handlers::tokenize::tokenize))
        .route("/detokenize", post(handlers::tokenize::detokenize))
        .merge(generation)
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            admission::release_after_large_bodies,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), auth::guard));
    // Preflights are answered before the `Host` and key checks (browsers send no key).
    let guarded = match cors::layer(&state.options.cors_origins) {
        Some(cors) => guarded.layer(cors),
        None => guarded,
    };
    guarded
        // Per-request lines at DEBUG: a 503 while loading or overloaded is an answer, not a fault.
        .layer(
            TraceLayer::new_for_http()
                .on_response(DefaultOnResponse::new().level(tracing::Level::DEBUG))
                .on_failure(DefaultOnFailure::new().level(tracing::Level::DEBUG)),
        )
        // Outermost: every response carries `x-request-id`, and the engine sees the id.
        .layer(middleware::from_fn(request_id::assign))
        .with_state(state)
}

/// Serves `backend` on `listener` with `options` until `shutdown` stops it: connection limits
/// and timeouts, then the stop sequence of [`listen`]. The report says whether requests were
/// cut short.
pub async fn run(
    backend: Arc<dyn Backend>,
    options: ServerOptions,
    listener: TcpListener,
    shutdown: ShutdownSignal,
) -> std::io::Result<ServeReport> {
    limits::raise_open_files_limit();
    let lifecycle = Lifecycle::new();
    let router = app_with_lifecycle(backend, options.clone(), lifecycle.clone());
    listen::serve_router(listener, router, &options, lifecycle, shutdown).await
}
