//! `GET /v1/models`: every configured model (loaded or not) and every alias;
//! `GET /v1/models/{id}`: one of them (404 `model_not_found` for an unknown id).

use axum::extract::{Path, State};
use axum::Json;

use crate::error::ApiError;
use crate::openai::tokenize::{ModelList, ModelObject};
use crate::AppState;
use ferry_engine::{EngineError, ModelCard};

/// The list handler.
pub async fn list_models(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: model_objects(&state),
    })
}

/// The handler of one model: the same object the list holds for `id` (a model or an alias).
pub async fn retrieve_model(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<ModelObject>, ApiError> {
    model_objects(&state)
        .into_iter()
        .find(|m| m.id == id)
        .map(Json)
        .ok_or_else(|| EngineError::ModelNotFound(id).into())
}

/// Every model, then every alias whose target is configured.
fn model_objects(state: &AppState) -> Vec<ModelObject> {
    let cards = state.backend.models();
    let mut data: Vec<ModelObject> = cards.iter().map(data_for).collect();
    for (alias, target) in &state.options.served_name_aliases {
        if let Some(card) = cards.iter().find(|c| &c.id == target) {
            data.push(ModelObject {
                id: alias.clone(),
                root: card.id.clone(),
                ..data_for(card)
            });
        }
    }
    data
}

fn data_for(card: &ModelCard) -> ModelObject {
    ModelObject {
        id: card.id.clone(),
        object: "model",
        created: card.created,
        owned_by: "ferry",
        root: card.id.clone(),
        max_model_len: card.max_context,
        status: card.status,
        location: card.residency.clone(),
    }
}
