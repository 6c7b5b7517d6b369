//! The AVX2 activation quantizers ([`super::activation_avx2`]) against the scalar ones, block
//! for block and bit for bit: random rows, rows whose scaled values sit on the rounding
//! halves, ties of the largest magnitude (the first one is the k-quants' sign), zero, NaN and
//! infinite values; and a planted difference (one value changed) must show.

use super::activation::{quantize_block, Q8Block, BLOCK};
use super::activation_avx2::Avx2;
use super::kquants::activation::{quantize_block_k, Q8KBlock, QK_K};
use super::test_support::drift_values;

/// Rows of `n` values that stress the quantizers (`case` picks the kind).
fn row(case: usize, n: usize, seed: u64) -> Vec<f32> {
    let mut x = drift_values(n, seed, 41);
    match case % 7 {
        // Values whose scaled form is k + 0.5 for the block's scale (max 127 -> scale 1).
        0 => {
            for (i, v) in x.iter_mut().enumerate() {
                *v = (i % 255) as f32 * 0.5 - 63.5;
            }
            x[0] = 127.0;
        }
        // The largest magnitude twice, with opposite signs (the first one wins).
        1 => {
            x[3] = -9.0;
            x[n - 5] = 9.0;
        }
        2 => x.iter_mut().for_each(|v| *v = 0.0),
        3 => x[n / 2] = f32::NAN,
        4 => x[7] = f32::INFINITY,
        5 => x.iter_mut().step_by(3).for_each(|v| *v = -0.0),
        _ => {}
    }
    x
}

fn q8(xs: &[f32]) -> (Q8Block, Q8Block) {
    let xs: &[f32; BLOCK] = xs.try_into().unwrap();
    let (mut want, mut got) = (Q8Block::ZERO, Q8Block::ZERO);
    quantize_block(xs, &mut want);
    Avx2::detect().unwrap().block_q8(xs, &mut got);
    (want, got)
}

fn q8k(xs: &[f32]) -> (Q8KBlock, Q8KBlock) {
    let xs: &[f32; QK_K] = xs.try_into().unwrap();
    let (mut want, mut got) = (Q8KBlock::ZERO, Q8KBlock::ZERO);
    quantize_block_k(xs, &mut want);
    if !Avx2::detect().unwrap().block_q8k(xs, &mut got) {
        // Left to the scalar code: only where the largest magnitude is infinite.
        assert!(xs.iter().any(|v| v.is_infinite()));
        quantize_block_k(xs, &mut got);
    }
    (want, got)
}

/// Bit patterns, so that NaN scales compare.
fn bits8(b: &Q8Block) -> (u32, u32, i32, [i8; BLOCK]) {
    (b.d.to_bits(), b.s.to_bits(), b.isum, b.qs)
}

fn bits8k(b: &Q8KBlock) -> (u32, Vec<i16>, Vec<i8>) {
    (b.d.to_bits(), b.bsums.to_vec(), b.qs.to_vec())
}

#[test]
fn the_avx2_quantizers_equal_the_scalar_ones_bit_for_bit() {
    if Avx2::detect().is_none() {
        eprintln!("skipped: this CPU lacks AVX2");
        return;
    }
    for case in 0..70 {
        let x = row(case, QK_K, 17 + case as u64);
        for xs in x.chunks_exact(BLOCK) {
            let (want, got) = q8(xs);
            assert_eq!(bits8(&got), bits8(&want), "case {case}: {xs:?}");
        }
        let (want, got) = q8k(&x);
        assert_eq!(bits8k(&got), bits8k(&want), "case {case}");
    }
}

#[test]
fn the_first_of_tied_magnitudes_sets_the_k_quant_sign() {
    if Avx2::detect().is_none() {
        return;
    }
    let mut x = vec![0.5f32; QK_K];
    x[200] = -4.0;
    x[201] = 4.0;
    let (want, got) = q8k(&x);
    assert_eq!(got.qs[200], -127);
    assert_eq!(got.qs[201], 127);
    assert_eq!(bits8k(&got), bits8k(&want));
    x[30] = 4.0;
    let (_, flipped) = q8k(&x);
    assert_eq!(flipped.qs[30], -127, "the earlier 4.0 is now the first");
}

#[test]
fn a_changed_value_changes_the_avx2_blocks() {
    // The planted difference: one value moved by more than a step must change its byte and
    // its group's sum in both quantizers.
    if Avx2::detect().is_none() {
        return;
    }
    let x = row(6, QK_K, 5);
    let mut y = x.clone();
    y[37] += 0.5;
    let (a, b) = (q8k(&x).1, q8k(&y).1);
    assert_ne!(a.qs[37], b.qs[37]);
    assert_ne!(a.bsums[2], b.bsums[2]);
    let (a, b) = (q8(&x[32..64]).1, q8(&y[32..64]).1);
    assert_ne!(a.qs[5], b.qs[5]);
    assert_ne!(a.isum, b.isum);
}
