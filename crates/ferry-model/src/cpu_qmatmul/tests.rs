//! Checks of the CPU quantized matmul against f32 references and candle's `QMatMul`.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use super::activation::{quantize_row, Q8Block, BLOCK};
use super::{Blocks, CpuQMatMul, Kernel};
use crate::header::GgufType;

/// Deterministic pseudo-random values in about [-1, 1] plus a per-index drift.
pub(super) fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|i| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            (2.0 * u - 1.0) + 0.3 * ((i % 7) as f32 - 3.0) / 3.0
        })
        .collect()
}

pub(super) struct Case {
    pub(super) weight: Arc<QTensor>,
    /// Dequantized weight, `[n, k]` row major.
    pub(super) w: Vec<f32>,
    pub(super) n: usize,
    pub(super) k: usize,
}

pub(super) fn case(dtype: GgmlDType, n: usize, k: usize, seed: u64) -> Case {
    let raw = Tensor::from_vec(values(n * k, seed), (n, k), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&raw, dtype).unwrap();
    let w = q
        .dequantize(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    Case {
        weight: Arc::new(q),
        w,
        n,
        k,
    }
}

/// `x` with each 32-block replaced by its int8 quantization, dequantized.
pub(super) fn dequantized_activations(x: &[f32]) -> Vec<f32> {
    let mut blocks = vec![Q8Block::ZERO; x.len() / BLOCK];
    quantize_row(x, &mut blocks);
    blocks
        .iter()
        .flat_map(|b| b.qs.iter().map(move |&q| f32::from(q) * b.d))
        .collect()
}

/// For each output: (f32 dot of `w` and `x`, sum of |w||x|, worst-case activation rounding).
fn reference(c: &Case, x: &[f32], m: usize) -> Vec<(f32, f32, f32)> {
    let mut out = Vec::with_capacity(m * c.n);
    for xi in x.chunks(c.k).take(m) {
        for w in c.w.chunks(c.k) {
            let (mut dot, mut mag, mut bound) = (0f64, 0f64, 0f64);
            for (wb, xb) in w.chunks(BLOCK).zip(xi.chunks(BLOCK)) {
                let step = xb.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                for (&a, &b) in wb.iter().zip(xb) {
                    dot += f64::from(a) * f64::from(b);
                    mag += f64::from(a.abs() * b.abs());
                    bound += f64::from(a.abs()) * f64::from(step) * 0.52;
                }
            }
            out.push((dot as f32, mag as f32, bound as f32));
        }
    }
    out
}

pub(super) fn run(c: &Case, x: &[f32], m: usize, kernel: Kernel) -> Vec<f32> {
    let mm = CpuQMatMul::new(c.weight.clone()).unwrap();
    let mut out = vec![f32::NAN; m * c.n];
    mm.matmul_f32(x, m, &mut out, kernel).unwrap();
    out
}

const SHAPES: [(usize, usize); 7] = [
    (1, 32),
    (3, 64),
    (7, 96),
    (33, 576),
    (64, 288),
    (130, 1536),
    (600, 576),
];

fn check_against_f32(dtype: GgmlDType, kernel: Kernel) {
    for (s, &(n, k)) in SHAPES.iter().enumerate() {
        for m in [1, 2, 5, 17] {
            let c = case(dtype, n, k, 11 + s as u64);
            let x = values(m * k, 1000 + m as u64);
            let got = run(&c, &x, m, kernel);
            // Against unquantized x: within the activation rounding bound.
            for (i, (&g, &(want, mag, bound))) in got.iter().zip(&reference(&c, &x, m)).enumerate()
            {
                let tol = bound + 1e-3 * mag + 1e-5;
                assert!(
                    (g - want).abs() <= tol,
                    "{dtype:?} {kernel:?} {m}x{k}->{n} out {i}: {g} vs {want} (tol {tol})"
                );
            }
            // Against the same quantized activations: only f16 scales and summation order.
            let xq: Vec<f32> = x.chunks(k).flat_map(dequantized_activations).collect();
            for (i, (&g, &(want, mag, _))) in got.iter().zip(&reference(&c, &xq, m)).enumerate() {
                let tol = 1e-3 * mag + 1e-5;
                assert!(
                    (g - want).abs() <= tol,
                    "{dtype:?} {kernel:?} {m}x{k}->{n} out {i}: {g} vs {want} with the same \
                     int8 activations (tol {tol})"
                );
            }
        }
    }
}

#[test]
fn q4_1_matches_dequantized_f32_reference() {
    check_against_f32(GgmlDType::Q4_1, Kernel::Auto);
    check_against_f32(GgmlDType::Q4_1, Kernel::Scalar);
}

#[test]
fn q4_0_matches_dequantized_f32_reference() {
    check_against_f32(GgmlDType::Q4_0, Kernel::Auto);
    check_against_f32(GgmlDType::Q4_0, Kernel::Scalar);
}

#[test]
fn q8_0_matches_dequantized_f32_reference() {
    check_against_f32(GgmlDType::Q8_0, Kernel::Auto);
    check_against_f32(GgmlDType::Q8_0, Kernel::Scalar);
}

#[test]
fn simd_and_scalar_kernels_agree() {
    for dtype in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q8_0] {
        for (s, &(n, k)) in SHAPES.iter().enumerate() {
            let c = case(dtype, n, k, 77 + s as u64);
            let x = values(3 * k, 5);
            let auto = run(&c, &x, 3, Kernel::Auto);
            let scalar = run(&c, &x, 3, Kernel::Scalar);
            for (a, b) in auto.iter().zip(&scalar) {
                assert!(
                    super::test_support::close(*a, *b, k),
                    "{dtype:?} {k}->{n}: simd {a} vs scalar {b}"
                );
            }
        }
    }
}

#[test]
fn matches_candle_qmatmul() {
    // candle's Q4_1 kernel wants an even number of blocks per row.
    for dtype in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q8_0] {
        for (n, k) in [(1, 64), (5, 128), (33, 576), (130, 1536), (600, 576)] {
            for m in [1, 4] {
                let c = case(dtype, n, k, 3);
                let x = values(m * k, 9);
                let xt = Tensor::from_vec(x.clone(), (m, k), &Device::Cpu).unwrap();
                let want = QMatMul::from_arc(c.weight.clone())
                    .unwrap()
                    .forward(&xt)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap();
                for kernel in [Kernel::Auto, Kernel::Scalar] {
                    let got = run(&c, &x, m, kernel);
                    for (i, (&g, &(_, mag, _))) in got.iter().zip(&reference(&c, &x, m)).enumerate()
                    {
                        let tol = 1e-4 * mag + 1e-5;
                        assert!(
                            (g - want[i]).abs() <= tol,
                            "{dtype:?} {kernel:?} {m}x{k}->{n} out {i}: {g} vs candle {}",
                            want[i]
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn forward_keeps_leading_dims_and_rejects_bad_input() {
    let c = case(GgmlDType::Q4_1, 10, 64, 1);
    let mm = CpuQMatMul::new(c.weight.clone()).unwrap();
    assert_eq!((mm.out_features(), mm.in_features()), (10, 64));
    let x = values(2 * 3 * 64, 4);
    let xt = Tensor::from_vec(x.clone(), (2, 3, 64), &Device::Cpu).unwrap();
    let y = mm.forward(&xt).unwrap();
    assert_eq!(y.dims(), &[2, 3, 10]);
    let flat = y.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    assert_eq!(flat, run(&c, &x, 6, Kernel::Auto));
    // A non-contiguous view gives the same answer as its contiguous copy.
    let wide = Tensor::from_vec(values(6 * 128, 4), (6, 128), &Device::Cpu).unwrap();
    let view = wide.narrow(1, 64, 64).unwrap();
    let a = mm.forward(&view).unwrap().to_vec2::<f32>().unwrap();
    let b = mm
        .forward(&view.contiguous().unwrap())
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
    assert_eq!(a, b);
    let bad = Tensor::zeros((1, 32), candle_core::DType::F32, &Device::Cpu).unwrap();
    assert!(mm.forward(&bad).is_err());
    assert!(mm.matmul_f32(&x, 5, &mut [0.0; 50], Kernel::Auto).is_err());
}

#[test]
fn rejects_formats_without_a_kernel() {
    // IQ2_XXS: 256 elements in 66 bytes, no kernel here.
    assert!(!CpuQMatMul::supports(GgufType::IQ2_XXS));
    let blocks = Blocks::owned(vec![0; 2 * 66], GgufType::IQ2_XXS, &[2, 256]).unwrap();
    assert!(CpuQMatMul::from_blocks(blocks).is_err());
    // Blocks must hold exactly their shape's bytes.
    assert!(Blocks::owned(vec![0; 17], GgufType::Q4_0, &[1, 32]).is_err());
    assert!(Blocks::owned(vec![0; 18], GgufType::Q4_0, &[1, 33]).is_err());
}

/// Builds one matrix per `(dtype, rows)` of `cols` inputs and checks that `forward_many` gives,
/// for every `m` in `ms`, each matrix's own `forward` bit for bit; returns the matrices.
pub(super) fn assert_forward_many_equals_forwards(
    types: &[(GgmlDType, usize)],
    cols: usize,
    ms: &[usize],
) -> Vec<CpuQMatMul> {
    let mats: Vec<CpuQMatMul> = types
        .iter()
        .enumerate()
        .map(|(i, &(dtype, n))| CpuQMatMul::new(case(dtype, n, cols, i as u64).weight).unwrap())
        .collect();
    let refs: Vec<&CpuQMatMul> = mats.iter().collect();
    for &m in ms {
        let x = Tensor::from_vec(values(m * cols, 5), (1, m, cols), &Device::Cpu).unwrap();
        let many = CpuQMatMul::forward_many(&refs, &x, Kernel::Auto).unwrap();
        assert_eq!(many.len(), mats.len());
        for (mm, y) in mats.iter().zip(&many) {
            assert_eq!(y.dims(), &[1, m, mm.out_features()]);
            let one = mm
                .forward(&x)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            assert_eq!(y.flatten_all().unwrap().to_vec1::<f32>().unwrap(), one);
        }
    }
    mats
}

#[test]
fn forward_many_equals_separate_forwards() {
    let mats = assert_forward_many_equals_forwards(
        &[
            (GgmlDType::Q4_1, 96),
            (GgmlDType::Q8_0, 32),
            (GgmlDType::Q4_0, 200),
        ],
        576,
        &[1, 3, 40],
    );
    let refs: Vec<&CpuQMatMul> = mats.iter().collect();
    let bad = Tensor::zeros((1, 2, 64), candle_core::DType::F32, &Device::Cpu).unwrap();
    assert!(CpuQMatMul::forward_many(&refs, &bad, Kernel::Auto).is_err());
}
