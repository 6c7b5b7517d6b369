//! Models: where they come from, their shape, tokenizer, weights and per-layer blocks.
//!
//! - [`source`]: a GGUF file, an HF directory or a hub id -> [`source::ModelFiles`].
//! - [`spec`]: [`spec::ModelSpec`], the architecture and dimensions (config.json or GGUF metadata).
//! - [`tokenizer`]: tokenizer.json or GGUF vocab -> [`tokenizer::TextTokenizer`], and chat templates.
//! - [`weights`]: [`weights::LayerWeights`] and the fixed parts, dense or quantized.
//! - [`loader`]: reads weights from GGUF or safetensors into those types.
//! - [`cpu_qmatmul`]: a SIMD CPU matmul over raw GGUF Q4_0 / Q4_1 / Q8_0 blocks.
//! - [`llama`]: the Llama-family blocks (Llama, Qwen2, Mistral) whose forward borrows its weights.
//! - [`kv_cache`]: the per-sequence key/value cache.

pub mod cpu_qmatmul;
pub mod error;
pub mod hub;
pub mod kv_cache;
pub mod llama;
pub mod loader;
pub mod source;
pub mod spec;
pub mod tokenizer;
pub mod weights;

pub use error::{ModelError, Result};
