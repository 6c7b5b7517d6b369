//! Gemma 2's and Gemma 3's decoder layer: `x + post_norm(attn(norm(x)))`, then
//! `x + post_norm(geglu(norm(x)))`, every norm an RMSNorm scaled by `1 + w` when the checkpoint
//! stores `w` (Hugging Face; llama.cpp's GGUFs store `1 + w`). Queries are scaled by
//! `1 / sqrt(query_pre_attn_scalar)`; Gemma 2 soft-caps the attention scores, Gemma 3 norms
//! each query and key head instead. Sliding-window and global layers alternate (the step
//! carries both masks, and Gemma 3's local RoPE tables); the embedding scale and the final
//! logit soft-cap live in the shared decoder loop, read from the spec.
//!
//! Reference: HF transformers' `modeling_gemma2.py` / `modeling_gemma3.py`, cross-checked in
//! `tests/suite/arch_crosscheck.rs` against candle-transformers' `gemma2`, `gemma3` and
//! `quantized_gemma3` on the same random weights.

use candle_core::Tensor;

use super::decoder::attention;
use super::decoder::block::{head_norm, projections, rms_norm_plus, BatchRows, Block, LayerDims};
use super::error::Result;
use super::spec::ModelSpec;
use super::tensors::Part;
use super::weights::LayerWeights;

/// One Gemma 2/3 decoder layer (sliding-window or global by its index).
#[derive(Debug, Clone, Copy)]
pub struct GemmaBlock {
    layer: LayerDims,
    offset: f32,
    qk_norm: bool,
}

impl GemmaBlock {
    /// Layer `index` of a model with `spec`.
    pub fn new(spec: &ModelSpec, index: usize) -> Self {
        Self {
            layer: LayerDims::of(spec, index),
            offset: spec.norm_offset,
            qk_norm: spec.qk_norm,
        }
    }

    fn norm(&self, x: &Tensor, w: &LayerWeights, part: Part) -> Result<Tensor> {
        rms_norm_plus(x, w.vector(part)?, self.layer.eps, self.offset)
    }
}

impl Block for GemmaBlock {
    fn forward(
        &self,
        x: &Tensor,
        w: &LayerWeights,
        seqs: &mut [BatchRows<'_, '_>],
    ) -> Result<Tensor> {
        let h = self.norm(x, w, Part::AttnNorm)?;
        let [mut q, mut k, v] = projections(
            &[w.linear(Part::Q)?, w.linear(Part::K)?, w.linear(Part::V)?],
            &h,
        )?;
        if self.qk_norm {
            q = head_norm(&q, w.vector(Part::QNorm)?, self.layer.eps, self.offset)?;
            k = head_norm(&k, w.vector(Part::KNorm)?, self.layer.eps, self.offset)?;
        }
        let y = attention::attend_each(&q, &k, &v, seqs, self.layer.attn, None)?;
        let y = w.linear(Part::O)?.forward(&y)?;
        let x = (x + self.norm(&y, w, Part::PostAttnNorm)?)?;
        let h = self.norm(&x, w, Part::FfnNorm)?;
        let [g, u] = projections(&[w.linear(Part::Gate)?, w.linear(Part::Up)?], &h)?;
        let m = w.linear(Part::Down)?.forward(&(g.gelu()? * u)?)?;
        Ok((&x + self.norm(&m, w, Part::PostFfnNorm)?)?)
    }
}
