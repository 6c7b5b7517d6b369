//! The vector operations the register-blocked prefill ([`super::blocked`]) is written in, per
//! instruction set ([`Lanes`]: [`Avx512`] sixteen f32 lanes, [`Avx2`] eight), among them a
//! vectorized `e^x` for `x <= 0` ([`Lanes::exp_neg`]: the same Cephes polynomial as the scalar
//! [`super::exp_neg`], exactly 0 below -87), the horizontal sum and maximum, and the widening of
//! cache rows to f32. The decode kernels ([`super::simd`]) use it for their softmax.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::simd::Elem;

/// One instruction set's f32 vector and the operations on it.
///
/// # Safety
/// Every method needs the CPU features of its implementation; pointers must be valid for
/// [`Lanes::L`] values (or one, for [`Lanes::splat_at`]).
pub(super) trait Lanes {
    /// The register type.
    type V: Copy;
    /// Lanes per register.
    const L: usize;
    /// Row vectors one pass of the micro-kernels keeps in registers (at most 4).
    const BLOCK: usize;

    unsafe fn zero() -> Self::V;
    unsafe fn splat(x: f32) -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `*p` in every lane.
    #[inline(always)]
    unsafe fn splat_at(p: *const f32) -> Self::V {
        Self::splat(*p)
    }
    /// `a * b + c`.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    /// The sum of the lanes.
    unsafe fn reduce_add(v: Self::V) -> f32;
    /// The largest lane.
    unsafe fn reduce_max(v: Self::V) -> f32;
    /// `e^x` per lane for `x <= 0`: within 1 ulp down to -87 (measured max relative error 8.0e-8),
    /// exactly 0 below (and for -inf).
    unsafe fn exp_neg(x: Self::V) -> Self::V;
    /// `dst[i] = src[i]` widened to f32, `dst.len() == src.len()`.
    unsafe fn widen<T: Elem>(src: &[T], dst: &mut [f32]);
}

/// The Cephes reduction and polynomial of [`super::exp_neg`] on vectors; `$floor(x)` rounds
/// down, `$pow2(n)` is `2^n` for the integral floats `n`, `$keep(y, x)` zeroes `y` where
/// `x < -87`.
#[cfg(target_arch = "x86_64")]
macro_rules! exp_body {
    ($s:ty, $x:expr, $floor:expr, $pow2:expr, $keep:expr) => {{
        type S = $s;
        let x0 = $x;
        let x = S::max(x0, S::splat(-87.0));
        let n = $floor(S::fma(x, S::splat(std::f32::consts::LOG2_E), S::splat(0.5)));
        let r = S::fma(n, S::splat(-0.693_359_4), x);
        let r = S::fma(n, S::splat(2.121_944_4e-4), r);
        let mut p = S::splat(1.987_569_1e-4);
        p = S::fma(p, r, S::splat(1.398_199_9e-3));
        p = S::fma(p, r, S::splat(8.333_452e-3));
        p = S::fma(p, r, S::splat(4.166_579_6e-2));
        p = S::fma(p, r, S::splat(1.666_666_5e-1));
        p = S::fma(p, r, S::splat(0.5));
        let y = S::add(S::fma(S::mul(p, r), r, r), S::splat(1.0));
        $keep(S::mul(y, $pow2(n)), x0)
    }};
}

/// AVX-512 F (with AVX2, FMA, F16C for the cache loads).
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx512;

#[cfg(target_arch = "x86_64")]
impl Lanes for Avx512 {
    type V = __m512;
    const L: usize = 16;
    const BLOCK: usize = 4;

    #[inline(always)]
    unsafe fn zero() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        _mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        _mm512_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        _mm512_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn max(a: __m512, b: __m512) -> __m512 {
        _mm512_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn reduce_add(v: __m512) -> f32 {
        _mm512_reduce_add_ps(v)
    }
    #[inline(always)]
    unsafe fn reduce_max(v: __m512) -> f32 {
        _mm512_reduce_max_ps(v)
    }
    #[inline(always)]
    unsafe fn exp_neg(x: __m512) -> __m512 {
        exp_body!(
            Avx512,
            x,
            |v| _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(v),
            |n| _mm512_scalef_ps(_mm512_set1_ps(1.0), n),
            |y, x0| _mm512_maskz_mov_ps(
                _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x0, _mm512_set1_ps(-87.0)),
                y
            )
        )
    }
    #[inline(always)]
    unsafe fn widen<T: Elem>(src: &[T], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len());
        let full = src.len() / 16 * 16;
        let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
        let mut i = 0;
        while i < full {
            _mm512_storeu_ps(d.add(i), T::load16(s.add(i)));
            i += 16;
        }
        for (o, x) in dst[full..].iter_mut().zip(&src[full..]) {
            *o = x.to_f32();
        }
    }
}

/// AVX2 with FMA and F16C.
#[cfg(target_arch = "x86_64")]
pub(super) struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Lanes for Avx2 {
    type V = __m256;
    const L: usize = 8;
    /// Two row vectors by four keys (or columns) is 8 sums, 4 broadcasts and a row vector: 13 of
    /// the 16 registers. Three (12 sums) spilled one sum to the stack and back every column,
    /// and its FMA waited on the reload: measured on Zen 3 (a 4,096-token prompt, the synthetic
    /// Q5_K_M Llama), attention took 0.62-0.68 of the GEMM's time with three, 0.45 with two.
    const BLOCK: usize = 2;

    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        _mm256_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        _mm256_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        _mm256_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        _mm256_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn max(a: __m256, b: __m256) -> __m256 {
        _mm256_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn reduce_add(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }
    #[inline(always)]
    unsafe fn reduce_max(v: __m256) -> f32 {
        let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)))
    }
    #[inline(always)]
    unsafe fn exp_neg(x: __m256) -> __m256 {
        exp_body!(
            Avx2,
            x,
            |v| _mm256_floor_ps(v),
            // 2^n from the exponent bits (n >= -126 after the clamp at -87).
            |n| _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
                _mm256_cvtps_epi32(n),
                _mm256_set1_epi32(127)
            ))),
            |y, x0| _mm256_and_ps(y, _mm256_cmp_ps::<_CMP_GE_OQ>(x0, _mm256_set1_ps(-87.0)))
        )
    }
    #[inline(always)]
    unsafe fn widen<T: Elem>(src: &[T], dst: &mut [f32]) {
        assert_eq!(src.len(), dst.len());
        let full = src.len() / 8 * 8;
        let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
        let mut i = 0;
        while i < full {
            _mm256_storeu_ps(d.add(i), T::load8(s.add(i)));
            i += 8;
        }
        for (o, x) in dst[full..].iter_mut().zip(&src[full..]) {
            *o = x.to_f32();
        }
    }
}

/// [`Lanes::exp_neg`] of `S` on every value of `xs` (whole vectors; `xs.len()` a multiple of
/// 16).
#[cfg(test)]
#[inline(always)]
unsafe fn exp_each<S: Lanes>(xs: &[f32]) -> Vec<f32> {
    let mut out = vec![0f32; xs.len()];
    for (x, o) in xs.chunks_exact(S::L).zip(out.chunks_exact_mut(S::L)) {
        S::store(o.as_mut_ptr(), S::exp_neg(S::load(x.as_ptr())));
    }
    out
}

#[cfg(all(test, target_arch = "x86_64"))]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn exp_each_avx512(xs: &[f32]) -> Vec<f32> {
    exp_each::<Avx512>(xs)
}

#[cfg(all(test, target_arch = "x86_64"))]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp_each_avx2(xs: &[f32]) -> Vec<f32> {
    exp_each::<Avx2>(xs)
}

/// The vector `e^x` of `isa` on `xs` (`None` for the baseline, which has none).
#[cfg(test)]
pub(super) fn exp_neg_with(isa: super::Isa, xs: &[f32]) -> Option<Vec<f32>> {
    assert!(xs.len().is_multiple_of(16) && super::Isa::available().contains(&isa));
    match isa {
        // SAFETY: the CPU runs `isa` (asserted above).
        #[cfg(target_arch = "x86_64")]
        super::Isa::Avx512 => Some(unsafe { exp_each_avx512(xs) }),
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        super::Isa::Avx2 => Some(unsafe { exp_each_avx2(xs) }),
        super::Isa::Baseline => None,
    }
}
