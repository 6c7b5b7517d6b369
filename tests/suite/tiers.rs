//! The tier cost model as `ferry plan` shows it (issue 13, item 3): a model with offloaded
//! layers gets a `tiers` section (the calibrated or configured rates, and per offloaded unit
//! kind the tier at batch 1 and at max_batch and the crossover row count), for the real
//! SmolLM2 GGUF and a tiny random Qwen3-MoE (whose experts are units of their own); the
//! decisions agree with the cost model recomputed from the printed work and rates;
//! `offload.tier` forces one tier; a model with nothing offloaded has no tiers.

use std::path::Path;
use std::process::Command;

use candle_core::quantized::GgmlDType;
use serde_json::Value;

use ferry::offload::{CostModel, Tier, UnitWork};

use crate::fit::run_plan;
use crate::real_model::model_path;

/// Fixed rates: a slow link, a modest host and a fast device.
const RATES: [&str; 8] = [
    "--link-bandwidth",
    "1GB/s",
    "--host-gflops",
    "10",
    "--host-bandwidth",
    "20GB/s",
    "--device-gflops",
    "1000",
];

/// `ferry plan --json` of `model` on the CPU with `extra` flags and an empty calibration
/// cache: the JSON document and stderr.
fn plan(model: &Path, extra: &[&str]) -> (Value, String) {
    let cache = tempfile::tempdir().unwrap();
    plan_cached(model, extra, cache.path())
}

/// [`plan`] with the calibration cache under `cache_home` (`XDG_CACHE_HOME`).
fn plan_cached(model: &Path, extra: &[&str], cache_home: &Path) -> (Value, String) {
    let (ok, stdout, stderr) = run_plan(
        Command::new(env!("CARGO_BIN_EXE_ferry"))
            .arg("plan")
            .arg("--model")
            .arg(model)
            .args(["--device", "cpu", "--json"])
            .args(extra)
            .env("RUST_LOG", "info")
            .env("XDG_CACHE_HOME", cache_home),
    );
    assert!(ok, "{stderr}");
    (serde_json::from_str(&stdout).expect("JSON"), stderr)
}

/// The human `ferry plan` of `model` with `extra` flags (an empty calibration cache).
fn plan_text(model: &Path, extra: &[&str]) -> String {
    let cache = tempfile::tempdir().unwrap();
    let (ok, stdout, stderr) = run_plan(
        Command::new(env!("CARGO_BIN_EXE_ferry"))
            .arg("plan")
            .arg("--model")
            .arg(model)
            .args(["--device", "cpu"])
            .args(extra)
            .env("XDG_CACHE_HOME", cache.path()),
    );
    assert!(ok, "{stderr}");
    stdout
}

fn tier(name: &Value) -> Tier {
    match name.as_str() {
        Some("stream") => Tier::Stream,
        Some("host") => Tier::Host,
        other => panic!("not a tier: {other:?}"),
    }
}

/// The cost model the report used, from its JSON.
fn cost_model(tiers: &Value) -> CostModel {
    let rate = |key: &str| {
        tiers[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key}: {tiers}"))
    };
    CostModel {
        link_bytes_per_s: rate("link_bytes_per_s"),
        host_flops_per_s: rate("host_flops_per_s"),
        host_read_bytes_per_s: rate("host_read_bytes_per_s"),
        device_flops_per_s: rate("device_flops_per_s"),
        forced: tiers["forced"].as_str().map(|_| tier(&tiers["forced"])),
        // null: the rows cost nothing (the CPU device).
        activation_bytes_per_s: Some(
            tiers["activation_bytes_per_s"]
                .as_f64()
                .unwrap_or(f64::INFINITY),
        ),
    }
}

/// Every unit line's decisions equal the cost model's, recomputed here.
fn check_decisions(tiers: &Value) {
    let model = cost_model(tiers);
    let units = tiers["units"].as_array().expect("units");
    assert!(!units.is_empty(), "{tiers}");
    for unit in units {
        let work = UnitWork {
            weight_bytes: unit["weight_bytes"].as_u64().unwrap(),
            flops_per_row: unit["flops_per_row"].as_f64().unwrap(),
            activation_bytes_per_row: unit["activation_bytes_per_row"].as_u64().unwrap(),
        };
        assert!(work.weight_bytes > 0 && work.flops_per_row > 0.0, "{unit}");
        let rows = unit["rows_at_max_batch"].as_u64().unwrap() as usize;
        assert_eq!(tier(&unit["tier_at_1"]), model.choose(&work, 1), "{unit}");
        assert_eq!(
            tier(&unit["tier_at_max_batch"]),
            model.choose(&work, rows),
            "{unit}"
        );
        assert_eq!(
            unit["crossover_rows"].as_u64().map(|r| r as usize),
            model.crossover(&work),
            "{unit}"
        );
    }
}

#[test]
fn offloaded_layers_get_tier_decisions_from_the_configured_rates() {
    let model = model_path();
    let mut flags = vec![
        "--offload",
        "sequential",
        "--max-batch",
        "64",
        "--max-context",
        "256",
    ];
    flags.extend(RATES);
    let (doc, stderr) = plan(&model, &flags);
    let tiers = &doc["models"][0]["tiers"];
    let n_layers = doc["models"][0]["plan"]["layers"].as_array().unwrap().len();
    assert_eq!(tiers["link_bytes_per_s"], 1e9);
    assert_eq!(tiers["host_flops_per_s"], 10e9);
    assert_eq!(tiers["weight_type"], "q4_1");
    assert_eq!(tiers["forced"], Value::Null);
    let layer = &tiers["units"][0];
    assert_eq!(layer["kind"], "layer");
    assert_eq!(layer["count"], n_layers);
    assert_eq!(layer["rows_at_max_batch"], 64);
    // A 1 GB/s link against a 10 GFLOP/s host: one row computes on the host, 64 stream.
    assert_eq!(layer["tier_at_1"], "host");
    assert_eq!(layer["tier_at_max_batch"], "stream");
    check_decisions(tiers);
    assert!(
        stderr.contains("calibration: link 1 GB/s (set), host 10.0 GFLOP/s (set) for q4_1"),
        "{stderr}"
    );

    let text = plan_text(&model, &flags);
    assert!(text.contains("\ntiers   link 1 GB/s (set), "), "{text}");
    let crossover = layer["crossover_rows"].as_u64().unwrap();
    assert!(
        text.contains(&format!(
            ": batch 1 host, max_batch 64 (64 rows) stream; streams from {crossover} rows\n"
        )),
        "{text}"
    );
}

/// GLM-4.5 (the llama.cpp-checked Q8_0 fixture): its first layer is dense, so the experts'
/// tier report comes from the first layer with experts, and counts the routed experts only
/// (8 in each of the 2 MoE layers; the shared expert stays with its layer).
#[test]
fn a_moe_model_with_a_dense_first_layer_reports_its_expert_units() {
    let path = crate::fixtures::path("arch-llamacpp").join("glm4moe-q8.gguf");
    let mut flags = vec![
        "--offload",
        "sequential",
        "--max-batch",
        "8",
        "--max-context",
        "64",
    ];
    flags.extend(RATES);
    let (doc, _) = plan(&path, &flags);
    let layers = doc["models"][0]["plan"]["experts"]["layers"]
        .as_array()
        .unwrap()
        .clone();
    let host: Vec<u64> = layers
        .iter()
        .map(|l| l["host_experts"].as_u64().unwrap())
        .collect();
    assert_eq!(host, [0, 8, 8], "{doc}");
    let tiers = &doc["models"][0]["tiers"];
    let units = tiers["units"].as_array().unwrap();
    assert_eq!(units.len(), 1, "{tiers}");
    assert_eq!(units[0]["kind"], "expert");
    assert_eq!(units[0]["count"], 16);
    // A batch of 8 rows, top 2 of 8 experts: 2 rows on each.
    assert_eq!(units[0]["rows_at_max_batch"], 2);
    check_decisions(tiers);
    let text = plan_text(&path, &flags);
    assert!(
        text.contains("\n  layer 0       dense (no experts)\n"),
        "{text}"
    );
    assert!(
        text.contains("\n  layer 1       experts: 0 device, 8 host (")
            && text.contains("\n  layer 2       experts: 0 device, 8 host ("),
        "{text}"
    );
}

#[test]
fn a_moe_model_has_expert_units_and_a_forced_tier_decides_all() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moe.gguf");
    crate::tiny::family_gguf(&path, "qwen3moe", GgmlDType::Q8_0);
    let mut flags = vec![
        "--offload",
        "sequential",
        "--max-batch",
        "8",
        "--max-context",
        "64",
    ];
    flags.extend(RATES);
    // Experts as the placement units (the default): only the host experts are offloaded.
    let (doc, _) = plan(&path, &flags);
    let tiers = &doc["models"][0]["tiers"];
    let units = tiers["units"].as_array().unwrap();
    assert_eq!(units.len(), 1, "{tiers}");
    assert_eq!(units[0]["kind"], "expert");
    let host_experts: u64 = doc["models"][0]["plan"]["experts"]["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["host_experts"].as_u64().unwrap())
        .sum();
    assert!(host_experts > 0, "{doc}");
    assert_eq!(units[0]["count"], host_experts);
    check_decisions(tiers);

    // Whole layers streamed: a layer unit and every expert of the offloaded layers.
    flags.extend(["--offload-experts", "false"]);
    let (doc, _) = plan(&path, &flags);
    let tiers = &doc["models"][0]["tiers"];
    let kinds: Vec<&str> = tiers["units"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["layer", "expert"]);
    let n_layers = doc["models"][0]["plan"]["layers"].as_array().unwrap().len();
    let expert = &tiers["units"][1];
    // 4 experts per layer, top-2: a batch of 8 puts 4 rows on each expert.
    assert_eq!(expert["count"], 4 * n_layers);
    assert_eq!(expert["rows_at_max_batch"], 4);
    assert_eq!(tiers["weight_type"], "q8_0");
    check_decisions(tiers);

    for forced in ["stream", "host"] {
        let mut flags = flags.clone();
        flags.extend(["--offload-tier", forced]);
        let (doc, _) = plan(&path, &flags);
        let tiers = &doc["models"][0]["tiers"];
        assert_eq!(tiers["forced"], forced);
        for unit in tiers["units"].as_array().unwrap() {
            assert_eq!(unit["tier_at_1"], forced, "{unit}");
            assert_eq!(unit["tier_at_max_batch"], forced, "{unit}");
        }
        check_decisions(tiers);
    }
}

#[test]
fn measured_rates_are_logged_and_nothing_offloaded_has_no_tiers() {
    let model = model_path();
    let cache_home = tempfile::tempdir().unwrap();
    // Kept whatever the machine's load (the spread limit has a test of its own: calibration).
    let steady = ["--offload", "sequential", "--calibration-spread", "100000%"];
    let (doc, stderr) = plan_cached(&model, &steady, cache_home.path());
    let tiers = &doc["models"][0]["tiers"];
    for key in [
        "link_bytes_per_s",
        "host_flops_per_s",
        "host_read_bytes_per_s",
        "device_flops_per_s",
    ] {
        let rate = tiers[key].as_f64().unwrap_or(0.0);
        assert!(rate.is_finite() && rate > 0.0, "{key}: {tiers}");
    }
    // The CPU device computes with the host's kernels.
    assert_eq!(tiers["device_flops_per_s"], tiers["host_flops_per_s"]);
    check_decisions(tiers);
    let line = stderr
        .lines()
        .find(|l| l.contains("calibration: link "))
        .unwrap_or_else(|| panic!("no calibration line in {stderr}"));
    assert!(
        line.contains("for q4_1 (reads ") && line.contains("(the host's), tier auto, measured in "),
        "{line}"
    );
    let cache = cache_home.path().join("ferry").join("calibration.json");
    assert!(
        line.contains(&format!(", saved to {}", cache.display())),
        "{line}"
    );
    assert_eq!(
        stderr.matches("calibration:").count(),
        1,
        "logged once: {stderr}"
    );

    // The next start reads the same rates from the cache and measures nothing.
    let (again, stderr) = plan_cached(&model, &steady, cache_home.path());
    let line = stderr
        .lines()
        .find(|l| l.contains("calibration from "))
        .unwrap_or_else(|| panic!("no calibration line in {stderr}"));
    assert!(
        line.contains(&format!("calibration from {} (measured ", cache.display()))
            && line.contains("; --recalibrate to measure again: link "),
        "{line}"
    );
    assert!(!line.contains("measured in"), "{line}");
    let again = &again["models"][0]["tiers"];
    for key in [
        "link_bytes_per_s",
        "host_flops_per_s",
        "host_read_bytes_per_s",
    ] {
        assert_eq!(again[key], tiers[key], "{key}");
    }

    let (doc, stderr) = plan(&model, &["--offload", "none"]);
    assert_eq!(doc["models"][0]["tiers"], Value::Null);
    assert!(!stderr.contains("calibration:"), "{stderr}");
    assert!(!plan_text(&model, &["--offload", "none"]).contains("\ntiers "));
}
