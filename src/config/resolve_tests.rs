//! Unit tests for configuration resolution: precedence, defaults and error messages.

use super::*;

fn over(pairs: &[(&str, &str)]) -> Overrides {
    let map: std::collections::HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Overrides::from_env(|key| map.get(key).cloned())
}

fn flag(name: &str, value: &str) -> Option<(String, String)> {
    Some((name.to_string(), value.to_string()))
}

#[test]
fn defaults_serve_the_embedded_model_on_loopback() {
    let config = Config::resolve(
        &RawConfig::default(),
        &Overrides::default(),
        &Overrides::default(),
    )
    .expect("defaults resolve");
    assert_eq!(config.server.host, "127.0.0.1");
    assert_eq!(config.server.port, 8080);
    assert_eq!(config.server.body_limit, 16 * 1024 * 1024);
    assert_eq!(config.models.len(), 1);
    assert_eq!(config.models[0].name, DEFAULT_MODEL_NAME);
    assert_eq!(config.models[0].source, DEFAULT_MODEL_SOURCE);
    assert_eq!(config.models[0].offload.mode, OffloadMode::Auto);
    assert_eq!(
        config.models[0].offload.gpu_memory,
        MemoryBudget::FractionOfFree(0.9)
    );
    assert_eq!(config.device.kind, DeviceChoice::Auto);
}

#[test]
fn flags_beat_env_beat_file() {
    let raw = RawConfig::from_toml(
        r#"
        [server]
        port = 9000
        host = "0.0.0.0"
        [[models]]
        name = "a"
        source = "a.gguf"
        max_batch = 2
        "#,
    )
    .expect("valid toml");
    let env = over(&[("FERRY_PORT", "9100"), ("FERRY_MAX_BATCH", "3")]);
    let flags = Overrides {
        port: flag("--port", "9200"),
        ..Overrides::default()
    };
    let config = Config::resolve(&raw, &env, &flags).expect("resolves");
    assert_eq!(config.server.port, 9200, "flag wins");
    assert_eq!(config.server.host, "0.0.0.0", "file value kept");
    assert_eq!(config.models[0].max_batch, 3, "env beats file");
}

#[test]
fn model_flag_replaces_models_and_derives_a_name() {
    let raw =
        RawConfig::from_toml("[[models]]\nname = \"a\"\nsource = \"a.gguf\"\ndtype = \"f16\"\n")
            .expect("valid toml");
    let flags = Overrides {
        model: flag("--model", "HuggingFaceTB/SmolLM2-135M-Instruct@main"),
        ..Overrides::default()
    };
    let config = Config::resolve(&raw, &Overrides::default(), &flags).expect("resolves");
    assert_eq!(config.models.len(), 1);
    assert_eq!(config.models[0].name, "HuggingFaceTB/SmolLM2-135M-Instruct");
    assert_eq!(
        config.models[0].dtype,
        DtypeChoice::F16,
        "other settings kept"
    );
}

#[test]
fn derived_names() {
    assert_eq!(
        derive_name("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        "SmolLM2-135M-Instruct.Q4_1"
    );
    assert_eq!(derive_name("org/name"), "org/name");
    assert_eq!(derive_name("org/name@v1"), "org/name");
    assert_eq!(derive_name("./local/dir"), "dir");
    assert_eq!(derive_name("/abs/path/model"), "model");
}

#[test]
fn errors_name_the_key_at_fault() {
    let cases: Vec<(Overrides, &str)> = vec![
        (
            Overrides {
                port: flag("--port", "http"),
                ..Overrides::default()
            },
            "--port",
        ),
        (
            Overrides {
                device: flag("FERRY_DEVICE", "tpu"),
                ..Overrides::default()
            },
            "FERRY_DEVICE",
        ),
        (
            Overrides {
                dtype: flag("--dtype", "int3"),
                ..Overrides::default()
            },
            "--dtype",
        ),
        (
            Overrides {
                offload: flag("--offload", "disk"),
                ..Overrides::default()
            },
            "--offload",
        ),
        (
            Overrides {
                gpu_memory: flag("--gpu-memory", "150%"),
                ..Overrides::default()
            },
            "--gpu-memory",
        ),
        (
            Overrides {
                max_batch: flag("--max-batch", "0"),
                ..Overrides::default()
            },
            "max_batch",
        ),
    ];
    for (flags, key) in cases {
        let err = Config::resolve(&RawConfig::default(), &Overrides::default(), &flags)
            .expect_err("must fail");
        assert!(err.to_string().contains(key), "`{err}` should name {key}");
    }
}

#[test]
fn file_errors() {
    assert!(
        RawConfig::from_toml("[server]\nprot = 1\n").is_err(),
        "unknown keys are rejected"
    );
    let raw = RawConfig::from_toml(
        "[[models]]\nname = \"x\"\nsource = \"a\"\n[[models]]\nname = \"x\"\nsource = \"b\"\n",
    )
    .expect("valid toml");
    let err = Config::resolve(&raw, &Overrides::default(), &Overrides::default()).expect_err("dup");
    assert!(err.to_string().contains("unique"), "{err}");
    let raw = RawConfig::from_toml("[[models]]\nname = \"x\"\n").expect("valid toml");
    let err = Config::resolve(&raw, &Overrides::default(), &Overrides::default()).expect_err("src");
    assert!(err.to_string().contains("models[0].source"), "{err}");
}

#[test]
fn budgets_and_devices() {
    let flags = Overrides {
        gpu_memory: flag("--gpu-memory", "6GiB"),
        device: flag("--device", "cuda:1"),
        link_bandwidth: flag("--link-bandwidth", "8GB/s"),
        ..Overrides::default()
    };
    let config = Config::resolve(&RawConfig::default(), &Overrides::default(), &flags).expect("ok");
    assert_eq!(
        config.models[0].offload.gpu_memory,
        MemoryBudget::Bytes(6 << 30)
    );
    assert_eq!(config.device.kind, DeviceChoice::Cuda(1));
    assert_eq!(config.device.link_bandwidth, Some(8_000_000_000));
}
