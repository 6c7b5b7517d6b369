//! One pre-norm decoder block: `x + attn(rms(x))`, then `x + mlp(rms(x))` with a SwiGLU MLP.
//! The block holds only hyper-parameters; weights are borrowed per call, so the same block
//! runs resident layers and layers streamed into a device slot alike.

use candle_core::Tensor;

use super::attention::{self, AttentionDims, Step};
use crate::model::error::Result;
use crate::model::kv_cache::LayerKv;
use crate::model::spec::ModelSpec;
use crate::model::weights::{LayerWeights, Linear};

/// The decoder block of the Llama family (shared by every layer).
#[derive(Debug, Clone, Copy)]
pub struct Block {
    dims: AttentionDims,
    eps: f32,
}

impl Block {
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

    /// Runs the block on `x` (`[1, seq, hidden]`), writing this layer's keys and values to `kv`.
    pub fn forward(
        &self,
        x: &Tensor,
        w: &LayerWeights,
        kv: &mut LayerKv,
        step: &Step<'_>,
    ) -> Result<Tensor> {
        let h = rms_norm(x, &w.attn_norm, self.eps)?;
        let h = attention::forward(&h, w, kv, step, self.dims)?;
        let x = (x + h)?;
        let h = rms_norm(&x, &w.ffn_norm, self.eps)?;
        Ok((&x + mlp(&h, w)?)?)
    }
}

/// One sequence's rows in a batched step: where they are in the batch and what its attention
/// needs.
pub struct BatchRows<'a, 'b> {
    /// First row of the sequence in the batch.
    pub offset: usize,
    /// Number of rows (new tokens).
    pub len: usize,
    /// This layer's key/value cache of the sequence.
    pub kv: &'b mut LayerKv,
    /// Position and mask of the sequence.
    pub step: &'b Step<'a>,
}

impl Block {
    /// Runs the block on the rows of several sequences at once (`x` is `[1, rows, hidden]`,
    /// the sequences' rows concatenated): norms, projections and the MLP see every row in one
    /// call each (one pass over the weights); attention runs per sequence on its own rows
    /// against its own cache.
    pub fn forward_batch(
        &self,
        x: &Tensor,
        w: &LayerWeights,
        seqs: &mut [BatchRows<'_, '_>],
    ) -> Result<Tensor> {
        let h = rms_norm(x, &w.attn_norm, self.eps)?;
        let [q, k, v] = projections(&[&w.q, &w.k, &w.v], &h)?;
        let mut outputs = Vec::with_capacity(seqs.len());
        for s in seqs.iter_mut() {
            let (offset, len) = (s.offset, s.len);
            let rows = |t: &Tensor| t.narrow(1, offset, len);
            outputs.push(attention::attend(
                &rows(&q)?,
                &rows(&k)?,
                &rows(&v)?,
                s.kv,
                s.step,
                self.dims,
            )?);
        }
        let y = Tensor::cat(&outputs, 1)?;
        let x = (x + w.o.forward(&y)?)?;
        let h = rms_norm(&x, &w.ffn_norm, self.eps)?;
        Ok((&x + mlp(&h, w)?)?)
    }
}

/// The SwiGLU MLP `down(silu(gate(h)) * up(h))`; gate and up share one pass over `h`.
fn mlp(h: &Tensor, w: &LayerWeights) -> Result<Tensor> {
    let [gate, up] = projections(&[&w.gate, &w.up], h)?;
    w.down.forward(&(candle_nn::ops::silu(&gate)? * up)?)
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
