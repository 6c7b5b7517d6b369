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
//!
//! The matmul path scores at most [`KEY_BLOCK`] keys at once: a longer context runs block by
//! block with an online softmax ([`blocked_attention`]) and builds each block's mask from
//! positions, so its workspace (the scores of a step's queries against one block) does not grow
//! with the context. [`score_block`] says how many keys each device scores at once, for the
//! planner's workspace estimate.
//!
//! A cache in host memory (`kv_offload`, [`LayerKv::on_host`]) is attended on the host whatever
//! the compute device (the step's queries, keys and values go down, the output comes back), or,
//! for a step whose rows make the host's work cost more than the link ([`LayerKv::streams`]: a
//! long prompt chunk), on the device after the positions it attends to cross.

use candle_core::{CpuStorage, DType, Device, Storage, Tensor};

use super::block::BatchRows;
use super::flash_cpu::{self, KvData, KvHeads};
use super::rope::Rope;
use crate::error::{ModelError, Result};
use crate::kv_cache::LayerKv;
use crate::kv_format::{self, KvFormat};
use crate::spec::ModelSpec;

/// Most keys the matmul path scores a query against at once; longer contexts go block by block.
pub const KEY_BLOCK: usize = 2048;

/// Keys one query row is scored against at once on `device` with `kv_len` keys visible: a tile
/// of the tiled kernel on the CPU ([`flash_cpu::TILE_K`]), at most [`KEY_BLOCK`] elsewhere. The
/// score matrix of a step is `heads x queries x score_block`, whatever the context.
pub fn score_block(device: &Device, kv_len: usize) -> usize {
    let block = if device.is_cpu() {
        flash_cpu::TILE_K
    } else {
        KEY_BLOCK
    };
    block.min(kv_len.max(1))
}

/// Head layout and scoring of one layer's attention.
#[derive(Debug, Clone, Copy)]
pub struct AttentionDims {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads.
    pub n_kv_heads: usize,
    /// Width of one head (of its queries and keys).
    pub head_dim: usize,
    /// Width of one value head: `head_dim`, or less when the values are the first part of
    /// the keys (latent attention: keys are the latent and its RoPE part, values the latent;
    /// [`crate::kv_cache::KvShape::values_in_keys`]).
    pub value_dim: usize,
    /// Scores are `q . k * scale` (`1 / sqrt(head_dim)` unless the family says otherwise).
    pub scale: f64,
    /// Scores are soft-capped to `cap * tanh(s / cap)` before the mask (Gemma 2).
    pub softcap: Option<f32>,
    /// The layer uses the step's sliding-window rope and mask ([`Step::local_mask`]).
    pub sliding: bool,
}

impl AttentionDims {
    /// The attention of decoder layer `index` of a model with `spec`.
    /// With latent attention ([`crate::spec::MlaSpec`]), the absorbed form's: every query head
    /// against the one cached latent row, values its first `kv_lora_rank`.
    pub fn of(spec: &ModelSpec, index: usize) -> Self {
        let scalar = spec.query_pre_attn_scalar.unwrap_or(spec.head_dim as f64);
        Self {
            n_heads: spec.n_heads,
            n_kv_heads: spec.n_kv_heads,
            head_dim: spec.head_dim,
            value_dim: spec.mla.map_or(spec.head_dim, |m| m.kv_lora_rank),
            scale: spec.mla.map_or(1.0 / scalar.sqrt(), |m| m.score_scale),
            softcap: spec.attn_softcap,
            sliding: spec.sliding_window_pattern.is_some() && spec.is_sliding_layer(index),
        }
    }
}

impl Step<'_> {
    /// The rotary tables of a layer with `dims`: the sliding-window layers' own, if any.
    pub fn rope_of(&self, dims: AttentionDims) -> &Rope {
        match dims.sliding {
            true => self.local_rope.unwrap_or(self.rope),
            false => self.rope,
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
    /// The step of `seq` new tokens at `pos`; the masks are built only where the one-shot
    /// matmul path runs (off the CPU, at most [`KEY_BLOCK`] keys: a longer context builds a mask
    /// per block, never one of `[seq, pos + seq]`).
    pub fn new(
        seq: usize,
        pos: usize,
        rope: &'a Rope,
        local_rope: Option<&'a Rope>,
        window: Option<usize>,
        local_window: Option<usize>,
        device: &Device,
    ) -> Result<Self> {
        let masks = !device.is_cpu() && pos + seq <= KEY_BLOCK;
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
/// `sinks` (one per query head, the layer's attention sinks) join every head's softmax when given.
pub fn attend_each(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqs: &mut [BatchRows<'_, '_>],
    dims: AttentionDims,
    sinks: Option<&[f32]>,
) -> Result<Tensor> {
    if let Some(values) = sinks.filter(|v| v.len() != dims.n_heads) {
        return Err(ModelError::BadShape {
            name: "attn_sinks".into(),
            actual: vec![values.len()],
            expected: vec![dims.n_heads],
        });
    }
    let mut outputs = Vec::with_capacity(seqs.len());
    for s in seqs.iter_mut() {
        let (q, k, v) = (s.rows(q)?, s.rows(k)?, s.rows(v)?);
        let step = s.step;
        outputs.push(attend(&q, &k, &v, s.kv()?, step, dims, sinks)?);
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
    let rope = step.rope_of(dims);
    let q = heads(q, dims.n_heads)?;
    let k = heads(k, dims.n_kv_heads)?;
    let v = heads(v, dims.n_kv_heads)?;
    let q = rope.apply(&q, step.pos)?;
    let k = rope.apply(&k, step.pos)?;
    attend_heads(&q, &k, &v, kv, step, dims, sinks)
}

/// [`attend`] after the heads are split and RoPE applied: `q` `[1, heads, seq, head_dim]`, `k`
/// `[1, kv_heads, seq, head_dim]` and `v` `[1, kv_heads, seq, value_dim]` (ignored when the
/// cache keeps the values in the keys) are written to `kv` and attended, on the host for a
/// host cache; returns `[1, seq, heads * value_dim]`. A family that rotates its own way (the
/// latent attention's shared RoPE part) calls it directly.
pub fn attend_heads(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    kv: &mut LayerKv,
    step: &Step<'_>,
    dims: AttentionDims,
    sinks: Option<&[f32]>,
) -> Result<Tensor> {
    let seq = q.dim(2)?;
    let (mask, window) = if dims.sliding {
        (&step.local_mask, step.local_window)
    } else {
        (&step.mask, step.window)
    };
    if kv.on_host() && !q.device().is_cpu() {
        // The cache lives in host memory (`kv_offload`): the step's keys and values cross to
        // the host to be written there.
        let host =
            |t: &Tensor| -> Result<Tensor> { Ok(t.to_device(&Device::Cpu)?.to_dtype(DType::F32)?) };
        let (hk, hv) = (host(k)?, host(v)?);
        if kv.streams(seq, dims.n_heads, step.pos + seq) {
            // The link is quicker for this step (a long prompt chunk): the positions it
            // attends to cross to the device, and attention runs there.
            return attend_rotated(q, &hk, &hv, kv, step, dims, (window, mask, sinks));
        }
        // Else the queries cross too, attention runs on the host (the CPU's tiled kernel, in
        // f32, masking by position), and only its output crosses back, never the cache.
        let no_mask = None;
        let y = attend_rotated(
            &host(q)?,
            &hk,
            &hv,
            kv,
            step,
            dims,
            (window, &no_mask, sinks),
        )?;
        return Ok(y.to_device(q.device())?.to_dtype(q.dtype())?);
    }
    attend_rotated(q, k, v, kv, step, dims, (window, mask, sinks))
}

/// [`attend`] after RoPE, on the device the cache lives on: rotates a block-format cache's
/// queries, keys and values around it and attends.
fn attend_rotated(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    kv: &mut LayerKv,
    step: &Step<'_>,
    dims: AttentionDims,
    (window, mask, sinks): (Option<usize>, &Option<Tensor>, Option<&[f32]>),
) -> Result<Tensor> {
    let head_dim = dims.head_dim;
    let format = kv.format();
    if format.rotates(head_dim) {
        // A block-format cache stores rotated keys and values (`kv_format::rotate`): rotated
        // queries score the same, and the output comes back rotated once more.
        let (q, k, v) = (
            kv_format::rotate(q)?,
            kv_format::rotate(k)?,
            kv_format::rotate(v)?,
        );
        let y = attend_stored(&q, &k, &v, kv, step, dims, (window, mask, sinks))?;
        return kv_format::rotate(&y);
    }
    attend_stored(q, k, v, kv, step, dims, (window, mask, sinks))
}

/// [`attend`] after RoPE (and the rotation of a block-format cache): writes `k` and `v` to the
/// cache and attends `q` to every position the layer holds.
fn attend_stored(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    kv: &mut LayerKv,
    step: &Step<'_>,
    dims: AttentionDims,
    (window, mask, sinks): (Option<usize>, &Option<Tensor>, Option<&[f32]>),
) -> Result<Tensor> {
    let (b, _, seq, head_dim) = q.dims4()?;
    let format = kv.format();
    let (k, v) = kv.write(step.pos, k, v)?;
    // The views start at the layer's first held position (a window layer forgets older ones);
    // causal and window masks are the same relative to it.
    let first = kv.first_position();
    let pos = step.pos - first;
    // The tiled kernel reads values as wide as the keys; the latent attention's narrower
    // values take the matmul path (on the CPU too).
    if q.device().is_cpu() && b == 1 && dims.value_dim == head_dim {
        let queries = Queries { pos, window, sinks };
        return tiled_attention(q, &k, &v, format, dims, queries);
    }
    // The matmul paths multiply dense tensors: a block-format cache is decoded for them; a
    // host cache's views cross to the queries' device (`kv_offload`, a step the link is quicker
    // for: just the positions held, not the buffers' capacity).
    let (k, v) = match format {
        KvFormat::Dense(_) => (k, v),
        _ => (format.decode(&k, head_dim)?, format.decode(&v, head_dim)?),
    };
    let onto = |t: Tensor| -> Result<Tensor> {
        if t.device().same_device(q.device()) {
            return Ok(t);
        }
        Ok(t.force_contiguous()?.to_device(q.device())?)
    };
    let (k, v) = (onto(k)?, onto(v)?.contiguous()?);
    let queries = Queries { pos, window, sinks };
    if q.device().is_cpu() && (2..=flash_cpu::ROW_BY_ROW).contains(&seq) {
        // As the tiled kernel runs short chunks: each query row as its decode step computes it
        // (against the keys up to its position), so a speculative step's verification reads
        // the logits decoding would give, bit for bit.
        let rows = (0..seq)
            .map(|i| {
                let seen = pos + i + 1;
                let row = Queries {
                    pos: pos + i,
                    ..queries
                };
                let (k, v) = (k.narrow(2, 0, seen)?, v.narrow(2, 0, seen)?);
                against_keys(&q.narrow(2, i, 1)?.contiguous()?, &k, &v, dims, row, None)
            })
            .collect::<Result<Vec<_>>>()?;
        return Ok(Tensor::cat(&rows, 1)?);
    }
    let mask = mask.as_ref().filter(|_| first == 0).cloned();
    against_keys(q, &k, &v, dims, queries, mask)
}

/// The matmul paths for `q` (`[b, heads, seq, dim]`) against the keys and values held (`k`,
/// `v`, from the first held position): key block by key block past [`KEY_BLOCK`] keys, else
/// at once under `mask` (the step's, when it applies), or one built from the positions.
fn against_keys(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    dims: AttentionDims,
    queries: Queries<'_>,
    mask: Option<Tensor>,
) -> Result<Tensor> {
    if k.dim(2)? > KEY_BLOCK {
        return blocked_attention(q, k, v, dims, queries, KEY_BLOCK);
    }
    let mask = match mask {
        Some(mask) => Some(mask),
        None => causal_mask(q.dim(2)?, queries.pos, queries.window, q.device())?,
    };
    matmul_attention(q, k, v, mask.as_ref(), dims, queries.sinks)
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
    let seq = q.dim(2)?;
    let kv_len = k.dim(2)?;
    let compute = q.dtype();
    let (q, dtype) = grouped_queries(q, k.dtype(), dims)?;
    let (k, v) = (k.to_dtype(dtype)?, v.to_dtype(dtype)?);
    let scores = masked(scaled_scores(&q, &k, dims)?, mask, dims, seq)?;
    let probs = match sinks {
        None => candle_nn::ops::softmax_last_dim(&scores)?,
        Some(sinks) => {
            let column = sink_column(sinks, &q, seq)?;
            let with_sinks = Tensor::cat(&[&scores, &column], 3)?;
            candle_nn::ops::softmax_last_dim(&with_sinks)?
                .narrow(3, 0, kv_len)?
                .contiguous()?
        }
    };
    let probs = probs.to_dtype(v.dtype())?;
    let y = probs.matmul(&v)?.to_dtype(compute)?;
    heads_to_rows(&y, dims, seq)
}

/// `q . k^T * scale` in f32 for grouped queries `q` (`[b, kv_heads, group * seq, dim]`) and keys
/// `k` (`[b, kv_heads, keys, dim]`), soft-capped when the layer caps.
fn scaled_scores(q: &Tensor, k: &Tensor, dims: AttentionDims) -> Result<Tensor> {
    let scores = (q.matmul(&k.t()?)?.to_dtype(DType::F32)? * dims.scale)?;
    Ok(match dims.softcap {
        None => scores,
        Some(cap) => ((scores / cap as f64)?.tanh()? * cap as f64)?,
    })
}

/// `scores` (`[b, kv_heads, group * seq, keys]`) plus the additive `mask` (`[seq, keys]`), which
/// every query head of a group shares.
fn masked(
    scores: Tensor,
    mask: Option<&Tensor>,
    dims: AttentionDims,
    seq: usize,
) -> Result<Tensor> {
    let Some(mask) = mask else {
        return Ok(scores);
    };
    let (b, kv_heads, rows, keys) = scores.dims4()?;
    Ok(scores
        .reshape((b, kv_heads, dims.n_heads / dims.n_kv_heads, seq, keys))?
        .broadcast_add(mask)?
        .reshape((b, kv_heads, rows, keys))?)
}

/// The sink logit of each row of grouped queries `q` (`[b, kv_heads, group * seq, dim]`) as a
/// `[b, kv_heads, group * seq, 1]` column: row `g * seq + i` of key/value head `h` is query head
/// `h * group + g`.
fn sink_column(sinks: &[f32], q: &Tensor, seq: usize) -> Result<Tensor> {
    let (b, kv_heads, rows, _) = q.dims4()?;
    let column: Vec<f32> = sinks
        .iter()
        .flat_map(|&s| std::iter::repeat_n(s, seq))
        .collect();
    Ok(
        Tensor::from_vec(column, (1, kv_heads, rows, 1), q.device())?
            .broadcast_as((b, kv_heads, rows, 1))?,
    )
}

/// The heads' outputs `[b, kv_heads, group * seq, dim]` (grouped as the queries were) back in
/// row order, `[b, seq, heads * dim]`.
fn heads_to_rows(y: &Tensor, dims: AttentionDims, seq: usize) -> Result<Tensor> {
    let b = y.dim(0)?;
    let (n_heads, head_dim) = (dims.n_heads, dims.value_dim);
    Ok(y.reshape((b, n_heads, seq, head_dim))?
        .transpose(1, 2)?
        .reshape((b, seq, n_heads * head_dim))?)
}

/// `q` (`[b, heads, seq, dim]`) in the dtype the attention matmuls run in for a cache of
/// `cache` dtype, grouped by the key/value head its heads share (`[b, kv_heads, group * seq,
/// dim]`, so keys and values are never repeated), and that dtype. The matmuls run in the
/// cache's dtype where the device multiplies it (an f16 or bf16 cache is not read up to f32 on
/// CUDA); candle's CPU matmul has no bf16, so there a bf16 cache is read up to the compute
/// dtype. An f32 cache with f32 activations is the plain f32 path.
fn grouped_queries(q: &Tensor, cache: DType, dims: AttentionDims) -> Result<(Tensor, DType)> {
    let (b, _, seq, _) = q.dims4()?;
    let dtype = if q.device().is_cpu() && cache == DType::BF16 {
        q.dtype()
    } else {
        cache
    };
    let group = dims.n_heads / dims.n_kv_heads;
    let q = q
        .to_dtype(dtype)?
        .reshape((b, dims.n_kv_heads, group * seq, q.dim(3)?))?;
    Ok((q, dtype))
}

/// [`matmul_attention`] over the keys in blocks of `block` with an online softmax: per block
/// the scores of every query against its keys, their maximum folded into each row's running
/// maximum, sum and weighted sum of values (rescaled when the maximum grows). Queries are at
/// positions `pos..` and each block's mask is built from positions (causal, and `window`), so
/// no tensor of `[seq, kv_len]` is ever made. Same contract as [`matmul_attention`]; equal to
/// it up to the order of the floating-point sums.
pub fn blocked_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    dims: AttentionDims,
    queries: Queries<'_>,
    block: usize,
) -> Result<Tensor> {
    let Queries { pos, window, sinks } = queries;
    let seq = q.dim(2)?;
    let kv_len = k.dim(2)?;
    let compute = q.dtype();
    let (q, dtype) = grouped_queries(q, k.dtype(), dims)?;
    // Rows whose keys so far are all masked keep this floor as their maximum, so that
    // `-inf - max` stays `-inf` (a weight of 0) instead of NaN.
    const FLOOR: f64 = -1e30;
    let mut max: Option<Tensor> = None;
    let mut sum: Option<Tensor> = None;
    let mut acc: Option<Tensor> = None;
    let mut start = 0;
    while start < kv_len {
        let n = block.max(1).min(kv_len - start);
        let kb = k.narrow(2, start, n)?.to_dtype(dtype)?;
        let vb = v.narrow(2, start, n)?.to_dtype(dtype)?;
        let mask = block_mask(seq, pos, start, n, window, q.device())?;
        let scores = masked(scaled_scores(&q, &kb, dims)?, mask.as_ref(), dims, seq)?;
        let block_max = scores.max_keepdim(candle_core::D::Minus1)?;
        let new_max = match &max {
            None => block_max.maximum(FLOOR)?,
            Some(old) => old.maximum(&block_max)?,
        };
        let weights = scores.broadcast_sub(&new_max)?.exp()?;
        let block_sum = weights.sum_keepdim(candle_core::D::Minus1)?;
        let values = weights.to_dtype(dtype)?.matmul(&vb)?.to_dtype(DType::F32)?;
        (sum, acc) = match (&max, sum, acc) {
            (Some(old), Some(sum), Some(acc)) => {
                let correction = (old - &new_max)?.exp()?;
                (
                    Some(((sum * &correction)? + block_sum)?),
                    Some((acc.broadcast_mul(&correction)? + values)?),
                )
            }
            _ => (Some(block_sum), Some(values)),
        };
        max = Some(new_max);
        start += n;
    }
    let (Some(max), Some(sum), Some(acc)) = (max, sum, acc) else {
        return Err(candle_core::Error::Msg("attention over no keys".into()).into());
    };
    // Sinks: one more logit per query head, with no value, joins each row's softmax.
    let (sum, acc) = match sinks {
        None => (sum, acc),
        Some(sinks) => {
            let column = sink_column(sinks, &q, seq)?;
            let new_max = max.maximum(&column)?;
            let correction = (&max - &new_max)?.exp()?;
            let sink = (column - &new_max)?.exp()?;
            (
                ((sum * &correction)? + sink)?,
                acc.broadcast_mul(&correction)?,
            )
        }
    };
    let y = acc.broadcast_div(&sum)?.to_dtype(compute)?;
    heads_to_rows(&y, dims, seq)
}

/// What the query rows of [`tiled_attention`] and [`blocked_attention`] see: the first row's
/// position (relative to the first key held), the window, and the sinks.
#[derive(Debug, Clone, Copy, Default)]
pub struct Queries<'a> {
    /// Position of the first query row; row `i` sees keys `j <= pos + i`.
    pub pos: usize,
    /// A query sees only the last `window` positions (itself included).
    pub window: Option<usize>,
    /// One logit per query head that joins its softmax (gpt-oss).
    pub sinks: Option<&'a [f32]>,
}

/// The additive mask of keys `start..start + n` for `seq` queries at positions `pos..`
/// (causal, and only the last `window` positions when set); `None` when every query sees
/// every key of the block.
fn block_mask(
    seq: usize,
    pos: usize,
    start: usize,
    n: usize,
    window: Option<usize>,
    device: &Device,
) -> Result<Option<Tensor>> {
    let window = window.unwrap_or(usize::MAX);
    let last_key = start + n - 1;
    let last_query = pos + seq - 1;
    if last_key <= pos && last_query - start < window {
        return Ok(None);
    }
    let mut data = Vec::with_capacity(seq * n);
    for i in 0..seq {
        let p = pos + i;
        data.extend((start..start + n).map(|j| {
            if j <= p && p - j < window {
                0.0f32
            } else {
                f32::NEG_INFINITY
            }
        }));
    }
    Ok(Some(Tensor::from_vec(data, (seq, n), device)?))
}

/// The attention core on the CPU in tiles ([`flash_cpu::attend`]), same contract as
/// [`matmul_attention`] for a batch of one, with the causal mask and `window` applied by
/// position (the query rows are positions `pos..`). Keys and values are read in place, as the
/// cache stores them in `format`.
pub fn tiled_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    format: KvFormat,
    dims: AttentionDims,
    queries: Queries<'_>,
) -> Result<Tensor> {
    let Queries { pos, window, sinks } = queries;
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
    let k_heads = kv_heads(cpu_storage(&k_store)?, k_layout, format, head_dim)?;
    let v_heads = kv_heads(cpu_storage(&v_store)?, v_layout, format, head_dim)?;
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

/// The key/value heads of a `[1, heads, len, row_len]` view whose rows are contiguous, stored
/// in `format` (a block format's head stride, in bytes, becomes one in values).
fn kv_heads<'a>(
    storage: &'a CpuStorage,
    layout: &candle_core::Layout,
    format: KvFormat,
    head_dim: usize,
) -> Result<KvHeads<'a>> {
    let start = layout.start_offset();
    let head_stride = layout.stride()[1];
    let (data, head_stride) = match (storage, format) {
        (CpuStorage::F32(s), KvFormat::Dense(_)) => {
            (KvData::F32(&s[start.min(s.len())..]), head_stride)
        }
        (CpuStorage::F16(s), KvFormat::Dense(_)) => {
            (KvData::F16(&s[start.min(s.len())..]), head_stride)
        }
        (CpuStorage::BF16(s), KvFormat::Dense(_)) => {
            (KvData::BF16(&s[start.min(s.len())..]), head_stride)
        }
        (CpuStorage::U8(s), KvFormat::Q8_0 | KvFormat::Q4_0) => {
            let row = format.row_bytes(head_dim);
            let bytes = &s[start.min(s.len())..];
            let data = match format {
                KvFormat::Q8_0 => KvData::Q8_0(bytes),
                _ => KvData::Q4_0(bytes),
            };
            (data, head_stride / row * head_dim)
        }
        _ => {
            return Err(ModelError::Unsupported(format!(
                "tiled CPU attention of a {} key/value cache held in other storage",
                format.as_str()
            )))
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

    /// Random `[1, heads, len, dim]` values from a fixed seed.
    fn random(heads: usize, len: usize, dim: usize, seed: u64) -> Tensor {
        let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let data: Vec<f32> = (0..heads * len * dim)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state % 2001) as f32 / 1000.0 - 1.0
            })
            .collect();
        Tensor::from_vec(data, (1, heads, len, dim), &Device::Cpu).unwrap()
    }

    #[test]
    fn key_blocks_give_the_one_shot_attention() {
        // (queries, position of the first, window, soft-cap, key block): prefill from 0, a chunk
        // after cached keys, decode, a window that masks whole blocks, a block of one key.
        let cases = [
            (7, 0, None, None, 3),
            (5, 11, None, None, 4),
            (1, 20, None, Some(5.0), 6),
            (6, 14, Some(4), None, 3),
            (1, 30, Some(7), None, 5),
            (4, 3, Some(2), Some(2.0), 1),
        ];
        for (seq, pos, window, softcap, block) in cases {
            let dims = AttentionDims {
                n_heads: 4,
                n_kv_heads: 2,
                head_dim: 8,
                value_dim: 8,
                scale: 0.35,
                softcap,
                sliding: window.is_some(),
            };
            let kv_len = pos + seq;
            let q = random(4, seq, 8, 1 + pos as u64);
            let k = random(2, kv_len, 8, 2 + seq as u64);
            let v = random(2, kv_len, 8, 3);
            let mask = causal_mask(seq, pos, window, &Device::Cpu).unwrap();
            // Without and with sinks (one logit per query head, one large enough to dominate).
            for sinks in [None, Some(&[0.3f32, -1.0, 2.5, 9.0][..])] {
                let one_shot = matmul_attention(&q, &k, &v, mask.as_ref(), dims, sinks).unwrap();
                let queries = Queries { pos, window, sinks };
                let blocked = blocked_attention(&q, &k, &v, dims, queries, block).unwrap();
                assert_eq!(blocked.dims(), one_shot.dims());
                let diff: f32 = (blocked - &one_shot)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar()
                    .unwrap();
                let case = (seq, pos, window, softcap, block, sinks.is_some());
                assert!(diff < 1e-5, "{case:?}: largest difference {diff}");
            }
        }
    }

    #[test]
    fn the_score_block_does_not_grow_with_the_context() {
        assert_eq!(score_block(&Device::Cpu, 4096), flash_cpu::TILE_K);
        assert_eq!(score_block(&Device::Cpu, 32768), flash_cpu::TILE_K);
        assert_eq!(score_block(&Device::Cpu, 10), 10);
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
