//! Checks of the IQ4_NL, IQ4_XS and MXFP4 decoders and kernels against an independent
//! reference: the `gguf` Python package's dequantization of random raw blocks
//! (tests/fixtures/iq-quants/blocks.json, written by scripts/make-iq-fixture.py), then an f32
//! dot product; and the scalar kernels against the AVX2 ones on larger random matrices.

use super::activation::BLOCK;
use super::tests::{dequantized_activations, values};
use super::{Blocks, CpuQMatMul, Kernel};
use crate::header::GgufType;

const TYPES: [GgufType; 3] = [GgufType::IQ4_NL, GgufType::IQ4_XS, GgufType::MXFP4];

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

/// A fixture case: the blocks and the package's values.
struct Case {
    blocks: Blocks,
    values: Vec<f32>,
}

fn fixture() -> Vec<Case> {
    let path = ferry_testkit::repo_root().join("tests/fixtures/iq-quants/blocks.json");
    let text = std::fs::read_to_string(path).expect("fixture (scripts/make-iq-fixture.py)");
    let json: serde_json::Value = serde_json::from_str(&text).expect("fixture json");
    let cases = json["cases"].as_array().expect("cases");
    cases
        .iter()
        .map(|c| {
            let name = c["type"].as_str().expect("type");
            let ty = *GgufType::ALL
                .iter()
                .find(|t| t.name() == name)
                .expect("known type");
            let shape = [
                c["rows"].as_u64().unwrap() as usize,
                c["cols"].as_u64().unwrap() as usize,
            ];
            let blocks = Blocks::owned(unhex(c["blocks"].as_str().unwrap()), ty, &shape).unwrap();
            let values = unhex(c["values"].as_str().unwrap())
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            Case { blocks, values }
        })
        .collect()
}

/// For each output: (f32 dot of `w` and `x`, sum of |w||x|, worst-case activation rounding).
fn reference(w: &[f32], k: usize, x: &[f32]) -> Vec<(f32, f32, f32)> {
    let mut out = Vec::new();
    for xi in x.chunks(k) {
        for wr in w.chunks(k) {
            let (mut dot, mut mag, mut bound) = (0f64, 0f64, 0f64);
            for (wb, xb) in wr.chunks(BLOCK).zip(xi.chunks(BLOCK)) {
                let step = xb.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                for (&a, &b) in wb.iter().zip(xb) {
                    dot += f64::from(a) * f64::from(b);
                    mag += f64::from(a.abs() * b.abs());
                    bound += f64::from(a.abs()) * f64::from(step) * 0.52;
                }
            }
            out.push((dot as f32, mag as f32, bound as f32));
        }
    }
    out
}

fn run(blocks: &Blocks, x: &[f32], m: usize, kernel: Kernel) -> Vec<f32> {
    let mm = CpuQMatMul::from_blocks(blocks.clone()).unwrap();
    let mut out = vec![f32::NAN; m * mm.out_features()];
    mm.matmul_f32(x, m, &mut out, kernel).unwrap();
    out
}

/// The kernel's results for `m` rows of `x` against the f32 dot with `w` (the same weight's
/// values): within the activation rounding bound of the exact dot, and within float error of
/// the dot with the same int8 activations.
fn check_kernel(blocks: &Blocks, w: &[f32], m: usize, seed: u64) {
    let k = blocks.cols();
    let x = values(m * k, seed);
    let xq: Vec<f32> = x.chunks(k).flat_map(dequantized_activations).collect();
    for kernel in [Kernel::Auto, Kernel::Scalar] {
        let got = run(blocks, &x, m, kernel);
        let what = format!("{} {kernel:?} {m}x{k}->{}", blocks.ty(), blocks.rows());
        for (i, (&g, &(want, mag, bound))) in got.iter().zip(&reference(w, k, &x)).enumerate() {
            let tol = bound + 1e-3 * mag + 1e-6;
            assert!(
                (g - want).abs() <= tol,
                "{what} out {i}: {g} vs {want} (tol {tol})"
            );
        }
        for (i, (&g, &(want, mag, _))) in got.iter().zip(&reference(w, k, &xq)).enumerate() {
            let tol = 1e-4 * mag + 1e-6;
            assert!(
                (g - want).abs() <= tol,
                "{what} out {i}: {g} vs {want} with the same int8 activations (tol {tol})"
            );
        }
    }
}

#[test]
fn decoders_match_the_gguf_package() {
    let cases = fixture();
    for ty in TYPES {
        assert!(
            cases.iter().any(|c| c.blocks.ty() == ty),
            "fixture lacks {ty}"
        );
        assert!(CpuQMatMul::supports(ty), "{ty}");
    }
    for c in &cases {
        let ours = c.blocks.dequantize().unwrap();
        assert_eq!(ours.len(), c.values.len());
        for (i, (a, b)) in ours.iter().zip(&c.values).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{} value {i}: {a} vs {b}",
                c.blocks.ty()
            );
        }
        // An embedding lookup decodes the rows asked for, in the order asked.
        let (rows, cols) = (c.blocks.rows(), c.blocks.cols());
        let ids: Vec<u32> = (0..rows as u32).rev().chain([0]).collect();
        let mut looked_up = vec![0f32; ids.len() * cols];
        c.blocks.dequantize_rows(&ids, &mut looked_up).unwrap();
        for (row, &id) in looked_up.chunks(cols).zip(&ids) {
            let id = id as usize;
            assert_eq!(row, &c.values[id * cols..(id + 1) * cols]);
        }
        assert!(c
            .blocks
            .dequantize_rows(&[rows as u32], &mut vec![0.0; cols])
            .is_err());
    }
}

#[test]
fn kernels_match_the_gguf_package_then_f32_dot() {
    for c in fixture() {
        for m in [1, 2, 5] {
            check_kernel(&c.blocks, &c.values, m, 40 + m as u64);
        }
    }
}

/// Random raw blocks of `ty` for a `[n, k]` matrix, with scales in realistic ranges.
pub(super) fn random_blocks(ty: GgufType, n: usize, k: usize, seed: u64) -> Blocks {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let count = n * k / ty.block_size();
    let mut bytes = Vec::with_capacity(count * ty.type_size());
    for _ in 0..count {
        let start = bytes.len();
        bytes.extend((0..ty.type_size()).map(|_| next() as u8));
        let block = &mut bytes[start..];
        match ty {
            GgufType::MXFP4 => block[0] = 118 + (next() % 14) as u8,
            _ => {
                let d = half::f16::from_f32((next() % 2000) as f32 * 1e-4 - 0.1);
                block[..2].copy_from_slice(&d.to_le_bytes());
                if matches!(ty, GgufType::Q4_1 | GgufType::Q5_1) {
                    let m = half::f16::from_f32((next() % 2000) as f32 * 1e-3 - 1.0);
                    block[2..4].copy_from_slice(&m.to_le_bytes());
                }
            }
        }
    }
    Blocks::owned(bytes, ty, &[n, k]).unwrap()
}

#[test]
fn kernels_on_random_blocks_match_their_decoding_and_each_other() {
    for ty in TYPES {
        for (s, &(n, k)) in [(1, 256), (3, 512), (7, 768), (33, 1536), (130, 1536)]
            .iter()
            .enumerate()
        {
            let blocks = random_blocks(ty, n, k, 5 + s as u64);
            let w = blocks.dequantize().unwrap();
            for m in [1, 3] {
                check_kernel(&blocks, &w, m, 70 + s as u64);
            }
            let x = values(3 * k, 9);
            let auto = run(&blocks, &x, 3, Kernel::Auto);
            let scalar = run(&blocks, &x, 3, Kernel::Scalar);
            for (a, b) in auto.iter().zip(&scalar) {
                assert!(
                    super::test_support::close(*a, *b, k),
                    "{ty} {k}->{n}: simd {a} vs scalar {b}"
                );
            }
        }
    }
}

#[test]
fn iq4_xs_needs_whole_super_blocks() {
    assert!(Blocks::owned(vec![0; 136], GgufType::IQ4_XS, &[1, 256]).is_ok());
    assert!(Blocks::owned(vec![0; 136], GgufType::IQ4_XS, &[2, 128]).is_err());
}
