//! Runtime glue: turns a resolved [`ferry_config::Config`] into running engine threads.
//!
//! - [`device`]: the configured device choice -> a candle `Device`.
//! - [`adapters`]: the real model and tokenizer behind the engine's `LanguageModel` and
//!   `TextCodec` traits.
//! - [`draft`], [`draft_model`]: the draft model of speculative method `draft`: its plan
//!   (placed first), its load with the vocabulary check, and its greedy proposals.
//! - [`load`]: source -> files -> weights + tokenizer, with a progress bar or log lines.
//! - [`load_report`]: the "model loaded" line (weight types and kernels, chat template, tool-call
//!   format, offload tier).
//! - [`telemetry`]: publishes offload accounting and residency into the Prometheus metrics.
//! - [`planning`]: `ferry plan`: file headers + budget -> placement plan, no weights read.
//! - [`swap`]: the server's residency manager for mode `model`: shared budget and location probe.
//! - [`device_plan`]: every model's plan on the one device, as `ferry plan` prints it and
//!   `serve` executes it.
//! - [`expert_routes`]: the experts' route counts kept across runs: read when planning, written
//!   by `serve`.
//! - [`tiers`]: the tier cost model of a planned model (start-up calibration, decisions).
//! - [`serve`]: `ferry serve` as a library call: configuration + listener + shutdown signal ->
//!   engine, loading threads, metrics publisher and HTTP server, until stopped.

pub mod adapters;
pub mod device;
pub mod device_plan;
pub mod draft;
pub mod draft_model;
pub mod error;
pub mod expert_routes;
pub mod load;
pub mod load_report;
pub mod placement;
pub mod planning;
pub mod serve;
pub mod swap;
pub mod telemetry;
pub mod tiers;

pub use error::RuntimeError;
