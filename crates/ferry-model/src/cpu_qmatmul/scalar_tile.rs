//! Portable dot products of one raw GGUF weight row with four quantized activation rows at
//! once (the scalar micro-kernels of [`super::tile`]): each weight block is unpacked once for
//! the four rows. Every output is the same sum, in the same order, as the one-row kernel in
//! [`super::scalar`] (block layouts are described there), or in [`super::q5`] for Q5_0 / Q5_1
//! and in [`super::iq4`] and [`super::mxfp4`] for the table-coded formats, so the results are
//! equal.

use super::activation::{Q8Block, BLOCK};
use super::iq4::{self, IQ4_NL_BYTES, IQ4_XS_BYTES, XS_SUB};
use super::mxfp4::{self, MXFP4_BYTES};
use super::q5;
use super::scalar::f16_at;
use super::tile::Rows4;

/// The 32 weights of a 4-bit block's 16 packed bytes, low nibbles first.
#[inline]
fn unpack_nibbles(qs: &[u8]) -> [i32; BLOCK] {
    let mut w = [0i32; BLOCK];
    for (j, &q) in qs.iter().enumerate() {
        w[j] = i32::from(q & 0x0F);
        w[j + BLOCK / 2] = i32::from(q >> 4);
    }
    w
}

/// `sum_j w[j] * a.qs[j]`.
#[inline]
fn int_dot(w: &[i32; BLOCK], a: &Q8Block) -> i32 {
    w.iter().zip(&a.qs).map(|(&w, &y)| w * i32::from(y)).sum()
}

/// The four rows' sums over blocks, in block order: `prepare` unpacks a weight block once and
/// `block` is one row's term for it.
fn per_block<P>(
    w: &[u8],
    a: Rows4<'_>,
    block_bytes: usize,
    prepare: impl Fn(&[u8]) -> P,
    block: impl Fn(&[u8], &P, &Q8Block) -> f32,
) -> [f32; 4] {
    let kb = a[0].len();
    assert!(
        a.iter().all(|r| r.len() == kb),
        "activation rows differ in length"
    );
    assert!(w.len() >= block_bytes * kb, "weight row too short");
    let mut sums = [0f32; 4];
    for (i, b) in w.chunks_exact(block_bytes).take(kb).enumerate() {
        let p = prepare(b);
        for (sum, row) in sums.iter_mut().zip(&a) {
            *sum += block(b, &p, &row[i]);
        }
    }
    sums
}

/// [`super::scalar::dot_q4_0`] of `w` with each of the four rows `a`.
pub fn q4_0(w: &[u8], a: Rows4<'_>) -> [f32; 4] {
    per_block(
        w,
        a,
        18,
        |b| unpack_nibbles(&b[2..18]),
        |b, nibbles, a| {
            let sumi = int_dot(nibbles, a) - 8 * a.isum;
            f16_at(b, 0) * a.d * sumi as f32
        },
    )
}

/// [`super::scalar::dot_q4_1`] of `w` with each of the four rows `a`.
pub fn q4_1(w: &[u8], a: Rows4<'_>) -> [f32; 4] {
    per_block(
        w,
        a,
        20,
        |b| unpack_nibbles(&b[4..20]),
        |b, nibbles, a| f16_at(b, 0) * a.d * int_dot(nibbles, a) as f32 + f16_at(b, 2) * a.s,
    )
}

/// [`super::scalar::dot_q8_0`] of `w` with each of the four rows `a`.
pub fn q8_0(w: &[u8], a: Rows4<'_>) -> [f32; 4] {
    per_block(
        w,
        a,
        34,
        |b| std::array::from_fn::<i32, BLOCK, _>(|j| i32::from(b[2 + j] as i8)),
        |b, ws, a| f16_at(b, 0) * a.d * int_dot(ws, a) as f32,
    )
}

/// [`super::q5::dot_q5_0`] of `w` with each of the four rows `a`.
pub fn q5_0(w: &[u8], a: Rows4<'_>) -> [f32; 4] {
    per_block(
        w,
        a,
        22,
        |b| q5::unpack5(q5::u32_at(b, 2), &b[6..22]),
        |b, qs, a| {
            let sumi = int_dot(qs, a) - 16 * a.isum;
            f16_at(b, 0) * a.d * sumi as f32
        },
    )
}

/// [`super::q5::dot_q5_1`] of `w` with each of the four rows `a`.
pub fn q5_1(w: &[u8], a: Rows4<'_>) -> [f32; 4] {
    per_block(
        w,
        a,
        24,
        |b| q5::unpack5(q5::u32_at(b, 4), &b[8..24]),
        |b, qs, a| f16_at(b, 0) * a.d * int_dot(qs, a) as f32 + f16_at(b, 2) * a.s,
    )
}

/// The 32 table values of a table-coded block's 16 index bytes, low nibbles first.
#[inline]
fn unpack_table(table: &[i8; 16], qs: &[u8]) -> [i32; BLOCK] {
    unpack_nibbles(qs).map(|n| i32::from(table[n as usize]))
}

/// [`super::iq4::dot_iq4_nl`] of `w` with each of the four rows `a`.
pub fn iq4_nl(w: &[u8], a: Rows4<'_>) -> [f32; 4] {
    per_block(
        w,
        a,
        IQ4_NL_BYTES,
        |b| unpack_table(&iq4::KVALUES, &b[2..IQ4_NL_BYTES]),
        |b, ws, a| f16_at(b, 0) * a.d * int_dot(ws, a) as f32,
    )
}

/// [`super::mxfp4::dot_mxfp4`] of `w` with each of the four rows `a`.
pub fn mxfp4(w: &[u8], a: Rows4<'_>) -> [f32; 4] {
    per_block(
        w,
        a,
        MXFP4_BYTES,
        |b| unpack_table(&mxfp4::KVALUES, &b[1..MXFP4_BYTES]),
        |b, ws, a| mxfp4::e8m0_half(b[0]) * a.d * int_dot(ws, a) as f32,
    )
}

/// [`super::iq4::dot_iq4_xs`] of `w` with each of the four rows `a`: per super-block the
/// sub-block terms are summed first, then added to the row's total, as there.
pub fn iq4_xs(w: &[u8], a: Rows4<'_>) -> [f32; 4] {
    let kb = a[0].len();
    assert!(
        a.iter().all(|r| r.len() == kb) && kb.is_multiple_of(XS_SUB),
        "activation rows differ in length or are not whole super-blocks"
    );
    assert!(
        w.len() >= IQ4_XS_BYTES * (kb / XS_SUB),
        "weight row too short"
    );
    let mut sums = [0f32; 4];
    for (s, b) in w.chunks_exact(IQ4_XS_BYTES).take(kb / XS_SUB).enumerate() {
        let d = f16_at(b, 0);
        let mut parts = [[0f32; XS_SUB]; 4];
        for i in 0..XS_SUB {
            let ws = unpack_table(&iq4::KVALUES, &b[8 + 16 * i..8 + 16 * (i + 1)]);
            let dw = d * iq4::xs_scale(b, i) as f32;
            for (part, row) in parts.iter_mut().zip(&a) {
                let blk = &row[XS_SUB * s + i];
                part[i] = dw * blk.d * int_dot(&ws, blk) as f32;
            }
        }
        for (sum, part) in sums.iter_mut().zip(parts) {
            *sum += part.into_iter().sum::<f32>();
        }
    }
    sums
}
