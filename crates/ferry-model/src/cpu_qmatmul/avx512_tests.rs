//! The AVX-512 path (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS, MXFP4): its one-row kernel
//! against the f32 dot product of the decoded weights with the same int8 activations, and its
//! GEMM kernel against the one-row kernel bit for bit, for odd and partial panels and row
//! counts that leave partial four-row groups; and every path of the tiled matmul against its
//! per-row loop and the scalar one. On a CPU without AVX-512 VNNI the first two say so and pass without
//! running (the scalar and AVX2 paths have their own tests).

use super::activation::{quantize_row, Q8Block};
use super::avx512::Avx512;
use super::iq_tests::random_blocks;
use super::test_support::{close, outputs};
use super::tests::values;
use super::tile::{Tiling, GEMM_MIN_ROWS};
use super::{amx_panel, avx2_panel, avx512_panel};
use super::{Blocks, CpuQMatMul, Format, Kernel};
use crate::header::GgufType;

/// The formats of the AVX-512 and AMX GEMM kernels (also read by `amx_panel_tests`).
pub(super) const TYPES: [GgufType; 6] = [
    GgufType::Q4_0,
    GgufType::Q4_1,
    GgufType::Q8_0,
    GgufType::IQ4_NL,
    GgufType::IQ4_XS,
    GgufType::MXFP4,
];

/// The formats of the AVX-512 kernels: [`TYPES`] and Q5_0 / Q5_1 (not on AMX).
const AVX512_TYPES: [GgufType; 8] = [
    TYPES[0],
    TYPES[1],
    TYPES[2],
    TYPES[3],
    TYPES[4],
    TYPES[5],
    GgufType::Q5_0,
    GgufType::Q5_1,
];

fn detect() -> Option<Avx512> {
    let k = Avx512::detect();
    if k.is_none() {
        eprintln!("skipped: this CPU lacks AVX-512 F/BW/VL/VNNI");
    }
    k
}

/// Whether `kernel`'s tiled matmul of `m` rows of `ty` must equal its per-row loop bit for
/// bit: always, except where a prompt takes the AVX2 GEMM kernel ([`avx2_panel::takes`]), or where a table-coded or Q5 format's prompt (`m >= GEMM_MIN_ROWS`) takes
/// the AVX-512 GEMM kernel (`Kernel::Auto` or `Kernel::Avx512`) while its row-at-a-time products keep the AVX2 kernel
/// ([`Avx512::row_wins`]), or where a prompt takes the AMX GEMM ([`amx_panel`]) and the
/// row-at-a-time products a kernel of another order (Q8_0's AVX2 one); those differ by float
/// summation order only.
pub(super) fn exact_per_row(ty: GgufType, kernel: Kernel, m: usize) -> bool {
    let format = Format::of(ty).unwrap();
    let avx512_row = Avx512::enabled(format) && Avx512::row_wins(format);
    // A prompt through the AMX GEMM has the AVX-512 row kernel's order (amx_panel_tests.rs),
    // which is the per-row loop's only where that row kernel serves it.
    let amx = kernel == Kernel::Auto
        && m >= amx_panel::AMX_MIN_ROWS
        && amx_panel::enabled(format)
        && !avx512_row
        && super::amx::Amx::detect().is_some();
    let avx512_path = matches!(kernel, Kernel::Auto | Kernel::Avx512)
        && Avx512::enabled(format)
        && Avx512::detect().is_some();
    let avx512_gemm = avx512_path && m >= GEMM_MIN_ROWS && !Avx512::row_wins(format);
    // Off the AVX-512 path (and the AMX one), a prompt through the AVX2 GEMM kernel has the
    // AVX-512 row kernel's order, the per-row loop the AVX2 row kernel's.
    let avx2_gemm = !avx512_path
        && !amx
        && avx2_panel::takes(kernel, format, m)
        && super::avx2::Avx2::detect().is_some();
    !amx && !avx512_gemm && !avx2_gemm
}

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

#[test]
fn avx512_row_kernel_is_the_f32_dot_of_the_decoded_blocks() {
    let Some(k) = detect() else { return };
    for ty in AVX512_TYPES {
        let format = Format::of(ty).unwrap();
        for (s, &(n, cols)) in [(3, 256), (5, 768), (2, 4096)].iter().enumerate() {
            let blocks = random_blocks(ty, n, cols, 30 + s as u64);
            let w = blocks.dequantize().unwrap();
            let data = bytes(&blocks);
            let row_bytes = data.len() / n;
            let act = quantized(&values(cols, 80 + s as u64), cols);
            let xq: Vec<f32> = act
                .iter()
                .flat_map(|b| b.qs.iter().map(move |&q| f32::from(q) * b.d))
                .collect();
            for r in 0..n {
                let got = k
                    .row(format, &data[r * row_bytes..(r + 1) * row_bytes], &act)
                    .expect("an AVX-512 kernel");
                let wr = &w[r * cols..(r + 1) * cols];
                let want: f64 = wr
                    .iter()
                    .zip(&xq)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                let mag: f64 = wr
                    .iter()
                    .zip(&xq)
                    .map(|(&a, &b)| f64::from((a * b).abs()))
                    .sum();
                // Q4_1's and Q5_1's offset term reads `a.s`, which is `d * sum(qs)` rounded
                // through f16 (as ggml stores it): allow that rounding times the blocks'
                // minimums.
                let row = &data[r * row_bytes..(r + 1) * row_bytes];
                let s_rounding: f64 = match ty {
                    GgufType::Q4_1 | GgufType::Q5_1 => act
                        .iter()
                        .enumerate()
                        .map(|(b, a)| {
                            let at = if ty == GgufType::Q4_1 { 20 } else { 24 } * b + 2;
                            let m = half::f16::from_le_bytes([row[at], row[at + 1]]);
                            let exact = f64::from(a.d) * f64::from(a.isum);
                            f64::from(m.to_f32().abs()) * (f64::from(a.s) - exact).abs()
                        })
                        .sum(),
                    _ => 0.0,
                };
                let tol = 1e-5 * mag + s_rounding + 1e-6;
                assert!(
                    (f64::from(got) - want).abs() <= tol,
                    "{ty} {cols} row {r}: {got} vs {want} (tol {tol})"
                );
            }
        }
    }
}

#[test]
fn avx512_gemm_kernel_equals_the_row_kernel_bit_for_bit() {
    let Some(k) = detect() else { return };
    for ty in AVX512_TYPES {
        let format = Format::of(ty).unwrap();
        // 1, 17, 33, 70 and 130 rows leave partial blocks and 64-row panels (130: a last
        // panel of two rows, its unused blocks zeroed); 256 and 1280 columns odd and even blocks.
        for (s, &(n, cols)) in [
            (1, 256),
            (17, 256),
            (33, 1280),
            (16, 512),
            (70, 256),
            (130, 1280),
        ]
        .iter()
        .enumerate()
        {
            let blocks = random_blocks(ty, n, cols, 40 + s as u64);
            let data = bytes(&blocks);
            let row_bytes = data.len() / n;
            for m in [1, 3, 4, 5, 17, 64] {
                let act = quantized(&values(m * cols, 90 + m as u64), cols);
                let rows: Vec<&[Q8Block]> = act.chunks(cols / 32).collect();
                let mut got = vec![f32::NAN; m * n];
                let mut put = |i: usize, r0: usize, ys: &[f32]| {
                    got[i * n + r0..i * n + r0 + ys.len()].copy_from_slice(ys);
                };
                // A sub-range of weight rows too, as a task would ask for.
                let lo = n / 3;
                assert!(avx512_panel::run(
                    k,
                    format,
                    &data,
                    row_bytes,
                    lo..n,
                    &rows,
                    &mut put
                ));
                for (i, a) in rows.iter().enumerate() {
                    for r in 0..n {
                        let want = k
                            .row(format, &data[r * row_bytes..(r + 1) * row_bytes], a)
                            .unwrap();
                        let g = got[i * n + r];
                        if r < lo {
                            assert!(g.is_nan(), "{ty} wrote row {r} outside its range");
                        } else {
                            assert_eq!(
                                g.to_bits(),
                                want.to_bits(),
                                "{ty} m={m} {cols}->{n} ({i}, {r}): {g} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn every_path_of_the_tiled_matmul_agrees_with_its_per_row_loop_and_the_others() {
    // Auto (AVX-512 where the CPU has it), Avx2 and Scalar: each tiled result equal to its own
    // per-row loop (see `exact_per_row`), and the three within float summation order of each
    // other.
    for ty in AVX512_TYPES {
        for (s, &(n, cols)) in [(37, 768), (600, 1024)].iter().enumerate() {
            let mats = [
                CpuQMatMul::from_blocks(random_blocks(ty, n, cols, 50 + s as u64)).unwrap(),
                CpuQMatMul::from_blocks(random_blocks(ty, 5, cols, 60 + s as u64)).unwrap(),
            ];
            for m in [1, 5, 64, 67] {
                let x = values(m * cols, 300 + m as u64);
                let run = |kernel, tiling| outputs(&mats, &x, m, kernel, tiling);
                let scalar = run(Kernel::Scalar, Tiling::Tiled);
                for kernel in [Kernel::Auto, Kernel::Avx2] {
                    let tiled = run(kernel, Tiling::Tiled);
                    let per_row = run(kernel, Tiling::PerRow);
                    if exact_per_row(ty, kernel, m) {
                        assert_eq!(tiled, per_row, "{ty} {kernel:?} m={m} {cols}->{n}");
                    } else {
                        for (a, b) in tiled.iter().flatten().zip(per_row.iter().flatten()) {
                            assert!(close(*a, *b, cols), "{ty} m={m}: {a} vs per-row {b}");
                        }
                    }
                    for (a, b) in tiled.iter().flatten().zip(scalar.iter().flatten()) {
                        assert!(
                            close(*a, *b, cols),
                            "{ty} {kernel:?} m={m}: {a} vs scalar {b}"
                        );
                    }
                }
                let format = Format::of(ty).unwrap();
                if m < GEMM_MIN_ROWS && !Avx512::row_wins(format) {
                    // Decode of a table-coded format is the AVX2 path's, unchanged; Q5's
                    // AVX-512 kernel (`q5_avx512`) has the AVX2 one's lane sums and order.
                    assert_eq!(
                        run(Kernel::Auto, Tiling::Tiled),
                        run(Kernel::Avx2, Tiling::Tiled)
                    );
                }
            }
        }
    }
}
