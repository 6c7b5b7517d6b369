//! Causal self-attention with grouped-query heads, RoPE and the in-place key/value cache;
//! per layer a score scale, an optional soft-cap and global or sliding-window attention.
//!
//! Query heads are grouped by the key/value head they share (`[kv_heads, group * seq, dim]`),
//! so keys and values are never repeated in memory: one batched matmul per key/value head
//! covers its whole group. Scores and softmax run in f32 whatever the compute dtype; the two
//! matmuls in the KV cache's dtype where the device has that matmul.

use candle_core::{DType, Device, Tensor};

use super::block::BatchRows;
use super::rope::Rope;
use crate::model::error::Result;
use crate::model::kv_cache::LayerKv;
use crate::model::spec::ModelSpec;

/// Head layout and scoring of one layer's attention.
#[derive(Debug, Clone, Copy)]
pub struct AttentionDims {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Scores are `q . k * scale` (`1 / sqrt(head_dim)` unless the family says otherwise).
    pub scale: f64,
    /// Scores are soft-capped to `cap * tanh(s / cap)` before the mask (Gemma 2).
    pub softcap: Option<f32>,
    /// The layer uses the step's sliding-window rope and mask ([`Step::local_mask`]).
    pub sliding: bool,
}

impl AttentionDims {
    /// The attention of decoder layer `index` of a model with `spec`.
    pub fn of(spec: &ModelSpec, index: usize) -> Self {
        let scalar = spec.query_pre_attn_scalar.unwrap_or(spec.head_dim as f64);
        Self {
            n_heads: spec.n_heads,
            n_kv_heads: spec.n_kv_heads,
            head_dim: spec.head_dim,
            scale: 1.0 / scalar.sqrt(),
            softcap: spec.attn_softcap,
            sliding: spec.sliding_window_pattern.is_some() && spec.is_sliding_layer(index),
        }
    }
}

/// What one forward step shares across layers.
#[derive(Debug)]
pub struct Step<'a> {
    /// Position of the first new token.
    pub pos: usize,
    /// Rotary tables.
    pub rope: &'a Rope,
    /// Additive f32 mask `[seq, pos + seq]` (0 or -inf), `None` when every key is visible.
    pub mask: Option<Tensor>,
    /// The sliding-window layers' rotary tables, when they differ from `rope` (Gemma 3).
    pub local_rope: Option<&'a Rope>,
    /// The sliding-window layers' mask, for families whose layers alternate between a window
    /// and global attention (Gemma 2/3); `mask` is then the global layers' mask.
    pub local_mask: Option<Tensor>,
}

/// [`attend`] for every sequence of a step, each on its own rows of the batched projections
/// (`q` `[1, rows, heads * dim]`, `k` and `v` `[1, rows, kv_heads * dim]`) against its own
/// cache; the heads' outputs are concatenated back in row order (`[1, rows, heads * dim]`).
pub fn attend_each(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqs: &mut [BatchRows<'_, '_>],
    dims: AttentionDims,
) -> Result<Tensor> {
    let mut outputs = Vec::with_capacity(seqs.len());
    for s in seqs.iter_mut() {
        let (q, k, v) = (s.rows(q)?, s.rows(k)?, s.rows(v)?);
        outputs.push(attend(&q, &k, &v, s.kv, s.step, dims)?);
    }
    Ok(Tensor::cat(&outputs, 1)?)
}

/// The attention core for one sequence, between the projections: takes the projected
/// `q` (`[1, seq, heads * dim]`), `k` and `v` (`[1, seq, kv_heads * dim]`), applies RoPE at
/// `step.pos`, writes keys and values to `kv` and returns the heads' output
/// (`[1, seq, heads * dim]`, before the output projection). [`attend_each`] calls it once per
/// sequence on that sequence's rows of the batched projections.
pub fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    kv: &mut LayerKv,
    step: &Step<'_>,
    dims: AttentionDims,
) -> Result<Tensor> {
    let (b, seq, _) = q.dims3()?;
    let AttentionDims {
        n_heads,
        n_kv_heads,
        head_dim,
        scale,
        softcap,
        ..
    } = dims;
    let heads = |t: &Tensor, n: usize| -> Result<Tensor> {
        Ok(t.reshape((b, seq, n, head_dim))?
            .transpose(1, 2)?
            .contiguous()?)
    };
    let (rope, mask) = if dims.sliding {
        (step.local_rope.unwrap_or(step.rope), &step.local_mask)
    } else {
        (step.rope, &step.mask)
    };
    let q = heads(q, n_heads)?;
    let k = heads(k, n_kv_heads)?;
    let v = heads(v, n_kv_heads)?;
    let q = rope.apply(&q, step.pos)?;
    let k = rope.apply(&k, step.pos)?;
    let (k, v) = kv.write(step.pos, &k, &v)?;
    let kv_len = k.dim(2)?;
    // The matmuls run in the cache's dtype where the device multiplies it (an f16 or bf16 cache
    // is not read up to f32 on CUDA); candle's CPU matmul has no bf16, so there a bf16 cache is
    // read up to the compute dtype. An f32 cache with f32 activations is the plain f32 path.
    let compute = q.dtype();
    let dtype = if q.device().is_cpu() && k.dtype() == DType::BF16 {
        compute
    } else {
        k.dtype()
    };
    let (q, k, v) = (q.to_dtype(dtype)?, k.to_dtype(dtype)?, v.to_dtype(dtype)?);

    let group = n_heads / n_kv_heads;
    let q = q.reshape((b, n_kv_heads, group * seq, head_dim))?;
    let scores = (q.matmul(&k.t()?)?.to_dtype(DType::F32)? * scale)?;
    let scores = match softcap {
        None => scores,
        Some(cap) => ((scores / cap as f64)?.tanh()? * cap as f64)?,
    };
    let scores = match mask {
        None => scores,
        Some(mask) => scores
            .reshape((b, n_kv_heads, group, seq, kv_len))?
            .broadcast_add(mask)?
            .reshape((b, n_kv_heads, group * seq, kv_len))?,
    };
    let probs = candle_nn::ops::softmax_last_dim(&scores)?.to_dtype(v.dtype())?;
    let y = probs.matmul(&v)?.to_dtype(compute)?;
    Ok(y.reshape((b, n_heads, seq, head_dim))?
        .transpose(1, 2)?
        .reshape((b, seq, n_heads * head_dim))?)
}

/// The additive mask for `seq` new tokens at `pos`: a query at position `p` sees keys `j <= p`,
/// and only the last `window` of them when a sliding window is set. `None` when nothing is
/// hidden (a single decode token inside the window).
pub fn causal_mask(
    seq: usize,
    pos: usize,
    window: Option<usize>,
    device: &Device,
) -> Result<Option<Tensor>> {
    let kv_len = pos + seq;
    let window = window.unwrap_or(usize::MAX);
    if seq == 1 && kv_len <= window {
        return Ok(None);
    }
    let mut data = Vec::with_capacity(seq * kv_len);
    for i in 0..seq {
        let p = pos + i;
        data.extend((0..kv_len).map(|j| {
            if j <= p && p - j < window {
                0.0f32
            } else {
                f32::NEG_INFINITY
            }
        }));
    }
    Ok(Some(Tensor::from_vec(data, (seq, kv_len), device)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(mask: &Tensor) -> Vec<Vec<bool>> {
        mask.to_vec2::<f32>()
            .unwrap()
            .into_iter()
            .map(|r| r.into_iter().map(|v| v == 0.0).collect())
            .collect()
    }

    #[test]
    fn prefill_mask_is_causal() {
        let m = causal_mask(3, 2, None, &Device::Cpu).unwrap().unwrap();
        assert_eq!(
            rows(&m),
            vec![
                vec![true, true, true, false, false],
                vec![true, true, true, true, false],
                vec![true, true, true, true, true],
            ]
        );
        assert!(causal_mask(1, 9, None, &Device::Cpu).unwrap().is_none());
    }

    #[test]
    fn sliding_window_keeps_the_last_tokens() {
        let m = causal_mask(2, 2, Some(2), &Device::Cpu).unwrap().unwrap();
        assert_eq!(
            rows(&m),
            vec![
                vec![false, true, true, false],
                vec![false, false, true, true]
            ]
        );
        let decode = causal_mask(1, 3, Some(2), &Device::Cpu).unwrap().unwrap();
        assert_eq!(rows(&decode), vec![vec![false, false, true, true]]);
        let probs = candle_nn::ops::softmax_last_dim(&decode).unwrap();
        let sums: Vec<f32> = probs.sum(1).unwrap().to_vec1().unwrap();
        assert_eq!(sums, vec![1.0]);
    }
}
