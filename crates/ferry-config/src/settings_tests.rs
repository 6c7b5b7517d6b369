//! The settings table is consistent with itself, with the resolved types and with README.md.
//! (The walk of every setting through flag, variable and file is in `cli.rs`'s tests, which
//! parse real command lines.)

use super::*;
use crate::types::{DeviceConfig, ModelConfig, ServerConfig};

/// The value `text` gets in a fresh section of the setting's scope, as shown.
fn shown(setting: &Setting, text: &str) -> Result<Shown, String> {
    match setting.scope() {
        Scope::Server => {
            let mut section = ServerConfig::blank();
            setting.apply(&mut section, text)?;
            Ok(setting.show(&section))
        }
        Scope::Device => {
            let mut section = DeviceConfig::blank();
            setting.apply(&mut section, text)?;
            Ok(setting.show(&section))
        }
        Scope::Model => {
            let mut section = ModelConfig::blank();
            setting.apply(&mut section, text)?;
            Ok(setting.show(&section))
        }
    }
}

#[test]
fn defaults_and_examples_parse_and_differ() {
    for setting in SETTINGS {
        if let Some(default) = setting.default {
            let value = shown(setting, default)
                .unwrap_or_else(|e| panic!("default of {}: {e}", setting.name));
            let example = shown(setting, setting.example)
                .unwrap_or_else(|e| panic!("example of {}: {e}", setting.name));
            assert_ne!(
                value, example,
                "{}: the example must not be the default",
                setting.name
            );
        } else {
            assert!(shown(setting, setting.example).is_ok(), "{}", setting.name);
            assert!(
                !setting.default_note.is_empty(),
                "{}: an unset default needs a note for the README",
                setting.name
            );
        }
    }
}

#[test]
fn names_variables_and_keys_are_unique() {
    for (i, a) in SETTINGS.iter().enumerate() {
        for b in &SETTINGS[..i] {
            assert_ne!(a.name, b.name);
            assert_ne!(a.env(), b.env());
            assert_ne!(a.doc_key(), b.doc_key());
            assert!(
                a.short.is_none() || a.short != b.short,
                "{} and {}",
                a.name,
                b.name
            );
        }
        assert!(a.env().starts_with("FERRY_") && !a.env().contains('-'));
    }
    assert!(find(SOURCE).is_some() && find(NAME).is_some());
    assert_eq!(
        find("gpu-memory").map(Setting::env).as_deref(),
        Some("FERRY_GPU_MEMORY")
    );
    assert_eq!(
        find("cpu-qmatmul").map(Setting::env).as_deref(),
        Some("FERRY_CPU_QMATMUL")
    );
}

#[test]
fn defaults_of_the_resolved_types_come_from_the_table() {
    let server = ServerConfig::default();
    assert_eq!((server.host.as_str(), server.port), ("127.0.0.1", 8080));
    assert_eq!(server.body_limit, 16 << 20);
    let model = ModelConfig::default();
    assert_eq!(model.source, DEFAULT_MODEL_SOURCE);
    assert_eq!(model.name, DEFAULT_MODEL_NAME);
    // Unset: the fit chooses them (`offload::fit`, 8 sequences when they fit).
    assert_eq!((model.max_context, model.max_batch), (None, None));
    assert_eq!(model.prefill_chunk, 512);
    assert_eq!(model.kv_dtype, crate::DtypeChoice::Auto);
    assert_eq!(model.offload.prefetch, 2);
    assert_eq!(DeviceConfig::default().link_bandwidth, None);
}

const START: &str =
    "<!-- settings table: generated from crates/ferry-config/src/settings.rs, checked by a test -->";
const END: &str = "<!-- end of settings table -->";

#[test]
fn the_readme_table_is_the_settings_table() {
    let readme =
        std::fs::read_to_string(ferry_testkit::repo_root().join("README.md")).expect("README.md");
    let start = readme.find(START).expect("README has the start marker") + START.len();
    let end = readme.find(END).expect("README has the end marker");
    let table = readme[start..end].trim();
    let expected = markdown_table();
    assert!(
        table == expected.trim(),
        "README.md's configuration table differs from SETTINGS; replace it with:\n\n{expected}"
    );
}

#[test]
fn closest_names_a_likely_typo_only() {
    assert_eq!(closest("prot", ["port", "host"]), Some("port"));
    assert_eq!(
        closest("gpu_mem", ["offload.gpu_memory", "gpu_memory"]),
        Some("gpu_memory")
    );
    assert_eq!(closest("zzzz", ["port", "host"]), None);
}

/// The value `text` gives the named model-scope setting, or its error.
fn model_value(name: &str, text: &str) -> Result<ModelConfig, String> {
    let mut model = ModelConfig::default();
    find(name).expect(name).apply(&mut model, text)?;
    Ok(model)
}

#[test]
fn tier_settings_parse_and_refuse() {
    use crate::TierChoice;
    assert_eq!(ModelConfig::default().tier.choice, TierChoice::Auto);
    for (text, choice) in [
        ("auto", TierChoice::Auto),
        ("stream", TierChoice::Stream),
        (" Host ", TierChoice::Host),
    ] {
        assert_eq!(
            model_value("offload-tier", text).unwrap().tier.choice,
            choice
        );
    }
    let err = model_value("offload-tier", "gpu").unwrap_err();
    assert!(err.contains("auto, stream or host"), "{err}");

    let default = ModelConfig::default().tier;
    assert_eq!(
        (
            default.host_gflops,
            default.device_gflops,
            default.host_bandwidth
        ),
        (None, None, None)
    );
    assert_eq!(
        model_value("host-gflops", "120").unwrap().tier.host_gflops,
        Some(120.0)
    );
    assert_eq!(
        model_value("device-gflops", "2.5e4")
            .unwrap()
            .tier
            .device_gflops,
        Some(25_000.0)
    );
    assert_eq!(
        model_value("host-bandwidth", "40GB/s")
            .unwrap()
            .tier
            .host_bandwidth,
        Some(40_000_000_000)
    );
    for bad in ["0", "-3", "inf", "NaN", "fast", ""] {
        for name in ["host-gflops", "device-gflops"] {
            assert!(model_value(name, bad).is_err(), "{name} = {bad:?}");
        }
    }
    assert!(model_value("host-bandwidth", "40GB").is_err());
    // What `ferry config` shows parses back to the same value.
    let set = model_value("host-gflops", "12.5").unwrap();
    let shown = find("host-gflops").unwrap().show(&set);
    assert_eq!(shown, Shown::Text("12.5".into()));
    assert_eq!(
        find("offload-tier").map(Setting::doc_key).as_deref(),
        Some("models[].offload.tier")
    );
    assert_eq!(
        find("offload-tier").map(Setting::env).as_deref(),
        Some("FERRY_OFFLOAD_TIER")
    );
}
