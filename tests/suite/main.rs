//! ferry's integration tests, one binary with a module per subject (one link instead of one per
//! file). Run one subject with `cargo test --test suite http_api::`.
//!
//! Shared helpers: [`common`] (the deterministic HTTP test backend, no model), [`real_model`]
//! (the default SmolLM2 GGUF through the real loader and engine) and [`tiny`] (seeded tiny random
//! checkpoints). The GPU checks are a separate binary (tests/gpu.rs, `--features cuda`).

mod common;
mod fixtures;
mod real_model;
mod serve_process;
mod tiny;

mod arch_crosscheck;
mod arch_families;
mod arch_llamacpp;
mod batch_forward;
mod builtin_templates;
mod bundle_launcher;
mod calibration;
mod chat_templates;
mod cli;
mod dense_tiers;
mod embeddings_real;
mod expert_offload;
mod expert_prefill;
mod expert_routes;
mod fit;
mod gguf_sources;
mod gpu_check_dry;
mod hf_model_serving;
mod http_api;
mod hybrid_serving;
mod kv_offload;
mod kv_perplexity;
mod layering;
mod lifecycle;
mod log_failures;
mod memory_bound;
mod model_real;
mod observability;
mod offload_model_mode;
mod offload_modes;
mod panel_cache;
mod plan_agreement;
mod plan_serve;
mod prefix_cache;
mod quant_llamacpp;
mod quantize_on_load;
mod readme_examples;
mod real_model_api;
mod real_model_http;
mod reasoning;
mod responses_api;
mod role_injection;
mod schema_limits;
mod serving;
mod speculative;
mod status_page;
mod structured_outputs;
mod tiers;
mod tokenize_parity;
mod tokenizer;
mod tokenizer_llamacpp;
mod tool_calls;
mod weight_integrity;
mod window_cache;
