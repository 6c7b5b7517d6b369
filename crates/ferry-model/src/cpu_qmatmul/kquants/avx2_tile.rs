//! AVX2 four-row k-quant kernels ([`super::tile`]): each Q2_K..Q6_K super-block is
//! loaded, its quants unpacked to bytes and its scales widened once, then multiplied with the
//! four activation rows' blocks while it sits in registers.
//!
//! Per 32-element chunk and row the arithmetic is that of the one-row kernel
//! ([`super::avx2`]): `vpmaddubsw` of the unsigned weight bytes with the int8 activations (no
//! saturation, see there), then the i16 pair sums times the chunk's two 16-element scales into
//! i32 lanes, by `vpmaddwd` + `vpaddd` or, with AVX-VNNI (`VNNI`), one VEX `vpdpwssd`
//! (issued by `asm!`, as in [`crate::cpu_qmatmul::avx2_tile`]); both are exact. Each
//! block's lanes are summed for the four rows together ([`hsum4`]) and turned into f32 by
//! [`add_block_values`], the one-row kernels' [`super::block_value`] on four lanes: the same
//! integers and the same float operations, so the results are bit-identical.

// The four rows' blocks are indexed in lockstep.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::super::avx2::f16_at;
use super::activation::Q8KBlock;
use super::avx2::{bsums, doubled, duplicated, k4_quants, pair_scales, prefetch, q6_k_quants};
use super::tile::Rows4K;
use super::{scale_words_q3_k, scales_mins_k4, KFormat};

/// The four-row kernel of `format`.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C (and AVX-VNNI when `VNNI`); the four rows must be equally
/// long and `w..w + format.block_bytes() * a[0].len()` readable.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows4<const VNNI: bool>(
    format: KFormat,
    w: *const u8,
    a: Rows4K<'_>,
) -> [f32; 4] {
    match format {
        KFormat::Q4K => k4::<144, false, VNNI>(w, a),
        KFormat::Q5K => k4::<176, true, VNNI>(w, a),
        KFormat::Q6K => q6_k::<VNNI>(w, a),
        KFormat::Q2K => q2_k::<VNNI>(w, a),
        KFormat::Q3K => q3_k::<VNNI>(w, a),
    }
}

/// For each of four rows, the sum of its eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum4(v: [__m256i; 4]) -> __m128i {
    let s01 = _mm256_hadd_epi32(v[0], v[1]);
    let s23 = _mm256_hadd_epi32(v[2], v[3]);
    let s = _mm256_hadd_epi32(s01, s23);
    _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s))
}

/// `acc[r] + block_value(d, dmin, b[r].d, sumi[r], summ[r])` for the four rows: the same f32
/// operations as [`super::block_value`], lane by lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn add_block_values(
    acc: __m128,
    (d, dmin): (f32, f32),
    b: [&Q8KBlock; 4],
    sumi: __m128i,
    summ: __m128i,
) -> __m128 {
    let ad = _mm_setr_ps(b[0].d, b[1].d, b[2].d, b[3].d);
    let di = _mm_mul_ps(_mm_set1_ps(d), ad);
    let dm = _mm_mul_ps(_mm_set1_ps(dmin), ad);
    let v = _mm_sub_ps(
        _mm_mul_ps(di, _mm_cvtepi32_ps(sumi)),
        _mm_mul_ps(dm, _mm_cvtepi32_ps(summ)),
    );
    _mm_add_ps(acc, v)
}

/// The four lanes of `acc`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn lanes(acc: __m128) -> [f32; 4] {
    let mut out = [0f32; 4];
    // SAFETY: `out` is four f32.
    unsafe { _mm_storeu_ps(out.as_mut_ptr(), acc) };
    out
}

/// `sum + madd(pairs, scales)` by one VEX `vpdpwssd` (AVX-VNNI).
///
/// # Safety
/// The CPU must have AVX2 and AVX-VNNI.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dpwssd(mut sum: __m256i, pairs: __m256i, scales: __m256i) -> __m256i {
    // SAFETY: the caller has AVX-VNNI; the instruction reads and writes registers only.
    std::arch::asm!(
        "{{vex}} vpdpwssd {acc}, {p}, {s}",
        acc = inout(ymm_reg) sum,
        p = in(ymm_reg) pairs,
        s = in(ymm_reg) scales,
        options(pure, nomem, nostack, preserves_flags),
    );
    sum
}

/// `sum` plus the eight i32 lanes of `sum scale * q * y` for one chunk (as the one-row
/// kernel's `chunk`).
///
/// # Safety
/// `y..y + 32` must be readable; AVX-VNNI when `VNNI`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn chunk<const VNNI: bool>(
    sum: __m256i,
    q: __m256i,
    y: *const i8,
    scales: __m256i,
) -> __m256i {
    let pairs = _mm256_maddubs_epi16(q, _mm256_loadu_si256(y.cast()));
    if VNNI {
        dpwssd(sum, pairs, scales)
    } else {
        _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, scales))
    }
}

/// The four rows' blocks `i`.
#[inline(always)]
fn blocks<'a>(a: &Rows4K<'a>, i: usize) -> [&'a Q8KBlock; 4] {
    [&a[0][i], &a[1][i], &a[2][i], &a[3][i]]
}

/// Q4_K (`HIGH = false`, quants at byte 16) and Q5_K (`HIGH = true`, high bits at byte 16,
/// quants at byte 48), as the one-row `k4`.
///
/// # Safety
/// As [`rows4`] with `BYTES`-byte blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4<const BYTES: usize, const HIGH: bool, const VNNI: bool>(
    w: *const u8,
    a: Rows4K<'_>,
) -> [f32; 4] {
    let qs_at = if HIGH { 48 } else { 16 };
    let mut acc = _mm_setzero_ps();
    for i in 0..a[0].len() {
        let p = w.add(BYTES * i);
        prefetch(p, BYTES);
        let b = blocks(&a, i);
        let (sc, mn) = scales_mins_k4(std::slice::from_raw_parts(p.add(4), 12));
        let (scales, mn16) = (doubled(duplicated(sc)), duplicated(mn));
        let mut h = if HIGH {
            _mm256_loadu_si256(p.add(16).cast())
        } else {
            _mm256_setzero_si256()
        };
        let mut sum = [_mm256_setzero_si256(); 4];
        for j in 0..4 {
            let (lo, hi) = k4_quants::<HIGH>(p.add(qs_at + 32 * j), &mut h);
            let (s0, s1) = (pair_scales(&scales, 2 * j), pair_scales(&scales, 2 * j + 1));
            for r in 0..4 {
                let y = b[r].qs.as_ptr().add(64 * j);
                sum[r] = chunk::<VNNI>(sum[r], lo, y, s0);
                sum[r] = chunk::<VNNI>(sum[r], hi, y.add(32), s1);
            }
        }
        let summ = [
            _mm256_madd_epi16(mn16, bsums(b[0])),
            _mm256_madd_epi16(mn16, bsums(b[1])),
            _mm256_madd_epi16(mn16, bsums(b[2])),
            _mm256_madd_epi16(mn16, bsums(b[3])),
        ];
        let d = (f16_at(p), f16_at(p.add(2)));
        acc = add_block_values(acc, d, b, hsum4(sum), hsum4(summ));
    }
    lanes(acc)
}

/// Q6_K, as the one-row `q6_k`.
///
/// # Safety
/// As [`rows4`] with 210-byte blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k<const VNNI: bool>(w: *const u8, a: Rows4K<'_>) -> [f32; 4] {
    let mut acc = _mm_setzero_ps();
    for i in 0..a[0].len() {
        let p = w.add(210 * i);
        prefetch(p, 210);
        let b = blocks(&a, i);
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192).cast()));
        let sc = doubled(sc16);
        let mut sum = [_mm256_setzero_si256(); 4];
        for n in 0..2 {
            let q = q6_k_quants(p, n);
            for g in 0..4 {
                let c = 4 * n + g;
                let s = pair_scales(&sc, c);
                for r in 0..4 {
                    sum[r] = chunk::<VNNI>(sum[r], q[g], b[r].qs.as_ptr().add(32 * c), s);
                }
            }
        }
        let mut sumi = sum;
        for r in 0..4 {
            let offset = _mm256_madd_epi16(sc16, bsums(b[r]));
            sumi[r] = _mm256_sub_epi32(sum[r], _mm256_slli_epi32::<5>(offset));
        }
        let d = (f16_at(p.add(208)), 0.0);
        acc = add_block_values(acc, d, b, hsum4(sumi), _mm_setzero_si128());
    }
    lanes(acc)
}

/// Q2_K, as the one-row `q2_k`: 2-bit quants, a 4-bit scale and a 4-bit min per 16 elements.
///
/// # Safety
/// As [`rows4`] with 84-byte blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_k<const VNNI: bool>(w: *const u8, a: Rows4K<'_>) -> [f32; 4] {
    let m4 = _mm_set1_epi8(0x0F);
    let m3 = _mm256_set1_epi8(3);
    let mut acc = _mm_setzero_ps();
    for i in 0..a[0].len() {
        let p = w.add(84 * i);
        prefetch(p, 84);
        let b = blocks(&a, i);
        let raw = _mm_loadu_si128(p.cast());
        let sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(raw, m4));
        let sc = doubled(sc16);
        let mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(raw), m4));
        let mut sum = [_mm256_setzero_si256(); 4];
        for n in 0..2 {
            let mut q = _mm256_loadu_si256(p.add(16 + 32 * n).cast());
            for j in 0..4 {
                let c = 4 * n + j;
                let v = _mm256_and_si256(q, m3);
                let s = pair_scales(&sc, c);
                for r in 0..4 {
                    sum[r] = chunk::<VNNI>(sum[r], v, b[r].qs.as_ptr().add(32 * c), s);
                }
                q = _mm256_srli_epi16::<2>(q);
            }
        }
        let summ = [
            _mm256_madd_epi16(mn16, bsums(b[0])),
            _mm256_madd_epi16(mn16, bsums(b[1])),
            _mm256_madd_epi16(mn16, bsums(b[2])),
            _mm256_madd_epi16(mn16, bsums(b[3])),
        ];
        let d = (f16_at(p.add(80)), f16_at(p.add(82)));
        acc = add_block_values(acc, d, b, hsum4(sum), hsum4(summ));
    }
    lanes(acc)
}

/// Q3_K, as the one-row `q3_k`: 2-bit quants plus a high bit (unsigned 0..7 here, the
/// offset of 4 taken through the activation sums), a signed 6-bit scale per 16 elements.
///
/// # Safety
/// As [`rows4`] with 110-byte blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_k<const VNNI: bool>(w: *const u8, a: Rows4K<'_>) -> [f32; 4] {
    let m3 = _mm256_set1_epi8(3);
    let one = _mm256_set1_epi8(1);
    let mut acc = _mm_setzero_ps();
    for i in 0..a[0].len() {
        let p = w.add(110 * i);
        prefetch(p, 110);
        let b = blocks(&a, i);
        let [w0, w1, w2, w3] = scale_words_q3_k(std::slice::from_raw_parts(p.add(96), 12));
        let words = _mm_set_epi32(w3 as i32, w2 as i32, w1 as i32, w0 as i32);
        let sc16 = _mm256_cvtepi8_epi16(_mm_sub_epi8(words, _mm_set1_epi8(32)));
        let sc = doubled(sc16);
        let mut h = _mm256_loadu_si256(p.cast());
        let mut sum = [_mm256_setzero_si256(); 4];
        for n in 0..2 {
            let mut q = _mm256_loadu_si256(p.add(32 + 32 * n).cast());
            for j in 0..4 {
                let c = 4 * n + j;
                let hb = _mm256_slli_epi16::<2>(_mm256_and_si256(h, one));
                let v = _mm256_or_si256(_mm256_and_si256(q, m3), hb);
                let s = pair_scales(&sc, c);
                for r in 0..4 {
                    sum[r] = chunk::<VNNI>(sum[r], v, b[r].qs.as_ptr().add(32 * c), s);
                }
                q = _mm256_srli_epi16::<2>(q);
                h = _mm256_srli_epi16::<1>(h);
            }
        }
        let mut sumi = sum;
        for r in 0..4 {
            let offset = _mm256_madd_epi16(sc16, bsums(b[r]));
            sumi[r] = _mm256_sub_epi32(sum[r], _mm256_slli_epi32::<2>(offset));
        }
        let d = (f16_at(p.add(108)), 0.0);
        acc = add_block_values(acc, d, b, hsum4(sumi), _mm_setzero_si128());
    }
    lanes(acc)
}
