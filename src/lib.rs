//! ferry: an OpenAI-compatible inference server that runs large language models on small GPUs.
//!
//! # Layout
//!
//! - [`config`]: one table of settings (flag, `FERRY_*` variable, config key, default, doc) driving
//!   two phases, as ripgrep does: the TOML file as text by key (no I/O), then its resolution
//!   against the environment and the flags, with the origin of every value.
//! - [`model`]: where a model comes from ([`model::source`]), what shape it has ([`model::spec`]),
//!   its tokenizer and chat template ([`model::tokenizer`]), its weights ([`model::weights`]) and the
//!   the per-layer forward loop every architecture shares ([`model::decoder`]) and each family's
//!   block, which borrows its layer's weights for one forward pass ([`model::llama`]).
//! - [`offload`]: the offload engine's placement side: model sizes from file headers
//!   ([`offload::sizing`]), the pure placement planner ([`offload::plan`]) and what `ferry plan`
//!   prints ([`offload::render`]).
//! - [`engine`]: the thread that owns loaded models and turns a validated request into a stream of
//!   generation events: sampling, stop strings, incremental detokenisation, logprobs.
//! - [`gpu`]: the CUDA side (devices, driver memory numbers, pinned host memory, the copy stream
//!   and its events, device slots), with a stand-in that says "built without CUDA" when the
//!   `cuda` feature is off.
//! - [`runtime`]: glue from a resolved configuration to running engine threads: device choice,
//!   adapters from the real model and tokenizer to the engine's traits, loading with progress.
//! - [`metrics`]: the Prometheus registry (`ferry_*`) shared by the HTTP layer, the engine and the
//!   offload engine, rendered by `GET /metrics`.
//! - [`cli`]: the command-line types (clap); the setting flags are generated from the settings
//!   table and become configuration overrides.
//! - [`server`]: the axum HTTP layer: OpenAI wire types, validation, handlers, SSE framing and the
//!   single place where errors become HTTP responses. It depends on the [`engine::Backend`] trait,
//!   never on a concrete model, so it is testable without one.

pub mod cli;
pub mod config;
pub mod engine;
pub mod gpu;
pub mod metrics;
pub mod model;
pub mod offload;
pub mod runtime;
pub mod server;
