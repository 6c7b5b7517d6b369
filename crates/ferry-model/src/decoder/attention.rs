//! Causal self-attention with grouped-query heads, RoPE and the in-place key/value cache;
//! per layer a score scale, an optional soft-cap, global or sliding-window attention and
//! optional attention sinks (gpt-oss: a learned logit per query head that joins the softmax's
//! denominator and adds no value).
//!
//! On the CPU the core runs in tiles with an online softmax ([`super::flash_cpu`]): no
//! `[queries, keys]` score matrix and no mask tensor, keys and values read in place from the
//! cache, so long prompts keep their speed. Elsewhere (CUDA) it is candle's matmuls: query
//! heads are grouped by the key/value head they share (`[kv_heads, group * seq, dim]`), so
//! keys and values are never repeated in memory and one batched matmul per key/value head
//! covers its whole group. Scores and softmax run in f32 whatever the compute dtype; the two
//! matmuls in the KV cache's dtype where the device has that matmul.

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};

use super::block::BatchRows;
use super::flash_cpu::{self, KvData, KvHeads};
use super::rope::Rope;
use crate::error::{ModelError, Result};
use crate::kv_cache::LayerKv;
use crate::spec::ModelSpec;

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
    /// Additive f32 mask `[seq, pos + seq]` (0 or -inf) for the matmul path; `None` when
    /// every key is visible, and on the CPU (whose tiled path masks by position).
    pub mask: Option<Tensor>,
    /// The sliding-window layers' rotary tables, when they differ from `rope` (Gemma 3).
    pub local_rope: Option<&'a Rope>,
    /// The sliding-window layers' mask, for families whose layers alternate between a window
    /// and global attention (Gemma 2/3); `mask` is then the global layers' mask.
    pub local_mask: Option<Tensor>,
    /// The global layers' sliding window (every layer's, for Mistral), if any.
    pub window: Option<usize>,
    /// The sliding-window layers' window (Gemma 2/3).
    pub local_window: Option<usize>,
}

impl<'a> Step<'a> {
    /// The step of `seq` new tokens at `pos`; the masks are built only where the matmul path
    /// runs (off the CPU).
    pub fn new(
        seq: usize,
        pos: usize,
        rope: &'a Rope,
        local_rope: Option<&'a Rope>,
        window: Option<usize>,
        local_window: Option<usize>,
        device: &Device,
    ) -> Result<Self> {
        let masks = !device.is_cpu();
        let mask = match masks {
            true => causal_mask(seq, pos, window, device)?,
            false => None,
        };
        let local_mask = match (masks, local_window) {
            (true, Some(w)) => causal_mask(seq, pos, Some(w), device)?,
            _ => None,
        };
        Ok(Self {
            pos,
            rope,
            mask,
            local_rope,
            local_mask,
            window,
            local_window,
        })
    }
}

/// [`attend`] for every sequence of a step, each on its own rows of the batched projections
/// (`q` `[1, rows, heads * dim]`, `k` and `v` `[1, rows, kv_heads * dim]`) against its own
/// cache; the heads' outputs are concatenated back in row order (`[1, rows, heads * dim]`).
/// `sinks` (`[heads]`, the layer's attention sinks) join every head's softmax when given.
pub fn attend_each(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqs: &mut [BatchRows<'_, '_>],
    dims: AttentionDims,
    sinks: Option<&Tensor>,
) -> Result<Tensor> {
    let sinks = match sinks {
        None => None,
        Some(t) => {
            let values = t.to_dtype(DType::F32)?.to_vec1::<f32>()?;
            if values.len() != dims.n_heads {
                return Err(ModelError::BadShape {
                    name: "attn_sinks".into(),
                    actual: vec![values.len()],
                    expected: vec![dims.n_heads],
                });
            }
            Some(values)
        }
    };
    let mut outputs = Vec::with_capacity(seqs.len());
    for s in seqs.iter_mut() {
        let (q, k, v) = (s.rows(q)?, s.rows(k)?, s.rows(v)?);
        outputs.push(attend(&q, &k, &v, s.kv, s.step, dims, sinks.as_deref())?);
    }
    Ok(Tensor::cat(&outputs, 1)?)
}

/// The attention core for one sequence, between the projections: takes the projected
/// `q` (`[1, seq, heads * dim]`), `k` and `v` (`[1, seq, kv_heads * dim]`), applies RoPE at
/// `step.pos`, writes keys and values to `kv` and returns the heads' output
/// (`[1, seq, heads * dim]`, before the output projection). [`attend_each`] calls it once per
/// sequence on that sequence's rows of the batched projections; `sinks` (one logit per query
/// head) join each head's softmax.
pub fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    kv: &mut LayerKv,
    step: &Step<'_>,
    dims: AttentionDims,
    sinks: Option<&[f32]>,
) -> Result<Tensor> {
    let (b, seq, _) = q.dims3()?;
    let head_dim = dims.head_dim;
    let heads = |t: &Tensor, n: usize| -> Result<Tensor> {
        Ok(t.reshape((b, seq, n, head_dim))?
            .transpose(1, 2)?
            .contiguous()?)
    };
    let (rope, mask, window) = if dims.sliding {
        (
            step.local_rope.unwrap_or(step.rope),
            &step.local_mask,
            step.local_window,
        )
    } else {
        (step.rope, &step.mask, step.window)
    };
    let q = heads(q, dims.n_heads)?;
    let k = heads(k, dims.n_kv_heads)?;
    let v = heads(v, dims.n_kv_heads)?;
    let q = rope.apply(&q, step.pos)?;
    let k = rope.apply(&k, step.pos)?;
    let (k, v) = kv.write(step.pos, &k, &v)?;
    if q.device().is_cpu() && b == 1 {
        return tiled_attention(&q, &k, &v, step.pos, window, dims, sinks);
    }
    let mask = match mask {
        Some(mask) => Some(mask.clone()),
        None => causal_mask(seq, step.pos, window, q.device())?,
    };
    matmul_attention(&q, &k, &v, mask.as_ref(), dims, sinks)
}

/// The attention core by candle's matmuls: `q` (`[b, heads, seq, dim]`, RoPE applied)
/// against the cached `k` and `v` (`[b, kv_heads, kv_len, dim]`) under the additive `mask`
/// (`[seq, kv_len]`, see [`causal_mask`]); returns `[b, seq, heads * dim]` in `q`'s dtype.
/// `sinks` (one logit per query head) are a column of scores that joins the softmax and is
/// dropped before the values.
pub fn matmul_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    dims: AttentionDims,
    sinks: Option<&[f32]>,
) -> Result<Tensor> {
    let (b, _, seq, _) = q.dims4()?;
    let AttentionDims {
        n_heads,
        n_kv_heads,
        head_dim,
        scale,
        softcap,
        ..
    } = dims;
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
    let probs = match sinks {
        None => candle_nn::ops::softmax_last_dim(&scores)?,
        Some(sinks) => {
            // Row `g * seq + i` of key/value head `h` is query head `h * group + g`.
            let column: Vec<f32> = sinks
                .iter()
                .flat_map(|&s| std::iter::repeat_n(s, seq))
                .collect();
            let column = Tensor::from_vec(column, (1, n_kv_heads, group * seq, 1), q.device())?
                .broadcast_as((b, n_kv_heads, group * seq, 1))?;
            let with_sinks = Tensor::cat(&[&scores, &column], 3)?;
            candle_nn::ops::softmax_last_dim(&with_sinks)?
                .narrow(3, 0, kv_len)?
                .contiguous()?
        }
    };
    let probs = probs.to_dtype(v.dtype())?;
    let y = probs.matmul(&v)?.to_dtype(compute)?;
    Ok(y.reshape((b, n_heads, seq, head_dim))?
        .transpose(1, 2)?
        .reshape((b, seq, n_heads * head_dim))?)
}

/// The attention core on the CPU in tiles ([`flash_cpu::attend`]), same contract as
/// [`matmul_attention`] for a batch of one, with the causal mask and `window` applied by
/// position (the query rows are positions `pos..`). Keys and values are read in place.
pub fn tiled_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    pos: usize,
    window: Option<usize>,
    dims: AttentionDims,
    sinks: Option<&[f32]>,
) -> Result<Tensor> {
    let (_, n_heads, seq, head_dim) = q.dims4()?;
    let compute = q.dtype();
    let q = q.to_dtype(DType::F32)?.contiguous()?;
    let (k, v) = (in_place(k)?, in_place(v)?);
    let (q_store, q_layout) = q.storage_and_layout();
    let (k_store, k_layout) = k.storage_and_layout();
    let (v_store, v_layout) = v.storage_and_layout();
    let q_all = cpu_storage(&q_store)?.as_slice::<f32>()?;
    let q_start = q_layout.start_offset();
    let q_len = n_heads * seq * head_dim;
    let q_rows = q_all
        .get(q_start..q_start + q_len)
        .ok_or_else(|| candle_core::Error::Msg("attention: query storage too short".into()))?;
    let shape = flash_cpu::Shape {
        n_heads,
        n_kv_heads: dims.n_kv_heads,
        head_dim,
        seq,
        pos,
        scale: dims.scale as f32,
        softcap: dims.softcap,
        window,
        sinks,
    };
    let k_heads = kv_heads(cpu_storage(&k_store)?, k_layout)?;
    let v_heads = kv_heads(cpu_storage(&v_store)?, v_layout)?;
    let mut out = vec![0f32; q_len];
    flash_cpu::attend(q_rows, k_heads, v_heads, &shape, &mut out)?;
    let y = Tensor::from_vec(out, (1, n_heads, seq, head_dim), &Device::Cpu)?;
    Ok(y.transpose(1, 2)?
        .reshape((1, seq, n_heads * head_dim))?
        .to_dtype(compute)?)
}

/// `t` (`[1, heads, len, dim]`) itself when its rows are contiguous within each head (the
/// cache's narrowed view), else a contiguous copy.
fn in_place(t: &Tensor) -> Result<Tensor> {
    let (_, _, _, dim) = t.dims4()?;
    let stride = t.layout().stride();
    if stride[3] == 1 && stride[2] == dim {
        Ok(t.clone())
    } else {
        Ok(t.contiguous()?)
    }
}

fn cpu_storage(storage: &Storage) -> Result<&CpuStorage> {
    match storage {
        Storage::Cpu(cpu) => Ok(cpu),
        _ => Err(ModelError::Unsupported(
            "tiled CPU attention of a tensor that is not on the CPU".into(),
        )),
    }
}

/// The key/value heads of a `[1, heads, len, dim]` view whose rows are contiguous.
fn kv_heads<'a>(storage: &'a CpuStorage, layout: &candle_core::Layout) -> Result<KvHeads<'a>> {
    let start = layout.start_offset();
    let head_stride = layout.stride()[1];
    let data = match storage {
        CpuStorage::F32(s) => KvData::F32(&s[start.min(s.len())..]),
        CpuStorage::F16(s) => KvData::F16(&s[start.min(s.len())..]),
        CpuStorage::BF16(s) => KvData::BF16(&s[start.min(s.len())..]),
        _ => {
            return Err(ModelError::Unsupported(
                "tiled CPU attention of a key/value cache that is not f32, f16 or bf16".into(),
            ))
        }
    };
    Ok(KvHeads { data, head_stride })
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
