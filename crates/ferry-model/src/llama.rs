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
    /// The layer's vectors the host reads, from its first call's weights.
    host: OnceLock<HostVectors>,
}

/// A layer's small vectors the host uses every step: gpt-oss's attention sinks (the attention
/// adds them on the host) and GLM-4.5's and DeepSeek-V3's expert-selection bias (routing runs
/// on the host). Read once and kept: reading them every step would wait on the device once per
/// layer and use.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostVectors {
    pub(crate) sinks: Option<Vec<f32>>,
    pub(crate) selection_bias: Option<Vec<f32>>,
}

impl HostVectors {
    /// The vectors of layer `w` (a mixture of experts `moe`, if any).
    pub(crate) fn read(w: &LayerWeights, moe: Option<MoeSpec>) -> Result<Self> {
        let host = |t: &Tensor| -> Result<Vec<f32>> {
            Ok(t.to_dtype(candle_core::DType::F32)?.to_vec1::<f32>()?)
        };
        let selection_bias = match moe.is_some_and(|m| m.selection_bias) {
            true => Some(host(w.vector(Part::ExpProbsBias)?)?),
            false => None,
        };
        Ok(Self {
            sinks: w.opt_vector(Part::AttnSinks).map(host).transpose()?,
            selection_bias,
        })
    }

    /// The vectors kept in `cell`, read from layer `w` on the first call (a block keeps one
    /// cell per layer).
    pub(crate) fn once<'a>(
        cell: &'a OnceLock<Self>,
        w: &LayerWeights,
        moe: Option<MoeSpec>,
    ) -> Result<&'a Self> {
        if let Some(host) = cell.get() {
            return Ok(host);
        }
        let read = Self::read(w, moe)?;
        Ok(cell.get_or_init(|| read))
    }
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
            host: OnceLock::new(),
        }
    }

    /// The layer's host vectors, read from `w` on the first call.
    fn host_vectors(&self, w: &LayerWeights) -> Result<&HostVectors> {
        HostVectors::once(&self.host, w, self.moe)
    }
}

impl Block for LlamaBlock {
    fn forward(
        &self,
        x: &Tensor,
        w: &LayerWeights,
        seqs: &mut [BatchRows<'_, '_>],
    ) -> Result<Tensor> {
        let host = self.host_vectors(w)?;
        let selection_bias = host.selection_bias.as_deref();
        pregate_experts(x, w, self.moe, self.layer.eps, selection_bias)?;
        let h = rms_norm(x, w.vector(Part::AttnNorm)?, self.layer.eps)?;
        let [mut q, mut k, v] = projections(
            &[w.linear(Part::Q)?, w.linear(Part::K)?, w.linear(Part::V)?],
            &h,
        )?;
        if self.qk_norm {
            q = head_norm(&q, w.vector(Part::QNorm)?, self.layer.eps, 0.0)?;
            k = head_norm(&k, w.vector(Part::KNorm)?, self.layer.eps, 0.0)?;
        }
        let y = attention::attend_each(&q, &k, &v, seqs, self.layer.attn, host.sinks.as_deref())?;
        let x = (x + w.linear(Part::O)?.forward(&y)?)?;
        add_mlp(&x, w, self.moe, self.layer.eps, selection_bias)
    }
}

/// Predicts layer `w`'s experts (a mixture `moe`) from `x`, the state entering the layer, normed
/// as its MLP will norm it, when the layer streams them: their copies then overlap the
/// attention. Nothing for a dense layer or resident experts.
pub(crate) fn pregate_experts(
    x: &Tensor,
    w: &LayerWeights,
    moe: Option<MoeSpec>,
    eps: f32,
    selection_bias: Option<&[f32]>,
) -> Result<()> {
    if let Some(moe) = moe.filter(|_| w.predicts_experts()) {
        let normed = rms_norm(x, w.vector(Part::FfnNorm)?, eps)?;
        moe::pregate(&normed, w, moe, selection_bias)?;
    }
    Ok(())
}

/// `x` plus layer `w`'s MLP of `x` normed by `ffn_norm`: the SwiGLU, or the mixture of experts
/// `moe` (routed with `selection_bias` where the family has one).
pub(crate) fn add_mlp(
    x: &Tensor,
    w: &LayerWeights,
    moe: Option<MoeSpec>,
    eps: f32,
    selection_bias: Option<&[f32]>,
) -> Result<Tensor> {
    let h = rms_norm(x, w.vector(Part::FfnNorm)?, eps)?;
    let m = match moe {
        None => swiglu(&h, w)?,
        Some(moe) => moe::forward(&h, w, moe, selection_bias)?,
    };
    Ok((x + m)?)
}

/// The SwiGLU MLP `down(silu(gate(h)) * up(h))` of layer `w`; gate and up share one pass over
/// `h`.
pub fn swiglu(h: &Tensor, w: &LayerWeights) -> Result<Tensor> {
    let [g, u] = projections(&[w.linear(Part::Gate)?, w.linear(Part::Up)?], h)?;
    w.linear(Part::Down)?
        .forward(&(candle_nn::ops::silu(&g)? * u)?)
}
