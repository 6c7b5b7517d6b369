//! The k-quants' panel layout ([`crate::cpu_qmatmul::panel8`]) and its AVX2 kernels (that every row
//! comes back from the layout: `layout_panel_tests`): the panel dots, the GEMM read from panels and
//! the tiled matmul of a weight with panels equal the scalar one-row kernel (or the per-row loop
//! over the GGUF rows) bit for bit; a weight changed in one bit changes its row's output and no
//! other (the comparisons can fail).

use super::super::activation::{quantize_row_k, Q8KBlock, QK_K};
use super::super::{avx2_panel, scalar, KFormat};
use crate::cpu_qmatmul::avx2::Avx2;
use crate::cpu_qmatmul::panel8::{Panels, ROWS};
use crate::cpu_qmatmul::test_support::{self, drift_values, k_quant_weights, outputs};
use crate::cpu_qmatmul::tile::Tiling;
use crate::cpu_qmatmul::Kernel;

/// The formats with a panel layout.
const FORMATS: [KFormat; 5] = KFormat::ALL;

/// `m` activation rows of `kb` super-blocks.
fn activations(m: usize, kb: usize, seed: u64) -> Vec<Vec<Q8KBlock>> {
    let x = drift_values(m * kb * QK_K, seed, 37);
    x.chunks(kb * QK_K)
        .map(|x| {
            let mut a = vec![Q8KBlock::ZERO; kb];
            quantize_row_k(x, &mut a);
            a
        })
        .collect()
}

#[test]
fn panel_dots_equal_the_scalar_row_kernel_bit_for_bit() {
    let Some(k) = Avx2::detect() else {
        eprintln!("skipped: this CPU lacks AVX2/FMA/F16C");
        return;
    };
    for format in FORMATS {
        for (s, kb) in [1, 2, 5].into_iter().enumerate() {
            let n = 16;
            let mut raw = k_quant_weights(format, n, kb, 40 + s as u64);
            let row_bytes = kb * format.block_bytes();
            for (i, a) in activations(3, kb, 70 + s as u64).iter().enumerate() {
                let panels = Panels::pack(format.into(), &raw, n, kb).unwrap();
                for p in 0..n / ROWS {
                    let got = super::dots(k, format, panels.panel(p), a);
                    for (r, y) in got.into_iter().enumerate() {
                        let row = &raw[(ROWS * p + r) * row_bytes..][..row_bytes];
                        let want = scalar::dot(format, row, a);
                        assert_eq!(y.to_bits(), want.to_bits(), "{format:?} kb={kb} row {r}");
                    }
                }
                // One quant bit of row 9 (panel 1, lane 1) flipped: its dot moves, no other.
                let before = super::dots(k, format, panels.panel(1), a);
                // A quant byte of the last block (Q5_K's byte 40 is a fifth bit, of a chunk whose
                // weight there is multiplied by zero in one case).
                let quant = if format == KFormat::Q5K { 88 } else { 40 };
                let at = 9 * row_bytes + row_bytes - format.block_bytes() + quant + i;
                raw[at] ^= 0x01;
                let changed = Panels::pack(format.into(), &raw, n, kb).unwrap();
                let after = super::dots(k, format, changed.panel(1), a);
                let row9 = scalar::dot(format, &raw[9 * row_bytes..][..row_bytes], a);
                assert_eq!(after[1].to_bits(), row9.to_bits(), "{format:?} changed row");
                raw[at] ^= 0x01;
                for r in 0..ROWS {
                    assert_eq!(before[r] != after[r], r == 1, "{format:?} lane {r}");
                }
            }
        }
    }
}

#[test]
fn the_gemm_from_panels_equals_the_gemm_from_rows_bit_for_bit() {
    let Some(k) = Avx2::detect() else {
        eprintln!("skipped: this CPU lacks AVX2/FMA/F16C");
        return;
    };
    for format in FORMATS {
        let (n, kb) = (32, 3);
        let raw = k_quant_weights(format, n, kb, 90);
        let panels = Panels::pack(format.into(), &raw, n, kb).unwrap();
        for (m, range) in [(8, 0..32), (13, 8..24), (9, 16..32)] {
            let acts = activations(m, kb, 200 + m as u64);
            let rows: Vec<&[Q8KBlock]> = acts.iter().map(Vec::as_slice).collect();
            let run = |from_panels: bool| {
                let mut got = vec![f32::NAN; m * n];
                let mut put = |i: usize, r0: usize, ys: &[f32]| {
                    got[i * n + r0..i * n + r0 + ys.len()].copy_from_slice(ys);
                };
                let done = match from_panels {
                    true => avx2_panel::run_panels(k, &panels, range.clone(), &rows, &mut put),
                    false => {
                        let stride = raw.len() / n;
                        avx2_panel::run(k, format, &raw, stride, range.clone(), &rows, &mut put)
                    }
                };
                assert!(done);
                got
            };
            let (from_panels, from_rows) = (run(true), run(false));
            for (i, (a, b)) in from_panels.iter().zip(&from_rows).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{format:?} m={m} output {i}");
            }
            let a = &acts[m - 1];
            let row = &raw[range.start * kb * format.block_bytes()..][..kb * format.block_bytes()];
            let want = scalar::dot(format, row, a);
            assert_eq!(
                from_panels[(m - 1) * n + range.start].to_bits(),
                want.to_bits()
            );
        }
    }
}

#[test]
fn a_weight_with_panels_multiplies_as_its_gguf_rows_do() {
    use candle_core::quantized::GgmlDType;
    for (dtype, format) in [
        (GgmlDType::Q4K, KFormat::Q4K),
        (GgmlDType::Q6K, KFormat::Q6K),
    ] {
        // 704 rows make several tasks; 64 rows one.
        for (n, cols) in [(64, 512), (704, 256)] {
            let plain = [test_support::matrix(dtype, n, cols, 7, 5)];
            let packed = [test_support::matrix(dtype, n, cols, 7, 5).with_panels_for(Kernel::Avx2)];
            assert_eq!(
                packed[0].has_panels(),
                Avx2::detect().is_some(),
                "{format:?}: panels made where the AVX2 kernels run"
            );
            for m in [1, 2, 5, 8, 9, 17] {
                let x = drift_values(m * cols, 300 + m as u64, 5);
                for kernel in [Kernel::Avx2, Kernel::AvxVnni, Kernel::Scalar] {
                    let got = outputs(&packed, &x, m, kernel, Tiling::Tiled);
                    let want = outputs(&plain, &x, m, kernel, Tiling::PerRow);
                    assert!(got.iter().flatten().all(|v| v.is_finite()));
                    assert_eq!(got, want, "{format:?} {kernel:?} m={m} {cols}->{n}");
                }
            }
        }
    }
}
