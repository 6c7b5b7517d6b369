//! # ferry-model
//!
//! Layer 1 of ferry (docs/ARCHITECTURE.md, "Crates"): a model, from its files to the logits of a
//! batch. It depends on `ferry-config` (the dtype and kernel choices are config types it reads)
//! and `ferry-chat` (the chat message its templates render), and may know nothing of the
//! offload engine, the generation engine, devices beyond
//! candle's `Device`, or HTTP: where a layer's weights live is behind the [`decoder::LayerSource`]
//! trait, which the offload engine implements from above.
//!
//! A reuser goes source -> files -> checkpoint -> model: [`source::ModelSource::parse`] and
//! [`source::resolve`] (a GGUF file, an HF directory or a hub id -> [`source::ModelFiles`]),
//! [`checkpoint::Checkpoint::open`] (headers, spec and tensor table, parsed once), then
//! [`loader::load_model`] for every layer resident, and [`decoder::Model::forward_batch`]; the
//! tokenizer and chat template come from [`tokenizer::TextTokenizer`]. The GGUF reader
//! ([`header`]) and the CPU kernels over raw GGUF blocks ([`cpu_qmatmul`]) can be used alone.
//!
//! Models: where they come from, their shape, tokenizer, weights and per-layer blocks.
//!
//! - [`source`]: a GGUF file, an HF directory or a hub id -> [`source::ModelFiles`].
//! - [`header`]: weight-file headers parsed without reading tensors (ferry's GGUF reader, every
//!   ggml type id; safetensors shards).
//! - [`checkpoint`]: [`checkpoint::Checkpoint`], a model's files opened once per load: headers,
//!   spec and tensor table, taken by the sizing, the tokenizer and the loader alike.
//! - [`spec`]: [`spec::ModelSpec`], the architecture and dimensions (config.json or GGUF metadata).
//! - [`tensors`]: the one table of tensor names (GGUF and Hugging Face) and
//!   [`tensors::TensorTable`], every tensor a model uses, checked.
//! - [`tokenizer`]: tokenizer.json or GGUF vocab -> [`tokenizer::TextTokenizer`], and chat templates.
//! - [`weights`]: [`weights::LayerWeights`] and the fixed parts, dense or quantized.
//! - [`loader`]: reads weights from GGUF or safetensors into those types.
//! - [`cpu_qmatmul`]: a SIMD CPU matmul over raw GGUF Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 and
//!   Q2_K..Q6_K blocks.
//! - [`decoder`]: [`decoder::Model`], the per-layer forward loop every architecture shares, the
//!   [`decoder::Block`] seam a family plugs into, and the [`decoder::LayerSource`] its weights
//!   come through; attention and RoPE.
//! - [`llama`]: the Llama family's block (Llama, Qwen2, Mistral); [`qwen3`], [`gemma`]
//!   (Gemma 2 and 3), [`phi3`] and [`deepseek2`] (DeepSeek's latent attention): the other
//!   families' blocks; [`moe`]: the routed-experts MLP of Qwen3-MoE (in [`qwen3`]'s block) and
//!   Mixtral (in [`llama`]'s); [`qwen35`]: Qwen3.5's hybrid layers (gated attention, or a Gated
//!   DeltaNet whose recurrence is [`gated_delta`]).
//! - [`kv_cache`]: the per-sequence key/value cache (its sliding-window layers keep only their
//!   window; a recurrent layer keeps a [`recurrent_state`] instead); [`kv_format`]: what it stores per position (a dense dtype, or q8_0 / q4_0 blocks
//!   behind a Hadamard rotation).
//! - [`pooling`]: embeddings: the pooling a model asks for and the pooler over its final
//!   hidden states ([`decoder::Model::forward_hidden`]), L2-normalised.
//! - [`verify`]: `verify_weights`, every tensor's values checked finite before a load.
//! - `step_threads`: where a decode step's short parallel loops (one-row matmuls, attention)
//!   run: candle's spinning barrier pool instead of rayon's.

pub mod checkpoint;
pub mod cpu_qmatmul;
pub mod decoder;
mod deepseek2;
mod dense_rows;
mod error;
mod gated_delta;
mod gemma;
pub mod generation_defaults;
pub mod header;
mod hub;
mod hub_gguf;
mod kv_buffer;
pub mod kv_cache;
pub mod kv_format;
mod llama;
pub mod loader;
mod moe;
mod phi3;
pub mod pooling;
mod qwen3;
mod qwen35;
pub mod recurrent_state;
pub mod source;
pub mod spec;
mod step_threads;
pub mod tensors;
pub mod tokenizer;
pub mod verify;
pub mod weights;

pub use error::{ModelError, Result};
