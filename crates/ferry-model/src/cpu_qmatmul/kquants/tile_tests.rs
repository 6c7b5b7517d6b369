//! The k-quant four-row kernels against the one-row scalar dot (bit for bit, on every SIMD
//! path this CPU runs; the others are named as skipped), and the tiled matmul against the
//! per-row one for Q2_K..Q6_K at odd row counts and partial tiles.

use candle_core::quantized::GgmlDType;
use half::f16;

use super::super::activation::{quantize_row_k, Q8KBlock, QK_K};
use super::super::{scalar, KFormat};
use super::{has_rows8, has_tile, rows4, rows8, Path, Rows4K, Rows8K};
use crate::cpu_qmatmul::tile::Tiling;
use crate::cpu_qmatmul::{test_support, CpuQMatMul, Kernel};

/// How often the values' magnitude scale repeats along a row.
const DRIFT: usize = 7;

fn values(n: usize, seed: u64) -> Vec<f32> {
    test_support::drift_values(n, seed, DRIFT)
}

/// `kb` super-blocks of `format` with every quant and scale byte random (all bit patterns,
/// not only those a quantizer writes) and small finite f16 scales.
fn random_row(format: KFormat, kb: usize, seed: u64) -> Vec<u8> {
    let bytes = format.block_bytes();
    let mut w = test_support::random_bytes(bytes * kb, seed);
    let scales: &[usize] = match format {
        KFormat::Q2K => &[80, 82],
        KFormat::Q3K => &[108],
        KFormat::Q4K | KFormat::Q5K => &[0, 2],
        KFormat::Q6K => &[208],
    };
    for (b, block) in w.chunks_exact_mut(bytes).enumerate() {
        for &at in scales {
            let v = ((b % 11) as f32 - 5.0) * 0.013 + 0.002;
            block[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
    }
    w
}

/// Four activation rows of `kb` super-blocks, the last row all zeros when `zero_row`.
fn activations(kb: usize, seed: u64, zero_row: bool) -> Vec<Q8KBlock> {
    let mut x = values(4 * kb * QK_K, seed);
    if zero_row {
        x[3 * kb * QK_K..].fill(0.0);
    }
    let mut act = vec![Q8KBlock::ZERO; 4 * kb];
    for (a, x) in act.chunks_mut(kb).zip(x.chunks(kb * QK_K)) {
        quantize_row_k(x, a);
    }
    act
}

/// The paths this CPU runs, after naming the ones it cannot (so a run shows what it skipped).
fn paths() -> Vec<Path> {
    let (run, skip): (Vec<Path>, Vec<Path>) = Path::all().into_iter().partition(|p| p.available());
    if !skip.is_empty() {
        eprintln!("k-quant tile paths skipped (not on this CPU): {skip:?}");
    }
    run
}

#[test]
fn four_row_kernels_equal_four_scalar_one_row_dots_on_every_path() {
    for format in KFormat::ALL {
        for kb in [1, 2, 3, 16] {
            for seed in 0..3 {
                let w = random_row(format, kb, 40 + seed);
                let act = activations(kb, 70 + seed, seed == 2);
                let r: Vec<&[Q8KBlock]> = act.chunks(kb).collect();
                let a: Rows4K<'_> = [r[0], r[1], r[2], r[3]];
                let want = a.map(|a| scalar::dot(format, &w, a));
                assert!(want.iter().all(|v| v.is_finite()));
                for path in paths() {
                    let got = rows4(path, format, &w, a).expect("a four-row kernel");
                    assert_eq!(
                        got.map(f32::to_bits),
                        want.map(f32::to_bits),
                        "{format:?} {path:?} {kb} blocks, seed {seed}"
                    );
                }
            }
        }
    }
}

#[test]
#[cfg(target_arch = "x86_64")]
fn avx2_one_row_dots_equal_the_scalar_dot_across_block_groups() {
    // The AVX2 one-row kernel sums its blocks in groups of eight: rows of fewer, exactly as
    // many, one more and several groups with a short last one (stale lanes left over).
    let Some(k) = crate::cpu_qmatmul::avx2::Avx2::detect() else {
        eprintln!("AVX2 one-row k-quant dots skipped: no AVX2 on this CPU");
        return;
    };
    for format in KFormat::ALL {
        for kb in [1, 7, 8, 9, 17, 22] {
            for seed in 0..3 {
                let w = random_row(format, kb, 140 + seed);
                let act = activations(kb, 170 + seed, seed == 2);
                for (r, a) in act.chunks(kb).enumerate() {
                    let want = scalar::dot(format, &w, a);
                    assert!(want.is_finite());
                    let got = super::super::avx2::dot(k, format, &w, a);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{format:?} {kb} blocks, seed {seed}, row {r}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn eight_row_kernels_equal_eight_scalar_one_row_dots() {
    if !Path::Avx512.available() {
        eprintln!("eight-row k-quant kernels skipped: no AVX-512 on this CPU");
    }
    for format in KFormat::ALL {
        for kb in [1, 3, 16] {
            let w = random_row(format, kb, 90 + kb as u64);
            let mut act = activations(kb, 11, false);
            act.extend(activations(kb, 12, true));
            let r: Vec<&[Q8KBlock]> = act.chunks(kb).collect();
            let a: Rows8K<'_> = std::array::from_fn(|i| r[i]);
            let want = a.map(|a| scalar::dot(format, &w, a).to_bits());
            for path in Path::all() {
                let got = rows8(path, format, &w, a);
                assert_eq!(
                    got.is_some(),
                    has_rows8(path, format),
                    "{format:?} {path:?}"
                );
                if let Some(got) = got {
                    assert_eq!(
                        got.map(f32::to_bits),
                        want,
                        "{format:?} {path:?} {kb} blocks"
                    );
                }
            }
        }
    }
}

#[test]
fn unavailable_paths_fall_back() {
    let act = activations(1, 3, false);
    let r: Vec<&[Q8KBlock]> = act.chunks(1).collect();
    let a: Rows4K<'_> = [r[0], r[1], r[2], r[3]];
    assert!(KFormat::ALL.into_iter().all(has_tile));
    for path in Path::all().into_iter().filter(|p| !p.available()) {
        let w = random_row(KFormat::Q4K, 1, 5);
        assert_eq!(rows4(path, KFormat::Q4K, &w, a), None, "{path:?}");
    }
}

fn matrix(dtype: GgmlDType, n: usize, k: usize, seed: u64) -> CpuQMatMul {
    test_support::matrix(dtype, n, k, seed, DRIFT)
}

/// [`test_support::outputs`], all finite, as bit patterns (for exact comparison).
fn outputs(
    mats: &[CpuQMatMul],
    x: &[f32],
    m: usize,
    kernel: Kernel,
    tiling: Tiling,
) -> Vec<Vec<u32>> {
    let outs = test_support::outputs(mats, x, m, kernel, tiling);
    assert!(outs.iter().flatten().all(|v| v.is_finite()));
    outs.iter()
        .map(|o| o.iter().map(|v| v.to_bits()).collect())
        .collect()
}

#[test]
fn tiled_k_quant_matmul_equals_the_scalar_per_row_one() {
    // 303 rows of 512 make partial tasks; a 5-row weight and a Q4_0 one ride along in the same
    // call (the 32-element activations beside the 256-element ones). 300 activation rows make
    // two AMX tasks (`amx_tile::task_rows`), the second with a partial group.
    let _ = paths();
    for dtype in [
        GgmlDType::Q2K,
        GgmlDType::Q3K,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
    ] {
        for (n, k) in [(5, 256), (303, 512), (33, 768)] {
            let mats = [
                matrix(dtype, n, k, 3),
                matrix(dtype, 5, k, 4),
                matrix(GgmlDType::Q4_0, 7, k, 8),
            ];
            for m in [1, 3, 4, 5, 17, 64, 67, 300] {
                let x = values(m * k, 100 + m as u64);
                // The k-quants' SIMD dots equal the scalar one; Q4_0's only its own kernel's (within
                // summation order where its prompt takes a GEMM kernel).
                let scalar = outputs(&mats, &x, m, Kernel::Scalar, Tiling::PerRow);
                for kernel in [Kernel::Auto, Kernel::AvxVnni, Kernel::Avx2, Kernel::Scalar] {
                    let tiled = outputs(&mats, &x, m, kernel, Tiling::Tiled);
                    let per_row = outputs(&mats, &x, m, kernel, Tiling::PerRow);
                    let what = format!("{dtype:?} {kernel:?} m={m} {k}->{n}");
                    assert!(tiled[..2] == scalar[..2], "{what}");
                    #[cfg(target_arch = "x86_64")]
                    let exact = crate::cpu_qmatmul::avx512_tests::exact_per_row(
                        crate::header::GgufType::Q4_0,
                        kernel,
                        m,
                    );
                    #[cfg(not(target_arch = "x86_64"))]
                    let exact = true;
                    if exact {
                        assert!(tiled[2] == per_row[2], "{what}: the Q4_0 weight");
                    } else {
                        // Its prompt through the AVX2 GEMM kernel, its per-row loop through
                        // the AVX2 row kernel: the same integer sums in another order.
                        let pairs = tiled[2].iter().zip(&per_row[2]);
                        for (&a, &b) in pairs {
                            let (a, b) = (f32::from_bits(a), f32::from_bits(b));
                            assert!(test_support::close(a, b, k), "{what}: {a} vs {b}");
                        }
                    }
                }
            }
        }
    }
}
