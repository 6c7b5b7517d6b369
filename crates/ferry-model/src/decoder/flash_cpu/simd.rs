//! The decode schedule's three inner loops, per instruction set ([`Kernel`]): the dot products
//! of a few query rows with a run of key rows, the online softmax of a row of scores, and the
//! weighted sums of a run of value rows into a few output rows. Key and value rows are read in
//! the cache's dtype ([`Elem`]) and widened to f32 in registers (F16C's `vcvtph2ps`, a shift for
//! bf16). [`Scalar`] is the reference. [`Avx2`] and [`Avx512`] take the keys a register's
//! lanes at a time (8 or 16 rows, widened once into a scratch block for the whole group): one
//! sum vector per key, then a tree of lane permutes and adds ([`fold_avx2`], [`fold_avx512`])
//! turns the block's vectors into one vector holding one score per lane, with no horizontal
//! sum per key (keys past the last whole block take one each); the softmax runs on vectors
//! with [`super::lanes`]' `e^x`; the weighted sums keep each value vector in a register for up
//! to four query rows at once.

use half::{bf16, f16};

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::exp_neg;
#[cfg(target_arch = "x86_64")]
use super::lanes::Lanes;
use super::{online_softmax, Shape};

/// Query rows one pass over the keys or values serves.
const ROWS: usize = 4;

/// An element type of the cache.
pub(super) trait Elem: Copy + Send + Sync + 'static {
    /// The value as f32.
    fn to_f32(self) -> f32;
    /// Eight values from `p` widened to f32.
    ///
    /// # Safety
    /// `p` must point to 8 readable values and the CPU must have AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> __m256;
    /// Sixteen values from `p` widened to f32.
    ///
    /// # Safety
    /// `p` must point to 16 readable values and the CPU must have AVX-512 F.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> __m512;
}

impl Elem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        _mm512_loadu_ps(p)
    }
}

impl Elem for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
    }
}

impl Elem for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> __m256 {
        let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(wide))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> __m512 {
        let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(wide))
    }
}

/// Key rows the SIMD kernels' dot products widen at once (one register's lanes of them): the
/// scratch [`Kernel::dots`] takes holds this many rows.
pub(super) const KEY_BLOCK: usize = 16;

/// The inner loops of one instruction set. Rows are `d` wide; `q` holds `rows` query rows,
/// `keys` and `values` hold `n` rows; `scores` and the weights `w` hold row `r`'s `n` values
/// at `r * stride`; `acc` holds output row `r` at `r * acc_stride`.
pub(super) trait Kernel {
    /// `scores[r * stride + j] = q_r . key_j`, with `scratch` (at least [`KEY_BLOCK`] rows) to
    /// widen key rows into.
    ///
    /// # Safety
    /// The CPU must have the kernel's features.
    #[allow(clippy::too_many_arguments)]
    unsafe fn dots<T: Elem>(
        q: &[f32],
        rows: usize,
        keys: &[T],
        d: usize,
        scores: &mut [f32],
        stride: usize,
        scratch: &mut [f32],
    );

    /// [`super::online_softmax`] of one row of raw dot products (the same result up to the
    /// order of the sums).
    ///
    /// # Safety
    /// The CPU must have the kernel's features.
    unsafe fn softmax(s: &Shape, scores: &mut [f32], max: &mut f32, sum: &mut f32) -> f32;

    /// `acc_r += sum_j w[r * stride + j] * value_j`.
    ///
    /// # Safety
    /// The CPU must have the kernel's features.
    unsafe fn weighted<T: Elem>(
        w: &[f32],
        stride: usize,
        rows: usize,
        values: &[T],
        d: usize,
        acc: &mut [f32],
        acc_stride: usize,
    );
}

/// Refuses slices too short for the rows the raw-pointer loops will touch.
#[inline(always)]
fn check_dots<T>(q: &[f32], rows: usize, keys: &[T], d: usize, scores: &[f32], stride: usize) {
    let n = keys.len() / d;
    assert!(rows > 0 && d > 0 && n <= stride && keys.len() == n * d);
    assert!(q.len() >= rows * d && scores.len() >= (rows - 1) * stride + n);
}

#[inline(always)]
fn check_weighted<T>(w: &[f32], stride: usize, rows: usize, values: &[T], d: usize, acc: &[f32]) {
    let n = values.len() / d;
    assert!(rows > 0 && d > 0 && n <= stride && values.len() == n * d);
    assert!(w.len() >= (rows - 1) * stride + n);
    let _ = acc;
}

/// Plain loops: the reference, and what CPUs without AVX2 run.
pub(super) struct Scalar;

impl Kernel for Scalar {
    #[inline(always)]
    unsafe fn dots<T: Elem>(
        q: &[f32],
        rows: usize,
        keys: &[T],
        d: usize,
        scores: &mut [f32],
        stride: usize,
        _scratch: &mut [f32],
    ) {
        check_dots(q, rows, keys, d, scores, stride);
        for (j, key) in keys.chunks_exact(d).enumerate() {
            for r in 0..rows {
                let q = &q[r * d..(r + 1) * d];
                scores[r * stride + j] = q.iter().zip(key).map(|(&a, &b)| a * b.to_f32()).sum();
            }
        }
    }

    #[inline(always)]
    unsafe fn softmax(s: &Shape, scores: &mut [f32], max: &mut f32, sum: &mut f32) -> f32 {
        online_softmax(s, scores, max, sum)
    }

    #[inline(always)]
    unsafe fn weighted<T: Elem>(
        w: &[f32],
        stride: usize,
        rows: usize,
        values: &[T],
        d: usize,
        acc: &mut [f32],
        acc_stride: usize,
    ) {
        check_weighted(w, stride, rows, values, d, acc);
        for (j, value) in values.chunks_exact(d).enumerate() {
            for r in 0..rows {
                let wj = w[r * stride + j];
                let out = &mut acc[r * acc_stride..r * acc_stride + d];
                for (o, &x) in out.iter_mut().zip(value) {
                    *o += wj * x.to_f32();
                }
            }
        }
    }
}

/// Generates an instruction set's [`Kernel`]: `$vec` the register type, `$w` its lanes,
/// `$load` the element load, `$zero`, `$loadf`, `$storef`, `$set1`, `$fma` its intrinsics,
/// `$fold` its lane-per-key reduction of `$w` sum vectors, `$lanes` its [`Lanes`] (the
/// vector `e^x`, the horizontal sum and maximum) and `$cols` the value vectors one weighted
/// pass keeps per row.
#[cfg(target_arch = "x86_64")]
macro_rules! simd_kernel {
    ($name:ident, $vec:ty, $w:literal, $load:ident, $zero:ident, $loadf:ident, $storef:ident,
     $set1:ident, $fma:ident, $fold:ident, $lanes:ty, $cols:literal) => {
        impl $name {
            /// `R` query rows against each key, one horizontal sum per key and row (the keys
            /// past the last whole block).
            #[inline(always)]
            unsafe fn dots_each<T: Elem, const R: usize>(
                q: *const f32,
                keys: &[T],
                d: usize,
                scores: *mut f32,
                stride: usize,
            ) {
                let full = d / $w * $w;
                for (j, key) in keys.chunks_exact(d).enumerate() {
                    let kp = key.as_ptr();
                    let mut acc = [$zero(); R];
                    let mut c = 0;
                    while c < full {
                        let kv = T::$load(kp.add(c));
                        for (r, a) in acc.iter_mut().enumerate() {
                            *a = $fma($loadf(q.add(r * d + c)), kv, *a);
                        }
                        c += $w;
                    }
                    for (r, a) in acc.iter().enumerate() {
                        let mut s = <$lanes>::reduce_add(*a);
                        for (c, &k) in key.iter().enumerate().skip(full) {
                            s += *q.add(r * d + c) * k.to_f32();
                        }
                        *scores.add(r * stride + j) = s;
                    }
                }
            }

            /// `rows` query rows against one block of `$w` key rows (`block`, and at `kp` their
            /// whole vectors widened column-major: vector `c` of key `j` at `(c * $w + j) *
            /// $w`): per row, one sum vector per key, folded into one vector of the block's `$w`
            /// scores; the columns past the last whole vector added one by one.
            #[inline(always)]
            unsafe fn dots_block<T: Elem>(
                q: *const f32,
                rows: usize,
                kp: *const f32,
                block: &[T],
                d: usize,
                scores: *mut f32,
                stride: usize,
            ) {
                let full = d / $w * $w;
                for r in 0..rows {
                    let qr = q.add(r * d);
                    let mut acc = [$zero(); $w];
                    let mut c = 0;
                    while c < full {
                        let qv = $loadf(qr.add(c));
                        let kc = kp.add(c * $w);
                        for (j, a) in acc.iter_mut().enumerate() {
                            *a = $fma(qv, $loadf(kc.add(j * $w)), *a);
                        }
                        c += $w;
                    }
                    let out = scores.add(r * stride);
                    $storef(out, $fold(acc));
                    if full < d {
                        for (j, key) in block.chunks_exact(d).enumerate() {
                            for (c, &k) in key.iter().enumerate().skip(full) {
                                *out.add(j) += *qr.add(c) * k.to_f32();
                            }
                        }
                    }
                }
            }

            /// `R` output rows' columns `c..c + V * lanes` over every value row.
            #[inline(always)]
            unsafe fn weighted_block<T: Elem, const R: usize, const V: usize>(
                w: *const f32,
                stride: usize,
                values: &[T],
                d: usize,
                acc: *mut f32,
                acc_stride: usize,
                c: usize,
            ) {
                let mut a = [[$zero(); V]; R];
                for (r, row) in a.iter_mut().enumerate() {
                    for (i, x) in row.iter_mut().enumerate() {
                        *x = $loadf(acc.add(r * acc_stride + c + i * $w));
                    }
                }
                for (j, value) in values.chunks_exact(d).enumerate() {
                    let vp = value.as_ptr().add(c);
                    let mut vv = [$zero(); V];
                    for (i, x) in vv.iter_mut().enumerate() {
                        *x = T::$load(vp.add(i * $w));
                    }
                    for (r, row) in a.iter_mut().enumerate() {
                        let p = $set1(*w.add(r * stride + j));
                        for (x, &y) in row.iter_mut().zip(&vv) {
                            *x = $fma(p, y, *x);
                        }
                    }
                }
                for (r, row) in a.iter().enumerate() {
                    for (i, x) in row.iter().enumerate() {
                        $storef(acc.add(r * acc_stride + c + i * $w), *x);
                    }
                }
            }

            /// `R` output rows over every value row, all columns.
            #[inline(always)]
            unsafe fn weighted_rows<T: Elem, const R: usize>(
                w: *const f32,
                stride: usize,
                values: &[T],
                d: usize,
                acc: *mut f32,
                acc_stride: usize,
            ) {
                let full = d / $w * $w;
                let mut c = 0;
                while c + $cols * $w <= full {
                    Self::weighted_block::<T, R, $cols>(w, stride, values, d, acc, acc_stride, c);
                    c += $cols * $w;
                }
                while c < full {
                    Self::weighted_block::<T, R, 1>(w, stride, values, d, acc, acc_stride, c);
                    c += $w;
                }
                if full == d {
                    return;
                }
                for (j, value) in values.chunks_exact(d).enumerate() {
                    for r in 0..R {
                        let wj = *w.add(r * stride + j);
                        for (cc, &x) in value.iter().enumerate().skip(full) {
                            *acc.add(r * acc_stride + cc) += wj * x.to_f32();
                        }
                    }
                }
            }
        }

        impl Kernel for $name {
            #[inline(always)]
            unsafe fn dots<T: Elem>(
                q: &[f32],
                rows: usize,
                keys: &[T],
                d: usize,
                scores: &mut [f32],
                stride: usize,
                scratch: &mut [f32],
            ) {
                check_dots(q, rows, keys, d, scores, stride);
                let n = keys.len() / d;
                let blocks = n / $w * $w;
                let full = d / $w * $w;
                let (qp, s) = (q.as_ptr(), scores.as_mut_ptr());
                assert!(blocks == 0 || scratch.len() >= $w * full);
                let to = scratch.as_mut_ptr();
                let mut j = 0;
                while j < blocks {
                    let block = &keys[j * d..(j + $w) * d];
                    for (jj, key) in block.chunks_exact(d).enumerate() {
                        let mut c = 0;
                        while c < full {
                            $storef(to.add((c + jj) * $w), T::$load(key.as_ptr().add(c)));
                            c += $w;
                        }
                    }
                    Self::dots_block(qp, rows, to, block, d, s.add(j), stride);
                    j += $w;
                }
                let tail = &keys[blocks * d..];
                let mut r = 0;
                while r < rows && blocks < n {
                    let (q, s) = (qp.add(r * d), s.add(r * stride + blocks));
                    match rows - r {
                        1 => Self::dots_each::<T, 1>(q, tail, d, s, stride),
                        2 => Self::dots_each::<T, 2>(q, tail, d, s, stride),
                        3 => Self::dots_each::<T, 3>(q, tail, d, s, stride),
                        _ => Self::dots_each::<T, ROWS>(q, tail, d, s, stride),
                    }
                    r += ROWS;
                }
            }

            #[inline(always)]
            unsafe fn softmax(s: &Shape, scores: &mut [f32], max: &mut f32, sum: &mut f32) -> f32 {
                type S = $lanes;
                let n = scores.len();
                let full = n / $w * $w;
                let p = scores.as_mut_ptr();
                let scale = S::splat(s.scale);
                let mut m = S::splat(f32::NEG_INFINITY);
                let mut i = 0;
                if let Some(cap) = s.softcap {
                    for x in scores.iter_mut() {
                        *x = (*x * s.scale / cap).tanh() * cap;
                    }
                    let p = scores.as_ptr();
                    while i < full {
                        m = S::max(m, S::load(p.add(i)));
                        i += $w;
                    }
                } else {
                    while i < full {
                        let x = S::mul(S::load(p.add(i)), scale);
                        S::store(p.add(i), x);
                        m = S::max(m, x);
                        i += $w;
                    }
                    for x in &mut scores[full..] {
                        *x *= s.scale;
                    }
                }
                let tile_max = scores[full..]
                    .iter()
                    .fold(S::reduce_max(m), |m, &x| m.max(x));
                let new_max = max.max(tile_max);
                let correction = (*max - new_max).exp();
                *max = new_max;
                let p = scores.as_mut_ptr();
                let (top, mut total) = (S::splat(new_max), S::zero());
                let mut i = 0;
                while i < full {
                    let e = S::exp_neg(S::sub(S::load(p.add(i)), top));
                    S::store(p.add(i), e);
                    total = S::add(total, e);
                    i += $w;
                }
                let mut tile_sum = S::reduce_add(total);
                for x in &mut scores[full..] {
                    *x = exp_neg(*x - new_max);
                    tile_sum += *x;
                }
                *sum = *sum * correction + tile_sum;
                correction
            }

            #[inline(always)]
            unsafe fn weighted<T: Elem>(
                w: &[f32],
                stride: usize,
                rows: usize,
                values: &[T],
                d: usize,
                acc: &mut [f32],
                acc_stride: usize,
            ) {
                check_weighted(w, stride, rows, values, d, acc);
                assert!(acc.len() >= (rows - 1) * acc_stride + d);
                let (w, a) = (w.as_ptr(), acc.as_mut_ptr());
                let mut r = 0;
                while r < rows {
                    let (w, a) = (w.add(r * stride), a.add(r * acc_stride));
                    match rows - r {
                        1 => Self::weighted_rows::<T, 1>(w, stride, values, d, a, acc_stride),
                        2 => Self::weighted_rows::<T, 2>(w, stride, values, d, a, acc_stride),
                        3 => Self::weighted_rows::<T, 3>(w, stride, values, d, a, acc_stride),
                        _ => Self::weighted_rows::<T, ROWS>(w, stride, values, d, a, acc_stride),
                    }
                    r += ROWS;
                }
            }
        }
    };
}

/// AVX2 + FMA + F16C, eight lanes.
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx2;

/// One score per lane from eight sum vectors: lane `j` of the result is the sum of `acc[j]`'s
/// lanes. Three levels of pairwise folds at lane distance `h` = 4, 2, 1: where bit `h` of the
/// lane index is clear a fold keeps `a[i] + a[i + h]`, where set `b[i - h] + b[i]` (a blend
/// plus a permute of the two, added), halving the vectors and the lanes per key each time.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn fold_avx2(acc: [__m256; 8]) -> __m256 {
    let fold4 = |a, b| {
        _mm256_add_ps(
            _mm256_blend_ps::<0xF0>(a, b),
            _mm256_permute2f128_ps::<0x21>(a, b),
        )
    };
    let fold2 = |a, b| {
        _mm256_add_ps(
            _mm256_blend_ps::<0xCC>(a, b),
            _mm256_shuffle_ps::<0x4E>(a, b),
        )
    };
    let fold1 = |a, b| {
        let crossed = _mm256_permute_ps::<0xB1>(_mm256_blend_ps::<0x55>(a, b));
        _mm256_add_ps(_mm256_blend_ps::<0xAA>(a, b), crossed)
    };
    let [a0, a1, a2, a3, a4, a5, a6, a7] = acc;
    let (b0, b1, b2, b3) = (fold4(a0, a4), fold4(a1, a5), fold4(a2, a6), fold4(a3, a7));
    fold1(fold2(b0, b2), fold2(b1, b3))
}

#[cfg(target_arch = "x86_64")]
simd_kernel!(
    Avx2,
    __m256,
    8,
    load8,
    _mm256_setzero_ps,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_set1_ps,
    _mm256_fmadd_ps,
    fold_avx2,
    super::lanes::Avx2,
    2
);

/// AVX-512 F, sixteen lanes.
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx512;

/// The lane indices (into `a` then `b`, 32 in all) a fold at lane distance `h` adds to the
/// blend of `a` and `b` (see [`fold_avx2`]).
const fn fold_index(h: usize) -> [i32; 16] {
    let mut index = [0i32; 16];
    let mut i = 0;
    while i < 16 {
        let from = if i & h == 0 { i + h } else { 16 + i - h };
        index[i] = from as i32;
        i += 1;
    }
    index
}

/// The lanes a fold at lane distance `h` takes from `b`.
const fn fold_mask(h: usize) -> u16 {
    let mut mask = 0u16;
    let mut i = 0;
    while i < 16 {
        if i & h != 0 {
            mask |= 1 << i;
        }
        i += 1;
    }
    mask
}

/// [`fold_avx2`] for sixteen sum vectors: four levels of folds at lane distance 8, 4, 2, 1.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn fold_avx512(acc: [__m512; 16]) -> __m512 {
    #[inline(always)]
    unsafe fn fold<const H: usize>(a: __m512, b: __m512) -> __m512 {
        let index = const { fold_index(H) };
        let index = _mm512_loadu_si512(index.as_ptr().cast());
        let blend = _mm512_mask_blend_ps(const { fold_mask(H) }, a, b);
        _mm512_add_ps(blend, _mm512_permutex2var_ps(a, index, b))
    }
    let mut v = acc;
    for j in 0..8 {
        v[j] = fold::<8>(v[j], v[j + 8]);
    }
    for j in 0..4 {
        v[j] = fold::<4>(v[j], v[j + 4]);
    }
    for j in 0..2 {
        v[j] = fold::<2>(v[j], v[j + 2]);
    }
    fold::<1>(v[0], v[1])
}

#[cfg(target_arch = "x86_64")]
simd_kernel!(
    Avx512,
    __m512,
    16,
    load16,
    _mm512_setzero_ps,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_set1_ps,
    _mm512_fmadd_ps,
    fold_avx512,
    super::lanes::Avx512,
    4
);
