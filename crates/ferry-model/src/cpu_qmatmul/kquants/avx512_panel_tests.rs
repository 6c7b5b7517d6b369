//! The Q2_K..Q6_K AVX-512 GEMM kernel ([`super::run`]) against the scalar one-row kernels bit
//! for bit: partial sixteen-row blocks and 64-row panels (a short last panel, whose unused
//! blocks hold an earlier panel's decoding), sub-ranges of weight rows, activation counts that
//! leave partial two-, three- and four-row sweeps, the extreme scaled bytes (Q2_K's 45, Q3_K's 0 and 252) and i16 sums
//! (Q4_K, Q5_K) against
//! extreme activations; and a weight changed in one bit must change its row's outputs (the
//! comparison can fail). (The tiled matmul through it: `tile_tests.rs`.)

use super::super::activation::{quantize_row_k, Q8KBlock, QK_K};
use super::super::avx512_tile::Avx512;
use super::super::{scalar, KFormat};
use crate::cpu_qmatmul::test_support::{drift_values, random_bytes};

/// `n` rows of `kb` random super-blocks of `format` with small finite f16 scales.
fn weights(format: KFormat, n: usize, kb: usize, seed: u64) -> Vec<u8> {
    let bytes = format.block_bytes();
    let mut w = random_bytes(bytes * n * kb, seed);
    // The f16 `d` (and `dmin`) of each block: 2^-8..2^-7 (exponent 7), any mantissa.
    let scale_at: &[usize] = match format {
        KFormat::Q2K => &[80, 82],
        KFormat::Q3K => &[108],
        KFormat::Q6K => &[208],
        _ => &[0, 2],
    };
    for b in w.chunks_exact_mut(bytes) {
        for &at in scale_at {
            b[at + 1] = 0x1C | (b[at + 1] & 0x83);
        }
    }
    w
}

/// `m` activation rows of `kb` super-blocks.
fn activations(m: usize, kb: usize, seed: u64) -> Vec<Q8KBlock> {
    let x = drift_values(m * kb * QK_K, seed, 37);
    let mut act = vec![Q8KBlock::ZERO; m * kb];
    for (a, x) in act.chunks_mut(kb).zip(x.chunks(kb * QK_K)) {
        quantize_row_k(x, a);
    }
    act
}

fn outputs(format: KFormat, data: &[u8], n: usize, lo: usize, rows: &[&[Q8KBlock]]) -> Vec<f32> {
    let k = Avx512::detect().unwrap();
    let mut got = vec![f32::NAN; rows.len() * n];
    let mut put = |i: usize, r0: usize, ys: &[f32]| {
        got[i * n + r0..i * n + r0 + ys.len()].copy_from_slice(ys);
    };
    let stride = data.len() / n;
    assert!(super::run(k, format, data, stride, lo..n, rows, &mut put));
    got
}

/// Asserts that `format`'s GEMM over rows `lo..n` of `data` equals the scalar dot everywhere.
fn assert_equal(format: KFormat, data: &[u8], n: usize, lo: usize, rows: &[&[Q8KBlock]]) {
    let row_bytes = data.len() / n;
    let got = outputs(format, data, n, lo, rows);
    for (i, a) in rows.iter().enumerate() {
        for r in 0..n {
            let g = got[i * n + r];
            if r < lo {
                assert!(g.is_nan(), "{format:?} wrote row {r} outside its range");
                continue;
            }
            let want = scalar::dot(format, &data[r * row_bytes..][..row_bytes], a);
            let m = rows.len();
            assert_eq!(
                g.to_bits(),
                want.to_bits(),
                "{format:?} n={n} m={m} ({i}, {r}): {g} vs {want}"
            );
        }
    }
}

#[test]
fn k_quant_avx512_gemm_equals_the_scalar_row_kernel_bit_for_bit() {
    if Avx512::detect().is_none() {
        eprintln!("skipped: this CPU lacks AVX-512 F/BW/VNNI");
        return;
    }
    for format in KFormat::ALL {
        for (s, &(n, kb)) in [
            (1, 1),
            (16, 1),
            (17, 2),
            (35, 3),
            (9, 2),
            (64, 1),
            (70, 2),
            (130, 1),
        ]
        .iter()
        .enumerate()
        {
            let data = weights(format, n, kb, 11 + s as u64);
            for m in [1, 3, 4, 5, 8, 9, 14] {
                let act = activations(m, kb, 60 + m as u64);
                let rows: Vec<&[Q8KBlock]> = act.chunks(kb).collect();
                assert_equal(format, &data, n, n / 3, &rows);
            }
        }
    }
}

#[test]
fn the_extreme_scaled_bytes_stay_exact() {
    // Q2_K: scale 15 and quant 3 (the byte 45); Q3_K: scale -32 with quant 0 (the byte 252,
    // product 128) and with quant 7 (product -96), scale 31 with quant 0 and 7; Q4_K / Q5_K:
    // every quant 15 / 31 (the largest i16 sums); activations at -128, -127 and 127.
    if Avx512::detect().is_none() {
        return;
    }
    let (n, kb, m) = (18, 2, 5);
    let mut act = activations(m, kb, 3);
    for (i, a) in act.iter_mut().enumerate() {
        for (j, q) in a.qs.iter_mut().enumerate() {
            *q = match i % 3 {
                0 => 127,
                1 => -128,
                _ if (j / 7) % 2 == 0 => 127,
                _ => -127,
            };
        }
        for (s, g) in a.bsums.iter_mut().zip(a.qs.chunks_exact(16)) {
            *s = g.iter().map(|&q| i16::from(q)).sum();
        }
    }
    let rows: Vec<&[Q8KBlock]> = act.chunks(kb).collect();
    let mut q2 = weights(KFormat::Q2K, n, kb, 4);
    for (b, block) in q2.chunks_exact_mut(84).enumerate() {
        block[..16].fill(if b % 3 == 0 { 0xFF } else { 0x0F });
        block[16..80].fill(if b % 2 == 0 { 0xFF } else { 0xE4 });
    }
    assert_equal(KFormat::Q2K, &q2, n, 0, &rows);
    let mut q3 = weights(KFormat::Q3K, n, kb, 5);
    for (b, block) in q3.chunks_exact_mut(110).enumerate() {
        // Scale bytes 0: every scale -32; 0xFF: every scale 31.
        block[96..108].fill(if b % 2 == 0 { 0x00 } else { 0xFF });
        let quants = if b % 3 == 0 { 0x00 } else { 0xFF };
        block[..96].fill(quants);
    }
    assert_equal(KFormat::Q3K, &q3, n, 0, &rows);
    for (format, quants) in [(KFormat::Q4K, 16..144), (KFormat::Q5K, 16..176)] {
        let mut w = weights(format, n, kb, 6);
        for (b, block) in w.chunks_exact_mut(format.block_bytes()).enumerate() {
            block[4..16].fill(if b % 2 == 0 { 0xFF } else { 0xBF });
            block[quants.clone()].fill(0xFF);
        }
        assert_equal(format, &w, n, 0, &rows);
    }
}

#[test]
fn a_changed_weight_bit_changes_the_avx512_gemm_outputs() {
    // The planted bug: the low bit of a quant byte of row 5 flipped (byte 40 of its first
    // super-block: quants in both formats), changing one weight.
    if Avx512::detect().is_none() {
        return;
    }
    for format in KFormat::ALL {
        let (n, kb, m) = (19, 2, 8);
        let data = weights(format, n, kb, 5);
        let act = activations(m, kb, 6);
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
