//! Qwen3's (dense and MoE) decoder layer: the Llama layer with an RMSNorm over each query and
//! key head before RoPE, and no q/k/v biases; [`LlamaBlock`] computes it.
//!
//! Reference: HF transformers' `modeling_qwen3.py`, cross-checked in
//! `tests/suite/arch_crosscheck.rs` against candle-transformers' `qwen3` and
//! `quantized_qwen3` on the same random weights.

use super::llama::LlamaBlock;
use super::spec::ModelSpec;

/// Decoder layer `index` of a Qwen3 model with `spec` (every layer alike).
pub fn block(spec: &ModelSpec, index: usize) -> LlamaBlock {
    LlamaBlock::with_qk_norm(spec, index, true)
}
