//! Activation quantization for the CPU quantized matmul: each row of `x` is cut into 32-wide
//! blocks, each stored as signed 8-bit integers with one scale (llama.cpp's Q8_1 layout, kept
//! unpacked in memory).
//!
//! The rounding follows candle's `BlockQ8_1::from_float` (and ggml's `quantize_row_q8_1`): the
//! scale is `max|x| / 127` rounded to f16, values are `round(x / scale)` with the unrounded
//! scale, and the block sum is stored as `f16(f16(sum) * scale)`. Doing the same keeps this
//! path's results within float summation order of candle's `QMatMul`.

use half::f16;

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

/// Quantizes one row `x` (its length a multiple of [`BLOCK`]) into `out` (`x.len() / BLOCK`
/// blocks).
pub fn quantize_row(x: &[f32], out: &mut [Q8Block]) {
    for (block, xs) in out.iter_mut().zip(x.chunks_exact(BLOCK)) {
        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let d16 = f16::from_f32(d);
        let mut sum = 0i32;
        for (q, &v) in block.qs.iter_mut().zip(xs) {
            // `as i8` saturates; |v * id| <= 127 up to rounding, so nothing is clipped.
            *q = (v * id).round() as i8;
            sum += i32::from(*q);
        }
        block.d = d16.to_f32();
        block.s = (f16::from_f32(sum as f32) * d16).to_f32();
        block.isum = sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
