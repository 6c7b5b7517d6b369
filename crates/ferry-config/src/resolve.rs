//! Phase two: built-in defaults < config file < `FERRY_*` environment < flags, setting by setting
//! from [`SETTINGS`], recording where every value came from ([`Origins`], shown by
//! `ferry config`). Pure: the environment and the flags arrive as [`Overrides`], so every rule is
//! unit-tested. The only look at the machine: a relative model `source` from a file is taken
//! relative to the file's folder when that path exists (see [`rebase_source`]); a relative
//! `chat_template` file from a file is always taken relative to its folder
//! ([`rebase_template`]).
//!
//! Per-model settings given as a flag or variable apply to every `[[models]]` entry. Two are
//! special: `--model`/`FERRY_MODEL` replaces the configured models with that one (keeping the
//! first entry's other settings), and `--served-name`/`FERRY_SERVED_NAME` names the one served
//! model (an error when several are configured).

use std::collections::BTreeMap;
use std::path::Path;

use super::raw::{RawConfig, RawTable};
use super::settings::{
    find, in_scope, Scope, Section, Setting, CHAT_TEMPLATE, DEFAULT_MODEL_NAME, DRAFT_MODEL, NAME,
    SETTINGS, SOURCE,
};
use super::types::{Config, DeviceConfig, ModelConfig, ServerConfig};
use super::values::{
    ChatTemplateSource, Codec, MemoryBudget, OffloadMode, SpeculativeMethod, Template,
};
use super::ConfigError;

/// Settings given as text by one layer (the environment, or the flags), by setting name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    values: BTreeMap<&'static str, String>,
}

impl Overrides {
    /// Reads every setting's `FERRY_*` variable through `lookup` (pass
    /// `|k| std::env::var(k).ok()`).
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let mut overrides = Self::default();
        for setting in SETTINGS {
            if let Some(value) = lookup(&setting.env()) {
                overrides.insert(setting, value);
            }
        }
        overrides
    }

    /// Sets `setting` to `value`.
    pub fn insert(&mut self, setting: &'static Setting, value: String) {
        self.values.insert(setting.name, value);
    }

    /// Sets the setting named `name` (its flag without dashes, e.g. `gpu-memory`).
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), ConfigError> {
        let setting = find(name).ok_or_else(|| {
            ConfigError::invalid(
                name,
                "not a setting (see the configuration table in README.md)",
            )
        })?;
        self.insert(setting, value.to_string());
        Ok(())
    }

    /// The text given for `setting`, if any.
    pub fn get(&self, setting: &Setting) -> Option<&str> {
        self.values.get(setting.name).map(String::as_str)
    }

    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// Where a resolved value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The built-in default (for a model name: derived from its source).
    Default,
    /// The config file.
    File,
    /// A `FERRY_*` environment variable.
    Env,
    /// A command-line flag.
    Flag,
}

impl Origin {
    /// `default`, `file`, `env` or `flag`.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Default => "default",
            Origin::File => "file",
            Origin::Env => "env",
            Origin::Flag => "flag",
        }
    }

    /// How an error names the value: `` `--port` (`server.port`) ``, the same with
    /// `FERRY_PORT`, or `` `server.port` ``.
    fn name(self, setting: &Setting, key: &str) -> String {
        match self {
            Origin::Flag => format!("`{}` (`{key}`)", setting.flag()),
            Origin::Env => format!("`{}` (`{key}`)", setting.env()),
            Origin::Default | Origin::File => format!("`{key}`"),
        }
    }
}

/// The origin of every resolved value, by key (`server.port`, `models[1].offload.mode`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Origins {
    by_key: BTreeMap<String, Origin>,
}

impl Origins {
    /// The origin of the value at `key`.
    pub fn get(&self, key: &str) -> Option<Origin> {
        self.by_key.get(key).copied()
    }

    fn set(&mut self, key: String, origin: Origin) {
        self.by_key.insert(key, origin);
    }
}

/// A resolved configuration with the origin of each value.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The configuration.
    pub config: Config,
    /// Where each value came from.
    pub origins: Origins,
    /// The config file, if one was read.
    pub file: Option<std::path::PathBuf>,
}

impl Config {
    /// Resolves a parsed file with environment and flag overrides (flags win).
    pub fn resolve(
        raw: &RawConfig,
        env: &Overrides,
        flags: &Overrides,
    ) -> Result<Self, ConfigError> {
        Resolved::new(raw, env, flags).map(|resolved| resolved.config)
    }
}

/// The layers one resolution reads.
struct Layers<'a> {
    raw: &'a RawConfig,
    env: &'a Overrides,
    flags: &'a Overrides,
}

impl Layers<'_> {
    /// The flag or variable for `setting`, if either is given (the flag wins).
    fn overridden(&self, setting: &Setting) -> Option<(Origin, &str)> {
        self.flags
            .get(setting)
            .map(|v| (Origin::Flag, v))
            .or_else(|| self.env.get(setting).map(|v| (Origin::Env, v)))
    }

    /// The winning text for `setting`: flag, variable, then the file's `table`.
    fn pick<'t>(
        &'t self,
        setting: &Setting,
        table: Option<&'t RawTable>,
    ) -> Option<(Origin, &'t str)> {
        self.overridden(setting).or_else(|| {
            table
                .and_then(|t| t.get(setting.key))
                .map(|v| (Origin::File, v))
        })
    }
}

/// Applies `setting` to `section` from the winning layer, or its default.
fn resolve_one<T: Section>(
    setting: &Setting,
    section: &mut T,
    picked: Option<(Origin, &str)>,
    key: String,
    origins: &mut Origins,
) -> Result<(), ConfigError> {
    let origin = match picked {
        Some((origin, text)) => {
            setting
                .apply(section, text)
                .map_err(|m| invalid(origin, setting, &key, m))?;
            origin
        }
        None => {
            setting.apply_default(section);
            Origin::Default
        }
    };
    origins.set(key, origin);
    Ok(())
}

fn invalid(origin: Origin, setting: &Setting, key: &str, message: String) -> ConfigError {
    ConfigError::Invalid {
        key: origin.name(setting, key),
        message,
    }
}

impl Resolved {
    /// Resolves a parsed file with environment and flag overrides (flags win).
    pub fn new(raw: &RawConfig, env: &Overrides, flags: &Overrides) -> Result<Self, ConfigError> {
        let layers = Layers { raw, env, flags };
        let mut origins = Origins::default();

        let mut server = ServerConfig::blank();
        for setting in in_scope(Scope::Server) {
            let picked = layers.pick(setting, Some(&raw.server));
            resolve_one(
                setting,
                &mut server,
                picked,
                setting.doc_key(),
                &mut origins,
            )?;
        }
        let mut device = DeviceConfig::blank();
        for setting in in_scope(Scope::Device) {
            let picked = layers.pick(setting, Some(&raw.device));
            resolve_one(
                setting,
                &mut device,
                picked,
                setting.doc_key(),
                &mut origins,
            )?;
        }

        let tables = model_tables(&layers)?;
        let mut models = Vec::with_capacity(tables.len());
        for (index, table) in tables.iter().enumerate() {
            models.push(resolve_model(
                &layers,
                index,
                table.as_ref(),
                tables.len(),
                &mut origins,
            )?);
        }
        check_models(&models, &origins)?;
        Ok(Self {
            config: Config {
                server,
                device,
                models,
            },
            origins,
            file: raw.path.clone(),
        })
    }
}

/// The entry named `name` of [`SETTINGS`], for the two special model settings.
fn setting(name: &str) -> &'static Setting {
    find(name).expect("SOURCE and NAME are entries of SETTINGS (a unit test checks it)")
}

/// The `[[models]]` tables to resolve: the file's, one built from `--model`, or none (`None` =
/// the built-in default model).
fn model_tables(layers: &Layers) -> Result<Vec<Option<RawTable>>, ConfigError> {
    let raw = layers.raw;
    if layers.overridden(setting(SOURCE)).is_some() {
        // `--model` replaces the models, keeping the first entry's other settings.
        let mut template = raw.models.first().cloned().unwrap_or_default();
        template.remove(setting(SOURCE).key);
        template.remove(setting(NAME).key);
        return Ok(vec![Some(template)]);
    }
    if !raw.models.is_empty() {
        return Ok(raw.models.iter().cloned().map(Some).collect());
    }
    if raw.from_file {
        return Err(ConfigError::Parse {
            path: raw.path.clone(),
            message: "it has no `[[models]]` table: add one per served model (see config/default.toml), or pass --model".to_string(),
        });
    }
    Ok(vec![None])
}

fn resolve_model(
    layers: &Layers,
    index: usize,
    table: Option<&RawTable>,
    count: usize,
    origins: &mut Origins,
) -> Result<ModelConfig, ConfigError> {
    let mut model = ModelConfig::blank();
    for setting in in_scope(Scope::Model) {
        let key = setting.key_at(index);
        match setting.name {
            SOURCE => {
                let picked = match layers.pick(setting, table) {
                    Some((Origin::File, text)) => {
                        Some((Origin::File, rebase_source(text, layers.raw)))
                    }
                    Some((origin, text)) => Some((origin, text.to_string())),
                    None if table.is_some() => {
                        return Err(ConfigError::invalid(key, "every model needs a source"))
                    }
                    None => None,
                };
                let picked = picked.as_ref().map(|(o, t)| (*o, t.as_str()));
                resolve_one(setting, &mut model, picked, key, origins)?;
            }
            DRAFT_MODEL => {
                let picked = match layers.pick(setting, table) {
                    Some((Origin::File, text)) => {
                        Some((Origin::File, rebase_source(text, layers.raw)))
                    }
                    other => other.map(|(origin, text)| (origin, text.to_string())),
                };
                let picked = picked.as_ref().map(|(o, t)| (*o, t.as_str()));
                resolve_one(setting, &mut model, picked, key, origins)?;
            }
            CHAT_TEMPLATE => {
                let picked = match layers.pick(setting, table) {
                    Some((Origin::File, text)) => {
                        Some((Origin::File, rebase_template(text, layers.raw)))
                    }
                    other => other.map(|(origin, text)| (origin, text.to_string())),
                };
                let picked = picked.as_ref().map(|(o, t)| (*o, t.as_str()));
                resolve_one(setting, &mut model, picked, key, origins)?;
            }
            NAME => {} // after the source, below
            _ => {
                let picked = layers.pick(setting, table);
                resolve_one(setting, &mut model, picked, key, origins)?;
            }
        }
    }
    let name = setting(NAME);
    let key = name.key_at(index);
    if let Some((origin, _)) = layers.overridden(name) {
        if count > 1 {
            return Err(invalid(
                origin,
                name,
                &key,
                format!("it names one model, but {count} are configured: set `name` in each `[[models]]` entry instead"),
            ));
        }
    }
    let file_name = table
        .and_then(|t| t.get(name.key))
        .filter(|n| !n.trim().is_empty());
    match layers
        .overridden(name)
        .or(file_name.map(|n| (Origin::File, n)))
    {
        Some(picked) => resolve_one(name, &mut model, Some(picked), key, origins)?,
        None => {
            // The built-in model keeps its short name; any other is named after its source.
            let default_source =
                origins.get(&setting(SOURCE).key_at(index)) == Some(Origin::Default);
            model.name = if default_source {
                DEFAULT_MODEL_NAME.to_string()
            } else {
                derive_name(&model.source)
            };
            origins.set(key, Origin::Default);
        }
    }
    Ok(model)
}

/// Rules that span settings or models: unique names; a draft model for method `draft`; one
/// device budget for every mode-`model` entry.
fn check_models(models: &[ModelConfig], origins: &Origins) -> Result<(), ConfigError> {
    for (i, model) in models.iter().enumerate() {
        let speculative = &model.speculative;
        if speculative.method == SpeculativeMethod::Draft && speculative.draft.is_none() {
            return Err(ConfigError::invalid(
                format!("models[{i}].speculative.method"),
                "method `draft` needs a draft model: set `speculative.draft` (--draft-model)",
            ));
        }
        if models[..i].iter().any(|other| other.name == model.name) {
            return Err(ConfigError::invalid(
                format!("models[{i}].name"),
                format!(
                    "`{}` is used by two models; names must be unique",
                    model.name
                ),
            ));
        }
    }
    let swapped: Vec<(usize, &ModelConfig)> = models
        .iter()
        .enumerate()
        .filter(|(_, m)| m.offload.mode == OffloadMode::Model)
        .collect();
    if let Some(((first_index, first), rest)) = swapped.split_first() {
        for (index, model) in rest {
            let key = format!("models[{index}].offload.gpu_memory");
            let set_here = origins.get(&key) == Some(Origin::File);
            if set_here && !same_budget(model.offload.gpu_memory, first.offload.gpu_memory) {
                return Err(ConfigError::invalid(
                    key,
                    format!(
                        "mode `model` entries share one device budget, set by the first of them (`models[{first_index}].offload.gpu_memory`); remove it here or set the same value there"
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn same_budget(a: MemoryBudget, b: MemoryBudget) -> bool {
    match (a, b) {
        (MemoryBudget::Bytes(x), MemoryBudget::Bytes(y)) => x == y,
        (MemoryBudget::FractionOfFree(x), MemoryBudget::FractionOfFree(y)) => (x - y).abs() < 1e-9,
        _ => false,
    }
}

/// A model `source` written in a config file, taken relative to the file's folder: an absolute
/// path stays; a relative one that exists there, or that cannot be a hub id (`org/name`), is
/// joined to the folder; a hub id stays a hub id. Sources from flags, variables and the built-in
/// default are relative to the working directory.
pub fn rebase_source(text: &str, raw: &RawConfig) -> String {
    let Some(dir) = raw.path.as_deref().and_then(Path::parent) else {
        return text.to_string();
    };
    let trimmed = text.trim();
    let path = Path::new(trimmed);
    if path.is_absolute() || dir.as_os_str().is_empty() {
        return text.to_string();
    }
    let joined = dir.join(path);
    if let Ok(real) = joined.canonicalize() {
        real.to_string_lossy().into_owned()
    } else if could_be_hub_id(trimmed) {
        text.to_string()
    } else {
        joined.to_string_lossy().into_owned()
    }
}

/// A `chat_template` written in a config file: a relative file path is joined to the file's
/// folder (the Jinja itself, and absolute paths, stay as written).
pub fn rebase_template(text: &str, raw: &RawConfig) -> String {
    let Some(dir) = raw.path.as_deref().and_then(Path::parent) else {
        return text.to_string();
    };
    match Template::parse(text) {
        Ok(Some(ChatTemplateSource::File(path))) if path.is_relative() => {
            dir.join(path).to_string_lossy().into_owned()
        }
        _ => text.to_string(),
    }
}

/// `org/name[@revision]` in shape (the model layer decides for real).
fn could_be_hub_id(text: &str) -> bool {
    let repo = text.split('@').next().unwrap_or(text);
    let parts: Vec<&str> = repo.split('/').collect();
    parts.len() == 2
        && parts.iter().all(|p| !p.is_empty() && !p.starts_with('.'))
        && !repo.to_ascii_lowercase().ends_with(".gguf")
}

/// A served name from a source: a file's stem, a directory's name, or a hub id without revision.
pub fn derive_name(source: &str) -> String {
    let without_revision = source.split('@').next().unwrap_or(source);
    let path = std::path::Path::new(without_revision);
    let looks_like_path = without_revision.starts_with('.')
        || without_revision.starts_with('/')
        || without_revision.ends_with(".gguf")
        || without_revision.matches('/').count() != 1;
    if looks_like_path {
        if let Some(stem) = path.file_stem().and_then(|s| s.to_str()) {
            return stem.to_string();
        }
    }
    without_revision.trim_end_matches('/').to_string()
}

#[cfg(test)]
#[path = "resolve_tests.rs"]
mod tests;
