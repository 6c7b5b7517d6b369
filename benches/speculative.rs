//! Decode speed at batch 1 with and without speculative decoding (method `ngram`, prompt
//! lookup, and method `draft`, a draft model), on the CPU device with every layer streamed over
//! an emulated link (`--offload sequential --link-bandwidth`), greedy, one run each in one
//! process. The prompt asks the model to repeat a code block with one change, so proposals
//! copied from the prompt are often right; `--prose` asks for an explanation instead (little to
//! copy, where a draft model still proposes). Prints a markdown table: decode tokens per second
//! (after the first token), bytes streamed per step, the link bound (link rate / streamed bytes
//! per token without speculation), the acceptance rate and the replies' agreement.
//!
//! The draft (`--draft`, default the default model, resident) is meant to be a smaller model
//! with the model's vocabulary: with only the default model at hand, serve it in f32 as the
//! model (`--dtype f32`: 6.6x the bytes of its Q4_1 file, streamed) and let the Q4_1 file draft.
//!
//! Usage: cargo bench --bench speculative -- [--model PATH] [--dtype f32] [--draft PATH]
//! [--link 8GB/s] [--tokens N] [--prose]

mod common;

use std::sync::Arc;
use std::time::Instant;

use candle_core::Device;
use clap::Parser;
use common::ModelArgs;
use ferry::config::settings::DEFAULT_MODEL_SOURCE;
use ferry::config::values::{Bandwidth, Codec};
use ferry::config::{
    DeviceChoice, DeviceConfig, MemoryBudget, ModelConfig, OffloadConfig, OffloadMode,
    SpeculativeMethod, TierChoice,
};
use ferry::engine::{
    Backend, ChatMessage, EngineHandle, EngineOptions, GenerationEvent, GenerationParams,
    GenerationRequest, TextCodec,
};
use ferry::metrics::Metrics;
use ferry::model::source::HubOptions;
use ferry::runtime::load::load_for_serving_on;

/// `cargo bench --bench speculative -- [OPTIONS]`.
#[derive(Parser)]
struct Options {
    #[command(flatten)]
    model: ModelArgs,
    /// The emulated link's rate.
    #[arg(long, default_value = "8GB/s", value_parser = link_rate)]
    link: u64,
    /// Tokens generated per run.
    #[arg(long, default_value_t = 160)]
    tokens: usize,
    /// Most tokens proposed per step.
    #[arg(long, default_value_t = 6)]
    proposals: usize,
    /// The draft model of method `draft` (a source; default the default model).
    #[arg(long, default_value = DEFAULT_MODEL_SOURCE)]
    draft: String,
    /// Ask for an explanation (little to copy) instead of an edited copy of the code.
    #[arg(long)]
    prose: bool,
}

const PROMPT: &str = "Repeat the following Python code exactly, but rename the function `mean` to `average`. Reply with the code only.\n\n```python\ndef mean(values):\n    if not values:\n        raise ValueError(\"no values\")\n    total = 0.0\n    for value in values:\n        total += value\n    return total / len(values)\n\n\ndef variance(values):\n    m = mean(values)\n    return sum((v - m) ** 2 for v in values) / len(values)\n```";

const PROSE: &str = "Explain in a few paragraphs how a hash map works, how it handles collisions, and when its lookups stop being constant time.";

/// A rate as the `link_bandwidth` setting takes it (`8GB/s`), in bytes per second.
fn link_rate(text: &str) -> Result<u64, String> {
    Bandwidth::parse(text)?.ok_or_else(|| format!("`{text}` sets no rate"))
}

/// One run's measurements.
struct Run {
    reply: Vec<u32>,
    tokens_per_second: f64,
    /// Bytes streamed per generated token (the prompt's step included).
    bytes_per_token: f64,
    acceptance: Option<f64>,
    /// The draft model's bytes on the device (method `draft`).
    draft_bytes: Option<u64>,
}

fn run(options: &Options, method: SpeculativeMethod) -> Result<Run, String> {
    let mut config = ModelConfig {
        name: "bench".to_string(),
        source: options.model.source.clone(),
        dtype: options.model.dtype,
        max_context: Some(1024),
        max_batch: Some(1),
        offload: OffloadConfig {
            mode: OffloadMode::Sequential,
            gpu_memory: MemoryBudget::FractionOfFree(0.9),
            prefetch: 2,
            keep_alive: std::time::Duration::from_secs(60),
        },
        ..ModelConfig::default()
    };
    // Every layer crosses the emulated link, as on a GPU: on the CPU device the tier cost model
    // would rightly compute the offloaded layers where they already are (no crossing at all).
    config.tier.choice = TierChoice::Stream;
    config.speculative.method = method;
    config.speculative.tokens = options.proposals;
    if method == SpeculativeMethod::Draft {
        config.speculative.draft = Some(options.draft.clone());
    }
    let device = DeviceConfig {
        kind: DeviceChoice::Cpu,
        link_bandwidth: Some(options.link),
        ..DeviceConfig::default()
    };
    let hub = HubOptions::from_env(|_| None);
    let loaded =
        load_for_serving_on(&config, &device, &Device::Cpu, &hub).map_err(|e| e.to_string())?;
    let accounting = Arc::clone(loaded.runner.store().accounting());
    let draft_bytes = loaded
        .runner
        .draft()
        .map(|d| d.store().accounting().snapshot().weights);
    let metrics = Metrics::new();
    let engine = EngineHandle::with_options(
        ["bench"],
        EngineOptions {
            max_batch: 1,
            metrics: metrics.clone(),
            ..EngineOptions::default()
        },
    );
    engine
        .model_ready("bench", loaded.runner, loaded.codec as Arc<dyn TextCodec>)
        .map_err(|e| e.to_string())?;
    let messages = [ChatMessage {
        role: "user".into(),
        content: if options.prose { PROSE } else { PROMPT }.into(),
        ..ChatMessage::default()
    }];
    let prompt = engine
        .encode_chat("bench", &messages, true, false)
        .map_err(|e| e.to_string())?;
    let mut params = GenerationParams {
        max_tokens: options.tokens,
        ignore_eos: true,
        ..GenerationParams::default()
    };
    params.sampling.temperature = 0.0;
    let before = accounting.snapshot();
    let mut events = engine
        .submit(GenerationRequest {
            cache_partition: None,
            model: "bench".into(),
            prompt,
            params,
        })
        .map_err(|e| e.to_string())?;
    let mut reply = Vec::new();
    let mut first = None;
    let mut last = Instant::now();
    while let Some(event) = events.blocking_recv() {
        match event {
            GenerationEvent::Token(t) => {
                reply.push(t.token_id);
                last = Instant::now();
                first.get_or_insert(last);
            }
            GenerationEvent::Finished { .. } => break,
            GenerationEvent::Failed(err) => return Err(err.to_string()),
        }
    }
    let after = accounting.snapshot();
    let first = first.ok_or("no token")?;
    let tokens_per_second = (reply.len() - 1) as f64 / (last - first).as_secs_f64();
    let (drafted, accepted) = metrics.speculation_counts("bench");
    Ok(Run {
        tokens_per_second,
        bytes_per_token: after.bytes_copied.saturating_sub(before.bytes_copied) as f64
            / reply.len() as f64,
        acceptance: (drafted > 0).then(|| accepted as f64 / drafted as f64),
        draft_bytes,
        reply,
    })
}

fn main() -> Result<(), String> {
    let options = Options::parse();
    let plain = run(&options, SpeculativeMethod::None)?;
    let fast = run(&options, SpeculativeMethod::Ngram)?;
    let drafted = run(&options, SpeculativeMethod::Draft)?;
    // Without speculation every step streams every layer for one token: the link's cap.
    let bound = options.link as f64 / plain.bytes_per_token;
    println!(
        "| run | decode tok/s | MB streamed per token | acceptance | x plain | x link bound |"
    );
    println!("|---|---|---|---|---|---|");
    for (name, r) in [("none", &plain), ("ngram", &fast), ("draft", &drafted)] {
        println!(
            "| {name} | {:.1} | {:.1} | {} | {:.2} | {:.2} |",
            r.tokens_per_second,
            r.bytes_per_token / 1e6,
            r.acceptance.map_or("-".into(), |a| format!("{a:.2}")),
            r.tokens_per_second / plain.tokens_per_second,
            r.tokens_per_second / bound,
        );
    }
    println!(
        "\nlink {:.1} GB/s, link bound {bound:.1} tok/s, up to {} proposals, {} tokens; replies identical: ngram {}, draft {}",
        options.link as f64 / 1e9,
        options.proposals,
        options.tokens,
        fast.reply == plain.reply,
        drafted.reply == plain.reply,
    );
    if let Some(bytes) = drafted.draft_bytes {
        println!(
            "draft weights {:.1} MB resident; the model streams {:.1} MB per step ({:.1}x)",
            bytes as f64 / 1e6,
            plain.bytes_per_token / 1e6,
            plain.bytes_per_token / bytes as f64
        );
    }
    Ok(())
}
