//! The command line: flags become overrides, and every setting reaches the resolved config through
//! its flag, its `FERRY_*` variable and its config key, each with the right origin.

use super::*;
use ferry_config::raw::RawConfig;
use ferry_config::settings::{Scope, SOURCE};
use ferry_config::values::Shown;
use ferry_config::{Origin, Resolved};

#[test]
fn serve_flags_become_overrides() {
    let cli = Cli::try_parse_from([
        "ferry",
        "serve",
        "--model",
        "m.gguf",
        "--port",
        "9000",
        "--offload",
        "sequential",
        "--gpu-memory",
        "2GiB",
        "--max-batch",
        "4",
    ])
    .expect("parses");
    let Command::Serve(args) = cli.command else {
        panic!("expected serve");
    };
    let flags = &args.settings;
    assert_eq!(flags.value("port"), Some("9000"));
    assert_eq!(flags.value("model"), Some("m.gguf"));
    assert_eq!(flags.value("offload"), Some("sequential"));
    assert_eq!(flags.value("gpu-memory"), Some("2GiB"));
    assert_eq!(flags.value("max-batch"), Some("4"));
}

#[test]
fn a_switch_given_alone_is_on() {
    let cli =
        Cli::try_parse_from(["ferry", "plan", "--recalibrate", "--device", "cpu"]).expect("parses");
    let Command::Plan(args) = cli.command else {
        panic!("expected plan");
    };
    assert_eq!(args.settings.value("recalibrate"), Some("true"));
    assert_eq!(args.settings.value("device"), Some("cpu"));
    let cli = Cli::try_parse_from(["ferry", "plan", "--recalibrate", "false"]).expect("parses");
    let Command::Plan(args) = cli.command else {
        panic!("expected plan");
    };
    assert_eq!(args.settings.value("recalibrate"), Some("false"));
}

#[test]
fn plan_and_generate_take_the_model_flags() {
    let plan = Cli::try_parse_from(["ferry", "plan", "--device", "cpu", "--json"]).expect("plan");
    assert!(matches!(
        plan.command,
        Command::Plan(PlanArgs { json: true, .. })
    ));
    let generate = Cli::try_parse_from([
        "ferry", "generate", "--prompt", "hi", "--dtype", "f32", "--seed", "7",
    ])
    .expect("generate");
    let Command::Generate(args) = generate.command else {
        panic!("expected generate");
    };
    assert_eq!(args.settings.value("dtype"), Some("f32"));
    assert_eq!(args.seed, Some(7));
    assert!(
        Cli::try_parse_from(["ferry", "generate"]).is_err(),
        "--prompt is required"
    );
    assert!(
        Cli::try_parse_from(["ferry", "plan", "--port", "1"]).is_err(),
        "server settings are not flags of plan"
    );
}

/// The resolved value of `setting` in model 0 (or its table), as shown, and its origin.
fn resolved_value(resolved: &Resolved, setting: &Setting) -> (Shown, Option<Origin>) {
    let config = &resolved.config;
    let shown = match setting.scope() {
        Scope::Server => setting.show(&config.server),
        Scope::Device => setting.show(&config.device),
        Scope::Model => setting.show(&config.models[0]),
    };
    (shown, resolved.origins.get(&setting.key_at(0)))
}

/// A config file setting `setting` to `value` (plus a source, which every model needs).
fn file_setting(setting: &Setting, value: &str) -> String {
    let quoted = toml::Value::String(value.to_string()).to_string();
    match setting.scope() {
        Scope::Server => format!(
            "[server]\n{} = {quoted}\n[[models]]\nsource = \"a.gguf\"\n",
            setting.key
        ),
        Scope::Device => format!(
            "[device]\n{} = {quoted}\n[[models]]\nsource = \"a.gguf\"\n",
            setting.key
        ),
        Scope::Model if setting.name == SOURCE => format!("[[models]]\nsource = {quoted}\n"),
        Scope::Model => format!(
            "[[models]]\nsource = \"a.gguf\"\n{} = {quoted}\n",
            setting.key
        ),
    }
}

#[test]
fn every_setting_reaches_the_config_by_flag_variable_and_key() {
    let none = Overrides::default();
    let defaults = Resolved::new(&RawConfig::default(), &none, &none).expect("defaults");
    for setting in SETTINGS {
        let (default, _) = resolved_value(&defaults, setting);

        // The flag, parsed by clap as `ferry serve` (which takes every setting) parses it.
        let cli = Cli::try_parse_from(["ferry", "serve", &setting.flag(), setting.example])
            .unwrap_or_else(|e| panic!("{}: {e}", setting.flag()));
        let Command::Serve(args) = cli.command else {
            panic!("expected serve");
        };
        let by_flag = Resolved::new(&RawConfig::default(), &none, &args.settings.overrides)
            .unwrap_or_else(|e| panic!("{}: {e}", setting.flag()));

        // The variable, through the same lookup the binary uses.
        let env_name = setting.env();
        let env = Overrides::from_env(|key| (key == env_name).then(|| setting.example.to_string()));
        let by_env = Resolved::new(&RawConfig::default(), &env, &none)
            .unwrap_or_else(|e| panic!("{env_name}: {e}"));

        // The config key, in a real TOML file.
        let raw = RawConfig::from_toml(&file_setting(setting, setting.example))
            .unwrap_or_else(|e| panic!("{}: {e}", setting.doc_key()));
        let by_file = Resolved::new(&raw, &none, &none)
            .unwrap_or_else(|e| panic!("{}: {e}", setting.doc_key()));

        for (resolved, origin) in [
            (&by_flag, Origin::Flag),
            (&by_env, Origin::Env),
            (&by_file, Origin::File),
        ] {
            let (value, got) = resolved_value(resolved, setting);
            assert_ne!(
                value, default,
                "{} by {origin:?} did not change the value",
                setting.name
            );
            assert_eq!(got, Some(origin), "{} by {origin:?}", setting.name);
        }
        assert_eq!(
            resolved_value(&by_flag, setting).0,
            resolved_value(&by_file, setting).0
        );
        assert_eq!(
            resolved_value(&by_env, setting).0,
            resolved_value(&by_file, setting).0
        );
    }
}

#[test]
fn flags_beat_variables_beat_the_file_for_every_setting() {
    for setting in SETTINGS {
        let file = file_setting(setting, setting.example);
        let raw = RawConfig::from_toml(&file).expect("file");
        let env_name = setting.env();
        let env = Overrides::from_env(|key| (key == env_name).then(|| setting.example.to_string()));
        let cli = Cli::try_parse_from(["ferry", "serve", &setting.flag(), setting.example])
            .expect("flag");
        let Command::Serve(args) = cli.command else {
            panic!("expected serve");
        };
        let both = Resolved::new(&raw, &env, &args.settings.overrides).expect("resolves");
        assert_eq!(
            resolved_value(&both, setting).1,
            Some(Origin::Flag),
            "{}",
            setting.name
        );
        let env_and_file = Resolved::new(&raw, &env, &Overrides::default()).expect("resolves");
        assert_eq!(
            resolved_value(&env_and_file, setting).1,
            Some(Origin::Env),
            "{}",
            setting.name
        );
    }
}
