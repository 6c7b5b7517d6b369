//! The Llama family's decoder layer (Llama, Qwen2, Mistral, Mixtral, and the MoE families on
//! the same layout: Qwen2-MoE, gpt-oss, GLM-4.5): pre-norm, `x + attn(rms(x))`, then
//! `x + mlp(rms(x))`, with grouped-query attention under RoPE (q/k/v/o biases when the
//! checkpoint has them, Mistral's sliding window through the step's mask, gpt-oss's
//! alternating windows and attention sinks, GLM-4.5's optional q/k norms and partial RoPE)
//! and a SwiGLU MLP or a mixture of experts ([`moe`]; GLM-4.5's leading layers are dense).
//!
//! Reference: HF transformers' `modeling_llama.py` / `modeling_qwen2.py` /
//! `modeling_mistral.py`, cross-checked in `tests/suite/arch_crosscheck.rs` against
//! candle-transformers' `llama`, `qwen2`, `mistral` and `quantized_llama` on the same random
//! weights.

use std::sync::OnceLock;

use candle_core::Tensor;

use super::decoder::attention;
use super::decoder::block::{head_norm, projections, rms_norm, BatchRows, Block, LayerDims};
use super::error::Result;
use super::moe;
use super::spec::{Architecture, ModelSpec, MoeSpec};
use super::tensors::Part;
use super::weights::LayerWeights;

/// The decoder layer of the Llama family (every layer alike).
#[derive(Debug, Clone)]
pub struct LlamaBlock {
    layer: LayerDims,
    moe: Option<MoeSpec>,
    /// An RMSNorm over each query and key head before RoPE (Qwen3's layer).
    qk_norm: bool,
    /// The layer's attention sinks (gpt-oss), read to the host from the first call's weights
    /// and kept: the attention adds them on the host, and reading them every step would wait
    /// on the device once per layer.
    sinks: OnceLock<Option<Vec<f32>>>,
}

impl LlamaBlock {
    /// Layer `index` of a model with `spec`'s head layout and norm epsilon (q/k norms only
    /// where GLM-4.5's file has them).
    pub fn new(spec: &ModelSpec, index: usize) -> Self {
        let qk_norm = spec.architecture == Architecture::Glm4Moe && spec.qk_norm;
        Self::with_qk_norm(spec, index, qk_norm)
    }

    /// [`LlamaBlock::new`], with an RMSNorm over each query and key head when `qk_norm`.
    pub fn with_qk_norm(spec: &ModelSpec, index: usize, qk_norm: bool) -> Self {
        Self {
            layer: LayerDims::of(spec, index),
            moe: spec.moe_at(index),
            qk_norm,
            sinks: OnceLock::new(),
        }
    }
}

/// A vector's values on the host, as f32.
fn host_values(t: &Tensor) -> Result<Vec<f32>> {
    Ok(t.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?)
}

impl Block for LlamaBlock {
    fn forward(
        &self,
        x: &Tensor,
        w: &LayerWeights,
        seqs: &mut [BatchRows<'_, '_>],
    ) -> Result<Tensor> {
        if let Some(moe) = self.moe.filter(|_| w.predicts_experts()) {
            // Predict this layer's experts from the state entering it: their copies overlap
            // the attention below.
            let normed = rms_norm(x, w.vector(Part::FfnNorm)?, self.layer.eps)?;
            moe::pregate(&normed, w, moe)?;
        }
        let h = rms_norm(x, w.vector(Part::AttnNorm)?, self.layer.eps)?;
        let [mut q, mut k, v] = projections(
            &[w.linear(Part::Q)?, w.linear(Part::K)?, w.linear(Part::V)?],
            &h,
        )?;
        if self.qk_norm {
            q = head_norm(&q, w.vector(Part::QNorm)?, self.layer.eps, 0.0)?;
            k = head_norm(&k, w.vector(Part::KNorm)?, self.layer.eps, 0.0)?;
        }
        let sinks = match self.sinks.get() {
            Some(sinks) => sinks.as_deref(),
            None => {
                let read = w.opt_vector(Part::AttnSinks).map(host_values).transpose()?;
                self.sinks.get_or_init(|| read).as_deref()
            }
        };
        let y = attention::attend_each(&q, &k, &v, seqs, self.layer.attn, sinks)?;
        let x = (x + w.linear(Part::O)?.forward(&y)?)?;
        let h = rms_norm(&x, w.vector(Part::FfnNorm)?, self.layer.eps)?;
        let m = match self.moe {
            None => swiglu(&h, w)?,
            Some(moe) => moe::forward(&h, w, moe)?,
        };
        Ok((&x + m)?)
    }
}

/// The SwiGLU MLP `down(silu(gate(h)) * up(h))` of layer `w`; gate and up share one pass over
/// `h`.
pub fn swiglu(h: &Tensor, w: &LayerWeights) -> Result<Tensor> {
    let [g, u] = projections(&[w.linear(Part::Gate)?, w.linear(Part::Up)?], h)?;
    w.linear(Part::Down)?
        .forward(&(candle_nn::ops::silu(&g)? * u)?)
}
