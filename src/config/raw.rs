//! The config file as written: every field optional, unknown keys rejected. No I/O, no defaults.

use serde::Deserialize;

/// A whole config file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// `[server]`.
    #[serde(default)]
    pub server: RawServer,
    /// `[device]`.
    #[serde(default)]
    pub device: RawDevice,
    /// `[[models]]`, one table per served model.
    #[serde(default)]
    pub models: Vec<RawModel>,
}

/// `[server]`: where and how the HTTP API listens.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    /// Bind address.
    pub host: Option<String>,
    /// TCP port.
    pub port: Option<u16>,
    /// Optional bearer token every request must carry.
    pub api_key: Option<String>,
    /// Requests allowed to wait for a batch slot.
    pub max_queue: Option<usize>,
    /// Largest accepted request body, e.g. "16MiB".
    pub body_limit: Option<String>,
    /// How long shutdown waits for in-flight requests, e.g. "30s".
    pub shutdown_timeout: Option<String>,
}

/// `[device]`: the compute device.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDevice {
    /// "auto", "cpu" or "cuda:N".
    pub kind: Option<String>,
    /// CPU device only: throttle the copy thread to this rate, e.g. "16GB/s".
    pub link_bandwidth: Option<String>,
}

/// One `[[models]]` table.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    /// The id clients send as `model`.
    pub name: Option<String>,
    /// GGUF file, HF directory or hub id `org/name[@revision]`.
    pub source: Option<String>,
    /// "auto", "f32", "f16" or "bf16".
    pub dtype: Option<String>,
    /// Context window to serve (at most the model's own).
    pub max_context: Option<usize>,
    /// Sequences decoded together.
    pub max_batch: Option<usize>,
    /// `[models.offload]`.
    #[serde(default)]
    pub offload: RawOffload,
}

/// `[models.offload]`: how weights are placed between device and host.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOffload {
    /// "none", "auto", "sequential" or "model".
    pub mode: Option<String>,
    /// Budget on the compute device: bytes ("6GiB") or a share of free memory ("90%").
    pub gpu_memory: Option<String>,
    /// Layers in flight ahead of compute.
    pub prefetch: Option<usize>,
    /// Mode "model": idle time before the model leaves the device, e.g. "5m".
    pub keep_alive: Option<String>,
}

impl RawConfig {
    /// Parses TOML text. Unknown keys are errors so typos do not pass silently.
    pub fn from_toml(text: &str) -> Result<Self, toml::de::Error> {
        toml::from_str(text)
    }
}
