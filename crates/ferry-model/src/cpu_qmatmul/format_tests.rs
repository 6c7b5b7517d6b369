//! Checks of the Q5_0 / Q5_1 and k-quant (Q2_K..Q6_K) kernels: against f32 references built
//! from candle's own dequantization of the same bytes, scalar against SIMD, and against
//! candle's `QMatMul`.

use std::borrow::Cow;
use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{Device, Module, Tensor};
use half::f16;

use super::activation::{quantize_row, Q8Block, BLOCK};
use super::kquants::activation::{quantize_row_k, Q8KBlock, QK_K};
use super::test_support::random_bytes;
use super::tests::{assert_forward_many_equals_forwards, case, run, values, Case};
use super::{CpuQMatMul, Kernel};
use crate::header::GgufType;

const Q5: [GgmlDType; 2] = [GgmlDType::Q5_0, GgmlDType::Q5_1];
const KQUANTS: [GgmlDType; 5] = [
    GgmlDType::Q2K,
    GgmlDType::Q3K,
    GgmlDType::Q4K,
    GgmlDType::Q5K,
    GgmlDType::Q6K,
];

fn is_k(dtype: GgmlDType) -> bool {
    KQUANTS.contains(&dtype)
}

/// Elements per activation block the kernels of `dtype` read.
fn act_block(dtype: GgmlDType) -> usize {
    if is_k(dtype) {
        QK_K
    } else {
        BLOCK
    }
}

/// Weight shapes `(n, k)`: odd row counts, one block, and rows enough for a partial last task.
fn shapes(dtype: GgmlDType) -> Vec<(usize, usize)> {
    if is_k(dtype) {
        vec![
            (1, 256),
            (3, 512),
            (7, 768),
            (33, 1536),
            (130, 2048),
            (257, 512),
        ]
    } else {
        vec![
            (1, 32),
            (3, 64),
            (7, 96),
            (33, 576),
            (130, 1536),
            (601, 576),
        ]
    }
}

/// `x` with each activation block replaced by its int8 quantization, dequantized.
fn dequantized_activations(dtype: GgmlDType, x: &[f32]) -> Vec<f32> {
    if is_k(dtype) {
        let mut blocks = vec![Q8KBlock::ZERO; x.len() / QK_K];
        quantize_row_k(x, &mut blocks);
        blocks
            .iter()
            .flat_map(|b| b.qs.iter().map(move |&q| f32::from(q) * b.d))
            .collect()
    } else {
        let mut blocks = vec![Q8Block::ZERO; x.len() / BLOCK];
        quantize_row(x, &mut blocks);
        blocks
            .iter()
            .flat_map(|b| b.qs.iter().map(move |&q| f32::from(q) * b.d))
            .collect()
    }
}

/// For each output: (f64 dot of `w` and `x`, sum of |w||x|, worst-case activation rounding
/// for activation blocks of `block` elements).
fn reference(c: &Case, x: &[f32], m: usize, block: usize) -> Vec<(f32, f32, f32)> {
    let mut out = Vec::with_capacity(m * c.n);
    for xi in x.chunks(c.k).take(m) {
        for w in c.w.chunks(c.k) {
            let (mut dot, mut mag, mut bound) = (0f64, 0f64, 0f64);
            for (wb, xb) in w.chunks(block).zip(xi.chunks(block)) {
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

fn check_against_f32(dtype: GgmlDType, kernel: Kernel) {
    let block = act_block(dtype);
    for (s, (n, k)) in shapes(dtype).into_iter().enumerate() {
        let c = case(dtype, n, k, 21 + s as u64);
        for m in [1, 3, 17] {
            let x = values(m * k, 2000 + m as u64);
            let got = run(&c, &x, m, kernel);
            // Against unquantized x: within the activation rounding bound.
            for (i, (&g, &(want, mag, bound))) in
                got.iter().zip(&reference(&c, &x, m, block)).enumerate()
            {
                let tol = bound + 1e-4 * mag + 1e-5;
                assert!(
                    (g - want).abs() <= tol,
                    "{dtype:?} {kernel:?} {m}x{k}->{n} out {i}: {g} vs {want} (tol {tol})"
                );
            }
            // Against the same quantized activations: only f32 rounding and summation order,
            // and for Q5_1 the f16 rounding of the block sum its offset term uses (as Q4_1).
            let rel = if dtype == GgmlDType::Q5_1 { 1e-3 } else { 1e-5 };
            let xq: Vec<f32> = x
                .chunks(k)
                .flat_map(|r| dequantized_activations(dtype, r))
                .collect();
            for (i, (&g, &(want, mag, _))) in
                got.iter().zip(&reference(&c, &xq, m, block)).enumerate()
            {
                let tol = rel * mag + 1e-6;
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
fn q5_matches_dequantized_f32_reference() {
    for dtype in Q5 {
        check_against_f32(dtype, Kernel::Auto);
        check_against_f32(dtype, Kernel::Scalar);
    }
}

#[test]
fn kquants_match_dequantized_f32_reference() {
    for dtype in KQUANTS {
        check_against_f32(dtype, Kernel::Auto);
        check_against_f32(dtype, Kernel::Scalar);
    }
}

/// Bytes of `dtype` blocks, and where in a block its f16 scales sit.
fn layout(dtype: GgmlDType) -> (usize, &'static [usize]) {
    match dtype {
        GgmlDType::Q5_0 => (22, &[0]),
        GgmlDType::Q5_1 => (24, &[0, 2]),
        GgmlDType::Q2K => (84, &[80, 82]),
        GgmlDType::Q3K => (110, &[108]),
        GgmlDType::Q4K => (144, &[0, 2]),
        GgmlDType::Q5K => (176, &[0, 2]),
        GgmlDType::Q6K => (210, &[208]),
        other => panic!("no layout for {other:?}"),
    }
}

/// A weight of arbitrary bytes (every bit pattern of quants, high bits and packed scales),
/// with finite f16 scales, and its dequantization by candle.
fn random_blocks(dtype: GgmlDType, n: usize, k: usize, seed: u64) -> Case {
    let (bytes, scales) = layout(dtype);
    let blocks = n * k / act_block(dtype);
    let mut data = random_bytes(blocks * bytes, seed);
    for (b, block) in data.chunks_exact_mut(bytes).enumerate() {
        for (j, &at) in scales.iter().enumerate() {
            let v = (((b * 7 + j * 3) % 19) as f32 - 9.0) * 0.003 + 0.0005;
            block[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
    }
    let storage = QStorage::from_data(Cow::Owned(data), &Device::Cpu, dtype).unwrap();
    let q = QTensor::new(storage, (n, k)).unwrap();
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

#[test]
fn arbitrary_blocks_match_candles_dequantization() {
    for dtype in Q5.into_iter().chain(KQUANTS) {
        let block = act_block(dtype);
        for (n, k) in [(5, 512), (67, 1024)] {
            let c = random_blocks(dtype, n, k, 5 + n as u64);
            for m in [1, 3] {
                let x = values(m * k, 40 + m as u64);
                let xq: Vec<f32> = x
                    .chunks(k)
                    .flat_map(|r| dequantized_activations(dtype, r))
                    .collect();
                let want = reference(&c, &xq, m, block);
                let rel = if dtype == GgmlDType::Q5_1 { 1e-3 } else { 1e-5 };
                for kernel in [Kernel::Auto, Kernel::Scalar] {
                    let got = run(&c, &x, m, kernel);
                    for (i, (&g, &(want, mag, _))) in got.iter().zip(&want).enumerate() {
                        let tol = rel * mag + 1e-6;
                        assert!(
                            (g - want).abs() <= tol,
                            "{dtype:?} {kernel:?} {m}x{k}->{n} out {i}: {g} vs {want} (tol {tol})"
                        );
                    }
                }
            }
        }
    }
}

/// The k-quant kernels reduce each block to the same exact integers and combine them in the
/// same order ([`super::kquants`]), so SIMD and scalar agree bit for bit; the Q5 SIMD kernels
/// accumulate in eight f32 lanes, so they agree to float summation order.
#[test]
fn simd_and_scalar_kernels_agree() {
    for dtype in Q5.into_iter().chain(KQUANTS) {
        for (s, (n, k)) in shapes(dtype).into_iter().enumerate() {
            let cases = [
                case(dtype, n, k, 77 + s as u64),
                random_blocks(dtype, n, k, 78 + s as u64),
            ];
            // 3 rows: the one-row dots; 9: the four-row kernels and a leftover row.
            for (c, m) in cases.iter().flat_map(|c| [(c, 3), (c, 9)]) {
                let x = values(m * k, 5);
                let auto = run(c, &x, m, Kernel::Auto);
                let scalar = run(c, &x, m, Kernel::Scalar);
                if is_k(dtype) {
                    assert_eq!(auto, scalar, "{dtype:?} {k}->{n}");
                    continue;
                }
                for (a, b) in auto.iter().zip(&scalar) {
                    assert!(
                        (a - b).abs() <= 1e-5 * (1.0 + b.abs()) * (k as f32).sqrt(),
                        "{dtype:?} {k}->{n}: simd {a} vs scalar {b}"
                    );
                }
            }
        }
    }
}

#[test]
fn matches_candle_qmatmul() {
    for dtype in Q5.into_iter().chain(KQUANTS) {
        let block = act_block(dtype);
        // candle's Q5 kernels want an even number of blocks per row (and panic otherwise,
        // poisoning its thread pool for every later test).
        let even = |&(_, k): &(usize, usize)| (k / block).is_multiple_of(2);
        for (n, k) in shapes(dtype).into_iter().filter(even) {
            let c = case(dtype, n, k, 3);
            for m in [1, 4] {
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
                let mags = reference(&c, &x, m, block);
                for kernel in [Kernel::Auto, Kernel::Scalar] {
                    let got = run(&c, &x, m, kernel);
                    for (i, (&g, &(_, mag, _))) in got.iter().zip(&mags).enumerate() {
                        let tol = 1e-5 * mag + 1e-6;
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
fn supports_and_checks_block_sizes() {
    for dtype in Q5.into_iter().chain(KQUANTS) {
        assert!(
            CpuQMatMul::supports(GgufType::from_candle(dtype)),
            "{dtype:?}"
        );
    }
    // A k-quant row of 256 elements is one block; a shape that does not match the bytes is
    // refused, not read out of bounds.
    let c = case(GgmlDType::Q4K, 2, 256, 1);
    let data = c.weight.data().unwrap().into_owned();
    let storage = QStorage::from_data(Cow::Owned(data), &Device::Cpu, GgmlDType::Q4K).unwrap();
    let wrong = QTensor::new(storage, (1, 512)).unwrap();
    let mm = CpuQMatMul::new(Arc::new(wrong));
    assert!(mm.is_ok(), "1 x 512 holds the same two blocks");
    let storage =
        QStorage::from_data(Cow::Owned(vec![0u8; 144]), &Device::Cpu, GgmlDType::Q4K).unwrap();
    assert!(QTensor::new(storage, (2, 256))
        .map(|q| CpuQMatMul::new(Arc::new(q)).is_err())
        .unwrap_or(true));
}

#[test]
fn forward_many_mixes_activation_kinds() {
    assert_forward_many_equals_forwards(
        &[
            (GgmlDType::Q4K, 96),
            (GgmlDType::Q5_0, 40),
            (GgmlDType::Q6K, 33),
            (GgmlDType::Q4_1, 8),
        ],
        512,
        &[1, 3, 17],
    );
}
