//! Expert-level offload on the CPU device with a throttled link (issue 13): decode tokens/s of
//! a synthetic Qwen3-MoE (random Q8_0 weights, written to a temporary GGUF) with about half of
//! its expert bytes off the device, three ways, in one run:
//!
//! - `whole layers`: half the layers streamed whole through the slot ring (prefetch 1);
//! - `routed experts (stream)`: half of every layer's experts in host slabs, the routed ones
//!   copied into a pool of expert slots (with its LRU cache of hot experts), prefetch 0: each
//!   copy issued after the router, overlapping the compute of the experts on the device;
//! - `routed experts (stream, prefetch 1)`: the same, with each layer's experts also predicted
//!   before its attention (pre-gating) and copied while it runs;
//! - `routed experts (host)`: the same placement, offloaded experts computed where they are;
//! - `routed experts (auto, per expert)`: each routed expert's tier chosen by the calibrated
//!   cost model from the rows routed to it (prefetch 1).
//!
//! Batch 1 and 8 (8 sequences decoded together). The link is `device.link_bandwidth`
//! (`--link`, default 4 GB/s). Prints a markdown table with the bytes copied per decode step
//! and, per decode step, the routed experts found on the device / copied / computed on the
//! host, and the predicted copies / the routed experts they supplied.
//!
//! Usage: cargo bench --bench moe_offload -- [--layers N] [--experts N] [--link BYTES_PER_S]
//! [--steps N].

use std::path::Path;
use std::time::Instant;

use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use clap::Parser;
use ferry::config::TierChoice;
use ferry::config::TierConfig;
use ferry::config::{DtypeChoice, OffloadMode};
use ferry::model::checkpoint::Checkpoint;
use ferry::model::decoder::SeqInput;
use ferry::model::loader::{Holding, LoadOptions};
use ferry::model::source::ModelFiles;
use ferry::offload::calibrate::{calibrate, CalibrationInput, Probe};
use ferry::offload::plan::{plan, Plan, PlanInput};
use ferry::offload::sizing::ModelSizes;
use ferry::offload::units::{format_bandwidth, format_bytes};
use ferry::offload::{load_placed, CostModel, ExpertInput, SlotKind, StreamConfig};

/// `cargo bench --bench moe_offload -- [OPTIONS]`.
#[derive(Parser)]
struct Options {
    /// Decoder layers of the synthetic model.
    #[arg(long, default_value_t = 8)]
    layers: usize,
    /// Experts per layer (2 routed per token).
    #[arg(long, default_value_t = 16)]
    experts: usize,
    /// Hidden size (and each expert's width).
    #[arg(long, default_value_t = 512)]
    hidden: usize,
    /// Emulated host-to-device link in bytes/s.
    #[arg(long, default_value_t = 4_000_000_000)]
    link: u64,
    /// Decode steps timed per case.
    #[arg(long, default_value_t = 8)]
    steps: usize,
    /// Passed by `cargo bench`.
    #[arg(long = "bench", hide = true)]
    _bench: bool,
}

/// Writes a Qwen3-MoE GGUF with random Q8_0 matrices (f32 norms) to `path`.
fn write_model(path: &Path, o: &Options) -> candle_core::Result<()> {
    let (h, heads, kv_heads, head_dim, vocab) = (o.hidden, 8, 4, o.hidden / 8, 1024);
    let dev = Device::Cpu;
    let q8 = |shape: &[usize]| -> candle_core::Result<QTensor> {
        QTensor::quantize(&Tensor::randn(0f32, 0.05, shape, &dev)?, GgmlDType::Q8_0)
    };
    let f32v = |n: usize| -> candle_core::Result<QTensor> {
        QTensor::quantize(
            &Tensor::ones(n, candle_core::DType::F32, &dev)?,
            GgmlDType::F32,
        )
    };
    let mut tensors: Vec<(String, QTensor)> = vec![
        ("token_embd.weight".into(), q8(&[vocab, h])?),
        ("output.weight".into(), q8(&[vocab, h])?),
        ("output_norm.weight".into(), f32v(h)?),
    ];
    for i in 0..o.layers {
        let b = |n: &str| format!("blk.{i}.{n}.weight");
        tensors.extend([
            (b("attn_norm"), f32v(h)?),
            (b("ffn_norm"), f32v(h)?),
            (b("attn_q_norm"), f32v(head_dim)?),
            (b("attn_k_norm"), f32v(head_dim)?),
            (b("attn_q"), q8(&[heads * head_dim, h])?),
            (b("attn_k"), q8(&[kv_heads * head_dim, h])?),
            (b("attn_v"), q8(&[kv_heads * head_dim, h])?),
            (b("attn_output"), q8(&[h, heads * head_dim])?),
            (b("ffn_gate_inp"), q8(&[o.experts, h])?),
            (b("ffn_gate_exps"), q8(&[o.experts, h, h])?),
            (b("ffn_up_exps"), q8(&[o.experts, h, h])?),
            (b("ffn_down_exps"), q8(&[o.experts, h, h])?),
        ]);
    }
    let u = |v: usize| gguf_file::Value::U32(v as u32);
    let arch = "qwen3moe";
    let meta: Vec<(String, gguf_file::Value)> = vec![
        (
            "general.architecture".into(),
            gguf_file::Value::String(arch.into()),
        ),
        (format!("{arch}.context_length"), u(512)),
        (format!("{arch}.embedding_length"), u(h)),
        (format!("{arch}.feed_forward_length"), u(h)),
        (format!("{arch}.block_count"), u(o.layers)),
        (format!("{arch}.attention.head_count"), u(heads)),
        (format!("{arch}.attention.head_count_kv"), u(kv_heads)),
        (
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            gguf_file::Value::F32(1e-6),
        ),
        (format!("{arch}.rope.freq_base"), gguf_file::Value::F32(1e6)),
        (format!("{arch}.rope.dimension_count"), u(head_dim)),
        (format!("{arch}.attention.key_length"), u(head_dim)),
        (format!("{arch}.attention.value_length"), u(head_dim)),
        (format!("{arch}.expert_count"), u(o.experts)),
        (format!("{arch}.expert_used_count"), u(2)),
        (format!("{arch}.expert_feed_forward_length"), u(h)),
    ];
    let meta_refs: Vec<(&str, &gguf_file::Value)> =
        meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let mut file = std::fs::File::create(path)?;
    gguf_file::write(&mut file, &meta_refs, &tensor_refs)
}

fn options() -> LoadOptions {
    LoadOptions {
        device: Device::Cpu,
        dtype: DtypeChoice::Auto,
    }
}

/// The expert plan with about half of the expert bytes on the host, and the whole-layer plan
/// with half of the layers on the host.
fn plans(checkpoint: &Checkpoint, link: u64) -> Result<(Plan, Plan), String> {
    let holding = Holding::new(checkpoint, &options()).map_err(|e| e.to_string())?;
    let sizes = ModelSizes::of(checkpoint, &holding, SlotKind::Cpu).map_err(|e| e.to_string())?;
    let n = sizes.layers.len();
    let mut input = PlanInput::new(
        OffloadMode::Sequential,
        sizes.layers.clone(),
        sizes.fixed,
        0,
    );
    input.layer_layouts = sizes.layouts.clone();
    input.link_bandwidth = Some(link);
    input.prefetch = 1;
    input.budget_bytes = u64::MAX / 4;
    input.experts = Some(ExpertInput {
        n_used: 2,
        pool_slots: None,
        host_layers: Default::default(),
        route_counts: Vec::new(),
    });
    let all = plan(&input).map_err(|e| e.to_string())?;
    let host_experts = all.host_bytes;
    input.mode = OffloadMode::Auto;
    input.budget_bytes = all.device_bytes + host_experts / 2;
    let experts = plan(&input).map_err(|e| e.to_string())?;
    input.experts = None;
    let layer = sizes.layers.iter().copied().max().unwrap_or(0);
    input.budget_bytes = sizes.fixed + (n / 2) as u64 * layer + 2 * layer;
    let layers = plan(&input).map_err(|e| e.to_string())?;
    Ok((experts, layers))
}

/// One row of the table.
struct Case<'a> {
    name: &'static str,
    plan: &'a Plan,
    tier: Option<TierChoice>,
    prefetch: usize,
    cost: Option<CostModel>,
}

/// What one case measured: decode tokens/s, bytes copied per step, and per step the routed
/// experts hit / missed / host-computed and the predicted copies / prefetch hits.
struct Measured {
    tok_s: f64,
    copied: u64,
    experts: [f64; 5],
}

/// Decodes `batch` sequences as `case` places them.
fn decode(
    checkpoint: &Checkpoint,
    case: &Case<'_>,
    batch: usize,
    o: &Options,
) -> Result<Measured, String> {
    let (plan, tier) = (case.plan, case.tier);
    let stream = StreamConfig {
        prefetch: case.prefetch,
        link_bandwidth: Some(o.link),
    };
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let mut placed =
        load_placed(checkpoint, &options(), plan, stream, &mut |_| {}).map_err(|e| err(&e))?;
    if let (Some(store), Some(tier)) = (placed.store.experts(), tier) {
        store.set_tier(tier);
        store.set_cost_model(case.cost);
    }
    let experts = placed.store.experts().cloned();
    let accounting = placed.store.accounting().clone();
    let model = &placed.model;
    let mut caches: Vec<_> = (0..batch).map(|_| model.new_cache()).collect();
    let mut inputs: Vec<Vec<u32>> = (0..batch)
        .map(|b| (0..8).map(|t| (b * 31 + t * 7) as u32 % 1000 + 3).collect())
        .collect();
    let mut step = |inputs: &mut Vec<Vec<u32>>| -> Result<(), String> {
        let mut seqs: Vec<SeqInput<'_>> = inputs
            .iter()
            .zip(caches.iter_mut())
            .map(|(tokens, cache)| SeqInput { tokens, cache })
            .collect();
        let logits = model
            .forward_batch(&mut seqs, &mut placed.store)
            .map_err(|e| err(&e))?;
        let next = logits
            .argmax(1)
            .and_then(|t| t.to_vec1::<u32>())
            .map_err(|e| err(&e))?;
        *inputs = next.into_iter().map(|t| vec![t]).collect();
        Ok(())
    };
    step(&mut inputs)?;
    step(&mut inputs)?;
    let settle = || {
        if let Some(e) = &experts {
            e.settle();
        }
    };
    settle();
    let before = accounting.snapshot();
    let started = Instant::now();
    for _ in 0..o.steps {
        step(&mut inputs)?;
    }
    let secs = started.elapsed().as_secs_f64();
    settle();
    let after = accounting.snapshot();
    let per_step = |a: u64, b: u64| (a - b) as f64 / o.steps as f64;
    Ok(Measured {
        tok_s: (o.steps * batch) as f64 / secs,
        copied: (after.bytes_copied - before.bytes_copied) / o.steps as u64,
        experts: [
            per_step(after.expert_hits, before.expert_hits),
            per_step(after.expert_misses, before.expert_misses),
            per_step(after.expert_host, before.expert_host),
            per_step(after.expert_prefetched, before.expert_prefetched),
            per_step(after.expert_prefetch_hits, before.expert_prefetch_hits),
        ],
    })
}

fn main() -> Result<(), String> {
    let o = Options::parse();
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let path = dir.path().join("moe.gguf");
    write_model(&path, &o).map_err(|e| e.to_string())?;
    let files = ModelFiles::Gguf { path };
    let checkpoint = Checkpoint::open(&files).map_err(|e| e.to_string())?;
    let (experts, layers) = plans(&checkpoint, o.link)?;
    let ex = experts.experts.as_ref().ok_or("no expert placement")?;
    println!(
        "synthetic Qwen3-MoE: {} layers, {} experts of {} (top 2), hidden {}, Q8_0; link {}",
        o.layers,
        o.experts,
        format_bytes(ex.layers[0].expert_bytes[0]),
        o.hidden,
        format_bandwidth(o.link)
    );
    println!(
        "expert plan: {} of {} experts on the host ({} host, pool {} slots); whole-layer plan: {} of {} layers on the host ({} host)\n",
        ex.host_experts(),
        o.layers * o.experts,
        format_bytes(experts.host_bytes),
        ex.pool_slots,
        layers.host_layers(),
        o.layers,
        format_bytes(layers.host_bytes),
    );
    // The per-expert tier decides by the calibrated rates, the link as throttled.
    let tier_config = TierConfig::default();
    let calibration = calibrate(&CalibrationInput {
        device: &Device::Cpu,
        weight_type: GgmlDType::Q8_0,
        link_bandwidth: Some(o.link),
        tier: &tier_config,
        probe: Probe::default(),
    })
    .map_err(|e| e.to_string())?;
    println!("{}\n", calibration.summary());
    println!("| batch | placement | decode tok/s | copied per step | experts per step: device / copied / host | predicted / prefetch hits |");
    println!("|---:|---|---:|---:|---:|---:|");
    for batch in [1usize, 8] {
        let case = |name, plan, tier, prefetch, cost| Case {
            name,
            plan,
            tier,
            prefetch,
            cost,
        };
        let stream = Some(TierChoice::Stream);
        let cases = [
            case("whole layers", &layers, None, 1, None),
            case("routed experts (stream)", &experts, stream, 0, None),
            case(
                "routed experts (stream, prefetch 1)",
                &experts,
                stream,
                1,
                None,
            ),
            case(
                "routed experts (host)",
                &experts,
                Some(TierChoice::Host),
                1,
                None,
            ),
            case(
                "routed experts (auto, per expert)",
                &experts,
                Some(TierChoice::Auto),
                1,
                Some(calibration.model),
            ),
        ];
        for case in &cases {
            let m = decode(&checkpoint, case, batch, &o)?;
            let [hit, miss, host, predicted, prefetch_hit] = m.experts;
            println!(
                "| {batch} | {} | {:.1} | {} | {hit:.1} / {miss:.1} / {host:.1} | {predicted:.1} / {prefetch_hit:.1} |",
                case.name,
                m.tok_s,
                format_bytes(m.copied),
            );
        }
    }
    Ok(())
}
