//! The tiled loop against the one-row loop: equal results, bit for bit, for every format,
//! kernel and row count (including partial four-row groups and partial tasks); the four-row
//! kernels of Q4_0, Q4_1, Q8_0, Q5_0 and Q5_1 (AVX2, AVX-VNNI on 16 and 32 registers, scalar)
//! against the one-row dots.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::super::activation::{quantize_row, ActRow, Q8Block};
use super::super::{CpuQMatMul, Dot, Format, Kernel};
use super::{rows4, Tiling};
use crate::cpu_qmatmul::test_support::{self, outputs};
use crate::header::GgufType;

/// How often the values' magnitude scale repeats along a row.
const DRIFT: usize = 5;

fn values(n: usize, seed: u64) -> Vec<f32> {
    test_support::drift_values(n, seed, DRIFT)
}

fn matrix(dtype: GgmlDType, n: usize, k: usize, seed: u64) -> CpuQMatMul {
    test_support::matrix(dtype, n, k, seed, DRIFT)
}

fn ty(dtype: GgmlDType) -> GgufType {
    GgufType::from_candle(dtype)
}

const FORMATS: [GgmlDType; 5] = [
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q8_0,
    GgmlDType::Q5_0,
    GgmlDType::Q5_1,
];

/// Every kernel choice.
const KERNELS: [Kernel; 5] = [
    Kernel::Auto,
    Kernel::Avx512,
    Kernel::AvxVnni,
    Kernel::Avx2,
    Kernel::Scalar,
];

#[test]
fn tiled_equals_per_row_for_every_row_count() {
    // k = 96 and 576 have an odd and an even number of blocks; 700 rows make partial tasks.
    for dtype in FORMATS {
        for (n, k) in [(5, 96), (70, 576), (700, 64)] {
            let mats = [matrix(dtype, n, k, 3), matrix(dtype, 3, k, 4)];
            for m in [1, 2, 3, 4, 5, 17, 64, 67, 130] {
                let x = values(m * k, 100 + m as u64);
                for kernel in KERNELS {
                    let tiled = outputs(&mats, &x, m, kernel, Tiling::Tiled);
                    let per_row = outputs(&mats, &x, m, kernel, Tiling::PerRow);
                    assert!(tiled.iter().flatten().all(|v| v.is_finite()));
                    #[cfg(target_arch = "x86_64")]
                    if !super::super::avx512_tests::exact_per_row(ty(dtype), kernel, m) {
                        // Q8_0's prompt through the AMX GEMM (bit for bit the AVX-512 row
                        // kernel, amx_panel_tests.rs), its per-row loop through the AVX2 row
                        // kernel: the same integer sums, summed in another order.
                        let pairs = tiled.iter().flatten().zip(per_row.iter().flatten());
                        for (a, b) in pairs {
                            assert!(
                                test_support::close(*a, *b, k),
                                "{dtype:?} m={m}: {a} vs {b}"
                            );
                        }
                        continue;
                    }
                    assert_eq!(tiled, per_row, "{dtype:?} {kernel:?} m={m} {k}->{n}");
                }
            }
        }
    }
}

#[test]
fn four_row_kernels_equal_four_one_row_dots() {
    for dtype in FORMATS {
        let format = Format::of(GgufType::from_candle(dtype)).unwrap();
        for kb in [1, 2, 3, 18] {
            let mm = matrix(dtype, 1, 32 * kb, 9);
            let data = mm.weight.bytes().unwrap();
            let x = values(4 * 32 * kb, 21);
            let mut act = vec![Q8Block::ZERO; 4 * kb];
            for (a, x) in act.chunks_mut(kb).zip(x.chunks(32 * kb)) {
                quantize_row(x, a);
            }
            let rows: Vec<&[Q8Block]> = act.chunks(kb).collect();
            let a = [rows[0], rows[1], rows[2], rows[3]];
            // Auto takes the AVX-512 GEMM kernel where the CPU has it (avx512_tests.rs).
            for kernel in [Kernel::AvxVnni, Kernel::Avx2, Kernel::Scalar] {
                let dot = Dot::new(format, kernel);
                let four = rows4(&dot, &data, a).expect("a four-row kernel");
                let one = a.map(|a| dot.row(&data, ActRow { q8: a, q8k: &[] }));
                assert_eq!(four, one, "{dtype:?} {kernel:?} {kb} blocks");
            }
        }
    }
}

#[test]
fn the_tiled_result_is_the_f32_product_within_rounding() {
    // Not only equal to the per-row loop: right. Against the dequantized weights and the
    // activations' own int8 rounding, for a shape with partial tiles.
    let (n, k, m) = (37, 160, 11);
    for dtype in FORMATS {
        let raw = Tensor::from_vec(values(n * k, 5), (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&raw, dtype).unwrap();
        let w = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let mats = [CpuQMatMul::new(Arc::new(q)).unwrap()];
        let x = values(m * k, 6);
        let got = &outputs(&mats, &x, m, Kernel::Auto, Tiling::Tiled)[0];
        for i in 0..m {
            let mut a = vec![Q8Block::ZERO; k / 32];
            quantize_row(&x[i * k..(i + 1) * k], &mut a);
            let xq: Vec<f32> = a
                .iter()
                .flat_map(|b| b.qs.iter().map(move |&q| f32::from(q) * b.d))
                .collect();
            for (r, wr) in w.iter().enumerate() {
                let want: f32 = wr.iter().zip(&xq).map(|(a, b)| a * b).sum();
                let mag: f32 = wr.iter().zip(&xq).map(|(a, b)| (a * b).abs()).sum();
                let g = got[i * n + r];
                assert!(
                    (g - want).abs() <= 2e-3 * mag + 1e-4,
                    "{dtype:?} ({i}, {r}): {g} vs {want}"
                );
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_four_row_kernels_with_and_without_vnni_equal_the_one_row_dot() {
    use super::super::avx2::Avx2;
    use super::super::{avx2_tile, q5};
    let Some(k) = Avx2::detect() else {
        return;
    };
    for dtype in FORMATS {
        for kb in [1, 2, 5, 48] {
            let mm = matrix(dtype, 1, 32 * kb, 12);
            let data = mm.weight.bytes().unwrap();
            let x = values(4 * 32 * kb, 31);
            let mut act = vec![Q8Block::ZERO; 4 * kb];
            for (a, x) in act.chunks_mut(kb).zip(x.chunks(32 * kb)) {
                quantize_row(x, a);
            }
            let rows: Vec<&[Q8Block]> = act.chunks(kb).collect();
            let a = [rows[0], rows[1], rows[2], rows[3]];
            let one = a.map(|a| match dtype {
                GgmlDType::Q4_0 => k.dot_q4_0(&data, a),
                GgmlDType::Q4_1 => k.dot_q4_1(&data, a),
                GgmlDType::Q5_0 => q5::avx2::dot_q5_0(k, &data, a),
                GgmlDType::Q5_1 => q5::avx2::dot_q5_1(k, &data, a),
                _ => k.dot_q8_0(&data, a),
            });
            // The one-row kernels' AVX-VNNI variants (plain AVX2 where the CPU lacks it):
            // the same lane sums, so the same results.
            let one_vnni = a.map(|a| match dtype {
                GgmlDType::Q5_0 => Some(q5::avx2::dot_q5_0_vnni(k, &data, a)),
                GgmlDType::Q5_1 => Some(q5::avx2::dot_q5_1_vnni(k, &data, a)),
                GgmlDType::Q8_0 => Some(k.dot_q8_0_vnni(&data, a)),
                _ => None,
            });
            if let [Some(_), ..] = one_vnni {
                let one_vnni = one_vnni.map(Option::unwrap);
                assert_eq!(one_vnni, one, "{dtype:?} one-row VNNI variant, {kb} blocks");
            }
            for vnni in [false, true] {
                let four = match dtype {
                    GgmlDType::Q4_0 => avx2_tile::q4_0(k, vnni, &data, a),
                    GgmlDType::Q4_1 => avx2_tile::q4_1(k, vnni, &data, a),
                    GgmlDType::Q5_0 => avx2_tile::q5_0(k, vnni, &data, a),
                    GgmlDType::Q5_1 => avx2_tile::q5_1(k, vnni, &data, a),
                    _ => avx2_tile::q8_0(k, vnni, &data, a),
                };
                assert_eq!(four, one, "{dtype:?} vnni {vnni} {kb} blocks");
            }
            let format = Format::of(ty(dtype)).unwrap();
            if let Some(four) = avx2_tile::narrow_vnni(format, &data, a) {
                assert_eq!(four, one, "{dtype:?} 16-register VNNI variant, {kb} blocks");
            }
        }
    }
}
