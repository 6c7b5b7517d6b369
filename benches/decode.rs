//! Prefill and decode throughput of ferry's model path on one GGUF (default: the embedded
//! SmolLM2-135M-Instruct Q4_1), greedy, batch 1, printed as one JSON line per run so
//! `benches/compare-llama-cpp.sh` can set it beside llama.cpp on the same file and threads.
//! Each line also carries the load-to-ready time and the resident set after loading and after
//! the run's request (with the sequence and its KV cache still alive), split into file-backed
//! pages (the mapped weights, the binary) and anonymous memory (heap, stacks), and the bytes
//! the KV cache holds.
//!
//! Usage: cargo bench --bench decode -- [OPTIONS] (`-- --help` lists them).
//! Threads: candle's CPU kernels use RAYON_NUM_THREADS (set it to compare at a fixed count).

mod common;

use std::time::Instant;

use clap::Parser;
use common::ModelArgs;
use ferry::config::values::{Codec, Dtype, Kernels, PanelCache};
use ferry::config::{
    CpuQmatmul, DtypeChoice, MemoryBudget, ModelConfig, OffloadConfig, OffloadMode,
    PanelCacheChoice,
};
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
    /// KV cache dtype, as the `kv_dtype` setting takes it (auto, f32, f16, bf16, q8_0, q4_0).
    #[arg(long, default_value = "auto", value_parser = Dtype::parse)]
    kv_dtype: DtypeChoice,
    /// CPU kernels for quantized weights, as the `cpu_qmatmul` setting takes them (auto,
    /// avx512, avx-vnni, avx2, scalar, candle): `avx2` measures an AVX2-only CPU's path.
    #[arg(long, default_value = "auto", value_parser = Kernels::parse)]
    cpu_qmatmul: CpuQmatmul,
    /// Where k-quant, IQ4_XS, IQ4_NL, MXFP4, Q5_0 and Q5_1 panel layouts are cached, as the
    /// `panel_cache` setting takes it (auto, off or a folder): `off` measures a load that makes
    /// them.
    #[arg(long, default_value = "auto", value_parser = PanelCache::parse)]
    panel_cache: PanelCacheChoice,
}

fn main() -> Result<(), String> {
    let options = Options::parse();
    // The allocator settings `ferry serve` runs with, so the resident sets below are the server's.
    ferry::server::limits::tune_allocator();
    ferry::model::weights::set_cpu_qmatmul(options.cpu_qmatmul);
    ferry::model::loader::panel_cache::set_panel_cache(&options.panel_cache);
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
    let rss_after_load = Rss::now().total;
    // A first load writes the panel cache in the background: no run shares the CPU with it.
    ferry::model::loader::panel_cache::wait_for_panel_cache_writes();
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
        // After the request, with its KV cache still held.
        let rss = Rss::now();
        let (rss_model, rss_binary) = mapped_rss(&options.model.source);
        let kv_bytes = sequence.kv_bytes();
        let kv_stored_bytes = sequence.kv_stored_bytes();
        println!(
            "{{\"engine\":\"ferry\",\"run\":{run},\"prompt_tokens\":{},\"gen_tokens\":{},\"prefill_tok_s\":{:.2},\"decode_tok_s\":{:.2},\"load_s\":{load_seconds:.4},\"rss_after_load\":{rss_after_load},\"rss_after_request\":{},\"rss_file\":{},\"rss_anon\":{},\"rss_model\":{rss_model},\"rss_binary\":{rss_binary},\"kv_bytes\":{kv_bytes},\"kv_stored_bytes\":{kv_stored_bytes},\"prompt_ids\":{:?}}}",
            prompt.len(),
            options.gen_tokens,
            prompt.len() as f64 / prefill_seconds,
            options.gen_tokens as f64 / decode_seconds,
            rss.total,
            rss.file,
            rss.anon,
            if run == 0 { prompt.clone() } else { Vec::new() },
        );
    }
    Ok(())
}

/// The process's resident set (/proc/self/status; zeros where there is none): `VmRSS`, and
/// its file-backed (`RssFile`: mapped weights, the binary and its libraries) and anonymous
/// (`RssAnon`: heap, stacks) parts. (`RssShmem`, the third part, is not used here.)
struct Rss {
    total: u64,
    file: u64,
    anon: u64,
}

impl Rss {
    fn now() -> Self {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
                .map_or(0, |kib| kib * 1024)
        };
        Rss {
            total: field("VmRSS:"),
            file: field("RssFile:"),
            anon: field("RssAnon:"),
        }
    }
}

/// Resident bytes of the mappings of the model file at `model` and of this binary itself
/// (/proc/self/smaps; zeros where there is none): the weights' pages, and the floor no load can
/// cut (the binary's code and data).
fn mapped_rss(model: &str) -> (u64, u64) {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap_or_default();
    let model = std::fs::canonicalize(model).ok();
    let exe = std::env::current_exe().ok();
    let (mut in_model, mut in_exe) = (0u64, 0u64);
    let mut current: Option<std::path::PathBuf> = None;
    for line in smaps.lines() {
        if let Some(rest) = line.strip_prefix("Rss:") {
            let kib: u64 = rest
                .split_whitespace()
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            if current.is_some() && current == model {
                in_model += kib * 1024;
            } else if current.is_some() && current == exe {
                in_exe += kib * 1024;
            }
        } else if line
            .split_whitespace()
            .next()
            .is_some_and(|a| a.contains('-'))
        {
            // A mapping's header: `start-end perms offset dev inode [path]`.
            current = line
                .split_whitespace()
                .nth(5)
                .filter(|p| p.starts_with('/'))
                .map(std::path::PathBuf::from);
        }
    }
    (in_model, in_exe)
}
