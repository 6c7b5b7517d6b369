//! The tier cost model of a planned model, made at start-up: when the plan offloads decoder
//! layers (modes `auto` and `sequential`), one offloaded layer's slab layout names the unit
//! kinds and the weight type, a short calibration ([`ferry_offload::calibrate`]) measures the
//! rates the configuration leaves unset, or reads them from the user's calibration cache
//! ([`ferry_offload::calibrate_cache`]) after the first start (logged at info, once), and
//! the [`TierReport`] holds the cost model with its decisions: `ferry plan` prints them, `serve` computes them once before
//! loading (as part of [`super::device_plan::DevicePlan`]). On a CUDA device only offloaded
//! experts held as GGUF blocks have a host tier ([`host_tier_on_cuda`]); offloaded whole
//! layers and experts held dense there are `stream`.

use candle_core::Device;

use super::RuntimeError;
use ferry_config::{DeviceConfig, ModelConfig, OffloadMode};
use ferry_model::checkpoint::Checkpoint;
use ferry_model::loader::{Holding, LoadOptions, TensorKind};
use ferry_offload::calibrate::{calibrate, calibrate_cached, CachePolicy, CalibrationInput, Probe};
use ferry_offload::calibrate_cache::CalibrationCache;
use ferry_offload::layout::LayerLayout;
use ferry_offload::plan::{Home, Plan};
use ferry_offload::tier_report::{unit_kinds, weight_type, Offloaded, TierReport};

/// The tier report of `model` planned as `plan` from `checkpoint` on `device`; `None` when
/// nothing is offloaded per unit (no host layers, or mode `model`, which moves whole models).
pub fn tier_report(
    model: &ModelConfig,
    device_config: &DeviceConfig,
    device: &Device,
    checkpoint: &Checkpoint,
    plan: &Plan,
) -> Result<Option<TierReport>, RuntimeError> {
    // An offloaded layer, or with experts as the units the first layer with host experts
    // (a MoE model's leading dense layers, GLM-4.5's, have none).
    let first = match plan.layers.iter().find(|l| l.home == Home::Host) {
        Some(layer) => layer.index,
        None if plan.host_bytes > 0 => {
            match plan
                .experts
                .iter()
                .flat_map(|e| &e.layers)
                .find(|l| l.host_experts() > 0)
            {
                Some(layer) => layer.index,
                None => return Ok(None),
            }
        }
        None => return Ok(None),
    };
    if plan.mode == OffloadMode::Model {
        return Ok(None);
    }
    let wrap = |source| RuntimeError::Model {
        name: model.name.clone(),
        source,
    };
    let options = LoadOptions {
        device: device.clone(),
        dtype: model.dtype,
    };
    let holding = Holding::new(checkpoint, &options).map_err(wrap)?;
    let layout = LayerLayout::of(checkpoint, &holding, first).map_err(wrap)?;
    let input = CalibrationInput {
        device,
        weight_type: weight_type(&layout),
        link_bandwidth: device_config.link_bandwidth,
        tier: &model.tier,
        probe: Probe::default(),
    };
    // Measured once per machine and build (when the probes were steady), then read from the
    // user's cache until `--recalibrate`.
    let policy = CachePolicy {
        recalibrate: device_config.recalibrate,
        max_spread: device_config.calibration_spread,
    };
    let calibration = match CalibrationCache::user() {
        Some(cache) => calibrate_cached(&input, &cache, policy),
        None => calibrate(&input),
    }
    .map_err(|source| RuntimeError::Offload {
        name: model.name.clone(),
        source,
    })?;
    // On CUDA only experts of GGUF blocks compute on the host (their pinned slabs viewed by
    // the CPU kernels); offloaded whole layers and experts held dense there only stream
    // (`ExpertStore::computes_on_host`, `WeightStore::set_layer_tiers`), so the report shows
    // what runs, and why (its cost model, forced to stream, is what `serve` decides by); a
    // forced `host` is refused at load for those.
    let stream_only = match (device.is_cpu(), plan.experts.is_some()) {
        (true, _) => None,
        _ if host_tier_on_cuda(plan, &layout) => None,
        (false, true) => Some(
            "the offloaded experts are held dense on CUDA (f16/bf16, or a GGUF type CUDA's \
             kernels lack, dequantized at load); ferry's CPU kernels compute only GGUF blocks \
             from a pinned slab",
        ),
        (false, false) => Some(
            "offloaded whole layers have no host tier on CUDA (their slabs' dense norms cannot \
             be read in pinned memory); offload experts one by one (offload.experts) for one",
        ),
    };
    tracing::info!(model = %model.name, "{}", calibration.summary());
    let spec = checkpoint.spec();
    let offloaded = match &plan.experts {
        Some(experts) => Offloaded::Experts(experts.layers.iter().map(|l| l.host_experts()).sum()),
        None => Offloaded::Layers(plan.host_layers()),
    };
    let kinds = unit_kinds(
        &layout,
        offloaded,
        spec.moe.as_ref(),
        spec.hidden_size,
        plan.max_batch,
    );
    let report = TierReport::new(calibration, plan.max_batch, kinds);
    // A forced tier is the user's: kept as set (a forced `host` is refused at load there).
    Ok(Some(match stream_only {
        Some(reason) if report.calibration.model.forced.is_none() => report.stream_only(reason),
        _ => report,
    }))
}

/// Whether `plan`'s offloaded units can compute on the host on a CUDA device: experts as the
/// units (not whole layers), held as GGUF blocks (`layout`, a layer with host experts), whose
/// pinned slabs ferry's CPU kernels read in place. Whole layers have dense norms, and an
/// expert held dense on CUDA a dense slab, which the CPU cannot view.
pub fn host_tier_on_cuda(plan: &Plan, layout: &LayerLayout) -> bool {
    plan.experts.is_some()
        && layout
            .entries
            .iter()
            .filter(|e| e.part.is_expert())
            .all(|e| matches!(e.kind, TensorKind::Blocks(_)))
}
