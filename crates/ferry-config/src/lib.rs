//! # ferry-config
//!
//! The bottom layer of ferry (docs/ARCHITECTURE.md, "Crates"): every setting of the server, and
//! how a configuration file, `FERRY_*` variables and command-line flags become one validated
//! [`Config`]. It depends on no other ferry crate and may know nothing of models, devices, the
//! engine or HTTP: what the layers above need from a setting is a plain value type defined here
//! ([`DtypeChoice`] for the model, [`TierChoice`] for the offload engine), and values that need
//! the machine (free device memory for `gpu_memory = "90%"`) stay symbolic until the runtime
//! resolves them.
//!
//! A reuser starts from [`load`] (a config file path and the flag [`Overrides`] -> a
//! [`Resolved`]: the [`Config`] and the [`Origins`] of every value), or from [`Config::resolve`]
//! with a parsed file and overrides of its own (no I/O at all), and adds a setting with one
//! entry in [`settings::SETTINGS`].
//!
//! Configuration in two phases, as ripgrep does it, driven by one table of settings:
//!
//! - [`settings`]: [`settings::SETTINGS`], the one definition of every setting (flag, `FERRY_*`
//!   variable, config key, default, doc, and the field it fills). Flags, variables, file keys,
//!   `ferry config` and the README's table all come from it.
//! - [`raw`]: phase one, the TOML file as text by key, checked against the table (no I/O).
//! - [`resolve`]: phase two, built-in defaults < file < `FERRY_*` environment < flags into a
//!   validated [`Config`], with the origin of every value. Values that need the machine (free
//!   device memory for `gpu_memory = "90%"`) stay symbolic and are resolved by the device layer.
//! - [`types`]: the resolved structs; [`values`]: their value types and how each is parsed and
//!   shown ([`expert_layers`]: `offload.host_expert_layers`); [`units`]: sizes, durations and
//!   bandwidths.
//! - [`load`]: the I/O edge (file, process environment, warnings about unknown `FERRY_*`
//!   variables); [`show`]: `ferry config`'s listing; [`env`]: the unknown-variable check;
//!   [`cache_folder`]: the user's cache folder every cache of the layers above lives in.

pub mod cache_folder;
mod env;
mod error;
pub mod expert_layers;
mod load;
pub mod raw;
mod resolve;
pub mod sampling;
pub mod settings;
pub mod show;
mod types;
mod units;
pub mod values;

pub use cache_folder::user_cache_folder;
pub use error::ConfigError;
pub use expert_layers::HostExpertLayers;
pub use load::load;
pub use resolve::{Origin, Origins, Overrides, Resolved};
pub use sampling::SamplingSettings;
pub use types::{Config, DeviceConfig, ModelConfig, OffloadConfig, ServerConfig};
pub use types::{SpeculativeConfig, TierConfig};
pub use values::TierChoice;
pub use values::{
    ChatTemplateSource, CpuQmatmul, DeviceChoice, DtypeChoice, KvOffload, MemoryBudget,
    OffloadMode, PanelCacheChoice, QuantType, ReasoningChoice, SpeculativeMethod,
};
