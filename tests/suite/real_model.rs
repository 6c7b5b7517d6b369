//! Shared helpers for integration tests that run the real default model (the HTTP-only test
//! double lives in tests/suite/common.rs).

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use ferry::config::{DtypeChoice, MemoryBudget, ModelConfig, OffloadConfig, OffloadMode};
use ferry::engine::traits::TextCodec;
use ferry::engine::worker::{EngineHandle, EngineOptions};
use ferry::engine::Backend;
use ferry::model::source::HubOptions;
use ferry::runtime::load::load_for_serving;

/// The served id of the real model in these tests.
pub const MODEL: &str = "smollm2";

/// Path of the default GGUF: `FERRY_TEST_MODEL` or models/ at the crate root.
pub fn model_path() -> PathBuf {
    let path = std::env::var_os("FERRY_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
        });
    assert!(
        path.is_file(),
        "{} is missing: run scripts/fetch-model.sh (scripts/test.sh does it for you)",
        path.display()
    );
    path
}

/// A model config for the real GGUF.
pub fn model_config(dtype: DtypeChoice) -> ModelConfig {
    ModelConfig {
        name: MODEL.to_string(),
        source: model_path().to_string_lossy().into_owned(),
        dtype,
        max_context: Some(2048),
        max_batch: Some(4),
        offload: OffloadConfig {
            mode: OffloadMode::None,
            gpu_memory: MemoryBudget::FractionOfFree(0.9),
            prefetch: 0,
            keep_alive: std::time::Duration::from_secs(60),
        },
        ..ModelConfig::default()
    }
}

/// A config for the real GGUF as the offload tests use it: `mode`, context 256, one sequence,
/// a 64 GiB budget, no prefetch, keep_alive 1 s (set other fields on the result).
pub fn offloaded(dtype: DtypeChoice, mode: OffloadMode) -> ModelConfig {
    let mut config = model_config(dtype);
    config.max_context = Some(256);
    config.max_batch = Some(1);
    config.offload = OffloadConfig {
        mode,
        gpu_memory: MemoryBudget::Bytes(64 << 30),
        prefetch: 0,
        keep_alive: std::time::Duration::from_secs(1),
    };
    config
}

/// An engine serving the real quantized model, loaded once per test binary.
pub fn engine() -> EngineHandle {
    static ENGINE: OnceLock<EngineHandle> = OnceLock::new();
    ENGINE
        .get_or_init(|| engine_with(EngineOptions::default()))
        .clone()
}

/// A new engine (own queue, own metrics) serving a fresh load of the real model.
pub fn engine_with(options: EngineOptions) -> EngineHandle {
    let config = model_config(DtypeChoice::Auto);
    let hub = HubOptions::from_env(|_| None);
    let loaded = load_for_serving(&config, &candle_core::Device::Cpu, &hub)
        .expect("the default model loads");
    let engine = EngineHandle::with_options([MODEL], options);
    engine
        .model_ready(MODEL, loaded.runner, loaded.codec as Arc<dyn TextCodec>)
        .expect("engine starts");
    engine
}

/// The engine behind the trait the server takes.
pub fn backend() -> Arc<dyn Backend> {
    Arc::new(engine())
}

/// ferry's router over [`backend`] on a loopback port, and an OpenAI client (async-openai) of
/// it; the server task is for the test to abort.
pub async fn openai_client() -> (
    async_openai::Client<async_openai::config::OpenAIConfig>,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let router = ferry::server::app(backend(), ferry::server::ServerOptions::default());
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let client = async_openai::Client::with_config(
        async_openai::config::OpenAIConfig::new()
            .with_api_base(format!("http://{address}/v1"))
            .with_api_key("unused"),
    );
    (client, server)
}
