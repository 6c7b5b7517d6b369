//! Configuration in two phases, as ripgrep does it:
//!
//! 1. [`raw`]: serde types that mirror the TOML file; parsing does no I/O and checks only syntax.
//! 2. [`resolve`]: merges built-in defaults, the file, `FERRY_*` environment variables and flags
//!    (in rising precedence) into a validated [`Config`]. Values that need the machine (free device
//!    memory for `gpu_memory = "90%"`) stay symbolic here and are resolved by the device layer.
//!
//! [`units`] parses the human-friendly sizes, durations and bandwidths the file and flags accept.

pub mod error;
pub mod raw;
pub mod resolve;
pub mod units;

pub use error::ConfigError;
pub use resolve::{
    Config, DeviceChoice, DeviceConfig, DtypeChoice, MemoryBudget, ModelConfig, OffloadConfig,
    OffloadMode, Overrides, ServerConfig,
};
