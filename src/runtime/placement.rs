//! A planned model's placement in the engine's plain terms ([`ModelPlacement`]), which
//! `serve` hands the engine for `GET /v1/ferry/status`: the plan's budget split, each layer's
//! home (a host layer is `host_computed` when the tier cost model computes every offloaded
//! unit kind on the host at one row, else `streamed`), and a MoE model's experts (`resident`,
//! or else `cached` through the device's expert pool or computed on the `host`, by the same
//! rule).

use ferry_engine::placement::{
    BudgetUse, ExpertLocation, LayerExperts, LayerLocation, LayerSite, ModelPlacement,
};
use ferry_offload::cost::Tier;
use ferry_offload::plan::{mode_name, Home, Plan};
use ferry_offload::tier_report::TierReport;

/// `plan`'s placement, with the tier decisions of `tiers` when the model has any.
pub fn model_placement(plan: &Plan, tiers: Option<&TierReport>) -> ModelPlacement {
    let host_computed = tiers.is_some_and(|t| {
        !t.lines.is_empty() && t.lines.iter().all(|line| line.at_one == Tier::Host)
    });
    let offloaded = if host_computed {
        LayerLocation::HostComputed
    } else {
        LayerLocation::Streamed
    };
    let layers = plan
        .layers
        .iter()
        .map(|layer| LayerSite {
            index: layer.index,
            location: match layer.home {
                Home::Device => LayerLocation::Device,
                Home::Host => offloaded,
            },
            bytes: layer.bytes,
        })
        .collect();
    let off_device = if host_computed {
        ExpertLocation::Host
    } else {
        ExpertLocation::Cached
    };
    let experts = plan
        .experts
        .iter()
        .flat_map(|e| &e.layers)
        .filter(|layer| layer.n_experts() > 0)
        .map(|layer| LayerExperts {
            layer: layer.index,
            experts: (0..layer.n_experts())
                .map(|i| {
                    if layer.is_resident(i) {
                        ExpertLocation::Resident
                    } else {
                        off_device
                    }
                })
                .collect(),
        })
        .collect();
    ModelPlacement {
        offload_mode: mode_name(plan.mode).to_owned(),
        budget: BudgetUse {
            budget: plan.budget_bytes,
            weights: plan.fixed_bytes.saturating_add(plan.resident_layer_bytes),
            slots: plan.slot_ring_bytes(),
            kv_cache: plan.device_kv_bytes(),
            workspace: plan.workspace_bytes,
            reserve: plan.reserve_bytes,
            device_total: plan.device_bytes,
            host: plan.host_bytes,
        },
        layers,
        experts,
        expert_cache_slots: plan.experts.as_ref().map_or(0, |e| e.pool_slots),
        max_context: plan.max_context,
        max_batch: plan.max_batch,
        link_bytes_per_s: tiers
            .map(|t| t.calibration.model.link_bytes_per_s)
            .filter(|r| r.is_finite() && *r > 0.0),
    }
}
