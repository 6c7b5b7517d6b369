//! The KV cache in host memory (`kv_offload`): the plan counts it on the host, not against the
//! device budget, so a context the device cannot hold is kept whole (`ferry plan`); a model served
//! with its cache there decodes what it decodes with the cache on the device, in every offload
//! mode and in a block format, and the device accounting sees no KV bytes.
//!
//! On the CPU device host memory is the device's own, so what differs here is the planning and
//! the accounting; the crossing to the host and back runs only on CUDA (tests/gpu.rs).

use std::path::Path;
use std::process::Command;

use candle_core::Device;
use serde_json::Value;

use ferry::config::{DtypeChoice, KvOffload, MemoryBudget, OffloadMode, QuantType};
use ferry::engine::traits::{LanguageModel, TextCodec};
use ferry::runtime::load::load_for_serving_on;

use crate::fit::run_plan;
use crate::offload_modes::{device_config, hub, plan_for, top_token};
use crate::real_model;

/// `ferry plan` of the million-token tiny model at 262144 tokens x 8 sequences in 256 MiB.
fn ferry_plan(model: &Path, extra: &[&str]) -> (bool, String, String) {
    let context = ["--max-context", "262144", "--max-batch", "8"];
    let args: Vec<&str> = context.iter().chain(extra).copied().collect();
    crate::fit::ferry_plan(model, &args)
}

#[test]
fn a_context_the_device_cannot_hold_is_planned_in_host_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = crate::fit::long_context_gguf(dir.path());
    // On the device, 262144 tokens x 8 sequences do not fit 256 MiB.
    let (ok, _, stderr) = ferry_plan(&model, &["--kv-offload", "off"]);
    assert!(!ok, "a 768 MiB cache fitted a 256 MiB budget: {stderr}");
    assert!(stderr.contains("of KV cache (f16)"), "{stderr}");

    let (ok, stdout, stderr) = ferry_plan(&model, &["--kv-offload", "on", "--json"]);
    assert!(ok, "{stderr}");
    let document: Value = serde_json::from_str(&stdout).expect("JSON");
    let plan = &document["models"][0]["plan"];
    assert_eq!(plan["kv_host"], true, "{plan}");
    assert_eq!(
        plan["max_context"], 262144,
        "the set context is kept: {plan}"
    );
    let value = |key: &str| {
        plan[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key}: {plan}"))
    };
    let (kv, device, host, budget) = (
        value("kv_bytes"),
        value("device_bytes"),
        value("host_bytes"),
        value("budget_bytes"),
    );
    assert!(kv > budget, "{plan}");
    assert!(device <= budget, "{plan}");
    assert!(host >= kv, "the cache's bytes are the host's: {plan}");
    assert!(
        plan["layers"]
            .as_array()
            .expect("layers")
            .iter()
            .all(|l| l["home"] == "device"),
        "every layer stays on the device: {plan}"
    );

    let (ok, text, stderr) = ferry_plan(&model, &["--kv-offload", "on"]);
    assert!(ok, "{stderr}");
    assert!(
        text.contains("in host memory, not on the device: attention runs on the host"),
        "{text}"
    );
}

#[test]
fn auto_is_off_on_the_cpu_device() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = crate::fit::long_context_gguf(dir.path());
    let (ok, stdout, stderr) = run_plan(
        Command::new(env!("CARGO_BIN_EXE_ferry"))
            .arg("plan")
            .arg("--model")
            .arg(&model)
            .args(["--device", "cpu", "--gpu-memory", "256MiB", "--json"]),
    );
    assert!(ok, "{stderr}");
    let document: Value = serde_json::from_str(&stdout).expect("JSON");
    let plan = &document["models"][0]["plan"];
    assert_eq!(plan["kv_host"], false, "{plan}");
    assert!(
        plan["max_context"].as_u64() < Some(1 << 20),
        "fitted: {plan}"
    );
}

/// Greedy decode of 12 tokens after a prompt, and the device KV bytes the accounting saw.
fn decode(kv_dtype: DtypeChoice, kv_offload: KvOffload, mode: OffloadMode) -> (Vec<u32>, u64) {
    let mut config = real_model::offloaded(DtypeChoice::Auto, mode);
    config.kv_dtype = kv_dtype;
    config.kv_offload = kv_offload;
    config.tier.experts = false;
    config.offload.prefetch = 1;
    if mode == OffloadMode::Auto {
        // About half the layers resident.
        let none = plan_for(&real_model::offloaded(DtypeChoice::Auto, OffloadMode::None));
        let half: u64 = none.layers.iter().map(|l| l.bytes).sum::<u64>() / 2;
        config.offload.gpu_memory = MemoryBudget::Bytes(none.device_bytes - half + (8 << 20));
    }
    let plan = plan_for(&config);
    assert_eq!(plan.kv_host, kv_offload == KvOffload::On, "{mode:?}");
    let loaded = load_for_serving_on(&config, &device_config(), &Device::Cpu, &hub())
        .unwrap_or_else(|e| panic!("load {mode:?}: {e}"));
    let prompt = loaded
        .codec
        .encode("The capital of France is", true)
        .expect("encode");
    let mut runner = loaded.runner;
    let mut seq = runner.new_sequence();
    let mut logits = runner.forward(&mut seq, &prompt).expect("prefill");
    let mut tokens = Vec::new();
    for _ in 0..12 {
        let next = top_token(&logits);
        tokens.push(next);
        logits = runner.forward(&mut seq, &[next]).expect("decode");
    }
    assert!(seq.kv_bytes() > 0);
    let acc = runner.accounting();
    assert_eq!(
        acc.check_within_plan(),
        Ok(()),
        "{mode:?} {kv_offload:?}: {acc:?}"
    );
    (tokens, acc.kv_peak)
}

#[test]
fn a_host_cache_decodes_like_a_device_cache_in_every_mode() {
    for kv_dtype in [DtypeChoice::Auto, DtypeChoice::Quantize(QuantType::Q8_0)] {
        let (reference, device_kv) = decode(kv_dtype, KvOffload::Off, OffloadMode::None);
        assert!(device_kv > 0, "a device cache is counted on the device");
        for mode in [
            OffloadMode::None,
            OffloadMode::Auto,
            OffloadMode::Sequential,
        ] {
            let (tokens, device_kv) = decode(kv_dtype, KvOffload::On, mode);
            assert_eq!(tokens, reference, "{kv_dtype:?} {mode:?}");
            assert_eq!(
                device_kv, 0,
                "a host cache holds no device bytes ({mode:?})"
            );
        }
    }
}
