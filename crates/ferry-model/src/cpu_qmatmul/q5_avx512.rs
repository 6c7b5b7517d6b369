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
use super::avx2::load_act;
use super::avx512::Avx512;
use super::q5::avx2::{nibbles, row, LaneSums};

/// Dot product of a Q5_0 row (at least `22 * a.len()` bytes) with `a`.
pub fn dot_q5_0(k: Avx512, w: &[u8], a: &[Q8Block]) -> f32 {
    let _ = k;
    assert!(w.len() >= 22 * a.len(), "q5_0 row too short");
    // SAFETY: `k` proves the features; the assert bounds every read of `w`.
    unsafe { kernel::<22, false>(w.as_ptr(), a) }
}

/// Dot product of a Q5_1 row (at least `24 * a.len()` bytes) with `a`.
pub fn dot_q5_1(k: Avx512, w: &[u8], a: &[Q8Block]) -> f32 {
    let _ = k;
    assert!(w.len() >= 24 * a.len(), "q5_1 row too short");
    // SAFETY: as in `dot_q5_0`.
    unsafe { kernel::<24, true>(w.as_ptr(), a) }
}

/// Q5_0 (`MIN = false`, 22-byte blocks) or Q5_1 (`MIN = true`, 24-byte blocks): the Q5 row
/// loop ([`row`]) on [`Masked`] lane sums.
///
/// # Safety
/// The CPU must have the features of [`Avx512`]; `w..w + BYTES * a.len()` must be readable.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn kernel<const BYTES: usize, const MIN: bool>(w: *const u8, a: &[Q8Block]) -> f32 {
    row::<BYTES, MIN, Masked>(w, a)
}

/// AVX-512's lanes: the high bits as a byte mask adding 16, one `vpdpbusd` started from
/// Q5_0's offset in lane 0.
struct Masked;

impl LaneSums for Masked {
    #[inline(always)]
    unsafe fn lanes<const MIN: bool>(p: *const u8, a: &Q8Block) -> __m256i {
        let qh_at = if MIN { 4 } else { 2 };
        let high: __mmask32 = u32::from_le(p.add(qh_at).cast::<u32>().read_unaligned());
        let nib = nibbles(p.add(qh_at + 4));
        let q = _mm256_mask_add_epi8(nib, high, nib, _mm256_set1_epi8(16));
        let start = if MIN {
            _mm256_setzero_si256()
        } else {
            _mm256_zextsi128_si256(_mm_cvtsi32_si128(-16 * a.isum))
        };
        _mm256_dpbusd_epi32(start, q, load_act(a))
    }
}
