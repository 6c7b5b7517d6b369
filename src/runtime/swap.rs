//! The server's residency manager for offload mode `model`: the shared device budget, derived
//! from the configuration, and the `/v1/models` location probe.
//!
//! Budget rule (documented in docs/ARCHITECTURE.md and README.md): every mode-`model` entry
//! shares one device budget, the `gpu_memory` of the first of them, resolved against the device's
//! free memory (setting a different `gpu_memory` on a later one is a configuration error). What
//! always stays on the device is taken off it: for every mode-`model` model its fixed parts
//! (embedding, final norm, head), its KV cache and activation workspace as its plan sizes them,
//! and one runtime reserve. The rest is what the resident copies of decoder layers may take
//! together; a model is moved in only when its layers fit next to the other resident ones, so
//! each model's layers alone must fit in it.

use std::sync::Arc;
use std::time::Duration;

use super::RuntimeError;
use ferry_config::{DeviceConfig, OffloadMode};
use ferry_engine::Residency;
use ferry_offload::plan::Plan;
use ferry_offload::units::format_bytes;
use ferry_offload::{OffloadError, SwapConfig, SwapManager};

/// How long a request waits for device room held by other models' running requests before it
/// fails with `Overloaded`.
pub const DEFAULT_SWAP_WAIT: Duration = Duration::from_secs(120);

/// The shared device budget of the mode-`model` entries, as `ferry plan` shows it and `serve`
/// uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolPlan {
    /// The swapped models, in config order.
    pub models: Vec<String>,
    /// The shared budget: the first mode-`model` entry's `gpu_memory`, in bytes.
    pub budget_bytes: u64,
    /// What always stays on the device: every swapped model's fixed parts, KV cache and
    /// workspace, plus one reserve.
    pub always_bytes: u64,
    /// What resident decoder layers may take together: `budget_bytes - always_bytes` (the swap
    /// manager's budget).
    pub layer_budget_bytes: u64,
    /// The most the pool holds on the device at once: `always_bytes` plus every swapped model's
    /// layers, at most `budget_bytes`.
    pub device_bytes: u64,
    /// The reserve counted in `always_bytes` (the largest of the swapped plans').
    pub reserve_bytes: u64,
}

/// The pool of the mode-`model` entries among `plans` (`(name, plan)` in config order, each
/// planned against the shared budget), or `None` when no entry uses mode `model`. Fails, with
/// the same text `serve` would die with, when the fixed parts do not fit the budget or a model's
/// layers cannot fit next to them.
pub fn pool_plan(plans: &[(&str, &Plan)]) -> Result<Option<PoolPlan>, RuntimeError> {
    let swapped: Vec<&(&str, &Plan)> = plans
        .iter()
        .filter(|(_, plan)| plan.mode == OffloadMode::Model)
        .collect();
    let Some((first, _)) = swapped.first() else {
        return Ok(None);
    };
    let budget_bytes = swapped[0].1.budget_bytes;
    let mut always = 0u64;
    let mut reserve = 0u64;
    let mut all_layers = 0u64;
    for (_, plan) in &swapped {
        always = always
            .saturating_add(plan.fixed_bytes)
            .saturating_add(plan.device_kv_bytes())
            .saturating_add(plan.workspace_bytes);
        reserve = reserve.max(plan.reserve_bytes);
        all_layers = all_layers.saturating_add(plan.resident_layer_bytes);
    }
    let always_bytes = always.saturating_add(reserve);
    if always_bytes >= budget_bytes {
        return Err(RuntimeError::Offload {
            name: first.to_string(),
            source: OffloadError::Weights(format!(
                "mode `model`: the fixed parts, KV caches, workspace and reserve of the swapped models need {}, the device budget is {}",
                format_bytes(always_bytes),
                format_bytes(budget_bytes)
            )),
        });
    }
    let layer_budget_bytes = budget_bytes - always_bytes;
    for (name, plan) in &swapped {
        if plan.resident_layer_bytes > layer_budget_bytes {
            return Err(RuntimeError::Offload {
                name: name.to_string(),
                source: OffloadError::Weights(format!(
                    "mode `model`: its layers need {}, but next to what the swapped models always keep on the device ({}) the budget of {} leaves {}",
                    format_bytes(plan.resident_layer_bytes),
                    format_bytes(always_bytes),
                    format_bytes(budget_bytes),
                    format_bytes(layer_budget_bytes)
                )),
            });
        }
    }
    Ok(Some(PoolPlan {
        models: swapped.iter().map(|(name, _)| name.to_string()).collect(),
        budget_bytes,
        always_bytes,
        layer_budget_bytes,
        device_bytes: always_bytes.saturating_add(all_layers).min(budget_bytes),
        reserve_bytes: reserve,
    }))
}

/// The server's swap manager for `pool` (copies throttled to `device.link_bandwidth`).
pub fn swap_manager(
    pool: &PoolPlan,
    device: &DeviceConfig,
) -> Result<Arc<SwapManager>, RuntimeError> {
    tracing::info!(
        budget = %format_bytes(pool.layer_budget_bytes),
        "mode `model`: device budget for resident models"
    );
    SwapManager::new(SwapConfig {
        budget_bytes: pool.layer_budget_bytes,
        link_bandwidth: device.link_bandwidth,
        wait_timeout: DEFAULT_SWAP_WAIT,
    })
    .map_err(|source| RuntimeError::Offload {
        name: "mode model".into(),
        source,
    })
}

/// The swap manager as the engine's residency probe (where `GET /v1/models` finds a swapped
/// model): a wrapper, since the probe's trait lives in `ferry-engine` and the manager in
/// `ferry-offload`, two crates that do not know each other.
pub struct SwapResidency(pub Arc<SwapManager>);

impl Residency for SwapResidency {
    fn location(&self, model: &str) -> Option<String> {
        self.0.location(model).map(|l| l.as_str().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_offload::plan::{plan, PlanInput};

    const MIB: u64 = 1 << 20;

    /// A mode-`model` plan: `layers` of 10 MiB, 5 MiB fixed, 1 MiB reserve, on a 100 MiB budget.
    fn swapped(layers: usize, budget: u64) -> Plan {
        let mut input = PlanInput::new(OffloadMode::Model, vec![10 * MIB; layers], 5 * MIB, budget);
        input.reserve_bytes = MIB;
        plan(&input).expect("fits alone")
    }

    #[test]
    fn the_pool_is_the_first_budget_less_what_always_stays() {
        let (a, b) = (swapped(3, 100 * MIB), swapped(5, 100 * MIB));
        let mut input = PlanInput::new(OffloadMode::Auto, vec![10 * MIB; 2], 5 * MIB, 100 * MIB);
        input.reserve_bytes = 2 * MIB;
        let other = plan(&input).expect("auto");
        let pool = pool_plan(&[("a", &a), ("x", &other), ("b", &b)])
            .expect("fits")
            .expect("a pool");
        assert_eq!(pool.models, ["a", "b"], "only mode-model entries");
        assert_eq!(pool.budget_bytes, 100 * MIB);
        assert_eq!(
            pool.always_bytes,
            a.fixed_bytes
                + a.kv_bytes
                + a.workspace_bytes
                + b.fixed_bytes
                + b.kv_bytes
                + b.workspace_bytes
                + MIB
        );
        assert_eq!(pool.layer_budget_bytes, 100 * MIB - pool.always_bytes);
        assert_eq!(
            pool.device_bytes,
            (pool.always_bytes + 80 * MIB).min(100 * MIB)
        );
        assert_eq!(pool_plan(&[("x", &other)]).expect("no pool"), None);
    }

    #[test]
    fn a_model_whose_layers_cannot_fit_next_to_the_others_is_refused() {
        // Alone each fits 60 MiB; next to the other's fixed parts the 5-layer one does not.
        let (small, large) = (swapped(1, 60 * MIB), swapped(5, 60 * MIB));
        let err = pool_plan(&[("small", &small), ("large", &large)]).expect_err("too large");
        assert!(err.to_string().contains("model `large`"), "{err}");
        // Three models whose fixed parts and one reserve take the whole 16 MiB.
        let tiny = swapped(1, 16 * MIB);
        let err = pool_plan(&[("a", &tiny), ("b", &tiny), ("c", &tiny)]).expect_err("fixed parts");
        assert!(err.to_string().contains("device budget is"), "{err}");
    }
}
