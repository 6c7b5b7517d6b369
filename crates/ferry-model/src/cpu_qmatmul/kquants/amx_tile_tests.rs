//! The AMX k-quant GEMM against the scalar one-row dot, bit for bit: directly on random raw
//! blocks (every quant and scale bit pattern) for partial panels and groups, and through the
//! tiled matmul (`Kernel::Auto`, tasks split by `tile::run`) against the scalar per-row one.
//! Skipped, with a message, where the CPU or OS has no AMX. Also: the k-quant tile path
//! follows the kernel choice.

use half::f16;

use super::super::super::amx::Amx;
use super::super::activation::{quantize_row_k, Q8KBlock, QK_K};
use super::super::tile::Path;
use super::super::{scalar, KFormat};
use super::{min_rows, run, supports};
use crate::cpu_qmatmul::tile::Tiling;
use crate::cpu_qmatmul::{test_support, Blocks, CpuQMatMul, Kernel};
use crate::header::GgufType;

const FORMATS: [KFormat; 3] = [KFormat::Q4K, KFormat::Q5K, KFormat::Q6K];

fn amx() -> Option<Amx> {
    let amx = Amx::detect();
    if amx.is_none() {
        eprintln!("AMX k-quant kernel skipped: this CPU or OS has no AMX-INT8");
    }
    amx
}

/// `rows` rows of `kb` super-blocks of `format`: every quant, scale and min byte random, the
/// f16 scales small and finite (some negative).
fn random_rows(format: KFormat, rows: usize, kb: usize, seed: u64) -> Vec<u8> {
    let bytes = format.block_bytes();
    let mut w = test_support::random_bytes(bytes * kb * rows, seed);
    let scales: &[usize] = match format {
        KFormat::Q6K => &[208],
        _ => &[0, 2],
    };
    for (b, block) in w.chunks_exact_mut(bytes).enumerate() {
        for (k, &at) in scales.iter().enumerate() {
            let v = ((b * 7 + k * 3) % 13) as f32 * 0.011 - 0.06;
            block[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
    }
    w
}

/// `m` activation rows of `kb` super-blocks; row 3 (if any) all zeros.
fn activations(m: usize, kb: usize, seed: u64) -> Vec<Q8KBlock> {
    let mut x = test_support::drift_values(m * kb * QK_K, seed, 5);
    if m > 3 {
        x[3 * kb * QK_K..4 * kb * QK_K].fill(0.0);
    }
    let mut act = vec![Q8KBlock::ZERO; m * kb];
    for (a, x) in act.chunks_mut(kb).zip(x.chunks(kb * QK_K)) {
        quantize_row_k(x, a);
    }
    act
}

#[test]
fn the_amx_kernel_equals_the_scalar_one_row_dot_bit_for_bit() {
    let Some(amx) = amx() else { return };
    for format in FORMATS {
        for (kb, n, m) in [
            (1, 16, 16),
            (1, 1, 1),
            (2, 5, 3),
            (3, 17, 33),
            (1, 40, 64),
            (4, 31, 47),
            (8, 16, 17),
            (2, 33, 66),
            (11, 17, 20),
        ] {
            let seed = (kb * 131 + n * 7 + m) as u64;
            let stride = format.block_bytes() * kb;
            let w = random_rows(format, n, kb, seed);
            let act = activations(m, kb, seed + 1);
            let acts: Vec<&[Q8KBlock]> = act.chunks(kb).collect();
            // A run of weight rows that starts inside the matrix, as tasks do.
            let weights = n / 3..n;
            let mut got = vec![vec![None; n]; m];
            let mut out = |i: usize, r0: usize, ys: &[f32]| {
                for (r, &y) in (r0..).zip(ys) {
                    assert!(got[i][r].replace(y.to_bits()).is_none(), "({i}, {r}) twice");
                }
            };
            assert!(run(
                amx,
                format,
                &w,
                stride,
                weights.clone(),
                &acts,
                &mut out
            ));
            for (i, a) in acts.iter().enumerate() {
                for r in 0..n {
                    let want = weights
                        .contains(&r)
                        .then(|| scalar::dot(format, &w[r * stride..][..stride], a).to_bits());
                    assert_eq!(
                        got[i][r], want,
                        "{format:?}: {kb} blocks, activation row {i} of {m}, weight row {r} of {n}"
                    );
                }
            }
        }
    }
}

#[test]
fn formats_without_an_amx_kernel_are_declined() {
    let Some(amx) = amx() else { return };
    for format in [KFormat::Q2K, KFormat::Q3K] {
        assert!(!supports(format));
        let w = vec![0u8; format.block_bytes()];
        let act = activations(1, 1, 1);
        let acts: Vec<&[Q8KBlock]> = act.chunks(1).collect();
        let mut out = |_: usize, _: usize, _: &[f32]| panic!("{format:?} computed");
        assert!(!run(amx, format, &w, w.len(), 0..1, &acts, &mut out));
    }
}

/// A `rows x cols` weight of raw random `format` blocks.
fn raw_matrix(format: KFormat, ty: GgufType, rows: usize, cols: usize, seed: u64) -> CpuQMatMul {
    let w = random_rows(format, rows, cols / QK_K, seed);
    CpuQMatMul::from_blocks(Blocks::owned(w, ty, &[rows, cols]).unwrap()).unwrap()
}

#[test]
fn the_tiled_matmul_on_amx_equals_the_scalar_per_row_one_bit_for_bit() {
    if amx().is_none() {
        return;
    }
    let bits = |o: Vec<Vec<f32>>| -> Vec<Vec<u32>> {
        o.into_iter()
            .map(|o| o.into_iter().map(f32::to_bits).collect())
            .collect()
    };
    for (format, ty) in [
        (KFormat::Q4K, GgufType::Q4_K),
        (KFormat::Q5K, GgufType::Q5_K),
        (KFormat::Q6K, GgufType::Q6_K),
    ] {
        // 300 rows split into several tasks (and panels with a partial last one), a 7-row
        // weight in the same call.
        for (n, k) in [(300, 512), (7, 768)] {
            let mats = [
                raw_matrix(format, ty, n, k, 5),
                raw_matrix(format, ty, 7, k, 6),
            ];
            let min = min_rows(format);
            for m in [15, 16, 17, min - 1, min, 40, 64, 67, 130] {
                let x = test_support::drift_values(m * k, 300 + m as u64, 7);
                let want = bits(test_support::outputs(
                    &mats,
                    &x,
                    m,
                    Kernel::Scalar,
                    Tiling::PerRow,
                ));
                let got = bits(test_support::outputs(
                    &mats,
                    &x,
                    m,
                    Kernel::Auto,
                    Tiling::Tiled,
                ));
                assert!(
                    got == want,
                    "{format:?} m={m} {k}->{n}: the AMX matmul differs from the scalar one"
                );
            }
        }
    }
}

#[test]
fn the_k_quant_tile_path_follows_the_kernel_choice() {
    let fastest = Path::all().into_iter().find(|p| p.available());
    assert_eq!(Path::detect(Kernel::Auto), fastest);
    assert_eq!(Path::detect(Kernel::Avx512), fastest);
    assert_eq!(Path::detect(Kernel::Scalar), None);
    let vnni = Path::detect(Kernel::AvxVnni);
    assert_ne!(
        vnni,
        Some(Path::Avx512),
        "Kernel::AvxVnni must not run the AVX-512 tiles"
    );
    let want = [Path::Avx2Vnni, Path::Avx2]
        .into_iter()
        .find(|p| p.available());
    assert_eq!(vnni, want);
    // Kernel::Avx2 is the AVX2-only CPU's path: neither AVX-512 nor AVX-VNNI.
    let avx2 = Path::detect(Kernel::Avx2);
    assert_eq!(avx2, Some(Path::Avx2).filter(|p| p.available()));
    if !Path::Avx512.available() {
        eprintln!("no AVX-512 on this CPU: Auto and AvxVnni pick the same path here");
    }
}
