//! Aggregate decode throughput with 1, 4 and 8 concurrent requests through the real engine
//! (continuous batching), (a) with every layer resident and (b) in mode `sequential` with the
//! CPU copy engine throttled so that copying weights dominates a step. In (b) one copy of each
//! layer serves the whole batch, so the aggregate at 8 should approach 8x the single-request
//! rate. Prints a markdown table with the ratios.
//!
//! Usage: cargo bench --bench batch_throughput -- [OPTIONS] (`-- --help` lists them).

mod common;
#[path = "common/engine.rs"]
mod engine_common;

use std::time::Instant;

use clap::Parser;
use common::ModelArgs;
use engine_common::cpu_engine;
use ferry::config::OffloadMode;
use ferry::engine::{Backend, EngineHandle, GenerationEvent, GenerationParams, GenerationRequest};
use ferry::metrics::Metrics;

/// `cargo bench --bench batch_throughput -- [OPTIONS]`.
#[derive(Parser)]
struct Options {
    #[command(flatten)]
    model: ModelArgs,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 32)]
    tokens: usize,
    /// The emulated link's bandwidth in the streamed case, bytes/s.
    #[arg(long, default_value_t = 400_000_000)]
    link: u64,
}

/// An engine serving the model in `mode` with batches of up to 8.
fn engine(options: &Options, mode: OffloadMode, link: Option<u64>) -> Result<EngineHandle, String> {
    cpu_engine(&options.model, 512, (mode, 2), link, Metrics::new())
}

/// Runs `n` concurrent requests of `tokens` tokens each; returns aggregate generated tokens/s.
fn aggregate_rate(engine: &EngineHandle, n: usize, tokens: usize) -> Result<f64, String> {
    let prompt = engine
        .tokenize("bench", "The ferry crossed the river at dawn and", true)
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut receivers = Vec::new();
    for _ in 0..n {
        let mut params = GenerationParams {
            max_tokens: tokens,
            ignore_eos: true,
            ..GenerationParams::default()
        };
        params.sampling.temperature = 0.0;
        receivers.push(
            engine
                .submit(GenerationRequest {
                    cache_partition: None,
                    model: "bench".to_string(),
                    prompt: prompt.clone(),
                    params,
                })
                .map_err(|e| e.to_string())?,
        );
    }
    let mut generated = 0;
    for mut events in receivers {
        while let Some(event) = events.blocking_recv() {
            match event {
                GenerationEvent::Token(_) => {}
                GenerationEvent::Finished { usage, .. } => {
                    generated += usage.completion_tokens;
                    break;
                }
                GenerationEvent::Failed(err) => return Err(err.to_string()),
            }
        }
    }
    Ok(generated as f64 / started.elapsed().as_secs_f64())
}

fn main() -> Result<(), String> {
    let options = Options::parse();
    let cases = [
        ("resident (none)", OffloadMode::None, None),
        (
            "sequential, link throttled",
            OffloadMode::Sequential,
            Some(options.link),
        ),
    ];
    println!("| mode | link | 1 req tok/s | 4 req tok/s | 8 req tok/s | 4 / 1 | 8 / 1 |");
    println!("|---|---|---|---|---|---|---|");
    for (label, mode, link) in cases {
        let engine = engine(&options, mode, link)?;
        aggregate_rate(&engine, 1, 4)?; // warm-up
        let rates: Vec<f64> = [1, 4, 8]
            .iter()
            .map(|&n| aggregate_rate(&engine, n, options.tokens))
            .collect::<Result<_, _>>()?;
        let link = link.map_or("-".to_string(), |b| format!("{:.0} MB/s", b as f64 / 1e6));
        println!(
            "| {label} | {link} | {:.1} | {:.1} | {:.1} | {:.2} | {:.2} |",
            rates[0],
            rates[1],
            rates[2],
            rates[1] / rates[0],
            rates[2] / rates[0]
        );
    }
    Ok(())
}
