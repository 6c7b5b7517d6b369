//! The resolved configuration: plain structs the rest of ferry reads. Each field is one setting
//! of [`super::settings::SETTINGS`], which holds its flag, variable, key, default and doc; the
//! `Default` impls are those built-in defaults.

use std::time::Duration;

use super::sampling::SamplingSettings;
use super::settings::{in_scope, Scope, Section};
use super::values::{
    ChatTemplateSource, CpuQmatmul, DeviceChoice, DtypeChoice, KvOffload, MemoryBudget,
    OffloadMode, PanelCacheChoice, ReasoningChoice, SpeculativeMethod, TierChoice,
};

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
    /// Bind address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Bearer token required on every request, if set.
    pub api_key: Option<String>,
    /// More accepted bearer tokens.
    pub api_keys: Vec<String>,
    /// A file of more accepted bearer tokens, one per line (read at start).
    pub api_keys_file: Option<String>,
    /// Requests allowed to wait.
    pub max_queue: usize,
    /// Largest request body in bytes.
    pub body_limit: usize,
    /// Grace period for in-flight requests at shutdown.
    pub shutdown_timeout: Duration,
    /// Most open connections.
    pub max_connections: usize,
    /// Longest time from a request head's first byte to its end.
    pub header_read_timeout: Duration,
    /// How long a connection may stay open without a request in flight.
    pub idle_timeout: Duration,
    /// Longest time a client may take to send a request body.
    pub body_read_timeout: Duration,
    /// Chat completions' `max_tokens` when the client gives none.
    pub default_max_tokens: usize,
    /// Largest `max_tokens` a request may ask for; unset = the context is the limit.
    pub max_tokens_limit: Option<usize>,
    /// Whether `GET /metrics` requires the API key; unset = whenever a key is set.
    pub metrics_auth: Option<bool>,
    /// `Host` names requests may carry; empty = the default rule (localhost names for a
    /// key-less server on a loopback address, any host otherwise).
    pub allowed_hosts: Vec<String>,
    /// Whether special tokens written inside chat messages are parsed as control tokens.
    pub parse_special_in_content: bool,
    /// Browser origins allowed cross-origin (CORS); empty = CORS off, `*` = any origin.
    pub cors_origins: Vec<String>,
    /// Whether `GET /` serves the status and chat page.
    pub web_ui: bool,
}

/// Resolved `[device]`.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceConfig {
    /// Compute device.
    pub kind: DeviceChoice,
    /// CPU device: copy-thread throttle in bytes/s (emulates a PCIe link); unset = unthrottled.
    pub link_bandwidth: Option<u64>,
    /// Kernels for quantized weights on the CPU.
    pub cpu_qmatmul: CpuQmatmul,
    /// Where k-quant, IQ4_XS, IQ4_NL, MXFP4, Q5_0 and Q5_1 panel layouts made at load are kept for
    /// the next load.
    pub panel_cache: PanelCacheChoice,
    /// Measure the tier calibration again instead of reading the cached one.
    pub recalibrate: bool,
    /// Cache a calibration only when its probes' spread is below this fraction.
    pub calibration_spread: f64,
}

/// Resolved `[models.offload]`.
#[derive(Debug, Clone, PartialEq)]
pub struct OffloadConfig {
    /// Placement mode.
    pub mode: OffloadMode,
    /// Device budget.
    pub gpu_memory: MemoryBudget,
    /// Layers in flight ahead of compute.
    pub prefetch: usize,
    /// Mode "model": idle time before leaving the device.
    pub keep_alive: Duration,
}

/// The tier settings of `[models.offload]` (`offload.tier` and the cost model's rates); a
/// field of [`ModelConfig`] of its own so that [`OffloadConfig`] literals stay unchanged.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TierConfig {
    /// Where offloaded units run: by cost, or forced.
    pub choice: TierChoice,
    /// Host compute rate of the CPU kernels in GFLOP/s; unset = measured at start-up.
    pub host_gflops: Option<f64>,
    /// Host memory read rate of the CPU kernels in bytes/s; unset = measured at start-up.
    pub host_bandwidth: Option<u64>,
    /// Compute device rate in GFLOP/s; unset = measured at start-up.
    pub device_gflops: Option<f64>,
    /// Place a mixture of experts expert by expert (`offload.experts`).
    pub experts: bool,
    /// The MoE layers that keep every expert on the host (`offload.host_expert_layers`): the
    /// first N, or a list of layer indices.
    pub host_expert_layers: super::expert_layers::HostExpertLayers,
    /// Count routed experts while serving and place the most routed first
    /// (`offload.expert_routes`).
    pub expert_routes: bool,
}

/// Resolved `[[models]]` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The id clients send as `model`.
    pub name: String,
    /// GGUF file, HF directory or hub id.
    pub source: String,
    /// Dense dtype.
    pub dtype: DtypeChoice,
    /// Context window cap; unset = the model's own, lowered to fit the budget
    /// (`offload::fit`).
    pub max_context: Option<usize>,
    /// Sequences decoded together; unset = 8, lowered to fit the budget (`offload::fit`).
    pub max_batch: Option<usize>,
    /// KV cache dtype; `Auto`: f16, bf16 for bf16 activations (`model::kv_cache::kv_dtype_for`).
    pub kv_dtype: DtypeChoice,
    /// Where the KV cache lives: the device, the host, or the host when the device cannot hold
    /// the context (`offload::fit`).
    pub kv_offload: KvOffload,
    /// Most prompt tokens one sequence feeds per engine step.
    pub prefill_chunk: usize,
    /// Most tokens one engine step computes, decodes and prompt chunks together; unset = 512,
    /// lowered when its workspace is what keeps the model from fitting (`runtime::planning`).
    pub max_step_tokens: Option<usize>,
    /// The time a shared engine step aims at (0: none).
    pub step_time: Duration,
    /// Whether requests sharing a prompt prefix reuse its KV state (`engine::prefix_cache`).
    pub prefix_cache: bool,
    /// Most tokens the prefix cache holds; unset = what the KV budget leaves room for.
    pub prefix_cache_tokens: Option<usize>,
    /// The chat template to use instead of the model's own; unset = the model's, else a
    /// built-in one for its family (`model::tokenizer::builtin_template`).
    pub chat_template: Option<ChatTemplateSource>,
    /// Whether chat replies of a reasoning template get their reasoning apart
    /// (`engine::reasoning`).
    pub reasoning_format: ReasoningChoice,
    /// Check every tensor's values at load (`model::verify`).
    pub verify_weights: bool,
    /// Sampling defaults for requests that name none; unset = the model's own, else
    /// llama.cpp's ([`super::sampling`]).
    pub sampling: SamplingSettings,
    /// Placement.
    pub offload: OffloadConfig,
    /// Where offloaded units run (`offload.tier`, `offload.host_gflops`, ...).
    pub tier: TierConfig,
    /// Speculative decoding (`[models.speculative]`).
    pub speculative: SpeculativeConfig,
}

/// Resolved `[models.speculative]`: how decode steps propose tokens for the model to verify.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SpeculativeConfig {
    /// Who proposes: nobody, a draft model or prompt lookup.
    pub method: SpeculativeMethod,
    /// The draft model's source (method `draft`).
    pub draft: Option<String>,
    /// Most tokens proposed per sequence and step.
    pub tokens: usize,
}

impl ServerConfig {
    /// Placeholder values, each overwritten by a setting's default.
    pub(super) fn blank() -> Self {
        Self {
            host: String::new(),
            port: 0,
            api_key: None,
            api_keys: Vec::new(),
            api_keys_file: None,
            max_queue: 0,
            body_limit: 0,
            shutdown_timeout: Duration::ZERO,
            max_connections: 0,
            header_read_timeout: Duration::ZERO,
            idle_timeout: Duration::ZERO,
            body_read_timeout: Duration::ZERO,
            default_max_tokens: 0,
            max_tokens_limit: None,
            metrics_auth: None,
            allowed_hosts: Vec::new(),
            parse_special_in_content: false,
            cors_origins: Vec::new(),
            web_ui: false,
        }
    }
}

impl DeviceConfig {
    /// Placeholder values, each overwritten by a setting's default.
    pub(super) fn blank() -> Self {
        Self {
            kind: DeviceChoice::Auto,
            link_bandwidth: None,
            cpu_qmatmul: CpuQmatmul::Auto,
            panel_cache: PanelCacheChoice::Auto,
            recalibrate: false,
            calibration_spread: 0.0,
        }
    }
}

impl ModelConfig {
    /// Placeholder values, each overwritten by a setting's default.
    pub(super) fn blank() -> Self {
        Self {
            name: String::new(),
            source: String::new(),
            dtype: DtypeChoice::Auto,
            max_context: None,
            max_batch: None,
            kv_dtype: DtypeChoice::Auto,
            kv_offload: KvOffload::Auto,
            prefill_chunk: 0,
            max_step_tokens: None,
            step_time: Duration::ZERO,
            prefix_cache: false,
            prefix_cache_tokens: None,
            chat_template: None,
            reasoning_format: ReasoningChoice::Auto,
            verify_weights: false,
            sampling: SamplingSettings::default(),
            offload: OffloadConfig {
                mode: OffloadMode::Auto,
                gpu_memory: MemoryBudget::FractionOfFree(1.0),
                prefetch: 0,
                keep_alive: Duration::ZERO,
            },
            tier: TierConfig::default(),
            speculative: SpeculativeConfig::default(),
        }
    }
}

/// `section` with the built-in default of every setting of `scope` applied.
fn with_defaults<T: Section>(mut section: T, scope: Scope) -> T {
    for setting in in_scope(scope) {
        setting.apply_default(&mut section);
    }
    section
}

/// The built-in defaults (the `default` texts of the settings table).
impl Default for ServerConfig {
    fn default() -> Self {
        with_defaults(Self::blank(), Scope::Server)
    }
}

/// The built-in defaults (the `default` texts of the settings table).
impl Default for DeviceConfig {
    fn default() -> Self {
        with_defaults(Self::blank(), Scope::Device)
    }
}

/// The built-in default model (`models/SmolLM2-135M-Instruct.Q4_1.gguf`, relative to the working
/// directory, served as `smollm2`) with every per-model default.
impl Default for ModelConfig {
    fn default() -> Self {
        with_defaults(Self::blank(), Scope::Model)
    }
}

/// The per-model offload defaults.
impl Default for OffloadConfig {
    fn default() -> Self {
        ModelConfig::default().offload
    }
}

/// Every built-in default: one server, the default device, the built-in default model.
impl Default for Config {
    fn default() -> Self {
        Self {
            server: ServerConfig::default(),
            device: DeviceConfig::default(),
            models: vec![ModelConfig::default()],
        }
    }
}
