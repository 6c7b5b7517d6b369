//! The draft model of speculative method `draft` before it runs: its configuration (the served
//! model's, with the draft's source, every layer resident, its own dtype and KV dtype), its plan
//! (placed on the device before the served model's, which gets what it leaves of the budget),
//! and its load, with the check that its vocabulary is the served model's.
//!
//! Planning is two passes: the draft with one position of one sequence gives its weights and
//! workspace; the model planned beside them gives the context and batch its KV cache holds;
//! the draft is planned for that context and batch, and the model again beside all of it (its
//! context and batch can only shrink, so the draft's cache stays large enough).

use candle_core::Device;

use super::draft_model::DraftModel;
use super::load::read_tokenizer;
use super::planning::{open_checkpoint, plan_beside};
use super::RuntimeError;
use ferry_config::{
    DeviceConfig, DtypeChoice, KvOffload, MemoryBudget, ModelConfig, OffloadMode,
    SpeculativeConfig, SpeculativeMethod,
};
use ferry_model::checkpoint::Checkpoint;
use ferry_model::loader::LoadOptions;
use ferry_model::source::HubOptions;
use ferry_model::tokenizer::TextTokenizer;
use ferry_offload::plan::{resolve_budget, Plan};
use ferry_offload::{load_placed, StreamConfig};

/// The draft's part of a model's plan.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftPlan {
    /// The draft's configuration as planned (what it loads with).
    pub config: ModelConfig,
    /// Its placement: every layer on the device.
    pub plan: Plan,
}

impl DraftPlan {
    /// Bytes the draft holds on the device (weights, KV caches, workspace; no reserve).
    pub fn device_bytes(&self) -> u64 {
        self.plan
            .device_bytes
            .saturating_sub(self.plan.reserve_bytes)
    }
}

/// Opens the draft's checkpoint when `model` speculates with method `draft`.
pub fn open_draft(
    model: &ModelConfig,
    hub: &HubOptions,
) -> Result<Option<Checkpoint>, RuntimeError> {
    if model.speculative.method != SpeculativeMethod::Draft {
        return Ok(None);
    }
    let config = draft_config(model, None, None, model.offload.gpu_memory)?;
    open_checkpoint(&config, hub).map(Some)
}

/// The draft's configuration: `target`'s, named `<name>/draft`, with the draft's source, every
/// layer resident, its own dtypes, no speculation, and the context and batch given.
fn draft_config(
    target: &ModelConfig,
    max_context: Option<usize>,
    max_batch: Option<usize>,
    budget: MemoryBudget,
) -> Result<ModelConfig, RuntimeError> {
    let source = target.speculative.draft.clone().ok_or_else(|| {
        RuntimeError::Placement(format!(
            "model `{}`: method `draft` needs a draft model (--draft-model)",
            target.name
        ))
    })?;
    let mut config = target.clone();
    config.name = format!("{}/draft", target.name);
    config.source = source;
    config.dtype = DtypeChoice::Auto;
    config.kv_dtype = DtypeChoice::Auto;
    // The draft's cache stays beside it on the device (it is small, and read every proposal).
    config.kv_offload = KvOffload::Off;
    config.offload.mode = OffloadMode::None;
    config.offload.gpu_memory = budget;
    config.max_context = max_context;
    config.max_batch = max_batch;
    config.speculative = SpeculativeConfig::default();
    config.verify_weights = false;
    Ok(config)
}

/// Plans the draft first, then `model` in what it leaves of the budget (two passes, see the
/// module header). Returns the model's plan and the draft's.
pub fn plan_draft_first(
    model: &ModelConfig,
    device_config: &DeviceConfig,
    device: &Device,
    (checkpoint, draft): (&Checkpoint, &Checkpoint),
    free_bytes: u64,
) -> Result<(Plan, DraftPlan), RuntimeError> {
    let budget = MemoryBudget::Bytes(resolve_budget(model.offload.gpu_memory, free_bytes)?);
    let plan_draft = |max_context, max_batch| -> Result<DraftPlan, RuntimeError> {
        let config = draft_config(model, Some(max_context), Some(max_batch), budget)?;
        let plan =
            plan_beside(&config, device_config, device, draft, free_bytes, 0).map_err(|e| {
                RuntimeError::Placement(format!("model `{}`: its draft: {e}", model.name))
            })?;
        Ok(DraftPlan { config, plan })
    };
    let smallest = plan_draft(1, 1)?;
    let first = plan_beside(
        model,
        device_config,
        device,
        checkpoint,
        free_bytes,
        smallest.device_bytes(),
    )?;
    let mut draft = plan_draft(first.max_context, first.max_batch)?;
    let plan = plan_beside(
        model,
        device_config,
        device,
        checkpoint,
        free_bytes,
        draft.device_bytes(),
    )?;
    draft.config.max_context = Some(draft.plan.max_context);
    draft.config.max_batch = Some(draft.plan.max_batch);
    Ok((plan, draft))
}

/// Loads the draft as `draft` plans it (every layer resident on `device`) for a model whose
/// tokenizer is `target` and whose embedding has `target_vocab` rows. A draft whose vocabulary
/// differs is an error naming the first token that differs.
pub fn load_draft(
    draft: &DraftPlan,
    checkpoint: &Checkpoint,
    device: &Device,
    target: &TextTokenizer,
    target_vocab: usize,
) -> Result<DraftModel, RuntimeError> {
    let name = &draft.config.name;
    let wrap = |source| RuntimeError::Model {
        name: name.clone(),
        source,
    };
    let tokenizer = read_tokenizer(checkpoint).map_err(wrap)?;
    check_vocabulary(&tokenizer, target)
        .map_err(|message| RuntimeError::Placement(format!("model `{name}`: {message}")))?;
    if checkpoint.spec().has_recurrent_layers() {
        return Err(RuntimeError::Placement(format!(
            "model `{name}`: a draft model with recurrent layers (Qwen3.5's DeltaNet) cannot \
             go back over rejected proposals"
        )));
    }
    let options = LoadOptions {
        device: device.clone(),
        dtype: draft.config.dtype,
    };
    let stream = StreamConfig {
        prefetch: 0,
        link_bandwidth: None,
    };
    let mut placed =
        load_placed(checkpoint, &options, &draft.plan, stream, &mut |_| {}).map_err(|source| {
            RuntimeError::Offload {
                name: name.clone(),
                source,
            }
        })?;
    placed.model.set_kv_dtype(draft.plan.kv_dtype);
    placed.store.accounting().log(name, &draft.plan);
    Ok(DraftModel::new(
        placed.model,
        placed.store,
        draft.plan.max_context,
        target_vocab,
    ))
}

/// `Err` naming the first token id whose text differs between the draft's vocabulary and the
/// model's (or where one of them ends).
pub fn check_vocabulary(draft: &TextTokenizer, target: &TextTokenizer) -> Result<(), String> {
    let (draft_size, target_size) = (draft.vocab_size(), target.vocab_size());
    let shown = |tokenizer: &TextTokenizer, id: u32| {
        format!("{:?}", String::from_utf8_lossy(&tokenizer.token_bytes(id)))
    };
    for id in 0..draft_size.max(target_size) as u32 {
        let (in_draft, in_target) = ((id as usize) < draft_size, (id as usize) < target_size);
        let same = in_draft && in_target && draft.token_bytes(id) == target.token_bytes(id);
        if same {
            continue;
        }
        let describe = |tokenizer: &TextTokenizer, present: bool, size: usize| {
            if present {
                shown(tokenizer, id)
            } else {
                format!("nothing (its vocabulary ends at {size} tokens)")
            }
        };
        return Err(format!(
            "the draft model's vocabulary differs from the model's at token {id}: {} in the draft, {} in the model; a draft must have the same vocabulary",
            describe(draft, in_draft, draft_size),
            describe(target, in_target, target_size)
        ));
    }
    Ok(())
}
