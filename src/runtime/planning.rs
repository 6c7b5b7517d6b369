//! `ferry plan`: sizes a configured model from its file headers (no weights are read) and runs
//! the pure placement planner against the device budget.

use candle_core::Device;

use super::RuntimeError;
use crate::config::{DeviceConfig, ModelConfig};
use crate::model::source::{self, HubOptions, ModelSource};
use crate::offload::plan::{
    plan, resolve_budget, Plan, PlanInput, DEFAULT_CPU_RESERVE_BYTES, DEFAULT_CUDA_RESERVE_BYTES,
    DEFAULT_LINK_BANDWIDTH,
};
use crate::offload::sizing::{
    kv_bytes_per_token_per_layer, summarize, workspace_bytes, DenseDtype, WorkspaceInput,
};

/// Tokens a prefill step processes at most (used for the workspace estimate).
pub const PREFILL_CHUNK: usize = 512;

/// The placement plan of `model` on `device`, whose free memory is `free_bytes`.
pub fn plan_model(
    model: &ModelConfig,
    device_config: &DeviceConfig,
    device: &Device,
    hub: &HubOptions,
    free_bytes: u64,
) -> Result<Plan, RuntimeError> {
    let wrap = |source| RuntimeError::Model {
        name: model.name.clone(),
        source,
    };
    let parsed = ModelSource::parse(&model.source).map_err(wrap)?;
    let files = source::resolve(&parsed, hub).map_err(wrap)?;
    let target = DenseDtype::from_choice(model.dtype);
    let summary = summarize(&files, target)?;
    let dims = &summary.dims;
    let max_context = match (model.max_context, dims.context_length) {
        (Some(cap), Some(native)) => cap.min(native),
        (Some(cap), None) => cap,
        (None, Some(native)) => native,
        (None, None) => 4096,
    };
    // Activations and the KV cache are f32 on the CPU; a dense dtype sets them on CUDA.
    let activation_bytes = match (device, target) {
        (Device::Cpu, _) | (_, None) => 4,
        (_, Some(dtype)) => dtype.size_in_bytes(),
    };
    let mut input = PlanInput::new(
        model.offload.mode,
        summary.sizes.layers.clone(),
        summary.sizes.fixed,
        resolve_budget(model.offload.gpu_memory, free_bytes)?,
    );
    input.max_batch = model.max_batch;
    input.max_context = max_context;
    input.kv_bytes_per_token_per_layer =
        kv_bytes_per_token_per_layer(dims.n_kv_heads, dims.head_dim, activation_bytes);
    input.prefetch = model.offload.prefetch;
    input.workspace_bytes = workspace_bytes(&WorkspaceInput {
        hidden_size: dims.hidden_size,
        vocab_size: dims.vocab_size,
        n_heads: dims.n_heads,
        max_batch: model.max_batch,
        prefill_chunk: PREFILL_CHUNK,
        max_context,
    });
    input.reserve_bytes = match device {
        Device::Cpu => DEFAULT_CPU_RESERVE_BYTES,
        _ => DEFAULT_CUDA_RESERVE_BYTES,
    };
    input.link_bandwidth = Some(
        device_config
            .link_bandwidth
            .unwrap_or(DEFAULT_LINK_BANDWIDTH),
    );
    Ok(plan(&input)?)
}

/// Free memory of the CPU "device": `MemAvailable` from /proc/meminfo.
pub fn cpu_free_bytes() -> Result<u64, RuntimeError> {
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| RuntimeError::Device(format!("cannot read /proc/meminfo: {e}")))?;
    text.lines()
        .find_map(|line| {
            let rest = line.strip_prefix("MemAvailable:")?;
            let kib: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
            Some(kib * 1024)
        })
        .ok_or_else(|| RuntimeError::Device("/proc/meminfo has no MemAvailable line".into()))
}
