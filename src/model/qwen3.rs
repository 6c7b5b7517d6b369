//! Qwen3's (dense) decoder layer: the Llama layer with an RMSNorm over each query and key head
//! before RoPE, and no q/k/v biases.
//!
//! Reference: HF transformers' `modeling_qwen3.py`, cross-checked in
//! `tests/suite/arch_crosscheck.rs` against candle-transformers' `qwen3` and
//! `quantized_qwen3` on the same random weights.

use candle_core::Tensor;

use super::decoder::attention::{self, AttentionDims};
use super::decoder::block::{head_norm, projections, rms_norm, BatchRows, Block};
use super::error::Result;
use super::llama::swiglu;
use super::moe;
use super::spec::{ModelSpec, MoeSpec};
use super::tensors::Part;
use super::weights::LayerWeights;

/// The decoder layer of Qwen3 (every layer alike).
#[derive(Debug, Clone, Copy)]
pub struct Qwen3Block {
    dims: AttentionDims,
    eps: f32,
    moe: Option<MoeSpec>,
}

impl Qwen3Block {
    /// Layer `index` of a model with `spec`.
    pub fn new(spec: &ModelSpec, index: usize) -> Self {
        Self {
            dims: AttentionDims::of(spec, index),
            eps: spec.rms_norm_eps as f32,
            moe: spec.moe,
        }
    }
}

impl Block for Qwen3Block {
    fn forward(
        &self,
        x: &Tensor,
        w: &LayerWeights,
        seqs: &mut [BatchRows<'_, '_>],
    ) -> Result<Tensor> {
        let h = rms_norm(x, w.vector(Part::AttnNorm)?, self.eps)?;
        let [q, k, v] = projections(
            &[w.linear(Part::Q)?, w.linear(Part::K)?, w.linear(Part::V)?],
            &h,
        )?;
        let q = head_norm(&q, w.vector(Part::QNorm)?, self.eps, 0.0)?;
        let k = head_norm(&k, w.vector(Part::KNorm)?, self.eps, 0.0)?;
        let y = attention::attend_each(&q, &k, &v, seqs, self.dims)?;
        let x = (x + w.linear(Part::O)?.forward(&y)?)?;
        let h = rms_norm(&x, w.vector(Part::FfnNorm)?, self.eps)?;
        let m = match self.moe {
            None => swiglu(&h, w)?,
            Some(moe) => moe::forward(&h, w, moe)?,
        };
        Ok((&x + m)?)
    }
}
