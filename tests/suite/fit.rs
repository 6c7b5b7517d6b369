//! Defaults that fit (`offload::fit`): a model whose full-context KV cache does not fit the budget
//! is planned and loaded with a fitted context (the log line names it; `ferry plan` shows it and
//! where it came from); a set `max_context` that does not fit is refused with its cost and the
//! largest value that fits; the KV cache's dtype (`kv_dtype`) halves its bytes in the plan and in
//! the cache, and greedy decoding with an f16 or bf16 cache stays close to the f32 one.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device};
use serde_json::Value;

use ferry::config::{DeviceConfig, DtypeChoice, MemoryBudget, OffloadMode, QuantType};
use ferry::engine::traits::LanguageModel;
use ferry::model::kv_format::KvFormat;
use ferry::model::loader::{load_model, LoadOptions};
use ferry::model::source::{HubOptions, ModelFiles};
use ferry::offload::Origin;
use ferry::runtime::device_plan::DevicePlan;
use ferry::runtime::load::load_for_serving;
use ferry::runtime::planning::plan_model;

use crate::real_model::{self, model_path};
use crate::tiny::Tiny;

const MIB: u64 = 1 << 20;
/// The tiny model's declared window: a million tokens (3 GiB of f16 KV cache at batch 8).
const LONG: usize = 1 << 20;

fn hub() -> HubOptions {
    HubOptions::from_env(|_| None)
}

/// A tiny random Llama GGUF that declares a [`LONG`] context.
pub(crate) fn long_context_gguf(dir: &Path) -> std::path::PathBuf {
    let tiny = Tiny::llama();
    let path = dir.join("long.gguf");
    tiny.write_gguf_context(&path, "llama", &tiny.random_weights(false, false), LONG);
    path
}

/// `ferry plan` on `model` on the CPU with a 256 MiB budget and `extra` flags: (ok, stdout,
/// stderr).
pub(crate) fn ferry_plan(model: &Path, extra: &[&str]) -> (bool, String, String) {
    run_plan(
        Command::new(env!("CARGO_BIN_EXE_ferry"))
            .arg("plan")
            .arg("--model")
            .arg(model)
            .args(["--device", "cpu", "--gpu-memory", "256MiB"])
            .args(extra)
            .env("RUST_LOG", "info"),
    )
}

/// Runs a `ferry plan` `command` (without `RUST_BACKTRACE`): (ok, stdout (UTF-8), stderr).
pub fn run_plan(command: &mut Command) -> (bool, String, String) {
    let output = command.env_remove("RUST_BACKTRACE").output().expect("runs");
    (
        output.status.success(),
        String::from_utf8(output.stdout).expect("utf-8"),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn a_long_context_model_is_planned_with_a_fitted_context() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = long_context_gguf(dir.path());
    let (ok, stdout, stderr) = ferry_plan(&model, &["--json"]);
    assert!(ok, "{stderr}");
    let document: Value = serde_json::from_str(&stdout).expect("JSON");
    let plan = &document["models"][0]["plan"];
    let context = plan["max_context"].as_u64().expect("max_context") as usize;
    assert!((4096..LONG).contains(&context), "{plan}");
    assert_eq!(context % 256, 0);
    assert_eq!(plan["model_context"], LONG);
    assert_eq!(plan["max_batch"], 8, "the context shrinks before the batch");
    assert_eq!(plan["kv_dtype"], "f16", "the default, on the CPU too");
    assert_eq!(
        plan["origin"],
        serde_json::json!({"max_context": "fitted", "max_batch": "default", "kv_dtype": "default"})
    );
    let (device, budget) = (plan["device_bytes"].as_u64(), plan["budget_bytes"].as_u64());
    assert!(device <= budget && budget == Some(256 * MIB), "{plan}");
    assert!(
        plan["layers"]
            .as_array()
            .expect("layers")
            .iter()
            .all(|l| l["home"] == "device"),
        "no layer leaves the device: {plan}"
    );
    // One log line says what was chosen and why.
    let line = stderr
        .lines()
        .find(|l| l.contains("fitted the KV cache"))
        .unwrap_or_else(|| panic!("no fit line in:\n{stderr}"));
    assert!(
        line.contains(&format!(
            "`max_context` {context} (the model's {LONG}, lowered)"
        )) && line.contains("`max_batch` 8 (the default)")
            && line.contains("of KV cache (f16)"),
        "{line}"
    );

    // The text listing shows the same choice.
    let (ok, text, stderr) = ferry_plan(&model, &[]);
    assert!(ok, "{stderr}");
    assert!(
        text.contains(&format!(
            "cache   max_context {context} (fitted; the model's {LONG}), max_batch 8 (default), kv_dtype f16 (default)"
        )),
        "{text}"
    );
}

#[test]
fn sequential_streaming_of_a_model_that_fits_is_warned_about() {
    let plan = |budget: &str| {
        run_plan(
            Command::new(env!("CARGO_BIN_EXE_ferry"))
                .args(["plan", "--json", "--model"])
                .arg(model_path())
                .args([
                    "--device",
                    "cpu",
                    "--offload",
                    "sequential",
                    "--gpu-memory",
                    budget,
                ])
                .args(["--max-context", "1024", "--max-batch", "1"]),
        )
    };
    let (ok, stdout, stderr) = plan("4GiB");
    assert!(ok, "{stderr}");
    let document: Value = serde_json::from_str(&stdout).expect("JSON");
    let notes = &document["models"][0]["plan"]["notes"];
    let warning = "offload mode `sequential` streams all 30 layers";
    assert!(
        notes.as_array().is_some_and(|n| n
            .iter()
            .any(|note| note.as_str().is_some_and(|t| t.starts_with(warning)))),
        "{notes}"
    );
    assert!(
        stderr.contains("WARN") && stderr.contains(warning),
        "{stderr}"
    );
    // A budget that holds the ring but not the whole model: streaming is the point.
    let (ok, stdout, stderr) = plan("85MiB");
    assert!(ok, "{stderr}");
    assert!(
        !stdout.contains(warning) && !stderr.contains(warning),
        "{stdout}"
    );
}

#[test]
fn an_oversized_max_context_is_refused_with_its_cost_and_what_fits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = long_context_gguf(dir.path());
    let (ok, _, stderr) = ferry_plan(&model, &["--max-context", &LONG.to_string()]);
    assert!(!ok, "a million tokens of workspace cannot fit 256 MiB");
    assert!(
        stderr.contains(&format!("`max_context` {LONG} (set) with `max_batch` 1")),
        "{stderr}"
    );
    assert!(stderr.contains("of KV cache (f16) and"), "{stderr}");
    let marker = "the largest that fit: `max_context` ";
    let at = stderr.find(marker).unwrap_or_else(|| panic!("{stderr}")) + marker.len();
    let largest: usize = stderr[at..]
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(stderr[at..].starts_with(&format!("{largest} with `max_batch` 1")));

    // It is the largest at the step size planned (512 tokens, set here: an unset one would be
    // lowered to fit one token more): it fits, one token more does not.
    let (ok, stdout, stderr) = ferry_plan(
        &model,
        &[
            "--json",
            "--max-step-tokens",
            "512",
            "--max-batch",
            "1",
            "--max-context",
            &largest.to_string(),
        ],
    );
    assert!(ok, "{stderr}");
    let document: Value = serde_json::from_str(&stdout).expect("JSON");
    let plan = &document["models"][0]["plan"];
    assert_eq!(plan["max_context"], largest);
    assert_eq!(plan["origin"]["max_context"], "set");
    assert!(plan["device_bytes"].as_u64() <= plan["budget_bytes"].as_u64());
    let one_more = (largest + 1).to_string();
    let (ok, _, stderr) = ferry_plan(
        &model,
        &[
            "--max-step-tokens",
            "512",
            "--max-batch",
            "1",
            "--max-context",
            &one_more,
        ],
    );
    assert!(!ok, "{one_more} tokens must not fit");
    assert!(stderr.contains("`max_context`"), "{stderr}");
}

/// A `tracing` writer into a shared buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("lock").extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_real_model_loads_with_a_fitted_context_within_its_budget() {
    // SmolLM2 (8192 tokens) with 8 sequences and the default f16 cache needs 1.8 GiB of KV cache
    // and workspace; 1.5 GiB leaves room for about 6000 tokens next to the weights.
    let budget = 1536 * MIB;
    let mut config = real_model::model_config(DtypeChoice::Auto);
    config.max_context = None;
    config.max_batch = None;
    config.offload.mode = OffloadMode::Auto;
    config.offload.gpu_memory = MemoryBudget::Bytes(budget);
    let plan =
        plan_model(&config, &DeviceConfig::default(), &Device::Cpu, &hub(), 0).expect("plans");
    assert!(plan.device_bytes <= budget);
    assert!(
        plan.max_context >= 4096 && plan.max_context < 8192,
        "{plan:?}"
    );
    assert_eq!(plan.origins.max_context, Origin::Fitted);
    assert_eq!(plan.max_batch, 8);
    assert_eq!(plan.host_layers(), 0);

    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let loaded = tracing::subscriber::with_default(subscriber, || {
        load_for_serving(&config, &Device::Cpu, &hub()).map_err(|e| e.to_string())
    })
    .expect("loads");
    assert_eq!(loaded.runner.max_context(), plan.max_context);
    let log = String::from_utf8(captured.0.lock().expect("lock").clone()).expect("utf-8");
    let line = log
        .lines()
        .find(|l| l.contains("fitted the KV cache"))
        .unwrap_or_else(|| panic!("no fit line in:\n{log}"));
    assert!(
        line.contains(&format!(
            "`max_context` {} (the model's 8192, lowered)",
            plan.max_context
        )),
        "{line}"
    );
}

/// The real model's greedy tokens after "The capital of France is" with its cache in `kv`, and
/// the top-1 choice at each step when fed `forced` (another run's tokens) instead.
fn greedy(kv: KvFormat, steps: usize, forced: Option<&[u32]>) -> (Vec<u32>, Vec<Vec<f32>>, usize) {
    greedy_from(kv, &[504, 3575, 282, 4649, 314], steps, forced)
}

#[test]
fn f16_and_bf16_caches_halve_the_bytes_and_keep_greedy_decoding_close() {
    let steps = 24;
    let dense = KvFormat::Dense;
    let (reference, f32_logits, f32_bytes) = greedy(dense(DType::F32), steps, None);
    // An f32 cache is the unchanged path: the same logits as the compute dtype's cache.
    let files = ModelFiles::Gguf { path: model_path() };
    let options = LoadOptions {
        device: Device::Cpu,
        dtype: DtypeChoice::Auto,
    };
    let loaded = load_model(&files, &options, &mut |_| {}).expect("loads");
    // (The model API's own default; the runtime sets the plan's, f16 unless `kv_dtype` is set.)
    assert_eq!(
        loaded.model.kv_dtype(),
        dense(DType::F32),
        "the activation dtype"
    );
    drop(loaded);
    let (again, again_logits, _) = greedy(dense(DType::F32), steps, None);
    assert_eq!((&again, &again_logits), (&reference, &f32_logits));

    let vocab = ferry::model::tokenizer::TextTokenizer::from_gguf_metadata(
        ferry::model::checkpoint::Checkpoint::open(&files)
            .expect("opens")
            .gguf_metadata()
            .expect("GGUF metadata"),
    )
    .expect("tokenizer");
    let text = |ids: &[u32]| vocab.decode(ids, true).expect("decodes");
    assert!(text(&reference).contains("Paris"), "{}", text(&reference));

    for kv in [dense(DType::F16), dense(DType::BF16)] {
        let (own, _, bytes) = greedy(kv, steps, None);
        assert_eq!(bytes * 2, f32_bytes, "{kv:?} takes half the bytes");
        assert!(text(&own).contains("Paris"), "{kv:?}: {}", text(&own));
        // Fed the f32 run's tokens, the top-1 choice mostly agrees with it.
        let (forced, _, _) = greedy(kv, steps, Some(&reference));
        let same = forced
            .iter()
            .zip(&reference)
            .filter(|(a, b)| a == b)
            .count();
        eprintln!("{kv:?}: top-1 equal at {same} of {steps} steps");
        assert!(same * 10 >= steps * 9, "{kv:?}: {same} of {steps}");
    }
}

#[test]
fn the_plan_counts_the_kv_cache_in_its_dtype() {
    let mut config = real_model::model_config(DtypeChoice::Auto);
    config.offload.gpu_memory = MemoryBudget::Bytes(4096 * MIB);
    let kv = |dtype| {
        let mut config = config.clone();
        config.kv_dtype = dtype;
        let plan =
            plan_model(&config, &DeviceConfig::default(), &Device::Cpu, &hub(), 0).expect("plans");
        (plan.kv_bytes, plan.kv_dtype, plan.origins.kv_dtype)
    };
    let dense = KvFormat::Dense;
    let (f16_bytes, dtype, origin) = kv(DtypeChoice::Auto);
    assert_eq!((dtype, origin), (dense(DType::F16), Origin::Default));
    // 2048 tokens x 4 sequences x 30 layers x 2 x 3 heads x 64 x 2 bytes.
    assert_eq!(f16_bytes, 2048 * 4 * 30 * 2 * 3 * 64 * 2);
    assert_eq!(
        kv(DtypeChoice::F32),
        (f16_bytes * 2, dense(DType::F32), Origin::Set)
    );
    for (choice, dtype) in [
        (DtypeChoice::F16, DType::F16),
        (DtypeChoice::BF16, DType::BF16),
    ] {
        assert_eq!(kv(choice), (f16_bytes, dense(dtype), Origin::Set));
    }
    // llama.cpp's blocks: 34 and 18 bytes per 32 values, against 64 bytes in f16.
    let q8 = DtypeChoice::Quantize(QuantType::Q8_0);
    let q4 = DtypeChoice::Quantize(QuantType::Q4_0);
    assert_eq!(kv(q8), (f16_bytes / 64 * 34, KvFormat::Q8_0, Origin::Set));
    assert_eq!(kv(q4), (f16_bytes / 64 * 18, KvFormat::Q4_0, Origin::Set));
}

#[test]
fn block_caches_keep_the_top_choice_of_an_f16_cache() {
    // Five prompts: the top-1 next token with an f16 cache, against each block format's, and
    // then over 16 greedy steps, each format fed the f16 run's tokens. A near tie can flip a
    // step with any change of cache (an f32 cache differs from f16 by up to 0.6 in the logits
    // of this model). Both must agree on the first token of 4 of 5 prompts; q8_0 on 90% of the
    // steps, the coarser q4_0 on 85% (measured: 77 and 73 of 80; q4_0 kept 63 before its cache
    // was rotated, `kv_format::rotate`).
    let files = ModelFiles::Gguf { path: model_path() };
    let vocab = ferry::model::tokenizer::TextTokenizer::from_gguf_metadata(
        ferry::model::checkpoint::Checkpoint::open(&files)
            .expect("opens")
            .gguf_metadata()
            .expect("GGUF metadata"),
    )
    .expect("tokenizer");
    let prompts = [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, there was a little",
        "The quick brown fox jumps over the",
        "Water boils at a temperature of",
    ];
    let steps = 16;
    let f16 = KvFormat::Dense(DType::F16);
    let references: Vec<(Vec<u32>, Vec<u32>)> = prompts
        .iter()
        .map(|text| {
            let prompt = vocab.encode(text, false).expect("encodes");
            let (reference, _, _) = greedy_from(f16, &prompt, steps, None);
            (prompt, reference)
        })
        .collect();
    for (format, prompts_floor, steps_floor) in
        [(KvFormat::Q8_0, 4, 0.9), (KvFormat::Q4_0, 4, 0.85)]
    {
        let (mut first_equal, mut steps_equal) = (0, 0);
        for (text, (prompt, reference)) in prompts.iter().zip(&references) {
            let (forced, _, _) = greedy_from(format, prompt, steps, Some(reference));
            let same = forced.iter().zip(reference).filter(|(a, b)| a == b).count();
            eprintln!("{format:?} {text:?}: top-1 equal at {same} of {steps} steps");
            first_equal += usize::from(forced[0] == reference[0]);
            steps_equal += same;
        }
        assert!(
            first_equal >= prompts_floor,
            "{format:?}: the top-1 agrees on {first_equal} of 5 prompts"
        );
        let share = steps_equal as f64 / (5 * steps) as f64;
        assert!(
            share >= steps_floor,
            "{format:?}: {share:.2} of the steps agree"
        );
    }
}

/// [`greedy`] from `prompt`: the tokens, each step's logits and the cache's allocated bytes.
fn greedy_from(
    kv: KvFormat,
    prompt: &[u32],
    steps: usize,
    forced: Option<&[u32]>,
) -> (Vec<u32>, Vec<Vec<f32>>, usize) {
    let files = ModelFiles::Gguf { path: model_path() };
    let options = LoadOptions {
        device: Device::Cpu,
        dtype: DtypeChoice::Auto,
    };
    let mut loaded = load_model(&files, &options, &mut |_| {}).expect("loads");
    loaded.model.set_kv_dtype(kv);
    let mut layers = loaded.layers;
    let mut cache = loaded.model.new_cache_with_limit(512);
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .fold(0, |best, (i, x)| if *x > v[best] { i } else { best }) as u32
    };
    let mut logits: Vec<Vec<f32>> = Vec::new();
    let mut tokens = Vec::new();
    let mut input = prompt.to_vec();
    for step in 0..steps {
        let out: Vec<f32> = loaded
            .model
            .forward(&input, &mut cache, &mut layers)
            .expect("forward")
            .to_vec1()
            .expect("f32");
        let next = argmax(&out);
        tokens.push(next);
        logits.push(out);
        input = vec![forced.map_or(next, |f| f[step])];
    }
    (tokens, logits, cache.allocated_bytes())
}

/// The real model in mode `none` with its context and batch set (4096, 1) and `max_step_tokens`
/// as given, against a budget of `budget` bytes.
fn step_tokens_config(budget: u64, max_step_tokens: Option<usize>) -> ferry::config::Config {
    let mut model = real_model::model_config(DtypeChoice::Auto);
    model.max_context = Some(4096);
    model.max_batch = Some(1);
    model.max_step_tokens = max_step_tokens;
    model.offload.gpu_memory = MemoryBudget::Bytes(budget);
    ferry::config::Config {
        models: vec![model],
        ..ferry::config::Config::default()
    }
}

#[test]
fn an_unset_max_step_tokens_is_lowered_before_a_refusal_and_a_set_one_is_not() {
    let planned = |budget: u64, step: Option<usize>| {
        let config = step_tokens_config(budget, step);
        DevicePlan::new(&config, &Device::Cpu, &hub(), 64 << 30).map_err(|e| e.to_string())
    };
    let roomy = 8 << 30;
    let at_512 = planned(roomy, None).expect("fits");
    let at_128 = planned(roomy, Some(128)).expect("fits");
    let (full, small) = (&at_512.models[0].plan, &at_128.models[0].plan);
    assert_eq!(
        full.max_step_tokens, 512,
        "the default, unlowered with room"
    );
    assert_eq!(small.max_step_tokens, 128);
    assert!(small.workspace_bytes < full.workspace_bytes);
    assert!(
        !full.notes.iter().any(|n| n.contains("max_step_tokens")),
        "{:?}",
        full.notes
    );

    // Room for the weights, the cache and the workspace of 128 tokens, not of 512.
    let budget = (full.device_bytes + small.device_bytes) / 2;
    let lowered = planned(budget, None).expect("an unset value is lowered to fit");
    let model = &lowered.models[0];
    let tokens = model.plan.max_step_tokens;
    assert!((128..512).contains(&tokens) && tokens % 64 == 0, "{tokens}");
    assert!(model.plan.device_bytes <= budget);
    assert_eq!(model.plan.mode, OffloadMode::None);
    assert!(
        model.plan.notes[0].starts_with(&format!(
            "fitted `max_step_tokens` {tokens} (the default 512, lowered)"
        )),
        "{:?}",
        model.plan.notes
    );
    assert_eq!(
        model.config.max_step_tokens,
        Some(tokens),
        "serve runs the engine with the fitted value"
    );
    assert_eq!(
        ferry::runtime::serve::engine_options(
            &ferry::config::Config {
                models: vec![model.config.clone()],
                ..ferry::config::Config::default()
            },
            ferry::metrics::Metrics::new()
        )
        .max_step_tokens,
        tokens
    );

    let message = planned(budget, Some(512)).expect_err("a set value is kept");
    assert!(message.contains("MiB of workspace"), "{message}");
    assert!(
        message.contains("a lower `max_step_tokens` shrinks the workspace"),
        "{message}"
    );
}
