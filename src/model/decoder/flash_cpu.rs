//! Causal attention on the CPU in tiles, flash-attention style: each task takes one query head
//! and a tile of [`TILE_Q`] query rows, walks the keys it may see in tiles of [`TILE_K`] and
//! keeps a running (online) softmax per row (the row's maximum so far, its sum of
//! exponentials and its weighted sum of values, rescaled when the maximum grows), so no
//! `[queries, keys]` score matrix is ever built and the memory per task stays a few tiles.
//!
//! The API is plain slices: queries and the output are f32 `[heads, seq, head_dim]`; keys and
//! values are read in place from the cache in its dtype (f32, f16 or bf16, widened to f32 one
//! tile at a time) as `[kv_heads, .., head_dim]` rows. Query head `h` reads key/value head
//! `h / (heads / kv_heads)` (grouped-query attention). Query row `i` is at position
//! `pos + i` and sees keys `j <= pos + i`, and only the last `window` of them when a sliding
//! window is set; scores are `q . k * scale`, soft-capped to `cap * tanh(s / cap)` when a cap
//! is set (Gemma 2).
//!
//! Tasks run on rayon's pool once the step is large enough. The inner loops are written so
//! the compiler vectorizes them, and are compiled twice (AVX2 + FMA, baseline) with the
//! variant picked at run time from the CPU's features. (An AVX-512 variant needs Rust 1.89,
//! past this crate's MSRV.)

use half::{bf16, f16, slice::HalfFloatSliceExt};
use rayon::prelude::*;

use crate::model::error::{ModelError, Result};

/// Query rows per task.
pub const TILE_Q: usize = 16;
/// Keys per tile.
pub const TILE_K: usize = 64;
/// Below this many (query row, key) pairs over all heads a call runs on the calling thread.
const PARALLEL_MIN: usize = 1 << 14;

/// One layer's keys or values as the cache stores them.
#[derive(Debug, Clone, Copy)]
pub enum KvData<'a> {
    /// 32-bit floats.
    F32(&'a [f32]),
    /// IEEE half floats.
    F16(&'a [f16]),
    /// bfloat16.
    BF16(&'a [bf16]),
}

impl KvData<'_> {
    fn len(&self) -> usize {
        match self {
            KvData::F32(s) => s.len(),
            KvData::F16(s) => s.len(),
            KvData::BF16(s) => s.len(),
        }
    }

    /// Widens `dst.len()` values starting at element `at` into `dst`.
    #[inline(always)]
    fn read(&self, at: usize, dst: &mut [f32]) {
        let n = dst.len();
        match self {
            KvData::F32(s) => dst.copy_from_slice(&s[at..at + n]),
            KvData::F16(s) => s[at..at + n].convert_to_f32_slice(dst),
            KvData::BF16(s) => s[at..at + n].convert_to_f32_slice(dst),
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
pub struct Shape {
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
}

/// Writes the attention output of every query head to `out` (`[n_heads, seq, head_dim]`,
/// f32) for the queries `q` (same layout) against keys `k` and values `v`.
pub fn attend(
    q: &[f32],
    k: KvHeads<'_>,
    v: KvHeads<'_>,
    shape: &Shape,
    out: &mut [f32],
) -> Result<()> {
    check(q, &k, &v, shape, out)?;
    let Shape {
        n_heads,
        head_dim,
        seq,
        ..
    } = *shape;
    if seq == 0 || n_heads == 0 || head_dim == 0 {
        return Ok(());
    }
    let isa = Isa::detect();
    let mut tasks = Vec::with_capacity(n_heads * seq.div_ceil(TILE_Q));
    for (head, out) in out.chunks_mut(seq * head_dim).enumerate() {
        for (t, out) in out.chunks_mut(TILE_Q * head_dim).enumerate() {
            tasks.push(Task {
                head,
                first: t * TILE_Q,
                out,
            });
        }
    }
    let run = |task: Task<'_>| isa.run(q, &k, &v, shape, task);
    if n_heads * seq * (shape.pos + seq) >= PARALLEL_MIN {
        tasks.into_par_iter().for_each(run);
    } else {
        tasks.into_iter().for_each(run);
    }
    Ok(())
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

/// One query head's tile of query rows and where its output goes.
struct Task<'a> {
    head: usize,
    /// First query row of the tile.
    first: usize,
    /// `[rows, head_dim]` of the output.
    out: &'a mut [f32],
}

/// The instruction set the inner loops were compiled for.
#[derive(Debug, Clone, Copy)]
enum Isa {
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Baseline,
}

impl Isa {
    fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
        }
        Isa::Baseline
    }

    fn run(self, q: &[f32], k: &KvHeads<'_>, v: &KvHeads<'_>, s: &Shape, task: Task<'_>) {
        match self {
            // SAFETY: `detect` chose it only when the CPU has the features.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => unsafe { tile_avx2(q, k, v, s, task) },
            Isa::Baseline => tile::<false>(q, k, v, s, task),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2(q: &[f32], k: &KvHeads<'_>, v: &KvHeads<'_>, s: &Shape, task: Task<'_>) {
    tile::<true>(q, k, v, s, task)
}

/// `a * b + c`, fused where the caller was compiled with FMA (`FMA`), else plain (a fused
/// multiply-add without the instruction is a slow library call).
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
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

/// The first position a query at `p` sees.
#[inline(always)]
fn first_visible(p: usize, window: Option<usize>) -> usize {
    window.map_or(0, |w| (p + 1).saturating_sub(w))
}

/// One task: the tile's query rows against every key they may see, online softmax per row.
#[inline(always)]
fn tile<const FMA: bool>(q: &[f32], k: &KvHeads<'_>, v: &KvHeads<'_>, s: &Shape, task: Task<'_>) {
    let d = s.head_dim;
    let rows = task.out.len() / d;
    let kv_head = task.head / (s.n_heads / s.n_kv_heads);
    let q0 = (task.head * s.seq + task.first) * d;
    let q = &q[q0..q0 + rows * d];
    let p_first = s.pos + task.first;
    let lo = first_visible(p_first, s.window);
    let hi = p_first + rows;

    // Running maximum and sum of exponentials per row; the output rows hold the weighted
    // sum of values until the end.
    let mut max = [f32::NEG_INFINITY; TILE_Q];
    let mut sum = [0f32; TILE_Q];
    let acc = &mut *task.out;
    acc.fill(0.0);
    // The key tile transposed (`kt[c * TILE_K + j]` is column `c` of key `j`), so the scores of
    // one query row against the whole tile are `TILE_K`-wide multiply-adds; the value tile
    // as rows.
    let mut kt = vec![0f32; d * TILE_K];
    let mut vt = vec![0f32; TILE_K * d];
    let mut krow = vec![0f32; d];
    let mut scores = [0f32; TILE_K];
    let mut scores2 = [0f32; TILE_K];

    let mut t0 = lo;
    while t0 < hi {
        let t1 = (t0 + TILE_K).min(hi);
        let n = t1 - t0;
        for j in 0..n {
            let at = kv_head * k.head_stride + (t0 + j) * d;
            k.data.read(at, &mut krow);
            for (c, &x) in krow.iter().enumerate() {
                kt[c * TILE_K + j] = x;
            }
            let at = kv_head * v.head_stride + (t0 + j) * d;
            v.data.read(at, &mut vt[j * d..(j + 1) * d]);
        }
        // Query rows two at a time share the loads of the key tile; each then takes its own
        // visible keys.
        let mut r = 0;
        while r < rows {
            let range = |r: usize| {
                let p = p_first + r;
                let a = first_visible(p, s.window).max(t0);
                let b = (p + 1).min(t1);
                (a < b).then(|| (a - t0, b - t0))
            };
            let (first, second) = (range(r), range(r + 1).filter(|_| r + 1 < rows));
            match (first.is_some(), second.is_some()) {
                (_, true) => row_scores2::<FMA>(
                    [&q[r * d..(r + 1) * d], &q[(r + 1) * d..(r + 2) * d]],
                    &kt,
                    &mut scores,
                    &mut scores2,
                ),
                (true, false) => row_scores::<FMA>(&q[r * d..(r + 1) * d], &kt, &mut scores),
                (false, false) => {}
            }
            for (i, range, scores) in [(r, first, &mut scores), (r + 1, second, &mut scores2)] {
                if let Some((a, b)) = range {
                    let out = &mut acc[i * d..(i + 1) * d];
                    let state = (&mut max[i], &mut sum[i]);
                    absorb::<FMA>(s, &mut scores[a..b], state, out, &vt[a * d..b * d]);
                }
            }
            r += 2;
        }
        t0 = t1;
    }
    for (r, out) in acc.chunks_exact_mut(d).enumerate() {
        let inv = 1.0 / sum[r];
        for o in out.iter_mut() {
            *o *= inv;
        }
    }
}

/// Folds one query row's scores against visible keys (`scores`, raw dot products) and those
/// keys' value rows into its running maximum, sum and weighted output `out`.
#[inline(always)]
fn absorb<const FMA: bool>(
    s: &Shape,
    scores: &mut [f32],
    (max, sum): (&mut f32, &mut f32),
    out: &mut [f32],
    values: &[f32],
) {
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
    if correction != 1.0 {
        for o in out.iter_mut() {
            *o *= correction;
        }
    }
    add_weighted::<FMA>(out, scores, values);
}

/// [`row_scores`] of two query rows at once (each key column loaded once for both).
#[inline(always)]
fn row_scores2<const FMA: bool>(
    q: [&[f32]; 2],
    kt: &[f32],
    s0: &mut [f32; TILE_K],
    s1: &mut [f32; TILE_K],
) {
    *s0 = [0.0; TILE_K];
    *s1 = [0.0; TILE_K];
    let mut cols = kt.chunks_exact(TILE_K);
    let (mut q0, mut q1) = (q[0].chunks_exact(4), q[1].chunks_exact(4));
    for (a, b) in (&mut q0).zip(&mut q1) {
        let (c0, c1, c2, c3) = match (cols.next(), cols.next(), cols.next(), cols.next()) {
            (Some(c0), Some(c1), Some(c2), Some(c3)) => (c0, c1, c2, c3),
            _ => return,
        };
        for j in 0..TILE_K {
            let x = madd::<FMA>(a[0], c0[j], s0[j]);
            let y = madd::<FMA>(b[0], c0[j], s1[j]);
            let x = madd::<FMA>(a[1], c1[j], x);
            let y = madd::<FMA>(b[1], c1[j], y);
            let x = madd::<FMA>(a[2], c2[j], x);
            let y = madd::<FMA>(b[2], c2[j], y);
            s0[j] = madd::<FMA>(a[3], c3[j], x);
            s1[j] = madd::<FMA>(b[3], c3[j], y);
        }
    }
    for ((&a, &b), col) in q0.remainder().iter().zip(q1.remainder()).zip(cols) {
        for ((x, y), &kc) in s0.iter_mut().zip(s1.iter_mut()).zip(col) {
            *x = madd::<FMA>(a, kc, *x);
            *y = madd::<FMA>(b, kc, *y);
        }
    }
}

/// `scores[j] = q . key_j` for the `TILE_K` keys of a transposed tile `kt`.
#[inline(always)]
fn row_scores<const FMA: bool>(q: &[f32], kt: &[f32], scores: &mut [f32; TILE_K]) {
    *scores = [0.0; TILE_K];
    let mut cols = kt.chunks_exact(TILE_K);
    let mut qs = q.chunks_exact(4);
    for q4 in &mut qs {
        let (c0, c1, c2, c3) = match (cols.next(), cols.next(), cols.next(), cols.next()) {
            (Some(c0), Some(c1), Some(c2), Some(c3)) => (c0, c1, c2, c3),
            _ => return,
        };
        for j in 0..TILE_K {
            let s = madd::<FMA>(q4[0], c0[j], scores[j]);
            let s = madd::<FMA>(q4[1], c1[j], s);
            let s = madd::<FMA>(q4[2], c2[j], s);
            scores[j] = madd::<FMA>(q4[3], c3[j], s);
        }
    }
    for (&qc, col) in qs.remainder().iter().zip(cols) {
        for (s, &kc) in scores.iter_mut().zip(col) {
            *s = madd::<FMA>(qc, kc, *s);
        }
    }
}

/// `out += sum_j w[j] * rows[j]` for value rows of `out.len()` values.
#[inline(always)]
fn add_weighted<const FMA: bool>(out: &mut [f32], w: &[f32], rows: &[f32]) {
    let d = out.len();
    let mut ws = w.chunks_exact(4);
    let mut vs = rows.chunks_exact(4 * d);
    for (w4, v4) in (&mut ws).zip(&mut vs) {
        let (v0, rest) = v4.split_at(d);
        let (v1, rest) = rest.split_at(d);
        let (v2, v3) = rest.split_at(d);
        for (c, o) in out.iter_mut().enumerate() {
            let x = madd::<FMA>(w4[0], v0[c], *o);
            let x = madd::<FMA>(w4[1], v1[c], x);
            let x = madd::<FMA>(w4[2], v2[c], x);
            *o = madd::<FMA>(w4[3], v3[c], x);
        }
    }
    for (&wj, vj) in ws.remainder().iter().zip(vs.remainder().chunks_exact(d)) {
        for (o, &x) in out.iter_mut().zip(vj) {
            *o = madd::<FMA>(wj, x, *o);
        }
    }
}

#[cfg(test)]
#[path = "flash_cpu_tests.rs"]
mod tests;
