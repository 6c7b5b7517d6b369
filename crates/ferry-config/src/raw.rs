//! Phase one: the config file as written. TOML text becomes, per table, the text of each value
//! under its key (`offload.mode`), checked against the keys of [`super::settings::SETTINGS`].
//! Structural mistakes are errors in the file's own words: an unknown key (naming the closest
//! known one), `[models]` where `[[models]]` is meant, a table where a value is expected. No
//! I/O, no defaults: that is [`super::resolve`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use toml::Value;

use super::settings::{closest, in_scope, Scope, SETTINGS};
use super::ConfigError;

/// The values of one table, by key (`port`, `offload.mode`), as text.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawTable {
    values: BTreeMap<String, String>,
}

impl RawTable {
    /// The text of `key`, if the file sets it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    /// Sets `key` (for building tables in code and tests).
    pub fn set(&mut self, key: &str, text: &str) {
        self.values.insert(key.to_string(), text.to_string());
    }

    /// Removes `key`.
    pub fn remove(&mut self, key: &str) {
        self.values.remove(key);
    }
}

/// A whole config file, or none (`RawConfig::default()`: only defaults, env and flags apply).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RawConfig {
    /// Whether this came from a file (a file must have `[[models]]` unless `--model` is given).
    pub from_file: bool,
    /// The file's path, when known: relative model sources resolve against its folder.
    pub path: Option<PathBuf>,
    /// `[server]`.
    pub server: RawTable,
    /// `[device]`.
    pub device: RawTable,
    /// `[[models]]`, one table per served model.
    pub models: Vec<RawTable>,
}

impl RawConfig {
    /// Parses TOML text. Unknown keys are errors so typos do not pass silently.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let root: toml::Table = text.parse().map_err(|e: toml::de::Error| parse_error(e))?;
        let mut raw = RawConfig {
            from_file: true,
            ..RawConfig::default()
        };
        for (key, value) in root {
            match key.as_str() {
                "server" => raw.server = table(value, "server", Scope::Server)?,
                "device" => raw.device = table(value, "device", Scope::Device)?,
                "models" => raw.models = models(value)?,
                other => return Err(unknown_top_level(other)),
            }
        }
        Ok(raw)
    }
}

fn parse_error(error: toml::de::Error) -> ConfigError {
    ConfigError::Parse {
        path: None,
        message: error.to_string().trim_end().to_string(),
    }
}

fn structure(message: String) -> ConfigError {
    ConfigError::Parse {
        path: None,
        message,
    }
}

fn models(value: Value) -> Result<Vec<RawTable>, ConfigError> {
    match value {
        Value::Array(entries) => entries
            .into_iter()
            .enumerate()
            .map(|(i, entry)| table(entry, &format!("models[{i}]"), Scope::Model))
            .collect(),
        Value::Table(_) => Err(structure(
            "`[models]` is a single table; write `[[models]]` (double brackets), one per served model, and `[models.offload]` under it".to_string(),
        )),
        other => Err(structure(format!(
            "`models` must be a list of `[[models]]` tables, not {}",
            kind(&other)
        ))),
    }
}

/// Flattens a table (and its sub-tables, such as `offload`) into `key -> text`.
fn table(value: Value, at: &str, scope: Scope) -> Result<RawTable, ConfigError> {
    let Value::Table(entries) = value else {
        return Err(structure(format!(
            "`{at}` must be a table (`[{}]`), not {}",
            at.split('[').next().unwrap_or(at),
            kind(&value)
        )));
    };
    let mut raw = RawTable::default();
    flatten(entries, "", at, scope, &mut raw)?;
    Ok(raw)
}

fn flatten(
    entries: toml::Table,
    prefix: &str,
    at: &str,
    scope: Scope,
    out: &mut RawTable,
) -> Result<(), ConfigError> {
    for (name, value) in entries {
        let key = format!("{prefix}{name}");
        let is_key = in_scope(scope).any(|s| s.key == key);
        let is_group = in_scope(scope).any(|s| s.key.starts_with(&format!("{key}.")));
        match value {
            Value::Table(inner) if is_group => flatten(inner, &format!("{key}."), at, scope, out)?,
            value if is_key => {
                let text = scalar(&value).ok_or_else(|| {
                    structure(format!(
                        "`{at}.{key}` must be a single value, not {}",
                        kind(&value)
                    ))
                })?;
                out.values.insert(key, text);
            }
            value if is_group => {
                return Err(structure(format!(
                    "`{at}.{key}` must be a table (`[{}.{key}]`), not {}",
                    at.split('[').next().unwrap_or(at),
                    kind(&value)
                )))
            }
            _ => return Err(unknown_key(at, scope, &key)),
        }
    }
    Ok(())
}

/// The text of a scalar: strings as written, numbers and booleans in TOML's spelling.
fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Integer(n) => Some(n.to_string()),
        Value::Float(x) => Some(x.to_string()),
        Value::Boolean(b) => Some(b.to_string()),
        Value::Datetime(_) | Value::Array(_) | Value::Table(_) => None,
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a number",
        Value::Boolean(_) => "a boolean",
        Value::Datetime(_) => "a date",
        Value::Array(_) => "a list",
        Value::Table(_) => "a table",
    }
}

fn unknown_key(at: &str, scope: Scope, key: &str) -> ConfigError {
    let hint = closest(key, in_scope(scope).map(|s| s.key))
        .map(|k| format!("; did you mean `{at}.{k}`?"))
        .unwrap_or_else(|| {
            let known: Vec<&str> = in_scope(scope).map(|s| s.key).collect();
            format!(" (known keys: {})", known.join(", "))
        });
    structure(format!("unknown key `{at}.{key}`{hint}"))
}

fn unknown_top_level(key: &str) -> ConfigError {
    let hint = match SETTINGS
        .iter()
        .find(|s| s.key == key || s.key.ends_with(&format!(".{key}")))
    {
        Some(setting) => format!("; `{key}` belongs in a table: `{}`", setting.doc_key()),
        None => match closest(key, ["server", "device", "models"]) {
            Some(name) => format!("; did you mean `{name}`?"),
            None => " (the file has `[server]`, `[device]` and `[[models]]` tables)".to_string(),
        },
    };
    structure(format!("unknown key `{key}`{hint}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> String {
        RawConfig::from_toml(text)
            .expect_err("must fail")
            .to_string()
    }

    #[test]
    fn values_are_kept_as_text_by_key() {
        let raw = RawConfig::from_toml(
            "[server]\nport = 9000\n[[models]]\nsource = \"a.gguf\"\n[models.offload]\nmode = \"model\"\n",
        )
        .expect("valid");
        assert!(raw.from_file);
        assert_eq!(raw.server.get("port"), Some("9000"));
        assert_eq!(raw.models.len(), 1);
        assert_eq!(raw.models[0].get("offload.mode"), Some("model"));
        let inline =
            RawConfig::from_toml("[[models]]\nsource = \"a\"\noffload = { prefetch = 3 }\n")
                .expect("inline table");
        assert_eq!(inline.models[0].get("offload.prefetch"), Some("3"));
    }

    #[test]
    fn unknown_keys_name_the_closest_known_one() {
        let message = error("[server]\nprot = 1\n");
        assert!(message.contains("server.prot"), "{message}");
        assert!(message.contains("did you mean `server.port`"), "{message}");
        let message = error("[[models]]\nsource = \"a\"\n[models.offload]\ngpu_mem = \"1GiB\"\n");
        assert!(
            message.contains("models[0].offload.gpu_memory"),
            "{message}"
        );
        let message = error("port = 1\n");
        assert!(message.contains("server.port"), "{message}");
    }

    #[test]
    fn structural_mistakes_are_explained_without_rust_type_names() {
        let message = error("[models]\nsource = \"a.gguf\"\n");
        assert!(message.contains("[[models]]"), "{message}");
        let message = error("[[models]]\nsource = \"a\"\noffload = \"auto\"\n");
        assert!(message.contains("must be a table"), "{message}");
        assert!(!message.contains("struct"), "{message}");
        let message = error("server = 3\n");
        assert!(message.contains("`server` must be a table"), "{message}");
        let message = error("[server]\nport = [1, 2]\n");
        assert!(message.contains("single value"), "{message}");
        for text in [
            "[server]\nport = 9000\nport = 9001\n",
            "[server\n",
            "[[models]]\n[models.offload]\nmode = 3\nmode = 4\n",
        ] {
            let message = error(text);
            assert!(
                !message.contains("struct") && !message.contains("Raw"),
                "{message}"
            );
        }
    }
}
