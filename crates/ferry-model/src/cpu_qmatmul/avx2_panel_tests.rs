//! The AVX2 GEMM kernel ([`avx2_panel`]), both variants (AVX2 alone, and AVX-VNNI where the CPU
//! has it), for every format it has: equal bit for bit to the AVX-512 one-row kernel where the
//! CPU has AVX-512 VNNI (and always to each other), within float summation order of the
//! scalar one-row dot everywhere, for partial panels, sub-ranges of weight rows and row counts
//! that leave partial four-row groups; a weight changed in one bit must change the outputs (the
//! comparison can fail). And the tiled matmul under `Kernel::Avx2` / `Kernel::AvxVnni` equal
//! bit for bit to the AVX-512 path's where both take their GEMM kernels.

use super::activation::{quantize_row, Q8Block};
use super::avx2::Avx2;
use super::avx2_tile::has_vnni;
use super::avx512::Avx512;
use super::iq_tests::random_blocks;
use super::test_support::{close, outputs};
use super::tests::values;
use super::tile::{Tiling, GEMM_MIN_ROWS};
use super::{avx2_panel, Blocks, CpuQMatMul, Dot, Format, Kernel};
use crate::header::GgufType;

/// Every format of the AVX2 GEMM kernel.
const TYPES: [GgufType; 8] = [
    GgufType::Q4_0,
    GgufType::Q4_1,
    GgufType::Q5_0,
    GgufType::Q5_1,
    GgufType::Q8_0,
    GgufType::IQ4_NL,
    GgufType::IQ4_XS,
    GgufType::MXFP4,
];

fn quantized(x: &[f32], k: usize) -> Vec<Q8Block> {
    let mut act = vec![Q8Block::ZERO; x.len() / 32];
    for (a, x) in act.chunks_mut(k / 32).zip(x.chunks(k)) {
        quantize_row(x, a);
    }
    act
}

fn bytes(blocks: &Blocks) -> Vec<u8> {
    blocks.bytes().unwrap().into_owned()
}

/// The panel's outputs (`m x n`, NaN where it wrote nothing) for weight rows `weights`.
fn panel_outputs(
    k: Avx2,
    vnni: bool,
    format: Format,
    data: &[u8],
    n: usize,
    weights: std::ops::Range<usize>,
    rows: &[&[Q8Block]],
) -> Vec<f32> {
    let mut got = vec![f32::NAN; rows.len() * n];
    let mut put = |i: usize, r0: usize, ys: &[f32]| {
        got[i * n + r0..i * n + r0 + ys.len()].copy_from_slice(ys);
    };
    let stride = data.len() / n;
    assert!(avx2_panel::run(
        k, vnni, format, data, stride, weights, rows, &mut put
    ));
    got
}

#[test]
fn avx2_gemm_kernel_equals_the_avx512_row_kernel_and_the_scalar_dot() {
    let Some(k) = Avx2::detect() else {
        eprintln!("skipped: this CPU lacks AVX2/FMA/F16C");
        return;
    };
    let avx512 = Avx512::detect();
    if avx512.is_none() {
        eprintln!("AVX-512 VNNI absent: the bit-for-bit comparison is skipped");
    }
    for ty in TYPES {
        let format = Format::of(ty).unwrap();
        let scalar = Dot::new(format, Kernel::Scalar);
        // 1, 17 and 33 rows leave partial panels; 256 and 1280 columns odd and even blocks.
        for (s, &(n, cols)) in [(1, 256), (17, 256), (33, 1280), (8, 512)]
            .iter()
            .enumerate()
        {
            let blocks = random_blocks(ty, n, cols, 140 + s as u64);
            let data = bytes(&blocks);
            let row_bytes = data.len() / n;
            let weight = |r: usize| &data[r * row_bytes..(r + 1) * row_bytes];
            for m in [1, 3, 4, 5, 17, 64] {
                let act = quantized(&values(m * cols, 190 + m as u64), cols);
                let rows: Vec<&[Q8Block]> = act.chunks(cols / 32).collect();
                // A sub-range of weight rows too, as a task would ask for.
                let lo = n / 3;
                let plain = panel_outputs(k, false, format, &data, n, lo..n, &rows);
                if has_vnni() {
                    let vnni = panel_outputs(k, true, format, &data, n, lo..n, &rows);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&plain), bits(&vnni), "{ty} m={m}: plain vs vnni");
                }
                for (i, a) in rows.iter().enumerate() {
                    for r in 0..n {
                        let g = plain[i * n + r];
                        if r < lo {
                            assert!(g.is_nan(), "{ty} wrote row {r} outside its range");
                            continue;
                        }
                        if let Some(k512) = avx512 {
                            let want = k512.row(format, weight(r), a).unwrap();
                            assert_eq!(
                                g.to_bits(),
                                want.to_bits(),
                                "{ty} m={m} {cols}->{n} ({i}, {r}): {g} vs {want}"
                            );
                        }
                        let a_row = super::activation::ActRow { q8: a, q8k: &[] };
                        let want = scalar.row(weight(r), a_row);
                        assert!(
                            close(g, want, cols),
                            "{ty} ({i}, {r}): {g} vs scalar {want}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_changed_weight_bit_changes_the_avx2_gemm_outputs() {
    // The planted bug: one weight of the last block of a row changed (the low bit of the row's
    // last byte, a quant byte in every format); the comparison above must be able to see it.
    let Some(k) = Avx2::detect() else { return };
    for ty in TYPES {
        let format = Format::of(ty).unwrap();
        let (n, cols, m) = (9, 512, 8);
        let data = bytes(&random_blocks(ty, n, cols, 77));
        let act = quantized(&values(m * cols, 78), cols);
        let rows: Vec<&[Q8Block]> = act.chunks(cols / 32).collect();
        let mut bad = data.clone();
        let row_bytes = data.len() / n;
        let target = 5;
        bad[(target + 1) * row_bytes - 1] ^= 1;
        for vnni in [false, true] {
            let good = panel_outputs(k, vnni, format, &data, n, 0..n, &rows);
            let planted = panel_outputs(k, vnni, format, &bad, n, 0..n, &rows);
            let differs = |r: usize| (0..m).any(|i| good[i * n + r] != planted[i * n + r]);
            assert!(differs(target), "{ty}: the changed weight went unseen");
            assert!(
                (0..n).filter(|&r| r != target).all(|r| !differs(r)),
                "{ty}: other rows changed"
            );
        }
    }
}

#[test]
fn avx2_path_prompts_equal_the_avx512_path_prompts() {
    // Where both paths take their GEMM kernels (the formats `Avx512::enabled` lists, at least
    // `GEMM_MIN_ROWS` rows), the whole tiled matmul under `Kernel::Avx2` and `Kernel::AvxVnni`
    // is bit for bit the AVX-512 path's.
    if Avx512::detect().is_none() || Avx2::detect().is_none() {
        eprintln!("skipped: this CPU lacks AVX-512 VNNI");
        return;
    }
    for ty in TYPES {
        let format = Format::of(ty).unwrap();
        if !Avx512::enabled(format) {
            continue;
        }
        let (n, cols) = (600, 1024);
        let mats = [
            CpuQMatMul::from_blocks(random_blocks(ty, n, cols, 91)).unwrap(),
            CpuQMatMul::from_blocks(random_blocks(ty, 7, cols, 92)).unwrap(),
        ];
        for m in [GEMM_MIN_ROWS, 5, 64, 67] {
            let x = values(m * cols, 400 + m as u64);
            let want = outputs(&mats, &x, m, Kernel::Avx512, Tiling::Tiled);
            for kernel in [Kernel::Avx2, Kernel::AvxVnni] {
                assert!(avx2_panel::takes(kernel, format, m));
                let got = outputs(&mats, &x, m, kernel, Tiling::Tiled);
                assert_eq!(got, want, "{ty} {kernel:?} m={m}");
            }
        }
    }
}
