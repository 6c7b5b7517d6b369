//! The Llama family's decoder layer (Llama, Qwen2, Mistral): pre-norm, `x + attn(rms(x))`,
//! then `x + mlp(rms(x))`, with grouped-query attention under RoPE (q/k/v biases when the
//! checkpoint has them, Mistral's sliding window through the step's mask) and a SwiGLU MLP.
//!
//! Reference: HF transformers' `modeling_llama.py` / `modeling_qwen2.py` /
//! `modeling_mistral.py`, cross-checked in `tests/suite/arch_crosscheck.rs` against
//! candle-transformers' `llama`, `qwen2`, `mistral` and `quantized_llama` on the same random
//! weights.

use candle_core::Tensor;

use super::decoder::attention::{self, AttentionDims};
use super::decoder::block::{projections, rms_norm, BatchRows, Block};
use super::error::Result;
use super::spec::ModelSpec;
use super::weights::{LayerWeights, Linear};

/// The decoder layer of the Llama family (every layer alike).
#[derive(Debug, Clone, Copy)]
pub struct LlamaBlock {
    dims: AttentionDims,
    eps: f32,
}

impl LlamaBlock {
    /// A block with `spec`'s head layout and norm epsilon.
    pub fn new(spec: &ModelSpec) -> Self {
        Self {
            dims: AttentionDims {
                n_heads: spec.n_heads,
                n_kv_heads: spec.n_kv_heads,
                head_dim: spec.head_dim,
            },
            eps: spec.rms_norm_eps as f32,
        }
    }
}

impl Block for LlamaBlock {
    fn forward(
        &self,
        x: &Tensor,
        w: &LayerWeights,
        seqs: &mut [BatchRows<'_, '_>],
    ) -> Result<Tensor> {
        let h = rms_norm(x, &w.attn_norm, self.eps)?;
        let [q, k, v] = projections(&[&w.q, &w.k, &w.v], &h)?;
        let y = attention::attend_each(&q, &k, &v, seqs, self.dims)?;
        let x = (x + w.o.forward(&y)?)?;
        let h = rms_norm(&x, &w.ffn_norm, self.eps)?;
        Ok((&x + swiglu(&h, &w.gate, &w.up, &w.down)?)?)
    }
}

/// The SwiGLU MLP `down(silu(gate(h)) * up(h))`; gate and up share one pass over `h`.
pub fn swiglu(h: &Tensor, gate: &Linear, up: &Linear, down: &Linear) -> Result<Tensor> {
    let [g, u] = projections(&[gate, up], h)?;
    down.forward(&(candle_nn::ops::silu(&g)? * u)?)
}
