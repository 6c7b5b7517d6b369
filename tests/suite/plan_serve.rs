//! `ferry plan` shows what `serve` executes, on the real SmolLM2 GGUF on the CPU device: in mode
//! `model` one shared budget (the plan's pool is the swap manager's budget, and every model
//! loads with the plan's numbers), the same refusal when a model does not fit the pool, one JSON
//! document for several models, and non-`model` entries that must fit the device together.

use crate::real_model::model_path;

use std::path::Path;
use std::process::Command;

use candle_core::Device;
use serde_json::Value;

use ferry::config::{
    Config, DeviceChoice, DeviceConfig, DtypeChoice, MemoryBudget, ModelConfig, OffloadMode,
};
use ferry::model::source::HubOptions;
use ferry::offload::render::plan_json;
use ferry::offload::PlannedBytes;
use ferry::runtime::device_plan::{prepare_serving, DevicePlan};
use ferry::runtime::load::load_for_serving_shared;

const GIB: u64 = 1 << 30;

fn hub() -> HubOptions {
    HubOptions::from_env(|_| None)
}

fn model(name: &str, dtype: DtypeChoice, mode: OffloadMode, budget: MemoryBudget) -> ModelConfig {
    let mut model = ModelConfig {
        name: name.into(),
        source: model_path().to_string_lossy().into_owned(),
        dtype,
        max_context: Some(256),
        max_batch: Some(1),
        ..ModelConfig::default()
    };
    model.offload.mode = mode;
    model.offload.gpu_memory = budget;
    model
}

/// "a" (quantized) and "b" (the same file in f32), both in mode `model`; "a" sets the budget,
/// "b" leaves its own at the default (90% of free memory), so it must use the shared one.
fn swapped(budget: u64) -> Config {
    Config {
        device: DeviceConfig {
            kind: DeviceChoice::Cpu,
            ..DeviceConfig::default()
        },
        models: vec![
            model(
                "a",
                DtypeChoice::Auto,
                OffloadMode::Model,
                MemoryBudget::Bytes(budget),
            ),
            model(
                "b",
                DtypeChoice::F32,
                OffloadMode::Model,
                MemoryBudget::FractionOfFree(0.9),
            ),
        ],
        ..Config::default()
    }
}

/// The same configuration as a TOML file (what `ferry plan --config` reads).
fn write_toml(dir: &Path, config: &Config) -> std::path::PathBuf {
    let mut text = String::from("[device]\nkind = \"cpu\"\n");
    for m in &config.models {
        let dtype = if m.dtype == DtypeChoice::F32 {
            "f32"
        } else {
            "auto"
        };
        let mode = match m.offload.mode {
            OffloadMode::Model => "model",
            OffloadMode::None => "none",
            OffloadMode::Auto => "auto",
            OffloadMode::Sequential => "sequential",
        };
        // A share of free memory is the default; only byte budgets are written.
        let budget = match m.offload.gpu_memory {
            MemoryBudget::Bytes(bytes) => format!("gpu_memory = \"{bytes}\"\n"),
            MemoryBudget::FractionOfFree(_) => String::new(),
        };
        text.push_str(&format!(
            "\n[[models]]\nname = \"{}\"\nsource = {}\ndtype = \"{dtype}\"\nmax_context = 256\nmax_batch = 1\n[models.offload]\nmode = \"{mode}\"\n{budget}",
            m.name,
            toml_string(&m.source),
        ));
    }
    let path = dir.join("ferry.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

fn toml_string(text: &str) -> String {
    serde_json::Value::String(text.to_string()).to_string()
}

fn ferry_plan_json(config_file: &Path) -> (bool, String, String) {
    crate::fit::run_plan(
        Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["plan", "--json", "--config"])
            .arg(config_file),
    )
}

#[test]
fn mode_model_is_planned_as_served_with_one_shared_budget() {
    let config = swapped(8 * GIB);
    let plan = DevicePlan::new(&config, &Device::Cpu, &hub(), 64 * GIB).expect("fits");
    let pool = plan.pool.clone().expect("a mode-model pool");
    assert_eq!(pool.models, ["a", "b"]);
    assert_eq!(pool.budget_bytes, 8 * GIB, "the first entry's gpu_memory");
    assert_eq!(pool.layer_budget_bytes, 8 * GIB - pool.always_bytes);
    for m in &plan.models {
        assert_eq!(
            m.plan.budget_bytes,
            8 * GIB,
            "{} planned against the shared budget",
            m.config.name
        );
    }
    let always: u64 = plan
        .models
        .iter()
        .map(|m| m.plan.fixed_bytes + m.plan.kv_bytes + m.plan.workspace_bytes)
        .sum::<u64>()
        + pool.reserve_bytes;
    assert_eq!(pool.always_bytes, always);

    // What serve runs: the same plan, the pool's budget in the swap manager, each model loaded
    // with its planned numbers.
    let serving = prepare_serving(&config, &Device::Cpu, &hub()).expect("serve plans alike");
    assert_eq!(serving.plan.models, plan.models);
    assert_eq!(serving.plan.pool, plan.pool);
    let swap = serving.swap.expect("a swap manager");
    assert_eq!(swap.config().budget_bytes, pool.layer_budget_bytes);
    for m in &serving.plan.models {
        let loaded =
            load_for_serving_shared(&m.config, &config.device, &Device::Cpu, &hub(), Some(&swap))
                .expect("loads as planned");
        assert_eq!(
            loaded.runner.accounting().planned,
            PlannedBytes::of(&m.plan),
            "{}",
            m.config.name
        );
    }
    assert_eq!(swap.models().len(), 2);

    // `ferry plan --json` on the same configuration: one document, the same plans and pool.
    let dir = tempfile::tempdir().expect("tempdir");
    let (ok, stdout, stderr) = ferry_plan_json(&write_toml(dir.path(), &config));
    assert!(ok, "{stderr}");
    let document: Value = serde_json::from_str(&stdout).expect("one JSON document");
    let models = document["models"].as_array().expect("models");
    assert_eq!(models.len(), 2);
    for (json, m) in models.iter().zip(&plan.models) {
        assert_eq!(json["name"], m.config.name.as_str());
        assert_eq!(json["plan"], plan_json(&m.plan));
    }
    assert_eq!(
        document["pool"]["layer_budget_bytes"],
        pool.layer_budget_bytes
    );
    assert_eq!(document["pool"]["models"], serde_json::json!(["a", "b"]));
}

#[test]
fn a_model_that_cannot_fit_the_pool_is_refused_by_plan_and_serve_alike() {
    let roomy = DevicePlan::new(&swapped(8 * GIB), &Device::Cpu, &hub(), 64 * GIB).expect("fits");
    let pool = roomy.pool.expect("pool");
    let layers = |name: &str| {
        roomy
            .models
            .iter()
            .find(|m| m.config.name == name)
            .expect("model")
            .plan
            .resident_layer_bytes
    };
    assert!(layers("b") > layers("a"), "f32 layers are larger");
    // Room for a's layers next to what always stays, not for b's.
    let config = swapped(pool.always_bytes + layers("a"));
    let planned =
        DevicePlan::new(&config, &Device::Cpu, &hub(), 64 * GIB).expect_err("b does not fit");
    let served = prepare_serving(&config, &Device::Cpu, &hub())
        .err()
        .expect("serve refuses too");
    assert_eq!(planned.to_string(), served.to_string());
    assert!(planned.to_string().contains("model `b`"), "{planned}");

    let dir = tempfile::tempdir().expect("tempdir");
    let (ok, _, stderr) = ferry_plan_json(&write_toml(dir.path(), &config));
    assert!(!ok, "ferry plan must refuse");
    assert_eq!(stderr.matches(&planned.to_string()).count(), 1, "{stderr}");
}

#[test]
fn entries_that_do_not_fit_the_device_together_are_refused() {
    let share = |fraction| MemoryBudget::FractionOfFree(fraction);
    let pair = |fraction| Config {
        device: DeviceConfig {
            kind: DeviceChoice::Cpu,
            ..DeviceConfig::default()
        },
        models: vec![
            model("a", DtypeChoice::Auto, OffloadMode::None, share(fraction)),
            model("b", DtypeChoice::Auto, OffloadMode::None, share(fraction)),
        ],
        ..Config::default()
    };
    let alone = DevicePlan::new(&pair(0.9), &Device::Cpu, &hub(), 64 * GIB).expect("fits");
    let need = alone.models[0].plan.device_bytes;
    assert_eq!(alone.device_bytes, 2 * need, "the two add up");

    // Each fits 90% of 1.5x its need; both do not fit 1.5x one need.
    let err =
        DevicePlan::new(&pair(0.9), &Device::Cpu, &hub(), need * 3 / 2).expect_err("too much");
    let message = err.to_string();
    assert!(
        message.contains("together") && message.contains("gpu_memory"),
        "{message}"
    );
    // Half the device each, on a device with room for both.
    let halves = DevicePlan::new(&pair(0.5), &Device::Cpu, &hub(), need * 22 / 10).expect("fits");
    assert!(halves.device_bytes <= halves.free_bytes);
    assert!(halves.pool.is_none());
}
