//! Prefill and decode throughput of ferry's model path on one GGUF (default: the embedded
//! SmolLM2-135M-Instruct Q4_1), greedy, batch 1, printed as one JSON line per run so
//! `benches/compare-llama-cpp.sh` can set it beside llama.cpp on the same file and threads.
//!
//! Usage: cargo bench --bench decode -- [OPTIONS] (`-- --help` lists them).
//! Threads: candle's CPU kernels use RAYON_NUM_THREADS (set it to compare at a fixed count).

mod common;

use std::time::Instant;

use clap::Parser;
use common::ModelArgs;
use ferry::config::values::{Codec, Dtype};
use ferry::config::{DtypeChoice, MemoryBudget, ModelConfig, OffloadConfig, OffloadMode};
use ferry::engine::sampling::argmax;
use ferry::engine::traits::{LanguageModel, TextCodec};
use ferry::model::source::HubOptions;
use ferry::runtime::load::load_for_serving;

/// `cargo bench --bench decode -- [OPTIONS]`.
#[derive(Parser)]
struct Options {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    /// Tokens generated per run.
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Runs (one JSON line each).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// KV cache dtype, as the `kv_dtype` setting takes it (auto, f32, f16, bf16).
    #[arg(long, default_value = "auto", value_parser = Dtype::parse)]
    kv_dtype: DtypeChoice,
}

fn main() -> Result<(), String> {
    let options = Options::parse();
    let config = ModelConfig {
        name: "bench".to_string(),
        source: options.model.source.clone(),
        dtype: options.model.dtype,
        max_context: None,
        max_batch: Some(1),
        kv_dtype: options.kv_dtype,
        offload: OffloadConfig {
            mode: OffloadMode::None,
            gpu_memory: MemoryBudget::FractionOfFree(0.9),
            prefetch: 0,
            keep_alive: std::time::Duration::from_secs(0),
        },
        ..ModelConfig::default()
    };
    let hub = HubOptions::from_env(|key| std::env::var(key).ok());
    let load_started = Instant::now();
    let loaded =
        load_for_serving(&config, &candle_core::Device::Cpu, &hub).map_err(|e| e.to_string())?;
    // Load-to-ready (plan, weights, tokenizer) and the resident set right after it (no KV yet).
    let load_seconds = load_started.elapsed().as_secs_f64();
    let rss_after_load = resident_bytes();
    let mut runner = loaded.runner;

    // A prompt of exactly `prompt_tokens` ids: a plain English passage, repeated as needed.
    let passage = "The ferry crossed the wide grey river every morning, carrying farmers, \
                   teachers and children to the market town on the other side. ";
    let mut prompt = Vec::new();
    while prompt.len() < options.prompt_tokens {
        prompt.extend(
            loaded
                .codec
                .encode(passage, false)
                .map_err(|e| e.to_string())?,
        );
    }
    prompt.truncate(options.prompt_tokens);

    for run in 0..options.runs {
        let mut sequence = runner.new_sequence();
        let started = Instant::now();
        let logits = runner
            .forward(&mut sequence, &prompt)
            .map_err(|e| e.to_string())?;
        let prefill_seconds = started.elapsed().as_secs_f64();
        let mut next = argmax(&logits);
        let decode_started = Instant::now();
        for _ in 0..options.gen_tokens {
            let logits = runner
                .forward(&mut sequence, &[next])
                .map_err(|e| e.to_string())?;
            next = argmax(&logits);
        }
        let decode_seconds = decode_started.elapsed().as_secs_f64();
        println!(
            "{{\"engine\":\"ferry\",\"run\":{run},\"prompt_tokens\":{},\"gen_tokens\":{},\"prefill_tok_s\":{:.2},\"decode_tok_s\":{:.2},\"load_s\":{load_seconds:.4},\"rss_after_load\":{rss_after_load},\"prompt_ids\":{:?}}}",
            prompt.len(),
            options.gen_tokens,
            prompt.len() as f64 / prefill_seconds,
            options.gen_tokens as f64 / decode_seconds,
            if run == 0 { prompt.clone() } else { Vec::new() },
        );
    }
    Ok(())
}

/// The process's resident set in bytes (`VmRSS` of /proc/self/status; 0 where there is none).
fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(0)
}
