//! `ferry config`: the effective configuration with the origin of every value (default, file,
//! env, flag), as TOML-ish text or as one JSON document. Secrets are never printed.

use std::fmt::Write as _;

use serde_json::{json, Map, Value};

use super::resolve::{Origin, Resolved};
use super::settings::{in_scope, Scope, Section, Setting};

/// Where a value came from, in words: `default`, `file`, `env FERRY_PORT`, `flag --port`.
fn origin_text(origin: Option<Origin>, setting: &Setting) -> String {
    match origin {
        Some(Origin::Env) => format!("env {}", setting.env()),
        Some(Origin::Flag) => format!("flag {}", setting.flag()),
        Some(other) => other.as_str().to_string(),
        None => "default".to_string(),
    }
}

/// The TOML-ish listing: every key with its value and, after `#`, its origin.
pub fn render_text(resolved: &Resolved) -> String {
    let mut out = String::new();
    let file = resolved
        .file
        .as_ref()
        .map_or_else(|| "none".to_string(), |p| p.display().to_string());
    let _ = writeln!(
        out,
        "# ferry's effective configuration; after each value, where it came from\n# (default < file < env FERRY_* < flag). Config file: {file}"
    );
    let config = &resolved.config;
    section(
        &mut out,
        resolved,
        "[server]",
        Scope::Server,
        &config.server,
        None,
    );
    section(
        &mut out,
        resolved,
        "[device]",
        Scope::Device,
        &config.device,
        None,
    );
    for (index, model) in config.models.iter().enumerate() {
        section(
            &mut out,
            resolved,
            "[[models]]",
            Scope::Model,
            model,
            Some(index),
        );
    }
    out
}

fn section<T: Section>(
    out: &mut String,
    resolved: &Resolved,
    header: &str,
    scope: Scope,
    values: &T,
    model: Option<usize>,
) {
    let _ = writeln!(out, "\n{header}");
    let mut group = "";
    for setting in in_scope(scope) {
        let (prefix, name) = setting.key.rsplit_once('.').unwrap_or(("", setting.key));
        if prefix != group {
            group = prefix;
            let _ = writeln!(out, "\n[models.{group}]");
        }
        let origin = resolved.origins.get(&setting.key_at(model.unwrap_or(0)));
        let line = match setting.show(values).toml() {
            Some(value) => format!("{name} = {value}"),
            None => format!("# {name} is not set"),
        };
        let _ = writeln!(out, "{line:<48} # {}", origin_text(origin, setting));
    }
}

/// The same as one JSON document: `{"file", "server": {key: {"value", "origin", "from"?}},
/// "device": {...}, "models": [{...}]}`, nested tables (`offload`) as nested objects.
pub fn render_json(resolved: &Resolved) -> Value {
    let config = &resolved.config;
    let models: Vec<Value> = config
        .models
        .iter()
        .enumerate()
        .map(|(index, model)| json_section(resolved, Scope::Model, model, index))
        .collect();
    json!({
        "file": resolved.file.as_ref().map(|p| p.display().to_string()),
        "server": json_section(resolved, Scope::Server, &config.server, 0),
        "device": json_section(resolved, Scope::Device, &config.device, 0),
        "models": models,
    })
}

fn json_section<T: Section>(resolved: &Resolved, scope: Scope, values: &T, model: usize) -> Value {
    let mut root = Map::new();
    for setting in in_scope(scope) {
        let origin = resolved.origins.get(&setting.key_at(model));
        let mut entry = Map::new();
        entry.insert("value".into(), setting.show(values).json());
        entry.insert(
            "origin".into(),
            Value::from(origin.unwrap_or(Origin::Default).as_str()),
        );
        match origin {
            Some(Origin::Env) => {
                entry.insert("from".into(), Value::from(setting.env()));
            }
            Some(Origin::Flag) => {
                entry.insert("from".into(), Value::from(setting.flag()));
            }
            _ => {}
        }
        let parts: Vec<&str> = setting.key.split('.').collect();
        insert_at(&mut root, &parts, Value::Object(entry));
    }
    Value::Object(root)
}

/// Inserts `value` at the dotted path `parts` (`["offload", "mode"]`), making the nested objects.
fn insert_at(table: &mut Map<String, Value>, parts: &[&str], value: Value) {
    match parts {
        [] => {}
        [leaf] => {
            table.insert(leaf.to_string(), value);
        }
        [head, rest @ ..] => {
            let next = table
                .entry(head.to_string())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(inner) = next {
                insert_at(inner, rest, value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw::RawConfig;
    use crate::resolve::Overrides;
    use crate::settings::SETTINGS;

    fn two_models() -> Resolved {
        let raw = RawConfig::from_toml(
            "[[models]]\nsource = \"a.gguf\"\n[[models]]\nsource = \"b.gguf\"\nmax_batch = 2\n",
        )
        .expect("toml");
        let mut flags = Overrides::default();
        flags.set("api-key", "sk-secret").expect("setting");
        Resolved::new(&raw, &Overrides::default(), &flags).expect("resolves")
    }

    #[test]
    fn the_text_lists_every_setting_of_every_model_once() {
        let text = render_text(&two_models());
        for setting in SETTINGS {
            let leaf = setting.key.rsplit('.').next().unwrap_or(setting.key);
            let lines = text
                .lines()
                .filter(|l| {
                    l.starts_with(&format!("{leaf} = "))
                        || l.starts_with(&format!("# {leaf} is not set"))
                })
                .count();
            let expected = if setting.scope() == Scope::Model {
                2
            } else {
                1
            };
            assert_eq!(lines, expected, "{}:\n{text}", setting.key);
        }
        assert_eq!(text.matches("[models.offload]").count(), 2, "{text}");
        assert!(!text.contains("sk-secret"), "{text}");
        assert!(text.contains("# flag --api-key"), "{text}");
    }

    #[test]
    fn the_json_nests_tables_and_names_each_origin() {
        let doc = render_json(&two_models());
        assert_eq!(doc["models"].as_array().map(Vec::len), Some(2));
        assert_eq!(doc["models"][1]["max_batch"]["value"], 2);
        assert_eq!(doc["models"][1]["max_batch"]["origin"], "file");
        assert_eq!(doc["models"][0]["max_batch"]["origin"], "default");
        assert_eq!(doc["models"][0]["offload"]["mode"]["value"], "auto");
        assert_eq!(doc["server"]["api_key"]["value"], "(hidden)");
        assert_eq!(doc["server"]["api_key"]["from"], "--api-key");
        assert_eq!(doc["file"], Value::Null);
    }
}
