//! Activation quantization for the k-quant kernels: each row of `x` is cut into 256-wide
//! super-blocks, each stored as signed 8-bit integers with one f32 scale and the sums of its
//! sixteen 16-element groups (llama.cpp's Q8_K idea).
//!
//! The rounding follows candle's `BlockQ8K::from_float`: the value of largest magnitude `max`
//! (the first one, if several tie) maps to -127, every value is `round(x * -127 / max)`, and the
//! scale is `-max / 127`. Doing the same keeps this path within float summation order of
//! candle's `QMatMul` on the same weights.

use super::super::activation::round_to_i8;

/// Elements per super-block, for these activations and every k-quant weight format.
pub const QK_K: usize = 256;

/// Elements per group summed in [`Q8KBlock::bsums`].
pub const GROUP: usize = 16;

/// One quantized 256-element super-block of an activation row.
#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C, align(32))]
pub struct Q8KBlock {
    /// The quantized values.
    pub qs: [i8; QK_K],
    /// `bsums[g] = sum(qs[16 g..16 g + 16])`, used by the weight formats' offset terms.
    pub bsums: [i16; QK_K / GROUP],
    /// Scale: element `j` is approximately `d * qs[j]`.
    pub d: f32,
}

impl Q8KBlock {
    /// A zero block (used to size scratch buffers before they are filled).
    pub const ZERO: Q8KBlock = Q8KBlock {
        qs: [0; QK_K],
        bsums: [0; QK_K / GROUP],
        d: 0.0,
    };
}

/// Quantizes one row `x` (its length a multiple of [`QK_K`]) into `out` (`x.len() / QK_K`
/// blocks); on AVX2 by [`crate::cpu_qmatmul::activation_avx2`], equal bit for bit.
pub fn quantize_row_k(x: &[f32], out: &mut [Q8KBlock]) {
    let (blocks, _) = x.as_chunks::<QK_K>();
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = crate::cpu_qmatmul::activation_avx2::Avx2::detect() {
        for (block, xs) in out.iter_mut().zip(blocks) {
            if !k.block_q8k(xs, block) {
                quantize_block_k(xs, block);
            }
        }
        return;
    }
    for (block, xs) in out.iter_mut().zip(blocks) {
        quantize_block_k(xs, block);
    }
}

/// [`quantize_row_k`]'s block, in scalar code.
pub(crate) fn quantize_block_k(xs: &[f32; QK_K], block: &mut Q8KBlock) {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in xs {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        *block = Q8KBlock::ZERO;
        return;
    }
    let iscale = -127.0 / max;
    for (q, &v) in block.qs.iter_mut().zip(xs) {
        // |v * iscale| <= 127 up to rounding; the saturation only guards that rounding.
        *q = round_to_i8(iscale * v);
    }
    for (s, g) in block.bsums.iter_mut().zip(block.qs.chunks_exact(GROUP)) {
        // At most 16 * 128 in magnitude, so it fits an i16.
        *s = g.iter().map(|&q| i16::from(q)).sum();
    }
    block.d = 1.0 / iscale;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_reconstruct_the_row_within_half_a_step() {
        let x: Vec<f32> = (0..2 * QK_K)
            .map(|i| ((i * 37) % 23) as f32 * 0.17 - 1.9 + (i / 97) as f32 * 0.3)
            .collect();
        let mut q = vec![Q8KBlock::ZERO; 2];
        quantize_row_k(&x, &mut q);
        for (b, xs) in q.iter().zip(x.chunks_exact(QK_K)) {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!((b.d.abs() - amax / 127.0).abs() <= amax / 127.0 * 1e-6);
            for (&qv, &v) in b.qs.iter().zip(xs) {
                assert!((f32::from(qv) * b.d - v).abs() <= b.d.abs() * 0.5001);
            }
            for (g, &s) in b.bsums.iter().enumerate() {
                let want: i32 = b.qs[g * GROUP..(g + 1) * GROUP]
                    .iter()
                    .map(|&v| i32::from(v))
                    .sum();
                assert_eq!(i32::from(s), want);
            }
        }
    }

    #[test]
    fn the_largest_value_maps_to_minus_127_and_zero_to_zero() {
        let mut x = vec![0.25f32; QK_K];
        x[7] = -3.0;
        let mut q = vec![Q8KBlock::ZERO; 2];
        q[1].qs[3] = 9;
        x.extend([0f32; QK_K]);
        quantize_row_k(&x, &mut q);
        assert_eq!(q[0].qs[7], -127);
        assert_eq!(q[0].qs[0], (0.25f32 * 127.0 / 3.0).round() as i8);
        assert_eq!(q[1], Q8KBlock::ZERO);
    }
}
