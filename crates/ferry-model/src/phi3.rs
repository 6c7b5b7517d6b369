//! Phi-3's decoder layer: the Llama layer with fused projections. One `qkv` matrix gives the
//! queries, keys and values (rows `[q | k | v]`) and one `gate_up` matrix the SwiGLU's gate
//! and up halves (rows `[gate | up]`); the block splits their outputs, so the weights stay one
//! tensor each in the file, the host slabs and the device slots.
//!
//! Reference: HF transformers' `modeling_phi3.py`, cross-checked in
//! `tests/suite/arch_crosscheck.rs` against candle-transformers' `phi3` on the same random
//! weights.

use candle_core::{Tensor, D};

use super::decoder::attention;
use super::decoder::block::{rms_norm, BatchRows, Block, LayerDims};
use super::error::Result;
use super::spec::ModelSpec;
use super::tensors::Part;
use super::weights::LayerWeights;

/// The decoder layer of Phi-3 (every layer alike).
#[derive(Debug, Clone, Copy)]
pub struct Phi3Block {
    layer: LayerDims,
    intermediate: usize,
}

impl Phi3Block {
    /// Layer `index` of a model with `spec`.
    pub fn new(spec: &ModelSpec, index: usize) -> Self {
        Self {
            layer: LayerDims::of(spec, index),
            intermediate: spec.intermediate_size,
        }
    }
}

impl Block for Phi3Block {
    fn forward(
        &self,
        x: &Tensor,
        w: &LayerWeights,
        seqs: &mut [BatchRows<'_, '_>],
    ) -> Result<Tensor> {
        let h = rms_norm(x, w.vector(Part::AttnNorm)?, self.layer.eps)?;
        let qkv = w.linear(Part::Qkv)?.forward(&h)?;
        let q_len = self.layer.attn.n_heads * self.layer.attn.head_dim;
        let kv_len = self.layer.attn.n_kv_heads * self.layer.attn.head_dim;
        let q = qkv.narrow(D::Minus1, 0, q_len)?;
        let k = qkv.narrow(D::Minus1, q_len, kv_len)?;
        let v = qkv.narrow(D::Minus1, q_len + kv_len, kv_len)?;
        let y = attention::attend_each(&q, &k, &v, seqs, self.layer.attn, None)?;
        let x = (x + w.linear(Part::O)?.forward(&y)?)?;
        let h = rms_norm(&x, w.vector(Part::FfnNorm)?, self.layer.eps)?;
        let gate_up = w.linear(Part::GateUp)?.forward(&h)?;
        let g = gate_up.narrow(D::Minus1, 0, self.intermediate)?;
        let u = gate_up.narrow(D::Minus1, self.intermediate, self.intermediate)?;
        let m = w
            .linear(Part::Down)?
            .forward(&(candle_nn::ops::silu(&g.contiguous()?)? * u)?)?;
        Ok((&x + m)?)
    }
}
