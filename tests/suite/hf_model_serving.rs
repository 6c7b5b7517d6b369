//! A Hugging Face layout served end to end: a tiny random Llama written as sharded safetensors
//! with an index, SmolLM2's real tokenizer files, loaded through `load_for_serving` from a
//! directory and from a hub id in an offline HF cache, then generating through the engine.

use crate::tiny;

use std::path::Path;
use std::sync::Arc;

use ferry::config::{DtypeChoice, MemoryBudget, ModelConfig, OffloadConfig, OffloadMode};
use ferry::engine::{
    Backend, EngineHandle, GenerationEvent, GenerationParams, GenerationRequest, TextCodec,
};
use ferry::model::source::HubOptions;
use ferry::runtime::load::load_for_serving;

const TOKENIZER_FIXTURES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/smollm2-hf-tokenizer"
);

/// Writes a tiny Llama with SmolLM2's vocabulary size into `dir` as two shards plus an index,
/// with the real tokenizer files next to it.
fn write_tiny_hf_model(dir: &Path) {
    let mut shape = tiny::Tiny::llama();
    shape.vocab = 49152;
    let weights = shape.random_weights(false, false);
    shape.write_hf(dir, &shape.llama_config(false, None), &weights, 2);
    let mut names: Vec<&String> = weights.keys().collect();
    names.sort();
    let per_shard = names.len().div_ceil(2);
    let map: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let shard = format!("model-{:05}-of-00002.safetensors", i / per_shard + 1);
            ((*name).clone(), serde_json::Value::String(shard))
        })
        .collect();
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(Path::new(TOKENIZER_FIXTURES).join(file), dir.join(file)).unwrap();
    }
}

fn config(source: &str) -> ModelConfig {
    ModelConfig {
        name: "tiny".to_string(),
        source: source.to_string(),
        dtype: DtypeChoice::Auto,
        max_context: Some(64),
        max_batch: Some(1),
        offload: OffloadConfig {
            mode: OffloadMode::None,
            gpu_memory: MemoryBudget::FractionOfFree(0.9),
            prefetch: 0,
            keep_alive: std::time::Duration::from_secs(1),
        },
        ..ModelConfig::default()
    }
}

/// Loads `source`, generates 6 greedy tokens past EOS and returns the text and usage.
fn generate(source: &str, hub: &HubOptions) -> (String, usize) {
    let loaded = load_for_serving(&config(source), &candle_core::Device::Cpu, hub).expect("loads");
    let engine = EngineHandle::new(["tiny"]);
    engine
        .model_ready("tiny", loaded.runner, loaded.codec as Arc<dyn TextCodec>)
        .expect("engine");
    assert_eq!(
        engine.max_context("tiny").unwrap(),
        64,
        "the configured cap applies"
    );
    let prompt = engine
        .tokenize("tiny", "Hello there", true)
        .expect("tokenize");
    let mut request = GenerationRequest {
        cache_partition: None,
        model: "tiny".to_string(),
        prompt,
        params: GenerationParams::default(),
    };
    request.params.max_tokens = 6;
    request.params.sampling.temperature = 0.0;
    request.params.ignore_eos = true;
    let mut events = engine.submit(request).expect("submit");
    let mut text = String::new();
    while let Some(event) = events.blocking_recv() {
        match event {
            GenerationEvent::Token(token) => text.push_str(&token.text),
            GenerationEvent::Finished {
                usage,
                trailing_text,
                ..
            } => {
                text.push_str(&trailing_text);
                return (text, usage.completion_tokens);
            }
            GenerationEvent::Failed(err) => panic!("generation failed: {err}"),
        }
    }
    panic!("no Finished event");
}

#[test]
fn hf_directory_and_offline_hub_cache_serve_the_same_model() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny-llama");
    std::fs::create_dir_all(&dir).unwrap();
    write_tiny_hf_model(&dir);

    let no_env = HubOptions::from_env(|_| None);
    let (text, generated) = generate(dir.to_str().unwrap(), &no_env);
    assert_eq!(generated, 6, "ignore_eos gives exactly max_tokens");
    let (again, _) = generate(dir.to_str().unwrap(), &no_env);
    assert_eq!(text, again, "greedy decoding is deterministic");

    // The same files as a hub snapshot in an offline cache: `org/tiny-llama` resolves to them.
    let cache = tmp.path().join("hub");
    let commit = "89abcdef0123456789abcdef0123456789abcdef";
    let snapshot = cache.join("models--org--tiny-llama/snapshots").join(commit);
    std::fs::create_dir_all(snapshot.parent().unwrap()).unwrap();
    std::fs::rename(&dir, &snapshot).unwrap();
    let refs = cache.join("models--org--tiny-llama/refs");
    std::fs::create_dir_all(&refs).unwrap();
    std::fs::write(refs.join("main"), commit).unwrap();
    let cache_text = cache.to_str().unwrap().to_string();
    let offline = HubOptions::from_env(move |key| match key {
        "HF_HUB_CACHE" => Some(cache_text.clone()),
        "HF_HUB_OFFLINE" => Some("1".to_string()),
        _ => None,
    });
    let (from_hub, _) = generate("org/tiny-llama", &offline);
    assert_eq!(from_hub, text);

    let err = load_for_serving(
        &config("org/absent-model"),
        &candle_core::Device::Cpu,
        &offline,
    )
    .err()
    .expect("a repo that is not cached fails");
    let message = err.to_string();
    assert!(
        message.contains("org/absent-model") && message.contains("hub"),
        "{message}"
    );
}

/// A directory's `generation_config.json` gives the sampling defaults a setting does not:
/// temperature and top_p from the file, top_k from the setting, min_p from llama.cpp's.
#[test]
fn generation_config_sets_the_sampling_defaults_a_setting_leaves_open() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny-llama");
    std::fs::create_dir_all(&dir).unwrap();
    write_tiny_hf_model(&dir);
    std::fs::write(
        dir.join("generation_config.json"),
        r#"{"bos_token_id": 1, "eos_token_id": 2, "do_sample": true,
            "temperature": 0.6, "top_p": 0.9, "top_k": 20}"#,
    )
    .unwrap();
    let mut config = config(dir.to_str().unwrap());
    config.sampling.top_k = Some(5);
    let loaded = load_for_serving(
        &config,
        &candle_core::Device::Cpu,
        &HubOptions::from_env(|_| None),
    )
    .expect("loads");
    let engine = EngineHandle::new(["tiny"]);
    engine
        .model_ready("tiny", loaded.runner, loaded.codec as Arc<dyn TextCodec>)
        .expect("engine");
    let defaults = engine.sampling_defaults("tiny").unwrap();
    assert_eq!(
        (
            defaults.temperature,
            defaults.top_p,
            defaults.top_k,
            defaults.min_p,
            defaults.repetition_penalty
        ),
        (0.6, 0.9, 5, 0.05, 1.0)
    );
}
