//! The four-row micro-kernels of the table-coded formats (IQ4_NL, IQ4_XS, MXFP4) against their
//! one-row kernels, bit for bit, on every path this CPU can run (scalar, AVX2, AVX2 with
//! AVX-VNNI), and the tiled matmul against the per-row one for row counts that leave partial
//! four-row groups and partial tasks (bit for bit, except a prompt through the AVX-512 GEMM
//! kernel, within float summation order: see `avx512_tests::exact_per_row`).

use super::activation::{quantize_row, ActRow, Q8Block};
use super::iq_tests::random_blocks;
use super::test_support::outputs;
use super::tests::values;
use super::tile::{rows4, Rows4, Tiling};
use super::{CpuQMatMul, Dot, Format, Kernel};
use crate::header::GgufType;

const TYPES: [GgufType; 3] = [GgufType::IQ4_NL, GgufType::IQ4_XS, GgufType::MXFP4];

/// Four activation rows of `kb` blocks, quantized from seeded values.
fn four_rows(kb: usize, seed: u64) -> Vec<Q8Block> {
    let x = values(4 * 32 * kb, seed);
    let mut act = vec![Q8Block::ZERO; 4 * kb];
    for (a, x) in act.chunks_mut(kb).zip(x.chunks(32 * kb)) {
        quantize_row(x, a);
    }
    act
}

fn rows(act: &[Q8Block], kb: usize) -> Rows4<'_> {
    let r: Vec<&[Q8Block]> = act.chunks(kb).collect();
    [r[0], r[1], r[2], r[3]]
}

/// Block counts per row to try: odd and even, one block, whole IQ4_XS super-blocks only.
fn block_counts(ty: GgufType) -> &'static [usize] {
    match ty {
        GgufType::IQ4_XS => &[8, 16, 24, 64],
        _ => &[1, 2, 3, 5, 18, 63],
    }
}

#[test]
fn four_row_table_kernels_equal_four_one_row_dots() {
    for ty in TYPES {
        let format = Format::of(ty).unwrap();
        for (s, &kb) in block_counts(ty).iter().enumerate() {
            let w = random_blocks(ty, 1, 32 * kb, 11 + s as u64);
            let data = w.bytes().unwrap();
            let act = four_rows(kb, 50 + s as u64);
            let a = rows(&act, kb);
            // Auto takes the AVX-512 GEMM kernel where the CPU has it (avx512_tests.rs).
            for kernel in [Kernel::Avx2, Kernel::Scalar] {
                let dot = Dot::new(format, kernel);
                let four = rows4(&dot, &data, a).expect("a four-row kernel");
                let one = a.map(|a| dot.row(&data, ActRow { q8: a, q8k: &[] }));
                assert!(four.iter().all(|v| v.is_finite()), "{ty} {kb}: {four:?}");
                assert_eq!(four, one, "{ty} {kernel:?} {kb} blocks");
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx2_table_kernels_with_and_without_vnni_equal_the_one_row_dot() {
    use super::avx2::Avx2;
    use super::{avx2_tile, iq4, mxfp4};
    let Some(k) = Avx2::detect() else {
        eprintln!("skipped: this CPU has no AVX2");
        return;
    };
    if !avx2_tile::has_vnni() {
        eprintln!("AVX-VNNI absent: its variant falls back to the plain AVX2 one");
    }
    for ty in TYPES {
        for (s, &kb) in block_counts(ty).iter().enumerate() {
            let w = random_blocks(ty, 1, 32 * kb, 21 + s as u64);
            let data = w.bytes().unwrap();
            let act = four_rows(kb, 60 + s as u64);
            let a = rows(&act, kb);
            let one = a.map(|a| match ty {
                GgufType::IQ4_NL => iq4::avx2_dot_iq4_nl(k, &data, a),
                GgufType::IQ4_XS => iq4::avx2_dot_iq4_xs(k, &data, a),
                _ => mxfp4::avx2_dot_mxfp4(k, &data, a),
            });
            for vnni in [false, true] {
                let four = match ty {
                    GgufType::IQ4_NL => avx2_tile::iq4_nl(k, vnni, &data, a),
                    GgufType::IQ4_XS => avx2_tile::iq4_xs(k, vnni, &data, a),
                    _ => avx2_tile::mxfp4(k, vnni, &data, a),
                };
                assert_eq!(four, one, "{ty} vnni {vnni} {kb} blocks");
            }
            let format = match ty {
                GgufType::IQ4_NL => Format::IQ4_NL,
                GgufType::IQ4_XS => Format::IQ4_XS,
                _ => Format::MXFP4,
            };
            if let Some(four) = avx2_tile::narrow_vnni(format, &data, a) {
                assert_eq!(four, one, "{ty} 16-register VNNI variant, {kb} blocks");
            }
        }
    }
}

#[test]
fn tiled_table_matmuls_equal_per_row_for_every_row_count() {
    // Odd weight-row counts; 600 rows of 1024 make partial tasks in the parallel loop.
    for ty in TYPES {
        for (s, (n, k)) in [(5, 256), (37, 768), (600, 1024)].into_iter().enumerate() {
            let mats = [
                CpuQMatMul::from_blocks(random_blocks(ty, n, k, 3 + s as u64)).unwrap(),
                CpuQMatMul::from_blocks(random_blocks(ty, 3, k, 7 + s as u64)).unwrap(),
            ];
            for m in [1, 3, 4, 5, 17, 64, 67] {
                let x = values(m * k, 200 + m as u64);
                for kernel in [Kernel::Auto, Kernel::Avx2, Kernel::Scalar] {
                    let tiled = outputs(&mats, &x, m, kernel, Tiling::Tiled);
                    let per_row = outputs(&mats, &x, m, kernel, Tiling::PerRow);
                    assert!(tiled.iter().flatten().all(|v| v.is_finite()));
                    #[cfg(target_arch = "x86_64")]
                    if !super::avx512_tests::exact_per_row(ty, kernel, m) {
                        // A prompt through the AVX-512 GEMM kernel, the per-row loop through
                        // the AVX2 row kernel: the same integer sums, summed in another order.
                        let pairs = tiled.iter().flatten().zip(per_row.iter().flatten());
                        for (a, b) in pairs {
                            assert!(
                                super::test_support::close(*a, *b, k),
                                "{ty} m={m}: {a} vs {b}"
                            );
                        }
                        continue;
                    }
                    assert_eq!(tiled, per_row, "{ty} {kernel:?} m={m} {k}->{n}");
                }
            }
        }
    }
}
