//! Quantize on load (`dtype = "q8_0"`, `"q4_k"`, ...): a tiny random Llama written as dense
//! safetensors is quantized by the loader; its logits stay close to the dense model's, the plan
//! counts exactly the bytes the loader holds (and those are the block sizes of the types asked
//! for, with llama.cpp's fallback for rows that are not whole blocks), streamed layers hold the
//! same blocks as resident ones, and the combinations that cannot work are readable errors.

use crate::real_model::model_path;
use crate::tiny::{self, config, cpu, Tiny, BIG};

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::GgmlDType;
use candle_core::{Device, Tensor};
use ferry::config::{DtypeChoice, OffloadMode, QuantType};
use ferry::model::checkpoint::Checkpoint;
use ferry::model::header::GgufType;
use ferry::model::loader::{load_model, Holding, LoadOptions, Role, TensorKind};
use ferry::model::source::ModelFiles;
use ferry::offload::plan::Plan;
use ferry::offload::{load_placed, StreamConfig};
use ferry::runtime::planning::plan_checkpoint;

fn q(ty: QuantType) -> DtypeChoice {
    DtypeChoice::Quantize(ty)
}

fn options(dtype: DtypeChoice) -> LoadOptions {
    LoadOptions {
        device: Device::Cpu,
        dtype,
    }
}

fn plan(files: &ModelFiles, dir: &Path, dtype: DtypeChoice, mode: OffloadMode) -> Plan {
    let checkpoint = Checkpoint::open(files).unwrap();
    plan_checkpoint(
        &config(dir, dtype, mode),
        &cpu(),
        &Device::Cpu,
        &checkpoint,
        BIG,
    )
    .unwrap()
}

/// Writes `tiny` with random weights (untied head) as one safetensors file under `dir`.
fn write(tiny: &Tiny, dir: &Path) -> (ModelFiles, HashMap<String, Tensor>) {
    let weights = tiny.random_weights(false, true);
    let files = tiny.write_hf(dir, &tiny.llama_config(false, None), &weights, 1);
    (files, weights)
}

/// The bytes `weights` take with every matrix quantized as `ty_of(row width)` says (`None`:
/// dense f32) and every vector f32, computed from the shapes alone.
fn expected_bytes(
    weights: &HashMap<String, Tensor>,
    ty_of: impl Fn(usize) -> Option<GgmlDType>,
) -> u64 {
    weights
        .values()
        .map(|t| {
            let elems = t.elem_count();
            let ty = (t.rank() == 2).then(|| ty_of(t.dims()[1])).flatten();
            match ty {
                Some(ty) => (elems / ty.block_size() * ty.type_size()) as u64,
                None => elems as u64 * 4,
            }
        })
        .sum()
}

/// The plan's bytes per layer and fixed part equal what the loader holds; returns the total.
fn plan_matches_loader(files: &ModelFiles, dir: &Path, dtype: DtypeChoice) -> u64 {
    let plan = plan(files, dir, dtype, OffloadMode::None);
    let loaded = load_model(files, &options(dtype), &mut |_| {}).unwrap();
    for (placed, layer) in plan.layers.iter().zip(&loaded.layers.0) {
        assert_eq!(
            placed.bytes,
            layer.size_in_bytes() as u64,
            "{dtype:?}: layer {}",
            placed.index
        );
    }
    assert_eq!(
        plan.fixed_bytes,
        loaded.model.fixed().size_in_bytes(false) as u64,
        "{dtype:?}: fixed parts"
    );
    plan.fixed_bytes + plan.layers.iter().map(|l| l.bytes).sum::<u64>()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b))
}

#[test]
fn q8_0_on_load_keeps_the_dense_logits_and_the_plan_counts_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = Tiny::k_quant_wide();
    let (files, weights) = write(&tiny, dir.path());
    let dense = tiny::ours(&files, DtypeChoice::F32);
    let quantized = tiny::ours(&files, q(QuantType::Q8_0));
    for (step, (d, qz)) in dense.iter().zip(&quantized).enumerate() {
        let scale = d.iter().fold(0f32, |m, x| m.max(x.abs()));
        let diff = tiny::max_abs_diff(d, qz);
        println!("step {step}: max |logit| {scale}, max |q8_0 - f32| {diff}");
        // Measured: up to 0.28 on logits up to 4.4 (the activations are quantized to 8 bits
        // too), cosine above 0.998.
        assert!(diff < 0.1 * scale, "step {step}: {diff} vs {scale}");
        assert!(cosine(d, qz) > 0.998, "step {step}");
        assert!(diff > 0.0, "step {step}: the weights really were quantized");
    }
    let total = plan_matches_loader(&files, dir.path(), q(QuantType::Q8_0));
    assert_eq!(total, expected_bytes(&weights, |_| Some(GgmlDType::Q8_0)));
    let dense_total = plan_matches_loader(&files, dir.path(), DtypeChoice::F32);
    assert!(
        total * 3 < dense_total,
        "q8_0 {total} bytes vs f32 {dense_total}"
    );
}

#[test]
fn every_load_time_type_is_sized_as_loaded_and_stays_close_to_the_dense_model() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = Tiny::k_quant_wide();
    let (files, weights) = write(&tiny, dir.path());
    let dense = tiny::ours(&files, DtypeChoice::F32);
    for ty in QuantType::ALL {
        let candle = ferry::model::loader::holding::ggml_type(ty);
        let total = plan_matches_loader(&files, dir.path(), q(ty));
        assert_eq!(total, expected_bytes(&weights, |_| Some(candle)), "{ty:?}");
        let ours = tiny::ours(&files, q(ty));
        // Random Gaussian weights are the quantizers' worst case, and the kernels quantize
        // the activations too; measured cosines (4 positions) ranged: q2_k 0.25-0.51, q3_k
        // 0.72-0.84, 4-bit 0.88-0.95, 5-bit 0.97-0.99, q6_k 0.989-0.996, q8_0 0.9986-0.9995.
        let floor = match ty {
            QuantType::Q2_K => 0.15,
            QuantType::Q3_K => 0.6,
            QuantType::Q4_0 | QuantType::Q4_1 | QuantType::Q4_K => 0.8,
            QuantType::Q5_0 | QuantType::Q5_1 | QuantType::Q5_K => 0.93,
            QuantType::Q6_K => 0.97,
            QuantType::Q8_0 => 0.995,
        };
        for (d, qz) in dense.iter().zip(&ours) {
            let c = cosine(d, qz);
            println!("{ty:?}: cosine to f32 {c}");
            assert!(c > floor, "{ty:?}: cosine {c} to the dense logits");
        }
    }
}

#[test]
fn blocks_made_at_load_are_the_blocks_a_gguf_of_that_type_holds() {
    // The same weights written as a GGUF whose every matrix candle quantized to the type (the
    // test writer uses candle's quantizer too): ferry serving that file as it is and ferry
    // quantizing the safetensors at load compute the same logits.
    let dir = tempfile::tempdir().unwrap();
    let tiny = Tiny::k_quant_wide();
    let (files, weights) = write(&tiny, dir.path());
    for ty in [QuantType::Q8_0, QuantType::Q4_K, QuantType::Q5_0] {
        let candle = ferry::model::loader::holding::ggml_type(ty);
        let path = dir.path().join(format!("{}.gguf", ty.as_str()));
        tiny.write_gguf_typed(&path, "llama", &weights, &|_| candle, true);
        let from_file = tiny::ours(&ModelFiles::Gguf { path }, DtypeChoice::Auto);
        let at_load = tiny::ours(&files, q(ty));
        for (a, b) in from_file.iter().zip(&at_load) {
            let diff = tiny::max_abs_diff(a, b);
            assert!(diff < 1e-3, "{ty:?}: {diff}");
        }
    }
}

#[test]
fn rows_that_are_not_whole_blocks_fall_back_per_tensor_like_llama_cpp() {
    // Hidden 64 and MLP 128: no row is a whole 256-element super-block, every row is whole
    // 32-element blocks, so q4_k becomes q5_0 and q6_k becomes q8_0 for every matrix.
    let dir = tempfile::tempdir().unwrap();
    let tiny = Tiny::llama();
    let (files, weights) = write(&tiny, dir.path());
    for (ty, fallback) in [
        (QuantType::Q4_K, GgmlDType::Q5_0),
        (QuantType::Q5_K, GgmlDType::Q5_1),
        (QuantType::Q6_K, GgmlDType::Q8_0),
        (QuantType::Q2_K, GgmlDType::Q4_0),
    ] {
        let checkpoint = Checkpoint::open(&files).unwrap();
        let holding = Holding::new(&checkpoint, &options(q(ty))).unwrap();
        let table = checkpoint.tensors();
        let layer = table.layer(0).unwrap();
        for (part, record) in &layer.tensors {
            let role = if part.is_matrix() {
                Role::Matrix
            } else {
                Role::Vector
            };
            let expected = if part.is_matrix() {
                TensorKind::Blocks(GgufType::from_candle(fallback))
            } else {
                TensorKind::Dense(candle_core::DType::F32)
            };
            assert_eq!(holding.kind(role, record).unwrap(), expected, "{ty:?}");
        }
        let total = plan_matches_loader(&files, dir.path(), q(ty));
        assert_eq!(
            total,
            expected_bytes(&weights, |_| Some(fallback)),
            "{ty:?}"
        );
    }
    // A width that is not even whole 32-element blocks stays dense.
    let odd = dir.path().join("odd");
    std::fs::create_dir_all(&odd).unwrap();
    let tiny = Tiny {
        hidden: 48,
        inter: 96,
        heads: 3,
        kv_heads: 1,
        ..Tiny::llama()
    };
    let (files, weights) = write(&tiny, &odd);
    let total = plan_matches_loader(&files, &odd, q(QuantType::Q8_0));
    let expected = expected_bytes(&weights, |row| (row % 32 == 0).then_some(GgmlDType::Q8_0));
    assert_eq!(total, expected);
    let dense = tiny::ours(&files, DtypeChoice::F32);
    let ours = tiny::ours(&files, q(QuantType::Q8_0));
    assert!(cosine(&dense[0], &ours[0]) > 0.99);
}

#[test]
fn streamed_layers_hold_the_blocks_the_resident_ones_do() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = Tiny::k_quant_wide();
    let (files, _) = write(&tiny, dir.path());
    let dtype = q(QuantType::Q4_K);
    let checkpoint = Checkpoint::open(&files).unwrap();
    let plan = plan(&files, dir.path(), dtype, OffloadMode::Sequential);
    assert_eq!(plan.host_layers(), 2);
    let stream = StreamConfig {
        prefetch: 1,
        link_bandwidth: None,
    };
    let mut placed = load_placed(&checkpoint, &options(dtype), &plan, stream, &mut |_| {}).unwrap();
    let mut cache = placed.model.new_cache();
    let streamed = placed
        .model
        .forward(tiny::PROMPT, &mut cache, &mut placed.store)
        .unwrap();
    placed
        .store
        .accounting()
        .snapshot()
        .check_within_plan()
        .unwrap();
    let resident = tiny::ours(&files, dtype);
    let diff = tiny::max_abs_diff(&streamed.to_vec1::<f32>().unwrap(), &resident[0]);
    assert_eq!(diff, 0.0);
}

#[test]
fn a_dense_gguf_quantizes_and_a_quantized_one_is_refused_by_plan_and_loader() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = Tiny::k_quant_wide();
    let weights = tiny.random_weights(false, true);
    let path = dir.path().join("f32.gguf");
    tiny.write_gguf(&path, "llama", &weights, GgmlDType::F32, true);
    let files = ModelFiles::Gguf { path: path.clone() };
    let total = plan_matches_loader(&files, &path, q(QuantType::Q6_K));
    assert_eq!(total, expected_bytes(&weights, |_| Some(GgmlDType::Q6K)));

    // The default model is Q4_1 already.
    let files = ModelFiles::Gguf { path: model_path() };
    let checkpoint = Checkpoint::open(&files).unwrap();
    let cfg = config(&model_path(), q(QuantType::Q8_0), OffloadMode::None);
    let planned = plan_checkpoint(&cfg, &cpu(), &Device::Cpu, &checkpoint, BIG)
        .expect_err("plan refuses")
        .to_string();
    let loading = load_model(&files, &options(q(QuantType::Q8_0)), &mut |_| {})
        .expect_err("loader refuses")
        .to_string();
    assert!(planned.contains(&loading), "{planned} / {loading}");
    assert!(
        loading.contains("dtype q8_0 quantizes a dense model at load")
            && loading.contains("already quantized")
            && loading.contains("`token_embd.weight` is Q")
            && loading.contains("use dtype auto"),
        "{loading}"
    );
}

#[test]
fn an_hf_directory_is_served_over_http_with_dtype_q8_0() {
    use ferry::engine::{EngineHandle, TextCodec};
    use ferry::model::source::HubOptions;
    use ferry::runtime::load::load_for_serving;
    use ferry::server::{app, ServerOptions};

    // A tiny Llama with SmolLM2's vocabulary and its real tokenizer files beside the weights.
    let dir = tempfile::tempdir().unwrap();
    let mut tiny = Tiny::llama();
    tiny.vocab = 49152;
    write(&tiny, dir.path());
    std::fs::rename(
        dir.path().join("model-00001-of-00001.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let tokenizer =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2-hf-tokenizer");
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tokenizer.join(file), dir.path().join(file)).unwrap();
    }
    let answer = |dtype: DtypeChoice| {
        let cfg = config(dir.path(), dtype, OffloadMode::None);
        let hub = HubOptions::from_env(|_| None);
        let loaded = load_for_serving(&cfg, &Device::Cpu, &hub).expect("loads");
        let bytes = loaded.runner.model().fixed().size_in_bytes(false);
        let engine = EngineHandle::new(["m"]);
        engine
            .model_ready(
                "m",
                loaded.runner,
                loaded.codec as std::sync::Arc<dyn TextCodec>,
            )
            .unwrap();
        let router = app(std::sync::Arc::new(engine), ServerOptions::default());
        let body = serde_json::json!({"model": "m", "prompt": "Hello there", "max_tokens": 3,
                                      "temperature": 0, "logprobs": 1});
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let reply = runtime.block_on(crate::common::post(&router, "/v1/completions", body));
        assert_eq!(reply.status, axum::http::StatusCode::OK, "{}", reply.text());
        let json = reply.json();
        assert_eq!(json["usage"]["completion_tokens"], 3);
        let first = json["choices"][0]["logprobs"]["token_logprobs"][0]
            .as_f64()
            .unwrap();
        (bytes, first)
    };
    let (dense_bytes, dense_logprob) = answer(DtypeChoice::F32);
    let (q8_bytes, q8_logprob) = answer(q(QuantType::Q8_0));
    // The fixed parts (embedding, norm, head) are held in q8_0: about a quarter of f32.
    assert!(q8_bytes * 3 < dense_bytes, "{q8_bytes} vs {dense_bytes}");
    assert!(
        (dense_logprob - q8_logprob).abs() < 0.05,
        "first token's logprob {q8_logprob} vs dense {dense_logprob}"
    );
}

#[test]
fn the_cli_names_what_it_accepts_for_bad_dtypes() {
    let ferry = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
            .arg("plan")
            .arg("--model")
            .arg(model_path())
            .args(args)
            .output()
            .expect("runs");
        assert!(!out.status.success(), "{args:?} must fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = ferry(&["--dtype", "q8_1"]);
    assert!(
        err.contains("`q8_1` is not a dtype") && err.contains("q4_k"),
        "{err}"
    );
    let err = ferry(&["--kv-dtype", "q6_k"]);
    assert!(err.contains("the KV cache does not take"), "{err}");
    let err = ferry(&["--dtype", "q4_k"]);
    assert!(err.contains("already quantized"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
