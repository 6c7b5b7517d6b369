//! `GET /health`: 200 `{"status":"ok",...}` when every configured model is ready; otherwise 503
//! with an OpenAI-shaped error body: `model_not_ready` while one is loading, `model_failed` when
//! one failed to load, `engine_unavailable` when one's engine stopped after loading (a replica
//! that cannot serve its whole configuration is not healthy, so an orchestrator restarts it).

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::error::ApiError;
use crate::AppState;
use ferry_engine::ModelStatus;

/// The handler.
pub async fn health(State(state): State<AppState>) -> Response {
    let cards = state.backend.models();
    if let Some(loading) = cards.iter().find(|c| c.status == ModelStatus::Loading) {
        return not_ready(format!(
            "The model `{}` is still loading; retry when /health returns 200.",
            loading.id
        ));
    }
    if let Some(failed) = cards.iter().find(|c| c.status == ModelStatus::Failed) {
        return ApiError::model_failed(&failed.id).into_response();
    }
    if let Some(stopped) = cards.iter().find(|c| c.status == ModelStatus::Stopped) {
        return ApiError::engine_stopped(&stopped.id).into_response();
    }
    if cards.is_empty() {
        return not_ready("No model is configured.".to_owned());
    }
    let models: Vec<_> = cards
        .iter()
        .map(|c| json!({"id": c.id, "status": c.status}))
        .collect();
    (
        StatusCode::OK,
        Json(json!({"status": "ok", "models": models})),
    )
        .into_response()
}

fn not_ready(message: String) -> Response {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "model_not_ready", message).into_response()
}
