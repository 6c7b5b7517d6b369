//! `GET /v1/ferry/status`: where each served model lives and what the server is doing now, as
//! one JSON document (the page at `GET /` polls it; the README's "Status page" section
//! documents every field). The static part is each model's [`ModelPlacement`], which the
//! runtime sets at load ([`ferry_engine::Backend::placement`]); the live part is read from the
//! metrics registry, with per-second rates measured between polls ([`rates`]).
//!
//! A model in offload mode `model` whose weights are parked on the host has every layer shown
//! as `swapped_out`, whatever its plan says.

pub mod rates;

use std::time::Instant;

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};

use super::AppState;
use ferry_engine::placement::LayerLocation;
use ferry_engine::{ModelCard, ModelPlacement};
use ferry_metrics::{MemoryKind, Metrics, TIER_LABELS};
use rates::Counters;

/// The `object` field of the document.
pub const OBJECT: &str = "ferry.status";

/// The handler.
pub async fn status(State(state): State<AppState>) -> Json<Value> {
    Json(document(&state, Instant::now()))
}

/// The whole document at `now`.
pub fn document(state: &AppState, now: Instant) -> Value {
    let metrics = &state.metrics;
    let cards = state.backend.models();
    let rates = state.rates.sample(now, counters(metrics, &cards));
    let rate = |name: &str| rates.get(name).copied().unwrap_or(0.0);
    // Each model's placement, read once per poll.
    let placements: Vec<Option<ModelPlacement>> = cards
        .iter()
        .map(|card| state.backend.placement(&card.id))
        .collect();
    let measured_link = placements
        .iter()
        .filter_map(|p| p.as_ref()?.link_bytes_per_s)
        .fold(None, |best: Option<f64>, r| {
            Some(best.map_or(r, |b| b.max(r)))
        });
    let models: Vec<Value> = cards
        .iter()
        .zip(placements)
        .map(|(card, placement)| model(metrics, card, placement, &rate))
        .collect();
    let link_rate = rate("bytes_copied");
    json!({
        "object": OBJECT,
        "models": models,
        "live": {
            "tokens_per_s": {
                "prompt": rate("prompt_tokens"),
                "generation": rate("generated_tokens"),
            },
            "requests": {"running": metrics.running(), "waiting": metrics.waiting()},
            "link": {
                "bytes_per_s": link_rate,
                "measured_bytes_per_s": measured_link,
                "utilization": measured_link.filter(|m| *m > 0.0).map(|m| link_rate / m),
                "bytes_total": metrics.offload_bytes_copied(),
                // Seconds per second that compute waited for a copy (0: the copies kept up;
                // near 1: every step waited on the link).
                "stall_seconds_per_s": rate("stall_us") / 1e6,
                "stall_seconds_total": metrics.offload_wait_seconds(),
            },
            "tier_decisions": TIER_LABELS
                .iter()
                .map(|t| ((*t).to_owned(), json!(metrics.tier_decisions(t))))
                .collect::<serde_json::Map<_, _>>(),
            "experts": experts(metrics),
            "device_memory": device_memory(metrics),
        },
    })
}

/// The counters rates are measured for.
fn counters(metrics: &Metrics, cards: &[ModelCard]) -> Counters {
    let mut counters = Counters::new();
    counters.insert("prompt_tokens".into(), metrics.prompt_tokens());
    counters.insert("generated_tokens".into(), metrics.generated_tokens());
    counters.insert("bytes_copied".into(), metrics.offload_bytes_copied());
    // In microseconds, so the counter of seconds has a rate like the others.
    counters.insert(
        "stall_us".into(),
        (metrics.offload_wait_seconds() * 1e6) as u64,
    );
    for card in cards {
        let id = &card.id;
        counters.insert(
            format!("model:{id}:prompt"),
            metrics.model_prompt_tokens(id),
        );
        counters.insert(
            format!("model:{id}:generated"),
            metrics.model_generated_tokens(id),
        );
    }
    counters
}

/// Routed experts by where they came from, and the expert cache's hit rate (hits over every
/// routed expert that was not computed on the host; `null` before any).
fn experts(metrics: &Metrics) -> Value {
    let hit = metrics.offload_experts("hit");
    let miss = metrics.offload_experts("miss");
    let cached = hit + miss;
    json!({
        "hit": hit,
        "miss": miss,
        "host": metrics.offload_experts("host"),
        "prefetched": metrics.offload_experts("prefetched"),
        "prefetch_hit": metrics.offload_experts("prefetch_hit"),
        "hit_rate": (cached > 0).then(|| hit as f64 / cached as f64),
    })
}

fn device_memory(metrics: &Metrics) -> Value {
    let mut map = serde_json::Map::new();
    for kind in MemoryKind::ALL {
        map.insert(kind.as_str().to_owned(), json!(metrics.device_memory(kind)));
    }
    map.insert("budget".into(), json!(metrics.device_memory_budget()));
    Value::Object(map)
}

/// One model's entry: its card, its placement (or `null`), its caches and token rates.
fn model(
    metrics: &Metrics,
    card: &ModelCard,
    placement: Option<ModelPlacement>,
    rate: &dyn Fn(&str) -> f64,
) -> Value {
    let id = &card.id;
    let (kv_used, kv_capacity) = metrics.model_kv_usage(id);
    let (queried, hits) = metrics.prefix_cache_counts(id);
    let cached = metrics.prefix_cache_tokens(id);
    let placement = placement.map(|p| swapped_out(p, card.residency.as_deref()));
    json!({
        "id": id,
        "status": card.status,
        "residency": card.residency,
        "placement": placement,
        "kv_cache": {
            "used_tokens": kv_used,
            "capacity_tokens": kv_capacity,
            "fill": ratio(kv_used, kv_capacity),
        },
        "prefix_cache": {
            "tokens": cached,
            "capacity_tokens": kv_capacity,
            "fill": ratio(cached, kv_capacity),
            "queried_tokens": queried,
            "hit_tokens": hits,
            "hit_rate": (queried > 0).then(|| hits as f64 / queried as f64),
        },
        "tokens_per_s": {
            "prompt": rate(&format!("model:{id}:prompt")),
            "generation": rate(&format!("model:{id}:generated")),
        },
    })
}

/// `used / capacity`, at most 1; 0 when there is no capacity.
fn ratio(used: u64, capacity: u64) -> f64 {
    if capacity == 0 {
        0.0
    } else {
        (used as f64 / capacity as f64).min(1.0)
    }
}

/// `placement` with every layer `swapped_out` while the model's weights are parked on the host.
fn swapped_out(mut placement: ModelPlacement, residency: Option<&str>) -> ModelPlacement {
    if residency == Some("host") {
        for layer in &mut placement.layers {
            layer.location = LayerLocation::SwappedOut;
        }
    }
    placement
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_engine::placement::{BudgetUse, LayerSite};

    fn placement() -> ModelPlacement {
        ModelPlacement {
            offload_mode: "model".into(),
            budget: BudgetUse::default(),
            layers: (0..3)
                .map(|index| LayerSite {
                    index,
                    location: LayerLocation::Device,
                    bytes: 1,
                })
                .collect(),
            experts: Vec::new(),
            expert_cache_slots: 0,
            max_context: 8,
            max_batch: 1,
            link_bytes_per_s: None,
        }
    }

    fn locations(p: &ModelPlacement) -> Vec<LayerLocation> {
        p.layers.iter().map(|l| l.location).collect()
    }

    #[test]
    fn a_parked_model_shows_every_layer_swapped_out() {
        let parked = swapped_out(placement(), Some("host"));
        assert_eq!(locations(&parked), [LayerLocation::SwappedOut; 3]);
        for residency in [Some("device"), Some("moving"), None] {
            let kept = swapped_out(placement(), residency);
            assert_eq!(
                locations(&kept),
                [LayerLocation::Device; 3],
                "{residency:?}"
            );
        }
    }

    #[test]
    fn ratios_are_bounded_and_zero_without_capacity() {
        assert_eq!(ratio(5, 0), 0.0);
        assert_eq!(ratio(1, 4), 0.25);
        assert_eq!(ratio(9, 4), 1.0);
    }
}
