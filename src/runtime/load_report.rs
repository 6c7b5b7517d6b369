//! The "model loaded" log line: what a newcomer needs to know about the model now serving. Its
//! weights' types and what multiplies them (`weights="q4_k matrices x169, 850 MiB, ferry CPU
//! kernels (avx2); ..."`: the file's quantized blocks, not the compute dtype, which is the
//! activations' and dense weights' `compute_dtype`), the chat template it renders prompts
//! with and where it came from, the markup its tool calls are read in (and whether the
//! template or ferry shows it the tools), and the offload tier its offloaded units run on.

use std::time::Instant;

use candle_core::Device;

use super::adapters::ModelRunner;
use ferry_config::{ModelConfig, OffloadMode, ReasoningChoice};
use ferry_engine::reasoning::ReasoningFormat;
use ferry_engine::tool_calls::ToolSupport;
use ferry_model::checkpoint::Checkpoint;
use ferry_model::loader::summary::weight_groups;
use ferry_model::loader::{Holding, LoadOptions};
use ferry_model::source::ModelFiles;
use ferry_model::tokenizer::chat_template::markup_family;
use ferry_model::tokenizer::TextTokenizer;
use ferry_offload::cost::Tier;
use ferry_offload::plan::Plan;
use ferry_offload::units::format_bytes;

/// Logs the line for `runner`, loaded from `checkpoint` as `plan` placed it, with `tokenizer`.
pub fn log_loaded(
    config: &ModelConfig,
    runner: &ModelRunner,
    checkpoint: &Checkpoint,
    plan: &Plan,
    tokenizer: &TextTokenizer,
    started: Instant,
) {
    let spec = runner.model().spec();
    let device = runner.model().device();
    let weights = weights(config, device, checkpoint);
    let chat_template = chat_template(checkpoint, tokenizer);
    let tool_calls = tool_calls(tokenizer);
    let reasoning = ReasoningFormat::settle(
        tokenizer.chat_template_source(),
        config.reasoning_format == ReasoningChoice::Auto,
    )
    .map_or(
        "none: replies are content as written",
        ReasoningFormat::name,
    );
    let experts_on_host = runner
        .store()
        .experts()
        .map(|e| e.computes_on_host() && e.host_experts() > 0);
    let offload_tier = offload_tier(config, device, plan, experts_on_host);
    tracing::info!(
        model = %config.name,
        architecture = ?spec.architecture,
        layers = spec.n_layers,
        hidden = spec.hidden_size,
        vocab = spec.vocab_size,
        context = ferry_engine::traits::LanguageModel::max_context(runner),
        compute_dtype = runner.model().dtype().as_str(),
        weights = weights.as_str(),
        chat_template = chat_template.as_str(),
        tool_calls = tool_calls.as_str(),
        reasoning,
        offload_tier = offload_tier.as_str(),
        seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
        "model loaded"
    );
}

/// `q4_k matrices x169, 850.0 MiB, ferry CPU kernels (avx2); f32 vectors x57, 0.2 MiB,
/// elementwise`.
fn weights(config: &ModelConfig, device: &Device, checkpoint: &Checkpoint) -> String {
    let options = LoadOptions {
        device: device.clone(),
        dtype: config.dtype,
    };
    let groups = Holding::new(checkpoint, &options)
        .and_then(|holding| weight_groups(checkpoint, &holding, device));
    match groups {
        Ok(groups) => groups
            .iter()
            .map(|g| {
                format!(
                    "{} {} x{}, {}, {}",
                    g.held,
                    g.role,
                    g.tensors,
                    format_bytes(g.bytes),
                    g.kernels
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
        Err(e) => format!("unknown ({e})"),
    }
}

/// `chatml, from the GGUF (tokenizer.chat_template)`, or what happens without one.
fn chat_template(checkpoint: &Checkpoint, tokenizer: &TextTokenizer) -> String {
    let Some(source) = tokenizer.chat_template_source() else {
        return "none: /v1/chat/completions is refused, use /v1/completions".into();
    };
    let from = match checkpoint.files() {
        ModelFiles::Gguf { .. } => "the GGUF (tokenizer.chat_template)",
        ModelFiles::HfDir { .. } => "tokenizer_config.json",
    };
    format!("{}, from {from}", markup_family(source))
}

/// `hermes markup, tools folded into the system message (the template does not render them)`.
fn tool_calls(tokenizer: &TextTokenizer) -> String {
    let support = ToolSupport::from_template(tokenizer.chat_template_source());
    let shown = if support.template_renders_tools {
        "tools rendered by the chat template"
    } else {
        "tools folded into the system message (the template does not render them)"
    };
    format!(
        "{} markup (fenced and bare JSON calls read too), {shown}",
        support.format.name()
    )
}

/// Where the offloaded units compute: nothing offloaded, the whole model swapped, a forced tier
/// or the cost model's choice per step. `experts_on_host`: the loaded expert store's offloaded
/// experts can all compute on the host (`None`: no expert store).
fn offload_tier(
    config: &ModelConfig,
    device: &Device,
    plan: &Plan,
    experts_on_host: Option<bool>,
) -> String {
    let offloaded = plan.host_layers() > 0 || (plan.experts.is_some() && plan.host_bytes > 0);
    if !offloaded {
        return "none: nothing is offloaded".into();
    }
    if plan.mode == OffloadMode::Model {
        return "none: mode model moves the whole model on and off the device".into();
    }
    match Tier::forced_by(config.tier.choice) {
        Some(tier) => format!("{} (offload.tier)", tier.name()),
        None if device.is_cpu() || experts_on_host == Some(true) && plan.host_layers() == 0 => {
            "auto: host or stream per step, by the calibrated cost model".into()
        }
        None if experts_on_host == Some(true) => "auto for the offloaded experts (host or stream \
             per step, by the calibrated cost model); the offloaded whole layers stream (no host \
             tier for whole layers on CUDA)"
            .into(),
        None if plan.experts.is_some() => "stream (the offloaded experts are held dense on \
             CUDA: ferry's CPU kernels compute only GGUF blocks in place)"
            .into(),
        None => "stream (no host tier for whole layers on CUDA: offload experts, \
             offload.experts, for one)"
            .into(),
    }
}
