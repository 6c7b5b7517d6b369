//! AVX-512 (F, BW, VL, VNNI) dot products of one raw GGUF Q5_0 / Q5_1 row with one quantized
//! activation row: the row-at-a-time (decode) kernels of Q5 where the kernel choice runs the
//! AVX-512 path ([`super::Kernel::Auto`], [`super::Kernel::Avx512`]); the prompts take
//! [`super::avx512_panel`].
//!
//! Per 32-element block (layouts in [`super::q5`]): the nibbles are made as in
//! [`super::q5::avx2::nibbles`], the block's 32 high bits are taken as a byte mask
//! (`__mmask32`) and add 16 to the bytes they select (one masked `vpaddb` for the five
//! instructions that spread them on AVX2), and one `vpdpbusd` sums the byte products into
//! eight i32 lanes, started from Q5_0's offset `-16 * isum` in lane 0: the lanes sum to the
//! block's exact integer dot product. The lanes are then converted and scaled once, even
//! blocks into one f32 accumulator and odd into another, with Q5_1's offset terms `m * a.s`
//! summed in block order in lane 1 of a register: the lane values and float operations of
//! [`super::q5::avx2`], so the results equal that path's bit for bit (tested), and decode
//! gives the same tokens on both.

use std::arch::x86_64::*;

use super::activation::Q8Block;
use super::avx2::{block_scale, hsum, load_act, PREFETCH_AHEAD};
use super::avx512::Avx512;
use super::q5::avx2::nibbles;

/// Dot product of a Q5_0 row (at least `22 * a.len()` bytes) with `a`.
pub fn dot_q5_0(k: Avx512, w: &[u8], a: &[Q8Block]) -> f32 {
    let _ = k;
    assert!(w.len() >= 22 * a.len(), "q5_0 row too short");
    // SAFETY: `k` proves the features; the assert bounds every read of `w`.
    unsafe { row::<22, false>(w.as_ptr(), a) }
}

/// Dot product of a Q5_1 row (at least `24 * a.len()` bytes) with `a`.
pub fn dot_q5_1(k: Avx512, w: &[u8], a: &[Q8Block]) -> f32 {
    let _ = k;
    assert!(w.len() >= 24 * a.len(), "q5_1 row too short");
    // SAFETY: as in `dot_q5_0`.
    unsafe { row::<24, true>(w.as_ptr(), a) }
}

/// Q5_0 (`MIN = false`, 22-byte blocks) or Q5_1 (`MIN = true`, 24-byte blocks).
///
/// # Safety
/// The CPU must have the features of [`Avx512`]; `w..w + BYTES * a.len()` must be readable.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn row<const BYTES: usize, const MIN: bool>(w: *const u8, a: &[Q8Block]) -> f32 {
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    // Lane 1: Q5_1's offset sum (lane 0 sums the scales, unused).
    let mut offset = _mm_setzero_ps();
    let mut pairs = a.chunks_exact(2);
    let mut p = w;
    for pair in &mut pairs {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD).cast());
        acc0 = block::<MIN>(p, &pair[0], acc0, &mut offset);
        acc1 = block::<MIN>(p.add(BYTES), &pair[1], acc1, &mut offset);
        p = p.add(2 * BYTES);
    }
    if let [last] = pairs.remainder() {
        acc0 = block::<MIN>(p, last, acc0, &mut offset);
    }
    let sum = hsum(_mm256_add_ps(acc0, acc1));
    if MIN {
        sum + _mm_cvtss_f32(_mm_movehdup_ps(offset))
    } else {
        sum
    }
}

/// `acc` plus the block at `p` times `a` (Q5_1: its offset term into lane 1 of `offset`).
///
/// # Safety
/// As [`row`]; the block at `p` must be readable.
#[inline(always)]
unsafe fn block<const MIN: bool>(
    p: *const u8,
    a: &Q8Block,
    acc: __m256,
    offset: &mut __m128,
) -> __m256 {
    let qh_at = if MIN { 4 } else { 2 };
    let high: __mmask32 = u32::from_le(p.add(qh_at).cast::<u32>().read_unaligned());
    let nib = nibbles(p.add(qh_at + 4));
    let q = _mm256_mask_add_epi8(nib, high, nib, _mm256_set1_epi8(16));
    let start = if MIN {
        _mm256_setzero_si256()
    } else {
        _mm256_zextsi128_si256(_mm_cvtsi32_si128(-16 * a.isum))
    };
    let prod = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(start, q, load_act(a)));
    if MIN {
        // [d * a.d, m * a.s, 0, 0].
        let t = _mm_mul_ps(
            _mm_cvtph_ps(_mm_cvtsi32_si128(p.cast::<i32>().read_unaligned())),
            _mm_castsi128_ps(_mm_loadl_epi64((a as *const Q8Block).cast())),
        );
        *offset = _mm_add_ps(*offset, t);
        _mm256_fmadd_ps(_mm256_broadcastss_ps(t), prod, acc)
    } else {
        _mm256_fmadd_ps(_mm256_broadcastss_ps(block_scale(p, a)), prod, acc)
    }
}
