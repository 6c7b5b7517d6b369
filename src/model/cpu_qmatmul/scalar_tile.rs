//! Portable dot products of one raw GGUF weight row with four quantized activation rows at
//! once (the scalar micro-kernels of [`super::tile`]): each weight block is unpacked once for
//! the four rows. Every output is the same sum, in the same order, as the one-row kernel in
//! [`super::scalar`] (block layouts are described there), so the results are equal.

use super::activation::{Q8Block, BLOCK};
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
