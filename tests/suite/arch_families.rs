//! Cross-checks ferry's Qwen3, Gemma 2/3 and Phi-3 blocks against candle-transformers on tiny
//! seeded random models, as `arch_crosscheck` does for the Llama family: the same weights
//! written as a real checkpoint (config.json + safetensors, and a GGUF with llama.cpp's names
//! and conventions), loaded through ferry's loader and through candle-transformers' own
//! implementation, logits compared on a prefill and several decode steps through the cache.

use crate::arch_crosscheck::{assert_all_close, reference};
use crate::tiny;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::GgmlDType;
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::{
    gemma2, gemma3, mixtral, phi3, quantized_phi3, quantized_qwen3, qwen3, qwen3_moe,
};
use ferry::model::loader::DtypeChoice;
use ferry::model::source::ModelFiles;
use std::path::Path;
use tiny::{ours, Tiny, PROMPT, STEPS};

fn vb(weights: &Weights) -> VarBuilder<'static> {
    VarBuilder::from_tensors(weights.clone(), DType::F32, &Device::Cpu)
}

/// [`reference`] fed one token at a time (the logits after the prompt's last token, then after
/// each step). candle's dense `gemma3` can only append contiguous keys and values to its cache,
/// which a multi-token prefill does not give it; one token at a time it does, and its sliding
/// layers then keep exactly the last `sliding_window` keys, as transformers' window does.
fn reference_stepwise(
    mut step: impl FnMut(&Tensor, usize) -> candle_core::Result<Tensor>,
) -> Vec<Vec<f32>> {
    let tokens: Vec<u32> = PROMPT.iter().chain(STEPS).copied().collect();
    let mut out = Vec::new();
    for (pos, &t) in tokens.iter().enumerate() {
        let ids = Tensor::new(&[t], &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let logits: Vec<f32> = step(&ids, pos)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        if pos + 1 >= PROMPT.len() {
            out.push(logits);
        }
    }
    out
}

fn gguf_content(path: &std::path::Path) -> (gguf_file::Content, std::fs::File) {
    let mut file = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    (content, file)
}

type Weights = std::collections::HashMap<String, Tensor>;

/// Ferry's logits (f32) from `weights` written as a checkpoint with config `json` in `dir`.
fn ours_hf(tiny: &Tiny, dir: &Path, json: &str, weights: &Weights, shards: usize) -> Vec<Vec<f32>> {
    ours(&tiny.write_hf(dir, json, weights, shards), DtypeChoice::F32)
}

/// Ferry's logits from `weights` written at `path` as a llama.cpp `arch` GGUF with `dtype`
/// matrices (q/k rows permuted for `llama`'s interleaved rope, as llama.cpp's converter does).
fn ours_gguf(
    tiny: &Tiny,
    path: &Path,
    arch: &str,
    weights: &Weights,
    dtype: GgmlDType,
) -> Vec<Vec<f32>> {
    tiny.write_gguf(path, arch, weights, dtype, arch == "llama");
    let files = ModelFiles::Gguf {
        path: path.to_path_buf(),
    };
    ours(&files, DtypeChoice::Auto)
}

/// A Q8_0 GGUF of `weights` at `path` against the same file dequantized: the logits differ,
/// by less than 5% of the largest one.
fn assert_quantized_near_dequantized(
    tiny: &Tiny,
    path: &Path,
    arch: &str,
    weights: &Weights,
    what: &str,
) {
    let quantized = ours_gguf(tiny, path, arch, weights, GgmlDType::Q8_0);
    let files = ModelFiles::Gguf {
        path: path.to_path_buf(),
    };
    let dequantized = ours(&files, DtypeChoice::F32);
    assert_eq!(quantized.len(), dequantized.len());
    for (q, d) in quantized.iter().zip(&dequantized) {
        let scale = d.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = tiny::max_abs_diff(q, d);
        println!("quantized {what} vs dequantized: {diff:e} (max |logit| {scale})");
        assert!(diff > 0.0 && diff < 0.05 * scale, "{diff} vs {scale}");
    }
}

#[test]
fn qwen3_matches_candle_from_hf_and_gguf() {
    let mut tiny = Tiny::llama();
    // candle's quantized_qwen3 computes in f16 unless the file says f32.
    tiny.gguf_meta = vec![("general.dtype", Value::U32(0))];
    let dir = tempfile::tempdir().unwrap();
    let weights = tiny.qwen3_weights(true);
    let json = tiny.qwen3_config(false);
    let cfg: qwen3::Config = serde_json::from_str(&json).unwrap();
    let mut model = qwen3::ModelForCausalLM::new(&cfg, vb(&weights)).unwrap();
    let theirs = reference(|ids, pos| model.forward(ids, pos));
    let hf = ours_hf(&tiny, dir.path(), &json, &weights, 1);
    assert_all_close(&hf, &theirs, 1e-4, "qwen3");

    // The same weights as an f32 GGUF (NEOX rope: q/k rows kept) give the same logits.
    let gguf = ours_gguf(
        &tiny,
        &dir.path().join("qwen3-f32.gguf"),
        "qwen3",
        &weights,
        GgmlDType::F32,
    );
    assert_all_close(&gguf, &hf, 1e-4, "qwen3 gguf vs hf");

    // Quantized, against candle's quantized_qwen3 on the same file.
    let path = dir.path().join("qwen3-q8.gguf");
    let quantized = ours_gguf(&tiny, &path, "qwen3", &weights, GgmlDType::Q8_0);
    let (content, mut file) = gguf_content(&path);
    let mut model =
        quantized_qwen3::ModelWeights::from_gguf(content, &mut file, &Device::Cpu).unwrap();
    let theirs = reference(|ids, pos| model.forward(ids, pos));
    assert_all_close(&quantized, &theirs, 1e-3, "quantized qwen3");
}

/// A tiny Gemma: rope bases 1e6 (global) and 1e4 (local) so the two kinds of layer differ.
fn gemma_tiny(window: usize, pattern: usize) -> Tiny {
    let mut tiny = Tiny::llama();
    tiny.rope_theta = 1_000_000.0;
    tiny.gguf_meta = vec![
        ("attention.sliding_window", Value::U32(window as u32)),
        (
            "attention.sliding_window_pattern",
            Value::U32(pattern as u32),
        ),
        // candle's quantized_gemma3 reads the pattern under this name.
        ("attention.sliding_window_type", Value::U32(pattern as u32)),
    ];
    tiny
}

#[test]
fn gemma3_matches_candle_from_hf_and_gguf() {
    // A window wider than the test's tokens here (candle's quantized_gemma3 masks one key
    // more than transformers does); the window itself is checked below.
    let tiny = gemma_tiny(4096, 2);
    let dir = tempfile::tempdir().unwrap();
    let weights = tiny.gemma_weights(true);
    let json = tiny.gemma_config(true, 4096, 2, ("null", "null"));
    let cfg: gemma3::Config = serde_json::from_str(&json).unwrap();
    let mut model = gemma3::Model::new(false, &cfg, vb(&weights)).unwrap();
    let theirs = reference_stepwise(|ids, pos| model.forward(ids, pos));
    let hf = ours_hf(&tiny, dir.path(), &json, &weights, 1);
    assert_all_close(&hf, &theirs, 1e-4, "gemma3");

    // llama.cpp's GGUF layout (norms stored as 1 + w) gives the same logits.
    let gguf = ours_gguf(
        &tiny,
        &dir.path().join("gemma3-f32.gguf"),
        "gemma3",
        &weights,
        GgmlDType::F32,
    );
    assert_all_close(&gguf, &hf, 1e-3, "gemma3 gguf vs hf");

    // Quantized, against the same file dequantized. (candle's quantized_gemma3 is no oracle
    // here: its MLP applies SiLU where Gemma's GeGLU, in transformers and llama.cpp alike,
    // applies GELU.)
    let path = dir.path().join("gemma3-q8.gguf");
    assert_quantized_near_dequantized(&tiny, &path, "gemma3", &weights, "gemma3");
}

#[test]
fn gemma3_sliding_window_matches_candle() {
    // A window of 3 keys, shorter than the prompt (7 tokens), on layers 0 and 2.
    let tiny = gemma_tiny(3, 2);
    let dir = tempfile::tempdir().unwrap();
    let weights = tiny.gemma_weights(true);
    let json = tiny.gemma_config(true, 3, 2, ("null", "null"));
    let cfg: gemma3::Config = serde_json::from_str(&json).unwrap();
    let mut model = gemma3::Model::new(false, &cfg, vb(&weights)).unwrap();
    let theirs = reference_stepwise(|ids, pos| model.forward(ids, pos));
    let windowed = ours_hf(&tiny, dir.path(), &json, &weights, 1);
    assert_all_close(&windowed, &theirs, 1e-4, "gemma3 window");

    // The GGUF's window and pattern give the same logits.
    let gguf = ours_gguf(
        &tiny,
        &dir.path().join("gemma3-window.gguf"),
        "gemma3",
        &weights,
        GgmlDType::F32,
    );
    assert_all_close(&gguf, &windowed, 1e-3, "gemma3 window gguf vs hf");

    // And the window matters: without it the logits differ.
    let wide = tiny.gemma_config(true, 4096, 2, ("null", "null"));
    let dir = tempfile::tempdir().unwrap();
    let wide = ours_hf(&tiny, dir.path(), &wide, &weights, 1);
    let d = tiny::max_abs_diff(&wide[0], &theirs[0]);
    assert!(d > 1e-3, "the sliding window changed nothing ({d})");
}

#[test]
fn gemma2_with_soft_caps_matches_candle() {
    let tiny = gemma_tiny(4096, 2);
    let dir = tempfile::tempdir().unwrap();
    let weights = tiny.gemma_weights(false);
    // Small caps, so that tanh is far from linear on these activations.
    let json = tiny.gemma_config(false, 4096, 2, ("0.5", "3.0"));
    let cfg: gemma2::Config = serde_json::from_str(&json).unwrap();
    let mut model = gemma2::Model::new(false, &cfg, vb(&weights)).unwrap();
    let theirs = reference(|ids, pos| model.forward(ids, pos));
    let hf = ours_hf(&tiny, dir.path(), &json, &weights, 1);
    assert_all_close(&hf, &theirs, 1e-4, "gemma2");
    assert!(
        hf.iter().flatten().all(|l| l.abs() <= 3.0),
        "final soft-cap"
    );

    let mut tiny = tiny;
    tiny.gguf_meta.extend([
        ("attn_logit_softcapping", Value::F32(0.5)),
        ("final_logit_softcapping", Value::F32(3.0)),
    ]);
    let gguf = ours_gguf(
        &tiny,
        &dir.path().join("gemma2-f32.gguf"),
        "gemma2",
        &weights,
        GgmlDType::F32,
    );
    assert_all_close(&gguf, &hf, 1e-4, "gemma2 gguf vs hf");
}

#[test]
fn phi3_fused_projections_match_candle_from_hf_and_gguf() {
    let tiny = Tiny::llama();
    let dir = tempfile::tempdir().unwrap();
    let weights = tiny.phi3_weights();
    let json = tiny.phi3_config();
    let cfg: phi3::Config = serde_json::from_str(&json).unwrap();
    let mut model = phi3::Model::new(&cfg, vb(&weights)).unwrap();
    let theirs = reference(|ids, pos| model.forward(ids, pos));
    let hf = ours_hf(&tiny, dir.path(), &json, &weights, 1);
    assert_all_close(&hf, &theirs, 1e-4, "phi3");

    let gguf = ours_gguf(
        &tiny,
        &dir.path().join("phi3-f32.gguf"),
        "phi3",
        &weights,
        GgmlDType::F32,
    );
    assert_all_close(&gguf, &hf, 1e-4, "phi3 gguf vs hf");

    let path = dir.path().join("phi3-q8.gguf");
    let quantized = ours_gguf(&tiny, &path, "phi3", &weights, GgmlDType::Q8_0);
    let (content, mut file) = gguf_content(&path);
    let mut model =
        quantized_phi3::ModelWeights::from_gguf(false, content, &mut file, &Device::Cpu).unwrap();
    let theirs = reference(|ids, pos| model.forward(ids, pos));
    assert_all_close(&quantized, &theirs, 1e-3, "quantized phi3");
}

/// Phi-3's longrope: the config's long factors and attention factor (HF) and llama.cpp's
/// `rope_factors_long` tensor and `rope.scaling.attn_factor` (GGUF) give the same logits, and
/// they are not the unscaled model's. (candle's phi3 multiplies the frequencies by the factors
/// where transformers divides, and scales no attention, so it is no oracle for this part.)
#[test]
fn phi3_longrope_from_config_and_gguf_agree() {
    let mut tiny = Tiny::llama();
    let dir = tempfile::tempdir().unwrap();
    let mut weights = tiny.phi3_weights();
    let half = tiny.head_dim / 2;
    let long: Vec<f32> = (0..half).map(|i| 1.0 + 1.5 * i as f32).collect();
    let short = vec![1.0f32; half];
    let list = |v: &[f32]| {
        let items: Vec<String> = v.iter().map(|x| format!("{x:.1}")).collect();
        items.join(", ")
    };
    // A 64-token window over an original 16: the long factors, attention factor
    // sqrt(1 + ln 4 / ln 16).
    let json = tiny.phi3_config().replace(
        r#""rope_scaling": null"#,
        &format!(
            r#""original_max_position_embeddings": 16, "rope_scaling": {{"type": "longrope",
            "short_factor": [{}], "long_factor": [{}]}}"#,
            list(&short),
            list(&long)
        ),
    );
    let hf = ours_hf(&tiny, dir.path(), &json, &weights, 1);

    let attn = (1.0f32 + 4f32.ln() / 16f32.ln()).sqrt();
    tiny.gguf_meta = vec![("rope.scaling.attn_factor", Value::F32(attn))];
    weights.insert(
        "rope_factors_long.weight".into(),
        Tensor::new(long.as_slice(), &Device::Cpu).unwrap(),
    );
    let gguf = ours_gguf(
        &tiny,
        &dir.path().join("phi3-longrope.gguf"),
        "phi3",
        &weights,
        GgmlDType::F32,
    );
    assert_all_close(&gguf, &hf, 1e-4, "phi3 longrope gguf vs hf");

    let plain_dir = tempfile::tempdir().unwrap();
    weights.remove("rope_factors_long.weight");
    let plain = ours_hf(&tiny, plain_dir.path(), &tiny.phi3_config(), &weights, 1);
    let d = tiny::max_abs_diff(&plain[0], &hf[0]);
    assert!(d > 1e-3, "longrope changed nothing ({d})");
}

#[test]
fn qwen3_moe_matches_candle_from_hf_and_gguf() {
    let mut tiny = Tiny::llama();
    tiny.gguf_meta = vec![("general.dtype", Value::U32(0))];
    tiny.gguf_meta.extend(tiny::moe_meta(4, 32));
    let dir = tempfile::tempdir().unwrap();
    let mut weights = tiny.qwen3_weights(true);
    tiny.add_experts(&mut weights, 4, 32, false);
    let json = tiny.qwen3_moe_config(4, 32);
    let cfg: qwen3_moe::Config = serde_json::from_str(&json).unwrap();
    let mut model = qwen3_moe::ModelForCausalLM::new(&cfg, vb(&weights)).unwrap();
    let theirs = reference(|ids, pos| model.forward(ids, pos));
    let hf = ours_hf(&tiny, dir.path(), &json, &weights, 2);
    assert_all_close(&hf, &theirs, 1e-4, "qwen3-moe");

    // Stacked experts in a GGUF, each expert its own slice: the same logits.
    let gguf = ours_gguf(
        &tiny,
        &dir.path().join("qwen3moe-f32.gguf"),
        "qwen3moe",
        &weights,
        GgmlDType::F32,
    );
    assert_all_close(&gguf, &hf, 1e-4, "qwen3-moe gguf vs hf");

    // Quantized, against the same file dequantized (candle's quantized_qwen3_moe runs its
    // experts on CUDA only).
    let path = dir.path().join("qwen3moe-q8.gguf");
    assert_quantized_near_dequantized(&tiny, &path, "qwen3moe", &weights, "qwen3-moe");
}

#[test]
fn mixtral_matches_candle_and_its_llama_gguf() {
    let mut tiny = Tiny::llama();
    tiny.gguf_meta.extend(tiny::moe_meta(4, tiny.inter));
    let dir = tempfile::tempdir().unwrap();
    let mut weights = tiny.random_weights(false, true);
    tiny.add_experts(&mut weights, 4, tiny.inter, true);
    let json = tiny.mixtral_config(4);
    let cfg: mixtral::Config = serde_json::from_str(&json).unwrap();
    let mut model = mixtral::Model::new(&cfg, vb(&weights)).unwrap();
    let theirs = reference(|ids, pos| model.forward(ids, pos));
    let hf = ours_hf(&tiny, dir.path(), &json, &weights, 1);
    assert_all_close(&hf, &theirs, 1e-4, "mixtral");

    // llama.cpp writes Mixtral as `llama` with `expert_count` and stacked experts (q/k rows
    // permuted for its interleaved rope). (candle's quantized_llama reads the older
    // one-tensor-per-expert layout, so the GGUF is checked against the HF checkpoint.)
    let gguf = ours_gguf(
        &tiny,
        &dir.path().join("mixtral-f32.gguf"),
        "llama",
        &weights,
        GgmlDType::F32,
    );
    assert_all_close(&gguf, &hf, 1e-4, "mixtral gguf vs hf");
}
