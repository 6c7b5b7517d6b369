//! The AMX prompt GEMM against the AVX-512 one-row kernel, bit for bit (`f32::to_bits`), on
//! random blocks of every format it has: every activation row count from 1 to 67 and more
//! (partial sixteen-row groups), weight ranges that leave partial sixteen-row panels and odd
//! and even block counts. On a CPU or OS without AMX-INT8 each test says so and passes without
//! running.

use super::super::activation::{quantize_row, Q8Block};
use super::super::iq_tests::random_blocks;
use super::super::tests::values;
use super::super::Format;
use super::{run, supports, Amx};
use crate::header::GgufType;

use super::super::avx512_tests::TYPES;

fn detect() -> Option<Amx> {
    let amx = Amx::detect();
    if amx.is_none() {
        eprintln!("skipped: this CPU or OS has no AMX-INT8 (or FERRY_NO_AMX is set)");
    }
    amx
}

fn raw(ty: GgufType, n: usize, cols: usize, seed: u64) -> Vec<u8> {
    random_blocks(ty, n, cols, seed)
        .bytes()
        .unwrap()
        .into_owned()
}

fn quantized(x: &[f32], k: usize) -> Vec<Q8Block> {
    let mut act = vec![Q8Block::ZERO; x.len() / 32];
    for (a, x) in act.chunks_mut(k / 32).zip(x.chunks(k)) {
        quantize_row(x, a);
    }
    act
}

/// Runs the GEMM over weight rows `lo..n` and checks every output against `Avx512::row` bit
/// for bit, and that nothing outside the range was written.
fn check(amx: Amx, ty: GgufType, data: &[u8], n: usize, cols: usize, lo: usize, m: usize) {
    let format = Format::of(ty).unwrap();
    let row_bytes = data.len() / n;
    let act = quantized(&values(m * cols, 700 + m as u64), cols);
    let rows: Vec<&[Q8Block]> = act.chunks(cols / 32).collect();
    let mut got = vec![f32::NAN; m * n];
    let mut put = |j: usize, r0: usize, ys: &[f32]| {
        got[j * n + r0..j * n + r0 + ys.len()].copy_from_slice(ys);
    };
    assert!(run(amx, format, data, row_bytes, lo..n, &rows, &mut put));
    for (j, a) in rows.iter().enumerate() {
        for r in 0..n {
            let g = got[j * n + r];
            if r < lo {
                assert!(g.is_nan(), "{ty} wrote row {r} outside its range");
                continue;
            }
            let want = amx
                .avx512
                .row(format, &data[r * row_bytes..(r + 1) * row_bytes], a)
                .unwrap();
            assert_eq!(
                g.to_bits(),
                want.to_bits(),
                "{ty} m={m} {cols}->{n} rows {lo}.. ({j}, {r}): {g} vs {want}"
            );
        }
    }
}

#[test]
fn amx_gemm_equals_the_avx512_row_kernel_bit_for_bit_for_every_row_count() {
    let Some(amx) = detect() else { return };
    for ty in TYPES {
        assert!(supports(Format::of(ty).unwrap()));
        // 1 weight row, and rows 5..17 of 17: partial panels; 8 blocks.
        for (s, &(n, cols, lo)) in [(1, 256, 0), (17, 256, 5)].iter().enumerate() {
            let data = raw(ty, n, cols, 40 + s as u64);
            for m in 1..=67 {
                check(amx, ty, &data, n, cols, lo, m);
            }
        }
    }
}

#[test]
fn amx_gemm_equals_the_avx512_row_kernel_bit_for_bit_for_long_rows_and_many_rows() {
    let Some(amx) = detect() else { return };
    for ty in TYPES {
        // 1280 columns: 40 blocks; 4096: 128; 33 and 48 weight rows: partial and whole panels.
        for (s, &(n, cols, lo)) in [(33, 1280, 11), (48, 4096, 0), (16, 768, 0)]
            .iter()
            .enumerate()
        {
            let data = raw(ty, n, cols, 50 + s as u64);
            for m in [1, 16, 31, 64, 130] {
                check(amx, ty, &data, n, cols, lo, m);
            }
        }
    }
}

#[test]
fn amx_gemm_handles_odd_block_counts() {
    // Blocks of 32: 1, 3 and 5 blocks exercise the last block landing in either result tile
    // (IQ4_XS has no such rows: its super-blocks are 8 blocks).
    let Some(amx) = detect() else { return };
    for ty in TYPES.into_iter().filter(|&t| t != GgufType::IQ4_XS) {
        for (s, &cols) in [32, 96, 160].iter().enumerate() {
            let n = 19;
            let data = raw(ty, n, cols, 60 + s as u64);
            for m in [1, 16, 20] {
                check(amx, ty, &data, n, cols, 2, m);
            }
        }
    }
}

#[test]
fn auto_prompts_take_the_amx_gemm_and_equal_the_avx512_row_kernel_bit_for_bit() {
    // Through the whole matmul (tile.rs splits 600 rows into tasks, several weights in one
    // call): every output of `Kernel::Auto` at and above the threshold, for every format it
    // enables, against `Avx512::row` on the same quantized activations.
    use super::super::test_support::outputs;
    use super::super::tile::Tiling;
    use super::super::{CpuQMatMul, Kernel};
    use super::{enabled, AMX_MIN_ROWS};
    let Some(amx) = detect() else { return };
    for ty in TYPES {
        let format = Format::of(ty).unwrap();
        if !enabled(format) {
            continue;
        }
        let cols = 1024;
        let blocks = [
            random_blocks(ty, 600, cols, 80),
            random_blocks(ty, 5, cols, 81),
        ];
        let datas: Vec<Vec<u8>> = blocks
            .iter()
            .map(|b| b.bytes().unwrap().into_owned())
            .collect();
        let mats = blocks.map(|b| CpuQMatMul::from_blocks(b).unwrap());
        for m in [AMX_MIN_ROWS, 17, 64, 67, 130, 300] {
            let x = values(m * cols, 900 + m as u64);
            let act = quantized(&x, cols);
            let got = outputs(&mats, &x, m, Kernel::Auto, Tiling::Tiled);
            for ((mm, data), got) in mats.iter().zip(&datas).zip(&got) {
                let n = mm.out_features();
                let row_bytes = data.len() / n;
                for (j, a) in act.chunks(cols / 32).enumerate() {
                    for r in 0..n {
                        let w = &data[r * row_bytes..(r + 1) * row_bytes];
                        let want = amx.avx512.row(format, w, a).unwrap();
                        let g = got[j * n + r];
                        assert_eq!(
                            g.to_bits(),
                            want.to_bits(),
                            "{ty} m={m} {cols}->{n} ({j}, {r}): {g} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
