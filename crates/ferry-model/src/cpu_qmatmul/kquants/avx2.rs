//! AVX2 dot products of one raw GGUF k-quant row with one row of [`Q8KBlock`]s (same contract
//! and layouts as [`super::scalar`]).
//!
//! Per 32-element chunk the weights are unpacked to unsigned bytes (0..63 at most), multiplied
//! with the int8 activations by `vpmaddubsw` (no saturation: `2 * 63 * 127 < 2^15`), and the
//! i16 pair sums by the chunk's two 16-element scales with `vpmaddwd` (the scales picked by one
//! `vpshufb` per chunk from a register holding eight of them in both halves, [`pair_scales`]), accumulating in
//! i32. The offset terms come from the activation's 16-element sums, so each block yields the
//! same two exact integers as the scalar kernel.
//!
//! The blocks are taken eight at a time ([`row`]): their integer lanes are summed across the
//! eight blocks at once (a tree of `vphaddd`, not two horizontal sums per block), the eight
//! `block_value`s are computed lane by lane with its very operations, and then added to the
//! row's total one by one in block order, as the scalar kernel adds them: the results are
//! bit-identical. Weights are prefetched as in [`crate::cpu_qmatmul::avx2`].

use std::arch::x86_64::*;

use super::super::avx2::{Avx2, PREFETCH_AHEAD};
use super::activation::Q8KBlock;
use super::{scale_words_q3_k, scales_mins_k4, KFormat};

/// Dot product of one row of `format` (at least `format.block_bytes() * a.len()` bytes) with
/// `a`.
pub fn dot(k: Avx2, format: KFormat, w: &[u8], a: &[Q8KBlock]) -> f32 {
    let _ = k;
    assert!(
        w.len() >= format.block_bytes() * a.len(),
        "{format:?} row too short"
    );
    // SAFETY: `k` proves AVX2, FMA and F16C; the assert bounds every read of `w`.
    unsafe {
        match format {
            KFormat::Q2K => q2_k(w.as_ptr(), a),
            KFormat::Q3K => q3_k(w.as_ptr(), a),
            KFormat::Q4K => q4_k(w.as_ptr(), a),
            KFormat::Q5K => q5_k(w.as_ptr(), a),
            KFormat::Q6K => q6_k(w.as_ptr(), a),
        }
    }
}

/// Eight i32 lanes of `sum scale * q * y` for one chunk: `q` unsigned weight bytes, `y` the 32
/// activation values at `y`, `scales` as [`pair_scales`] gives them.
///
/// # Safety
/// `y..y + 32` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn chunk(q: __m256i, y: *const i8, scales: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(q, _mm256_loadu_si256(y.cast()));
    _mm256_madd_epi16(pairs, scales)
}

/// The activation block's sixteen 16-element sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn bsums(a: &Q8KBlock) -> __m256i {
    // SAFETY: `bsums` is 32 bytes.
    unsafe { _mm256_loadu_si256(a.bsums.as_ptr().cast()) }
}

/// Eight i16 values, each duplicated into two adjacent lanes (for per-32 scales and mins).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn duplicated(v: [u8; 8]) -> __m256i {
    let s = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(v)));
    _mm256_set_m128i(_mm_unpackhi_epi16(s, s), _mm_unpacklo_epi16(s, s))
}

/// Prefetches the block `PREFETCH_AHEAD` bytes past the one at `p`, `bytes` long.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn prefetch(p: *const u8, bytes: usize) {
    let mut off = 0;
    while off < bytes {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD + off).cast());
        off += 64;
    }
}

/// One k-quant's block for [`row`]: its bytes, where its f16 scales are, and its integer lanes.
trait RowBlock {
    /// Bytes per super-block.
    const BYTES: usize;
    /// Byte offset of the f16 `d`.
    const D_AT: usize;
    /// Byte offset of the f16 `dmin` (`None`: the format has none, its offset is in `sumi`).
    const DMIN_AT: Option<usize>;
    /// Two vectors of i32 lanes whose lane sums are the block's `sumi` and `summ` (zero where
    /// [`DMIN_AT`](Self::DMIN_AT) is `None`).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA, F16C; `p..p + BYTES` must be readable.
    unsafe fn lanes(p: *const u8, a: &Q8KBlock) -> (__m256i, __m256i);
}

/// Blocks per group of [`row`] (the lanes of one register).
const GROUP: usize = 8;

/// The dot product of one row of `B` blocks at `w` with `a` (see the module header).
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C; `w..w + B::BYTES * a.len()` must be readable.
#[inline(always)]
unsafe fn row<B: RowBlock>(w: *const u8, a: &[Q8KBlock]) -> f32 {
    let mut acc = 0f32;
    let mut sums = [_mm256_setzero_si256(); GROUP];
    let mut mins = [_mm256_setzero_si256(); GROUP];
    let mut d = [0u16; GROUP];
    let mut dmin = [0u16; GROUP];
    let mut ad = [0f32; GROUP];
    let mut values = [0f32; GROUP];
    for (g, group) in a.chunks(GROUP).enumerate() {
        for (k, a) in group.iter().enumerate() {
            let p = w.add(B::BYTES * (GROUP * g + k));
            prefetch(p, B::BYTES);
            (sums[k], mins[k]) = B::lanes(p, a);
            d[k] = p.add(B::D_AT).cast::<u16>().read_unaligned();
            if let Some(at) = B::DMIN_AT {
                dmin[k] = p.add(at).cast::<u16>().read_unaligned();
            }
            ad[k] = a.d;
        }
        // Lanes past a short last group hold the previous group's values: computed, not added.
        let (sumi, summ) = (lane_sums(&sums), lane_sums(&mins));
        let d = _mm256_cvtph_ps(_mm_loadu_si128(d.as_ptr().cast()));
        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(dmin.as_ptr().cast()));
        let ad = _mm256_loadu_ps(ad.as_ptr());
        _mm256_storeu_ps(values.as_mut_ptr(), block_values(d, dmin, ad, sumi, summ));
        for &v in &values[..group.len()] {
            acc += v;
        }
    }
    acc
}

/// [`super::block_value`] on eight lanes, with its f32 operations lane by lane:
/// `(d * ad) * sumi - (dmin * ad) * summ` (shared with the AVX2 k-quant GEMM).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn block_values(
    d: __m256,
    dmin: __m256,
    ad: __m256,
    sumi: __m256i,
    summ: __m256i,
) -> __m256 {
    _mm256_sub_ps(
        _mm256_mul_ps(_mm256_mul_ps(d, ad), _mm256_cvtepi32_ps(sumi)),
        _mm256_mul_ps(_mm256_mul_ps(dmin, ad), _mm256_cvtepi32_ps(summ)),
    )
}

/// Lane `k` of the result is the sum of the eight lanes of `v[k]` (exact, wrapping as the
/// scalar kernel's i32 sums would).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lane_sums(v: &[__m256i; GROUP]) -> __m256i {
    // Each 128-bit half: [v0, v1, v2, v3] (and [v4..v7]) summed over that half's four lanes.
    let q0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    let q1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(q0, q1),
        _mm256_permute2x128_si256::<0x31>(q0, q1),
    )
}

/// Sixteen i16 scales as two registers, scales `0..8` in both halves of the first and `8..16`
/// in both halves of the second, for [`pair_scales`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn doubled(sc16: __m256i) -> [__m256i; 2] {
    [
        _mm256_permute2x128_si256::<0x00>(sc16, sc16),
        _mm256_permute2x128_si256::<0x11>(sc16, sc16),
    ]
}

/// `vpshufb` patterns: for chunk `c % 4`, the bytes of i16 `2 (c % 4)` in every lane of the low
/// half and of i16 `2 (c % 4) + 1` in the high half.
const PICK: [[u8; 32]; 4] = {
    let mut pick = [[0u8; 32]; 4];
    let mut c = 0;
    while c < 4 {
        let mut i = 0;
        while i < 32 {
            let word = 2 * c + i / 16;
            pick[c][i] = (2 * word + i % 2) as u8;
            i += 1;
        }
        c += 1;
    }
    pick
};

/// From [`doubled`] scales, scale `2 c` in every i16 lane of the low half and `2 c + 1` in the
/// high half: the scales of chunk `c`'s two 16-element halves, by one `vpshufb`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn pair_scales(doubled: &[__m256i; 2], c: usize) -> __m256i {
    // SAFETY: `PICK[c % 4]` is 32 bytes.
    let pick = unsafe { _mm256_loadu_si256(PICK[c % 4].as_ptr().cast()) };
    _mm256_shuffle_epi8(doubled[c / 4], pick)
}

struct Q2;
impl RowBlock for Q2 {
    const BYTES: usize = 84;
    const D_AT: usize = 80;
    const DMIN_AT: Option<usize> = Some(82);
    #[inline(always)]
    unsafe fn lanes(p: *const u8, a: &Q8KBlock) -> (__m256i, __m256i) {
        let m4 = _mm_set1_epi8(0x0F);
        let m3 = _mm256_set1_epi8(3);
        let raw = _mm_loadu_si128(p.cast());
        let sc = doubled(_mm256_cvtepu8_epi16(_mm_and_si128(raw, m4)));
        let mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(raw), m4));
        let mut sum = _mm256_setzero_si256();
        for n in 0..2 {
            let mut q = _mm256_loadu_si256(p.add(16 + 32 * n).cast());
            for j in 0..4 {
                let c = 4 * n + j;
                let v = _mm256_and_si256(q, m3);
                let s = chunk(v, a.qs.as_ptr().add(32 * c), pair_scales(&sc, c));
                sum = _mm256_add_epi32(sum, s);
                q = _mm256_srli_epi16::<2>(q);
            }
        }
        (sum, _mm256_madd_epi16(mn16, bsums(a)))
    }
}

struct Q3;
impl RowBlock for Q3 {
    const BYTES: usize = 110;
    const D_AT: usize = 108;
    const DMIN_AT: Option<usize> = None;
    #[inline(always)]
    unsafe fn lanes(p: *const u8, a: &Q8KBlock) -> (__m256i, __m256i) {
        let m3 = _mm256_set1_epi8(3);
        let one = _mm256_set1_epi8(1);
        let [w0, w1, w2, w3] = scale_words_q3_k(std::slice::from_raw_parts(p.add(96), 12));
        let words = _mm_set_epi32(w3 as i32, w2 as i32, w1 as i32, w0 as i32);
        let sc16 = _mm256_cvtepi8_epi16(_mm_sub_epi8(words, _mm_set1_epi8(32)));
        let offset = _mm256_madd_epi16(sc16, bsums(a));
        let sc = doubled(sc16);
        let mut h = _mm256_loadu_si256(p.cast());
        let mut sum = _mm256_setzero_si256();
        for n in 0..2 {
            let mut q = _mm256_loadu_si256(p.add(32 + 32 * n).cast());
            for j in 0..4 {
                let c = 4 * n + j;
                let hb = _mm256_slli_epi16::<2>(_mm256_and_si256(h, one));
                let v = _mm256_or_si256(_mm256_and_si256(q, m3), hb);
                let s = chunk(v, a.qs.as_ptr().add(32 * c), pair_scales(&sc, c));
                sum = _mm256_add_epi32(sum, s);
                q = _mm256_srli_epi16::<2>(q);
                h = _mm256_srli_epi16::<1>(h);
            }
        }
        let sumi = _mm256_sub_epi32(sum, _mm256_slli_epi32::<2>(offset));
        (sumi, _mm256_setzero_si256())
    }
}

/// Q4_K (`HIGH = false`, quants at byte 16) and Q5_K (`HIGH = true`, high bits at byte 16,
/// quants at byte 48), `BYTES` per block.
struct K4<const BYTES: usize, const HIGH: bool>;
impl<const BYTES: usize, const HIGH: bool> RowBlock for K4<BYTES, HIGH> {
    const BYTES: usize = BYTES;
    const D_AT: usize = 0;
    const DMIN_AT: Option<usize> = Some(2);
    #[inline(always)]
    unsafe fn lanes(p: *const u8, a: &Q8KBlock) -> (__m256i, __m256i) {
        let qs_at = if HIGH { 48 } else { 16 };
        let (sc, mn) = scales_mins_k4(std::slice::from_raw_parts(p.add(4), 12));
        let mins = _mm256_madd_epi16(duplicated(mn), bsums(a));
        let sc = doubled(duplicated(sc));
        let mut h = if HIGH {
            _mm256_loadu_si256(p.add(16).cast())
        } else {
            _mm256_setzero_si256()
        };
        let mut sum = _mm256_setzero_si256();
        for j in 0..4 {
            let (lo, hi) = k4_quants::<HIGH>(p.add(qs_at + 32 * j), &mut h);
            let y = a.qs.as_ptr().add(64 * j);
            let s0 = chunk(lo, y, pair_scales(&sc, 2 * j));
            let s1 = chunk(hi, y.add(32), pair_scales(&sc, 2 * j + 1));
            sum = _mm256_add_epi32(sum, _mm256_add_epi32(s0, s1));
        }
        (sum, mins)
    }
}

struct Q6;
impl RowBlock for Q6 {
    const BYTES: usize = 210;
    const D_AT: usize = 208;
    const DMIN_AT: Option<usize> = None;
    #[inline(always)]
    unsafe fn lanes(p: *const u8, a: &Q8KBlock) -> (__m256i, __m256i) {
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(p.add(192).cast()));
        let offset = _mm256_madd_epi16(sc16, bsums(a));
        let sc = doubled(sc16);
        let mut sum = _mm256_setzero_si256();
        for n in 0..2 {
            let q = q6_k_quants(p, n);
            for (g, v) in q.into_iter().enumerate() {
                let c = 4 * n + g;
                let s = chunk(v, a.qs.as_ptr().add(32 * c), pair_scales(&sc, c));
                sum = _mm256_add_epi32(sum, s);
            }
        }
        let sumi = _mm256_sub_epi32(sum, _mm256_slli_epi32::<5>(offset));
        (sumi, _mm256_setzero_si256())
    }
}

/// # Safety
/// The CPU must have AVX2, FMA, F16C; `w..w + 84 * a.len()` must be readable.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_k(w: *const u8, a: &[Q8KBlock]) -> f32 {
    row::<Q2>(w, a)
}

/// # Safety
/// The CPU must have AVX2, FMA, F16C; `w..w + 110 * a.len()` must be readable.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_k(w: *const u8, a: &[Q8KBlock]) -> f32 {
    row::<Q3>(w, a)
}

/// # Safety
/// The CPU must have AVX2, FMA, F16C; `w..w + 144 * a.len()` must be readable.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k(w: *const u8, a: &[Q8KBlock]) -> f32 {
    row::<K4<144, false>>(w, a)
}

/// # Safety
/// The CPU must have AVX2, FMA, F16C; `w..w + 176 * a.len()` must be readable.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k(w: *const u8, a: &[Q8KBlock]) -> f32 {
    row::<K4<176, true>>(w, a)
}

/// The low and high nibbles of the 32 Q4_K / Q5_K quant bytes at `q` (64 quants, two chunks),
/// with Q5_K's fifth bits (`HIGH`) taken from the low two bits of `h`, which moves on to the
/// next two. Shared by the one-row and the four-row kernel.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C; `q..q + 32` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k4_quants<const HIGH: bool>(
    q: *const u8,
    h: &mut __m256i,
) -> (__m256i, __m256i) {
    let m4 = _mm256_set1_epi8(0x0F);
    let bit4 = _mm256_set1_epi8(0x10);
    let q = _mm256_loadu_si256(q.cast());
    let mut lo = _mm256_and_si256(q, m4);
    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
    if HIGH {
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<4>(*h), bit4));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16::<3>(*h), bit4));
        *h = _mm256_srli_epi16::<2>(*h);
    }
    (lo, hi)
}

/// The 128 six-bit quants of half `n` (0 or 1) of the Q6_K block at `p`, as bytes 0..63 in
/// four vectors of 32 (chunks `4 * n .. 4 * n + 4`): low nibbles from `ql`, high two bits
/// from `qh`. Shared by the one-row and the four-row kernel.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C; `p..p + 192` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_k_quants(p: *const u8, n: usize) -> [__m256i; 4] {
    let ql0 = _mm256_loadu_si256(p.add(64 * n).cast());
    let ql1 = _mm256_loadu_si256(p.add(64 * n + 32).cast());
    let qh = _mm256_loadu_si256(p.add(128 + 32 * n).cast());
    q6_k_bytes(ql0, ql1, qh)
}

/// The six-bit quants of four chunks from their bytes: `ql0` (low nibbles of the first and
/// third chunk), `ql1` (second and fourth) and `qh` (their high two bits, two bits per chunk),
/// byte `i` of each giving element `i` of the chunks (the one-row, four-row and panel
/// kernels' one Q6_K decoding).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q6_k_bytes(ql0: __m256i, ql1: __m256i, qh: __m256i) -> [__m256i; 4] {
    let m4 = _mm256_set1_epi8(0x0F);
    let m3 = _mm256_set1_epi8(3);
    let m30 = _mm256_set1_epi8(0x30);
    [
        _mm256_or_si256(
            _mm256_and_si256(ql0, m4),
            _mm256_slli_epi16::<4>(_mm256_and_si256(qh, m3)),
        ),
        _mm256_or_si256(
            _mm256_and_si256(ql1, m4),
            _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m30),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
            _mm256_and_si256(qh, m30),
        ),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
            _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m30),
        ),
    ]
}

/// # Safety
/// The CPU must have AVX2, FMA, F16C; `w..w + 210 * a.len()` must be readable.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k(w: *const u8, a: &[Q8KBlock]) -> f32 {
    row::<Q6>(w, a)
}
