//! The offload engine on a real CUDA device (feature `cuda`; compiled by CI, run on a GPU machine
//! by scripts/gpu-check.sh). Every test needs cuda:0 and fails with a clear message without one.
//!
//! - every mode decodes the same greedy tokens as mode `none` on the GPU (quantized GGUF and
//!   dense f16/bf16/f32 models written by the test, and, when `FERRY_GPU_TEST_MODEL` names an HF
//!   directory with a tokenizer, that model through the serving loader in all four modes);
//! - GPU logits match the CPU's within float tolerance for the same weights;
//! - the device memory ferry takes, as the driver reports it, stays within the plan, and the
//!   slot ring is not reallocated while decoding;
//! - a CUDA out-of-memory error fails the step with `OutOfMemory` (HTTP 503) and the next step
//!   on the same runner succeeds;
//! - a KV cache in host memory (`kv_offload = on`, and a q8_0 cache, which CUDA keeps there)
//!   gives the device cache's logits, attended on the host or streamed to the device, and the
//!   device holds none of its bytes;
//! - a tiny Qwen3-MoE with its experts offloaded (streamed through the expert pool, or half
//!   resident) decodes the tokens of `none`;
//! - the host tier on CUDA (issue 30, item 1): the same model's offloaded experts computed on
//!   the host (forced `host`, and `auto` by a cost model that computes 1-row experts there)
//!   give `none`'s logits within the CPU kernels' rounding and its tokens, the host decisions
//!   are counted and no expert byte crosses the link under `host`; experts held dense on CUDA
//!   have no host tier;
//! - the calibration on CUDA measures the CPU kernels' rates and the activations' round trip.

#[allow(dead_code)]
#[path = "suite/tiny.rs"]
mod tiny;

use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use ferry::config::{
    DeviceChoice, DeviceConfig, DtypeChoice, KvOffload, MemoryBudget, ModelConfig, OffloadConfig,
    OffloadMode, QuantType,
};
use ferry::engine::traits::{LanguageModel, TextCodec};
use ferry::engine::EngineError;
use ferry::model::checkpoint::Checkpoint;
use ferry::model::kv_cache::HostKvRates;
use ferry::model::loader::LoadOptions;
use ferry::model::source::{HubOptions, ModelFiles};
use ferry::offload::plan::Plan;
use ferry::offload::{load_placed, StreamConfig};
use ferry::runtime::adapters::ModelRunner;
use ferry::runtime::load::load_for_serving_on;
use ferry::runtime::planning::plan_model;
use tiny::Tiny;

const PROMPT: &[u32] = &[1, 17, 42, 99, 5, 63, 120, 7, 88, 31];
const NEW_TOKENS: usize = 12;
const MAX_CONTEXT: usize = 64;

fn gpu() -> Device {
    ferry::gpu::open(0).unwrap_or_else(|e| {
        panic!("these tests need cuda:0 (run them through scripts/gpu-check.sh): {e}")
    })
}

fn hub() -> HubOptions {
    HubOptions::from_env(|_| None)
}

fn device_config(device: &Device) -> DeviceConfig {
    DeviceConfig {
        kind: if device.is_cuda() {
            DeviceChoice::Cuda(0)
        } else {
            DeviceChoice::Cpu
        },
        link_bandwidth: None,
        ..DeviceConfig::default()
    }
}

/// A test model: its files, the dtype to load it in, and a label for messages.
struct Case {
    label: &'static str,
    source: PathBuf,
    files: ModelFiles,
    dtype: DtypeChoice,
}

/// Hidden 256, 6 layers, GQA 8/4: small, but with real GGML block rows (multiples of 32).
fn shape() -> Tiny {
    Tiny {
        hidden: 256,
        inter: 512,
        layers: 6,
        heads: 8,
        kv_heads: 4,
        head_dim: 32,
        vocab: 512,
        ..Tiny::llama()
    }
}

/// Writes the test models into `dir`: Q8_0 and Q4_0 GGUF files and one HF directory loaded as
/// f32, f16 and bf16.
fn cases(dir: &Path) -> Vec<Case> {
    let t = shape();
    let weights = t.random_weights(false, true);
    let mut out = Vec::new();
    for (label, dtype) in [
        ("gguf q8_0", GgmlDType::Q8_0),
        ("gguf q4_0", GgmlDType::Q4_0),
    ] {
        let path = dir.join(format!("{}.gguf", label.replace(' ', "-")));
        t.write_gguf(&path, "llama", &weights, dtype, true);
        out.push(Case {
            label,
            source: path.clone(),
            files: ModelFiles::Gguf { path },
            dtype: DtypeChoice::Auto,
        });
    }
    let hf = dir.join("hf");
    std::fs::create_dir_all(&hf).expect("mkdir");
    let files = t.write_hf(&hf, &t.llama_config(false, None), &weights, 2);
    for (label, dtype) in [
        ("hf f32", DtypeChoice::F32),
        ("hf f16", DtypeChoice::F16),
        ("hf bf16", DtypeChoice::BF16),
    ] {
        out.push(Case {
            label,
            source: hf.clone(),
            files: files.clone(),
            dtype,
        });
    }
    out
}

fn model_config(
    case: &Case,
    mode: OffloadMode,
    budget: MemoryBudget,
    prefetch: usize,
) -> ModelConfig {
    ModelConfig {
        name: case.label.replace(' ', "-"),
        source: case.source.to_string_lossy().into_owned(),
        dtype: case.dtype,
        max_context: Some(MAX_CONTEXT),
        max_batch: Some(1),
        // The cache in the compute dtype on both devices, so the GPU is compared with the CPU
        // on the same path (CUDA's default would be f16).
        kv_dtype: match case.dtype {
            DtypeChoice::F16 => DtypeChoice::F16,
            DtypeChoice::BF16 => DtypeChoice::BF16,
            _ => DtypeChoice::F32,
        },
        offload: OffloadConfig {
            mode,
            gpu_memory: budget,
            prefetch,
            keep_alive: std::time::Duration::from_secs(1),
        },
        ..ModelConfig::default()
    }
}

/// Plenty of room (the planner still checks it against the card).
const BIG: MemoryBudget = MemoryBudget::Bytes(8 << 30);

fn plan_for(config: &ModelConfig, device: &Device) -> Plan {
    let free = ferry::runtime::device::free_bytes(device).expect("free memory");
    plan_model(config, &device_config(device), device, &hub(), free).expect("plan")
}

/// The budget with which mode `auto` keeps exactly `k` layers resident.
fn budget_for(none: &Plan, k: usize, prefetch: usize) -> u64 {
    let layers: Vec<u64> = none.layers.iter().map(|l| l.bytes).collect();
    let base = none.device_bytes - layers.iter().sum::<u64>();
    let slot = layers[k..].iter().copied().max().unwrap_or(0);
    let slots = (prefetch + 1).min(layers.len() - k) as u64;
    base + layers[..k].iter().sum::<u64>() + slots * slot
}

/// Loads `case` as `config` places it on `device` (no tokenizer needed).
fn runner(case: &Case, config: &ModelConfig, device: &Device) -> (ModelRunner, Plan) {
    let plan = plan_for(config, device);
    let options = LoadOptions {
        device: device.clone(),
        dtype: config.dtype,
    };
    let stream = StreamConfig {
        prefetch: config.offload.prefetch,
        link_bandwidth: None,
    };
    let checkpoint = Checkpoint::open(&case.files).expect("checkpoint");
    let mut placed = load_placed(&checkpoint, &options, &plan, stream, &mut |_| {})
        .unwrap_or_else(|e| panic!("{} {:?}: load: {e}", case.label, config.offload.mode));
    // The cache the plan counted.
    placed.model.set_kv_dtype(plan.kv_dtype);
    placed.model.set_kv_host(plan.kv_host);
    (
        ModelRunner::new(placed.model, placed.store, Some(MAX_CONTEXT)),
        plan,
    )
}

fn argmax(logits: &[f32]) -> u32 {
    logits
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i as u32)
        .expect("non-empty logits")
}

/// Greedy tokens after `prompt`, and the logits of every step.
fn greedy(runner: &mut ModelRunner, prompt: &[u32]) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut seq = runner.new_sequence();
    let mut logits = runner.forward(&mut seq, prompt).expect("prefill");
    let (mut tokens, mut all) = (Vec::new(), Vec::new());
    for _ in 0..NEW_TOKENS {
        let next = argmax(&logits);
        tokens.push(next);
        all.push(logits);
        logits = runner.forward(&mut seq, &[next]).expect("decode");
    }
    all.push(logits);
    (tokens, all)
}

fn max_abs(v: &[Vec<f32>]) -> f32 {
    v.iter().flatten().fold(0f32, |m, x| m.max(x.abs()))
}

fn max_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| tiny::max_abs_diff(x, y))
        .fold(0f32, f32::max)
}

#[test]
fn every_mode_decodes_like_none_on_the_gpu() {
    let device = gpu();
    let dir = tempfile::tempdir().expect("tempdir");
    for case in cases(dir.path()) {
        let none_config = model_config(&case, OffloadMode::None, BIG, 0);
        let (mut none, none_plan) = runner(&case, &none_config, &device);
        let (reference, reference_logits) = greedy(&mut none, PROMPT);
        drop(none);
        let n = none_plan.layers.len();
        let mut configs = vec![
            model_config(&case, OffloadMode::Sequential, BIG, 1),
            model_config(&case, OffloadMode::Sequential, BIG, 2),
        ];
        for k in [n / 2, n - 1] {
            let budget = MemoryBudget::Bytes(budget_for(&none_plan, k, 2));
            configs.push(model_config(&case, OffloadMode::Auto, budget, 2));
        }
        for config in configs {
            let (mut r, plan) = runner(&case, &config, &device);
            let what = format!(
                "{} {:?} prefetch {}",
                case.label, config.offload.mode, config.offload.prefetch
            );
            assert!(plan.host_layers() > 0, "{what}: nothing streams");
            assert_eq!(r.store().slots(), plan.slots, "{what}");
            let (tokens, logits) = greedy(&mut r, PROMPT);
            assert_eq!(tokens, reference, "{what}");
            // The same kernels on the same bytes: streamed layers must not change the numbers.
            let diff = max_diff(&logits, &reference_logits);
            assert!(
                diff <= 1e-4 * max_abs(&reference_logits).max(1.0),
                "{what}: logits differ by {diff}"
            );
            let acc = r.accounting();
            assert_eq!(acc.check_within_plan(), Ok(()), "{what}: {acc:?}");
            let passes = NEW_TOKENS as u64 + 1;
            assert!(
                acc.copies >= passes * plan.host_layers() as u64,
                "{what}: {acc:?}"
            );
            assert!(acc.max_slots_busy <= plan.slots as u64, "{what}: {acc:?}");
        }
    }
}

#[test]
fn gpu_logits_match_the_cpu() {
    let device = gpu();
    let dir = tempfile::tempdir().expect("tempdir");
    for case in cases(dir.path()) {
        // The CPU has no bf16 matmul: compare bf16 on the GPU with f32 on the CPU.
        let cpu_case = Case {
            dtype: match case.dtype {
                DtypeChoice::BF16 => DtypeChoice::F32,
                other => other,
            },
            label: case.label,
            source: case.source.clone(),
            files: case.files.clone(),
        };
        let (mut on_cpu, _) = runner(
            &cpu_case,
            &model_config(&cpu_case, OffloadMode::None, BIG, 0),
            &Device::Cpu,
        );
        let (mut on_gpu, _) = runner(
            &case,
            &model_config(&case, OffloadMode::Sequential, BIG, 2),
            &device,
        );
        // Teacher forcing: both see the CPU's tokens, so one near-tie cannot derail the rest.
        let (cpu_tokens, cpu_logits) = greedy(&mut on_cpu, PROMPT);
        let mut seq = on_gpu.new_sequence();
        let mut gpu_logits = vec![on_gpu.forward(&mut seq, PROMPT).expect("prefill")];
        for &t in &cpu_tokens {
            gpu_logits.push(on_gpu.forward(&mut seq, &[t]).expect("decode"));
        }
        // Relative to the largest logit: f32 differs in summation order only; the others round
        // weights or activations (f16, bf16, and q8_1 activations in candle's CUDA kernels vs
        // ferry's int8 CPU kernels).
        let tolerance = match case.label {
            "hf f32" => 1e-3,
            "hf f16" => 2e-2,
            _ => 6e-2,
        };
        let diff = max_diff(&gpu_logits, &cpu_logits);
        let scale = max_abs(&cpu_logits).max(1.0);
        eprintln!(
            "{}: max |gpu - cpu| = {diff} (largest logit {scale})",
            case.label
        );
        assert!(
            diff <= tolerance * scale,
            "{}: logits differ by {diff} (scale {scale})",
            case.label
        );
    }
}

/// Logits of every step with the CPU's `tokens` forced after `PROMPT`.
fn forced(runner: &mut ModelRunner, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut seq = runner.new_sequence();
    let mut logits = vec![runner.forward(&mut seq, PROMPT).expect("prefill")];
    for &t in tokens {
        logits.push(runner.forward(&mut seq, &[t]).expect("decode"));
    }
    logits
}

#[test]
fn a_host_kv_cache_decodes_like_the_device_cache_on_the_gpu() {
    let device = gpu();
    let dir = tempfile::tempdir().expect("tempdir");
    for case in cases(dir.path()) {
        let tolerance = match case.label {
            "hf f32" => 1e-3,
            "hf f16" | "hf bf16" => 2e-2,
            _ => 1e-3,
        };
        let on_device = model_config(&case, OffloadMode::None, BIG, 0);
        let (mut reference_runner, plan) = runner(&case, &on_device, &device);
        assert!(!plan.kv_host, "{}", case.label);
        let (tokens, reference) = greedy(&mut reference_runner, PROMPT);
        drop(reference_runner);
        // Attention on the host (no rates), and on the device with the positions streamed to
        // it every step (a link the rates call infinitely fast).
        let streamed = HostKvRates {
            link_bytes_per_s: f64::INFINITY,
            host_read_bytes_per_s: 1.0,
            host_flops_per_s: 1.0,
        };
        for (mode, rates) in [
            (OffloadMode::None, None),
            (OffloadMode::Sequential, None),
            (OffloadMode::None, Some(streamed)),
        ] {
            let mut config = model_config(&case, mode, BIG, 1);
            config.kv_offload = KvOffload::On;
            let (mut r, plan) = runner(&case, &config, &device);
            r.set_host_kv_rates(rates);
            let what = format!("{} {mode:?} kv_offload on, rates {rates:?}", case.label);
            assert!(plan.kv_host, "{what}");
            let logits = forced(&mut r, &tokens);
            let diff = max_diff(&logits, &reference);
            let scale = max_abs(&reference).max(1.0);
            eprintln!("{what}: max |host kv - device kv| = {diff} (largest logit {scale})");
            assert!(diff <= tolerance * scale, "{what}: logits differ by {diff}");
            let acc = r.accounting();
            assert_eq!(acc.kv_peak, 0, "{what}: KV bytes on the device: {acc:?}");
            assert_eq!(acc.check_within_plan(), Ok(()), "{what}: {acc:?}");
        }
    }
    // A block-format cache lives on the host on CUDA (auto puts it there): its logits are the
    // CPU device's with the same cache, within the weights' rounding.
    let case = cases(dir.path())
        .into_iter()
        .find(|c| c.label == "hf f32")
        .expect("f32");
    let mut config = model_config(&case, OffloadMode::Sequential, BIG, 1);
    config.kv_dtype = DtypeChoice::Quantize(QuantType::Q8_0);
    let (mut on_gpu, plan) = runner(&case, &config, &device);
    assert!(plan.kv_host, "q8_0 on CUDA goes to the host: {plan:?}");
    let mut cpu_config = model_config(&case, OffloadMode::None, BIG, 0);
    cpu_config.kv_dtype = config.kv_dtype;
    let (mut on_cpu, _) = runner(&case, &cpu_config, &Device::Cpu);
    let (tokens, cpu_logits) = greedy(&mut on_cpu, PROMPT);
    let gpu_logits = forced(&mut on_gpu, &tokens);
    let diff = max_diff(&gpu_logits, &cpu_logits);
    let scale = max_abs(&cpu_logits).max(1.0);
    eprintln!("q8_0 host cache on the GPU: max |gpu - cpu| = {diff} (largest logit {scale})");
    assert!(
        diff <= 1e-3 * scale,
        "q8_0 host cache: logits differ by {diff}"
    );
    // The same cache decoded and streamed to the device every step.
    let (mut streaming, _) = runner(&case, &config, &device);
    streaming.set_host_kv_rates(Some(HostKvRates {
        link_bytes_per_s: f64::INFINITY,
        host_read_bytes_per_s: 1.0,
        host_flops_per_s: 1.0,
    }));
    let streamed_logits = forced(&mut streaming, &tokens);
    let diff = max_diff(&streamed_logits, &cpu_logits);
    eprintln!("q8_0 host cache streamed to the GPU: max |gpu - cpu| = {diff}");
    assert!(
        diff <= 1e-3 * scale,
        "q8_0 streamed: logits differ by {diff}"
    );
}

/// The 1B-class model the GPU check script generates (an HF directory with a tokenizer).
fn script_model() -> PathBuf {
    let dir = std::env::var_os("FERRY_GPU_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!("set FERRY_GPU_TEST_MODEL to an HF model directory (scripts/gpu-check.sh does)")
        });
    assert!(
        dir.join("config.json").is_file(),
        "{}: no config.json",
        dir.display()
    );
    dir
}

fn serving_config(dir: &Path, mode: OffloadMode, budget: MemoryBudget) -> ModelConfig {
    ModelConfig {
        name: "script-model".into(),
        source: dir.to_string_lossy().into_owned(),
        dtype: DtypeChoice::Auto,
        max_context: Some(512),
        max_batch: Some(1),
        offload: OffloadConfig {
            mode,
            gpu_memory: budget,
            prefetch: 2,
            keep_alive: std::time::Duration::from_secs(30),
        },
        ..ModelConfig::default()
    }
}

/// The driver's free bytes right now.
fn driver_free(device: &Device) -> u64 {
    device.synchronize().expect("synchronize");
    ferry::gpu::memory_info(device).expect("memory info").free
}

#[test]
fn the_script_model_decodes_alike_in_every_mode_within_the_driver_budget() {
    let dir = script_model();
    let device = gpu();
    let dconf = device_config(&device);
    let none_config = serving_config(&dir, OffloadMode::None, MemoryBudget::FractionOfFree(0.9));
    let none_plan = plan_for(&none_config, &device);
    let half = MemoryBudget::Bytes(budget_for(&none_plan, none_plan.layers.len() / 2, 2));
    let mut reference: Option<Vec<u32>> = None;
    for (mode, budget) in [
        (OffloadMode::None, MemoryBudget::FractionOfFree(0.9)),
        (OffloadMode::Auto, half),
        (OffloadMode::Sequential, MemoryBudget::FractionOfFree(0.9)),
        (OffloadMode::Model, MemoryBudget::FractionOfFree(0.9)),
    ] {
        let config = serving_config(&dir, mode, budget);
        let plan = plan_for(&config, &device);
        let before = driver_free(&device);
        let loaded = load_for_serving_on(&config, &dconf, &device, &hub())
            .unwrap_or_else(|e| panic!("{mode:?}: load: {e}"));
        let prompt = loaded
            .codec
            .encode("The capital of France is", true)
            .expect("encode");
        let mut r = loaded.runner;
        let mut seq = r.new_sequence();
        let mut logits = r.forward(&mut seq, &prompt).expect("prefill");
        let mut tokens = Vec::new();
        let mut lowest = driver_free(&device);
        let mut slot_bytes = Vec::new();
        for _ in 0..NEW_TOKENS {
            let next = argmax(&logits);
            tokens.push(next);
            logits = r.forward(&mut seq, &[next]).expect("decode");
            lowest = lowest.min(driver_free(&device));
            slot_bytes.push(r.accounting().slots);
        }
        let taken = before.saturating_sub(lowest);
        eprintln!(
            "{mode:?}: driver says ferry took {} MiB, plan allows {} MiB",
            taken >> 20,
            plan.device_bytes >> 20
        );
        assert!(
            taken <= plan.device_bytes,
            "{mode:?}: took {taken} bytes, plan {}",
            plan.device_bytes
        );
        assert!(
            slot_bytes.windows(2).all(|w| w[0] == w[1]),
            "{mode:?}: slot ring changed: {slot_bytes:?}"
        );
        assert_eq!(r.accounting().check_within_plan(), Ok(()), "{mode:?}");
        match &reference {
            None => reference = Some(tokens),
            Some(reference) => assert_eq!(&tokens, reference, "{mode:?}"),
        }
    }
}

/// The Q8_0 test model with every layer streamed through 3 slots.
fn sequential_q8(dir: &Path, device: &Device) -> ModelRunner {
    let case = cases(dir).remove(0);
    let config = model_config(&case, OffloadMode::Sequential, BIG, 2);
    runner(&case, &config, device).0
}

#[test]
fn streaming_allocates_nothing_per_step() {
    let device = gpu();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut r = sequential_q8(dir.path(), &device);
    let mut seq = r.new_sequence();
    let mut logits = r.forward(&mut seq, PROMPT).expect("prefill");
    // Warm up, then watch the driver: the prompt already allocated the KV cache at its
    // MAX_CONTEXT limit (it grows in chunks larger than that), the slots are fixed, and only
    // activations come and go.
    for _ in 0..4 {
        logits = r.forward(&mut seq, &[argmax(&logits)]).expect("decode");
    }
    let slots = r.accounting().slots;
    let steady = driver_free(&device);
    let mut lowest = steady;
    for _ in 0..16 {
        logits = r.forward(&mut seq, &[argmax(&logits)]).expect("decode");
        lowest = lowest.min(driver_free(&device));
    }
    assert_eq!(r.accounting().slots, slots, "slots were reallocated");
    let grew = steady.saturating_sub(lowest);
    let slot_size = slots / r.store().slots().max(1) as u64;
    assert!(
        grew < slot_size,
        "device use grew by {grew} bytes over 16 steps (one slot is {slot_size})"
    );
}

#[test]
fn out_of_memory_fails_the_step_and_the_runner_goes_on() {
    let device = gpu();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut r = sequential_q8(dir.path(), &device);
    let (reference, _) = greedy(&mut r, PROMPT);
    // Fill the card in shrinking chunks until nothing more fits.
    let mut filler: Vec<Tensor> = Vec::new();
    let mut chunk: usize = 1 << 30;
    while chunk >= 1 << 16 {
        match Tensor::zeros(chunk, DType::U8, &device) {
            Ok(t) => filler.push(t),
            Err(_) => chunk /= 2,
        }
    }
    device.synchronize().expect("synchronize");
    let mut seq = r.new_sequence();
    let err = r
        .forward(&mut seq, PROMPT)
        .expect_err("a full card cannot run a step");
    assert!(matches!(err, EngineError::OutOfMemory(_)), "{err:?}");
    drop(filler);
    device.synchronize().expect("synchronize");
    let (tokens, _) = greedy(&mut r, PROMPT);
    assert_eq!(
        tokens, reference,
        "the runner works again once memory is back"
    );
}

/// Q4_K_M's mix: attn_v and ffn_down q6_K in layers 0 and 3, q4_K elsewhere (like llama.cpp).
fn q4_k_m(name: &str) -> GgmlDType {
    let more_bits = name.starts_with("blk.0.") || name.starts_with("blk.3.");
    if more_bits && (name.contains("attn_v") || name.contains("ffn_down")) {
        GgmlDType::Q6K
    } else {
        GgmlDType::Q4K
    }
}

#[test]
fn a_mixed_type_gguf_streams_within_the_plans_slot_bytes() {
    let device = gpu();
    let dir = tempfile::tempdir().expect("tempdir");
    let t = shape();
    let weights = t.random_weights(false, true);
    let path = dir.path().join("q4_k_m.gguf");
    t.write_gguf_typed(&path, "llama", &weights, &q4_k_m, true);
    let case = Case {
        label: "gguf q4_k_m",
        source: path.clone(),
        files: ModelFiles::Gguf { path },
        dtype: DtypeChoice::Auto,
    };
    let none = model_config(&case, OffloadMode::None, BIG, 2);
    let (mut resident, _) = runner(&case, &none, &device);
    let (want, _) = greedy(&mut resident, PROMPT);
    drop(resident);

    let config = model_config(&case, OffloadMode::Sequential, BIG, 2);
    let before = driver_free(&device);
    let (mut r, plan) = runner(&case, &config, &device);
    let slots = r.store().slots() as u64;
    // The slot holds the union of the layers' matrix buffers (both q6_K and q4_K for attn_v and
    // ffn_down), as the plan counted it, and the device holds exactly that.
    let layout = plan.slot_layout.as_ref().expect("a slot layout");
    assert!(layout.matrices.len() > 7, "{layout:?}");
    assert_eq!(r.accounting().slots, slots * plan.slot_bytes);
    let (got, _) = greedy(&mut r, PROMPT);
    assert_eq!(got, want, "sequential decodes like none");
    let used = before.saturating_sub(driver_free(&device));
    // The driver rounds allocations up (2 MiB pages); allow that per allocation, no more.
    let allocations = slots * (layout.matrices.len() as u64 + 1) + 64;
    assert!(
        used <= plan.device_bytes + allocations * (2 << 20),
        "the driver reports {used} bytes used, the plan {}",
        plan.device_bytes
    );
}

/// A tiny Qwen3-MoE (8 experts, top 2, Q8_0 GGUF), written by the test.
fn qwen3_moe(dir: &Path) -> PathBuf {
    use candle_core::quantized::gguf_file::Value;
    let mut tiny = Tiny::llama();
    tiny.gguf_meta = vec![("general.dtype", Value::U32(0))];
    tiny.gguf_meta.extend(tiny::moe_meta(8, 32));
    let mut weights = tiny.qwen3_weights(true);
    tiny.add_experts(&mut weights, 8, 32, false);
    let path = dir.join("qwen3moe-q8.gguf");
    tiny.write_gguf(&path, "qwen3moe", &weights, GgmlDType::Q8_0, false);
    path
}

/// Experts as placement units on the GPU: every expert streamed through a pool of 2 slots (and
/// of 1: a prompt routes to more experts than that, so the pool is refilled in rounds), with
/// prefetch 0 and 1, and half of them resident with a pool of 3, decode the greedy tokens of
/// mode `none`; the pool has the plan's slots and the device memory stays within the plan.
#[test]
fn offloaded_experts_decode_like_none_on_the_gpu() {
    use ferry::config::TierChoice;
    use ferry::model::loader::Holding;
    use ferry::offload::plan::{plan, PlanInput};
    use ferry::offload::sizing::ModelSizes;
    use ferry::offload::{ExpertInput, SlotKind};

    let device = gpu();
    let dir = tempfile::tempdir().expect("tempdir");
    let files = ModelFiles::Gguf {
        path: qwen3_moe(dir.path()),
    };
    let checkpoint = Checkpoint::open(&files).expect("checkpoint");
    let options = LoadOptions {
        device: device.clone(),
        dtype: DtypeChoice::Auto,
    };
    let holding = Holding::new(&checkpoint, &options).expect("holding");
    let sizes = ModelSizes::of(&checkpoint, &holding, SlotKind::Cuda).expect("sizes");
    let plan_with = |mode: OffloadMode, budget: u64, pool: usize| {
        let mut input = PlanInput::new(mode, sizes.layers.clone(), sizes.fixed, budget);
        input.layer_layouts = sizes.layouts.clone();
        input.slot_kind = SlotKind::Cuda;
        input.experts = Some(ExpertInput {
            n_used: 2,
            pool_slots: Some(pool),
            host_layers: Default::default(),
            route_counts: Vec::new(),
        });
        plan(&input).expect("plan")
    };
    let decode = |plan: &Plan, prefetch: usize, what: &str| {
        let stream = StreamConfig {
            prefetch,
            link_bandwidth: None,
        };
        let mut placed = load_placed(&checkpoint, &options, plan, stream, &mut |_| {})
            .unwrap_or_else(|e| panic!("{what}: load: {e}"));
        placed.model.set_kv_dtype(plan.kv_dtype);
        let mut runner = ModelRunner::new(placed.model, placed.store, Some(MAX_CONTEXT));
        if let Some(experts) = runner.store().experts() {
            assert_eq!(
                experts.pool_slots() + experts.scratch_slots(),
                plan.slots,
                "{what}"
            );
            // The pool's streaming: the same kernels as `none` (the host tier has its own test).
            experts.set_tier(TierChoice::Stream);
        }
        let (tokens, _) = greedy(&mut runner, PROMPT);
        let acc = runner.accounting();
        assert_eq!(acc.check_within_plan(), Ok(()), "{what}: {acc:?}");
        tokens
    };
    let none = plan_with(OffloadMode::None, 8 << 30, 2);
    assert!(none.experts.is_none());
    let reference = decode(&none, 0, "none");
    let all_experts: u64 = sizes
        .layouts
        .iter()
        .map(|l| {
            (0..8)
                .map(|e| l.expert(e).resident_bytes(SlotKind::Cuda))
                .sum::<u64>()
        })
        .sum();
    let half = none.device_bytes - all_experts / 2;
    for (mode, budget, pool, prefetch) in [
        (OffloadMode::Sequential, 8 << 30, 2, 0),
        (OffloadMode::Sequential, 8 << 30, 2, 1),
        (OffloadMode::Sequential, 8 << 30, 1, 0),
        (OffloadMode::Auto, half, 3, 1),
    ] {
        let what = format!("{mode:?} pool {pool} prefetch {prefetch}");
        let plan = plan_with(mode, budget, pool);
        assert!(plan.experts.is_some(), "{what}: experts offloaded");
        assert_eq!(decode(&plan, prefetch, &what), reference, "{what}");
    }
}

/// The host tier on CUDA (issue 30, item 1): every expert offloaded through a pool of 2, with
/// tier `stream`, `host` (forced) and `auto` (a cost model that computes an expert 1 row was
/// routed to on the host and streams one several rows were). Streaming runs the GPU's kernels
/// on the same bytes: `none`'s tokens and logits. Host-computed experts run ferry's CPU
/// kernels, which round differently from candle's CUDA ones (q8_1 activations there, int8
/// here): with `none`'s tokens forced, the logits stay within the tolerance
/// `gpu_logits_match_the_cpu` allows for q8_0, and every greedy token whose margin over the
/// runner-up is wider than that is `none`'s. The host decisions are counted, in the accounting
/// and in the layers' last decisions; under `host` no expert byte crosses the link, under
/// `auto` fewer than under `stream`. Experts held dense on CUDA (f32 here) have no host tier.
#[test]
fn offloaded_experts_compute_on_the_host_beside_the_gpu() {
    use ferry::config::TierChoice;
    use ferry::model::loader::Holding;
    use ferry::offload::plan::{plan, PlanInput};
    use ferry::offload::sizing::ModelSizes;
    use ferry::offload::{CostModel, ExpertInput, Served, SlotKind};

    let device = gpu();
    let dir = tempfile::tempdir().expect("tempdir");
    let files = ModelFiles::Gguf {
        path: qwen3_moe(dir.path()),
    };
    let checkpoint = Checkpoint::open(&files).expect("checkpoint");
    let plan_for_dtype = |dtype: DtypeChoice, mode: OffloadMode| {
        let options = LoadOptions {
            device: device.clone(),
            dtype,
        };
        let holding = Holding::new(&checkpoint, &options).expect("holding");
        let sizes = ModelSizes::of(&checkpoint, &holding, SlotKind::Cuda).expect("sizes");
        let mut input = PlanInput::new(mode, sizes.layers.clone(), sizes.fixed, 8 << 30);
        input.layer_layouts = sizes.layouts.clone();
        input.slot_kind = SlotKind::Cuda;
        input.experts = Some(ExpertInput {
            n_used: 2,
            pool_slots: Some(2),
            host_layers: Default::default(),
            route_counts: Vec::new(),
        });
        (options, plan(&input).expect("plan"))
    };
    let load = |options: &LoadOptions, plan: &Plan| {
        let stream = StreamConfig {
            prefetch: 0,
            link_bandwidth: None,
        };
        let mut placed =
            load_placed(&checkpoint, options, plan, stream, &mut |_| {}).expect("load");
        placed.model.set_kv_dtype(plan.kv_dtype);
        ModelRunner::new(placed.model, placed.store, Some(MAX_CONTEXT))
    };
    let (options, none) = plan_for_dtype(DtypeChoice::Auto, OffloadMode::None);
    assert!(none.experts.is_none());
    let (reference, reference_logits) = greedy(&mut load(&options, &none), PROMPT);
    let (options, offloaded) = plan_for_dtype(DtypeChoice::Auto, OffloadMode::Sequential);
    assert!(offloaded.experts.is_some());
    let scale = max_abs(&reference_logits).max(1.0);
    let tolerance = 6e-2 * scale;
    let n_layers = offloaded.layers.len();
    // A runner whose offloaded experts take `tier`, under a cost model in which a copy costs
    // 1 ms and a row on the host 0.4 ms: 1 row computes on the host, from 3 they stream.
    let tiered = |tier: TierChoice| {
        let runner = load(&options, &offloaded);
        let experts = runner.store().experts().expect("an expert store").clone();
        experts.set_tier(tier);
        let work = experts.expert_work(0, 0).expect("offloaded expert 0");
        experts.set_cost_model(Some(CostModel {
            link_bytes_per_s: work.weight_bytes as f64 * 1e3,
            host_flops_per_s: work.flops_per_row / 4e-4,
            host_read_bytes_per_s: 1e15,
            device_flops_per_s: 1e15,
            forced: None,
            activation_bytes_per_s: None,
        }));
        (runner, experts)
    };
    let mut expert_bytes = Vec::new();
    for tier in [TierChoice::Stream, TierChoice::Host, TierChoice::Auto] {
        let what = format!("tier {tier:?}");
        let (mut runner, experts) = tiered(tier);
        assert!(
            experts.computes_on_host(),
            "{what}: Q8_0 experts have a host tier"
        );
        assert_eq!(experts.stream_only_experts(), 0, "{what}");
        let logits = forced(&mut runner, &reference);
        let diff = max_diff(&logits, &reference_logits);
        eprintln!("{what}: max |logits - none's| = {diff} (largest logit {scale})");
        let acc = runner.accounting();
        assert_eq!(acc.check_within_plan(), Ok(()), "{what}: {acc:?}");
        let on_host: usize = (0..n_layers)
            .map(|l| {
                experts
                    .last_decisions(l)
                    .iter()
                    .filter(|d| d.served == Served::Host)
                    .count()
            })
            .sum();
        match tier {
            TierChoice::Stream => {
                // The GPU's kernels on the same bytes.
                assert!(diff <= 1e-4 * scale, "{what}: logits differ by {diff}");
                assert_eq!(acc.expert_host, 0, "{what}: {acc:?}");
            }
            _ => {
                assert!(diff <= tolerance, "{what}: logits differ by {diff}");
                assert!(acc.expert_host > 0, "{what}: nothing on the host: {acc:?}");
                assert!(
                    on_host > 0,
                    "{what}: the last step computed nothing on the host"
                );
            }
        }
        // Greedy decoding: `none`'s tokens wherever `none` was not near a tie (up to the first
        // token that differs: after it the sequences are not comparable).
        let (tokens, _) = greedy(&mut tiered(tier).0, PROMPT);
        for (step, (&got, &want)) in tokens.iter().zip(&reference).enumerate() {
            let mut sorted = reference_logits[step].clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            if sorted[0] - sorted[1] > 2.0 * tolerance {
                assert_eq!(
                    got, want,
                    "{what}: step {step}: {tokens:?} vs {reference:?}"
                );
            }
            if got != want {
                eprintln!("{what}: a near tie at step {step}: {tokens:?} vs {reference:?}");
                break;
            }
        }
        expert_bytes.push((tier, acc.expert_bytes));
    }
    let bytes = |t| expert_bytes.iter().find(|(x, _)| *x == t).map(|(_, b)| *b);
    let stream = bytes(TierChoice::Stream).expect("stream");
    assert!(stream > 0, "streaming copies experts: {expert_bytes:?}");
    assert_eq!(bytes(TierChoice::Host), Some(0), "{expert_bytes:?}");
    assert!(
        bytes(TierChoice::Auto).expect("auto") < stream,
        "{expert_bytes:?}"
    );

    // Experts held dense on CUDA (f32): their pinned slabs have no CPU view, they stream.
    let (options, dense) = plan_for_dtype(DtypeChoice::F32, OffloadMode::Sequential);
    let runner = load(&options, &dense);
    let experts = runner.store().experts().expect("an expert store");
    assert!(!experts.computes_on_host());
    assert_eq!(experts.stream_only_experts(), experts.host_experts());
}

/// The calibration on CUDA (issue 30, item 4) measures what the host tier there costs: the
/// CPU kernels on the weight type, and the round trip of a few rows to the host and back,
/// which the cost model then charges a host-computed unit's activations.
#[test]
fn the_calibration_measures_the_activation_round_trip_on_the_gpu() {
    use ferry::config::TierConfig;
    use ferry::offload::calibrate::{calibrate, CalibrationInput, Probe, Source};

    let device = gpu();
    let tier = TierConfig::default();
    let calibration = calibrate(&CalibrationInput {
        device: &device,
        weight_type: GgmlDType::Q8_0,
        link_bandwidth: None,
        tier: &tier,
        probe: Probe::default(),
    })
    .expect("calibrates");
    eprintln!("{}", calibration.summary());
    assert_eq!(calibration.activations, Some(Source::Measured));
    let m = calibration.model;
    let round_trip = m.activation_bytes_per_s.expect("a measured round trip");
    assert!(round_trip.is_finite() && round_trip > 0.0, "{round_trip}");
    assert!(
        m.host_flops_per_s > 0.0 && m.host_read_bytes_per_s > 0.0,
        "{m:?}"
    );
    assert!(
        calibration.rates().contains("activations round trip"),
        "{}",
        calibration.rates()
    );
}
