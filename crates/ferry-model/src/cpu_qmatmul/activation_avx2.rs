//! The activation quantizers on AVX2, equal bit for bit to the scalar ones
//! ([`super::activation::quantize_row`], [`super::kquants::activation::quantize_row_k`]),
//! which a prompt runs once per matmul input (8 % of a Q4_K_M prompt's time before, scalar).
//!
//! The same float operations lane by lane: the largest magnitude by `vmaxps` (NaN lanes
//! ignored, as the scalar comparisons ignore them), the scaled values rounded half away from
//! zero by [`super::activation::round_to_i8`]'s truncation and fraction test, NaN to 0; then
//! packed to bytes, the group sums taken by `vpsadbw` of the bytes offset to unsigned.

use std::arch::x86_64::*;

use super::activation::{Q8Block, BLOCK};
use super::kquants::activation::{Q8KBlock, GROUP, QK_K};

/// Proof that the CPU has AVX2 and F16C.
#[derive(Debug, Clone, Copy)]
pub struct Avx2(());

impl Avx2 {
    /// `Some` where the CPU has AVX2 and F16C.
    pub fn detect() -> Option<Avx2> {
        (is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")).then_some(Avx2(()))
    }

    /// [`super::activation::quantize_row`]'s block: `xs` into `block`.
    pub fn block_q8(self, xs: &[f32; BLOCK], block: &mut Q8Block) {
        // SAFETY: `self` proves AVX2 and F16C; the reads are of `xs`.
        unsafe { block_q8(xs, block) }
    }

    /// [`super::kquants::activation::quantize_row_k`]'s block: `xs` into `block`; `false`
    /// (nothing written) where the largest magnitude is infinite, left to the scalar code.
    pub fn block_q8k(self, xs: &[f32; QK_K], block: &mut Q8KBlock) -> bool {
        // SAFETY: as above.
        unsafe { block_q8k(xs, block) }
    }
}

/// The largest `|x|` of eight-lane `v`s' lanes folded into `m` (NaN lanes leave `m`).
#[inline(always)]
unsafe fn fold_abs_max(m: __m256, v: __m256) -> __m256 {
    // `vmaxps` returns its second operand where either is NaN.
    _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0), v), m)
}

/// The largest lane of `m`.
#[inline(always)]
unsafe fn horizontal_max(m: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
    _mm_cvtss_f32(m)
}

/// [`super::activation::round_to_i8`] of each lane, as i32.
#[inline(always)]
unsafe fn round_to_i8(y: __m256) -> __m256i {
    let y = _mm256_and_ps(y, _mm256_cmp_ps::<_CMP_ORD_Q>(y, y));
    let y = _mm256_min_ps(
        _mm256_max_ps(y, _mm256_set1_ps(-128.0)),
        _mm256_set1_ps(127.0),
    );
    let t = _mm256_cvttps_epi32(y);
    let frac = _mm256_sub_ps(y, _mm256_cvtepi32_ps(t));
    let up = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5)));
    let down = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(frac, _mm256_set1_ps(-0.5)));
    // The masks are -1 where set.
    _mm256_add_epi32(_mm256_sub_epi32(t, up), down)
}

/// Thirty-two values at `x` times `scale`, rounded, as bytes in order.
#[inline(always)]
unsafe fn quantized_32(x: *const f32, scale: __m256) -> __m256i {
    // A loop, not a closure: the intrinsics inline only into the caller's target features.
    let mut v = [_mm256_setzero_si256(); 4];
    for (k, v) in v.iter_mut().enumerate() {
        *v = round_to_i8(_mm256_mul_ps(scale, _mm256_loadu_ps(x.add(8 * k))));
    }
    let p01 = _mm256_packs_epi32(v[0], v[1]);
    let p23 = _mm256_packs_epi32(v[2], v[3]);
    // The packs interleave 128-bit lanes: four-byte runs 0, 4, 1, 5, ... put back in order.
    let b = _mm256_packs_epi16(p01, p23);
    _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// The sums of bytes 0..16 and 16..32 of `q` (signed).
#[inline(always)]
unsafe fn half_sums(q: __m256i) -> (i32, i32) {
    let unsigned = _mm256_xor_si256(q, _mm256_set1_epi8(-128));
    let sad = _mm256_sad_epu8(unsigned, _mm256_setzero_si256());
    let mut s = [0u64; 4];
    _mm256_storeu_si256(s.as_mut_ptr().cast(), sad);
    let bias = 16 * 128;
    ((s[0] + s[1]) as i32 - bias, (s[2] + s[3]) as i32 - bias)
}

/// `x` rounded to f16 and back (F16C).
#[inline(always)]
unsafe fn to_f16(x: f32) -> f32 {
    let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(x));
    _mm_cvtss_f32(_mm_cvtph_ps(h))
}

#[target_feature(enable = "avx2,f16c")]
unsafe fn block_q8(xs: &[f32; BLOCK], block: &mut Q8Block) {
    let x = xs.as_ptr();
    let mut m = _mm256_setzero_ps();
    for k in 0..BLOCK / 8 {
        m = fold_abs_max(m, _mm256_loadu_ps(x.add(8 * k)));
    }
    let amax = horizontal_max(m);
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q = quantized_32(x, _mm256_set1_ps(id));
    _mm256_storeu_si256(block.qs.as_mut_ptr().cast(), q);
    let (lo, hi) = half_sums(q);
    let sum = lo + hi;
    // `f16::from_f32(d)`, `f16::from_f32(sum)`, their product in f32 rounded to f16 (the
    // `half` crate's `Mul`), by F16C (round to nearest even, as `half` rounds) instead of
    // `half`'s calls.
    let d16 = to_f16(d);
    block.d = d16;
    block.s = to_f16(to_f16(sum as f32) * d16);
    block.isum = sum;
}

#[target_feature(enable = "avx2")]
unsafe fn block_q8k(xs: &[f32; QK_K], block: &mut Q8KBlock) -> bool {
    let x = xs.as_ptr();
    let mut m = _mm256_setzero_ps();
    for k in 0..QK_K / 8 {
        m = fold_abs_max(m, _mm256_loadu_ps(x.add(8 * k)));
    }
    let amax = horizontal_max(m);
    if amax == 0.0 {
        *block = Q8KBlock::ZERO;
        return true;
    }
    if !amax.is_finite() {
        return false;
    }
    // The first value of that magnitude (the scalar scan keeps the first of ties).
    let target = _mm256_set1_ps(amax);
    let sign = _mm256_set1_ps(-0.0);
    let mut first = 0;
    for k in 0..QK_K / 8 {
        let a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x.add(8 * k)));
        let hits = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(a, target));
        if hits != 0 {
            first = 8 * k + hits.trailing_zeros() as usize;
            break;
        }
    }
    let iscale = -127.0 / xs[first];
    let scale = _mm256_set1_ps(iscale);
    for c in 0..QK_K / 32 {
        let q = quantized_32(x.add(32 * c), scale);
        _mm256_storeu_si256(block.qs.as_mut_ptr().add(32 * c).cast(), q);
        let (lo, hi) = half_sums(q);
        // At most 16 * 128 in magnitude.
        block.bsums[2 * c] = lo as i16;
        block.bsums[2 * c + 1] = hi as i16;
    }
    const { assert!(2 * GROUP == 32) };
    block.d = 1.0 / iscale;
    true
}
