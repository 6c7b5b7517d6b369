//! Causal attention on the CPU without a `[queries, keys]` score matrix: an online softmax
//! (each query row keeps its maximum so far, its sum of exponentials and its weighted sum of
//! values, rescaled when the maximum grows) over keys and values read in place from the cache.
//!
//! The API is plain slices: queries and the output are f32 `[heads, seq, head_dim]`; keys and
//! values are read in place from the cache in its format (f32, f16 or bf16, widened to f32 as
//! they are used; or q8_0 / q4_0 blocks, decoded a tile at a time into a small buffer) as
//! `[kv_heads, .., head_dim]` rows. Query head `h` reads key/value head
//! `h / (heads / kv_heads)` (grouped-query attention). Query row `i` is at position
//! `pos + i` and sees keys `j <= pos + i`, and only the last `window` of them when a sliding
//! window is set; scores are `q . k * scale`, soft-capped to `cap * tanh(s / cap)` when a cap
//! is set (Gemma 2). With attention sinks (gpt-oss), head `h`'s sink logit joins the softmax's
//! denominator when each row is finished: `sum + e^(sink - max)`, which is the softmax over the
//! keys and the sink with the sink's column dropped.
//!
//! Two schedules, one per job:
//! - [`decode`] (one query row per head, a decode step): one task per key/value head and
//!   range of keys, all query heads of the group together (each key and value row read once
//!   for the group), each range with its own maximum and sum, merged at the end
//!   (flash-decoding), so every thread is busy even with few heads and long contexts.
//! - [`prefill`] (several rows): one task per key/value head and tile of query rows, the
//!   group's query heads over one transposed key tile. Up to [`ROW_BY_ROW`] rows run instead
//!   one at a time as decode steps, so a short chunk (a speculative step's proposals) computes
//!   each position exactly as decoding it alone does.
//!
//! Inner loops are explicit SIMD ([`simd`]: AVX-512, AVX2 + FMA) or written for the
//! auto-vectorizer, with the variant picked at run time from the CPU's features ([`Isa`]) and
//! a baseline kept beside them.

mod blocked;
mod decode;
mod lanes;
mod prefill;
mod simd;

use half::{bf16, f16, slice::HalfFloatSliceExt};

use crate::error::{ModelError, Result};
use crate::kv_format::{decode_blocks, KvFormat, BLOCK};

pub use prefill::{TILE_K, TILE_Q};

/// One layer's keys or values as the cache stores them.
#[derive(Debug, Clone, Copy)]
pub enum KvData<'a> {
    /// 32-bit floats.
    F32(&'a [f32]),
    /// IEEE half floats.
    F16(&'a [f16]),
    /// bfloat16.
    BF16(&'a [bf16]),
    /// llama.cpp's q8_0 blocks, as bytes (elements count the values they decode to; reads start
    /// and end on whole blocks).
    Q8_0(&'a [u8]),
    /// llama.cpp's q4_0 blocks, as bytes (as [`KvData::Q8_0`]).
    Q4_0(&'a [u8]),
}

impl KvData<'_> {
    fn len(&self) -> usize {
        match self {
            KvData::F32(s) => s.len(),
            KvData::F16(s) => s.len(),
            KvData::BF16(s) => s.len(),
            KvData::Q8_0(b) => b.len() / 34 * BLOCK,
            KvData::Q4_0(b) => b.len() / 18 * BLOCK,
        }
    }

    /// Whether the values are blocks that must be decoded before use.
    fn is_blocks(&self) -> bool {
        matches!(self, KvData::Q8_0(_) | KvData::Q4_0(_))
    }

    /// Widens `dst.len()` values starting at element `at` into `dst` (for blocks, `at` and
    /// the length are whole blocks: the cache's rows are).
    #[inline(always)]
    fn read(&self, at: usize, dst: &mut [f32]) {
        let n = dst.len();
        match self {
            KvData::Q8_0(b) => {
                let bytes = &b[at / BLOCK * 34..(at + n) / BLOCK * 34];
                decode_blocks(KvFormat::Q8_0, bytes, dst);
            }
            KvData::Q4_0(b) => {
                let bytes = &b[at / BLOCK * 18..(at + n) / BLOCK * 18];
                decode_blocks(KvFormat::Q4_0, bytes, dst);
            }
            KvData::F32(s) => dst.copy_from_slice(&s[at..at + n]),
            KvData::F16(s) => s[at..at + n].convert_to_f32_slice(dst),
            // A bf16 is the top half of an f32: a shift, which vectorizes (half's slice
            // conversion is an element loop with a NaN branch, and made prefill with a bf16
            // cache slower than with f32: docs/BENCHMARKS.md).
            KvData::BF16(s) => {
                for (d, x) in dst.iter_mut().zip(&s[at..at + n]) {
                    *d = f32::from_bits(u32::from(x.to_bits()) << 16);
                }
            }
        }
    }
}

/// Keys or values of every key/value head: head `h`'s row `j` is the `head_dim` values at
/// element `h * head_stride + j * head_dim` of `data`.
#[derive(Debug, Clone, Copy)]
pub struct KvHeads<'a> {
    /// The cache's storage.
    pub data: KvData<'a>,
    /// Elements from one key/value head to the next.
    pub head_stride: usize,
}

/// What one attention call computes.
#[derive(Debug, Clone, Copy)]
pub struct Shape<'a> {
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (divides `n_heads`).
    pub n_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Query rows per head (the new tokens).
    pub seq: usize,
    /// Position of the first query row; the keys are positions `0..pos + seq`.
    pub pos: usize,
    /// Scores are `q . k * scale`.
    pub scale: f32,
    /// Scores are soft-capped to `cap * tanh(s / cap)`.
    pub softcap: Option<f32>,
    /// A query sees only the last `window` positions (itself included).
    pub window: Option<usize>,
    /// One sink logit per query head (`n_heads` of them), if the layer has attention sinks.
    pub sinks: Option<&'a [f32]>,
}

/// The inputs of one call [`check`] accepted, as the schedules take them.
#[derive(Debug, Clone, Copy)]
struct Call<'a> {
    /// Queries, `[n_heads, seq, head_dim]`.
    q: &'a [f32],
    /// Keys and values of every key/value head.
    k: &'a KvHeads<'a>,
    v: &'a KvHeads<'a>,
    s: &'a Shape<'a>,
}

/// Writes the attention output of every query head to `out` (`[n_heads, seq, head_dim]`,
/// f32) for the queries `q` (same layout) against keys `k` and values `v`, with the fastest
/// inner loops this CPU runs.
pub fn attend(
    q: &[f32],
    k: KvHeads<'_>,
    v: KvHeads<'_>,
    shape: &Shape,
    out: &mut [f32],
) -> Result<()> {
    attend_with(Isa::detect(), q, k, v, shape, out)
}

/// [`attend`] with the inner loops of `isa` (which the CPU must run: see [`Isa::available`]).
pub(crate) fn attend_with(
    isa: Isa,
    q: &[f32],
    k: KvHeads<'_>,
    v: KvHeads<'_>,
    shape: &Shape,
    out: &mut [f32],
) -> Result<()> {
    check(q, &k, &v, shape, out)?;
    if shape.seq == 0 || shape.n_heads == 0 || shape.head_dim == 0 {
        return Ok(());
    }
    if !Isa::available().contains(&isa) {
        return Err(ModelError::Unsupported(format!(
            "CPU attention: this CPU cannot run the {isa:?} loops"
        )));
    }
    let call = Call {
        q,
        k: &k,
        v: &v,
        s: shape,
    };
    if shape.seq == 1 {
        decode::run(isa, call, out);
    } else if shape.seq <= ROW_BY_ROW {
        row_by_row(isa, call, out);
    } else {
        prefill::run(isa, call, out);
    }
    Ok(())
}

/// Query rows up to this many per head run one at a time through [`decode`], each as the
/// decode step at its position would run it, so a short chunk computes every position bit for
/// bit as decoding token by token does: what a speculative step's verification needs (the
/// logits after each proposed token are the ones decoding it would give).
pub const ROW_BY_ROW: usize = 16;

/// Runs each query row of `call` as a decode step at its position.
fn row_by_row(isa: Isa, call: Call<'_>, out: &mut [f32]) {
    let s = call.s;
    let d = s.head_dim;
    let mut q_row = vec![0f32; s.n_heads * d];
    let mut out_row = vec![0f32; s.n_heads * d];
    for i in 0..s.seq {
        for h in 0..s.n_heads {
            let at = (h * s.seq + i) * d;
            q_row[h * d..(h + 1) * d].copy_from_slice(&call.q[at..at + d]);
        }
        let shape = Shape {
            seq: 1,
            pos: s.pos + i,
            ..*s
        };
        let row = Call {
            q: &q_row,
            k: call.k,
            v: call.v,
            s: &shape,
        };
        decode::run(isa, row, &mut out_row);
        for h in 0..s.n_heads {
            let at = (h * s.seq + i) * d;
            out[at..at + d].copy_from_slice(&out_row[h * d..(h + 1) * d]);
        }
    }
}

/// Refuses inconsistent shapes and storage too short for them.
fn check(q: &[f32], k: &KvHeads<'_>, v: &KvHeads<'_>, s: &Shape, out: &[f32]) -> Result<()> {
    let bad = |what: String| Err(ModelError::Config(format!("CPU attention: {what}")));
    if s.n_kv_heads == 0 || !s.n_heads.is_multiple_of(s.n_kv_heads) {
        return bad(format!(
            "{} query heads cannot share {} key/value heads",
            s.n_heads, s.n_kv_heads
        ));
    }
    let q_len = s.n_heads * s.seq * s.head_dim;
    if q.len() != q_len || out.len() != q_len {
        return bad(format!(
            "{} query and {} output values for {q_len}",
            q.len(),
            out.len()
        ));
    }
    if s.window == Some(0) {
        return bad("a sliding window of 0 positions".into());
    }
    if (k.data.is_blocks() || v.data.is_blocks())
        && (!s.head_dim.is_multiple_of(BLOCK)
            || !k.head_stride.is_multiple_of(BLOCK)
            || !v.head_stride.is_multiple_of(BLOCK))
    {
        return bad(format!(
            "a block-format cache with heads of {} values (not whole {BLOCK}-value blocks)",
            s.head_dim
        ));
    }
    if let Some(sinks) = s.sinks.filter(|sinks| sinks.len() != s.n_heads) {
        return bad(format!(
            "{} attention sinks for {} heads",
            sinks.len(),
            s.n_heads
        ));
    }
    let kv_len = s.pos + s.seq;
    for (name, t) in [("key", k), ("value", v)] {
        let needed = (s.n_kv_heads - 1) * t.head_stride + kv_len * s.head_dim;
        if t.head_stride < kv_len * s.head_dim || t.data.len() < needed {
            return bad(format!(
                "{name} storage of {} values (head stride {}) for {kv_len} positions",
                t.data.len(),
                t.head_stride
            ));
        }
    }
    Ok(())
}

/// The instruction set the inner loops run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    /// AVX-512 F/BW/VL with FMA (and F16C for half-precision caches).
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// AVX2 with FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Plain Rust for the target's baseline (the reference the others are tested against).
    Baseline,
}

impl Isa {
    /// The fastest variant this CPU runs that the process's kernel choice allows (the
    /// `cpu_qmatmul` setting, [`crate::cpu_qmatmul::process_kernel`]): `avx2` and `avx-vnni`
    /// keep attention off AVX-512 too, so they run an AVX2-only CPU's whole path; `scalar`
    /// takes the baseline.
    pub(crate) fn detect() -> Self {
        Self::for_kernel(crate::cpu_qmatmul::process_kernel())
    }

    /// The fastest variant this CPU runs that `kernel` allows (see [`detect`](Self::detect)).
    pub(crate) fn for_kernel(kernel: crate::cpu_qmatmul::Kernel) -> Self {
        use crate::cpu_qmatmul::Kernel;
        let available = Self::available();
        match kernel {
            Kernel::Auto | Kernel::Avx512 => available[0],
            Kernel::Scalar => Isa::Baseline,
            #[cfg(target_arch = "x86_64")]
            Kernel::AvxVnni | Kernel::Avx2 => available
                .into_iter()
                .find(|&isa| isa != Isa::Avx512)
                .unwrap_or(Isa::Baseline),
            #[cfg(not(target_arch = "x86_64"))]
            Kernel::AvxVnni | Kernel::Avx2 => Isa::Baseline,
        }
    }

    /// Every variant this CPU runs, fastest first (the baseline last, always there).
    pub(crate) fn available() -> Vec<Self> {
        let mut isas = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            if avx2
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
            {
                isas.push(Isa::Avx512);
            }
            if avx2 {
                isas.push(Isa::Avx2);
            }
        }
        isas.push(Isa::Baseline);
        isas
    }
}

/// `e^x` for `x <= 0` to about 2 ulp, branch free so that loops over it vectorize (Cephes'
/// single-precision polynomial after reducing by powers of two); underflows to about 1e-38
/// instead of 0 below -87.
#[inline(always)]
fn exp_neg(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let x = x.max(-87.0);
    let n = (x * LOG2E + 0.5).floor();
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// The softmax denominator of a row of query head `head` whose running maximum and sum of
/// exponentials are `max` and `sum`: `sum`, plus `e^(sink - max)` when the head has a sink.
#[inline(always)]
fn denominator(s: &Shape<'_>, head: usize, max: f32, sum: f32) -> f32 {
    match s.sinks {
        None => sum,
        Some(sinks) => sum + (sinks[head] - max).exp(),
    }
}

/// The first position a query at `p` sees.
#[inline(always)]
fn first_visible(p: usize, window: Option<usize>) -> usize {
    window.map_or(0, |w| (p + 1).saturating_sub(w))
}

/// Scales one query row's raw dot products `scores` and soft-caps them, then folds them into
/// its running maximum and sum: on return `scores` holds `e^(s - max)` under the new maximum
/// and the returned factor is what the row's weighted sum of values must be multiplied by
/// (`e^(old max - new max)`) before those weights are added.
#[inline(always)]
fn online_softmax(s: &Shape, scores: &mut [f32], max: &mut f32, sum: &mut f32) -> f32 {
    for x in scores.iter_mut() {
        *x *= s.scale;
    }
    if let Some(cap) = s.softcap {
        for x in scores.iter_mut() {
            *x = (*x / cap).tanh() * cap;
        }
    }
    let tile_max = scores.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let new_max = max.max(tile_max);
    let correction = (*max - new_max).exp();
    *max = new_max;
    for x in scores.iter_mut() {
        *x = exp_neg(*x - new_max);
    }
    *sum = *sum * correction + scores.iter().sum::<f32>();
    correction
}

#[cfg(test)]
mod tests;
