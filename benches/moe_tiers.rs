//! Expert tiers on the CPU device with an emulated link (issue 30): decode and prefill tokens/s
//! of a generated Qwen3-30B-A3B-shaped MoE (hidden 2048, 128 experts of width 768, top 8, 32
//! query heads over 4 key/value heads of 128; a few layers, a small vocabulary; Q8_0, written in
//! the bench from random blocks) with every routed expert offloaded (mode `sequential`: the
//! pool of 8 cache slots and the 2 prefill scratch slots on the device, every expert in a host
//! slab), three ways in one run:
//!
//! - (a) `stream`: every routed expert not in the pool copied over the link (`offload.tier =
//!   stream`, and a layer's experts beyond the free slots copied in further rounds, as on CUDA,
//!   rather than computed on the host); a prefill's through the scratch slots;
//! - (b) `host`: every routed expert computed where its slab lies (`offload.tier = host`);
//! - (c) `auto`: each routed expert's tier chosen per step by the cost model from the rows
//!   routed to it, with the rates `serve` would calibrate (the link as throttled).
//!
//! Each against its bound, from what the run moved: the link bound is `link / link bytes per
//! token` (expert bytes over the link), the host bound `host read rate / host bytes per token`
//! (the bytes of the experts computed on the host, at the calibrated read rate); a row that
//! does both is bounded by the sum of the two times. Bounds count the experts only (attention
//! and the router are resident). Both tiers compute on this CPU, so the compute bound (the
//! routed experts' flops per token at the calibrated host rate) is printed beside them. Prefill is one step of `--prompt` tokens on a fresh sequence;
//! decode is batch 1 after it. Each case runs `--rounds` times, interleaved with the others
//! (a, b, c, a, b, c, ...), so a load spike hits one run, not a case: the table shows each
//! case's median run and, per round, auto over the better of (a) and (b) in that round (and
//! their median). The load average is printed with each run.
//!
//! Usage: cargo bench --locked --bench moe_tiers -- [--layers N] [--link BYTES_PER_S]
//! [--prompt N] [--steps N] [--rounds N] (`-- --help` lists them all).

use std::path::Path;
use std::time::Instant;

use candle_core::quantized::ggml_file::qtensor_from_ggml;
use candle_core::quantized::{gguf_file, GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use clap::Parser;
use ferry::config::{DtypeChoice, OffloadMode, TierChoice, TierConfig};
use ferry::model::checkpoint::Checkpoint;
use ferry::model::decoder::SeqInput;
use ferry::model::loader::{Holding, LoadOptions};
use ferry::model::source::ModelFiles;
use ferry::offload::calibrate::{calibrate, CalibrationInput, Probe};
use ferry::offload::plan::{plan, Plan, PlanInput};
use ferry::offload::sizing::ModelSizes;
use ferry::offload::units::{format_bandwidth, format_bytes};
use ferry::offload::{
    load_placed, CostModel, ExpertInput, Served, SlotKind, StepKind, StepKindSnapshot, StreamConfig,
};

/// `cargo bench --bench moe_tiers -- [OPTIONS]`.
#[derive(Parser)]
struct Options {
    /// Decoder layers (Qwen3-30B-A3B has 48).
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// Routed experts per layer.
    #[arg(long, default_value_t = 128)]
    experts: usize,
    /// Experts each token is routed to.
    #[arg(long, default_value_t = 8)]
    top_k: usize,
    /// Hidden size.
    #[arg(long, default_value_t = 2048)]
    hidden: usize,
    /// Each expert's width (`moe_intermediate_size`).
    #[arg(long, default_value_t = 768)]
    expert_ff: usize,
    /// Vocabulary (Qwen3's is 151,936; the head is not what this measures).
    #[arg(long, default_value_t = 2048)]
    vocab: usize,
    /// Emulated host-to-device link in bytes/s.
    #[arg(long, default_value_t = 16_000_000_000)]
    link: u64,
    /// Prompt tokens of the prefill step.
    #[arg(long, default_value_t = 512)]
    prompt: usize,
    /// Decode steps timed per run.
    #[arg(long, default_value_t = 64)]
    steps: usize,
    /// Runs per case (interleaved; the median counts).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Prefetch depth (`offload.prefetch`).
    #[arg(long, default_value_t = 1)]
    prefetch: usize,
    /// Passed by `cargo bench`.
    #[arg(long = "bench", hide = true)]
    _bench: bool,
}

/// Random Q8_0 blocks: a fixed scale and random quants, so the weights are finite and small
/// (about 1/sqrt(hidden)), made from a pool of random blocks tiled over the tensor: generated
/// in seconds, where quantizing random floats would take minutes.
struct Blocks {
    pool: Vec<u8>,
}

/// Bytes and elements of one Q8_0 block.
const Q8_0_BLOCK: (usize, usize) = (34, 32);

impl Blocks {
    fn new(seed: u64) -> Self {
        let mut state = seed | 1;
        let mut next = move || {
            // xorshift64
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let scale = half::f16::from_f32(3e-4).to_le_bytes();
        let blocks = 1 << 15;
        let mut pool = Vec::with_capacity(blocks * Q8_0_BLOCK.0);
        for _ in 0..blocks {
            pool.extend_from_slice(&scale);
            for _ in 0..Q8_0_BLOCK.1 / 8 {
                pool.extend_from_slice(&next().to_le_bytes());
            }
        }
        Self { pool }
    }

    /// A Q8_0 tensor of `dims` (the last one a multiple of 32), starting at block `offset` of
    /// the pool (so tensors differ).
    fn tensor(&self, dims: &[usize], offset: usize) -> candle_core::Result<QTensor> {
        let elems: usize = dims.iter().product();
        let bytes = elems / Q8_0_BLOCK.1 * Q8_0_BLOCK.0;
        let start = (offset * Q8_0_BLOCK.0) % self.pool.len();
        let data: Vec<u8> = self
            .pool
            .iter()
            .cycle()
            .skip(start)
            .take(bytes)
            .copied()
            .collect();
        qtensor_from_ggml(GgmlDType::Q8_0, &data, dims.to_vec(), &Device::Cpu)
    }
}

/// Writes the Qwen3-MoE GGUF to `path`.
fn write_model(path: &Path, o: &Options) -> candle_core::Result<()> {
    let (h, heads, kv_heads, head_dim) = (o.hidden, 32, 4, 128);
    let blocks = Blocks::new(0x5eed);
    let f32v =
        |n: usize| QTensor::quantize(&Tensor::ones(n, DType::F32, &Device::Cpu)?, GgmlDType::F32);
    let mut offset = 0;
    let mut q8 = |dims: &[usize]| {
        offset += 7919;
        blocks.tensor(dims, offset)
    };
    let mut tensors: Vec<(String, QTensor)> = vec![
        ("token_embd.weight".into(), q8(&[o.vocab, h])?),
        ("output.weight".into(), q8(&[o.vocab, h])?),
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
            (b("ffn_gate_exps"), q8(&[o.experts, o.expert_ff, h])?),
            (b("ffn_up_exps"), q8(&[o.experts, o.expert_ff, h])?),
            (b("ffn_down_exps"), q8(&[o.experts, h, o.expert_ff])?),
        ]);
    }
    let u = |v: usize| gguf_file::Value::U32(v as u32);
    let arch = "qwen3moe";
    let meta: Vec<(String, gguf_file::Value)> = vec![
        (
            "general.architecture".into(),
            gguf_file::Value::String(arch.into()),
        ),
        (format!("{arch}.context_length"), u(4096)),
        (format!("{arch}.embedding_length"), u(h)),
        (format!("{arch}.feed_forward_length"), u(6144)),
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
        (format!("{arch}.expert_used_count"), u(o.top_k)),
        (format!("{arch}.expert_feed_forward_length"), u(o.expert_ff)),
    ];
    let meta_refs: Vec<(&str, &gguf_file::Value)> =
        meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
    let mut file = std::io::BufWriter::new(std::fs::File::create(path)?);
    gguf_file::write(&mut file, &meta_refs, &tensor_refs)
}

fn options() -> LoadOptions {
    LoadOptions {
        device: Device::Cpu,
        dtype: DtypeChoice::Auto,
    }
}

/// Every expert in a host slab: the pool (top-k slots) and the scratch slots on the device.
fn all_offloaded(checkpoint: &Checkpoint, o: &Options) -> Result<Plan, String> {
    let holding = Holding::new(checkpoint, &options()).map_err(|e| e.to_string())?;
    let sizes = ModelSizes::of(checkpoint, &holding, SlotKind::Cpu).map_err(|e| e.to_string())?;
    let mut input = PlanInput::new(
        OffloadMode::Sequential,
        sizes.layers,
        sizes.fixed,
        u64::MAX / 4,
    );
    input.layer_layouts = sizes.layouts;
    input.link_bandwidth = Some(o.link);
    input.prefetch = o.prefetch;
    input.max_context = o.prompt + o.steps + 8;
    input.experts = Some(ExpertInput {
        n_used: o.top_k,
        pool_slots: None,
        host_layers: Default::default(),
        route_counts: Vec::new(),
    });
    plan(&input).map_err(|e| e.to_string())
}

/// One case: its name and tier.
#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    tier: TierChoice,
}

/// What one run of a step kind measured.
#[derive(Clone, Copy, Default)]
struct Run {
    tok_s: f64,
    /// Expert bytes over the link and expert bytes computed on the host, per token.
    link_per_token: f64,
    host_per_token: f64,
    /// The share of the offloaded routed experts computed on the host.
    host_share: f64,
    load: f64,
}

/// The one-minute load average now.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

fn per_token(before: &StepKindSnapshot, after: &StepKindSnapshot, expert: u64, secs: f64) -> Run {
    let tokens = (after.tokens - before.tokens) as f64;
    let served = |s: Served| (after.get(s) - before.get(s)) as f64;
    let offloaded = served(Served::Hit) + served(Served::Copied) + served(Served::Host);
    Run {
        tok_s: tokens / secs,
        link_per_token: (after.link_bytes - before.link_bytes) as f64 / tokens,
        host_per_token: served(Served::Host) * expert as f64 / tokens,
        host_share: if offloaded > 0.0 {
            served(Served::Host) / offloaded
        } else {
            0.0
        },
        load: load_average(),
    }
}

/// Prefill (one step of the prompt) and batch-1 decode after it, as `case` places the experts.
fn measure(
    checkpoint: &Checkpoint,
    plan: &Plan,
    case: Case,
    cost: CostModel,
    expert: u64,
    o: &Options,
) -> Result<(Run, Run), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let stream = StreamConfig {
        prefetch: o.prefetch,
        link_bandwidth: Some(o.link),
    };
    let mut placed =
        load_placed(checkpoint, &options(), plan, stream, &mut |_| {}).map_err(|e| err(&e))?;
    let experts = placed.store.experts().cloned().ok_or("no expert store")?;
    experts.set_tier(case.tier);
    experts.set_cost_model(Some(cost));
    // Stream-only streams every routed expert: a layer's beyond the free slots in rounds.
    experts.set_rounds(case.tier == TierChoice::Stream);
    let accounting = placed.store.accounting().clone();
    let model = &placed.model;
    let mut cache = model.new_cache();
    let prompt: Vec<u32> = (0..o.prompt)
        .map(|t| (t * 7919 + 13) as u32 % o.vocab as u32)
        .collect();
    let mut step = |tokens: &[u32], cache: &mut _| -> Result<u32, String> {
        let mut seqs = [SeqInput { tokens, cache }];
        let logits = model
            .forward_batch(&mut seqs, &mut placed.store)
            .map_err(|e| err(&e))?;
        let next = logits
            .argmax(1)
            .and_then(|t| t.to_vec1::<u32>())
            .map_err(|e| err(&e))?;
        Ok(next[0])
    };
    let snapshot = |kind| accounting.expert_steps().snapshot(kind);
    let before = snapshot(StepKind::Prefill);
    let started = Instant::now();
    let mut next = step(&prompt, &mut cache)?;
    let prefill = per_token(
        &before,
        &snapshot(StepKind::Prefill),
        expert,
        started.elapsed().as_secs_f64(),
    );
    // Two untimed decode steps, then the timed ones.
    for _ in 0..2 {
        next = step(&[next], &mut cache)?;
    }
    experts.settle();
    let before = snapshot(StepKind::Decode);
    let started = Instant::now();
    for _ in 0..o.steps {
        next = step(&[next], &mut cache)?;
    }
    let secs = started.elapsed().as_secs_f64();
    let decode = per_token(&before, &snapshot(StepKind::Decode), expert, secs);
    Ok((prefill, decode))
}

/// `link / link bytes + host bytes / host read rate` per token, as tokens/s.
fn bound(run: &Run, link: f64, host_read: f64) -> f64 {
    let secs = run.link_per_token / link + run.host_per_token / host_read;
    if secs > 0.0 {
        1.0 / secs
    } else {
        f64::INFINITY
    }
}

fn main() -> Result<(), String> {
    let o = Options::parse();
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let path = dir.path().join("qwen3moe-shaped.gguf");
    let started = Instant::now();
    write_model(&path, &o).map_err(|e| e.to_string())?;
    let written = started.elapsed();
    let checkpoint = Checkpoint::open(&ModelFiles::Gguf { path }).map_err(|e| e.to_string())?;
    let plan = all_offloaded(&checkpoint, &o)?;
    let ex = plan.experts.as_ref().ok_or("no expert placement")?;
    let expert = ex.layers[0].expert_bytes[0];
    println!(
        "Qwen3-30B-A3B-shaped MoE: {} layers, {} experts of {} (width {}, top {}), hidden {}, Q8_0 \
         (written in {:.1} s); link {}; {} experts on the host ({}), pool {} + {} scratch slots",
        o.layers,
        o.experts,
        format_bytes(expert),
        o.expert_ff,
        o.top_k,
        o.hidden,
        written.as_secs_f64(),
        format_bandwidth(o.link),
        ex.host_experts(),
        format_bytes(plan.host_bytes),
        ex.pool_slots,
        ex.scratch_slots,
    );
    let calibration = calibrate(&CalibrationInput {
        device: &Device::Cpu,
        weight_type: GgmlDType::Q8_0,
        link_bandwidth: Some(o.link),
        tier: &TierConfig::default(),
        probe: Probe::default(),
    })
    .map_err(|e| e.to_string())?;
    let cost = calibration.model;
    println!("{}", calibration.summary());
    let work_rows = |rows| {
        let flops = 2.0 * (3 * o.hidden * o.expert_ff) as f64;
        let work = ferry::offload::UnitWork {
            weight_bytes: expert,
            flops_per_row: flops,
            activation_bytes_per_row: 4 * o.hidden as u64,
        };
        cost.choose(&work, rows)
    };
    println!(
        "cost model: one row {}, {} rows {}; link bound at top {} (every routed expert over the link): {:.1} tok/s\n",
        work_rows(1),
        o.prompt * o.top_k / o.experts,
        work_rows(o.prompt * o.top_k / o.experts),
        o.top_k,
        o.link as f64 / (o.layers * o.top_k) as f64 / expert as f64,
    );
    let cases = [
        Case {
            name: "(a) stream",
            tier: TierChoice::Stream,
        },
        Case {
            name: "(b) host",
            tier: TierChoice::Host,
        },
        Case {
            name: "(c) auto",
            tier: TierChoice::Auto,
        },
    ];
    // runs[case][round]: (prefill, decode).
    let mut runs: Vec<Vec<(Run, Run)>> = vec![Vec::new(); cases.len()];
    for round in 0..o.rounds {
        for (c, case) in cases.iter().enumerate() {
            let (prefill, decode) = measure(&checkpoint, &plan, *case, cost, expert, &o)?;
            println!(
                "round {round} {}: prefill {:.1} tok/s (load {:.2}), decode {:.2} tok/s (load {:.2})",
                case.name, prefill.tok_s, prefill.load, decode.tok_s, decode.load
            );
            runs[c].push((prefill, decode));
        }
    }
    let (link, host_read) = (o.link as f64, cost.host_read_bytes_per_s);
    let expert_flops_per_token =
        (o.layers * o.top_k) as f64 * 2.0 * (3 * o.hidden * o.expert_ff) as f64;
    println!(
        "\ncompute bound (routed experts' flops per token at the host's {:.1} GFLOP/s): {:.1} tok/s",
        cost.host_flops_per_s / 1e9,
        cost.host_flops_per_s / expert_flops_per_token
    );
    println!(
        "\n| step | tier | tok/s (median of {}) | load | link bytes per token | host bytes per token | host share | byte bound tok/s | of bound |",
        o.rounds
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let median = |mut xs: Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    for (k, kind) in ["prefill", "decode"].into_iter().enumerate() {
        let of = |run: &(Run, Run)| if k == 0 { run.0 } else { run.1 };
        for (c, case) in cases.iter().enumerate() {
            let mut sorted: Vec<Run> = runs[c].iter().map(of).collect();
            sorted.sort_by(|a, b| a.tok_s.total_cmp(&b.tok_s));
            let run = sorted[sorted.len() / 2];
            let b = bound(&run, link, host_read);
            println!(
                "| {kind} | {} | {:.2} | {:.2} | {} | {} | {:.0}% | {:.1} | {:.2} |",
                case.name,
                run.tok_s,
                run.load,
                format_bytes(run.link_per_token.round() as u64),
                format_bytes(run.host_per_token.round() as u64),
                100.0 * run.host_share,
                b,
                run.tok_s / b,
            );
        }
        let ratios: Vec<f64> = (0..o.rounds)
            .map(|r| {
                let (a, b, c) = (of(&runs[0][r]), of(&runs[1][r]), of(&runs[2][r]));
                c.tok_s / a.tok_s.max(b.tok_s)
            })
            .collect();
        let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "| {kind} | auto / better of (a), (b), per round | {} (median {:.2}) | | | | | | |",
            each.join(", "),
            median(ratios.clone())
        );
    }
    Ok(())
}
