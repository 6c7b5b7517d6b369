//! IQ4_XS, IQ4_NL, MXFP4, Q5_0 and Q5_1 in the panel layout ([`super::table_panel`],
//! [`super::q5_panel`]): every format's rows (the k-quants' too) come back from the layout byte for
//! byte; the panel dots and the GEMM read from panels equal the AVX2 GEMM over the GGUF rows bit
//! for bit (and the scalar dot within float summation order); a weight changed in one bit changes
//! its row's output and no other; a weight with panels multiplies as its GGUF rows do, its decode
//! giving the bits its prompt gives (the comparisons can fail).

use super::activation::{quantize_row, Q8Block};
use super::avx2::Avx2;
use super::avx2_tile::has_vnni;
use super::iq_tests::random_blocks;
use super::panel8::{fits, PanelFormat, Panels, ROWS};
use super::test_support::{close, k_quant_weights, outputs};
use super::tests::values;
use super::tile::Tiling;
use super::{avx2_panel, iq4, mxfp4, q5, CpuQMatMul, Format, Kernel};
use crate::header::GgufType;

/// A format of these tests: its GGUF type, layout and matmul format.
#[derive(Clone, Copy, Debug)]
struct Case {
    ty: GgufType,
    layout: PanelFormat,
    format: Format,
}

const CASES: [Case; 5] = [
    Case {
        ty: GgufType::IQ4_XS,
        layout: PanelFormat::Iq4Xs,
        format: Format::IQ4_XS,
    },
    Case {
        ty: GgufType::IQ4_NL,
        layout: PanelFormat::Iq4Nl,
        format: Format::IQ4_NL,
    },
    Case {
        ty: GgufType::MXFP4,
        layout: PanelFormat::Mxfp4,
        format: Format::MXFP4,
    },
    Case {
        ty: GgufType::Q5_0,
        layout: PanelFormat::Q5_0,
        format: Format::Q5_0,
    },
    Case {
        ty: GgufType::Q5_1,
        layout: PanelFormat::Q5_1,
        format: Format::Q5_1,
    },
];

impl Case {
    /// Elements per block.
    fn elements(self) -> usize {
        self.layout.block_elements()
    }

    /// The GGUF bytes of a random `n` x `kb` block matrix.
    fn weights(self, n: usize, kb: usize, seed: u64) -> Vec<u8> {
        let blocks = random_blocks(self.ty, n, self.elements() * kb, seed);
        blocks.bytes().unwrap().into_owned()
    }

    /// `m` activation rows of `kb` blocks.
    fn activations(self, m: usize, kb: usize, seed: u64) -> Vec<Vec<Q8Block>> {
        let k = self.elements() * kb;
        let x = values(m * k, seed);
        x.chunks(k)
            .map(|x| {
                let mut a = vec![Q8Block::ZERO; k / 32];
                quantize_row(x, &mut a);
                a
            })
            .collect()
    }

    /// The panel kernel's eight dots.
    fn dots(self, k: Avx2, panel: &[u8], a: &[Q8Block]) -> [f32; ROWS] {
        avx2_panel::panel_dots(k, self.layout, panel, a).expect("a 32-element panel format")
    }

    /// The scalar one-row dot.
    fn scalar(self, row: &[u8], a: &[Q8Block]) -> f32 {
        match self.layout {
            PanelFormat::Iq4Xs => iq4::dot_iq4_xs(row, a),
            PanelFormat::Iq4Nl => iq4::dot_iq4_nl(row, a),
            PanelFormat::Mxfp4 => mxfp4::dot_mxfp4(row, a),
            PanelFormat::Q5_0 => q5::dot_q5_0(row, a),
            _ => q5::dot_q5_1(row, a),
        }
    }
}

/// The AVX2 GEMM over the GGUF rows `range` of `raw` (`n` rows), or over `panels`' rows, for
/// the activation rows `acts`: `m x n` outputs, NaN where none was written.
fn gemm(
    case: Case,
    k: Avx2,
    vnni: bool,
    source: (&[u8], &Panels),
    from_panels: bool,
    range: std::ops::Range<usize>,
    acts: &[Vec<Q8Block>],
) -> Vec<f32> {
    let (raw, panels) = source;
    let n = panels.rows();
    let rows: Vec<&[Q8Block]> = acts.iter().map(Vec::as_slice).collect();
    let mut got = vec![f32::NAN; acts.len() * n];
    let mut put = |i: usize, r0: usize, ys: &[f32]| {
        got[i * n + r0..i * n + r0 + ys.len()].copy_from_slice(ys);
    };
    let done = match from_panels {
        true => avx2_panel::run_panels(k, vnni, panels, range, &rows, &mut put),
        false => {
            let stride = raw.len() / n;
            avx2_panel::run(k, vnni, case.format, raw, stride, range, &rows, &mut put)
        }
    };
    assert!(done);
    got
}

#[test]
fn every_format_s_panel_layout_gives_every_row_back() {
    for format in PanelFormat::ALL {
        for (n, kb) in [(8, 1), (16, 3), (24, 2)] {
            let seed = 5 + n as u64;
            let raw = match format {
                PanelFormat::K(k) => k_quant_weights(k, n, kb, seed),
                _ => {
                    let case = CASES.into_iter().find(|c| c.layout == format).unwrap();
                    case.weights(n, kb, seed)
                }
            };
            let panels = Panels::pack(format, &raw, n, kb).unwrap();
            assert_eq!(
                panels.len(),
                raw.len(),
                "{format:?}: as large as the GGUF rows"
            );
            let row_bytes = kb * format.block_bytes();
            let mut row = vec![0u8; row_bytes];
            for r in 0..n {
                panels.unpack_row(r, &mut row);
                let want = &raw[r * row_bytes..(r + 1) * row_bytes];
                assert_eq!(row, want, "{format:?} row {r}");
            }
        }
    }
    assert!(!fits(12, 2), "rows not whole panels");
    assert!(fits(16, 2));
}

#[test]
fn panel_dots_equal_the_gemm_bit_for_bit() {
    let Some(k) = Avx2::detect() else {
        eprintln!("skipped: this CPU lacks AVX2/FMA/F16C");
        return;
    };
    for case in CASES {
        let bytes = case.layout.block_bytes();
        // Where a block's quant bytes start (its last segment).
        let quants = case.layout.segments().last().unwrap().0;
        for (s, kb) in [1, 2, 5].into_iter().enumerate() {
            let n = 16;
            let row_bytes = kb * bytes;
            let mut raw = case.weights(n, kb, 40 + s as u64);
            let acts = case.activations(3, kb, 70 + s as u64);
            let panels = Panels::pack(case.layout, &raw, n, kb).unwrap();
            let want = gemm(case, k, false, (&raw, &panels), false, 0..n, &acts);
            let what = |i: usize| format!("{case:?} kb={kb} act {i}");
            for (i, a) in acts.iter().enumerate() {
                for p in 0..n / ROWS {
                    let got = case.dots(k, panels.panel(p), a);
                    for (r, y) in got.into_iter().enumerate() {
                        let at = i * n + ROWS * p + r;
                        assert_eq!(y.to_bits(), want[at].to_bits(), "{} row {r}", what(i));
                        let row = &raw[(ROWS * p + r) * row_bytes..][..row_bytes];
                        let scalar = case.scalar(row, a);
                        let k = case.elements() * kb;
                        assert!(close(y, scalar, k), "{}: {y} vs scalar {scalar}", what(i));
                    }
                }
                // One quant bit of row 9 (panel 1, lane 1) in its last block flipped (the
                // first from a byte that moves with `i` that moves the scalar dot: a scale or
                // an activation can be zero): its dot moves, no other.
                let before = case.dots(k, panels.panel(1), a);
                let row9 = |raw: &[u8]| case.scalar(&raw[9 * row_bytes..][..row_bytes], a);
                let first = 9 * row_bytes + row_bytes - bytes + quants;
                let at = (first + 5 * i..first + bytes - quants)
                    .find(|&at| {
                        let mut flipped = raw.clone();
                        flipped[at] ^= 0x01;
                        row9(&flipped) != row9(&raw)
                    })
                    .expect("a quant bit that moves the dot");
                raw[at] ^= 0x01;
                let changed = Panels::pack(case.layout, &raw, n, kb).unwrap();
                let after = case.dots(k, changed.panel(1), a);
                let k = case.elements() * kb;
                assert!(close(after[1], row9(&raw), k), "{}: changed row", what(i));
                raw[at] ^= 0x01;
                for r in 0..ROWS {
                    assert_eq!(before[r] != after[r], r == 1, "{} lane {r}", what(i));
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
    for case in CASES {
        let (n, kb) = (32, 3);
        let raw = case.weights(n, kb, 90);
        let panels = Panels::pack(case.layout, &raw, n, kb).unwrap();
        // The AVX-VNNI variant only where the CPU has it (else `run_panels` takes the plain one).
        let variants: &[bool] = if has_vnni() { &[false, true] } else { &[false] };
        for &vnni in variants {
            for (m, range) in [(8, 0..32), (13, 8..24), (1, 16..32), (5, 24..32)] {
                let acts = case.activations(m, kb, 200 + m as u64);
                let source = (raw.as_slice(), &panels);
                let from_panels = gemm(case, k, vnni, source, true, range.clone(), &acts);
                let from_rows = gemm(case, k, vnni, source, false, range.clone(), &acts);
                for (i, (a, b)) in from_panels.iter().zip(&from_rows).enumerate() {
                    let what = format!("{case:?} vnni={vnni} m={m} output {i}");
                    assert_eq!(a.to_bits(), b.to_bits(), "{what}");
                }
                let written = from_panels.iter().filter(|v| !v.is_nan()).count();
                assert_eq!(written, m * range.len(), "m={m}: the rows asked, no other");
            }
        }
    }
}

#[test]
fn a_weight_with_panels_multiplies_as_its_gguf_rows_do() {
    for case in CASES {
        // 704 rows make several tasks; 64 rows one.
        for (n, cols) in [(64, 512), (704, 256)] {
            let seed = 7 + n as u64;
            let matrix = || CpuQMatMul::from_blocks(random_blocks(case.ty, n, cols, seed)).unwrap();
            let plain = [matrix()];
            let packed = [matrix().with_panels_for(Kernel::Avx2)];
            assert_eq!(
                packed[0].has_panels(),
                Avx2::detect().is_some(),
                "{case:?}: panels made where the AVX2 kernels run"
            );
            for m in [1, 2, 3, 4, 5, 9, 17] {
                // Rows past `m` up to four make the plain weight's call a GEMM one too
                // (`GEMM_MIN_ROWS`): each output row depends on its activation row only.
                let x = values(m.max(4) * cols, 300 + m as u64);
                for kernel in [Kernel::Avx2, Kernel::AvxVnni, Kernel::Scalar] {
                    let got = outputs(&packed, &x[..m * cols], m, kernel, Tiling::Tiled);
                    assert!(got.iter().flatten().all(|v| v.is_finite()));
                    let prompt = outputs(&plain, &x, m.max(4), kernel, Tiling::Tiled);
                    let per_row = outputs(&plain, &x[..m * cols], m, kernel, Tiling::PerRow);
                    for (i, (&y, &want)) in got[0].iter().zip(&prompt[0]).enumerate() {
                        let what = format!("{case:?} {kernel:?} m={m} {cols}->{n} output {i}");
                        assert!(close(y, per_row[0][i], cols), "{what}");
                        if kernel != Kernel::Scalar && Avx2::detect().is_some() {
                            assert_eq!(y.to_bits(), want.to_bits(), "{what}: the prompt's bits");
                        } else {
                            assert_eq!(y.to_bits(), per_row[0][i].to_bits(), "{what}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn mxfp4_panel_scales_equal_e8m0_half_for_every_byte() {
    use super::table_panel::{Mx, TableFormat};
    if Avx2::detect().is_none() {
        eprintln!("skipped: this CPU lacks AVX2/FMA/F16C");
        return;
    }
    // Eight rows' `e` at a time (the random blocks above only hold normal scales).
    for first in (0..=255u8).step_by(ROWS) {
        let mut blk = [0u8; 17 * ROWS];
        for (r, e) in blk[..ROWS].iter_mut().enumerate() {
            *e = first + r as u8;
        }
        let mut lanes = [0f32; ROWS];
        // SAFETY: AVX2 and F16C checked above; `blk` is one MXFP4 panel block.
        unsafe {
            let scales = Mx::scales(blk.as_ptr());
            std::arch::x86_64::_mm256_storeu_ps(lanes.as_mut_ptr(), scales[0]);
        }
        for (r, y) in lanes.into_iter().enumerate() {
            let want = mxfp4::e8m0_half(blk[r]);
            assert_eq!(y.to_bits(), want.to_bits(), "e = {}", blk[r]);
        }
    }
}
