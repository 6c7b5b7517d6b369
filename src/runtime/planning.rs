//! `ferry plan`: sizes a configured model from its file headers (no weights are read) and runs
//! the pure placement planner against the device budget, with the KV cache fitted to it
//! ([`ferry_offload::fit`]: unset `max_context` / `max_batch` are chosen, and logged when
//! lowered). Loading plans the same way from the checkpoint it then loads ([`plan_checkpoint`]),
//! so the plan `ferry plan` prints is the one `ferry serve` follows. A speculative draft model is
//! placed first and the model gets what it leaves of the budget ([`super::draft`]). A MoE
//! model's resident experts are the most routed ones where earlier runs counted them
//! ([`super::expert_routes`]).

use std::collections::{BTreeMap, BTreeSet};

use candle_core::{DType, Device};

use super::draft::{open_draft, plan_draft_first, DraftPlan};
use super::expert_routes::recorded_routes;
use super::RuntimeError;
use ferry_config::{DeviceConfig, DtypeChoice, KvOffload, ModelConfig, OffloadMode};
use ferry_model::checkpoint::Checkpoint;
use ferry_model::decoder::attention::score_block;
use ferry_model::header::GgufType;
use ferry_model::kv_cache::{kv_dtype_for, window_positions, KvShape};
use ferry_model::kv_format::KvFormat;
use ferry_model::loader::{Holding, LoadOptions};
use ferry_model::recurrent_state::RecurrentShape;
use ferry_model::source::{self, HubOptions, ModelSource};
use ferry_model::spec::ModelSpec;
use ferry_model::tensors::StoredType;
use ferry_model::ModelError;
use ferry_offload::experts_plan::ExpertInput;
use ferry_offload::fit::{fit, CacheRequest, Fitted};
use ferry_offload::layout::SlotKind;
use ferry_offload::plan::{
    resolve_budget, KvLayout, Origin, Plan, PlanInput, DEFAULT_CPU_RESERVE_BYTES,
    DEFAULT_CUDA_RESERVE_BYTES, DEFAULT_LINK_BANDWIDTH,
};
use ferry_offload::sizing::{
    kv_bytes_per_token_per_layer, workspace_bytes, ModelSizes, WorkspaceInput,
};
use ferry_offload::units::format_bytes;

/// The placement plan of `model` on `device`, whose free memory is `free_bytes`: resolves the
/// source, opens the checkpoint (and its draft's) and plans it ([`plan_with_draft`]).
pub fn plan_model(
    model: &ModelConfig,
    device_config: &DeviceConfig,
    device: &Device,
    hub: &HubOptions,
    free_bytes: u64,
) -> Result<Plan, RuntimeError> {
    let checkpoint = open_checkpoint(model, hub)?;
    let draft = open_draft(model, hub)?;
    let (plan, _) = plan_with_draft(
        model,
        device_config,
        device,
        (&checkpoint, draft.as_ref()),
        free_bytes,
    )?;
    Ok(plan)
}

/// Resolves `model`'s source (a path or a hub id) and opens its checkpoint: the one header
/// parse of a load.
pub fn open_checkpoint(model: &ModelConfig, hub: &HubOptions) -> Result<Checkpoint, RuntimeError> {
    let wrap = |source| RuntimeError::Model {
        name: model.name.clone(),
        source,
    };
    let parsed = ModelSource::parse(&model.source).map_err(wrap)?;
    let files = source::resolve(&parsed, hub).map_err(wrap)?;
    Checkpoint::open(&files).map_err(wrap)
}

/// The placement plan of an open `checkpoint` configured as `model` on `device`, without a
/// draft model.
pub fn plan_checkpoint(
    model: &ModelConfig,
    device_config: &DeviceConfig,
    device: &Device,
    checkpoint: &Checkpoint,
    free_bytes: u64,
) -> Result<Plan, RuntimeError> {
    plan_beside(model, device_config, device, checkpoint, free_bytes, 0)
}

/// The placement plan of `model` (its open checkpoint and, for speculative method `draft`, its
/// draft's): the draft placed first ([`super::draft::plan_draft_first`]), then the model in what
/// it leaves of the budget.
pub fn plan_with_draft(
    model: &ModelConfig,
    device_config: &DeviceConfig,
    device: &Device,
    (checkpoint, draft): (&Checkpoint, Option<&Checkpoint>),
    free_bytes: u64,
) -> Result<(Plan, Option<DraftPlan>), RuntimeError> {
    match draft {
        None => Ok((
            plan_checkpoint(model, device_config, device, checkpoint, free_bytes)?,
            None,
        )),
        Some(draft) => {
            let (plan, draft) = plan_draft_first(
                model,
                device_config,
                device,
                (checkpoint, draft),
                free_bytes,
            )?;
            Ok((plan, Some(draft)))
        }
    }
}

/// The placement plan of `checkpoint` configured as `model` on `device`, in its budget less
/// `held` bytes another model (its draft) holds on the device.
pub fn plan_beside(
    model: &ModelConfig,
    device_config: &DeviceConfig,
    device: &Device,
    checkpoint: &Checkpoint,
    free_bytes: u64,
    held: u64,
) -> Result<Plan, RuntimeError> {
    let wrap = |source: ModelError| RuntimeError::Model {
        name: model.name.clone(),
        source,
    };
    let options = LoadOptions {
        device: device.clone(),
        dtype: model.dtype,
    };
    let holding = Holding::new(checkpoint, &options).map_err(wrap)?;
    let slot_kind = SlotKind::for_device(device);
    let sizes = ModelSizes::of(checkpoint, &holding, slot_kind).map_err(wrap)?;
    let spec = checkpoint.spec();
    let budget = resolve_budget(model.offload.gpu_memory, free_bytes)?;
    let budget = budget.checked_sub(held).ok_or_else(|| {
        RuntimeError::Placement(format!(
            "model `{}`: its draft model needs {} of its budget of {}",
            model.name,
            format_bytes(held),
            format_bytes(budget)
        ))
    })?;
    // Activations use the compute dtype (f32 for quantized weights); the KV cache its own.
    let kv_dtype = kv_dtype_for(model.kv_dtype, holding.compute());
    let kv_offload = kv_offload_for(model.kv_offload, kv_dtype, device);
    let kv_device = match kv_offload {
        KvOffload::On => Device::Cpu,
        _ => device.clone(),
    };
    let kv_shape = KvShape::of(spec);
    kv_dtype.check(&kv_shape, &kv_device).map_err(wrap)?;
    let kv_per_token = kv_bytes_per_token_per_layer(kv_shape, kv_dtype);
    let reserve_bytes = match device {
        Device::Cpu => DEFAULT_CPU_RESERVE_BYTES,
        _ => DEFAULT_CUDA_RESERVE_BYTES,
    };
    let link_bandwidth = device_config
        .link_bandwidth
        .unwrap_or(DEFAULT_LINK_BANDWIDTH);
    // What earlier runs counted of the experts' routing: the most routed are resident first.
    let routes = recorded_routes(model, checkpoint);
    let input_at = |max_context: usize, max_batch: usize, step_tokens: usize| {
        let mut input = PlanInput::new(
            model.offload.mode,
            sizes.layers.clone(),
            sizes.fixed,
            budget,
        );
        input.max_batch = max_batch;
        input.max_context = max_context;
        input.kv_bytes_per_token_per_layer = kv_per_token;
        input.kv_dtype = kv_dtype;
        input.kv_layout = kv_layout(spec, step_tokens);
        input.prefetch = model.offload.prefetch;
        input.workspace_bytes = workspace_bytes(&WorkspaceInput {
            hidden_size: spec.hidden_size,
            vocab_size: spec.vocab_size,
            n_heads: spec.n_heads,
            max_batch,
            // The most tokens one engine step computes.
            prefill_chunk: step_tokens,
            score_block: score_block(device, max_context),
        });
        input.max_step_tokens = step_tokens;
        input.reserve_bytes = reserve_bytes;
        input.link_bandwidth = Some(link_bandwidth);
        input.layer_layouts = sizes.layouts.clone();
        input.slot_kind = slot_kind;
        // A mixture of experts is placed expert by expert (`offload.experts`), on the CPU and
        // CUDA devices alike (the pool's slots sized as `slot_kind` holds them).
        input.experts = spec
            .moe
            .filter(|_| model.tier.experts)
            .map(|moe| ExpertInput {
                n_used: moe.n_used,
                pool_slots: None,
                host_layers: model.tier.host_expert_layers.clone(),
                route_counts: routes
                    .as_ref()
                    .map(|r| r.counts.clone())
                    .unwrap_or_default(),
            });
        input
    };
    let request = CacheRequest {
        max_context: model.max_context.map(|cap| cap.min(spec.max_context)),
        max_batch: model.max_batch,
        model_context: spec.max_context,
        kv_dtype: if model.kv_dtype == DtypeChoice::Auto {
            Origin::Default
        } else {
            Origin::Set
        },
        kv_offload,
        // The host's free memory, a tenth kept back: what the plan puts there (offloaded
        // weights, pinned or registered, and the cache) must fit in it.
        host_free_bytes: cpu_free_bytes().ok().map(|free| free / 10 * 9),
        device_in_host_memory: device.is_cpu(),
    };
    let (mut fitted, step_tokens) = fit_step_tokens(model, &request, &input_at)?;
    let input_for =
        |max_context: usize, max_batch: usize| input_at(max_context, max_batch, step_tokens);
    fitted
        .plan
        .notes
        .extend(dequantized_notes(checkpoint, &holding));
    if let Some(note) = recurrent_note(spec) {
        tracing::info!(model = %model.name, "{note}");
        fitted.plan.notes.push(note);
    }
    if let Some(routes) = routes.as_ref().filter(|_| fitted.plan.experts.is_some()) {
        fitted.plan.notes.push(routes.note());
    }
    if let Some(note) = needless_streaming(&fitted.plan, &input_for) {
        tracing::warn!(model = %model.name, "{note}");
        fitted.plan.notes.push(note);
    }
    if let Some(reason) = &fitted.reason {
        tracing::info!(
            model = %model.name,
            max_context = fitted.plan.max_context,
            max_batch = fitted.plan.max_batch,
            kv_dtype = fitted.plan.kv_dtype.as_str(),
            kv_bytes = fitted.plan.kv_bytes,
            "{reason}"
        );
    }
    Ok(fitted.plan)
}

/// `max_step_tokens` when it is not set and fits.
const DEFAULT_STEP_TOKENS: usize = ferry_engine::worker::DEFAULT_MAX_STEP_TOKENS;

/// An unset `max_step_tokens` is lowered in steps of this many tokens, down to this many.
const STEP_TOKENS_STEP: usize = 64;

/// The KV cache fitted ([`fit`]) at `model`'s `max_step_tokens`, and that value. An unset one
/// that does not fit at [`DEFAULT_STEP_TOKENS`] (the activation workspace it sizes is part of
/// the device's need) is lowered in steps of [`STEP_TOKENS_STEP`] to the largest that fits,
/// the plan's first note saying why; a set one, or none fitting, keeps the first error.
fn fit_step_tokens(
    model: &ModelConfig,
    request: &CacheRequest,
    input_at: &dyn Fn(usize, usize, usize) -> PlanInput,
) -> Result<(Fitted, usize), RuntimeError> {
    let at = |step_tokens: usize| fit(request, &|c, b| input_at(c, b, step_tokens));
    let top = model.max_step_tokens.unwrap_or(DEFAULT_STEP_TOKENS);
    let refusal = match at(top) {
        Ok(fitted) => return Ok((fitted, top)),
        Err(refusal) if model.max_step_tokens.is_none() => refusal,
        Err(refusal) => return Err(refusal.into()),
    };
    let lower = (1..top.div_ceil(STEP_TOKENS_STEP))
        .rev()
        .map(|m| m * STEP_TOKENS_STEP);
    for step_tokens in lower {
        if let Ok(mut fitted) = at(step_tokens) {
            let note = format!(
                "fitted `max_step_tokens` {step_tokens} (the default {top}, lowered): at {top} tokens per step the activation workspace ({}) does not fit beside the smallest KV cache and the weights; {step_tokens} need {}; prompts prefill in smaller steps; set `max_step_tokens` to choose otherwise",
                format_bytes(input_at(fitted.plan.max_context, fitted.plan.max_batch, top).workspace_bytes),
                format_bytes(fitted.plan.workspace_bytes),
            );
            tracing::info!(model = %model.name, max_step_tokens = step_tokens, "{note}");
            fitted.plan.notes.insert(0, note);
            return Ok((fitted, step_tokens));
        }
    }
    Err(refusal.into())
}

/// What a model with recurrent layers (Qwen3.5's Gated DeltaNet) does without: the prefix cache
/// and speculation, which need a sequence cut back to an earlier position (no state snapshots
/// are kept), and which parts of its layers are slow paths.
fn recurrent_note(spec: &ModelSpec) -> Option<String> {
    let layers = (0..spec.n_layers)
        .filter(|&i| spec.is_recurrent_layer(i))
        .count();
    (layers > 0).then(|| {
        format!(
            "{layers} of {} layers are Gated DeltaNet layers with a recurrent state: the prefix cache and speculation are off for this model (a state cannot go back to an earlier position); their recurrence runs token by token from candle ops on every device, also for prompts (a slow path: no chunked or fused kernel)",
            spec.n_layers
        )
    })
}

/// A warning when mode `sequential` streams every layer of a model that the budget holds
/// whole at the same context and batch (mode `none` would plan it): every step pays the link
/// for nothing.
fn needless_streaming(
    plan: &Plan,
    input_for: &dyn Fn(usize, usize) -> PlanInput,
) -> Option<String> {
    if plan.mode != OffloadMode::Sequential {
        return None;
    }
    let mut resident = input_for(plan.max_context, plan.max_batch);
    resident.mode = OffloadMode::None;
    resident.kv_host = plan.kv_host;
    let whole = ferry_offload::plan::plan(&resident).ok()?;
    Some(format!(
        "offload mode `sequential` streams all {} layers ({} per step) though the whole model fits the budget ({} of {}): set `offload.mode = \"auto\"` (or `none`) to keep them on the device",
        plan.layers.len(),
        format_bytes(plan.streamed_bytes_per_step),
        format_bytes(whole.device_bytes),
        format_bytes(whole.budget_bytes),
    ))
}

/// Where the KV cache may live, as the fit reads it: on the CPU device `auto` is `off` (its
/// memory is host memory already); on CUDA a block format (q8_0, q4_0), whose attention runs in
/// the CPU's kernel only, puts the cache on the host unless it is set `off` (the format's check
/// then refuses it).
fn kv_offload_for(setting: KvOffload, format: KvFormat, device: &Device) -> KvOffload {
    match setting {
        KvOffload::Auto if device.is_cpu() => KvOffload::Off,
        KvOffload::Auto if format.is_quantized() => KvOffload::On,
        other => other,
    }
}

/// The KV cache's layout for `spec`: its sliding-window layers (each keeps at most its window,
/// the slack and one step of `max_step` tokens) and one token's bytes per layer in every format
/// the cache holds (the block formats only where the heads are whole blocks and the values
/// have rows of their own); with latent attention, the values the heads' expanded keys and
/// values would take.
fn kv_layout(spec: &ModelSpec, max_step: usize) -> KvLayout {
    let shape = KvShape::of(spec);
    let windows: Vec<usize> = (0..spec.n_layers)
        .filter_map(|i| spec.layer_window(i))
        .collect();
    let window = windows.iter().copied().max().unwrap_or(0);
    let recurrent: Vec<RecurrentShape> = match &spec.delta_net {
        Some(delta) => (0..spec.n_layers)
            .filter(|&i| spec.is_recurrent_layer(i))
            .map(|_| RecurrentShape::of(delta))
            .collect(),
        None => Vec::new(),
    };
    let formats = [
        KvFormat::Dense(DType::F32),
        KvFormat::Dense(DType::F16),
        KvFormat::Dense(DType::BF16),
        KvFormat::Q8_0,
        KvFormat::Q4_0,
    ];
    KvLayout {
        window_layers: windows.len(),
        window_positions: if window > 0 {
            window_positions(window, max_step)
        } else {
            0
        },
        per_token_by_format: formats
            .into_iter()
            .filter(|f| f.check(&shape, &Device::Cpu).is_ok())
            .map(|f| (f.as_str(), kv_bytes_per_token_per_layer(shape, f)))
            .collect(),
        recurrent_layers: recurrent.len(),
        recurrent_bytes_per_seq: recurrent.iter().map(|s| s.bytes() as u64).sum(),
        expanded_values_per_token: spec
            .mla
            .map(|m| spec.n_heads * (m.q_head_dim(spec.rope_dim) + m.v_head_dim)),
    }
}

/// One line per GGUF block type of `checkpoint` that the device has no kernels for (on CUDA:
/// IQ4_NL, IQ4_XS, MXFP4) while `holding` would keep blocks: those tensors are dequantized at
/// load, and the plan counts their dense bytes.
pub fn dequantized_notes(checkpoint: &Checkpoint, holding: &Holding) -> Vec<String> {
    let mut by_type: BTreeMap<GgufType, (BTreeSet<&str>, u64, u64)> = BTreeMap::new();
    let dense_size = holding.compute().size_in_bytes() as u64;
    for record in checkpoint.tensors().records() {
        let StoredType::Gguf(ty) = record.stored else {
            continue;
        };
        if !ty.is_block() || holding.dense().is_some() || holding.has_kernels(ty) {
            continue;
        }
        let entry = by_type.entry(ty).or_default();
        // A stacked expert tensor (gpt-oss's MXFP4 experts) has one record per expert
        // (`name[e]`): it counts once.
        let name = record
            .name
            .split_once('[')
            .map_or(&*record.name, |(n, _)| n);
        entry.0.insert(name);
        entry.1 += record.stored_bytes() as u64;
        entry.2 += record.elem_count() as u64 * dense_size;
    }
    by_type
        .into_iter()
        .map(|(ty, (names, stored, dense))| {
            let count = names.len();
            format!(
                "{count} {ty} tensors ({} in the file) have no kernels on this device: \
                 dequantized to {} at load, {} (counted above)",
                format_bytes(stored),
                holding.compute().as_str(),
                format_bytes(dense)
            )
        })
        .collect()
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
