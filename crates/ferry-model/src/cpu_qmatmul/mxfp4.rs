//! MXFP4 (gpt-oss's expert weights): dot products of raw GGUF rows with int8 activation rows
//! (scalar and AVX2) and dequantization.
//!
//! Block layout, 32 elements in 17 bytes: `e: u8`, an E8M0 scale (a power of two), then
//! `qs: [u8; 16]`, 4-bit E2M1 codes packed as in Q4_0 (nibble `j < 16` is the low half of
//! `qs[j]`, nibble `j >= 16` the high half of `qs[j - 16]`). ggml keeps the E2M1 values doubled
//! so they are integers ([`KVALUES`]) and halves the scale instead: element `j` is
//! `2^(e - 128) * KVALUES[nibble_j]` (ggml's `GGML_E8M0_TO_FP32_HALF`). The integer values
//! make the per-block dot product an integer one, like IQ4_NL's.

use super::activation::{Q8Block, BLOCK};
use super::iq4::{decode_nibbles, table_dot};

/// E2M1 values, doubled.
pub const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Bytes of an MXFP4 block (32 elements).
pub const MXFP4_BYTES: usize = 17;

/// `2^(e - 128)`: the E8M0 scale `e`, halved to match the doubled [`KVALUES`] (denormal for
/// `e < 2`, as ggml computes it).
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    let e = u32::from(e);
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits((e - 1) << 23)
    }
}

/// Decodes MXFP4 blocks (`bytes.len() / 17 * 32` values).
pub fn dequantize_mxfp4(bytes: &[u8], out: &mut [f32]) {
    for (b, o) in bytes
        .chunks_exact(MXFP4_BYTES)
        .zip(out.chunks_exact_mut(BLOCK))
    {
        decode_nibbles(&KVALUES, e8m0_half(b[0]), &b[1..], o);
    }
}

/// Dot product of an MXFP4 row (`a.len()` blocks of 17 bytes) with `a`.
pub fn dot_mxfp4(w: &[u8], a: &[Q8Block]) -> f32 {
    w.chunks_exact(MXFP4_BYTES)
        .zip(a)
        .map(|(b, a)| e8m0_half(b[0]) * a.d * table_dot(&KVALUES, &b[1..], a) as f32)
        .sum()
}

#[cfg(target_arch = "x86_64")]
pub use self::x86::avx2_dot_mxfp4;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::activation::Q8Block;
    use super::super::avx2::{table_row, Avx2, BlockScale};
    use super::{KVALUES, MXFP4_BYTES};

    /// AVX2 form of [`super::dot_mxfp4`].
    pub fn avx2_dot_mxfp4(k: Avx2, w: &[u8], a: &[Q8Block]) -> f32 {
        let _ = k;
        assert!(w.len() >= MXFP4_BYTES * a.len(), "mxfp4 row too short");
        // SAFETY: `k` proves the CPU features; the assert bounds every read of `w`.
        unsafe {
            let table = _mm_loadu_si128(KVALUES.as_ptr().cast());
            table_row(table, BlockScale::E8m0Half, w.as_ptr(), a)
        }
    }
}
