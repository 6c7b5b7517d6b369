//! Copy/compute overlap of the offload engine on the CPU device (issue 3, "Overlap, proven
//! without a GPU"). Decodes with every layer resident to measure the compute time of a step,
//! sets `link_bandwidth` so that copying one layer takes about as long as computing it, then
//! decodes in mode `sequential` (every layer streamed) with prefetch 0, 1 and 2 and prints a
//! markdown table: step time, compute and copy time per step, overlap efficiency
//! `(t_compute + t_copy - t_step) / min(t_compute, t_copy)` (1.0: the copy is fully hidden,
//! 0.0: none of it is), and the achieved copy bandwidth as a fraction of the configured one.
//!
//! Usage: cargo bench --bench offload_overlap -- [OPTIONS] (`-- --help` lists them).

mod common;

use std::time::{Duration, Instant};

use candle_core::Device;
use clap::Parser;
use common::ModelArgs;
use ferry::config::{
    DeviceChoice, DeviceConfig, MemoryBudget, ModelConfig, OffloadConfig, OffloadMode,
};
use ferry::engine::sampling::argmax;
use ferry::engine::traits::{LanguageModel, TextCodec};
use ferry::model::source::HubOptions;
use ferry::offload::units::{format_bandwidth, format_bytes};
use ferry::runtime::adapters::ModelRunner;
use ferry::runtime::load::load_for_serving_on;
use ferry::runtime::planning::plan_model;

/// `cargo bench --bench offload_overlap -- [OPTIONS]`.
#[derive(Parser)]
struct Options {
    #[command(flatten)]
    model: ModelArgs,
    /// Decode steps timed per case.
    #[arg(long, default_value_t = 16)]
    steps: usize,
}

fn config(options: &Options, mode: OffloadMode, prefetch: usize) -> ModelConfig {
    ModelConfig {
        name: "bench".into(),
        source: options.model.source.clone(),
        dtype: options.model.dtype,
        max_context: Some(512),
        max_batch: Some(1),
        offload: OffloadConfig {
            mode,
            gpu_memory: MemoryBudget::Bytes(64 << 30),
            prefetch,
            keep_alive: Duration::from_secs(1),
        },
        ..ModelConfig::default()
    }
}

fn device(link_bandwidth: Option<u64>) -> DeviceConfig {
    DeviceConfig {
        kind: DeviceChoice::Cpu,
        link_bandwidth,
        ..DeviceConfig::default()
    }
}

/// Mean wall time of one decode step over `steps` steps (after a prefill and two warm-up steps).
fn decode_step_time(
    runner: &mut ModelRunner,
    prompt: &[u32],
    steps: usize,
) -> Result<Duration, String> {
    let mut seq = runner.new_sequence();
    let mut next = argmax(
        &runner
            .forward(&mut seq, prompt)
            .map_err(|e| e.to_string())?,
    );
    for _ in 0..2 {
        next = argmax(
            &runner
                .forward(&mut seq, &[next])
                .map_err(|e| e.to_string())?,
        );
    }
    let started = Instant::now();
    for _ in 0..steps {
        next = argmax(
            &runner
                .forward(&mut seq, &[next])
                .map_err(|e| e.to_string())?,
        );
    }
    Ok(started.elapsed() / steps as u32)
}

fn main() -> Result<(), String> {
    let options = Options::parse();
    let hub = HubOptions::from_env(|_| None);
    let prompt_text = "The capital of France is";

    let resident_cfg = config(&options, OffloadMode::None, 0);
    let plan = plan_model(&resident_cfg, &device(None), &Device::Cpu, &hub, 64 << 30)
        .map_err(|e| e.to_string())?;
    let n_layers = plan.layers.len();
    let layer_bytes = plan.layers.iter().map(|l| l.bytes).max().unwrap_or(0);
    let loaded = load_for_serving_on(&resident_cfg, &device(None), &Device::Cpu, &hub)
        .map_err(|e| e.to_string())?;
    let prompt = loaded
        .codec
        .encode(prompt_text, true)
        .map_err(|e| e.to_string())?;
    let mut runner = loaded.runner;
    let t_resident = decode_step_time(&mut runner, &prompt, options.steps)?;
    drop(runner);
    let t_layer = t_resident.as_secs_f64() / n_layers as f64;
    let bandwidth = (layer_bytes as f64 / t_layer) as u64;
    println!(
        "model {} ({} layers, {} per layer); resident decode step {:.2} ms, {:.3} ms per layer; link bandwidth set to {}\n",
        options.model.source,
        n_layers,
        format_bytes(layer_bytes),
        t_resident.as_secs_f64() * 1e3,
        t_layer * 1e3,
        format_bandwidth(bandwidth)
    );
    println!("| prefetch | t_step (ms) | t_compute (ms) | t_copy (ms) | overlap efficiency | copy bandwidth / configured | compute waited (ms/step) | in-run compute (ms) | in-run efficiency |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for prefetch in [0usize, 1, 2] {
        let cfg = config(&options, OffloadMode::Sequential, prefetch);
        let loaded = load_for_serving_on(&cfg, &device(Some(bandwidth)), &Device::Cpu, &hub)
            .map_err(|e| e.to_string())?;
        let mut runner = loaded.runner;
        let before = runner.accounting();
        let t_step = decode_step_time(&mut runner, &prompt, options.steps)?;
        let after = runner.accounting();
        let copies = (after.copies - before.copies).max(1) as f64;
        let copy_time = (after.copy_time - before.copy_time).as_secs_f64();
        let steps_run = copies / n_layers as f64;
        let t_copy = copy_time / steps_run;
        let waited = (after.wait_time - before.wait_time).as_secs_f64() / steps_run;
        let achieved = (after.bytes_copied - before.bytes_copied) as f64 / copy_time;
        let t_compute = t_resident.as_secs_f64();
        let t_step = t_step.as_secs_f64();
        let efficiency = (t_compute + t_copy - t_step) / t_compute.min(t_copy);
        // Compute as measured in this run (step time minus time spent waiting for copies), for
        // when the resident measurement and this one saw different machine load.
        let run_compute = (t_step - waited).max(0.0);
        let run_efficiency = (run_compute + t_copy - t_step) / run_compute.min(t_copy);
        println!(
            "| {prefetch} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            t_step * 1e3,
            t_compute * 1e3,
            t_copy * 1e3,
            efficiency,
            achieved / bandwidth as f64,
            waited * 1e3,
            run_compute * 1e3,
            run_efficiency
        );
    }
    Ok(())
}
