//! `n` choices of one request against `n` independent requests, on the real engine: a
//! 901-token prompt, 4 choices of 8 greedy tokens each. One request of `n = 4` prefills the prompt
//! once and copies its KV cache to the other choices; four requests prefill it four times.
//! Prints a markdown table: wall time to the first token of every choice, to the end, and the
//! prompt tokens the model computed (`ferry_prompt_tokens_total`).
//!
//! Usage: cargo bench --profile dev --bench shared_prefill -- [--model PATH] [--dtype D] [--choices N]

mod common;
#[path = "common/engine.rs"]
mod engine_common;

use std::time::{Duration, Instant};

use clap::Parser;
use common::ModelArgs;
use engine_common::cpu_engine;
use ferry::config::OffloadMode;
use ferry::engine::{Backend, EngineHandle, GenerationEvent, GenerationParams, GenerationRequest};
use ferry::metrics::Metrics;
use tokio::sync::mpsc::Receiver;

/// `cargo bench --profile dev --bench shared_prefill -- [OPTIONS]`.
#[derive(Parser)]
struct Options {
    #[command(flatten)]
    model: ModelArgs,
    /// Choices of the one request (and independent requests to compare with).
    #[arg(long, default_value_t = 4)]
    choices: usize,
}

fn engine(model: &ModelArgs, metrics: Metrics) -> Result<EngineHandle, String> {
    cpu_engine(model, 2048, (OffloadMode::None, 0), None, metrics)
}

/// Waits for every receiver: (latest first token, end) after `started`.
fn drain(
    receivers: Vec<Receiver<GenerationEvent>>,
    started: Instant,
) -> Result<(Duration, Duration), String> {
    let mut first = Duration::ZERO;
    for mut rx in receivers {
        let mut seen = false;
        while let Some(event) = rx.blocking_recv() {
            match event {
                GenerationEvent::Token(_) if !seen => {
                    seen = true;
                    first = first.max(started.elapsed());
                }
                GenerationEvent::Token(_) => {}
                GenerationEvent::Finished { .. } => break,
                GenerationEvent::Failed(err) => return Err(err.to_string()),
            }
        }
    }
    Ok((first, started.elapsed()))
}

fn main() -> Result<(), String> {
    let Options { model, choices } = Options::parse();
    let metrics = Metrics::new();
    let engine = engine(&model, metrics.clone())?;
    let text = "The ferry crossed the wide river at dawn, carrying travellers and their carts. "
        .repeat(60);
    let mut prompt = engine
        .tokenize("bench", &text, true)
        .map_err(|e| e.to_string())?;
    prompt.truncate(1000);
    let mut params = GenerationParams {
        max_tokens: 8,
        ignore_eos: true,
        ..GenerationParams::default()
    };
    params.sampling.temperature = 0.0;
    let request = GenerationRequest {
        cache_partition: None,
        model: "bench".to_string(),
        prompt,
        params,
    };
    // Warm-up.
    drain(
        vec![engine.submit(request.clone()).map_err(|e| e.to_string())?],
        Instant::now(),
    )?;

    let tokens = request.prompt.len();
    println!("| {choices} choices of a {tokens}-token prompt | all first tokens | all done | prompt tokens computed |");
    println!("|---|---|---|---|");
    let before = metrics.prompt_tokens();
    let started = Instant::now();
    let receivers = engine
        .submit_choices(request.clone(), choices)
        .map_err(|e| e.to_string())?;
    let (first, done) = drain(receivers, started)?;
    println!(
        "| one request, n = {choices} (prefill once, KV copied) | {:.2} s | {:.2} s | {} |",
        first.as_secs_f64(),
        done.as_secs_f64(),
        metrics.prompt_tokens() - before
    );
    let before = metrics.prompt_tokens();
    let started = Instant::now();
    let receivers = (0..choices)
        .map(|i| engine.submit(request.for_choice(i)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let (first, done) = drain(receivers, started)?;
    println!(
        "| {choices} independent requests | {:.2} s | {:.2} s | {} |",
        first.as_secs_f64(),
        done.as_secs_f64(),
        metrics.prompt_tokens() - before
    );
    Ok(())
}
