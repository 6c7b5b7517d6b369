//! The k-quant AVX2 GEMM kernel ([`super::run`]) against the scalar one-row kernels bit for
//! bit, every k-quant, for partial panels, sub-ranges of weight rows and row counts that leave
//! partial four-row groups; and a weight changed in one bit must change its row's outputs
//! (the comparison can fail). (The tiled matmul through it: `tile_tests.rs`.)

use super::super::activation::{quantize_row_k, Q8KBlock, QK_K};
use super::super::{scalar, KFormat};
use crate::cpu_qmatmul::avx2::Avx2;
use crate::cpu_qmatmul::test_support::{drift_values, k_quant_weights as weights};

fn outputs(format: KFormat, data: &[u8], n: usize, lo: usize, rows: &[&[Q8KBlock]]) -> Vec<f32> {
    let k = Avx2::detect().unwrap();
    let mut got = vec![f32::NAN; rows.len() * n];
    let mut put = |i: usize, r0: usize, ys: &[f32]| {
        got[i * n + r0..i * n + r0 + ys.len()].copy_from_slice(ys);
    };
    let stride = data.len() / n;
    assert!(super::run(k, format, data, stride, lo..n, rows, &mut put));
    got
}

#[test]
fn k_quant_avx2_gemm_equals_the_scalar_row_kernel_bit_for_bit() {
    if Avx2::detect().is_none() {
        eprintln!("skipped: this CPU lacks AVX2/FMA/F16C");
        return;
    }
    for format in KFormat::ALL {
        // Sixteen-row pairs of panels, a short second panel, a lone last panel (n - n / 3 rows).
        for (s, &(n, kb)) in [(1, 1), (17, 2), (9, 3), (40, 2), (30, 1)]
            .iter()
            .enumerate()
        {
            let data = weights(format, n, kb, 11 + s as u64);
            let row_bytes = data.len() / n;
            for m in [1, 3, 4, 6, 9] {
                let x = drift_values(m * kb * QK_K, 60 + m as u64, 37);
                let mut act = vec![Q8KBlock::ZERO; m * kb];
                for (a, x) in act.chunks_mut(kb).zip(x.chunks(kb * QK_K)) {
                    quantize_row_k(x, a);
                }
                let rows: Vec<&[Q8KBlock]> = act.chunks(kb).collect();
                let lo = n / 3;
                let got = outputs(format, &data, n, lo, &rows);
                for (i, a) in rows.iter().enumerate() {
                    for r in 0..n {
                        let g = got[i * n + r];
                        if r < lo {
                            assert!(g.is_nan(), "{format:?} wrote row {r} outside its range");
                            continue;
                        }
                        let want = scalar::dot(format, &data[r * row_bytes..][..row_bytes], a);
                        assert_eq!(
                            g.to_bits(),
                            want.to_bits(),
                            "{format:?} m={m} kb={kb} ({i}, {r}): {g} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_changed_weight_bit_changes_the_k_quant_avx2_gemm_outputs() {
    // The planted bug: the low bit of a quant byte of row 5 flipped (byte 40 of its first
    // super-block: quants in every k-quant), changing one weight.
    if Avx2::detect().is_none() {
        return;
    }
    for format in KFormat::ALL {
        let (n, kb, m) = (9, 2, 8);
        let data = weights(format, n, kb, 5);
        let x = drift_values(m * kb * QK_K, 6, 37);
        let mut act = vec![Q8KBlock::ZERO; m * kb];
        for (a, x) in act.chunks_mut(kb).zip(x.chunks(kb * QK_K)) {
            quantize_row_k(x, a);
        }
        let rows: Vec<&[Q8KBlock]> = act.chunks(kb).collect();
        let mut bad = data.clone();
        let target = 5;
        bad[target * (data.len() / n) + 40] ^= 1;
        let good = outputs(format, &data, n, 0, &rows);
        let planted = outputs(format, &bad, n, 0, &rows);
        let differs = |r: usize| (0..m).any(|i| good[i * n + r] != planted[i * n + r]);
        assert!(
            differs(target),
            "{format:?}: the changed weight went unseen"
        );
        assert!((0..n).filter(|&r| r != target).all(|r| !differs(r)));
    }
}
