//! The Q5_0 / Q5_1 one-row kernels of every SIMD path ([`super::q5::avx2`] with and without
//! AVX-VNNI, [`super::q5_avx512`]) against the scalar dot ([`super::q5::dot_q5_0`],
//! [`super::q5::dot_q5_1`]): on blocks of every bit pattern within float summation order, and,
//! with every scale 1 (so each f32 operation is exact), equal to the exact integer dot product,
//! which the in-lane offset of Q5_0 must get right to the unit; and every SIMD path equal to
//! the plain AVX2 one bit for bit (the same lane sums, the same float operations). A path the
//! CPU lacks says so and is skipped.

use half::f16;

use super::activation::{quantize_row, Q8Block};
use super::avx2::Avx2;
use super::avx2_tile::has_vnni;
use super::avx512::Avx512;
use super::iq_tests::random_blocks;
use super::q5;
use super::q5_avx512;
use super::test_support::close;
use super::tests::values;
use crate::header::GgufType;

/// The SIMD one-row kernels of `ty` this CPU has, by name.
type RowFn = Box<dyn Fn(&[u8], &[Q8Block]) -> f32>;

fn kernels(ty: GgufType) -> Vec<(&'static str, RowFn)> {
    let q5_1 = ty == GgufType::Q5_1;
    let mut out: Vec<(&'static str, RowFn)> = Vec::new();
    if let Some(k) = Avx2::detect() {
        out.push(if q5_1 {
            ("avx2", Box::new(move |w, a| q5::avx2::dot_q5_1(k, w, a)))
        } else {
            ("avx2", Box::new(move |w, a| q5::avx2::dot_q5_0(k, w, a)))
        });
        if has_vnni() {
            out.push(if q5_1 {
                (
                    "avx-vnni",
                    Box::new(move |w, a| q5::avx2::dot_q5_1_vnni(k, w, a)),
                )
            } else {
                (
                    "avx-vnni",
                    Box::new(move |w, a| q5::avx2::dot_q5_0_vnni(k, w, a)),
                )
            });
        } else {
            eprintln!("skipped avx-vnni: this CPU lacks AVX-VNNI");
        }
    } else {
        eprintln!("skipped avx2: this CPU lacks AVX2");
    }
    if let Some(k) = Avx512::detect() {
        out.push(if q5_1 {
            ("avx512", Box::new(move |w, a| q5_avx512::dot_q5_1(k, w, a)))
        } else {
            ("avx512", Box::new(move |w, a| q5_avx512::dot_q5_0(k, w, a)))
        });
    } else {
        eprintln!("skipped avx512: this CPU lacks AVX-512 F/BW/VL/VNNI");
    }
    out
}

fn scalar(ty: GgufType, w: &[u8], a: &[Q8Block]) -> f32 {
    if ty == GgufType::Q5_1 {
        q5::dot_q5_1(w, a)
    } else {
        q5::dot_q5_0(w, a)
    }
}

fn quantized(x: &[f32]) -> Vec<Q8Block> {
    let mut a = vec![Q8Block::ZERO; x.len() / 32];
    quantize_row(x, &mut a);
    a
}

#[test]
fn simd_row_kernels_equal_the_scalar_dot_within_summation_order() {
    for ty in [GgufType::Q5_0, GgufType::Q5_1] {
        let bytes = if ty == GgufType::Q5_1 { 24 } else { 22 };
        // 1, 3, 7 and 9 blocks: a lone and an odd last block; 28 and 128 blocks: pairs only.
        for (s, &(n, cols)) in [(5, 32), (4, 96), (3, 224), (3, 288), (6, 896), (2, 4096)]
            .iter()
            .enumerate()
        {
            let blocks = random_blocks(ty, n, cols, 11 + s as u64);
            let data = blocks.bytes().unwrap().into_owned();
            let row = bytes * cols / 32;
            let act = quantized(&values(cols, 70 + s as u64));
            let all = kernels(ty);
            for (name, dot) in &all {
                for r in 0..n {
                    let w = &data[r * row..(r + 1) * row];
                    let (got, want) = (dot(w, &act), scalar(ty, w, &act));
                    assert!(
                        close(got, want, cols),
                        "{ty} {name} {cols} row {r}: {got} vs scalar {want}"
                    );
                    let plain = all[0].1(w, &act);
                    assert_eq!(
                        got.to_bits(),
                        plain.to_bits(),
                        "{ty} {name} {cols} row {r}: {got} vs {} {plain}",
                        all[0].0
                    );
                }
            }
        }
    }
}

#[test]
fn with_unit_scales_the_row_kernels_are_the_exact_integer_dot() {
    for ty in [GgufType::Q5_0, GgufType::Q5_1] {
        let bytes = if ty == GgufType::Q5_1 { 24 } else { 22 };
        let qh_at = if ty == GgufType::Q5_1 { 4 } else { 2 };
        for (s, cols) in [32usize, 96, 1024].into_iter().enumerate() {
            let mut data = random_blocks(ty, 1, cols, 3 + s as u64)
                .bytes()
                .unwrap()
                .into_owned();
            let one = f16::from_f32(1.0).to_le_bytes();
            for b in data.chunks_exact_mut(bytes) {
                b[..2].copy_from_slice(&one);
                if ty == GgufType::Q5_1 {
                    // m = 0: the offset term adds nothing (and `a.s`, rounded through f16,
                    // does not enter the integer sum).
                    b[2..4].copy_from_slice(&[0, 0]);
                }
            }
            let mut act = quantized(&values(cols, 90 + s as u64));
            for a in &mut act {
                a.d = 1.0;
            }
            let want: i64 = data
                .chunks_exact(bytes)
                .zip(&act)
                .map(|(b, a)| {
                    let qh = u32::from_le_bytes(b[qh_at..qh_at + 4].try_into().unwrap());
                    let q = q5::unpack5(qh, &b[qh_at + 4..qh_at + 20]);
                    let offset = if ty == GgufType::Q5_1 { 0 } else { 16 };
                    q.iter()
                        .zip(&a.qs)
                        .map(|(&q, &y)| i64::from(q - offset) * i64::from(y))
                        .sum::<i64>()
                })
                .sum();
            assert!(want.abs() < 1 << 24, "the sum must be exact in f32");
            assert_eq!(scalar(ty, &data, &act), want as f32, "{ty} scalar {cols}");
            for (name, dot) in kernels(ty) {
                assert_eq!(dot(&data, &act), want as f32, "{ty} {name} {cols}");
            }
        }
    }
}
