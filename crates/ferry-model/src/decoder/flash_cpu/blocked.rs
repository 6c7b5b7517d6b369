//! The prefill task of the SIMD instruction sets ([`Lanes`]), register blocked with query rows
//! in the vector lanes: the task's rows (every query head of the group, [`TILE_Q`] rows each)
//! are cut into row vectors of [`Lanes::L`] rows, held transposed (`qt[v][c]` is column `c` of
//! the rows of row vector `v`, pre-multiplied by the scale). Per tile of [`TILE_K`] keys, the
//! key and value rows are widened to f32 once for the whole group, then
//! - the scores `S^T[v][j]` (a vector over rows per key) come from a micro-kernel that keeps up
//!   to [`Lanes::BLOCK`] row vectors by [`KEYS`] keys of sums in registers, one broadcast key
//!   element and one query vector load per multiply-add column;
//! - the online softmax runs per row vector (maximum, correction, [`Lanes::exp_neg`], sum all
//!   vectors, no horizontal reductions), the causal/window mask applied only in tiles that
//!   need it;
//! - the weighted values go into the transposed output `ot[v][c]` with a micro-kernel of up to
//!   [`Lanes::BLOCK`] row vectors by [`COLS`] columns (one broadcast value element per column).
//!
//! The output is divided by the sums and transposed back once per task.

use super::lanes::Lanes;
use super::prefill::{Task, TILE_K, TILE_Q};
use super::{denominator, first_visible, KvData, KvHeads, Shape};

/// Keys per step of the score micro-kernel.
const KEYS: usize = 4;
/// Output columns per step of the weighted-value micro-kernel.
const COLS: usize = 4;

/// Widens `dst.len()` cache values from element `at` into `dst`.
#[inline(always)]
unsafe fn widen<S: Lanes>(data: &KvData<'_>, at: usize, dst: &mut [f32]) {
    let n = dst.len();
    match data {
        KvData::F32(x) => dst.copy_from_slice(&x[at..at + n]),
        KvData::F16(x) => S::widen(&x[at..at + n], dst),
        KvData::BF16(x) => S::widen(&x[at..at + n], dst),
        KvData::Q8_0(_) | KvData::Q4_0(_) => data.read(at, dst),
    }
}

/// Runs `$f::<S, V>` for the `$nv` row vectors of one block (1..=4).
macro_rules! by_block {
    ($nv:expr, $f:ident, $($arg:expr),*) => {
        match $nv {
            1 => $f::<S, 1>($($arg),*),
            2 => $f::<S, 2>($($arg),*),
            3 => $f::<S, 3>($($arg),*),
            _ => $f::<S, 4>($($arg),*),
        }
    };
}

/// One task (see [`super::prefill`]) with the loops of `S`.
///
/// # Safety
/// The CPU must have `S`'s features; the shape passed [`super::check`].
#[inline(always)]
pub(super) unsafe fn task<S: Lanes>(
    q: &[f32],
    k: &KvHeads<'_>,
    v: &KvHeads<'_>,
    s: &Shape,
    mut task: Task<'_>,
) {
    let (d, l) = (s.head_dim, S::L);
    debug_assert!(TILE_Q.is_multiple_of(l) && S::BLOCK <= 4);
    let group = task.outs.len();
    let rows = task.outs[0].len() / d;
    let subs = TILE_Q / l;
    let nv = group * subs;
    let p_first = s.pos + task.first;
    let hi = p_first + rows;
    // The last row position of the tile (padding lanes included): every row sees key `t0` when
    // `t0 >= first_visible(p_last)`.
    let p_last = p_first + TILE_Q - 1;

    let mut qt = vec![0f32; nv * d * l];
    let mut ot = vec![0f32; nv * d * l];
    let mut kw = vec![0f32; TILE_K * d];
    let mut vw = vec![0f32; TILE_K * d];
    let mut st = vec![0f32; nv * TILE_K * l];
    // Running maximum (f32::MIN before any key: no infinities, so no NaN from -inf - -inf),
    // sum and the tile's correction per row, lane-major like the row vectors.
    let mut max = vec![f32::MIN; nv * l];
    let mut sum = vec![0f32; nv * l];
    let mut corr = vec![0f32; nv * l];

    for g in 0..group {
        let head = task.kv_head * group + g;
        let q0 = (head * s.seq + task.first) * d;
        for (r, row) in q[q0..q0 + rows * d].chunks_exact(d).enumerate() {
            let (vi, lane) = (g * subs + r / l, r % l);
            for (c, &x) in row.iter().enumerate() {
                qt[(vi * d + c) * l + lane] = x * s.scale;
            }
        }
    }

    let mut t0 = first_visible(p_first, s.window);
    while t0 < hi {
        let t1 = (t0 + TILE_K).min(hi);
        let n = t1 - t0;
        let n_pad = n.div_ceil(KEYS) * KEYS;
        for j in 0..n {
            let at = task.kv_head * k.head_stride + (t0 + j) * d;
            widen::<S>(&k.data, at, &mut kw[j * d..(j + 1) * d]);
            let at = task.kv_head * v.head_stride + (t0 + j) * d;
            widen::<S>(&v.data, at, &mut vw[j * d..(j + 1) * d]);
        }
        kw[n * d..n_pad * d].fill(0.0);

        let mut v0 = 0;
        while v0 < nv {
            let nb = S::BLOCK.min(nv - v0);
            let (qp, sp) = (
                qt.as_ptr().add(v0 * d * l),
                st.as_mut_ptr().add(v0 * TILE_K * l),
            );
            by_block!(nb, scores, qp, kw.as_ptr(), d, n_pad, sp);
            v0 += nb;
        }
        if let Some(cap) = s.softcap {
            for x in st.iter_mut() {
                *x = (*x / cap).tanh() * cap;
            }
        }
        let full = n == n_pad && t1 <= p_first + 1 && t0 >= first_visible(p_last, s.window);
        if !full {
            for (vi, scores) in st.chunks_exact_mut(TILE_K * l).enumerate() {
                let p0 = p_first + (vi % subs) * l;
                for (j, lanes) in scores.chunks_exact_mut(l).take(n_pad).enumerate() {
                    let kp = t0 + j;
                    for (lane, x) in lanes.iter_mut().enumerate() {
                        let p = p0 + lane;
                        if j >= n || kp > p || kp < first_visible(p, s.window) {
                            *x = f32::NEG_INFINITY;
                        }
                    }
                }
            }
        }
        for vi in 0..nv {
            softmax::<S>(
                st.as_mut_ptr().add(vi * TILE_K * l),
                n_pad,
                max.as_mut_ptr().add(vi * l),
                sum.as_mut_ptr().add(vi * l),
                corr.as_mut_ptr().add(vi * l),
            );
        }

        let mut v0 = 0;
        while v0 < nv {
            let nb = S::BLOCK.min(nv - v0);
            let (sp, op) = (
                st.as_ptr().add(v0 * TILE_K * l),
                ot.as_mut_ptr().add(v0 * d * l),
            );
            let cp = corr.as_ptr().add(v0 * l);
            let mut c = 0;
            while c + COLS <= d {
                by_block!(nb, weighted, sp, vw.as_ptr(), d, n, op, cp, c, COLS);
                c += COLS;
            }
            while c < d {
                by_block!(nb, weighted, sp, vw.as_ptr(), d, n, op, cp, c, 1);
                c += 1;
            }
            v0 += nb;
        }
        t0 = t1;
    }

    for (g, out) in task.outs.iter_mut().enumerate() {
        let head = task.kv_head * (s.n_heads / s.n_kv_heads) + g;
        for (r, row) in out.chunks_exact_mut(d).enumerate() {
            let (vi, lane) = (g * subs + r / l, r % l);
            let at = vi * l + lane;
            let inv = 1.0 / denominator(s, head, max[at], sum[at]);
            for (c, o) in row.iter_mut().enumerate() {
                *o = ot[(vi * d + c) * l + lane] * inv;
            }
        }
    }
}

/// `st[v][j] = qt[v] . key_j` for the `V` row vectors at `qt` (`[V][d][L]`) and the `n_pad`
/// (a multiple of [`KEYS`]) widened keys at `kw` (`[n_pad][d]`), into `st` (`[V][TILE_K][L]`).
#[inline(always)]
unsafe fn scores<S: Lanes, const V: usize>(
    qt: *const f32,
    kw: *const f32,
    d: usize,
    n_pad: usize,
    st: *mut f32,
) {
    let l = S::L;
    let mut j = 0;
    while j < n_pad {
        let mut acc = [[S::zero(); KEYS]; V];
        let kj = kw.add(j * d);
        for c in 0..d {
            let mut b = [S::zero(); KEYS];
            for (i, x) in b.iter_mut().enumerate() {
                *x = S::splat_at(kj.add(i * d + c));
            }
            for (vb, a) in acc.iter_mut().enumerate() {
                let qv = S::load(qt.add((vb * d + c) * l));
                for (x, &y) in a.iter_mut().zip(&b) {
                    *x = S::fma(qv, y, *x);
                }
            }
        }
        for (vb, a) in acc.iter().enumerate() {
            for (i, &x) in a.iter().enumerate() {
                S::store(st.add((vb * TILE_K + j + i) * l), x);
            }
        }
        j += KEYS;
    }
}

/// One row vector's online softmax over its `n` scores at `st` (masked ones `-inf`): updates
/// the running maximum and sum, writes the correction of the earlier output to `corr` and
/// replaces the scores by their weights `e^(s - max)`.
#[inline(always)]
unsafe fn softmax<S: Lanes>(st: *mut f32, n: usize, max: *mut f32, sum: *mut f32, corr: *mut f32) {
    let l = S::L;
    let old = S::load(max);
    let mut m = old;
    for j in 0..n {
        m = S::max(m, S::load(st.add(j * l)));
    }
    let c = S::exp_neg(S::sub(old, m));
    let mut total = S::zero();
    for j in 0..n {
        let p = S::exp_neg(S::sub(S::load(st.add(j * l)), m));
        S::store(st.add(j * l), p);
        total = S::add(total, p);
    }
    S::store(max, m);
    S::store(corr, c);
    S::store(sum, S::fma(S::load(sum), c, total));
}

/// `ot[v][c + i] = ot[v][c + i] * corr[v] + sum_j st[v][j] * value_j[c + i]` for the `V` row
/// vectors at `ot` (`[V][d][L]`, weights `st` `[V][TILE_K][L]`, corrections `corr` `[V][L]`)
/// and columns `c..c + cols` (`cols` is [`COLS`] or 1), over the `n` widened values at `vw`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn weighted<S: Lanes, const V: usize>(
    st: *const f32,
    vw: *const f32,
    d: usize,
    n: usize,
    ot: *mut f32,
    corr: *const f32,
    c: usize,
    cols: usize,
) {
    if cols == COLS {
        weighted_cols::<S, V, COLS>(st, vw, d, n, ot, corr, c);
    } else {
        weighted_cols::<S, V, 1>(st, vw, d, n, ot, corr, c);
    }
}

/// [`weighted`] for `C` columns.
#[inline(always)]
unsafe fn weighted_cols<S: Lanes, const V: usize, const C: usize>(
    st: *const f32,
    vw: *const f32,
    d: usize,
    n: usize,
    ot: *mut f32,
    corr: *const f32,
    c: usize,
) {
    let l = S::L;
    let mut acc = [[S::zero(); C]; V];
    for (vb, a) in acc.iter_mut().enumerate() {
        let f = S::load(corr.add(vb * l));
        for (i, x) in a.iter_mut().enumerate() {
            *x = S::mul(S::load(ot.add((vb * d + c + i) * l)), f);
        }
    }
    for j in 0..n {
        let mut b = [S::zero(); C];
        for (i, x) in b.iter_mut().enumerate() {
            *x = S::splat_at(vw.add(j * d + c + i));
        }
        for (vb, a) in acc.iter_mut().enumerate() {
            let p = S::load(st.add((vb * TILE_K + j) * l));
            for (x, &y) in a.iter_mut().zip(&b) {
                *x = S::fma(p, y, *x);
            }
        }
    }
    for (vb, a) in acc.iter().enumerate() {
        for (i, &x) in a.iter().enumerate() {
            S::store(ot.add((vb * d + c + i) * l), x);
        }
    }
}
