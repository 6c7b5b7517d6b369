//! The seam between the shared decoder loop and an architecture. A [`Block`] is what one
//! decoder layer computes (its norms, attention variant, MLP or mixture of experts) from that
//! layer's borrowed [`LayerWeights`] and the rows of every sequence of the step; [`for_layer`]
//! picks each layer's block from the spec. A new family is a new `Block` type and one arm of
//! [`for_layer`]; the loop, the layer sources and the offload engine stay as they are.
//!
//! Also here: the helpers every block uses ([`rms_norm`], [`rms_norm_plus`], [`head_norm`],
//! [`projections`]).

use std::fmt;
use std::sync::Arc;

use candle_core::Tensor;

use super::attention::{AttentionDims, Step};
use crate::deepseek2::Deepseek2Block;
use crate::error::Result;
use crate::gemma::GemmaBlock;
use crate::kv_cache::{LayerKv, LayerState};
use crate::llama::LlamaBlock;
use crate::phi3::Phi3Block;
use crate::qwen3;
use crate::qwen35::Qwen35Block;
use crate::recurrent_state::RecurrentState;
use crate::spec::{Architecture, ModelSpec};
use crate::weights::{LayerWeights, Linear};

/// One decoder layer of a family, run on the rows of a whole step.
///
/// A block holds only hyper-parameters: its weights are borrowed per call, so the same block
/// runs resident layers and layers streamed into a device slot alike.
pub trait Block: fmt::Debug + Send + Sync {
    /// Runs the layer on `x` (`[1, rows, hidden]`: the new tokens of every sequence of the
    /// step, concatenated in `seqs` order) and returns its output (same shape). Row-wise work
    /// (norms, projections, MLP) should see every row in one call, which is one pass over the
    /// weights per step; attention runs per sequence on its own rows against its own cache
    /// (`attention::attend_each`), writing this layer's keys and values there.
    fn forward(
        &self,
        x: &Tensor,
        weights: &LayerWeights,
        seqs: &mut [BatchRows<'_, '_>],
    ) -> Result<Tensor>;
}

/// One sequence's rows in a step: where they are in the batch and what its attention needs.
pub struct BatchRows<'a, 'b> {
    /// First row of the sequence in the batch.
    pub offset: usize,
    /// Number of rows (new tokens).
    pub len: usize,
    /// What this layer keeps of the sequence: its key/value cache or its recurrent state
    /// ([`BatchRows::kv`], [`BatchRows::recurrent`]).
    pub state: &'b mut LayerState,
    /// Position and mask of the sequence.
    pub step: &'b Step<'a>,
}

impl BatchRows<'_, '_> {
    /// This sequence's rows of a batched activation `t` (`[1, rows, ..]`).
    pub fn rows(&self, t: &Tensor) -> Result<Tensor> {
        Ok(t.narrow(1, self.offset, self.len)?)
    }

    /// This layer's key/value cache (an error if the layer keeps a recurrent state).
    pub fn kv(&mut self) -> Result<&mut LayerKv> {
        self.state.kv_mut()
    }

    /// This layer's recurrent state (an error if the layer keeps keys and values).
    pub fn recurrent(&mut self) -> Result<&mut RecurrentState> {
        self.state.recurrent_mut()
    }
}

/// What every family's layer reads from the spec: its attention's head layout and its norms'
/// epsilon.
#[derive(Debug, Clone, Copy)]
pub struct LayerDims {
    /// The attention's head layout (of this layer: sliding-window or global).
    pub attn: AttentionDims,
    /// The RMSNorms' epsilon.
    pub eps: f32,
}

impl LayerDims {
    /// Layer `index` of a model with `spec`.
    pub fn of(spec: &ModelSpec, index: usize) -> Self {
        Self {
            attn: AttentionDims::of(spec, index),
            eps: spec.rms_norm_eps as f32,
        }
    }
}

/// The block of decoder layer `index` of a model with `spec` (per-layer variants, such as
/// Gemma's sliding-window and global layers, are chosen by `index`).
pub fn for_layer(spec: &ModelSpec, index: usize) -> Arc<dyn Block> {
    match spec.architecture {
        Architecture::Llama
        | Architecture::Qwen2
        | Architecture::Mistral
        | Architecture::Mixtral
        | Architecture::Qwen2Moe
        | Architecture::GptOss
        | Architecture::Glm4Moe => Arc::new(LlamaBlock::new(spec, index)),
        Architecture::Qwen3 | Architecture::Qwen3Moe => Arc::new(qwen3::block(spec, index)),
        Architecture::Gemma2 | Architecture::Gemma3 => Arc::new(GemmaBlock::new(spec, index)),
        Architecture::Phi3 => Arc::new(Phi3Block::new(spec, index)),
        Architecture::Qwen35 | Architecture::Qwen35Moe => Arc::new(Qwen35Block::new(spec, index)),
        Architecture::Deepseek2 => Arc::new(Deepseek2Block::new(spec, index)),
    }
}

/// `N` projections of the same input ([`Linear::forward_many`]).
pub fn projections<const N: usize>(linears: &[&Linear; N], h: &Tensor) -> Result<[Tensor; N]> {
    Linear::forward_many(linears, h)?
        .try_into()
        .map_err(|_| candle_core::Error::Msg("projection count".into()).into())
}

/// RMSNorm over the last dimension with a learned scale.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    Ok(candle_nn::ops::rms_norm(&x.contiguous()?, weight, eps)?)
}

/// [`rms_norm`] with a scale of `offset + weight` (Gemma's `1 + w` convention when the
/// checkpoint stores `w`; `offset` 0 is plain [`rms_norm`]).
pub fn rms_norm_plus(x: &Tensor, weight: &Tensor, eps: f32, offset: f32) -> Result<Tensor> {
    if offset == 0.0 {
        return rms_norm(x, weight, eps);
    }
    rms_norm(x, &(weight + offset as f64)?, eps)
}

/// [`rms_norm_plus`] of every head of `x` (`[.., heads * head_dim]`) on its own, with one
/// `[head_dim]` weight (Qwen3's and Gemma 3's q/k norms).
pub fn head_norm(x: &Tensor, weight: &Tensor, eps: f32, offset: f32) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let head_dim = weight.dim(0)?;
    let (last, lead) = dims
        .split_last()
        .ok_or_else(|| candle_core::Error::Msg("head_norm: scalar input".into()))?;
    let mut split = lead.to_vec();
    split.extend([last / head_dim, head_dim]);
    let y = rms_norm_plus(&x.reshape(split)?, weight, eps, offset)?;
    Ok(y.reshape(dims)?)
}
