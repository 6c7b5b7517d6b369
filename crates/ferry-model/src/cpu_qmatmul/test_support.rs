//! Seeded data for the kernel tests: raw block bytes of every bit pattern ([`random_bytes`], from
//! `ferry-testkit`, which `benches/qmatmul_kernels.rs` takes too), drifting f32 values, a
//! quantized weight made of them, and the tiled matmul's outputs for a set of weights.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::kquants::KFormat;
use super::tile::Tiling;
use super::{matmul_many_with, CpuQMatMul, Kernel};

pub(crate) use ferry_testkit::random_bytes;

/// `n` pseudo-random values in [-1, 1) scaled by `1 + i % period` (so magnitudes vary along a
/// row).
pub(crate) fn drift_values(n: usize, seed: u64, period: usize) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * (1.0 + (i % period) as f32)
        })
        .collect()
}

/// An `n x k` weight of `dtype`, quantized by candle from [`drift_values`].
pub(crate) fn matrix(dtype: GgmlDType, n: usize, k: usize, seed: u64, period: usize) -> CpuQMatMul {
    let raw = Tensor::from_vec(drift_values(n * k, seed, period), (n, k), &Device::Cpu).unwrap();
    CpuQMatMul::new(Arc::new(QTensor::quantize(&raw, dtype).unwrap())).unwrap()
}

/// The outputs of one [`matmul_many_with`] call over `mats` with `m` activation rows `x`
/// (NaN-filled beforehand, so an output the call skips shows).
pub(crate) fn outputs(
    mats: &[CpuQMatMul],
    x: &[f32],
    m: usize,
    kernel: Kernel,
    tiling: Tiling,
) -> Vec<Vec<f32>> {
    let mut outs: Vec<Vec<f32>> = mats
        .iter()
        .map(|mm| vec![f32::NAN; m * mm.out_features()])
        .collect();
    let mut jobs: Vec<(&CpuQMatMul, &mut [f32])> = mats
        .iter()
        .zip(outs.iter_mut().map(Vec::as_mut_slice))
        .collect();
    matmul_many_with(&mut jobs, x, m, kernel, tiling).unwrap();
    outs
}

/// The float tolerance between two kernels' results for `k` input features (the same integer
/// block sums, summed in another order).
pub(crate) fn close(a: f32, b: f32, k: usize) -> bool {
    (a - b).abs() <= 1e-5 * (1.0 + b.abs()) * (k as f32).sqrt()
}

/// `n` rows of `kb` random super-blocks of `format` with small finite f16 scales.
pub(crate) fn k_quant_weights(format: KFormat, n: usize, kb: usize, seed: u64) -> Vec<u8> {
    let bytes = format.block_bytes();
    let mut w = random_bytes(bytes * n * kb, seed);
    // The f16 `d` (and `dmin`) of each block: 2^-8..2^-7 (exponent 7), any mantissa.
    let scale_at: &[usize] = match format {
        KFormat::Q2K => &[80, 82],
        KFormat::Q3K => &[108],
        KFormat::Q4K | KFormat::Q5K => &[0, 2],
        KFormat::Q6K => &[208],
    };
    for b in w.chunks_exact_mut(bytes) {
        for &at in scale_at {
            b[at + 1] = 0x1C | (b[at + 1] & 0x83);
        }
    }
    w
}
