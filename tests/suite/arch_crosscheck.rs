//! Cross-checks ferry's Llama-family model against candle-transformers on tiny random models.
//!
//! Each test builds random weights, writes them as a real checkpoint (config.json +
//! safetensors, or GGUF), loads them through ferry's loader and through candle-transformers'
//! own implementation, and compares the logits of a prefill and of several decode steps that
//! go through the key/value cache.

use crate::tiny;

use candle_core::quantized::{gguf_file, GgmlDType};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::{llama, mistral, quantized_llama, qwen2};
use ferry::model::decoder::{LayerSource, ResidentLayers};
use ferry::model::loader::{load_model, DtypeChoice, LoadOptions};
use ferry::model::source::ModelFiles;
use ferry::model::weights::LayerWeights;
use ferry::model::ModelError;
use tiny::{max_abs_diff, ours, Tiny, PROMPT, STEPS};

/// Runs candle's model through the same prefill + decode schedule.
pub fn reference(
    mut step: impl FnMut(&Tensor, usize) -> candle_core::Result<Tensor>,
) -> Vec<Vec<f32>> {
    let dev = Device::Cpu;
    let mut run = |ids: &[u32], pos: usize| -> Vec<f32> {
        let ids = Tensor::new(ids, &dev).unwrap().unsqueeze(0).unwrap();
        step(&ids, pos)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap()
    };
    let mut out = vec![run(PROMPT, 0)];
    for (pos, &t) in (PROMPT.len()..).zip(STEPS) {
        out.push(run(&[t], pos));
    }
    out
}

pub fn assert_all_close(ours: &[Vec<f32>], theirs: &[Vec<f32>], tol: f32, what: &str) {
    assert_eq!(ours.len(), theirs.len());
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        let d = max_abs_diff(a, b);
        println!("{what} step {i}: max |diff| = {d:e}");
        assert!(
            d < tol,
            "{what}: step {i} logits differ by {d} (tolerance {tol})"
        );
    }
}

#[test]
fn llama_gqa_untied_matches_candle() {
    let tiny = Tiny::llama();
    let dir = tempfile::tempdir().unwrap();
    let weights = tiny.random_weights(false, true);
    let files = tiny.write_hf(dir.path(), &tiny.llama_config(false, None), &weights, 1);
    let cfg: llama::LlamaConfig = serde_json::from_str(&tiny.llama_config(false, None)).unwrap();
    let cfg = cfg.into_config(false);
    let vb = VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu);
    let model = llama::Llama::load(vb, &cfg).unwrap();
    let mut cache = llama::Cache::new(true, DType::F32, &cfg, &Device::Cpu).unwrap();
    let theirs = reference(|ids, pos| model.forward(ids, pos, &mut cache));
    assert_all_close(&ours(&files, DtypeChoice::F32), &theirs, 1e-4, "llama");
}

#[test]
fn llama_tied_with_llama3_rope_scaling_matches_candle() {
    let tiny = Tiny::llama();
    let scaling = r#"{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16}"#;
    let json = tiny.llama_config(true, Some(scaling));
    let dir = tempfile::tempdir().unwrap();
    let weights = tiny.random_weights(false, false);
    // Two shards, as an index.json-listed checkpoint would be.
    let files = tiny.write_hf(dir.path(), &json, &weights, 2);
    let cfg: llama::LlamaConfig = serde_json::from_str(&json).unwrap();
    let cfg = cfg.into_config(false);
    assert!(cfg.tie_word_embeddings && cfg.rope_scaling.is_some());
    let vb = VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu);
    let model = llama::Llama::load(vb, &cfg).unwrap();
    let mut cache = llama::Cache::new(true, DType::F32, &cfg, &Device::Cpu).unwrap();
    let theirs = reference(|ids, pos| model.forward(ids, pos, &mut cache));
    assert_all_close(
        &ours(&files, DtypeChoice::F32),
        &theirs,
        1e-4,
        "llama3 tied",
    );
}

#[test]
fn qwen2_with_biases_matches_candle() {
    let tiny = Tiny::llama();
    let json = tiny.qwen2_config(false);
    let dir = tempfile::tempdir().unwrap();
    let weights = tiny.random_weights(true, true);
    let files = tiny.write_hf(dir.path(), &json, &weights, 1);
    let cfg: qwen2::Config = serde_json::from_str(&json).unwrap();
    let vb = VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu);
    let mut model = qwen2::ModelForCausalLM::new(&cfg, vb).unwrap();
    let theirs = reference(|ids, pos| model.forward(ids, pos));
    assert_all_close(&ours(&files, DtypeChoice::F32), &theirs, 1e-4, "qwen2");
}

#[test]
fn mistral_with_explicit_head_dim_matches_candle() {
    let mut tiny = Tiny::llama();
    tiny.head_dim = 32; // wider than hidden / heads, as some Mistral checkpoints are
    let json = tiny.mistral_config();
    let dir = tempfile::tempdir().unwrap();
    let weights = tiny.random_weights(false, true);
    let files = tiny.write_hf(dir.path(), &json, &weights, 1);
    let cfg: mistral::Config = serde_json::from_str(&json).unwrap();
    let vb = VarBuilder::from_tensors(weights, DType::F32, &Device::Cpu);
    let mut model = mistral::Model::new(&cfg, vb).unwrap();
    let theirs = reference(|ids, pos| model.forward(ids, pos));
    assert_all_close(&ours(&files, DtypeChoice::F32), &theirs, 1e-4, "mistral");
}

#[test]
fn f16_dense_path_stays_close_to_f32() {
    let tiny = Tiny::llama();
    let dir = tempfile::tempdir().unwrap();
    let weights = tiny.random_weights(true, true);
    let files = tiny.write_hf(dir.path(), &tiny.qwen2_config(false), &weights, 1);
    let f32_logits = ours(&files, DtypeChoice::F32);
    let f16_logits = ours(&files, DtypeChoice::F16);
    assert_all_close(&f16_logits, &f32_logits, 5e-2, "f16 vs f32");
}

#[test]
fn quantized_gguf_matches_candle_quantized_llama() {
    let tiny = Tiny::llama();
    let dir = tempfile::tempdir().unwrap();
    let weights = tiny.random_weights(false, false);
    let path = dir.path().join("tiny.gguf");
    tiny.write_gguf(&path, "llama", &weights, GgmlDType::Q4_1, true);
    let files = ModelFiles::Gguf { path: path.clone() };

    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut model =
        quantized_llama::ModelWeights::from_gguf(content, &mut file, &Device::Cpu).unwrap();
    let theirs = reference(|ids, pos| model.forward(ids, pos));
    let quantized = ours(&files, DtypeChoice::Auto);
    assert_all_close(&quantized, &theirs, 1e-3, "quantized gguf");

    // The same file dequantized to f32 runs the dense path on the same weights.
    let dense = ours(&files, DtypeChoice::F32);
    for (q, d) in quantized.iter().zip(&dense) {
        let scale = d.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = max_abs_diff(q, d);
        println!("quantized vs dequantized: max |diff| = {diff:e}, max |logit| = {scale}");
        assert!(
            diff > 0.0,
            "quantized activations should make the paths differ slightly"
        );
        assert!(
            diff < 0.1 * scale,
            "quantized and dequantized logits diverge: {diff} vs {scale}"
        );
    }
}

/// A GGUF written the way llama.cpp's converter writes a llama checkpoint (q/k rows permuted
/// for interleaved RoPE, llama.cpp tensor names) must give the HF checkpoint's logits.
#[test]
fn gguf_llama_layout_matches_hf_checkpoint() {
    let tiny = Tiny::llama();
    let dir = tempfile::tempdir().unwrap();
    let weights = tiny.random_weights(false, true);
    let files = tiny.write_hf(dir.path(), &tiny.llama_config(false, None), &weights, 1);
    let path = dir.path().join("f32.gguf");
    tiny.write_gguf(&path, "llama", &weights, GgmlDType::F32, true);
    let gguf = ours(&ModelFiles::Gguf { path }, DtypeChoice::Auto);
    assert_all_close(
        &gguf,
        &ours(&files, DtypeChoice::F32),
        1e-4,
        "gguf llama vs hf",
    );
}

/// Qwen2 GGUFs keep HF's q/k order (NEOX rope) and carry q/k/v biases.
#[test]
fn gguf_qwen2_layout_matches_hf_checkpoint() {
    let tiny = Tiny::llama();
    let dir = tempfile::tempdir().unwrap();
    let weights = tiny.random_weights(true, false);
    let json = tiny.qwen2_config(true);
    let files = tiny.write_hf(dir.path(), &json, &weights, 1);
    let path = dir.path().join("qwen2.gguf");
    tiny.write_gguf(&path, "qwen2", &weights, GgmlDType::F32, false);
    let gguf = ours(&ModelFiles::Gguf { path }, DtypeChoice::Auto);
    assert_all_close(
        &gguf,
        &ours(&files, DtypeChoice::F32),
        1e-4,
        "gguf qwen2 vs hf",
    );
}

/// Records the order in which the model asks for and releases layers.
struct Recording {
    inner: ResidentLayers,
    events: Vec<String>,
}

impl LayerSource for Recording {
    fn layer(&mut self, index: usize) -> ferry::model::Result<LayerWeights> {
        self.events.push(format!("get {index}"));
        self.inner.layer(index)
    }
    fn release(&mut self, index: usize) -> ferry::model::Result<()> {
        self.events.push(format!("release {index}"));
        Ok(())
    }
}

#[test]
fn forward_walks_layers_in_order_and_reports_errors() {
    let tiny = Tiny::llama();
    let dir = tempfile::tempdir().unwrap();
    let weights = tiny.random_weights(false, true);
    let files = tiny.write_hf(dir.path(), &tiny.llama_config(false, None), &weights, 1);
    let options = LoadOptions {
        device: Device::Cpu,
        dtype: DtypeChoice::Auto,
    };
    let mut reports = 0;
    let loaded = load_model(&files, &options, &mut |p| {
        assert!(p.done_bytes <= p.total_bytes);
        reports += 1;
    })
    .unwrap();
    assert_eq!(reports, 2 + 9 * tiny.layers + 1, "one report per tensor");
    assert_eq!(loaded.model.dtype(), DType::F32, "auto is f32 on the CPU");

    let mut layers = Recording {
        inner: loaded.layers.clone(),
        events: Vec::new(),
    };
    let mut cache = loaded.model.new_cache_with_limit(6);
    let logits = loaded
        .model
        .forward(&[1, 2, 3], &mut cache, &mut layers)
        .unwrap();
    assert_eq!(logits.dims(), &[tiny.vocab]);
    assert_eq!(cache.len(), 3);
    let expected: Vec<String> = (0..tiny.layers)
        .flat_map(|i| [format!("get {i}"), format!("release {i}")])
        .collect();
    assert_eq!(layers.events, expected);

    let err = loaded
        .model
        .forward(&[1, 2, 3, 4], &mut cache, &mut layers)
        .unwrap_err();
    assert!(
        matches!(err, ModelError::ContextOverflow { needed: 7, max: 6 }),
        "{err}"
    );
    let err = loaded
        .model
        .forward(&[tiny.vocab as u32], &mut cache, &mut layers)
        .unwrap_err();
    assert!(matches!(err, ModelError::TokenOutOfRange { .. }), "{err}");
    assert!(matches!(
        loaded.model.forward(&[], &mut cache, &mut layers),
        Err(ModelError::EmptyInput)
    ));
    assert_eq!(cache.len(), 3, "failed steps leave the cache untouched");
    let mut too_few = ResidentLayers(loaded.layers.0[..1].to_vec());
    assert!(loaded
        .model
        .forward(&[1], &mut cache, &mut too_few)
        .is_err());
    assert_eq!(cache.len(), 3);
    loaded
        .model
        .forward(&[4, 5, 6], &mut cache, &mut layers)
        .unwrap();
    assert_eq!(cache.len(), 6);

    let bf16 = LoadOptions {
        device: Device::Cpu,
        dtype: DtypeChoice::BF16,
    };
    let err = load_model(&files, &bf16, &mut |_| {}).unwrap_err();
    assert!(matches!(err, ModelError::Unsupported(_)), "{err}");
}

#[test]
fn chunked_prefill_matches_one_shot_prefill() {
    let tiny = Tiny::llama();
    let dir = tempfile::tempdir().unwrap();
    let weights = tiny.random_weights(true, true);
    let files = tiny.write_hf(dir.path(), &tiny.qwen2_config(false), &weights, 1);
    let options = LoadOptions {
        device: Device::Cpu,
        dtype: DtypeChoice::F32,
    };
    let loaded = load_model(&files, &options, &mut |_| {}).unwrap();
    let mut layers = loaded.layers;
    let mut one = loaded.model.new_cache();
    let whole: Vec<f32> = loaded
        .model
        .forward(PROMPT, &mut one, &mut layers)
        .unwrap()
        .to_vec1()
        .unwrap();
    let mut chunked = loaded.model.new_cache();
    loaded
        .model
        .forward(&PROMPT[..3], &mut chunked, &mut layers)
        .unwrap();
    let parts: Vec<f32> = loaded
        .model
        .forward(&PROMPT[3..], &mut chunked, &mut layers)
        .unwrap()
        .to_vec1()
        .unwrap();
    let d = max_abs_diff(&whole, &parts);
    assert!(d < 1e-4, "chunked prefill differs by {d}");
    // Rewinding the cache and replaying gives the same logits again.
    chunked.truncate(3).unwrap();
    let again: Vec<f32> = loaded
        .model
        .forward(&PROMPT[3..], &mut chunked, &mut layers)
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(parts, again);
}

#[test]
fn model_types_can_move_to_the_engine_thread() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<ferry::model::decoder::Model>();
    send_sync::<ferry::model::loader::LoadedModel>();
    send_sync::<ferry::model::kv_cache::KvCache>();
    send_sync::<LayerWeights>();
}
