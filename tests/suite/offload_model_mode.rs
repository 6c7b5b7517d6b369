//! Offload mode `model` on the real SmolLM2 GGUF, on the CPU device: two models ("a", quantized;
//! "b", dequantized to f32) share one swap manager behind the real HTTP router. Greedy answers
//! equal mode `none`; with room for one model they alternate A, B, A, B with exactly 4 swap-ins
//! and 3 swap-outs and `/v1/models` says where each is; keep_alive moves an idle model out with no
//! traffic; room for both means no further swaps; a model whose room is held by a running request
//! waits and then fails with `Overloaded`.

use crate::common as http;
use crate::real_model;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use candle_core::Device;
use serde_json::{json, Value};

use ferry::config::{DeviceChoice, DeviceConfig, DtypeChoice, ModelConfig, OffloadMode};
use ferry::engine::traits::{LanguageModel, TextCodec};
use ferry::engine::{EngineError, EngineHandle};
use ferry::model::source::HubOptions;
use ferry::offload::{Location, SwapConfig, SwapManager};
use ferry::runtime::load::{load_for_serving_on, load_for_serving_shared};
use ferry::runtime::planning::plan_model;
use ferry::runtime::swap::SwapResidency;
use ferry::server::{app, ServerOptions};

const MAX_TOKENS: usize = 12;
const LONG: Duration = Duration::from_secs(300);

/// "a" is the quantized model, "b" the same file dequantized to f32.
fn dtype_of(name: &str) -> DtypeChoice {
    if name == "b" {
        DtypeChoice::F32
    } else {
        DtypeChoice::Auto
    }
}

fn prompt_of(name: &str) -> &'static str {
    if name == "b" {
        "Once upon a time"
    } else {
        "The capital of France is"
    }
}

fn config(name: &str, dtype: DtypeChoice, mode: OffloadMode, keep_alive: Duration) -> ModelConfig {
    let mut config = real_model::offloaded(dtype, mode);
    config.name = name.into();
    config.offload.keep_alive = keep_alive;
    config
}

fn device_config() -> DeviceConfig {
    DeviceConfig {
        kind: DeviceChoice::Cpu,
        link_bandwidth: Some(16_000_000_000),
        ..DeviceConfig::default()
    }
}

fn hub() -> HubOptions {
    HubOptions::from_env(|_| None)
}

/// Device bytes of a model's decoder layers (what the swap budget counts).
fn layer_bytes(name: &str) -> u64 {
    let cfg = config(name, dtype_of(name), OffloadMode::Model, LONG);
    plan_model(&cfg, &device_config(), &Device::Cpu, &hub(), 64 << 30)
        .expect("plan")
        .resident_layer_bytes
}

/// Greedy completion of `name`'s prompt through `POST /v1/completions`.
async fn complete(router: &Router, name: &str) -> Result<String, (StatusCode, Value)> {
    let body = json!({"model": name, "prompt": prompt_of(name), "max_tokens": MAX_TOKENS, "temperature": 0});
    let reply = http::post(router, "/v1/completions", body).await;
    let (status, body) = (reply.status, reply.json());
    if status != StatusCode::OK {
        return Err((status, body));
    }
    Ok(body["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_string())
}

/// `location` of every model in `GET /v1/models`.
async fn locations(router: &Router) -> Vec<(String, Option<String>)> {
    let reply = http::get(router, "/v1/models").await;
    let (status, body) = (reply.status, reply.json());
    assert_eq!(status, StatusCode::OK, "{body}");
    body["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| {
            (
                m["id"].as_str().expect("id").to_string(),
                m["location"].as_str().map(str::to_string),
            )
        })
        .collect()
}

fn loc(names: &[(&str, &str)]) -> Vec<(String, Option<String>)> {
    names
        .iter()
        .map(|(n, l)| (n.to_string(), Some(l.to_string())))
        .collect()
}

/// The mode-`none` greedy answers of "a" and "b", computed once per test binary.
fn reference() -> &'static [(String, String)] {
    static REFERENCE: OnceLock<Vec<(String, String)>> = OnceLock::new();
    REFERENCE.get_or_init(|| {
        let engine = EngineHandle::new(["a", "b"]);
        for name in ["a", "b"] {
            let cfg = config(name, dtype_of(name), OffloadMode::None, LONG);
            let loaded = load_for_serving_on(&cfg, &device_config(), &Device::Cpu, &hub())
                .expect("mode none loads");
            engine
                .model_ready(name, loaded.runner, loaded.codec as Arc<dyn TextCodec>)
                .expect("ready");
        }
        let router = app(Arc::new(engine), ServerOptions::default());
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        runtime.block_on(async {
            let mut out = Vec::new();
            for name in ["a", "b"] {
                let text = complete(&router, name).await.expect("mode none answers");
                out.push((name.to_string(), text));
            }
            assert_ne!(out[0].1, out[1].1, "the two prompts should differ");
            out
        })
    })
}

fn expected(name: &str) -> &'static str {
    &reference()
        .iter()
        .find(|(n, _)| n == name)
        .expect("reference")
        .1
}

/// A server with `names` in mode `model` sharing one manager with `budget_bytes`.
fn swap_server(
    names: &[&str],
    budget_bytes: u64,
    keep_alive: Duration,
) -> (Router, Arc<SwapManager>) {
    let manager = SwapManager::new(SwapConfig {
        budget_bytes,
        link_bandwidth: device_config().link_bandwidth,
        wait_timeout: Duration::from_secs(60),
    })
    .expect("manager");
    let engine = EngineHandle::new(names.iter().copied());
    engine.set_residency(Arc::new(SwapResidency(manager.clone())));
    for &name in names {
        let cfg = config(name, dtype_of(name), OffloadMode::Model, keep_alive);
        let loaded =
            load_for_serving_shared(&cfg, &device_config(), &Device::Cpu, &hub(), Some(&manager))
                .expect("mode model loads");
        engine
            .model_ready(name, loaded.runner, loaded.codec as Arc<dyn TextCodec>)
            .expect("ready");
    }
    (app(Arc::new(engine), ServerOptions::default()), manager)
}

#[test]
fn two_models_alternate_through_a_budget_for_one() {
    let _ = reference();
    let (a, b) = (layer_bytes("a"), layer_bytes("b"));
    // Room for the larger model plus half the smaller one: never both.
    let budget = a.max(b) + a.min(b) / 2;
    let (router, manager) = swap_server(&["a", "b"], budget, LONG);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        assert_eq!(
            locations(&router).await,
            loc(&[("a", "host"), ("b", "host")])
        );
        for (i, name) in ["a", "b", "a", "b"].into_iter().enumerate() {
            let text = complete(&router, name).await.expect("answer");
            assert_eq!(text, expected(name), "request {i} to {name}");
            let stats = manager.stats();
            assert!(stats.resident_bytes <= budget, "{stats:?}");
            if i == 2 {
                assert_eq!(
                    locations(&router).await,
                    loc(&[("a", "device"), ("b", "host")])
                );
            }
        }
        assert_eq!(
            locations(&router).await,
            loc(&[("a", "host"), ("b", "device")])
        );
    });
    let stats = manager.stats();
    assert_eq!((stats.swaps_in, stats.swaps_out, stats.expired), (4, 3, 0));
    let per_model: Vec<_> = manager
        .models()
        .into_iter()
        .map(|m| (m.name, m.swaps_in, m.swaps_out))
        .collect();
    assert_eq!(
        per_model,
        vec![("a".to_string(), 2, 2), ("b".to_string(), 2, 1)]
    );
}

#[test]
fn a_budget_for_both_keeps_both_resident() {
    let _ = reference();
    let budget = layer_bytes("a") + layer_bytes("b") + (1 << 20);
    let (router, manager) = swap_server(&["a", "b"], budget, LONG);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        for name in ["a", "b", "a", "b"] {
            assert_eq!(
                complete(&router, name).await.expect("answer"),
                expected(name)
            );
        }
        assert_eq!(
            locations(&router).await,
            loc(&[("a", "device"), ("b", "device")])
        );
    });
    let stats = manager.stats();
    assert_eq!((stats.swaps_in, stats.swaps_out), (2, 0));
}

#[test]
fn keep_alive_moves_an_idle_model_out_without_traffic() {
    let _ = reference();
    let (router, manager) = swap_server(&["a"], 1 << 30, Duration::from_millis(300));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        assert_eq!(complete(&router, "a").await.expect("answer"), expected("a"));
        assert_eq!(manager.stats().swaps_in, 1);
        // The keep-alive thread runs on the OS clock: wait (bounded) for it, no longer.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while manager.location("a") != Some(Location::Host) {
            assert!(std::time::Instant::now() < deadline, "never moved out");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(locations(&router).await, loc(&[("a", "host")]));
        let stats = manager.stats();
        assert_eq!(
            (stats.swaps_out, stats.expired, stats.resident_bytes),
            (1, 1, 0)
        );
        // Back on the device for the next request, with the same answer.
        assert_eq!(complete(&router, "a").await.expect("answer"), expected("a"));
        assert_eq!(manager.stats().swaps_in, 2);
    });
}

#[test]
fn a_model_whose_room_is_busy_waits_then_reports_overloaded() {
    // Two quantized models, room for one, a short wait.
    let bytes = layer_bytes("a");
    let manager = SwapManager::new(SwapConfig {
        budget_bytes: bytes + bytes / 2,
        link_bandwidth: None,
        wait_timeout: Duration::from_millis(200),
    })
    .expect("manager");
    let load = |name: &str| {
        let cfg = config(name, DtypeChoice::Auto, OffloadMode::Model, LONG);
        load_for_serving_shared(&cfg, &device_config(), &Device::Cpu, &hub(), Some(&manager))
            .expect("mode model loads")
    };
    let (first, second) = (load("first"), load("second"));
    let prompt = first.codec.encode("Hello", true).expect("encode");
    let (mut first, mut second) = (first.runner, second.runner);

    let mut busy = first.new_sequence();
    first.forward(&mut busy, &prompt).expect("first runs");
    assert!(busy.holds_lease());
    assert_eq!(manager.location("first"), Some(Location::Device));

    let mut waiting = second.new_sequence();
    let err = second
        .forward(&mut waiting, &prompt)
        .expect_err("no room while `first` runs");
    assert!(matches!(err, EngineError::Overloaded(_)), "{err:?}");
    assert_eq!(manager.location("second"), Some(Location::Host));

    drop(busy);
    second
        .forward(&mut waiting, &prompt)
        .expect("room once `first` finished");
    assert_eq!(manager.location("first"), Some(Location::Host));
    assert_eq!(manager.location("second"), Some(Location::Device));
    let stats = manager.stats();
    assert_eq!((stats.swaps_in, stats.swaps_out), (2, 1));
    // Device accounting follows residency: `first` holds only its fixed parts now.
    let (a, b) = (first.accounting(), second.accounting());
    assert!(
        b.weights >= a.weights + bytes,
        "first {} second {}",
        a.weights,
        b.weights
    );
}
