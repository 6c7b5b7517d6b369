//! The quantized KV cache's cost in quality, against llama.cpp's for the same setting: the
//! default model's perplexity on a fixed 2048-token text (token ids in
//! tests/fixtures/kv-perplexity/expected.json, made by scripts/make-kv-perplexity-fixture.py with
//! llama.cpp's perplexities for an f16, q8_0 and q4_0 cache) with ferry's cache in each format.
//! ferry's f16 perplexity must be llama.cpp's within 1%, and the change a block format makes
//! at most llama.cpp's own change for it plus half a percent.

use candle_core::{DType, Device};
use serde_json::Value;

use ferry::config::DtypeChoice;
use ferry::model::kv_format::KvFormat;
use ferry::model::loader::{load_model, LoadOptions};
use ferry::model::source::ModelFiles;

use crate::real_model::model_path;

/// Positions prefilled per step (logits of every row come from the hidden states).
const CHUNK: usize = 256;

/// Perplexity of `ids` (each token predicted from those before it) with the cache in `format`.
fn perplexity(ids: &[u32], format: KvFormat) -> f64 {
    let options = LoadOptions {
        device: Device::Cpu,
        dtype: DtypeChoice::Auto,
    };
    let files = ModelFiles::Gguf { path: model_path() };
    let mut loaded = load_model(&files, &options, &mut |_| {}).expect("loads");
    loaded.model.set_kv_dtype(format);
    let mut cache = loaded.model.new_cache_with_limit(ids.len());
    let mut nll = 0.0f64;
    for (c, chunk) in ids.chunks(CHUNK).enumerate() {
        let hidden = loaded
            .model
            .forward_hidden(chunk, &mut cache, &mut loaded.layers)
            .expect("forward");
        let logits = loaded.model.fixed().lm_head.forward(&hidden).expect("head");
        let rows = logits
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for (i, row) in rows.iter().enumerate() {
            let Some(&next) = ids.get(c * CHUNK + i + 1) else {
                break;
            };
            let top = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
            let z: f64 = row.iter().map(|&x| (x as f64 - top).exp()).sum();
            nll += top + z.ln() - row[next as usize] as f64;
        }
    }
    (nll / (ids.len() - 1) as f64).exp()
}

#[test]
fn quantized_caches_cost_no_more_perplexity_than_in_llama_cpp() {
    let path = ferry_testkit::repo_root().join("tests/fixtures/kv-perplexity/expected.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let ids: Vec<u32> = fixture["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ids.len(), 2048);
    let theirs = |name: &str| fixture["llama_cpp_perplexity"][name].as_f64().unwrap();
    let f16 = perplexity(&ids, KvFormat::Dense(DType::F16));
    eprintln!("f16: ferry {f16:.4}, llama.cpp {:.4}", theirs("f16"));
    assert!(
        (f16 / theirs("f16") - 1.0).abs() < 0.01,
        "f16: {f16} against {}",
        theirs("f16")
    );
    for (format, name) in [(KvFormat::Q8_0, "q8_0"), (KvFormat::Q4_0, "q4_0")] {
        let ours = perplexity(&ids, format) / f16 - 1.0;
        let llama = theirs(name) / theirs("f16") - 1.0;
        eprintln!("{name}: perplexity change ferry {ours:+.4}, llama.cpp {llama:+.4}");
        assert!(
            ours <= llama.max(0.0) + 0.005,
            "{name}: {ours:+.4} against llama.cpp's {llama:+.4}"
        );
    }
}
