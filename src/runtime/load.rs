//! Brings one configured model up: source -> local files -> checkpoint (every header parsed
//! once) -> placement plan -> tokenizer + weights (resident on the device or offloaded to the
//! host and streamed, as the plan says), reporting progress as a bar on a terminal and as log
//! lines otherwise. With speculative method `draft`, the draft model loads after the model, every
//! layer of it resident, once its vocabulary is checked against the model's ([`super::draft`]).

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Instant;

use candle_core::Device;
use indicatif::{ProgressBar, ProgressStyle};

use super::adapters::{ModelRunner, TokenizerCodec};
use super::device::free_bytes;
use super::draft::{load_draft, open_draft, DraftPlan};
use super::load_report::log_loaded;
use super::planning::{open_checkpoint, plan_with_draft};
use super::RuntimeError;
use ferry_config::{DeviceConfig, ModelConfig, OffloadMode, ReasoningChoice, SpeculativeMethod};
use ferry_engine::{SamplingParams, Speculation, SpeculationMethod};
use ferry_model::checkpoint::Checkpoint;
use ferry_model::generation_defaults::recommended_sampling;
use ferry_model::kv_cache::HostKvRates;
use ferry_model::loader::{LoadOptions, LoadProgress};
use ferry_model::pooling::{Pooling, PoolingOrigin};
use ferry_model::source::{HubOptions, ModelFiles};
use ferry_model::tokenizer::{TemplateOrigin, TextTokenizer};
use ferry_model::ModelError;
use ferry_offload::cost::{CostModel, Tier};
use ferry_offload::plan::{mode_name, Plan};
use ferry_offload::store::LayerTiers;
use ferry_offload::{load_parked, load_placed, Accounting, StreamConfig, SwapConfig, SwapManager};

/// A model ready to hand to the engine.
pub struct LoadedForServing {
    /// Model + resident layers behind `LanguageModel`.
    pub runner: ModelRunner,
    /// Tokenizer + chat template behind `TextCodec`.
    pub codec: Arc<TokenizerCodec>,
}

/// Loads `config`'s model onto `device` with no link throttle. Blocking; call it from the engine
/// thread. See [`load_for_serving_on`].
pub fn load_for_serving(
    config: &ModelConfig,
    device: &Device,
    hub: &HubOptions,
) -> Result<LoadedForServing, RuntimeError> {
    load_for_serving_on(config, &DeviceConfig::default(), device, hub)
}

/// Loads `config`'s model onto `device`, placing it with the offload planner (`config.offload`:
/// mode, budget, prefetch) and streaming offloaded layers through a copy engine throttled to
/// `device_config.link_bandwidth`. Mode `none` that does not fit the budget fails with the
/// planner's advice. Mode `model` gets a swap manager of its own, sized to this one model (a
/// server with several models shares one: [`load_for_serving_shared`]). Blocking; call it from
/// the engine thread.
pub fn load_for_serving_on(
    config: &ModelConfig,
    device_config: &DeviceConfig,
    device: &Device,
    hub: &HubOptions,
) -> Result<LoadedForServing, RuntimeError> {
    load_for_serving_shared(config, device_config, device, hub, None)
}

/// [`load_for_serving_on`], registering a mode-`model` model with the server's `swap` manager
/// (see `runtime::swap::swap_manager_for`). Other modes ignore `swap`.
pub fn load_for_serving_shared(
    config: &ModelConfig,
    device_config: &DeviceConfig,
    device: &Device,
    hub: &HubOptions,
    swap: Option<&Arc<SwapManager>>,
) -> Result<LoadedForServing, RuntimeError> {
    tracing::info!(model = %config.name, source = %config.source, "resolving model source");
    let checkpoint = open_checkpoint(config, hub)?;
    let draft_checkpoint = open_draft(config, hub)?;
    let free = free_bytes(device)?;
    let (plan, draft_plan) = plan_with_draft(
        config,
        device_config,
        device,
        (&checkpoint, draft_checkpoint.as_ref()),
        free,
    )?;
    let draft = draft_checkpoint.as_ref().zip(draft_plan.as_ref());
    let loaded = load_planned(
        config,
        device_config,
        device,
        Planned {
            checkpoint: &checkpoint,
            plan: &plan,
            draft,
        },
        None,
        swap,
    )?;
    release_after_load(checkpoint);
    if let Some(draft) = draft_checkpoint {
        release_after_load(draft);
    }
    Ok(loaded)
}

/// Drops `checkpoint` once its model is loaded and gives back to the OS what loading freed (the
/// header's metadata, the tokenizer's build tables: megabytes glibc would keep in its heaps), on
/// a thread of its own so neither is part of the load's time.
pub fn release_after_load(checkpoint: Checkpoint) {
    let release = move || {
        drop(checkpoint);
        ferry_server::limits::release_freed_memory();
    };
    if let Err(err) = std::thread::Builder::new()
        .name("ferry-release".into())
        .spawn(release)
    {
        tracing::debug!(error = %err, "no thread to release the load's memory");
    }
}

/// A model opened and planned: its checkpoint, its plan, and its draft's (method `draft`).
#[derive(Clone, Copy)]
pub struct Planned<'a> {
    /// The model's opened checkpoint.
    pub checkpoint: &'a Checkpoint,
    /// Its placement.
    pub plan: &'a Plan,
    /// The draft model's checkpoint and plan.
    pub draft: Option<(&'a Checkpoint, &'a DraftPlan)>,
}

/// Loads a model `serve` has already opened and planned (`runtime::device_plan`): the same
/// checkpoint (no second header parse) and exactly the plan `ferry plan` shows. `cost` is the
/// plan's calibrated cost model (`ModelPlan::tiers`), which decides where offloaded experts run
/// each step (`None`: the expert store's own rule).
pub fn load_planned(
    config: &ModelConfig,
    device_config: &DeviceConfig,
    device: &Device,
    planned: Planned<'_>,
    cost: Option<CostModel>,
    swap: Option<&Arc<SwapManager>>,
) -> Result<LoadedForServing, RuntimeError> {
    let Planned {
        checkpoint,
        plan,
        draft,
    } = planned;
    let started = Instant::now();
    let wrap = |source: ModelError| RuntimeError::Model {
        name: config.name.clone(),
        source,
    };
    if config.speculative.method == SpeculativeMethod::Draft && draft.is_none() {
        return Err(RuntimeError::Placement(format!(
            "model `{}`: speculative method `draft` without a planned draft model",
            config.name
        )));
    }
    if config.verify_weights {
        ferry_model::verify::verify_weights(checkpoint).map_err(wrap)?;
        tracing::info!(
            model = %config.name,
            seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
            "weights verified: every float value and block scale is finite"
        );
    }
    // The tokenizer (tens of thousands of merges) builds on its own thread while the weights load.
    std::thread::scope(|scope| {
        let tokenizer = scope.spawn(|| load_tokenizer(config, checkpoint));
        let mut runner = load_runner(config, device_config, device, swap, checkpoint, plan)?
            .with_pooling(pooling_of(config, checkpoint))
            .with_speculation(speculation_of(config));
        // A host KV cache is attended where the calibrated rates say a step costs less.
        runner.set_host_kv_rates(cost.filter(|_| plan.kv_host).map(|c| HostKvRates {
            link_bytes_per_s: c.link_bytes_per_s,
            host_read_bytes_per_s: c.host_read_bytes_per_s,
            host_flops_per_s: c.host_flops_per_s,
        }));
        if let Some(experts) = runner.store().experts() {
            experts.set_tier(config.tier.choice);
            experts.set_cost_model(cost);
        }
        // Offloaded dense layers: host or stream per step, by the same cost model.
        let spec = runner.model().spec();
        let tiers = LayerTiers {
            cost,
            forced: Tier::forced_by(config.tier.choice),
        };
        runner
            .store()
            .set_layer_tiers(tiers, spec.moe.as_ref(), spec.hidden_size)
            .map_err(|source| RuntimeError::Offload {
                name: config.name.clone(),
                source,
            })?;
        let tokenizer = tokenizer
            .join()
            .map_err(|_| {
                wrap(ModelError::Tokenizer(
                    "the tokenizer builder panicked".into(),
                ))
            })?
            .map_err(wrap)?;
        if let Some((draft_checkpoint, draft_plan)) = draft {
            let vocab = runner.model().spec().vocab_size;
            let draft = load_draft(draft_plan, draft_checkpoint, device, &tokenizer, vocab)?;
            tracing::info!(
                model = %config.name,
                draft = %draft_plan.config.source,
                device_mib = draft_plan.device_bytes() >> 20,
                max_context = draft_plan.plan.max_context,
                "speculative draft model loaded, every layer on the device"
            );
            runner = runner.with_draft(draft);
        }
        log_loaded(config, &runner, checkpoint, plan, &tokenizer, started);
        let sampling = sampling_defaults(config, checkpoint).map_err(wrap)?;
        Ok(LoadedForServing {
            runner,
            codec: TokenizerCodec::new(
                tokenizer,
                sampling,
                config.reasoning_format == ReasoningChoice::Auto,
            ),
        })
    })
}

/// The engine's speculation for `config` (`models[].speculative`).
pub fn speculation_of(config: &ModelConfig) -> Speculation {
    let method = match config.speculative.method {
        SpeculativeMethod::None => SpeculationMethod::Off,
        SpeculativeMethod::Draft => SpeculationMethod::Draft,
        SpeculativeMethod::Ngram => SpeculationMethod::Ngram,
    };
    Speculation {
        method,
        max_tokens: config.speculative.tokens,
    }
}

/// How `checkpoint`'s embeddings pool (logged), or why it gives none (a warning).
fn pooling_of(config: &ModelConfig, checkpoint: &Checkpoint) -> Result<Pooling, String> {
    match Pooling::of_checkpoint(checkpoint) {
        Ok((pooling, origin)) => {
            let origin = match origin {
                PoolingOrigin::Gguf => "the GGUF's pooling_type",
                PoolingOrigin::SentenceTransformers => "1_Pooling/config.json",
                PoolingOrigin::Default => "the default for a decoder LM",
            };
            tracing::debug!(model = %config.name, pooling = pooling.name(), origin, "embeddings");
            Ok(pooling)
        }
        Err(err) => {
            tracing::warn!(model = %config.name, reason = %err, "this model gives no embeddings");
            Err(err.to_string())
        }
    }
}

/// Loads the weights as `plan` places them: resident, streamed or parked for swapping.
fn load_runner(
    config: &ModelConfig,
    device_config: &DeviceConfig,
    device: &Device,
    swap: Option<&Arc<SwapManager>>,
    checkpoint: &Checkpoint,
    plan: &Plan,
) -> Result<ModelRunner, RuntimeError> {
    let options = LoadOptions {
        device: device.clone(),
        dtype: config.dtype,
    };
    tracing::info!(
        model = %config.name,
        mode = mode_name(plan.mode),
        device_layers = plan.device_layers(),
        host_layers = plan.host_layers(),
        slots = plan.slots,
        max_context = plan.max_context,
        max_batch = plan.max_batch,
        kv_dtype = plan.kv_dtype.as_str(),
        "placement planned"
    );
    let stream = StreamConfig {
        prefetch: config.offload.prefetch,
        link_bandwidth: device_config.link_bandwidth,
    };
    let mut progress = ProgressReporter::new(&config.name);
    if config.offload.mode == OffloadMode::Model {
        return load_swapped(
            config,
            device_config,
            &options,
            checkpoint,
            plan,
            swap,
            &mut progress,
        );
    }
    let mut placed = load_placed(checkpoint, &options, plan, stream, &mut |p| {
        progress.update(&p)
    })
    .map_err(|e| RuntimeError::Offload {
        name: config.name.clone(),
        source: e,
    })?;
    progress.finish();
    placed.store.accounting().log(&config.name, plan);
    // The KV cache the plan sized: its context (fitted or set) and dtype.
    placed.model.set_kv_dtype(plan.kv_dtype);
    placed.model.set_kv_host(plan.kv_host);
    Ok(ModelRunner::new(
        placed.model,
        placed.store,
        Some(plan.max_context),
    ))
}

/// Mode `model`: fixed parts resident, every layer parked on the host and registered with the
/// swap manager (the server's, or one of its own sized to this model).
fn load_swapped(
    config: &ModelConfig,
    device_config: &DeviceConfig,
    options: &LoadOptions,
    checkpoint: &Checkpoint,
    plan: &Plan,
    swap: Option<&Arc<SwapManager>>,
    progress: &mut ProgressReporter,
) -> Result<ModelRunner, RuntimeError> {
    let wrap = |source| RuntimeError::Offload {
        name: config.name.clone(),
        source,
    };
    let mut parked =
        load_parked(checkpoint, options, &mut |p| progress.update(&p)).map_err(wrap)?;
    parked.model.set_kv_dtype(plan.kv_dtype);
    parked.model.set_kv_host(plan.kv_host);
    progress.finish();
    let accounting = Arc::new(Accounting::new(plan));
    accounting.add_weights(parked.fixed_bytes);
    let host = Arc::new(parked.host);
    let manager = match swap {
        Some(manager) => manager.clone(),
        None => SwapManager::new(SwapConfig {
            budget_bytes: host
                .layers()
                .iter()
                .map(|l| (l.blocks_len + l.dense_len) as u64)
                .sum(),
            link_bandwidth: device_config.link_bandwidth,
            wait_timeout: super::swap::DEFAULT_SWAP_WAIT,
        })
        .map_err(wrap)?,
    };
    let client = manager
        .register(
            &config.name,
            host,
            &options.device,
            config.offload.keep_alive,
            Some(accounting.clone()),
        )
        .map_err(wrap)?;
    accounting.log(&config.name, plan);
    Ok(ModelRunner::swapped(
        parked.model,
        accounting,
        manager,
        client,
        Some(plan.max_context),
    ))
}

/// The tokenizer from the GGUF metadata (already parsed with the checkpoint) or the HF
/// tokenizer files, with its chat template settled: `config.chat_template`, else the model's,
/// else a built-in one (one warning naming it).
fn load_tokenizer(
    config: &ModelConfig,
    checkpoint: &Checkpoint,
) -> Result<TextTokenizer, ModelError> {
    let mut tokenizer = read_tokenizer(checkpoint)?;
    let architecture = checkpoint.spec().architecture;
    match tokenizer.settle_chat_template(config.chat_template.as_ref(), architecture)? {
        TemplateOrigin::Model => {}
        TemplateOrigin::Configured => tracing::info!(
            model = %config.name,
            "chat template from the chat_template setting"
        ),
        TemplateOrigin::Builtin(builtin) => tracing::warn!(
            model = %config.name,
            template = builtin.name(),
            "the model has no chat template; chats use ferry's built-in {} template (set \
             chat_template to choose another)",
            builtin.name()
        ),
    }
    Ok(tokenizer)
}

/// What requests that name no sampling values get: the model's settings, else what its files
/// recommend, else llama.cpp's defaults (logged with the origin of each).
fn sampling_defaults(
    config: &ModelConfig,
    checkpoint: &Checkpoint,
) -> Result<SamplingParams, ModelError> {
    let recommended = recommended_sampling(checkpoint)?;
    let resolved = ferry_config::sampling::resolve(&config.sampling, &recommended);
    tracing::info!(
        model = %config.name,
        "sampling defaults for requests that send none: {}",
        resolved.describe()
    );
    let v = resolved.values;
    Ok(SamplingParams {
        temperature: v.temperature,
        top_p: v.top_p,
        top_k: v.top_k,
        min_p: v.min_p,
        repetition_penalty: v.repetition_penalty,
        ..SamplingParams::default()
    })
}

/// The tokenizer as the model's files describe it.
pub(super) fn read_tokenizer(checkpoint: &Checkpoint) -> Result<TextTokenizer, ModelError> {
    match checkpoint.files() {
        ModelFiles::Gguf { .. } => {
            let metadata = checkpoint
                .gguf_metadata()
                .ok_or_else(|| ModelError::Source("the GGUF header is missing".into()))?;
            TextTokenizer::from_gguf_metadata(metadata)
        }
        ModelFiles::HfDir {
            tokenizer,
            tokenizer_config,
            generation_config,
            ..
        } => TextTokenizer::from_hf_files(
            tokenizer,
            tokenizer_config.as_deref(),
            generation_config.as_deref(),
        ),
    }
}

/// Shows load progress: a byte bar on a terminal, otherwise a log line every 10%.
struct ProgressReporter {
    name: String,
    bar: Option<ProgressBar>,
    next_logged_percent: u64,
}

impl ProgressReporter {
    fn new(name: &str) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(0);
            if let Ok(style) = ProgressStyle::with_template(
                "{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, eta {eta})",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_message(format!("loading {name}"));
            bar
        });
        Self {
            name: name.to_string(),
            bar,
            next_logged_percent: 10,
        }
    }

    fn update(&mut self, progress: &LoadProgress) {
        if let Some(bar) = &self.bar {
            bar.set_length(progress.total_bytes);
            bar.set_position(progress.done_bytes);
            return;
        }
        if progress.total_bytes == 0 {
            return;
        }
        let percent = progress.done_bytes.saturating_mul(100) / progress.total_bytes;
        if percent >= self.next_logged_percent {
            tracing::info!(
                model = %self.name,
                "loading weights: {percent}% ({} of {} MiB)",
                progress.done_bytes >> 20,
                progress.total_bytes >> 20
            );
            self.next_logged_percent = (percent / 10 + 1) * 10;
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
