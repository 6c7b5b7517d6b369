//! Activation quantization for the CPU quantized matmul: each row of `x` is cut into 32-wide
//! blocks, each stored as signed 8-bit integers with one scale (llama.cpp's Q8_1 layout, kept
//! unpacked in memory).
//!
//! The rounding follows candle's `BlockQ8_1::from_float` (and ggml's `quantize_row_q8_1`): the
//! scale is `max|x| / 127` rounded to f16, values are `round(x / scale)` with the unrounded
//! scale, and the block sum is stored as `f16(f16(sum) * scale)`. Doing the same keeps this
//! path's results within float summation order of candle's `QMatMul`.
//!
//! The k-quant formats read 256-element blocks instead ([`super::kquants::activation`]);
//! [`Activations`] holds one input quantized once for each [`ActKind`] its weights need.

use half::f16;
use rayon::prelude::*;

use super::kquants::activation::{quantize_row_k, Q8KBlock, QK_K};

/// Elements per block, for activations and for every supported weight format.
pub const BLOCK: usize = 32;

/// One quantized 32-element block of an activation row.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C, align(16))]
pub struct Q8Block {
    /// Scale: element `j` is approximately `d * qs[j]`.
    pub d: f32,
    /// `d * sum(qs)` as ggml stores it (through f16), used by the Q4_1 offset term.
    pub s: f32,
    /// `sum(qs)` exactly, used by the Q4_0 offset term.
    pub isum: i32,
    /// The quantized values.
    pub qs: [i8; BLOCK],
}

impl Q8Block {
    /// A zero block (used to size scratch buffers before they are filled).
    pub const ZERO: Q8Block = Q8Block {
        d: 0.0,
        s: 0.0,
        isum: 0,
        qs: [0; BLOCK],
    };
}

/// `x.round()` (half away from zero) saturated to `i8`, NaN to 0: `x.round() as i8` in a form
/// the compiler vectorizes (`f32::round` is a call to libm's `roundf` per element on x86-64's
/// baseline). After the clamp `|x| <= 128`, so the truncation `t` and the fraction `x - t` are
/// exact, and one step away from zero where `|x - t| >= 0.5` is the rounding. Equal to
/// `x.round().clamp(-128.0, 127.0) as i8` for every f32 (checked over all of them once; the
/// test covers the edges).
#[inline(always)]
pub fn round_to_i8(x: f32) -> i8 {
    let x = x.clamp(-128.0, 127.0);
    let t = x as i32;
    let frac = x - t as f32;
    (t + i32::from(frac >= 0.5) - i32::from(frac <= -0.5)) as i8
}

/// Quantizes one row `x` (its length a multiple of [`BLOCK`]) into `out` (`x.len() / BLOCK`
/// blocks); on AVX2 by [`super::activation_avx2`], equal bit for bit.
pub fn quantize_row(x: &[f32], out: &mut [Q8Block]) {
    let (blocks, _) = x.as_chunks::<BLOCK>();
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = super::activation_avx2::Avx2::detect() {
        for (block, xs) in out.iter_mut().zip(blocks) {
            k.block_q8(xs, block);
        }
        return;
    }
    for (block, xs) in out.iter_mut().zip(blocks) {
        quantize_block(xs, block);
    }
}

/// [`quantize_row`]'s block, in scalar code.
pub(super) fn quantize_block(xs: &[f32; BLOCK], block: &mut Q8Block) {
    let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let d16 = f16::from_f32(d);
    let mut sum = 0i32;
    for (q, &v) in block.qs.iter_mut().zip(xs) {
        // |v * id| <= 127 up to rounding, so nothing is clipped.
        *q = round_to_i8(v * id);
        sum += i32::from(*q);
    }
    block.d = d16.to_f32();
    block.s = (f16::from_f32(sum as f32) * d16).to_f32();
    block.isum = sum;
}

/// Which quantized activations a weight format's kernel reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActKind {
    /// 32-element [`Q8Block`]s (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
    Q8,
    /// 256-element [`Q8KBlock`]s (the k-quants).
    Q8K,
}

/// One matmul input of `m` rows, quantized once for each kind some weight needs (the others
/// stay empty).
#[derive(Debug, Default)]
pub struct Activations {
    q8: Vec<Q8Block>,
    q8k: Vec<Q8KBlock>,
    /// Blocks per row of each kind.
    per_row: (usize, usize),
}

/// Input row `i` of an [`Activations`], in every kind it was quantized to.
#[derive(Debug, Clone, Copy)]
pub struct ActRow<'a> {
    /// The 32-element blocks (empty unless [`ActKind::Q8`] was asked for).
    pub q8: &'a [Q8Block],
    /// The 256-element blocks (empty unless [`ActKind::Q8K`] was asked for).
    pub q8k: &'a [Q8KBlock],
}

impl Activations {
    /// Quantizes the rows of `x` (each `k` wide; `k` a multiple of 32, and of 256 if
    /// [`ActKind::Q8K`] is among `kinds`) for each of `kinds`, over rayon's pool when `parallel`.
    pub fn quantize(
        x: &[f32],
        k: usize,
        kinds: impl IntoIterator<Item = ActKind>,
        parallel: bool,
    ) -> Self {
        let mut out = Activations::default();
        for kind in kinds {
            match kind {
                ActKind::Q8 if out.per_row.0 == 0 => {
                    out.per_row.0 = k / BLOCK;
                    out.q8 = quantized(x, k, BLOCK, Q8Block::ZERO, parallel, quantize_row);
                }
                ActKind::Q8K if out.per_row.1 == 0 => {
                    out.per_row.1 = k / QK_K;
                    out.q8k = quantized(x, k, QK_K, Q8KBlock::ZERO, parallel, quantize_row_k);
                }
                _ => {}
            }
        }
        out
    }

    /// Input row `i`.
    pub fn row(&self, i: usize) -> ActRow<'_> {
        let (a, b) = self.per_row;
        ActRow {
            q8: self.q8.get(i * a..(i + 1) * a).unwrap_or(&[]),
            q8k: self.q8k.get(i * b..(i + 1) * b).unwrap_or(&[]),
        }
    }
}

/// Every row of `x` (each `k` wide) quantized by `row` into blocks of `block` elements.
fn quantized<B: Copy + Send + Sync>(
    x: &[f32],
    k: usize,
    block: usize,
    zero: B,
    parallel: bool,
    row: fn(&[f32], &mut [B]),
) -> Vec<B> {
    let per_row = k / block;
    let mut out = vec![zero; x.len() / block];
    if per_row == 0 {
        return out;
    }
    if parallel {
        out.par_chunks_mut(per_row)
            .zip(x.par_chunks(k))
            .for_each(|(a, x)| row(x, a));
    } else {
        for (a, x) in out.chunks_mut(per_row).zip(x.chunks(k)) {
            row(x, a);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_to_i8_is_round_then_saturate_at_every_edge() {
        let below = |x: f32| f32::from_bits(x.to_bits() - 1);
        let above = |x: f32| f32::from_bits(x.to_bits() + 1);
        let mut xs = vec![
            0.0,
            -0.0,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1e10,
            -1e10,
        ];
        for k in -130..=130 {
            let half = k as f32 + 0.5;
            xs.extend([k as f32, half, below(half.abs()), above(half.abs())]);
            xs.extend([-half, -below(half.abs()), -above(half.abs())]);
        }
        xs.extend((0..100_000).map(|i| (i as f32 - 50_000.0) * 0.002_71));
        for x in xs {
            let want = if x.is_nan() {
                0
            } else {
                x.round().clamp(-128.0, 127.0) as i8
            };
            assert_eq!(round_to_i8(x), want, "{x:e}");
        }
    }

    #[test]
    fn blocks_reconstruct_the_row_within_half_a_step() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37) % 23) as f32 * 0.17 - 1.9)
            .collect();
        let mut q = vec![Q8Block::ZERO; 2];
        quantize_row(&x, &mut q);
        for (b, xs) in q.iter().zip(x.chunks_exact(BLOCK)) {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!((b.d - amax / 127.0).abs() <= amax / 127.0 * 1e-3);
            for (&qv, &v) in b.qs.iter().zip(xs) {
                assert!((f32::from(qv) * b.d - v).abs() <= b.d * 0.51 + 1e-3 * amax.max(1.0));
            }
            let sum: i32 = b.qs.iter().map(|&v| i32::from(v)).sum();
            assert_eq!(b.isum, sum);
            assert!((b.s - b.d * sum as f32).abs() <= (b.d * sum as f32).abs() * 2e-3 + 1e-6);
        }
    }

    #[test]
    fn zero_block_quantizes_to_zero() {
        let mut q = vec![Q8Block::ZERO; 1];
        q[0].qs[3] = 9;
        quantize_row(&[0.0; BLOCK], &mut q);
        assert_eq!(q[0], Q8Block::ZERO);
    }
}
