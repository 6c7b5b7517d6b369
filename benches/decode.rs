//! Prefill and decode throughput of ferry's model path on one GGUF (default: the embedded
//! SmolLM2-135M-Instruct Q4_1), greedy, batch 1, printed as one JSON line per run so
//! `benches/compare-llama-cpp.sh` can set it beside llama.cpp on the same file and threads.
//!
//! Usage: cargo bench --bench decode -- [--model PATH] [--kv-dtype auto|f32|f16|bf16]
//!        [--prompt-tokens N] [--gen-tokens N] [--runs N]
//! Threads: candle's CPU kernels use RAYON_NUM_THREADS (set it to compare at a fixed count).

use std::time::Instant;

use ferry::config::{DtypeChoice, MemoryBudget, ModelConfig, OffloadConfig, OffloadMode};
use ferry::engine::traits::{LanguageModel, TextCodec};
use ferry::model::source::HubOptions;
use ferry::runtime::load::load_for_serving;

struct Options {
    model: String,
    dtype: DtypeChoice,
    kv_dtype: DtypeChoice,
    prompt_tokens: usize,
    gen_tokens: usize,
    runs: usize,
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        model: "models/SmolLM2-135M-Instruct.Q4_1.gguf".to_string(),
        dtype: DtypeChoice::Auto,
        kv_dtype: DtypeChoice::Auto,
        prompt_tokens: 128,
        gen_tokens: 128,
        runs: 3,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--model" => options.model = value()?,
            "--dtype" => {
                options.dtype = match value()?.as_str() {
                    "f32" => DtypeChoice::F32,
                    "auto" => DtypeChoice::Auto,
                    other => return Err(format!("unsupported --dtype {other}")),
                }
            }
            "--kv-dtype" => {
                options.kv_dtype = match value()?.as_str() {
                    "auto" => DtypeChoice::Auto,
                    "f32" => DtypeChoice::F32,
                    "f16" => DtypeChoice::F16,
                    "bf16" => DtypeChoice::BF16,
                    other => return Err(format!("unsupported --kv-dtype {other}")),
                }
            }
            "--prompt-tokens" => options.prompt_tokens = parse(&value()?)?,
            "--gen-tokens" => options.gen_tokens = parse(&value()?)?,
            "--runs" => options.runs = parse(&value()?)?,
            "--bench" => {} // cargo bench passes this through
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(options)
}

fn parse(text: &str) -> Result<usize, String> {
    text.parse()
        .map_err(|_| format!("`{text}` is not a number"))
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, value) in logits.iter().enumerate() {
        if *value > logits[best] {
            best = i;
        }
    }
    best as u32
}

fn main() -> Result<(), String> {
    let options = parse_args()?;
    let config = ModelConfig {
        name: "bench".to_string(),
        source: options.model.clone(),
        dtype: options.dtype,
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
    let loaded =
        load_for_serving(&config, &candle_core::Device::Cpu, &hub).map_err(|e| e.to_string())?;
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
            "{{\"engine\":\"ferry\",\"run\":{run},\"prompt_tokens\":{},\"gen_tokens\":{},\"prefill_tok_s\":{:.2},\"decode_tok_s\":{:.2},\"prompt_ids\":{:?}}}",
            prompt.len(),
            options.gen_tokens,
            prompt.len() as f64 / prefill_seconds,
            options.gen_tokens as f64 / decode_seconds,
            if run == 0 { prompt.clone() } else { Vec::new() },
        );
    }
    Ok(())
}
