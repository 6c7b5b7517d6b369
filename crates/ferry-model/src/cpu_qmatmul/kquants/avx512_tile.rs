//! AVX-512 four-row k-quant kernels ([`super::tile`]): as [`super::avx2_tile`], on 64
//! elements (two chunks) per zmm register.
//!
//! Per two chunks a weight super-block gives one zmm of unsigned quant bytes (its halves the
//! two chunks, unpacked from one broadcast 32-byte load by per-half variable shifts, Q5_K's
//! fifth bit added under a byte mask) and one zmm of i16 scales (each 128-bit lane one
//! 16-element group's scale, picked by `vpermw`). Per row that is one `vpmaddubsw` and one
//! `vpdpwssd` (AVX-512 VNNI) into i32 lanes: the same exact products and sums as the one-row
//! kernels, so each block's integers, and after [`add_block_values`] each result, are
//! bit-identical to theirs.

// The four rows' blocks are indexed in lockstep.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::super::avx2::{f16_at, Avx2};
use super::activation::Q8KBlock;
use super::avx2::{bsums, duplicated, prefetch};
use super::avx2_tile::{add_block_values, hsum4, lanes};
use super::tile::Rows4K;
use super::{scales_mins_k4, KFormat};

/// Proof that this CPU has AVX-512 F, BW and VNNI (and AVX2, FMA, F16C).
#[derive(Debug, Clone, Copy)]
pub struct Avx512(());

impl Avx512 {
    /// `Some` when the running CPU supports the kernels (read once).
    pub fn detect() -> Option<Self> {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let ok = *OK.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vnni")
                && Avx2::detect().is_some()
        });
        ok.then_some(Avx512(()))
    }
}

/// The four-row kernel of `format` (Q4_K, Q5_K or Q6_K).
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VNNI and AVX2, FMA, F16C; the four rows must be equally
/// long and `w..w + format.block_bytes() * a[0].len()` readable.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows4(format: KFormat, w: *const u8, a: Rows4K<'_>) -> [f32; 4] {
    rows::<4>(format, w, a)
}

/// [`rows4`] for eight activation rows (the 32 zmm registers hold eight accumulators).
///
/// # Safety
/// As [`rows4`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows8(format: KFormat, w: *const u8, a: [&[Q8KBlock]; 8]) -> [f32; 8] {
    rows::<8>(format, w, a)
}

/// The kernel of `format` for `R` rows (a multiple of four).
///
/// # Safety
/// As [`rows4`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn rows<const R: usize>(format: KFormat, w: *const u8, a: [&[Q8KBlock]; R]) -> [f32; R] {
    match format {
        KFormat::Q4K => k4::<144, false, R>(w, a),
        KFormat::Q5K => k4::<176, true, R>(w, a),
        KFormat::Q6K => q6_k::<R>(w, a),
        KFormat::Q2K | KFormat::Q3K => unreachable!("{format:?} has no four-row kernel"),
    }
}

/// A zmm of 32 i16 lanes, those of the low 256 bits `lo`, of the high 256 bits `hi`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) fn halves_epi16(lo: i16, hi: i16) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi16(lo)),
        _mm256_set1_epi16(hi),
    )
}

/// The 32 bytes at `p` in both halves of a zmm.
///
/// # Safety
/// `p..p + 32` must be readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn broadcast32(p: *const u8) -> __m512i {
    _mm512_broadcast_i64x4(_mm256_loadu_si256(p.cast()))
}

/// From sixteen i16 group scales (the low half of `sc16`), a zmm whose 128-bit lane `k` holds
/// group `4 pair + k`'s scale in all eight i16 lanes: the scales of elements
/// `64 pair..64 pair + 64`'s i16 pair sums.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(super) fn group_scales(sc16: __m512i, pair: usize) -> __m512i {
    let k = 0x0001_0001_0001_0001i64;
    let lane = _mm512_set_epi64(3 * k, 3 * k, 2 * k, 2 * k, k, k, 0, 0);
    let idx = _mm512_add_epi16(lane, _mm512_set1_epi16(4 * pair as i16));
    _mm512_permutexvar_epi16(idx, sc16)
}

/// `sum` plus the sixteen i32 lanes of `sum scale * q * y` over 64 elements.
///
/// # Safety
/// `y..y + 64` must be readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn chunks2(sum: __m512i, q: __m512i, y: *const i8, scales: __m512i) -> __m512i {
    let pairs = _mm512_maddubs_epi16(q, _mm512_loadu_si512(y.cast()));
    _mm512_dpwssd_epi32(sum, pairs, scales)
}

/// The sixteen i32 lanes of `v` folded to eight (same total).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn fold(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// Per byte, bit `2 j` in the low half and bit `2 j + 1` in the high half (Q5_K: the
/// fifth-bit masks of chunks `2 j` and `2 j + 1`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn high_bit(j: usize) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi8((1u8 << (2 * j)) as i8)),
        _mm256_set1_epi8((1u8 << (2 * j + 1)) as i8),
    )
}

/// Q6_K's two high bits at `shift` of each byte of `qh`, as `16 * bits`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn q6_high(qh: __m512i, shift: __m512i) -> __m512i {
    let m3 = _mm512_set1_epi8(3);
    _mm512_slli_epi16::<4>(_mm512_and_si512(_mm512_srlv_epi16(qh, shift), m3))
}

/// The rows' blocks `i`.
#[inline(always)]
fn blocks<'a, const R: usize>(a: &[&'a [Q8KBlock]; R], i: usize) -> [&'a Q8KBlock; R] {
    std::array::from_fn(|r| &a[r][i])
}

/// The block values of `R` rows (four at a time, [`add_block_values`]) added to `acc`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn add_rows<const R: usize>(
    acc: &mut [__m128; 2],
    d: (f32, f32),
    b: &[&Q8KBlock; R],
    sumi: &[__m256i; R],
    summ: Option<&[__m256i; R]>,
) {
    for g in 0..R / 4 {
        let four = |v: &[__m256i; R]| [v[4 * g], v[4 * g + 1], v[4 * g + 2], v[4 * g + 3]];
        let bg = [b[4 * g], b[4 * g + 1], b[4 * g + 2], b[4 * g + 3]];
        let mm = match summ {
            Some(m) => hsum4(four(m)),
            None => _mm_setzero_si128(),
        };
        acc[g] = add_block_values(acc[g], d, bg, hsum4(four(sumi)), mm);
    }
}

/// The `R` results in `acc`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
fn results<const R: usize>(acc: [__m128; 2]) -> [f32; R] {
    let (lo, hi) = (lanes(acc[0]), lanes(acc[1]));
    std::array::from_fn(|r| if r < 4 { lo[r] } else { hi[r - 4] })
}

/// Q4_K (`HIGH = false`, quants at byte 16) and Q5_K (`HIGH = true`, high bits at byte 16,
/// quants at byte 48).
///
/// # Safety
/// As [`rows4`] with `BYTES`-byte blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn k4<const BYTES: usize, const HIGH: bool, const R: usize>(
    w: *const u8,
    a: [&[Q8KBlock]; R],
) -> [f32; R] {
    let m4 = _mm512_set1_epi8(0x0F);
    let sixteen = _mm512_set1_epi8(0x10);
    // Low half: the low nibbles (chunk 2 j), high half: the high nibbles (chunk 2 j + 1).
    let nibble_shift = halves_epi16(0, 4);
    // Q5_K: chunk `c`'s fifth bit is bit `c` of its high-bit byte.
    let bits = [high_bit(0), high_bit(1), high_bit(2), high_bit(3)];
    let qs_at = if HIGH { 48 } else { 16 };
    let mut acc = [_mm_setzero_ps(); 2];
    for i in 0..a[0].len() {
        let p = w.add(BYTES * i);
        prefetch(p, BYTES);
        let b = blocks(&a, i);
        let (sc, mn) = scales_mins_k4(std::slice::from_raw_parts(p.add(4), 12));
        let (sc16, mn16) = (_mm512_castsi256_si512(duplicated(sc)), duplicated(mn));
        let h = if HIGH {
            broadcast32(p.add(16))
        } else {
            _mm512_setzero_si512()
        };
        let mut sum = [_mm512_setzero_si512(); R];
        for j in 0..4 {
            let q = broadcast32(p.add(qs_at + 32 * j));
            let mut q = _mm512_and_si512(_mm512_srlv_epi16(q, nibble_shift), m4);
            if HIGH {
                let set = _mm512_test_epi8_mask(h, bits[j]);
                q = _mm512_mask_add_epi8(q, set, q, sixteen);
            }
            let s = group_scales(sc16, j);
            for r in 0..R {
                sum[r] = chunks2(sum[r], q, b[r].qs.as_ptr().add(64 * j), s);
            }
        }
        let mut summ = [_mm256_setzero_si256(); R];
        let mut sumi = [_mm256_setzero_si256(); R];
        for r in 0..R {
            summ[r] = _mm256_madd_epi16(mn16, bsums(b[r]));
            sumi[r] = fold(sum[r]);
        }
        let d = (f16_at(p), f16_at(p.add(2)));
        add_rows(&mut acc, d, &b, &sumi, Some(&summ));
    }
    results(acc)
}

/// Q6_K.
///
/// # Safety
/// As [`rows4`] with 210-byte blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn q6_k<const R: usize>(w: *const u8, a: [&[Q8KBlock]; R]) -> [f32; R] {
    let m4 = _mm512_set1_epi8(0x0F);
    // Chunks 4 n and 4 n + 1 take high bits 0-1 and 2-3, chunks 4 n + 2 and 4 n + 3 bits 4-5
    // and 6-7.
    let (shift_a, shift_b) = (halves_epi16(0, 2), halves_epi16(4, 6));
    let mut acc = [_mm_setzero_ps(); 2];
    for i in 0..a[0].len() {
        let p = w.add(210 * i);
        prefetch(p, 210);
        let b = blocks(&a, i);
        let sc16y = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192).cast()));
        let sc16 = _mm512_castsi256_si512(sc16y);
        let mut sum = [_mm512_setzero_si512(); R];
        for n in 0..2 {
            // Low half `ql[64 n..64 n + 32]`, high half the next 32: chunks 4 n (+2), 4 n + 1 (+2).
            let ql = _mm512_loadu_si512(p.add(64 * n).cast());
            let qh = broadcast32(p.add(128 + 32 * n));
            let qa = _mm512_or_si512(_mm512_and_si512(ql, m4), q6_high(qh, shift_a));
            let qb = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
                q6_high(qh, shift_b),
            );
            let (sa, sb) = (group_scales(sc16, 2 * n), group_scales(sc16, 2 * n + 1));
            for r in 0..R {
                let y = b[r].qs.as_ptr().add(128 * n);
                sum[r] = chunks2(sum[r], qa, y, sa);
                sum[r] = chunks2(sum[r], qb, y.add(64), sb);
            }
        }
        let mut sumi = [_mm256_setzero_si256(); R];
        for r in 0..R {
            let offset = _mm256_madd_epi16(sc16y, bsums(b[r]));
            sumi[r] = _mm256_sub_epi32(fold(sum[r]), _mm256_slli_epi32::<5>(offset));
        }
        let d = (f16_at(p.add(208)), 0.0);
        add_rows(&mut acc, d, &b, &sumi, None);
    }
    results(acc)
}
