//! The decode schedule's two inner loops, per instruction set ([`Kernel`]): the dot products
//! of a few query rows with a run of key rows, and the weighted sums of a run of value rows
//! into a few output rows. Key and value rows are read in the cache's dtype ([`Elem`]) and
//! widened to f32 in registers (F16C's `vcvtph2ps`, a shift for bf16). [`Scalar`] is the
//! reference; [`Avx2`] and [`Avx512`] keep each key and value vector in a register for up to
//! four query rows at once.

use half::{bf16, f16};

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

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

/// The inner loops of one instruction set. Rows are `d` wide; `q` holds `rows` query rows,
/// `keys` and `values` hold `n` rows; `scores` and the weights `w` hold row `r`'s `n` values
/// at `r * stride`; `acc` holds output row `r` at `r * acc_stride`.
pub(super) trait Kernel {
    /// `scores[r * stride + j] = q_r . key_j`.
    ///
    /// # Safety
    /// The CPU must have the kernel's features.
    unsafe fn dots<T: Elem>(
        q: &[f32],
        rows: usize,
        keys: &[T],
        d: usize,
        scores: &mut [f32],
        stride: usize,
    );

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
/// `$hsum` its horizontal sum and `$cols` the value vectors one weighted pass keeps per row.
#[cfg(target_arch = "x86_64")]
macro_rules! simd_kernel {
    ($name:ident, $vec:ty, $w:literal, $load:ident, $zero:ident, $loadf:ident, $storef:ident,
     $set1:ident, $fma:ident, $hsum:ident, $cols:literal) => {
        impl $name {
            /// `R` query rows against every key.
            #[inline(always)]
            unsafe fn dots_rows<T: Elem, const R: usize>(
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
                        let mut s = $hsum(*a);
                        for (c, &k) in key.iter().enumerate().skip(full) {
                            s += *q.add(r * d + c) * k.to_f32();
                        }
                        *scores.add(r * stride + j) = s;
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
            ) {
                check_dots(q, rows, keys, d, scores, stride);
                let (q, s) = (q.as_ptr(), scores.as_mut_ptr());
                let mut r = 0;
                while r < rows {
                    let (q, s) = (q.add(r * d), s.add(r * stride));
                    match rows - r {
                        1 => Self::dots_rows::<T, 1>(q, keys, d, s, stride),
                        2 => Self::dots_rows::<T, 2>(q, keys, d, s, stride),
                        3 => Self::dots_rows::<T, 3>(q, keys, d, s, stride),
                        _ => Self::dots_rows::<T, ROWS>(q, keys, d, s, stride),
                    }
                    r += ROWS;
                }
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

/// The sum of a register's eight lanes.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
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
    hsum256,
    2
);

/// AVX-512 F, sixteen lanes.
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx512;

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
    _mm512_reduce_add_ps,
    4
);
