//! Phase two of configuration: built-in defaults < config file < `FERRY_*` environment < flags.
//! Pure: the environment arrives as an [`Overrides`] value, so every rule is unit-tested.

use std::time::Duration;

use super::raw::{RawConfig, RawModel};
use super::units::{parse_bandwidth, parse_bytes, parse_duration, parse_percent};
use super::ConfigError;

/// The model served when neither the config nor `--model` names one: the file
/// `scripts/fetch-model.sh` fetches.
pub const DEFAULT_MODEL_SOURCE: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
/// The id of the default model.
pub const DEFAULT_MODEL_NAME: &str = "smollm2";

/// A fully resolved configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// HTTP settings.
    pub server: ServerConfig,
    /// Compute device.
    pub device: DeviceConfig,
    /// Served models (at least one).
    pub models: Vec<ModelConfig>,
}

/// Resolved `[server]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Bind address; default 127.0.0.1 (never all interfaces unless asked).
    pub host: String,
    /// TCP port; default 8080.
    pub port: u16,
    /// Bearer token required on every request, if set.
    pub api_key: Option<String>,
    /// Requests allowed to wait; default 64.
    pub max_queue: usize,
    /// Largest request body in bytes; default 16 MiB.
    pub body_limit: usize,
    /// Grace period for in-flight requests at shutdown; default 30 s.
    pub shutdown_timeout: Duration,
}

/// Which compute device to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceChoice {
    /// CUDA device 0 when built with CUDA and one is present, else the CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// CUDA device N.
    Cuda(usize),
}

/// Resolved `[device]`.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceConfig {
    /// Compute device; default auto.
    pub kind: DeviceChoice,
    /// CPU device: copy-thread throttle in bytes/s (emulates a PCIe link); default unthrottled.
    pub link_bandwidth: Option<u64>,
}

/// Dense weight dtype: the model loader's own choice type, so the two layers cannot disagree.
pub use crate::model::loader::DTypeChoice as DtypeChoice;

/// Where weights live (DESIGN.md 4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffloadMode {
    /// Everything resident on the compute device.
    None,
    /// Layers in order until the budget, the rest streamed.
    Auto,
    /// Every decoder layer streamed through a small slot ring.
    Sequential,
    /// The whole model moves between host and device on demand.
    Model,
}

/// The device memory budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemoryBudget {
    /// A fixed number of bytes.
    Bytes(u64),
    /// A share (0, 1] of the device's free memory at start.
    FractionOfFree(f64),
}

/// Resolved `[models.offload]`.
#[derive(Debug, Clone, PartialEq)]
pub struct OffloadConfig {
    /// Placement mode; default auto.
    pub mode: OffloadMode,
    /// Device budget; default 90% of free memory.
    pub gpu_memory: MemoryBudget,
    /// Layers in flight ahead of compute; default 2.
    pub prefetch: usize,
    /// Mode "model": idle time before leaving the device; default 5 minutes.
    pub keep_alive: Duration,
}

/// Resolved `[[models]]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The id clients send as `model`.
    pub name: String,
    /// GGUF file, HF directory or hub id.
    pub source: String,
    /// Dense dtype; default auto.
    pub dtype: DtypeChoice,
    /// Context window cap; default the model's own.
    pub max_context: Option<usize>,
    /// Sequences decoded together; default 8.
    pub max_batch: usize,
    /// Placement.
    pub offload: OffloadConfig,
}

/// Values from the environment or the command line, as text, each tagged with where it came from
/// so errors can name the flag or variable.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overrides {
    /// `(origin, value)` pairs; `origin` is e.g. `--port` or `FERRY_PORT`.
    pub host: Option<(String, String)>,
    /// Port.
    pub port: Option<(String, String)>,
    /// Bearer token.
    pub api_key: Option<(String, String)>,
    /// Queue length.
    pub max_queue: Option<(String, String)>,
    /// Model source: replaces the configured models with this one.
    pub model: Option<(String, String)>,
    /// Served name for `model`.
    pub served_name: Option<(String, String)>,
    /// Dense dtype, for every model.
    pub dtype: Option<(String, String)>,
    /// Device kind.
    pub device: Option<(String, String)>,
    /// Batch size, for every model.
    pub max_batch: Option<(String, String)>,
    /// Context cap, for every model.
    pub max_context: Option<(String, String)>,
    /// Offload mode, for every model.
    pub offload: Option<(String, String)>,
    /// Device budget, for every model.
    pub gpu_memory: Option<(String, String)>,
    /// Prefetch depth, for every model.
    pub prefetch: Option<(String, String)>,
    /// CPU link throttle.
    pub link_bandwidth: Option<(String, String)>,
}

/// The environment variable behind each override, for [`Overrides::from_env`].
const ENV_NAMES: [&str; 14] = [
    "FERRY_HOST",
    "FERRY_PORT",
    "FERRY_API_KEY",
    "FERRY_MAX_QUEUE",
    "FERRY_MODEL",
    "FERRY_SERVED_NAME",
    "FERRY_DTYPE",
    "FERRY_DEVICE",
    "FERRY_MAX_BATCH",
    "FERRY_MAX_CONTEXT",
    "FERRY_OFFLOAD",
    "FERRY_GPU_MEMORY",
    "FERRY_PREFETCH",
    "FERRY_LINK_BANDWIDTH",
];

impl Overrides {
    /// Reads `FERRY_*` variables through `lookup` (pass `|k| std::env::var(k).ok()`).
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let mut values = ENV_NAMES
            .iter()
            .map(|name| lookup(name).map(|value| (name.to_string(), value)));
        let mut next = || values.next().flatten();
        Self {
            host: next(),
            port: next(),
            api_key: next(),
            max_queue: next(),
            model: next(),
            served_name: next(),
            dtype: next(),
            device: next(),
            max_batch: next(),
            max_context: next(),
            offload: next(),
            gpu_memory: next(),
            prefetch: next(),
            link_bandwidth: next(),
        }
    }
}

impl Config {
    /// Resolves a parsed file with environment and flag overrides (flags win).
    pub fn resolve(
        raw: &RawConfig,
        env: &Overrides,
        flags: &Overrides,
    ) -> Result<Self, ConfigError> {
        let layers = [env, flags];
        let pick = |get: fn(&Overrides) -> &Option<(String, String)>| {
            layers.iter().rev().find_map(|layer| get(layer).clone())
        };

        let server = resolve_server(raw, &pick)?;
        let device = resolve_device(raw, &pick)?;

        let mut raw_models = raw.models.clone();
        if let Some((_, source)) = pick(|o| &o.model) {
            let template = raw_models.first().cloned().unwrap_or_default();
            let name = pick(|o| &o.served_name)
                .map(|(_, name)| name)
                .unwrap_or_else(|| derive_name(&source));
            raw_models = vec![RawModel {
                name: Some(name),
                source: Some(source),
                ..template
            }];
        } else if raw_models.is_empty() {
            raw_models.push(RawModel {
                name: Some(DEFAULT_MODEL_NAME.to_string()),
                source: Some(DEFAULT_MODEL_SOURCE.to_string()),
                ..RawModel::default()
            });
        }

        let mut models = Vec::with_capacity(raw_models.len());
        for (index, raw_model) in raw_models.iter().enumerate() {
            models.push(resolve_model(index, raw_model, &pick)?);
        }
        for (i, model) in models.iter().enumerate() {
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
        Ok(Self {
            server,
            device,
            models,
        })
    }
}

type Pick<'a> =
    dyn Fn(fn(&Overrides) -> &Option<(String, String)>) -> Option<(String, String)> + 'a;

fn resolve_server(raw: &RawConfig, pick: &Pick) -> Result<ServerConfig, ConfigError> {
    let file = &raw.server;
    let host = pick(|o| &o.host)
        .map(|(_, v)| v)
        .or_else(|| file.host.clone())
        .unwrap_or_else(|| "127.0.0.1".to_string());
    let port = match pick(|o| &o.port) {
        Some((key, value)) => parse_number(&key, &value)?,
        None => file.port.unwrap_or(8080),
    };
    let api_key = pick(|o| &o.api_key)
        .map(|(_, v)| v)
        .or_else(|| file.api_key.clone())
        .filter(|key| !key.is_empty());
    let max_queue = match pick(|o| &o.max_queue) {
        Some((key, value)) => parse_number(&key, &value)?,
        None => file.max_queue.unwrap_or(64),
    };
    let body_limit = match &file.body_limit {
        Some(text) => {
            parse_bytes(text).map_err(|m| ConfigError::invalid("server.body_limit", m))?
        }
        None => 16 * 1024 * 1024,
    };
    if body_limit == 0 {
        return Err(ConfigError::invalid(
            "server.body_limit",
            "must be positive",
        ));
    }
    let shutdown_timeout = match &file.shutdown_timeout {
        Some(text) => {
            parse_duration(text).map_err(|m| ConfigError::invalid("server.shutdown_timeout", m))?
        }
        None => Duration::from_secs(30),
    };
    Ok(ServerConfig {
        host,
        port,
        api_key,
        max_queue,
        body_limit: usize::try_from(body_limit)
            .map_err(|_| ConfigError::invalid("server.body_limit", "too large"))?,
        shutdown_timeout,
    })
}

fn resolve_device(raw: &RawConfig, pick: &Pick) -> Result<DeviceConfig, ConfigError> {
    let (key, kind) = pick(|o| &o.device)
        .or_else(|| {
            raw.device
                .kind
                .clone()
                .map(|v| ("device.kind".to_string(), v))
        })
        .unwrap_or_else(|| ("device.kind".to_string(), "auto".to_string()));
    let kind = parse_device(&kind).map_err(|m| ConfigError::invalid(key, m))?;
    let link_bandwidth = match pick(|o| &o.link_bandwidth).or_else(|| {
        raw.device
            .link_bandwidth
            .clone()
            .map(|v| ("device.link_bandwidth".to_string(), v))
    }) {
        Some((key, text)) => {
            Some(parse_bandwidth(&text).map_err(|m| ConfigError::invalid(key, m))?)
        }
        None => None,
    };
    Ok(DeviceConfig {
        kind,
        link_bandwidth,
    })
}

fn resolve_model(index: usize, raw: &RawModel, pick: &Pick) -> Result<ModelConfig, ConfigError> {
    let at = |field: &str| format!("models[{index}].{field}");
    let source = raw
        .source
        .clone()
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| ConfigError::invalid(at("source"), "every model needs a source"))?;
    let name = raw
        .name
        .clone()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| derive_name(&source));

    let text_or = |over: Option<(String, String)>, file: &Option<String>, field: &str| {
        over.or_else(|| file.clone().map(|v| (at(field), v)))
    };
    let dtype = match text_or(pick(|o| &o.dtype), &raw.dtype, "dtype") {
        Some((key, text)) => parse_dtype(&text).map_err(|m| ConfigError::invalid(key, m))?,
        None => DtypeChoice::Auto,
    };
    let max_context = match pick(|o| &o.max_context) {
        Some((key, value)) => Some(parse_number::<usize>(&key, &value)?),
        None => raw.max_context,
    };
    if max_context == Some(0) {
        return Err(ConfigError::invalid(
            at("max_context"),
            "must be at least 1",
        ));
    }
    let max_batch = match pick(|o| &o.max_batch) {
        Some((key, value)) => parse_number::<usize>(&key, &value)?,
        None => raw.max_batch.unwrap_or(8),
    };
    if max_batch == 0 {
        return Err(ConfigError::invalid(at("max_batch"), "must be at least 1"));
    }

    let offload = &raw.offload;
    let mode = match text_or(pick(|o| &o.offload), &offload.mode, "offload.mode") {
        Some((key, text)) => parse_mode(&text).map_err(|m| ConfigError::invalid(key, m))?,
        None => OffloadMode::Auto,
    };
    let gpu_memory = match text_or(
        pick(|o| &o.gpu_memory),
        &offload.gpu_memory,
        "offload.gpu_memory",
    ) {
        Some((key, text)) => parse_budget(&text).map_err(|m| ConfigError::invalid(key, m))?,
        None => MemoryBudget::FractionOfFree(0.9),
    };
    let prefetch = match pick(|o| &o.prefetch) {
        Some((key, value)) => parse_number::<usize>(&key, &value)?,
        None => offload.prefetch.unwrap_or(2),
    };
    let keep_alive = match &offload.keep_alive {
        Some(text) => {
            parse_duration(text).map_err(|m| ConfigError::invalid(at("offload.keep_alive"), m))?
        }
        None => Duration::from_secs(300),
    };
    Ok(ModelConfig {
        name,
        source,
        dtype,
        max_context,
        max_batch,
        offload: OffloadConfig {
            mode,
            gpu_memory,
            prefetch,
            keep_alive,
        },
    })
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

fn parse_number<T: std::str::FromStr>(key: &str, value: &str) -> Result<T, ConfigError> {
    value
        .trim()
        .parse()
        .map_err(|_| ConfigError::invalid(key, format!("`{value}` is not a valid number")))
}

/// Parses `auto`, `cpu`, `cuda` or `cuda:N`.
pub fn parse_device(text: &str) -> Result<DeviceChoice, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "auto" => Ok(DeviceChoice::Auto),
        "cpu" => Ok(DeviceChoice::Cpu),
        "cuda" | "gpu" => Ok(DeviceChoice::Cuda(0)),
        other => other
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(DeviceChoice::Cuda)
            .ok_or_else(|| format!("`{text}` is not a device (use auto, cpu or cuda:N)")),
    }
}

fn parse_dtype(text: &str) -> Result<DtypeChoice, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "auto" => Ok(DtypeChoice::Auto),
        "f32" | "float32" => Ok(DtypeChoice::F32),
        "f16" | "float16" | "half" => Ok(DtypeChoice::F16),
        "bf16" | "bfloat16" => Ok(DtypeChoice::BF16),
        _ => Err(format!(
            "`{text}` is not a dtype (use auto, f32, f16 or bf16)"
        )),
    }
}

fn parse_mode(text: &str) -> Result<OffloadMode, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "none" => Ok(OffloadMode::None),
        "auto" => Ok(OffloadMode::Auto),
        "sequential" => Ok(OffloadMode::Sequential),
        "model" => Ok(OffloadMode::Model),
        _ => Err(format!(
            "`{text}` is not an offload mode (use none, auto, sequential or model)"
        )),
    }
}

fn parse_budget(text: &str) -> Result<MemoryBudget, String> {
    if text.trim().ends_with('%') {
        parse_percent(text).map(MemoryBudget::FractionOfFree)
    } else {
        parse_bytes(text).map(MemoryBudget::Bytes)
    }
}

#[cfg(test)]
#[path = "resolve_tests.rs"]
mod tests;
