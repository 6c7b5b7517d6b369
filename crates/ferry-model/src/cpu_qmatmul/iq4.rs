//! IQ4_NL and IQ4_XS: dot products of raw GGUF rows with int8 activation rows (scalar and AVX2)
//! and dequantization. Both store 4-bit indices into one non-linear table of 16 int8 values
//! ([`KVALUES`], ggml's `kvalues_iq4nl`), so a block's weights are exact small integers times
//! a scale and the dot product stays in integers per 32 elements.
//!
//! Block layouts (little endian):
//! - IQ4_NL, 32 elements in 18 bytes: `d: f16`, `qs: [u8; 16]`; element `j` is
//!   `d * KVALUES[nibble_j]`.
//! - IQ4_XS, 256 elements in 136 bytes: `d: f16`, `scales_h: u16`, `scales_l: [u8; 4]`,
//!   `qs: [u8; 128]`: eight sub-blocks of 32, sub-block `i` with the 6-bit scale
//!   `ls = (scales_l[i / 2] >> 4 * (i % 2)) & 15 | ((scales_h >> 2 * i) & 3) << 4` and indices
//!   `qs[16 * i..16 * i + 16]`; element `j` of it is `d * (ls - 32) * KVALUES[nibble_j]`.
//!
//! Nibble `j < 16` is the low half of the sub-block's byte `j`, nibble `j >= 16` the high half
//! of byte `j - 16` (as in Q4_0).

use super::activation::{Q8Block, BLOCK};
use super::scalar::f16_at;

/// The IQ4 value table.
pub const KVALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Bytes of an IQ4_NL block (32 elements).
pub const IQ4_NL_BYTES: usize = 18;
/// Bytes of an IQ4_XS super-block (256 elements).
pub const IQ4_XS_BYTES: usize = 136;
/// 32-element sub-blocks per IQ4_XS super-block.
pub(super) const XS_SUB: usize = 8;

/// `out[j] = d * table[nibble_j]` for the 16 index bytes `qs` (32 values).
pub(super) fn decode_nibbles(table: &[i8; 16], d: f32, qs: &[u8], out: &mut [f32]) {
    let (lo, hi) = out.split_at_mut(BLOCK / 2);
    for ((&q, l), h) in qs.iter().zip(lo).zip(hi) {
        *l = d * f32::from(table[usize::from(q & 0x0F)]);
        *h = d * f32::from(table[usize::from(q >> 4)]);
    }
}

/// `sum_j table[nibble_j] * a.qs[j]` for the 16 index bytes `qs`.
#[inline]
pub(super) fn table_dot(table: &[i8; 16], qs: &[u8], a: &Q8Block) -> i32 {
    let (lo, hi) = a.qs.split_at(BLOCK / 2);
    qs.iter()
        .zip(lo.iter().zip(hi))
        .map(|(&q, (&l, &h))| {
            i32::from(table[usize::from(q & 0x0F)]) * i32::from(l)
                + i32::from(table[usize::from(q >> 4)]) * i32::from(h)
        })
        .sum()
}

/// The signed 6-bit scale of sub-block `i` of the IQ4_XS super-block `b`, minus 32.
#[inline]
pub(super) fn xs_scale(b: &[u8], i: usize) -> i32 {
    let high = u16::from_le_bytes([b[2], b[3]]);
    let low = i32::from((b[4 + i / 2] >> (4 * (i % 2))) & 0x0F);
    (low | (i32::from((high >> (2 * i)) & 3) << 4)) - 32
}

/// Decodes IQ4_NL blocks (`bytes.len() / 18 * 32` values).
pub fn dequantize_iq4_nl(bytes: &[u8], out: &mut [f32]) {
    for (b, o) in bytes
        .chunks_exact(IQ4_NL_BYTES)
        .zip(out.chunks_exact_mut(BLOCK))
    {
        decode_nibbles(&KVALUES, f16_at(b, 0), &b[2..], o);
    }
}

/// Decodes IQ4_XS super-blocks (`bytes.len() / 136 * 256` values).
pub fn dequantize_iq4_xs(bytes: &[u8], out: &mut [f32]) {
    for (b, o) in bytes
        .chunks_exact(IQ4_XS_BYTES)
        .zip(out.chunks_exact_mut(XS_SUB * BLOCK))
    {
        let d = f16_at(b, 0);
        for (i, o) in o.chunks_exact_mut(BLOCK).enumerate() {
            let qs = &b[8 + 16 * i..8 + 16 * (i + 1)];
            decode_nibbles(&KVALUES, d * xs_scale(b, i) as f32, qs, o);
        }
    }
}

/// Dot product of an IQ4_NL row (`a.len()` blocks of 18 bytes) with `a`.
pub fn dot_iq4_nl(w: &[u8], a: &[Q8Block]) -> f32 {
    w.chunks_exact(IQ4_NL_BYTES)
        .zip(a)
        .map(|(b, a)| f16_at(b, 0) * a.d * table_dot(&KVALUES, &b[2..], a) as f32)
        .sum()
}

/// Dot product of an IQ4_XS row (`a.len() / 8` super-blocks of 136 bytes) with `a`.
pub fn dot_iq4_xs(w: &[u8], a: &[Q8Block]) -> f32 {
    w.chunks_exact(IQ4_XS_BYTES)
        .zip(a.chunks_exact(XS_SUB))
        .map(|(b, a)| {
            let d = f16_at(b, 0);
            a.iter()
                .enumerate()
                .map(|(i, a)| {
                    let sumi = table_dot(&KVALUES, &b[8 + 16 * i..8 + 16 * (i + 1)], a);
                    d * xs_scale(b, i) as f32 * a.d * sumi as f32
                })
                .sum::<f32>()
        })
        .sum()
}

#[cfg(target_arch = "x86_64")]
pub use self::x86::{avx2_dot_iq4_nl, avx2_dot_iq4_xs};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::activation::Q8Block;
    use super::super::avx2::{
        f16_at, hsum, table_product, table_row, Avx2, BlockScale, PREFETCH_AHEAD,
    };
    use super::{IQ4_NL_BYTES, IQ4_XS_BYTES, KVALUES, XS_SUB};

    /// AVX2 form of [`super::dot_iq4_nl`].
    pub fn avx2_dot_iq4_nl(k: Avx2, w: &[u8], a: &[Q8Block]) -> f32 {
        let _ = k;
        assert!(w.len() >= IQ4_NL_BYTES * a.len(), "iq4_nl row too short");
        // SAFETY: `k` proves the CPU features; the assert bounds every read of `w`.
        unsafe {
            let table = _mm_loadu_si128(KVALUES.as_ptr().cast());
            table_row(table, BlockScale::F16, w.as_ptr(), a)
        }
    }

    /// AVX2 form of [`super::dot_iq4_xs`].
    pub fn avx2_dot_iq4_xs(k: Avx2, w: &[u8], a: &[Q8Block]) -> f32 {
        let _ = k;
        assert!(
            a.len().is_multiple_of(XS_SUB) && w.len() >= IQ4_XS_BYTES * (a.len() / XS_SUB),
            "iq4_xs row too short"
        );
        // SAFETY: as in `avx2_dot_iq4_nl`.
        unsafe { iq4_xs(w, a) }
    }

    /// # Safety
    /// The CPU must have AVX2, FMA, F16C; `w` must hold `a.len() / 8` super-blocks.
    ///
    /// Per super-block the eight sub-block scales `d * (ls - 32)` are computed in one register
    /// (variable shifts pick the 6-bit scales' bits), and two sub-blocks' indices are looked up
    /// per 32-byte load; the accumulation is the one of [`avx2_tile::iq4_xs`]'s rows (one
    /// accumulator, sub-block by sub-block, `(d * ls) * a.d` times the block's lane sums).
    ///
    /// [`avx2_tile::iq4_xs`]: super::super::avx2_tile::iq4_xs
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn iq4_xs(w: &[u8], a: &[Q8Block]) -> f32 {
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES.as_ptr().cast()));
        let mask = _mm256_set1_epi8(0x0F);
        // Sub-block i's low four bits are bits 4i.. of the u32 `scales_l`, its high two bits
        // 2i.. of the u16 `scales_h`.
        let low_at = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        let high_at = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
        let mut scales = [0f32; XS_SUB];
        let mut acc = _mm256_setzero_ps();
        for (b, a) in w.chunks_exact(IQ4_XS_BYTES).zip(a.chunks_exact(XS_SUB)) {
            let p = b.as_ptr();
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD).cast());
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD + 64).cast());
            let high = _mm256_set1_epi32(i32::from(p.add(2).cast::<u16>().read_unaligned()));
            let low = _mm256_set1_epi32(p.add(4).cast::<i32>().read_unaligned());
            let ls = _mm256_or_si256(
                _mm256_and_si256(_mm256_srlv_epi32(low, low_at), _mm256_set1_epi32(0x0F)),
                _mm256_slli_epi32::<4>(_mm256_and_si256(
                    _mm256_srlv_epi32(high, high_at),
                    _mm256_set1_epi32(3),
                )),
            );
            let ls = _mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32)));
            // `d * xs_scale(b, i) as f32`, lane i.
            _mm256_storeu_ps(
                scales.as_mut_ptr(),
                _mm256_mul_ps(_mm256_set1_ps(f16_at(p)), ls),
            );
            for pair in 0..XS_SUB / 2 {
                // Sub-blocks 2 pair and 2 pair + 1: their low nibbles' values in the halves of
                // `lo`, their high nibbles' in the halves of `hi`.
                let q = _mm256_loadu_si256(p.add(8 + 32 * pair).cast());
                let lo = _mm256_shuffle_epi8(table, _mm256_and_si256(q, mask));
                let hi =
                    _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16::<4>(q), mask));
                let halves = [
                    _mm256_permute2x128_si256::<0x20>(lo, hi),
                    _mm256_permute2x128_si256::<0x31>(lo, hi),
                ];
                for (h, wv) in halves.into_iter().enumerate() {
                    let i = 2 * pair + h;
                    let scale = scales[i] * a[i].d;
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(scale), table_product(wv, &a[i]), acc);
                }
            }
        }
        hsum(acc)
    }
}
