//! Qwen3's (dense and MoE) decoder layer: the Llama layer with an RMSNorm over each query and
//! key head before RoPE, and no q/k/v biases; [`LlamaBlock`] computes it.
//!
//! Reference: HF transformers' `modeling_qwen3.py`, cross-checked in
//! `tests/suite/arch_crosscheck.rs` against candle-transformers' `qwen3` and
//! `quantized_qwen3` on the same random weights.

use candle_core::Tensor;

use super::decoder::block::{BatchRows, Block};
use super::error::Result;
use super::llama::LlamaBlock;
use super::spec::ModelSpec;
use super::weights::LayerWeights;

/// The decoder layer of Qwen3 (every layer alike).
#[derive(Debug, Clone, Copy)]
pub struct Qwen3Block(LlamaBlock);

impl Qwen3Block {
    /// Layer `index` of a model with `spec`.
    pub fn new(spec: &ModelSpec, index: usize) -> Self {
        Self(LlamaBlock::with_qk_norm(spec, index, true))
    }
}

impl Block for Qwen3Block {
    fn forward(
        &self,
        x: &Tensor,
        w: &LayerWeights,
        seqs: &mut [BatchRows<'_, '_>],
    ) -> Result<Tensor> {
        self.0.forward(x, w, seqs)
    }
}
