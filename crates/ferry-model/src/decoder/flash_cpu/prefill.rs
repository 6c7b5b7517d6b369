//! The prefill schedule of [`super::attend`] (several query rows per head): each task takes
//! one key/value head and a tile of [`TILE_Q`] query rows of every query head of its group,
//! walks the keys those rows may see in tiles of [`TILE_K`] (read and transposed once for the
//! whole group) and keeps a running softmax per row, so the memory per task stays a few
//! tiles. The SIMD instruction sets run the register-blocked task of [`super::blocked`]; the
//! baseline runs [`tile`] here, plain loops (the reference the others are tested against).

use rayon::prelude::*;

use super::{denominator, first_visible, online_softmax, Call, Isa, KvHeads, Shape};

/// Query rows per head per task.
pub const TILE_Q: usize = 16;
/// Keys per tile.
pub const TILE_K: usize = 64;
/// Below this many (query row, key) pairs over all heads a call runs on the calling thread.
const PARALLEL_MIN: usize = 1 << 14;

/// Runs every task of a call whose shape [`super::check`] accepted.
pub(super) fn run(isa: Isa, call: Call<'_>, out: &mut [f32]) {
    let Call { q, k, v, s } = call;
    let (d, seq) = (s.head_dim, s.seq);
    let group = s.n_heads / s.n_kv_heads;
    let tiles = seq.div_ceil(TILE_Q);
    // Each head's output rows cut into tiles; task (kv head, tile) takes that tile of every
    // query head of the group.
    let mut per_head: Vec<_> = out
        .chunks_mut(seq * d)
        .map(|o| o.chunks_mut(TILE_Q * d))
        .collect();
    let mut tasks = Vec::with_capacity(s.n_kv_heads * tiles);
    for kv_head in 0..s.n_kv_heads {
        let heads = &mut per_head[kv_head * group..(kv_head + 1) * group];
        for t in 0..tiles {
            let outs: Vec<&mut [f32]> = heads.iter_mut().filter_map(|h| h.next()).collect();
            tasks.push(Task {
                kv_head,
                first: t * TILE_Q,
                outs,
            });
        }
    }
    let run = |task: Task<'_>| match isa {
        // SAFETY: `attend_with` runs an `Isa` only when the CPU has its features.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { tile_avx512(q, k, v, s, task) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { tile_avx2(q, k, v, s, task) },
        Isa::Baseline => tile::<false>(q, k, v, s, task),
    };
    if s.n_heads * seq * (s.pos + seq) >= PARALLEL_MIN {
        tasks.into_par_iter().for_each(run);
    } else {
        tasks.into_iter().for_each(run);
    }
}

/// One key/value head's tile of query rows (of every query head of its group) and where
/// their outputs go.
pub(super) struct Task<'a> {
    pub(super) kv_head: usize,
    /// First query row of the tile.
    pub(super) first: usize,
    /// `[rows, head_dim]` of the output, per query head of the group.
    pub(super) outs: Vec<&'a mut [f32]>,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn tile_avx512(q: &[f32], k: &KvHeads<'_>, v: &KvHeads<'_>, s: &Shape, task: Task<'_>) {
    super::blocked::task::<super::lanes::Avx512>(q, k, v, s, task)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile_avx2(q: &[f32], k: &KvHeads<'_>, v: &KvHeads<'_>, s: &Shape, task: Task<'_>) {
    super::blocked::task::<super::lanes::Avx2>(q, k, v, s, task)
}

/// One task: the tile's query rows of every head of the group against every key they may
/// see, online softmax per row.
#[inline(always)]
fn tile<const FMA: bool>(
    q: &[f32],
    k: &KvHeads<'_>,
    v: &KvHeads<'_>,
    s: &Shape,
    mut task: Task<'_>,
) {
    let d = s.head_dim;
    let group = task.outs.len();
    let rows = task.outs[0].len() / d;
    let kv_head = task.kv_head;
    let p_first = s.pos + task.first;
    let lo = first_visible(p_first, s.window);
    let hi = p_first + rows;

    // Running maximum and sum of exponentials per (head, row); the output rows hold the
    // weighted sum of values until the end.
    let mut max = vec![f32::NEG_INFINITY; group * TILE_Q];
    let mut sum = vec![0f32; group * TILE_Q];
    for out in task.outs.iter_mut() {
        out.fill(0.0);
    }
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
        let range = |r: usize| {
            let p = p_first + r;
            let a = first_visible(p, s.window).max(t0);
            let b = (p + 1).min(t1);
            (a < b).then(|| (a - t0, b - t0))
        };
        for (g, acc) in task.outs.iter_mut().enumerate() {
            let head = kv_head * group + g;
            let q0 = (head * s.seq + task.first) * d;
            let q = &q[q0..q0 + rows * d];
            // Query rows two at a time share the loads of the key tile; each then takes its
            // own visible keys.
            let mut r = 0;
            while r < rows {
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
                let at = g * TILE_Q + r;
                match (first, second) {
                    // Both rows see the same keys (every tile but the diagonal one): one pass
                    // over the value rows serves both.
                    (Some((a, b)), Some(same)) if same == (a, b) => {
                        let (o0, o1) = acc[r * d..(r + 2) * d].split_at_mut(d);
                        let (w0, w1) = (&mut scores[a..b], &mut scores2[a..b]);
                        let c0 = online_softmax(s, w0, &mut max[at], &mut sum[at]);
                        let c1 = online_softmax(s, w1, &mut max[at + 1], &mut sum[at + 1]);
                        rescale(o0, c0);
                        rescale(o1, c1);
                        add_weighted2::<FMA>([o0, o1], [w0, w1], &vt[a * d..b * d]);
                    }
                    _ => {
                        let rows = [(r, first, &mut scores), (r + 1, second, &mut scores2)];
                        for (i, range, scores) in rows {
                            if let Some((a, b)) = range {
                                let out = &mut acc[i * d..(i + 1) * d];
                                let at = g * TILE_Q + i;
                                let state = (&mut max[at], &mut sum[at]);
                                absorb::<FMA>(s, &mut scores[a..b], state, out, &vt[a * d..b * d]);
                            }
                        }
                    }
                }
                r += 2;
            }
        }
        t0 = t1;
    }
    for (g, acc) in task.outs.iter_mut().enumerate() {
        let head = kv_head * (s.n_heads / s.n_kv_heads) + g;
        for (r, out) in acc.chunks_exact_mut(d).enumerate() {
            let at = g * TILE_Q + r;
            let inv = 1.0 / denominator(s, head, max[at], sum[at]);
            for o in out.iter_mut() {
                *o *= inv;
            }
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
    let correction = online_softmax(s, scores, max, sum);
    rescale(out, correction);
    add_weighted::<FMA>(out, scores, values);
}

/// `out *= factor` (skipped when the running maximum did not move).
#[inline(always)]
fn rescale(out: &mut [f32], factor: f32) {
    if factor != 1.0 {
        for o in out.iter_mut() {
            *o *= factor;
        }
    }
}

/// [`add_weighted`] of two output rows with their own weights over the same value rows (each
/// value loaded once for both).
#[inline(always)]
fn add_weighted2<const FMA: bool>(out: [&mut [f32]; 2], w: [&[f32]; 2], rows: &[f32]) {
    let [o0, o1] = out;
    let d = o0.len();
    let (mut w0, mut w1) = (w[0].chunks_exact(4), w[1].chunks_exact(4));
    let mut vs = rows.chunks_exact(4 * d);
    for ((a, b), v4) in (&mut w0).zip(&mut w1).zip(&mut vs) {
        let (v0, rest) = v4.split_at(d);
        let (v1, rest) = rest.split_at(d);
        let (v2, v3) = rest.split_at(d);
        for (c, (x, y)) in o0.iter_mut().zip(o1.iter_mut()).enumerate() {
            let p = madd::<FMA>(a[1], v1[c], madd::<FMA>(a[0], v0[c], *x));
            *x = madd::<FMA>(a[3], v3[c], madd::<FMA>(a[2], v2[c], p));
            let q = madd::<FMA>(b[1], v1[c], madd::<FMA>(b[0], v0[c], *y));
            *y = madd::<FMA>(b[3], v3[c], madd::<FMA>(b[2], v2[c], q));
        }
    }
    let rest = w0.remainder().iter().zip(w1.remainder());
    for ((&a, &b), v) in rest.zip(vs.remainder().chunks_exact(d)) {
        for ((x, y), &v) in o0.iter_mut().zip(o1.iter_mut()).zip(v) {
            *x = madd::<FMA>(a, v, *x);
            *y = madd::<FMA>(b, v, *y);
        }
    }
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
