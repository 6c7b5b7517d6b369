//! ferry: an OpenAI-compatible inference server that runs large language models on small GPUs.
//!
//! This package is the top of the workspace: the runtime that builds engines from a
//! configuration, the command line and the `ferry` binary. Every layer below it is a crate of its
//! own, re-exported here under its layer's name (so `ferry::model::spec::ModelSpec` is
//! `ferry_model::spec::ModelSpec`); each crate depends on the layers below it and nothing else,
//! and Cargo enforces it (docs/ARCHITECTURE.md, "Crates").
//!
//! # Layout
//!
//! - [`config`] (`ferry-config`): one table of settings (flag, `FERRY_*` variable, config key,
//!   default, doc) driving two phases, as ripgrep does: the TOML file as text by key (no I/O),
//!   then its resolution against the environment and the flags, with the origin of every value.
//! - [`gpu`] (`ferry-gpu`): the CUDA side (devices, driver memory numbers, pinned host memory,
//!   the copy stream and its events), with a stand-in that says "built without CUDA" when the
//!   `cuda` feature is off.
//! - [`metrics`] (`ferry-metrics`): the Prometheus registry (`ferry_*`) shared by the HTTP layer,
//!   the engine and the offload engine, rendered by `GET /metrics`; one request's tracking and
//!   the log sink.
//! - [`chat`] (`ferry-chat`): the chat message the tokenizer renders and the engine's requests
//!   carry, so that neither of the two depends on the other.
//! - [`model`] (`ferry-model`): where a model comes from, what shape it has, its tokenizer and
//!   chat template, its weights, the CPU quantized kernels, the per-layer forward loop every
//!   architecture shares and each family's block.
//! - [`offload`] (`ferry-offload`): the offload engine: model sizes from file headers, the pure
//!   placement planner, host slabs, the streamed slot ring, expert pools and whole-model swaps.
//! - [`engine`] (`ferry-engine`): the thread that owns loaded models and turns a validated
//!   request into a stream of generation events: batching, sampling, stop strings, incremental
//!   detokenisation, logprobs, grammars and tool calls.
//! - [`server`] (`ferry-server`): the axum HTTP layer: OpenAI wire types, validation, handlers,
//!   SSE framing and the single place where errors become HTTP responses. It depends on the
//!   [`engine::Backend`] trait, never on a concrete model, so it is testable without one.
//! - [`runtime`] (this package): glue from a resolved configuration to running engine threads:
//!   device choice, adapters from the real model and tokenizer to the engine's traits, loading
//!   with progress, `ferry plan`, and `ferry serve` as a library call.
//! - [`cli`] (this package): the command-line types (clap); the setting flags are generated from
//!   the settings table and become configuration overrides.

pub mod cli;
pub mod runtime;

pub use ferry_chat as chat;
pub use ferry_config as config;
pub use ferry_engine as engine;
pub use ferry_gpu as gpu;
pub use ferry_metrics as metrics;
pub use ferry_model as model;
pub use ferry_offload as offload;
pub use ferry_server as server;
