//! Portable dot products of one raw GGUF weight row with one quantized activation row.
//!
//! These are the reference kernels: always available, always used when the CPU lacks AVX2,
//! and the yardstick the SIMD kernels are tested against. Block layouts (little endian):
//! - Q4_0, 18 bytes: `d: f16`, `qs: [u8; 16]`; element `j` is `d * (nibble_j - 8)`.
//! - Q4_1, 20 bytes: `d: f16`, `m: f16`, `qs: [u8; 16]`; element `j` is `d * nibble_j + m`.
//! - Q8_0, 34 bytes: `d: f16`, `qs: [i8; 32]`; element `j` is `d * qs[j]`.
//!
//! Nibble `j < 16` is the low half of `qs[j]`, nibble `j >= 16` the high half of `qs[j - 16]`.

use half::f16;

use super::activation::{Q8Block, BLOCK};

/// Reads the little-endian f16 at `bytes[at..at + 2]` as f32.
#[inline]
pub(super) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([bytes[at], bytes[at + 1]])).to_f32()
}

/// Sum over blocks of `nibble_j * a.qs[j]` for a 16-byte nibble array.
#[inline]
fn nibble_dot(qs: &[u8], a: &Q8Block) -> i32 {
    let (lo, hi) = a.qs.split_at(BLOCK / 2);
    qs.iter()
        .zip(lo.iter().zip(hi))
        .map(|(&q, (&l, &h))| i32::from(q & 0x0F) * i32::from(l) + i32::from(q >> 4) * i32::from(h))
        .sum()
}

/// Dot product of a Q4_0 row (`a.len()` blocks of 18 bytes) with `a`.
pub fn dot_q4_0(w: &[u8], a: &[Q8Block]) -> f32 {
    w.chunks_exact(18)
        .zip(a)
        .map(|(b, a)| {
            let sumi = nibble_dot(&b[2..18], a) - 8 * a.isum;
            f16_at(b, 0) * a.d * sumi as f32
        })
        .sum()
}

/// Dot product of a Q4_1 row (`a.len()` blocks of 20 bytes) with `a`.
pub fn dot_q4_1(w: &[u8], a: &[Q8Block]) -> f32 {
    w.chunks_exact(20)
        .zip(a)
        .map(|(b, a)| f16_at(b, 0) * a.d * nibble_dot(&b[4..20], a) as f32 + f16_at(b, 2) * a.s)
        .sum()
}

/// Dot product of a Q8_0 row (`a.len()` blocks of 34 bytes) with `a`.
pub fn dot_q8_0(w: &[u8], a: &[Q8Block]) -> f32 {
    w.chunks_exact(34)
        .zip(a)
        .map(|(b, a)| {
            let sumi: i32 = b[2..34]
                .iter()
                .zip(&a.qs)
                .map(|(&q, &y)| i32::from(q as i8) * i32::from(y))
                .sum();
            f16_at(b, 0) * a.d * sumi as f32
        })
        .sum()
}
