//! The server's residency manager for offload mode `model`: its budget, derived from the
//! configuration, and the `/v1/models` location probe.
//!
//! Budget rule (documented in docs/ARCHITECTURE.md): the device budget is the `gpu_memory` of the
//! first mode-`model` entry, resolved against the device's free memory. What always stays on the
//! device is taken off it: for every mode-`model` model its fixed parts (embedding, final norm,
//! head), its KV cache and activation workspace as its plan sizes them, and one runtime reserve.
//! The rest is what the resident copies of decoder layers may take together; a model is moved
//! in only when its layers fit next to the other resident ones.

use std::sync::Arc;
use std::time::Duration;

use candle_core::Device;

use super::device::free_bytes;
use super::planning::plan_model;
use super::RuntimeError;
use crate::config::{Config, OffloadMode};
use crate::engine::Residency;
use crate::model::source::HubOptions;
use crate::offload::plan::resolve_budget;
use crate::offload::render::format_bytes;
use crate::offload::{OffloadError, SwapConfig, SwapManager};

/// How long a request waits for device room held by other models' running requests before it
/// fails with `Overloaded`.
pub const DEFAULT_SWAP_WAIT: Duration = Duration::from_secs(120);

/// The swap budget of `config` on a device with `free_bytes` free (see the module docs), or
/// `None` when no model uses mode `model`.
pub fn swap_budget(
    config: &Config,
    device: &Device,
    hub: &HubOptions,
    free_bytes: u64,
) -> Result<Option<u64>, RuntimeError> {
    let swapped: Vec<_> = config
        .models
        .iter()
        .filter(|m| m.offload.mode == OffloadMode::Model)
        .collect();
    let Some(first) = swapped.first() else {
        return Ok(None);
    };
    let total = resolve_budget(first.offload.gpu_memory, free_bytes)?;
    let mut always = 0u64;
    let mut reserve = 0u64;
    for model in &swapped {
        let plan = plan_model(model, &config.device, device, hub, free_bytes)?;
        always = always
            .saturating_add(plan.fixed_bytes)
            .saturating_add(plan.kv_bytes)
            .saturating_add(plan.workspace_bytes);
        reserve = reserve.max(plan.reserve_bytes);
    }
    let fixed = always.saturating_add(reserve);
    if fixed >= total {
        return Err(RuntimeError::Offload {
            name: first.name.clone(),
            source: OffloadError::Weights(format!(
                "mode `model`: the fixed parts, KV caches, workspace and reserve of the swapped models need {}, the device budget is {}",
                format_bytes(fixed),
                format_bytes(total)
            )),
        });
    }
    Ok(Some(total - fixed))
}

/// The server's swap manager when some model uses mode `model` (budget from [`swap_budget`]
/// against the device's free memory, copies throttled to `config.device.link_bandwidth`).
pub fn swap_manager_for(
    config: &Config,
    device: &Device,
    hub: &HubOptions,
) -> Result<Option<Arc<SwapManager>>, RuntimeError> {
    if !config
        .models
        .iter()
        .any(|m| m.offload.mode == OffloadMode::Model)
    {
        return Ok(None);
    }
    let free = free_bytes(device)?;
    let Some(budget_bytes) = swap_budget(config, device, hub, free)? else {
        return Ok(None);
    };
    tracing::info!(budget = %format_bytes(budget_bytes), "mode `model`: device budget for resident models");
    let manager = SwapManager::new(SwapConfig {
        budget_bytes,
        link_bandwidth: config.device.link_bandwidth,
        wait_timeout: DEFAULT_SWAP_WAIT,
    })
    .map_err(|source| RuntimeError::Offload {
        name: "mode model".into(),
        source,
    })?;
    Ok(Some(manager))
}

impl Residency for SwapManager {
    fn location(&self, model: &str) -> Option<String> {
        SwapManager::location(self, model).map(|l| l.as_str().to_string())
    }
}
