//! Dot products of raw GGUF Q5_0 / Q5_1 rows with 32-element int8 activation blocks
//! ([`Q8Block`]), portable and AVX2 (same contract as [`super::scalar`] / [`super::avx2`]).
//!
//! Layouts (little endian, 32 elements per block): Q5_0, 22 bytes: `d: f16`, `qh: u32`,
//! `qs: [u8; 16]`; Q5_1, 24 bytes: `d: f16`, `m: f16`, `qh: u32`, `qs: [u8; 16]`. Element `j`
//! has the 5-bit value `q_j = nibble_j | 16 * ((qh >> j) & 1)` (nibbles as in Q4_0) and is
//! `d * (q_j - 16)` (Q5_0) or `d * q_j + m` (Q5_1). Both kernels take the unsigned `q_j`
//! against the activations and apply the offset through the block sums (`isum`, `s`).

use super::activation::{Q8Block, BLOCK};
use super::scalar::f16_at;

/// `sum_j q_j * a.qs[j]` for one block's high bits `qh` and nibbles `qs`.
#[inline]
fn dot5(qh: u32, qs: &[u8], a: &Q8Block) -> i32 {
    let (lo, hi) = a.qs.split_at(BLOCK / 2);
    qs.iter()
        .zip(lo.iter().zip(hi))
        .enumerate()
        .map(|(j, (&q, (&l, &h)))| {
            let q0 = (q & 0x0F) | (((qh >> j) & 1) << 4) as u8;
            let q1 = (q >> 4) | (((qh >> (j + 16)) & 1) << 4) as u8;
            i32::from(q0) * i32::from(l) + i32::from(q1) * i32::from(h)
        })
        .sum()
}

/// The 32 unsigned 5-bit values `q_j` of one block's high bits `qh` and nibbles `qs` (the
/// four-row kernels of [`super::scalar_tile`] unpack each block once).
#[inline]
pub(super) fn unpack5(qh: u32, qs: &[u8]) -> [i32; BLOCK] {
    let mut q = [0i32; BLOCK];
    for (j, &b) in qs.iter().enumerate().take(BLOCK / 2) {
        q[j] = i32::from(b & 0x0F) | (((qh >> j) & 1) << 4) as i32;
        q[j + BLOCK / 2] = i32::from(b >> 4) | (((qh >> (j + 16)) & 1) << 4) as i32;
    }
    q
}

/// The little-endian u32 at `b[at..at + 4]`.
#[inline]
pub(super) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Dot product of a Q5_0 row (`a.len()` blocks of 22 bytes) with `a`.
pub fn dot_q5_0(w: &[u8], a: &[Q8Block]) -> f32 {
    w.chunks_exact(22)
        .zip(a)
        .map(|(b, a)| {
            let sumi = dot5(u32_at(b, 2), &b[6..22], a) - 16 * a.isum;
            f16_at(b, 0) * a.d * sumi as f32
        })
        .sum()
}

/// Dot product of a Q5_1 row (`a.len()` blocks of 24 bytes) with `a`.
pub fn dot_q5_1(w: &[u8], a: &[Q8Block]) -> f32 {
    w.chunks_exact(24)
        .zip(a)
        .map(|(b, a)| {
            let sumi = dot5(u32_at(b, 4), &b[8..24], a);
            f16_at(b, 0) * a.d * sumi as f32 + f16_at(b, 2) * a.s
        })
        .sum()
}

/// The AVX2 kernels: the 32 high bits are spread to one byte per element (`0x10` where set)
/// and OR-ed into the nibbles, then multiplied as in the Q4 kernels.
#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    use std::arch::x86_64::*;

    use super::super::activation::Q8Block;
    use super::super::avx2::{dot_u8_i8, f16_at, hsum, load_act, nibbles, Avx2, PREFETCH_AHEAD};

    /// Dot product of a Q5_0 row (at least `22 * a.len()` bytes) with `a`.
    pub fn dot_q5_0(k: Avx2, w: &[u8], a: &[Q8Block]) -> f32 {
        let _ = k;
        assert!(w.len() >= 22 * a.len(), "q5_0 row too short");
        // SAFETY: `k` proves the features; the assert bounds every read of `w`.
        unsafe { q5::<22, false>(w.as_ptr(), a) }
    }

    /// Dot product of a Q5_1 row (at least `24 * a.len()` bytes) with `a`.
    pub fn dot_q5_1(k: Avx2, w: &[u8], a: &[Q8Block]) -> f32 {
        let _ = k;
        assert!(w.len() >= 24 * a.len(), "q5_1 row too short");
        // SAFETY: as in `dot_q5_0`.
        unsafe { q5::<24, true>(w.as_ptr(), a) }
    }

    /// `0x10` in byte `j` where bit `j` of `qh` is set, else 0.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::cpu_qmatmul) fn high_bits(qh: u32) -> __m256i {
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(qh as i32),
            _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                3, 3, 3, 3,
            ),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }

    /// Q5_0 (`MIN = false`, 22-byte blocks) or Q5_1 (`MIN = true`, 24-byte blocks).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA, F16C; `w..w + BYTES * a.len()` must be readable.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q5<const BYTES: usize, const MIN: bool>(w: *const u8, a: &[Q8Block]) -> f32 {
        let qh_at = if MIN { 4 } else { 2 };
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut offset = 0f32;
        for (i, a) in a.iter().enumerate() {
            let p = w.add(BYTES * i);
            if i % 2 == 0 {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD).cast());
            }
            let scale = f16_at(p) * a.d;
            let qh = p.add(qh_at).cast::<u32>().read_unaligned();
            let q = _mm256_or_si256(nibbles(p.add(qh_at + 4)), high_bits(u32::from_le(qh)));
            let prod = dot_u8_i8(q, load_act(a));
            if i % 2 == 0 {
                acc0 = _mm256_fmadd_ps(_mm256_set1_ps(scale), prod, acc0);
            } else {
                acc1 = _mm256_fmadd_ps(_mm256_set1_ps(scale), prod, acc1);
            }
            if MIN {
                offset += f16_at(p.add(2)) * a.s;
            } else {
                offset -= scale * (16 * a.isum) as f32;
            }
        }
        hsum(_mm256_add_ps(acc0, acc1)) + offset
    }
}
