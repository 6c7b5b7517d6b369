//! Portable dot products of one raw GGUF k-quant row with one row of [`Q8KBlock`]s: the
//! reference kernels, used when the CPU lacks AVX2 and as the yardstick for the SIMD ones.
//!
//! Super-block layouts (256 elements, little endian; "chunk `c`" is elements `32 c..32 c + 32`,
//! `l` an index within it, half `h = l / 16`):
//! - Q2_K, 84 bytes: `scales: [u8; 16]` (low nibble scale, high nibble min, per 16 elements),
//!   `qs: [u8; 64]`, `d: f16`, `dmin: f16`. Element: `d * sc * q - dmin * min` with
//!   `q = (qs[32 (c / 4) + l] >> 2 (c % 4)) & 3`, scale/min byte `2 c + h`.
//! - Q3_K, 110 bytes: `hmask: [u8; 32]`, `qs: [u8; 64]`, `scales: [u8; 12]` (sixteen 6-bit,
//!   offset 32), `d: f16`. Element: `d * sc * (q + 4 h_bit - 4)` with `q` as in Q2_K and
//!   `h_bit = (hmask[l] >> c) & 1`, scale `2 c + h`.
//! - Q4_K, 144 bytes: `d: f16`, `dmin: f16`, `scales: [u8; 12]` (eight 6-bit scales and mins),
//!   `qs: [u8; 128]`. Element: `d * sc_c * q - dmin * min_c` with `q` the low (even `c`) or
//!   high (odd `c`) nibble of `qs[32 (c / 2) + l]`.
//! - Q5_K, 176 bytes: as Q4_K with `qh: [u8; 32]` before `qs`; `q` gains `16 * ((qh[l] >> c) & 1)`.
//! - Q6_K, 210 bytes: `ql: [u8; 128]`, `qh: [u8; 64]`, `scales: [i8; 16]`, `d: f16`. With
//!   `n = c / 4`, `g = c % 4`: `q` is the low (`g < 2`) or high nibble of
//!   `ql[64 n + 32 (g % 2) + l]` plus `16 * ((qh[32 n + l] >> 2 g) & 3)`; element
//!   `d * sc[2 c + h] * (q - 32)`.
//!
//! Each kernel reduces a block to exact integers: `sumi` (the scaled dot product, offsets of
//! Q3_K and Q6_K folded in) and `summ` (the min term of Q2_K, Q4_K, Q5_K against the
//! activation's 16-element sums).

use super::super::scalar::f16_at;
use super::activation::{Q8KBlock, GROUP};
use super::{block_value, scales_mins_k4, scales_q3_k, KFormat};

/// Dot product of one row of `format` (`a.len()` super-blocks) with `a`.
pub fn dot(format: KFormat, w: &[u8], a: &[Q8KBlock]) -> f32 {
    match format {
        KFormat::Q2K => dot_q2_k(w, a),
        KFormat::Q3K => dot_q3_k(w, a),
        KFormat::Q4K => dot_q4_k(w, a),
        KFormat::Q5K => dot_q5_k(w, a),
        KFormat::Q6K => dot_q6_k(w, a),
    }
}

/// `sum_g scale[g] * bsums[g]` over the sixteen 16-element groups.
fn group_sum(scales: impl Iterator<Item = i32>, a: &Q8KBlock) -> i32 {
    scales.zip(a.bsums).map(|(s, b)| s * i32::from(b)).sum()
}

/// Dot product of a Q2_K row with `a`.
pub fn dot_q2_k(w: &[u8], a: &[Q8KBlock]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.chunks_exact(84).zip(a) {
        let (sc, qs) = (&b[..16], &b[16..80]);
        let mut sumi = 0i32;
        for (i, ys) in a.qs.chunks_exact(GROUP).enumerate() {
            let (c, h) = (i / 2, i % 2);
            let q = &qs[32 * (c / 4) + GROUP * h..][..GROUP];
            let shift = 2 * (c % 4);
            let t: i32 = q
                .iter()
                .zip(ys)
                .map(|(&q, &y)| i32::from((q >> shift) & 3) * i32::from(y))
                .sum();
            sumi += i32::from(sc[i] & 0x0F) * t;
        }
        let summ = group_sum(sc.iter().map(|&s| i32::from(s >> 4)), a);
        acc += block_value(f16_at(b, 80), f16_at(b, 82), a.d, sumi, summ);
    }
    acc
}

/// Dot product of a Q3_K row with `a`.
pub fn dot_q3_k(w: &[u8], a: &[Q8KBlock]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.chunks_exact(110).zip(a) {
        let (hmask, qs) = (&b[..32], &b[32..96]);
        let sc = scales_q3_k(&b[96..108]);
        let mut sumi = 0i32;
        for (i, ys) in a.qs.chunks_exact(GROUP).enumerate() {
            let (c, h) = (i / 2, i % 2);
            let q = &qs[32 * (c / 4) + GROUP * h..][..GROUP];
            let hm = &hmask[GROUP * h..][..GROUP];
            let shift = 2 * (c % 4);
            let t: i32 = q
                .iter()
                .zip(hm)
                .zip(ys)
                .map(|((&q, &m), &y)| {
                    let v = ((q >> shift) & 3) | (((m >> c) & 1) << 2);
                    i32::from(v) * i32::from(y)
                })
                .sum();
            sumi += i32::from(sc[i]) * t;
        }
        let offset = group_sum(sc.iter().map(|&s| i32::from(s)), a);
        acc += block_value(f16_at(b, 108), 0.0, a.d, sumi - 4 * offset, 0);
    }
    acc
}

/// The shared body of Q4_K and Q5_K: `high(c, l)` is the fifth bit's value (0 or 16) of
/// element `l` of chunk `c`.
#[inline(always)]
fn dot_k4(
    w: &[u8],
    a: &[Q8KBlock],
    block: usize,
    qs_at: usize,
    high: impl Fn(&[u8], usize, usize) -> u8,
) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.chunks_exact(block).zip(a) {
        let (sc, mn) = scales_mins_k4(&b[4..16]);
        let qs = &b[qs_at..qs_at + 128];
        let mut sumi = 0i32;
        for (c, ys) in a.qs.chunks_exact(32).enumerate() {
            let q = &qs[32 * (c / 2)..][..32];
            let t: i32 = q
                .iter()
                .zip(ys)
                .enumerate()
                .map(|(l, (&q, &y))| {
                    let nib = if c % 2 == 0 { q & 0x0F } else { q >> 4 };
                    i32::from(nib | high(b, c, l)) * i32::from(y)
                })
                .sum();
            sumi += i32::from(sc[c]) * t;
        }
        let summ = group_sum((0..16).map(|g| i32::from(mn[g / 2])), a);
        acc += block_value(f16_at(b, 0), f16_at(b, 2), a.d, sumi, summ);
    }
    acc
}

/// Dot product of a Q4_K row with `a`.
pub fn dot_q4_k(w: &[u8], a: &[Q8KBlock]) -> f32 {
    dot_k4(w, a, 144, 16, |_, _, _| 0)
}

/// Dot product of a Q5_K row with `a`.
pub fn dot_q5_k(w: &[u8], a: &[Q8KBlock]) -> f32 {
    dot_k4(w, a, 176, 48, |b, c, l| ((b[16 + l] >> c) & 1) << 4)
}

/// Dot product of a Q6_K row with `a`.
pub fn dot_q6_k(w: &[u8], a: &[Q8KBlock]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in w.chunks_exact(210).zip(a) {
        let (ql, qh) = (&b[..128], &b[128..192]);
        let sc = &b[192..208];
        let mut sumi = 0i32;
        for (i, ys) in a.qs.chunks_exact(GROUP).enumerate() {
            let (c, h) = (i / 2, i % 2);
            let (n, g) = (c / 4, c % 4);
            let lo = &ql[64 * n + 32 * (g % 2) + GROUP * h..][..GROUP];
            let hi = &qh[32 * n + GROUP * h..][..GROUP];
            let t: i32 = lo
                .iter()
                .zip(hi)
                .zip(ys)
                .map(|((&l, &hb), &y)| {
                    let nib = if g < 2 { l & 0x0F } else { l >> 4 };
                    let v = nib | (((hb >> (2 * g)) & 3) << 4);
                    i32::from(v) * i32::from(y)
                })
                .sum();
            sumi += i32::from(sc[i] as i8) * t;
        }
        let offset = group_sum(sc.iter().map(|&s| i32::from(s as i8)), a);
        acc += block_value(f16_at(b, 208), 0.0, a.d, sumi - 32 * offset, 0);
    }
    acc
}
