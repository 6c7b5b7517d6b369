//! Fitting the KV cache to the budget (llama.cpp's `--fit` is the anchor: it shrinks the context
//! before it moves weights off the GPU). A pure layer over [`plan`]: the caller says which of
//! `max_context` / `max_batch` are set and how to build the planner's input for any pair
//! (the KV cache and the workspace depend on both); [`fit`] chooses the unset ones.
//!
//! The order, each step only for values that are not set:
//!
//! 1. The defaults: the model's whole window and [`DEFAULT_MAX_BATCH`] sequences, if they fit
//!    with every decoder layer on the device (in mode `sequential`, whose layers stream by
//!    choice: if they fit at all).
//! 2. The context: the largest multiple of [`CONTEXT_STEP`] down to [`CONTEXT_FLOOR`] (or the
//!    model's window, if smaller) that fits with the default batch and every layer on the device.
//! 3. The batch: at the floor context, the largest batch below the default that keeps every
//!    layer on the device.
//! 4. The weights: at the floor context and batch 1, layers move to the host (mode `auto`), as
//!    many as the budget needs. The cache never crowds weights off the device while a smaller
//!    unset value would keep them; a server that wants more sequences next to streamed layers
//!    sets `max_batch`.
//!
//! With `kv_offload = auto` a cache the device cannot hold at step 1's values goes to host
//! memory instead (when the host holds it), before anything is lowered; with `on` it is there
//! from the start and the steps size what the device keeps without it.
//!
//! Set values are never changed; a plan with fitted ones carries a `fitted: ...` note saying
//! why. When the values planned do not fit at all, the error ([`PlanError::CacheDoesNotFit`])
//! names `max_context` and `max_batch`, what they cost, the largest values that fit and the
//! smallest budget that fits them. A plan whose host bytes exceed the host's free memory
//! ([`CacheRequest::host_free_bytes`]; on the CPU device with its device bytes, also host
//! memory) is refused, naming both ([`PlanError::HostMemory`]).

use super::error::{CacheOverflow, PlanError, Result};
use super::plan::{plan, CacheOrigins, Origin, Plan, PlanInput};
use super::units::format_bytes;
use ferry_config::{KvOffload, OffloadMode};

/// `max_batch` when it is not set and fits.
pub const DEFAULT_MAX_BATCH: usize = 8;

/// The smallest context the fit lowers an unset `max_context` to (the model's window when that is
/// smaller); below it, an unset `max_batch` shrinks and then layers move off the device.
pub const CONTEXT_FLOOR: usize = 4096;

/// A fitted context is a multiple of this many tokens (unless it is the model's window).
pub const CONTEXT_STEP: usize = 256;

/// What the configuration says about the KV cache's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheRequest {
    /// `max_context` as set (at most the model's window); `None` = unset.
    pub max_context: Option<usize>,
    /// `max_batch` as set; `None` = unset.
    pub max_batch: Option<usize>,
    /// The model's own context window.
    pub model_context: usize,
    /// Where the KV dtype came from (`Default` or `Set`), copied into the plan.
    pub kv_dtype: Origin,
    /// Where the KV cache may live (`kv_offload`; on the CPU device `auto` arrives as `Off`).
    pub kv_offload: KvOffload,
    /// Host memory the plan may take (offloaded weights, pinned or registered for the copies,
    /// and a KV cache there: `auto` keeps the cache on the device when it would not fit there
    /// either); a plan that needs more is refused, naming the bytes; `None`: unknown, not
    /// checked.
    pub host_free_bytes: Option<u64>,
    /// Whether the device's memory is the host's (the CPU device): the plan's device bytes
    /// then count against `host_free_bytes` too.
    pub device_in_host_memory: bool,
}

/// A plan with its KV cache fitted, and why, when ferry lowered a value.
#[derive(Debug, Clone, PartialEq)]
pub struct Fitted {
    /// The plan (its `max_context`, `max_batch` and `origins` say what was chosen).
    pub plan: Plan,
    /// One sentence for the log when something was fitted: the settings, what the defaults
    /// would have cost and what was chosen.
    pub reason: Option<String>,
}

/// Chooses the unset values of `request` in the module's order and plans with them;
/// `input_for(max_context, max_batch)` is the planner's input for one pair.
pub fn fit(
    request: &CacheRequest,
    input_for: &dyn Fn(usize, usize) -> PlanInput,
) -> Result<Fitted> {
    let mut fitted = fit_cache(request, input_for)?;
    if let Some(free) = request.host_free_bytes {
        let device = if request.device_in_host_memory {
            fitted.plan.device_bytes
        } else {
            0
        };
        let needed = fitted.plan.host_bytes.saturating_add(device);
        if needed > free {
            return Err(PlanError::HostMemory {
                needed,
                free,
                device,
            });
        }
    }
    if let Some(reason) = &fitted.reason {
        fitted.plan.notes.insert(0, reason.clone());
    }
    Ok(fitted)
}

fn fit_cache(
    request: &CacheRequest,
    input_for: &dyn Fn(usize, usize) -> PlanInput,
) -> Result<Fitted> {
    let window = request.model_context.max(1);
    let top_context = request.max_context.unwrap_or(window).min(window);
    let top_batch = request.max_batch.unwrap_or(DEFAULT_MAX_BATCH).max(1);
    let floor_context = request
        .max_context
        .map_or(CONTEXT_FLOOR.min(window), |c| c.min(window));
    let floor_batch = request.max_batch.unwrap_or(1).max(1);
    let origins = |context: usize, batch: usize| CacheOrigins {
        max_context: origin(request.max_context.is_some(), context < window),
        max_batch: origin(request.max_batch.is_some(), batch < DEFAULT_MAX_BATCH),
        kv_dtype: request.kv_dtype,
        model_context: window,
    };
    let on_host = request.kv_offload == KvOffload::On;
    let input_at = |context: usize, batch: usize| {
        let mut input = input_for(context, batch);
        input.kv_host = on_host;
        input
    };
    let input_for = &input_at;
    let attempt = |context: usize, batch: usize| {
        let mut input = input_for(context, batch);
        input.origins = origins(context, batch);
        plan(&input)
    };
    // Whether the weights keep the placement they would have with no KV cache at all.
    let keeps_weights = |context: usize, batch: usize| match attempt(context, batch) {
        Ok(p) => p.mode != OffloadMode::Auto || p.host_layers() == 0,
        Err(_) => false,
    };
    let done = |context: usize, batch: usize, plan: Plan| {
        let reason = (context < top_context || batch < top_batch).then(|| {
            reason(
                request,
                &plan,
                &input_for(top_context, top_batch),
                top_context,
                top_batch,
            )
        });
        Fitted { plan, reason }
    };

    // 1. The defaults (or the values set).
    if keeps_weights(top_context, top_batch) {
        return Ok(done(
            top_context,
            top_batch,
            attempt(top_context, top_batch)?,
        ));
    }
    // 1b. `auto`: the same values with the KV cache in host memory, when the host holds it.
    if request.kv_offload == KvOffload::Auto {
        let mut input = input_for(top_context, top_batch);
        input.origins = origins(top_context, top_batch);
        input.kv_host = true;
        if let Ok(hosted) = plan(&input) {
            let host_fits = request
                .host_free_bytes
                .is_none_or(|free| hosted.host_bytes <= free);
            if host_fits && (hosted.mode != OffloadMode::Auto || hosted.host_layers() == 0) {
                let device = input_for(top_context, top_batch);
                let reason = host_reason(request, &hosted, &device);
                return Ok(Fitted {
                    plan: hosted,
                    reason: Some(reason),
                });
            }
        }
    }
    // 2. A shorter context at the default batch.
    if request.max_context.is_none() && floor_context < top_context {
        let steps = |m: usize| (m * CONTEXT_STEP).max(floor_context);
        let lowest = floor_context.div_ceil(CONTEXT_STEP);
        let highest = (top_context - 1) / CONTEXT_STEP;
        if let Some(m) = largest(lowest, highest, &|m| keeps_weights(steps(m), top_batch)) {
            let context = steps(m);
            return Ok(done(context, top_batch, attempt(context, top_batch)?));
        }
    }
    // 3. A smaller batch at the floor context.
    if request.max_batch.is_none() && top_batch > 1 {
        if let Some(batch) = largest(1, top_batch - 1, &|b| keeps_weights(floor_context, b)) {
            return Ok(done(floor_context, batch, attempt(floor_context, batch)?));
        }
    }
    // 4. Layers move off the device (mode auto), or the smallest cache does not fit at all.
    match attempt(floor_context, floor_batch) {
        Ok(plan) => Ok(done(floor_context, floor_batch, plan)),
        Err(cause) => Err(cache_error(
            request,
            cause,
            &input_for(floor_context, floor_batch),
            &attempt,
        )),
    }
}

/// The log line of `kv_offload = auto` moving the cache to the host: what the device could not
/// hold, and what it costs.
fn host_reason(request: &CacheRequest, hosted: &Plan, device: &PlanInput) -> String {
    format!(
        "kept the KV cache in host memory (kv_offload = auto): {} with {} need {} of KV cache ({}), which the device budget {} does not hold beside the weights; attention runs on the host for every layer; set `kv_offload = \"off\"` to shorten the context instead",
        describe_context(request, hosted.max_context),
        describe_batch(request, hosted.max_batch),
        format_bytes(device.kv_bytes()),
        hosted.kv_dtype.as_str(),
        format_bytes(hosted.budget_bytes),
    )
}

fn origin(set: bool, lowered: bool) -> Origin {
    match (set, lowered) {
        (true, _) => Origin::Set,
        (false, true) => Origin::Fitted,
        (false, false) => Origin::Default,
    }
}

/// The largest `x` in `lo..=hi` for which `fits` holds, given that it is monotone (true up to
/// some point, false after it).
fn largest(lo: usize, hi: usize, fits: &dyn Fn(usize) -> bool) -> Option<usize> {
    if lo > hi || !fits(lo) {
        return None;
    }
    let (mut good, mut bad) = (lo, hi + 1);
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if fits(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    Some(good)
}

/// "`max_context` 4096 (set)", "`max_context` 4096 (the model's 131072, lowered)".
fn describe_context(request: &CacheRequest, context: usize) -> String {
    let note = match request.max_context {
        Some(_) => "set".to_string(),
        None if context >= request.model_context => "the model's window".to_string(),
        None => format!("the model's {}, lowered", request.model_context),
    };
    format!("`max_context` {context} ({note})")
}

/// "`max_batch` 8 (the default)", "`max_batch` 2 (set)".
fn describe_batch(request: &CacheRequest, batch: usize) -> String {
    let note = match request.max_batch {
        Some(_) => "set".to_string(),
        None if batch >= DEFAULT_MAX_BATCH => "the default".to_string(),
        None => format!("the default {DEFAULT_MAX_BATCH}, lowered"),
    };
    format!("`max_batch` {batch} ({note})")
}

/// The log line of a fit: what the defaults would need, what was chosen and what it costs.
fn reason(
    request: &CacheRequest,
    chosen: &Plan,
    top: &PlanInput,
    top_context: usize,
    top_batch: usize,
) -> String {
    let kv_dtype = chosen.kv_dtype.as_str();
    let placement = if let Some(experts) = &chosen.experts {
        format!(
            "; {} of {} routed experts live on the host (expert offload), every layer's other parts on the device",
            experts.host_experts(),
            experts.layers.iter().map(|l| l.n_experts()).sum::<usize>()
        )
    } else if chosen.host_layers() > 0 {
        format!(
            "; {} of {} layers still stream from the host (set `max_batch` for more sequences beside them)",
            chosen.host_layers(),
            chosen.layers.len()
        )
    } else {
        "; every layer stays on the device".to_string()
    };
    format!(
        "fitted the KV cache to the budget: `max_context` {top_context} with `max_batch` {top_batch} would need {} of KV cache ({kv_dtype}) and {} of workspace; chose {} and {}: {} of KV cache and {} of workspace, {} of the budget {} on the device{placement}; set `max_context` / `max_batch` (or `kv_dtype`) to choose otherwise",
        format_bytes(top.kv_bytes()),
        format_bytes(top.workspace_bytes),
        describe_context(request, chosen.max_context),
        describe_batch(request, chosen.max_batch),
        format_bytes(chosen.kv_bytes),
        format_bytes(chosen.workspace_bytes),
        format_bytes(chosen.device_bytes),
        format_bytes(chosen.budget_bytes),
    )
}

/// The refusal of the smallest cache the fit may plan: names the values and their cost, and the
/// largest values that fit (a shorter context at this batch, a smaller batch at this context).
/// When nothing smaller fits either, the cache is not the problem and `cause` stands alone.
fn cache_error(
    request: &CacheRequest,
    cause: PlanError,
    planned: &PlanInput,
    attempt: &dyn Fn(usize, usize) -> Result<Plan>,
) -> PlanError {
    let (context, batch) = (planned.max_context, planned.max_batch);
    let mut options = Vec::new();
    if let Some(c) = largest(1, context.saturating_sub(1), &|c| attempt(c, batch).is_ok()) {
        options.push(format!("`max_context` {c} with `max_batch` {batch}"));
    }
    if let Some(b) = largest(1, batch.saturating_sub(1), &|b| attempt(context, b).is_ok()) {
        options.push(format!("`max_batch` {b} with `max_context` {context}"));
    }
    // The weights themselves not fitting (modes none and model) is the planner's own error,
    // with its advice; a cache too large for any offload mode names the budget that holds it.
    let weights = matches!(
        cause,
        PlanError::DoesNotFit { .. } | PlanError::CannotBeResident { .. }
    );
    if options.is_empty() && weights {
        return cause;
    }
    let budget = smallest_budget(planned);
    if options.is_empty() && budget.is_none() {
        return cause;
    }
    let mut instead = Vec::new();
    if !options.is_empty() {
        instead.push(format!("the largest that fit: {}", options.join(", or ")));
    }
    if let Some(bytes) = budget {
        // Rounded up to what one types: whole MiB from 1 GiB, whole KiB below.
        let size = if bytes >= 1 << 30 {
            format!("{}MiB", bytes.div_ceil(1 << 20))
        } else {
            format!("{}KiB", bytes.div_ceil(1 << 10))
        };
        instead.push(format!(
            "the smallest budget that fits them: {size} (set `offload.gpu_memory` / `--gpu-memory {size}`; a lower `max_step_tokens` shrinks the workspace)"
        ));
    }
    PlanError::CacheDoesNotFit(Box::new(CacheOverflow {
        asked: format!(
            "{} with {}",
            describe_context(request, context),
            describe_batch(request, batch)
        ),
        kv_bytes: planned.kv_bytes(),
        kv_dtype: planned.kv_dtype.as_str(),
        workspace_bytes: planned.workspace_bytes,
        cause,
        instead: instead.join("; "),
    }))
}

/// The smallest device budget with which `planned` plans (the planner needs more room for
/// more of everything, so one doubling and a bisection find it); `None` when none below
/// `u64::MAX` does.
fn smallest_budget(planned: &PlanInput) -> Option<u64> {
    let fits = |budget: u64| {
        let mut input = planned.clone();
        input.budget_bytes = budget;
        plan(&input).is_ok()
    };
    let mut bad = planned.budget_bytes;
    let mut good = bad.max(1 << 20);
    while !fits(good) {
        bad = good;
        good = good.checked_mul(2)?;
    }
    while good - bad > 1 {
        let mid = bad + (good - bad) / 2;
        if fits(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    Some(good)
}

#[cfg(test)]
#[path = "fit_tests.rs"]
mod tests;
