//! Unit tests for configuration resolution: precedence, defaults and error messages.

use super::*;
use crate::settings::{DEFAULT_MODEL_NAME, DEFAULT_MODEL_SOURCE};
use crate::values::{DeviceChoice, DtypeChoice, MemoryBudget, OffloadMode};

fn over(pairs: &[(&str, &str)]) -> Overrides {
    let map: std::collections::HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Overrides::from_env(|key| map.get(key).cloned())
}

/// Overrides by setting name (`port`, `gpu-memory`), as the flags or the environment give them.
fn set(pairs: &[(&str, &str)]) -> Overrides {
    let mut overrides = Overrides::default();
    for (name, value) in pairs {
        overrides.set(name, value).expect("a setting");
    }
    overrides
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
    let flags = set(&[("port", "9200")]);
    let config = Config::resolve(&raw, &env, &flags).expect("resolves");
    assert_eq!(config.server.port, 9200, "flag wins");
    assert_eq!(config.server.host, "0.0.0.0", "file value kept");
    assert_eq!(config.models[0].max_batch, Some(3), "env beats file");
}

#[test]
fn model_flag_replaces_models_and_derives_a_name() {
    let raw =
        RawConfig::from_toml("[[models]]\nname = \"a\"\nsource = \"a.gguf\"\ndtype = \"f16\"\n")
            .expect("valid toml");
    let flags = set(&[("model", "HuggingFaceTB/SmolLM2-135M-Instruct@main")]);
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
    // (environment, flags, what the message must name)
    let cases: Vec<(Overrides, Overrides, &str)> = vec![
        (Overrides::default(), set(&[("port", "http")]), "--port"),
        (
            set(&[("device", "tpu")]),
            Overrides::default(),
            "FERRY_DEVICE",
        ),
        (Overrides::default(), set(&[("dtype", "int3")]), "--dtype"),
        (
            Overrides::default(),
            set(&[("offload", "disk")]),
            "--offload",
        ),
        (
            Overrides::default(),
            set(&[("gpu-memory", "150%")]),
            "--gpu-memory",
        ),
        (
            Overrides::default(),
            set(&[("max-batch", "0")]),
            "max_batch",
        ),
    ];
    for (env, flags, key) in cases {
        let err = Config::resolve(&RawConfig::default(), &env, &flags).expect_err("must fail");
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
    let flags = set(&[
        ("gpu-memory", "6GiB"),
        ("device", "cuda:1"),
        ("link-bandwidth", "8GB/s"),
    ]);
    let config = Config::resolve(&RawConfig::default(), &Overrides::default(), &flags).expect("ok");
    assert_eq!(
        config.models[0].offload.gpu_memory,
        MemoryBudget::Bytes(6 << 30)
    );
    assert_eq!(config.device.kind, DeviceChoice::Cuda(1));
    assert_eq!(config.device.link_bandwidth, Some(8_000_000_000));
}

#[test]
fn a_file_without_models_is_an_error_unless_model_is_given() {
    let raw = RawConfig::from_toml("[server]\nport = 9000\n").expect("valid toml");
    let err = Config::resolve(&raw, &Overrides::default(), &Overrides::default())
        .expect_err("no [[models]]");
    assert!(err.to_string().contains("[[models]]"), "{err}");
    let config = Config::resolve(&raw, &Overrides::default(), &set(&[("model", "m.gguf")]))
        .expect("--model supplies the model");
    assert_eq!(config.models[0].source, "m.gguf");
    assert_eq!(config.server.port, 9000);
}

#[test]
fn served_name_names_the_one_model_and_refuses_several() {
    let one =
        RawConfig::from_toml("[[models]]\nname = \"a\"\nsource = \"a.gguf\"\n").expect("toml");
    let config = Config::resolve(
        &one,
        &over(&[("FERRY_SERVED_NAME", "b")]),
        &Overrides::default(),
    )
    .expect("one model");
    assert_eq!(config.models[0].name, "b");
    let two = RawConfig::from_toml(
        "[[models]]\nname = \"a\"\nsource = \"a.gguf\"\n[[models]]\nname = \"b\"\nsource = \"b.gguf\"\n",
    )
    .expect("toml");
    let err = Config::resolve(&two, &Overrides::default(), &set(&[("served-name", "c")]))
        .expect_err("two models, one name");
    assert!(err.to_string().contains("--served-name"), "{err}");
    // Other per-model flags apply to every model.
    let config = Config::resolve(&two, &Overrides::default(), &set(&[("max-batch", "3")]))
        .expect("resolves");
    assert!(config.models.iter().all(|m| m.max_batch == Some(3)));
}

#[test]
fn relative_sources_in_a_file_resolve_against_its_folder() {
    let dir = tempfile::tempdir().expect("tempdir");
    let models = dir.path().join("models");
    std::fs::create_dir(&models).expect("mkdir");
    std::fs::write(models.join("m.gguf"), b"GGUF").expect("write");
    let config_dir = dir.path().join("config");
    std::fs::create_dir(&config_dir).expect("mkdir");
    let mut raw = RawConfig::from_toml(
        "[[models]]\nsource = \"../models/m.gguf\"\n[[models]]\nsource = \"org/name@v1\"\n[[models]]\nsource = \"missing/x.gguf\"\n",
    )
    .expect("toml");
    raw.path = Some(config_dir.join("ferry.toml"));
    let config = Config::resolve(&raw, &Overrides::default(), &Overrides::default()).expect("ok");
    let expected = models.join("m.gguf").canonicalize().expect("exists");
    assert_eq!(std::path::Path::new(&config.models[0].source), expected);
    assert_eq!(
        config.models[1].source, "org/name@v1",
        "a hub id stays a hub id"
    );
    assert_eq!(
        std::path::Path::new(&config.models[2].source),
        config_dir.join("missing/x.gguf"),
        "a missing file is reported where it was looked for"
    );
    // A flag is relative to the working directory, as typed.
    let config = Config::resolve(
        &raw,
        &Overrides::default(),
        &set(&[("model", "rel/m.gguf")]),
    )
    .expect("ok");
    assert_eq!(config.models[0].source, "rel/m.gguf");
}

#[test]
fn a_relative_chat_template_file_in_a_file_is_relative_to_its_folder() {
    use crate::ChatTemplateSource;
    let mut raw = RawConfig::from_toml(
        "[[models]]\nsource = \"/m/a.gguf\"\nchat_template = \"t/chat.jinja\"\n[[models]]\nsource = \"/m/b.gguf\"\nchat_template = \"/abs/chat.jinja\"\n[[models]]\nsource = \"/m/c.gguf\"\nchat_template = \"{{ messages[0].content }}\"\n",
    )
    .expect("toml");
    raw.path = Some(std::path::PathBuf::from("/etc/ferry/ferry.toml"));
    let config = Config::resolve(&raw, &Overrides::default(), &Overrides::default()).expect("ok");
    let templates: Vec<_> = config
        .models
        .iter()
        .map(|m| m.chat_template.clone())
        .collect();
    assert_eq!(
        templates,
        [
            Some(ChatTemplateSource::File("/etc/ferry/t/chat.jinja".into())),
            Some(ChatTemplateSource::File("/abs/chat.jinja".into())),
            Some(ChatTemplateSource::Inline(
                "{{ messages[0].content }}".into()
            )),
        ]
    );
    // A flag is relative to the working directory, as typed.
    let config = Config::resolve(
        &raw,
        &Overrides::default(),
        &set(&[("chat-template", "t/chat.jinja")]),
    )
    .expect("ok");
    assert_eq!(
        config.models[0].chat_template,
        Some(ChatTemplateSource::File("t/chat.jinja".into()))
    );
}

#[test]
fn the_shipped_config_points_at_the_fetched_model_from_any_directory() {
    let path = ferry_testkit::repo_root().join("config/default.toml");
    let raw = crate::load::read_file(&path).expect("config/default.toml");
    let resolved = Resolved::new(&raw, &Overrides::default(), &Overrides::default()).expect("ok");
    let source = std::path::Path::new(&resolved.config.models[0].source);
    assert!(source.is_absolute(), "{}", source.display());
    let repo_model = ferry_testkit::repo_root().join(DEFAULT_MODEL_SOURCE);
    if let Ok(real) = repo_model.canonicalize() {
        assert_eq!(source, real);
    } else {
        assert!(source.ends_with(std::path::Path::new("config/../").join(DEFAULT_MODEL_SOURCE)));
    }
    assert_eq!(resolved.origins.get("models[0].source"), Some(Origin::File));
    assert_eq!(
        resolved.origins.get("models[0].prefetch"),
        None,
        "keys are full paths"
    );
    assert_eq!(
        resolved.origins.get("models[0].offload.prefetch"),
        Some(Origin::File)
    );
    assert_eq!(
        resolved.origins.get("device.link_bandwidth"),
        Some(Origin::Default)
    );
}

#[test]
fn mode_model_entries_share_the_first_ones_budget() {
    let file = |second: &str| {
        RawConfig::from_toml(&format!(
            "[[models]]\nname = \"a\"\nsource = \"a.gguf\"\noffload = {{ mode = \"model\", gpu_memory = \"4GiB\" }}\n[[models]]\nname = \"b\"\nsource = \"b.gguf\"\noffload = {{ mode = \"model\"{second} }}\n"
        ))
        .expect("toml")
    };
    let none = Overrides::default();
    assert!(
        Config::resolve(&file(""), &none, &none).is_ok(),
        "inherits the shared budget"
    );
    assert!(
        Config::resolve(&file(", gpu_memory = \"4GiB\""), &none, &none).is_ok(),
        "same value"
    );
    let err = Config::resolve(&file(", gpu_memory = \"2GiB\""), &none, &none)
        .expect_err("a second budget");
    let message = err.to_string();
    assert!(
        message.contains("models[1].offload.gpu_memory") && message.contains("models[0]"),
        "{message}"
    );
    assert!(
        Config::resolve(
            &file(", gpu_memory = \"2GiB\""),
            &none,
            &set(&[("gpu-memory", "3GiB")])
        )
        .is_ok(),
        "a flag sets every entry alike"
    );
}

#[test]
fn sizes_that_cannot_be_meant_are_errors() {
    let raw = RawConfig::from_toml(
        "[[models]]\nsource = \"a.gguf\"\n[models.offload]\ngpu_memory = \"0.9\"\n",
    )
    .expect("toml");
    let err =
        Config::resolve(&raw, &Overrides::default(), &Overrides::default()).expect_err("0.9 bytes");
    let message = err.to_string();
    assert!(
        message.contains("models[0].offload.gpu_memory") && message.contains("90%"),
        "{message}"
    );
}

#[test]
fn origins_say_where_each_value_came_from() {
    let raw = RawConfig::from_toml("[server]\nport = 9000\n[[models]]\nsource = \"a.gguf\"\n")
        .expect("toml");
    let resolved = Resolved::new(
        &raw,
        &over(&[("FERRY_MAX_QUEUE", "5"), ("FERRY_HOST", "0.0.0.0")]),
        &set(&[("host", "::1")]),
    )
    .expect("ok");
    let origins = &resolved.origins;
    assert_eq!(origins.get("server.port"), Some(Origin::File));
    assert_eq!(origins.get("server.max_queue"), Some(Origin::Env));
    assert_eq!(origins.get("server.host"), Some(Origin::Flag));
    assert_eq!(origins.get("server.body_limit"), Some(Origin::Default));
    assert_eq!(
        origins.get("models[0].name"),
        Some(Origin::Default),
        "derived from the source"
    );
    assert_eq!(resolved.config.models[0].name, "a");
    assert_eq!(resolved.config.server.host, "::1");
}

#[test]
fn speculative_settings_come_from_the_table_file_variables_and_flags() {
    use crate::values::SpeculativeMethod;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("draft.gguf"), b"GGUF").expect("write");
    let mut raw = RawConfig::from_toml(
        "[[models]]\nsource = \"m.gguf\"\n[models.speculative]\nmethod = \"draft\"\ndraft = \"draft.gguf\"\ntokens = 6\n",
    )
    .expect("toml");
    raw.path = Some(dir.path().join("ferry.toml"));
    let config = Config::resolve(&raw, &Overrides::default(), &Overrides::default()).expect("ok");
    let speculative = &config.models[0].speculative;
    assert_eq!(speculative.method, SpeculativeMethod::Draft);
    assert_eq!(speculative.tokens, 6);
    let draft = speculative.draft.as_deref().expect("a draft");
    assert_eq!(
        std::path::Path::new(draft),
        dir.path()
            .join("draft.gguf")
            .canonicalize()
            .expect("exists"),
        "a draft in a file is relative to its folder, as a source is"
    );
    // Variables over the file, flags over the variables.
    let env = over(&[
        ("FERRY_SPECULATIVE_METHOD", "ngram"),
        ("FERRY_SPECULATIVE_TOKENS", "3"),
    ]);
    let config = Config::resolve(&raw, &env, &set(&[("speculative-tokens", "9")])).expect("ok");
    assert_eq!(
        config.models[0].speculative.method,
        SpeculativeMethod::Ngram
    );
    assert_eq!(config.models[0].speculative.tokens, 9);
    // The default is off, with 4 tokens.
    let plain = Config::resolve(
        &RawConfig::default(),
        &Overrides::default(),
        &Overrides::default(),
    )
    .expect("defaults");
    assert_eq!(plain.models[0].speculative.method, SpeculativeMethod::None);
    assert_eq!(plain.models[0].speculative.tokens, 4);
    // Method draft without a draft, an unknown method and 0 tokens are errors naming the key.
    let err = Config::resolve(
        &RawConfig::default(),
        &Overrides::default(),
        &set(&[("speculative-method", "draft")]),
    )
    .expect_err("no draft")
    .to_string();
    assert!(
        err.contains("speculative.method") && err.contains("--draft-model"),
        "{err}"
    );
    for (name, value, says) in [
        ("speculative-method", "medusa", "none, draft or ngram"),
        ("speculative-tokens", "0", "at least 1"),
    ] {
        let err = Config::resolve(
            &RawConfig::default(),
            &Overrides::default(),
            &set(&[(name, value)]),
        )
        .expect_err(value)
        .to_string();
        assert!(err.contains(says), "{err}");
    }
}

#[test]
fn host_expert_layers_take_a_count_or_a_list_from_the_file_variables_and_flags() {
    use crate::HostExpertLayers;
    let raw = RawConfig::from_toml(
        "[[models]]\nsource = \"m.gguf\"\noffload = { host_expert_layers = \"0,2,5-7\" }\n",
    )
    .expect("toml");
    let layers = |env: &Overrides, flags: &Overrides| {
        Config::resolve(&raw, env, flags)
            .map(|config| config.models[0].tier.host_expert_layers.clone())
    };
    let none = Overrides::default();
    assert_eq!(
        layers(&none, &none).expect("file"),
        HostExpertLayers::List(vec![0, 2, 5, 6, 7])
    );
    let env = over(&[("FERRY_HOST_EXPERT_LAYERS", "3")]);
    assert_eq!(
        layers(&env, &none).expect("variable"),
        HostExpertLayers::First(3)
    );
    let flags = set(&[("host-expert-layers", "1-2")]);
    assert_eq!(
        layers(&env, &flags).expect("flag"),
        HostExpertLayers::List(vec![1, 2])
    );
    // An integer in the file is a count; the default is none.
    let counted = RawConfig::from_toml(
        "[[models]]\nsource = \"m.gguf\"\noffload = { host_expert_layers = 4 }\n",
    )
    .expect("toml");
    let config = Config::resolve(&counted, &none, &none).expect("count");
    assert_eq!(
        config.models[0].tier.host_expert_layers,
        HostExpertLayers::First(4)
    );
    let plain = Config::resolve(&RawConfig::default(), &none, &none).expect("defaults");
    assert!(plain.models[0].tier.host_expert_layers.is_none());
    // A bad list names the setting and what it takes.
    let error = layers(&none, &set(&[("host-expert-layers", "2-x")])).expect_err("bad");
    let text = error.to_string();
    assert!(
        text.contains("host-expert-layers") && text.contains("0,2,5-7"),
        "{text}"
    );
}
