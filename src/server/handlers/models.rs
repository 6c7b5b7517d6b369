//! `GET /v1/models`: every configured model (loaded or not) and every alias.

use axum::extract::State;
use axum::Json;

use crate::server::openai::tokenize::{ModelList, ModelObject};
use crate::server::AppState;

/// The handler.
pub async fn list_models(State(state): State<AppState>) -> Json<ModelList> {
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
    Json(ModelList {
        object: "list",
        data,
    })
}

fn data_for(card: &crate::engine::ModelCard) -> ModelObject {
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
