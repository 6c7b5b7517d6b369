//! How every configured model shares the one compute device: what `ferry plan` prints and what
//! `serve` executes (it calls [`DevicePlan::new`] before loading anything and loads each model
//! with [`ModelPlan::config`], so both see the same numbers and refuse alike).
//!
//! Rules (README's "Several models on one device"):
//! - The device's free memory is measured once; every `gpu_memory = "90%"` is a share of it.
//! - Each non-`model` entry is planned against its own `gpu_memory`; every mode-`model` entry
//!   against the shared budget of the first of them ([`super::swap`]).
//! - Together they must fit: the entries' device bytes (each plan's, without its reserve, and
//!   its speculative draft model's), the mode-`model` pool's (at most its budget) and one reserve
//!   may not exceed the free memory.
//! - A draft model is placed first, inside its model's budget ([`super::draft`]).

use std::sync::Arc;

use candle_core::{DType, Device};
use serde_json::{json, Value};

use super::device::{describe, free_bytes};
use super::draft::{open_draft, DraftPlan};
use super::planning::{open_checkpoint, plan_with_draft};
use super::swap::{pool_plan, swap_manager, PoolPlan};
use super::tiers::tier_report;
use super::RuntimeError;
use ferry_config::{
    Config, DtypeChoice, KvOffload, MemoryBudget, ModelConfig, OffloadMode, QuantType,
    SpeculativeMethod,
};
use ferry_engine::speculative::MAX_PROPOSAL;
use ferry_model::checkpoint::Checkpoint;
use ferry_model::kv_format::KvFormat;
use ferry_model::source::HubOptions;
use ferry_offload::plan::{resolve_budget, Plan};
use ferry_offload::render::{plan_json, render_text};
use ferry_offload::tier_report::TierReport;
use ferry_offload::units::format_bytes;
use ferry_offload::SwapManager;

/// What `serve` needs before it loads anything: the plan `ferry plan` shows, the checkpoints it
/// was made from (one per model, in order: loading reuses them, so each header is parsed once),
/// and the swap manager of the mode-`model` pool (if any).
pub struct Serving {
    /// Every model's plan; load each with its [`ModelPlan::config`] and [`ModelPlan::plan`].
    pub plan: DevicePlan,
    /// The opened checkpoint of each of `plan.models`, in the same order.
    pub checkpoints: Vec<Checkpoint>,
    /// The opened checkpoint of each model's draft (method `draft`), in the same order.
    pub draft_checkpoints: Vec<Option<Checkpoint>>,
    /// The shared residency manager of the mode-`model` entries.
    pub swap: Option<Arc<SwapManager>>,
}

/// Measures the device's free memory once, plans every model ([`DevicePlan::new`], refusing
/// what `ferry plan` refuses) and makes the mode-`model` swap manager.
pub fn prepare_serving(
    config: &Config,
    device: &Device,
    hub: &HubOptions,
) -> Result<Serving, RuntimeError> {
    let free = free_bytes(device)?;
    let (plan, (checkpoints, draft_checkpoints)) =
        DevicePlan::with_checkpoints(config, device, hub, free)?;
    let swap = plan
        .pool
        .as_ref()
        .map(|pool| swap_manager(pool, &config.device))
        .transpose()?;
    Ok(Serving {
        plan,
        checkpoints,
        draft_checkpoints,
        swap,
    })
}

/// The checkpoints a device plan was made from: each model's, and its draft's.
pub type Checkpoints = (Vec<Checkpoint>, Vec<Option<Checkpoint>>);

/// One model's part of the device plan.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPlan {
    /// The model's configuration with its budget resolved to bytes and its KV cache's
    /// `max_context`, `max_batch` and `kv_dtype` as planned (what `serve` loads with).
    pub config: ModelConfig,
    /// Its placement.
    pub plan: Plan,
    /// The tier cost model and its decisions, when layers are offloaded ([`tier_report`]).
    pub tiers: Option<TierReport>,
    /// The speculative draft model's plan (method `draft`), placed before the model's.
    pub draft: Option<DraftPlan>,
}

/// Every model's placement on one device, and whether they fit together.
#[derive(Debug, Clone, PartialEq)]
pub struct DevicePlan {
    /// The device, e.g. `cpu` or `cuda:0`.
    pub device: String,
    /// Its free memory when measured.
    pub free_bytes: u64,
    /// The models, in config order.
    pub models: Vec<ModelPlan>,
    /// The mode-`model` pool, if any entry uses mode `model`.
    pub pool: Option<PoolPlan>,
    /// The most the models hold on the device at once (at most `free_bytes`).
    pub device_bytes: u64,
}

/// The setting that names `dtype`.
fn dtype_choice(format: KvFormat) -> DtypeChoice {
    match format {
        KvFormat::Dense(DType::F16) => DtypeChoice::F16,
        KvFormat::Dense(DType::BF16) => DtypeChoice::BF16,
        KvFormat::Dense(_) => DtypeChoice::F32,
        KvFormat::Q8_0 => DtypeChoice::Quantize(QuantType::Q8_0),
        KvFormat::Q4_0 => DtypeChoice::Quantize(QuantType::Q4_0),
    }
}

impl DevicePlan {
    /// Plans `config`'s models on `device` with `free_bytes` free. Fails when a model does not
    /// fit its budget, the mode-`model` pool does not fit, or the models do not fit together.
    pub fn new(
        config: &Config,
        device: &Device,
        hub: &HubOptions,
        free_bytes: u64,
    ) -> Result<Self, RuntimeError> {
        Self::with_checkpoints(config, device, hub, free_bytes).map(|(plan, _)| plan)
    }

    /// [`DevicePlan::new`], also returning the checkpoint each model was planned from, and its
    /// draft's.
    pub fn with_checkpoints(
        config: &Config,
        device: &Device,
        hub: &HubOptions,
        free_bytes: u64,
    ) -> Result<(Self, Checkpoints), RuntimeError> {
        let shared = config
            .models
            .iter()
            .find(|m| m.offload.mode == OffloadMode::Model)
            .map(|m| resolve_budget(m.offload.gpu_memory, free_bytes))
            .transpose()?;
        let mut models = Vec::with_capacity(config.models.len());
        let mut checkpoints = Vec::with_capacity(config.models.len());
        let mut draft_checkpoints = Vec::with_capacity(config.models.len());
        for model in &config.models {
            let budget = match (model.offload.mode, shared) {
                (OffloadMode::Model, Some(shared)) => shared,
                _ => resolve_budget(model.offload.gpu_memory, free_bytes)?,
            };
            let mut pinned = model.clone();
            pinned.offload.gpu_memory = MemoryBudget::Bytes(budget);
            let checkpoint = open_checkpoint(&pinned, hub)?;
            let draft_checkpoint = open_draft(&pinned, hub)?;
            let (plan, draft) = plan_with_draft(
                &pinned,
                &config.device,
                device,
                (&checkpoint, draft_checkpoint.as_ref()),
                free_bytes,
            )
            .map_err(|e| match e {
                RuntimeError::Plan(e) => {
                    RuntimeError::Placement(format!("model `{}`: {e}", model.name))
                }
                other => other,
            })?;
            // Serve loads with what was chosen, so it plans (and sizes its engine) the same.
            pinned.max_context = Some(plan.max_context);
            pinned.max_batch = Some(plan.max_batch);
            if plan.max_step_tokens > 0 {
                pinned.max_step_tokens = Some(plan.max_step_tokens);
            }
            pinned.kv_dtype = dtype_choice(plan.kv_dtype);
            pinned.kv_offload = if plan.kv_host {
                KvOffload::On
            } else {
                KvOffload::Off
            };
            let tiers = tier_report(&pinned, &config.device, device, &checkpoint, &plan)?;
            models.push(ModelPlan {
                config: pinned,
                plan,
                tiers,
                draft,
            });
            checkpoints.push(checkpoint);
            draft_checkpoints.push(draft_checkpoint);
        }
        let named: Vec<(&str, &Plan)> = models
            .iter()
            .map(|m| (m.config.name.as_str(), &m.plan))
            .collect();
        let pool = pool_plan(&named)?;

        let mut reserve = pool.as_ref().map_or(0, |p| p.reserve_bytes);
        let mut held = pool
            .as_ref()
            .map_or(0, |p| p.device_bytes.saturating_sub(p.reserve_bytes));
        for model in models.iter().filter(|m| m.plan.mode != OffloadMode::Model) {
            reserve = reserve.max(model.plan.reserve_bytes);
            held = held.saturating_add(
                model
                    .plan
                    .device_bytes
                    .saturating_sub(model.plan.reserve_bytes),
            );
        }
        for draft in models.iter().filter_map(|m| m.draft.as_ref()) {
            held = held.saturating_add(draft.device_bytes());
        }
        let device_bytes = held.saturating_add(reserve);
        let plan = Self {
            device: describe(device),
            free_bytes,
            models,
            pool,
            device_bytes,
        };
        if device_bytes > free_bytes {
            return Err(RuntimeError::Placement(plan.overflow_message()));
        }
        Ok((plan, (checkpoints, draft_checkpoints)))
    }

    fn overflow_message(&self) -> String {
        let mut parts: Vec<String> = self
            .models
            .iter()
            .filter(|m| m.plan.mode != OffloadMode::Model)
            .map(|m| {
                let draft = m.draft.as_ref().map_or(0, DraftPlan::device_bytes);
                format!(
                    "`{}` {}",
                    m.config.name,
                    format_bytes(m.plan.device_bytes + draft)
                )
            })
            .collect();
        if let Some(pool) = &self.pool {
            parts.push(format!(
                "the mode `model` pool of {} {}",
                pool.models.join(", "),
                format_bytes(pool.device_bytes)
            ));
        }
        format!(
            "the models need {} on {} together ({}), but it has {} free: give each model a share of the device with `gpu_memory` (e.g. \"45%\" each for two), or stream more with offload auto/sequential",
            format_bytes(self.device_bytes),
            self.device,
            parts.join(", "),
            format_bytes(self.free_bytes)
        )
    }

    /// The human listing: every model's plan, the mode-`model` pool and the total.
    pub fn render_text(&self) -> String {
        let mut out = format!(
            "device {} with {} free\n",
            self.device,
            format_bytes(self.free_bytes)
        );
        for model in &self.models {
            let shared = if model.plan.mode == OffloadMode::Model {
                " (budget shared by the mode `model` entries)"
            } else {
                ""
            };
            out.push_str(&format!(
                "\nmodel {} ({}){shared}\n{}",
                model.config.name,
                model.config.source,
                render_text(&model.plan)
            ));
            if let Some(tiers) = &model.tiers {
                out.push_str(&tiers.render_text());
            }
            out.push_str(&speculative_line(&model.config, model.draft.as_ref()));
        }
        if let Some(pool) = &self.pool {
            out.push_str(&format!(
                "\nmode `model` pool ({}): budget {} = {} always on the device (fixed parts, KV caches, workspace, reserve) + {} for the resident models' layers\n",
                pool.models.join(", "),
                format_bytes(pool.budget_bytes),
                format_bytes(pool.always_bytes),
                format_bytes(pool.layer_budget_bytes),
            ));
        }
        out.push_str(&format!(
            "\ntogether on {}: {} of {} free\n",
            self.device,
            format_bytes(self.device_bytes),
            format_bytes(self.free_bytes)
        ));
        out
    }

    /// One JSON document: `{"device", "free_bytes", "device_bytes", "models": [{"name",
    /// "source", "plan", "tiers", "speculative": {"method", "draft", "tokens"}}], "pool": null | {"models", "budget_bytes", "always_bytes",
    /// "layer_budget_bytes", "device_bytes"}}`.
    pub fn to_json(&self) -> Value {
        let models: Vec<Value> = self
            .models
            .iter()
            .map(|m| {
                json!({
                    "name": m.config.name,
                    "source": m.config.source,
                    "plan": plan_json(&m.plan),
                    "tiers": m.tiers.as_ref().map(TierReport::json),
                    "speculative": speculative_json(&m.config, m.draft.as_ref()),
                })
            })
            .collect();
        let pool = self.pool.as_ref().map(|p| {
            json!({
                "models": p.models,
                "budget_bytes": p.budget_bytes,
                "always_bytes": p.always_bytes,
                "layer_budget_bytes": p.layer_budget_bytes,
                "device_bytes": p.device_bytes,
            })
        });
        json!({
            "device": self.device,
            "free_bytes": self.free_bytes,
            "device_bytes": self.device_bytes,
            "models": models,
            "pool": pool,
        })
    }
}

/// `ferry plan`'s line on a model's speculative decoding (`models[].speculative`), with the
/// draft model's bytes on the device.
fn speculative_line(config: &ModelConfig, draft: Option<&DraftPlan>) -> String {
    let speculative = &config.speculative;
    match speculative.method {
        SpeculativeMethod::None => "speculative none\n".to_string(),
        SpeculativeMethod::Ngram => format!(
            "speculative ngram (prompt lookup), up to {} tokens per step, fewer where acceptance says it does not pay\n",
            speculative.tokens.min(MAX_PROPOSAL)
        ),
        SpeculativeMethod::Draft => {
            let mut line = format!(
                "speculative draft {}, up to {} tokens per step, fewer where acceptance and its cost say it does not pay\n",
                speculative.draft.as_deref().unwrap_or("(none)"),
                speculative.tokens.min(MAX_PROPOSAL)
            );
            if let Some(draft) = draft {
                let plan = &draft.plan;
                line.push_str(&format!(
                    "  draft on the device first: {} = weights {} + KV {} ({} x {} positions, {}) + workspace {}\n",
                    format_bytes(draft.device_bytes()),
                    format_bytes(plan.fixed_bytes + plan.resident_layer_bytes),
                    format_bytes(plan.kv_bytes),
                    plan.max_batch,
                    plan.max_context,
                    plan.kv_dtype.as_str(),
                    format_bytes(plan.workspace_bytes),
                ));
            }
            line
        }
    }
}

/// [`speculative_line`] as JSON (`draft_plan`: the draft's plan, method `draft`).
fn speculative_json(config: &ModelConfig, draft: Option<&DraftPlan>) -> Value {
    let speculative = &config.speculative;
    let method = match speculative.method {
        SpeculativeMethod::None => "none",
        SpeculativeMethod::Ngram => "ngram",
        SpeculativeMethod::Draft => "draft",
    };
    json!({
        "method": method,
        "draft": speculative.draft,
        "tokens": speculative.tokens.min(MAX_PROPOSAL),
        "draft_device_bytes": draft.map(DraftPlan::device_bytes),
        "draft_plan": draft.map(|d| plan_json(&d.plan)),
    })
}
