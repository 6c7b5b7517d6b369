//! Time to first token of a chat's second turn with and without prefix caching, on the real
//! engine, in one run: a ~1,000-token shared prefix (a long system text and a first question),
//! the first turn's greedy reply, then a second question. With the cache, the second turn
//! starts from the first turn's prompt blocks and computes only the reply, the new question and
//! the tail of the last partial block; without it, the whole prompt is prefilled again. The
//! turns are built at the token level (prompt, reply and question ids concatenated), so any
//! model works. Each second turn asks a new question, so only the shared part can be reused.
//! Prints a markdown table: the median time to first token of the second turn over `--turns`
//! runs, and the prompt tokens computed per second turn (prompt less `cached_tokens`).
//!
//! Usage: cargo bench --profile dev --bench prefix_cache -- [--model PATH] [--dtype D] [--turns N]

mod common;
#[path = "common/engine.rs"]
mod engine_common;

use std::time::{Duration, Instant};

use clap::Parser;
use common::ModelArgs;
use engine_common::{cpu_engine, cpu_engine_with};
use ferry::config::OffloadMode;
use ferry::engine::{
    Backend, EngineHandle, EngineOptions, GenerationEvent, GenerationParams, GenerationRequest,
};
use ferry::metrics::Metrics;

/// `cargo bench --profile dev --bench prefix_cache -- [OPTIONS]`.
#[derive(Parser)]
struct Options {
    #[command(flatten)]
    model: ModelArgs,
    /// Second turns timed per engine (the median is printed).
    #[arg(long, default_value_t = 3)]
    turns: usize,
    /// Tokens of the shared prefix.
    #[arg(long, default_value_t = 1000)]
    prefix: usize,
}

/// One finished turn: its generated ids, time to first token and prompt tokens cached.
struct Turn {
    reply: Vec<u32>,
    first_token: Duration,
    cached: usize,
}

fn run(engine: &EngineHandle, prompt: Vec<u32>, max_tokens: usize) -> Result<Turn, String> {
    let mut params = GenerationParams {
        max_tokens,
        ..GenerationParams::default()
    };
    params.sampling.temperature = 0.0;
    let request = GenerationRequest {
        cache_partition: None,
        model: "bench".to_string(),
        prompt,
        params,
    };
    let started = Instant::now();
    let mut rx = engine.submit(request).map_err(|e| e.to_string())?;
    let mut turn = Turn {
        reply: Vec::new(),
        first_token: Duration::ZERO,
        cached: 0,
    };
    while let Some(event) = rx.blocking_recv() {
        match event {
            GenerationEvent::Token(token) => {
                if turn.reply.is_empty() {
                    turn.first_token = started.elapsed();
                }
                turn.reply.push(token.token_id);
            }
            GenerationEvent::Finished { usage, .. } => {
                if turn.reply.is_empty() {
                    turn.first_token = started.elapsed();
                }
                turn.cached = usage.prompt_tokens_details.map_or(0, |d| d.cached_tokens);
                break;
            }
            GenerationEvent::Failed(err) => return Err(err.to_string()),
        }
    }
    Ok(turn)
}

/// The median second-turn time to first token on `engine` over `questions`, the prompt tokens
/// each second turn computed, and the second turns' replies.
fn second_turns(
    engine: &EngineHandle,
    shared: &[u32],
    questions: &[Vec<u32>],
) -> Result<(Duration, usize, Vec<Vec<u32>>), String> {
    let first = run(engine, shared.to_vec(), 16)?;
    let mut times = Vec::new();
    let mut computed = 0;
    let mut replies = Vec::new();
    for question in questions {
        let mut prompt = shared.to_vec();
        prompt.extend(&first.reply);
        prompt.extend(question);
        let len = prompt.len();
        let turn = run(engine, prompt, 8)?;
        times.push(turn.first_token);
        computed = len - turn.cached;
        replies.push(turn.reply);
    }
    times.sort();
    Ok((times[times.len() / 2], computed, replies))
}

fn main() -> Result<(), String> {
    let options = Options::parse();
    let plain = cpu_engine(
        &options.model,
        4096,
        (OffloadMode::None, 0),
        None,
        Metrics::new(),
    )?;
    let cached = cpu_engine_with(
        &options.model,
        4096,
        (OffloadMode::None, 0),
        None,
        EngineOptions::default(),
    )?;
    let text = "The museum keeps the logbooks of the lighthouse keepers, who wrote down the \
        weather, the ships that passed and the birds on the cliffs every evening. "
        .repeat(40);
    let mut shared = plain
        .tokenize("bench", &text, true)
        .map_err(|e| e.to_string())?;
    shared.truncate(options.prefix);
    let mut questions = Vec::new();
    for i in 0..options.turns.max(1) {
        let question = format!("\nQuestion {i}: what did keeper number {i} write down?\nAnswer:");
        questions.push(
            plain
                .tokenize("bench", &question, false)
                .map_err(|e| e.to_string())?,
        );
    }
    // Warm-up (allocations, thread pools) on text the turns do not share.
    for engine in [&plain, &cached] {
        let warm = engine
            .tokenize("bench", &"Warm up. ".repeat(50), true)
            .map_err(|e| e.to_string())?;
        run(engine, warm, 2)?;
    }
    let (without, computed_without, replies_without) = second_turns(&plain, &shared, &questions)?;
    let (with, computed_with, replies_with) = second_turns(&cached, &shared, &questions)?;
    if replies_with != replies_without {
        return Err("the greedy replies differ with and without the prefix cache".into());
    }
    let tokens = shared.len();
    println!(
        "| second chat turn after a {tokens}-token shared prefix | time to first token (median of {}) | prompt tokens computed |",
        questions.len()
    );
    println!("|---|---|---|");
    println!(
        "| prefix cache off | {:.3} s | {computed_without} |",
        without.as_secs_f64()
    );
    println!(
        "| prefix cache on | {:.3} s | {computed_with} |",
        with.as_secs_f64()
    );
    println!(
        "| ratio off / on | {:.1}x | |",
        without.as_secs_f64() / with.as_secs_f64().max(1e-9)
    );
    Ok(())
}
