//! Causal self-attention with grouped-query heads, RoPE and the in-place key/value cache.
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

/// Head layout of the attention block.
#[derive(Debug, Clone, Copy)]
pub struct AttentionDims {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
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
    } = dims;
    let heads = |t: &Tensor, n: usize| -> Result<Tensor> {
        Ok(t.reshape((b, seq, n, head_dim))?
            .transpose(1, 2)?
            .contiguous()?)
    };
    let q = heads(q, n_heads)?;
    let k = heads(k, n_kv_heads)?;
    let v = heads(v, n_kv_heads)?;
    let q = step.rope.apply(&q, step.pos)?;
    let k = step.rope.apply(&k, step.pos)?;
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
    let scale = 1.0 / (head_dim as f64).sqrt();
    let scores = (q.matmul(&k.t()?)?.to_dtype(DType::F32)? * scale)?;
    let scores = match &step.mask {
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
