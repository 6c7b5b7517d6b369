//! The tiers of offloaded dense layers on the CPU device (issue 13, item 3): decode tokens/s of
//! the model with half its layers offloaded and the link throttled (`--link`, bytes/s), every
//! offloaded layer streamed whole into a slot (`offload.tier = stream`), computed where its
//! host slab lies (`host`), or chosen per layer and step by the calibrated cost model (`auto`,
//! the rates `serve` would measure at start-up), at batch 1 and 8, in one run. Also prints
//! the resident (mode `none`) rate for reference, the bytes copied per step and the cost
//! model's choice per batch.
//!
//! Usage: cargo bench --locked --bench dense_tiers -- [OPTIONS] (`-- --help` lists them).

mod common;

use std::time::{Duration, Instant};

use candle_core::Device;
use clap::Parser;
use common::ModelArgs;
use ferry::config::{
    DeviceChoice, DeviceConfig, MemoryBudget, ModelConfig, OffloadConfig, OffloadMode, TierChoice,
};
use ferry::engine::sampling::argmax;
use ferry::engine::traits::{LanguageModel, TextCodec};
use ferry::model::checkpoint::Checkpoint;
use ferry::model::source::{HubOptions, ModelFiles};
use ferry::offload::units::{format_bandwidth, format_bytes};
use ferry::offload::{LayerTiers, Plan, Tier};
use ferry::runtime::adapters::ModelRunner;
use ferry::runtime::load::load_for_serving_on;
use ferry::runtime::planning::plan_model;
use ferry::runtime::tiers::tier_report;

/// `cargo bench --bench dense_tiers -- [OPTIONS]`.
#[derive(Parser)]
struct Options {
    #[command(flatten)]
    model: ModelArgs,
    /// Decode steps timed per case.
    #[arg(long, default_value_t = 16)]
    steps: usize,
    /// The emulated link, bytes/s (default 4 GB/s).
    #[arg(long, default_value_t = 4_000_000_000)]
    link: u64,
    /// Layers copied ahead of compute.
    #[arg(long, default_value_t = 1)]
    prefetch: usize,
}

fn config(options: &Options, mode: OffloadMode, budget: u64) -> ModelConfig {
    let mut config = ModelConfig {
        name: "bench".into(),
        source: options.model.source.clone(),
        dtype: options.model.dtype,
        max_context: Some(512),
        max_batch: Some(8),
        offload: OffloadConfig {
            mode,
            gpu_memory: MemoryBudget::Bytes(budget),
            prefetch: options.prefetch,
            keep_alive: Duration::from_secs(1),
        },
        ..ModelConfig::default()
    };
    config.tier.experts = false;
    config
}

fn device(link_bandwidth: Option<u64>) -> DeviceConfig {
    DeviceConfig {
        kind: DeviceChoice::Cpu,
        link_bandwidth,
        ..DeviceConfig::default()
    }
}

/// The budget with which mode `auto` keeps the first `k` layers of `none` resident.
fn budget_for(none: &Plan, k: usize, prefetch: usize) -> u64 {
    let layers: Vec<u64> = none.layers.iter().map(|l| l.bytes).collect();
    let base = none.device_bytes - layers.iter().sum::<u64>();
    let slot = layers[k..].iter().copied().max().unwrap_or(0);
    let slots = (prefetch + 1).min(layers.len() - k) as u64;
    base + layers[..k].iter().sum::<u64>() + slots * slot
}

/// Decode tokens/s of `batch` copies of `prompt` (after a prefill and two warm-up steps), and
/// the bytes copied and host-tier decisions per timed step.
fn decode(
    runner: &mut ModelRunner,
    prompt: &[u32],
    batch: usize,
    steps: usize,
) -> Result<(f64, u64, f64), String> {
    let mut seqs: Vec<_> = (0..batch).map(|_| runner.new_sequence()).collect();
    let mut inputs: Vec<Vec<u32>> = vec![prompt.to_vec(); batch];
    let mut step = |runner: &mut ModelRunner, inputs: &mut Vec<Vec<u32>>| -> Result<(), String> {
        let mut b: Vec<(&mut _, &[u32])> = seqs
            .iter_mut()
            .zip(inputs.iter())
            .map(|(s, t)| (s, t.as_slice()))
            .collect();
        let logits = runner.forward_batch(&mut b).map_err(|e| e.to_string())?;
        for (input, row) in inputs.iter_mut().zip(&logits) {
            *input = vec![argmax(row)];
        }
        Ok(())
    };
    for _ in 0..3 {
        step(runner, &mut inputs)?;
    }
    let before = runner.accounting();
    let host_before = runner_host_decisions(runner);
    let started = Instant::now();
    for _ in 0..steps {
        step(runner, &mut inputs)?;
    }
    let secs = started.elapsed().as_secs_f64();
    let after = runner.accounting();
    let host_per_step = (runner_host_decisions(runner) - host_before) as f64 / steps as f64;
    Ok((
        (steps * batch) as f64 / secs,
        (after.bytes_copied - before.bytes_copied) / steps as u64,
        host_per_step,
    ))
}

fn runner_host_decisions(runner: &ModelRunner) -> u64 {
    runner.store().accounting().tier_decisions().get(Tier::Host)
}

fn main() -> Result<(), String> {
    let o = Options::parse();
    let hub = HubOptions::from_env(|_| None);
    let none_cfg = config(&o, OffloadMode::None, 64 << 30);
    let none = plan_model(&none_cfg, &device(None), &Device::Cpu, &hub, 64 << 30)
        .map_err(|e| e.to_string())?;
    let n = none.layers.len();
    let k = n / 2;
    let budget = budget_for(&none, k, o.prefetch);
    let loaded = load_for_serving_on(&none_cfg, &device(None), &Device::Cpu, &hub)
        .map_err(|e| e.to_string())?;
    let prompt = loaded
        .codec
        .encode("The capital of France is", true)
        .map_err(|e| e.to_string())?;
    let mut resident = loaded.runner;

    let offloaded_cfg = config(&o, OffloadMode::Auto, budget);
    let link = device(Some(o.link));
    let plan = plan_model(&offloaded_cfg, &link, &Device::Cpu, &hub, 64 << 30)
        .map_err(|e| e.to_string())?;
    let checkpoint = Checkpoint::open(&ModelFiles::Gguf {
        path: o.model.source.clone().into(),
    })
    .map_err(|e| e.to_string())?;
    let report = tier_report(&offloaded_cfg, &link, &Device::Cpu, &checkpoint, &plan)
        .map_err(|e| e.to_string())?
        .ok_or("nothing offloaded")?;
    let spec = checkpoint.spec().clone();
    println!(
        "model {} ({n} layers, {} offloaded, {} streamed per step), prefetch {}, link {}",
        o.model.source,
        plan.host_layers(),
        format_bytes(plan.streamed_bytes_per_step),
        o.prefetch,
        format_bandwidth(o.link)
    );
    print!("{}", report.render_text());
    println!();
    println!("| batch | placement | decode tok/s | vs resident | copied per step | host layers per step |");
    println!("|---:|---|---:|---:|---:|---:|");
    for batch in [1usize, 8] {
        let (base, _, _) = decode(&mut resident, &prompt, batch, o.steps)?;
        println!("| {batch} | resident (mode none) | {base:.1} | 1.00 | 0 B | - |");
        for (name, choice) in [
            ("stream (whole layers)", TierChoice::Stream),
            ("host (compute on the slab)", TierChoice::Host),
            ("auto (calibrated cost model)", TierChoice::Auto),
        ] {
            let mut cfg = offloaded_cfg.clone();
            cfg.tier.choice = choice;
            let loaded =
                load_for_serving_on(&cfg, &link, &Device::Cpu, &hub).map_err(|e| e.to_string())?;
            let mut runner = loaded.runner;
            if runner.store().resident_layers() != k {
                return Err(format!(
                    "{} layers resident, expected {k}",
                    runner.store().resident_layers()
                ));
            }
            if choice == TierChoice::Auto {
                let tiers = LayerTiers {
                    cost: Some(report.calibration.model),
                    forced: None,
                };
                runner
                    .store()
                    .set_layer_tiers(tiers, spec.moe.as_ref(), spec.hidden_size)
                    .map_err(|e| e.to_string())?;
            }
            let (tok_s, copied, hosted) = decode(&mut runner, &prompt, batch, o.steps)?;
            println!(
                "| {batch} | {name} | {tok_s:.1} | {:.2} | {} | {hosted:.1} |",
                tok_s / base,
                format_bytes(copied)
            );
        }
    }
    Ok(())
}
