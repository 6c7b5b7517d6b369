//! AVX2 dot products of one activation row with the eight weight rows of a panel in the
//! [`super::panel8`] layout (the decode kernel of the k-quants on AVX2).
//!
//! One 32-byte load holds four quant bytes of each of the eight rows; the activation's four
//! matching bytes are broadcast and `vpmaddubsw`-multiplied with them, the 16-bit pair sums of
//! a chunk (or half chunk) summed in 16 bits (no saturation, as in [`super::avx2_panel`]) and
//! `vpmaddwd`-multiplied by each row's scale, picked for all eight rows by one `vpshufb`. Each
//! i32 lane is then one row's exact `sumi` / `summ` of the one-row kernels, combined with
//! [`super::avx2::block_values`]' f32 operations and added block by block from 0: every lane
//! equals the one-row dot of its row bit for bit, with no horizontal sums at all.

use std::arch::x86_64::*;

use super::activation::Q8KBlock;
use super::avx2::block_values;
use super::avx2_panel::Panel;
use super::tile::Path;
use super::KFormat;
use crate::cpu_qmatmul::avx2::Avx2;
use crate::cpu_qmatmul::panel8::{segment_at, PanelFormat, ROWS};
use crate::cpu_qmatmul::Kernel;

/// Whether `kernel` runs the k-quants through the AVX2 kernels on this CPU (plain AVX2 or
/// AVX-VNNI: the tile path [`Path::detect`] picks), where the panel layout is read.
pub fn takes(kernel: Kernel) -> bool {
    matches!(Path::detect(kernel), Some(Path::Avx2 | Path::Avx2Vnni))
}

/// The eight dot products of the panel at `panel` (`a.len()` panel blocks of `format`) with
/// `a`, row `r` of the panel in lane `r`.
pub fn dots(k: Avx2, format: KFormat, panel: &[u8], a: &[Q8KBlock]) -> [f32; ROWS] {
    let _ = k;
    assert!(
        panel.len() >= format.block_bytes() * ROWS * a.len(),
        "{format:?} panel too short"
    );
    let mut out = [0f32; ROWS];
    // SAFETY: `k` proves AVX2, FMA and F16C; the assert bounds every read of `panel`.
    unsafe {
        let acc = match format {
            KFormat::Q4K => q4_k(panel.as_ptr(), a),
            KFormat::Q5K => q5_k(panel.as_ptr(), a),
            KFormat::Q6K => q6_k(panel.as_ptr(), a),
            KFormat::Q2K => q2_k(panel.as_ptr(), a),
            KFormat::Q3K => q3_k(panel.as_ptr(), a),
        };
        _mm256_storeu_ps(out.as_mut_ptr(), acc);
    }
    out
}

/// A `vpshufb` pattern giving, in every 32-bit lane, bytes `lo` and `hi` of that lane as its
/// two 16-bit halves: zero-extended (`HIGH = false`: the byte in the low half of each i16) or
/// in the high byte, to be sign-extended by an arithmetic shift (`HIGH = true`).
const fn pattern<const HIGH: bool>(lo: usize, hi: usize) -> [u8; 32] {
    let mut p = [0x80u8; 32];
    let mut i = 0;
    while i < 32 {
        let lane = (i % 16) / 4;
        let byte = if i % 4 < 2 { lo } else { hi };
        if (i % 2 == 1) == HIGH {
            p[i] = (4 * lane + byte) as u8;
        }
        i += 1;
    }
    p
}

/// Byte `c` of each lane, twice, zero-extended (Q4_K's scales and mins).
const SAME: [[u8; 32]; 4] = [
    pattern::<false>(0, 0),
    pattern::<false>(1, 1),
    pattern::<false>(2, 2),
    pattern::<false>(3, 3),
];
/// Byte `c` of each lane, twice, in the high bytes (Q6_K's signed scales).
const SAME_HIGH: [[u8; 32]; 4] = [
    pattern::<true>(0, 0),
    pattern::<true>(1, 1),
    pattern::<true>(2, 2),
    pattern::<true>(3, 3),
];
/// Bytes `2 k` and `2 k + 1` of each lane in the high bytes (Q6_K's scale pairs).
const PAIR_HIGH: [[u8; 32]; 2] = [pattern::<true>(0, 1), pattern::<true>(2, 3)];
/// Bytes `2 k` and `2 k + 1` of each lane, zero-extended (Q2_K's min pairs).
const PAIR: [[u8; 32]; 2] = [pattern::<false>(0, 1), pattern::<false>(2, 3)];

/// `v` shuffled by `pattern`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn shuffle(v: __m256i, pattern: &[u8; 32]) -> __m256i {
    // SAFETY: `pattern` is 32 bytes.
    _mm256_shuffle_epi8(v, unsafe { _mm256_loadu_si256(pattern.as_ptr().cast()) })
}

/// Byte `c` (0..4) of each 32-bit lane of `v` as two u16 in that lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pick(v: __m256i, c: usize) -> __m256i {
    shuffle(v, &SAME[c % 4])
}

/// `v` shuffled by a `HIGH` pattern, sign-extended to i16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pick_signed(v: __m256i, pattern: &[u8; 32]) -> __m256i {
    _mm256_srai_epi16::<8>(shuffle(v, pattern))
}

/// Bytes ahead of the panel block being read that are prefetched: a panel block takes as
/// long as eight one-row blocks, so the one-row kernels' distance would arrive too late.
const AHEAD: usize = 4096;

/// Prefetches the `bytes` at `AHEAD` past `p`.
#[inline(always)]
pub(crate) unsafe fn prefetch(p: *const u8, bytes: usize) {
    for off in (0..bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(AHEAD + off).cast());
    }
}

/// The activation's four bytes at `y` in every lane.
#[inline(always)]
unsafe fn broadcast(y: *const i8) -> __m256i {
    _mm256_set1_epi32(y.cast::<i32>().read_unaligned())
}

/// Each lane's group term: `sum_k groups[k] . (bsums[2 k], bsums[2 k + 1])` of the activation
/// block `a`, where lane r of `groups[k]` holds row r's weights of the 16-element groups
/// `2 k, 2 k + 1` (mins, or signed scales) as two i16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn group_sums(groups: &[__m256i; 8], a: &Q8KBlock) -> __m256i {
    let bsums = a.bsums.as_ptr().cast::<i32>();
    let mut sum = _mm256_setzero_si256();
    for (k, &g) in groups.iter().enumerate() {
        // SAFETY: `bsums` is 16 i16, eight pairs.
        let bs = _mm256_set1_epi32(unsafe { bsums.add(k).read_unaligned() });
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(g, bs));
    }
    sum
}

/// Each lane's block value of a format whose weights carry an offset (Q3_K: 4, Q6_K: 32,
/// i.e. `1 << SHIFT`) instead of a min: `d * a.d * (sumi - (1 << SHIFT) * group term)`, the
/// group term the scale pairs `pairs` against the activation's 16-element sums.
#[inline(always)]
unsafe fn offset_block_values<const SHIFT: i32>(
    d: __m256,
    sumi: __m256i,
    pairs: &[__m256i; 8],
    a: &Q8KBlock,
) -> __m256 {
    let offset = _mm256_slli_epi32::<SHIFT>(group_sums(pairs, a));
    let zero = _mm256_setzero_si256();
    let sumi = _mm256_sub_epi32(sumi, offset);
    block_values(d, _mm256_setzero_ps(), _mm256_set1_ps(a.d), sumi, zero)
}

/// The eight f16 at `p` as f32.
#[inline(always)]
unsafe fn halves(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
}

/// The eight scales and eight mins of each row of the Q4_K panel block at `blk`: lane `r` of
/// `scales[0]` holds row r's scales 0..4, of `scales[1]` its 4..8 (the scalar
/// `scales_mins_k4` on every lane, byte for byte), likewise the mins.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C; `blk..blk + 128` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_scales_mins(blk: *const u8) -> ([__m256i; 2], [__m256i; 2]) {
    let (m4, m6, m2) = (
        _mm256_set1_epi8(0x0F),
        _mm256_set1_epi8(0x3F),
        _mm256_set1_epi8(0x03),
    );
    let load = |at: usize| _mm256_loadu_si256(blk.add(at).cast());
    let (a0, a1, a2) = (load(32), load(64), load(96));
    let top = |v: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<6>(v), m2));
    let scales = [
        _mm256_and_si256(a0, m6),
        _mm256_or_si256(_mm256_and_si256(a2, m4), top(a0)),
    ];
    let mins = [
        _mm256_and_si256(a1, m6),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(a2), m4), top(a1)),
    ];
    (scales, mins)
}

/// The sixteen half-chunk scales of each row of the Q6_K panel block at `blk` (lane r of
/// entry h: row r's scale h twice, as i16), and its eight pairs (entry g: scales 2 g, 2 g + 1).
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C; `blk..blk + 144` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_scales(blk: *const u8) -> ([__m256i; 16], [__m256i; 8]) {
    let at = segment_at(KFormat::Q6K, 1);
    // Lane r of `sc[u]`: scales 4 u..4 u + 4 of row r.
    let sc: [__m256i; 4] = std::array::from_fn(|u| _mm256_loadu_si256(blk.add(at + 32 * u).cast()));
    (
        std::array::from_fn(|h| pick_signed(sc[h / 4], &SAME_HIGH[h % 4])),
        std::array::from_fn(|g| pick_signed(sc[g / 2], &PAIR_HIGH[g % 2])),
    )
}

/// Super-block `b` of a decoded GEMM panel ([`super::avx2_panel`]) from the Q4_K
/// (`FIFTH = false`) or Q5_K panel block at `blk`: the same words, scales, group weights and
/// `d`, `dmin` as decoding the eight GGUF rows gives, with no transposition.
#[inline(always)]
unsafe fn fill_k4<const FIFTH: bool>(blk: *const u8, panel: &mut Panel, b: usize) {
    let m4 = _mm256_set1_epi8(0x0F);
    let at = k4_layout::<FIFTH>();
    let (sc, mn) = q4_k_scales_mins(blk);
    for j in 0..4 {
        for w in 0..8 {
            let (lo, hi) = k4_words::<FIFTH>(blk, at, j, w, m4);
            store(&mut panel.packed, ((b * 8 + 2 * j) * 8 + w) * ROWS, lo);
            store(&mut panel.packed, ((b * 8 + 2 * j + 1) * 8 + w) * ROWS, hi);
        }
    }
    // A chunk's one scale for both its halves; group g's weight is chunk g's min.
    let scales = std::array::from_fn(|h| pick(sc[h / 8], h / 2));
    let groups = std::array::from_fn(|g| pick(mn[g / 4], g));
    fill_rest(panel, b, &scales, &groups, halves(blk), halves(blk.add(16)));
}

/// [`fill_k4`] for Q4_K.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C; `blk..blk + 1152` must be readable and `panel` hold
/// super-block `b`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn fill_q4_k(blk: *const u8, panel: &mut Panel, b: usize) {
    fill_k4::<false>(blk, panel, b)
}

/// [`fill_k4`] for Q5_K.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C; `blk..blk + 1408` must be readable and `panel` hold
/// super-block `b`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn fill_q5_k(blk: *const u8, panel: &mut Panel, b: usize) {
    fill_k4::<true>(blk, panel, b)
}

/// [`fill_q4_k`] for Q6_K.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C; `blk..blk + 1680` must be readable and `panel` hold
/// super-block `b`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn fill_q6_k(blk: *const u8, panel: &mut Panel, b: usize) {
    let quants = segment_at(KFormat::Q6K, 2);
    let (half_scales, pairs) = q6_k_scales(blk);
    for n in 0..2 {
        for w in 0..8 {
            let q = q6_k_words(blk.add(quants), n, w);
            for (g, q) in q.into_iter().enumerate() {
                store(&mut panel.packed, ((b * 8 + 4 * n + g) * 8 + w) * ROWS, q);
            }
        }
    }
    fill_rest(
        panel,
        b,
        &half_scales,
        &pairs,
        halves(blk),
        _mm256_setzero_ps(),
    );
}

/// Word `w` of chunks `4 n..4 n + 4` of the Q6_K panel block's quants at `q` (its three
/// recoded words side by side, see `Q6K_SEGMENTS` and `q6_k_bytes` in [`panel8`]): the low
/// six bits of each word are chunks `4 n`, `4 n + 1`, `4 n + 2`, their top two bits those of
/// chunk `4 n + 3` (bits 0-1, 2-3, 4-5). The 16-bit shifts bring the other byte's bits only
/// where the masks clear them.
///
/// [`panel8`]: crate::cpu_qmatmul::panel8
#[inline(always)]
unsafe fn q6_k_words(q: *const u8, n: usize, w: usize) -> [__m256i; 4] {
    let at = q.add((8 * n + w) * 3 * 32);
    let load = |i: usize| _mm256_loadu_si256(at.add(32 * i).cast());
    let (a, b, c) = (load(0), load(1), load(2));
    let last = _mm256_or_si256(
        _mm256_or_si256(bits(a, 6, 0x03), bits(b, 4, 0x0C)),
        bits(c, 2, 0x30),
    );
    [bits(a, 0, 0x3F), bits(b, 0, 0x3F), bits(c, 0, 0x3F), last]
}

/// Bits `shift..` of each byte of `v` under `mask`.
#[inline(always)]
unsafe fn bits(v: __m256i, shift: usize, mask: i8) -> __m256i {
    let s = _mm256_srl_epi16(v, _mm_cvtsi32_si128(shift as i32));
    _mm256_and_si256(s, _mm256_set1_epi8(mask))
}

/// The Q2_K panel block at `blk`: the sixteen half-chunk scales of each row (entry h, lane r:
/// row r's scale h twice) and its eight pairs of mins (entry k: mins 2 k, 2 k + 1).
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C; `blk..blk + 160` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_k_scales_mins(blk: *const u8) -> ([__m256i; 16], [__m256i; 8]) {
    let at = segment_at(KFormat::Q2K, 2);
    let units: [__m256i; 4] =
        std::array::from_fn(|u| _mm256_loadu_si256(blk.add(at + 32 * u).cast()));
    let scales = units.map(|u| bits(u, 0, 0x0F));
    let mins = units.map(|u| bits(u, 4, 0x0F));
    (
        std::array::from_fn(|h| pick(scales[h / 4], h % 4)),
        std::array::from_fn(|k| shuffle(mins[k / 2], &PAIR[k % 2])),
    )
}

/// The chunk `c` quants of the Q2_K quant word `x` (two bits per chunk of four).
#[inline(always)]
unsafe fn q2_k_chunk(x: __m256i, c: usize) -> __m256i {
    bits(x, 2 * (c % 4), 3)
}

/// # Safety
/// The CPU must have AVX2, FMA, F16C; `p..p + 672 * a.len()` must be readable.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_k(p: *const u8, a: &[Q8KBlock]) -> __m256 {
    const BLOCK: usize = 84 * ROWS;
    let quants = segment_at(KFormat::Q2K, 3);
    let mut acc = _mm256_setzero_ps();
    for (b, a) in a.iter().enumerate() {
        let blk = p.add(BLOCK * b);
        prefetch(blk, BLOCK);
        let (d, dmin) = (halves(blk), halves(blk.add(16)));
        let (scales, mins) = q2_k_scales_mins(blk);
        let y = a.qs.as_ptr();
        let mut sumi = _mm256_setzero_si256();
        for n in 0..2 {
            for t in 0..2 {
                // Words 4 t..4 t + 4 of chunks 4 n..4 n + 4: half `2 c + t` of each.
                let mut s16 = [_mm256_setzero_si256(); 4];
                for w in 4 * t..4 * t + 4 {
                    let x = _mm256_loadu_si256(blk.add(quants + (8 * n + w) * 32).cast());
                    for (j, s16) in s16.iter_mut().enumerate() {
                        let yw = broadcast(y.add(32 * (4 * n + j) + 4 * w));
                        let q = q2_k_chunk(x, j);
                        *s16 = _mm256_add_epi16(*s16, _mm256_maddubs_epi16(q, yw));
                    }
                }
                for (j, &s16) in s16.iter().enumerate() {
                    let h = 2 * (4 * n + j) + t;
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s16, scales[h]));
                }
            }
        }
        let summ = group_sums(&mins, a);
        acc = _mm256_add_ps(acc, block_values(d, dmin, _mm256_set1_ps(a.d), sumi, summ));
    }
    acc
}

/// The Q3_K panel block at `blk`: the sixteen signed half-chunk scales of each row (entry h,
/// lane r: row r's scale h twice, as i16) and its eight pairs (entry k: scales 2 k, 2 k + 1);
/// the scalar `scale_words_q3_k`, less 32, on every lane.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C; `blk..blk + 112` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_k_scales(blk: *const u8) -> ([__m256i; 16], [__m256i; 8]) {
    let at = segment_at(KFormat::Q3K, 1);
    let load = |u: usize| _mm256_loadu_si256(blk.add(at + 32 * u).cast());
    let (a0, a1, t) = (load(0), load(1), load(2));
    let top = |shift: usize| _mm256_slli_epi16::<4>(bits(t, shift, 0x03));
    let words = [
        _mm256_or_si256(bits(a0, 0, 0x0F), top(0)),
        _mm256_or_si256(bits(a1, 0, 0x0F), top(2)),
        _mm256_or_si256(bits(a0, 4, 0x0F), top(4)),
        _mm256_or_si256(bits(a1, 4, 0x0F), top(6)),
    ]
    .map(|w| _mm256_sub_epi8(w, _mm256_set1_epi8(32)));
    (
        std::array::from_fn(|h| pick_signed(words[h / 4], &SAME_HIGH[h % 4])),
        std::array::from_fn(|k| pick_signed(words[k / 2], &PAIR_HIGH[k % 2])),
    )
}

/// The three recoded words of word `w` of the Q3_K panel block's quants at `q` (side by side,
/// see `Q3K_SEGMENTS` and `q3_k_bytes` in [`panel8`]).
///
/// [`panel8`]: crate::cpu_qmatmul::panel8
#[inline(always)]
unsafe fn q3_k_words(q: *const u8, w: usize) -> [__m256i; 3] {
    let at = q.add(w * 3 * 32);
    std::array::from_fn(|i| _mm256_loadu_si256(at.add(32 * i).cast()))
}

/// The chunk `c` quants (0..8, before the offset of 4) of the recoded Q3_K words `x`: chunks
/// 0-5 a field of three bits, chunks 6 and 7 two bits of the first or second word and one of
/// the third (the 16-bit shifts bring the other byte's bits only where the masks clear them).
#[inline(always)]
unsafe fn q3_k_chunk(x: &[__m256i; 3], c: usize) -> __m256i {
    match c {
        0..=5 => bits(x[c / 2], 3 * (c % 2), 7),
        _ => _mm256_or_si256(bits(x[c - 6], 6, 3), bits(x[2], c - 2, 4)),
    }
}

/// # Safety
/// The CPU must have AVX2, FMA, F16C; `p..p + 880 * a.len()` must be readable.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3_k(p: *const u8, a: &[Q8KBlock]) -> __m256 {
    const BLOCK: usize = 110 * ROWS;
    let quants = segment_at(KFormat::Q3K, 2);
    let mut acc = _mm256_setzero_ps();
    for (b, a) in a.iter().enumerate() {
        let blk = p.add(BLOCK * b);
        prefetch(blk, BLOCK);
        let d = halves(blk);
        let (scales, pairs) = q3_k_scales(blk);
        let y = a.qs.as_ptr();
        let mut sumi = _mm256_setzero_si256();
        for t in 0..2 {
            // Words 4 t..4 t + 4 of all eight chunks: half `2 c + t` of each.
            let mut s16 = [_mm256_setzero_si256(); 8];
            for w in 4 * t..4 * t + 4 {
                let x = q3_k_words(blk.add(quants), w);
                for (c, s16) in s16.iter_mut().enumerate() {
                    let yw = broadcast(y.add(32 * c + 4 * w));
                    let q = q3_k_chunk(&x, c);
                    *s16 = _mm256_add_epi16(*s16, _mm256_maddubs_epi16(q, yw));
                }
            }
            for (c, &s16) in s16.iter().enumerate() {
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s16, scales[2 * c + t]));
            }
        }
        // The offset: 4 times the scales against the activation's 16-element sums.
        acc = _mm256_add_ps(acc, offset_block_values::<2>(d, sumi, &pairs, a));
    }
    acc
}

/// [`fill_q4_k`] for Q2_K.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C; `blk..blk + 672` must be readable and `panel` hold
/// super-block `b`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn fill_q2_k(blk: *const u8, panel: &mut Panel, b: usize) {
    let quants = segment_at(KFormat::Q2K, 3);
    let (scales, mins) = q2_k_scales_mins(blk);
    for n in 0..2 {
        for w in 0..8 {
            let x = _mm256_loadu_si256(blk.add(quants + (8 * n + w) * 32).cast());
            for j in 0..4 {
                let at = ((b * 8 + 4 * n + j) * 8 + w) * ROWS;
                store(&mut panel.packed, at, q2_k_chunk(x, j));
            }
        }
    }
    fill_rest(panel, b, &scales, &mins, halves(blk), halves(blk.add(16)));
}

/// [`fill_q4_k`] for Q3_K.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C; `blk..blk + 880` must be readable and `panel` hold
/// super-block `b`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn fill_q3_k(blk: *const u8, panel: &mut Panel, b: usize) {
    let quants = segment_at(KFormat::Q3K, 2);
    let (scales, pairs) = q3_k_scales(blk);
    for w in 0..8 {
        let x = q3_k_words(blk.add(quants), w);
        for c in 0..8 {
            let at = ((b * 8 + c) * 8 + w) * ROWS;
            store(&mut panel.packed, at, q3_k_chunk(&x, c));
        }
    }
    fill_rest(panel, b, &scales, &pairs, halves(blk), _mm256_setzero_ps());
}

/// Eight lanes `x` into `v[at..at + 8]`.
#[inline(always)]
unsafe fn store(v: &mut [u32], at: usize, x: __m256i) {
    assert!(at + ROWS <= v.len());
    _mm256_storeu_si256(v.as_mut_ptr().add(at).cast(), x);
}

/// Super-block `b`'s half-chunk scales, group-weight pairs, `d` and `dmin` into `panel`.
#[inline(always)]
unsafe fn fill_rest(
    panel: &mut Panel,
    b: usize,
    scales: &[__m256i; 16],
    groups: &[__m256i; 8],
    d: __m256,
    dmin: __m256,
) {
    for (h, &s) in scales.iter().enumerate() {
        store(&mut panel.scales, (b * 16 + h) * ROWS, s);
    }
    for (g, &p) in groups.iter().enumerate() {
        store(&mut panel.groups, (b * 8 + g) * ROWS, p);
    }
    let at = b * ROWS;
    assert!(at + ROWS <= panel.d.len() && at + ROWS <= panel.dmin.len());
    _mm256_storeu_ps(panel.d.as_mut_ptr().add(at), d);
    _mm256_storeu_ps(panel.dmin.as_mut_ptr().add(at), dmin);
}

/// Bits 3-4 of chunk `2 j + 1`'s Q5_K weights from the recoded fifth-bit word `h` (bits `2 j`,
/// `2 j + 1` of each byte), in place: 16-bit shifts bring the other byte's bits only where the
/// mask clears them.
#[inline(always)]
unsafe fn q5_k_top(h: __m256i, j: usize) -> __m256i {
    let moved = match j {
        0 | 1 => _mm256_sll_epi16(h, _mm_cvtsi32_si128(3 - 2 * j as i32)),
        _ => _mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * j as i32 - 3)),
    };
    _mm256_and_si256(moved, _mm256_set1_epi8(0x18))
}

/// Where a Q4_K (`FIFTH = false`) or Q5_K panel block's fifth-bit words (Q5_K) and quants
/// start, and its size.
#[inline(always)]
fn k4_layout<const FIFTH: bool>() -> K4Layout {
    let format = if FIFTH { KFormat::Q5K } else { KFormat::Q4K };
    let quants = PanelFormat::from(format).segments().len() - 1;
    K4Layout {
        highs: segment_at(format, quants - 1),
        quants: segment_at(format, quants),
        block: format.block_bytes() * ROWS,
    }
}

/// See [`k4_layout`].
#[derive(Clone, Copy)]
struct K4Layout {
    highs: usize,
    quants: usize,
    block: usize,
}

/// Chunks `2 j` and `2 j + 1`'s unsigned weights of word `w` of a Q4_K / Q5_K panel block
/// at `blk` laid out as `at` says (`m4`: 0x0F in every byte).
#[inline(always)]
unsafe fn k4_words<const FIFTH: bool>(
    blk: *const u8,
    at: K4Layout,
    j: usize,
    w: usize,
    m4: __m256i,
) -> (__m256i, __m256i) {
    let x = _mm256_loadu_si256(blk.add(at.quants + (8 * j + w) * 32).cast());
    if !FIFTH {
        let lo = _mm256_and_si256(x, m4);
        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(x), m4);
        return (lo, hi);
    }
    // Recoded (`q5_k_bytes` in `panel8`): chunk 2 j in bits 0-4, bits 0-2 of chunk 2 j + 1
    // above them, its bits 3-4 in the fifth-bit word.
    let h = _mm256_loadu_si256(blk.add(at.highs + w * 32).cast());
    (
        bits(x, 0, 0x1F),
        _mm256_or_si256(bits(x, 5, 0x07), q5_k_top(h, j)),
    )
}

/// The Q4_K (`FIFTH = false`) or Q5_K panel dots: per chunk pair, eight (Q4_K) or four
/// (Q5_K: 2 * 31 * 128 per pair sum) words' `vpmaddubsw` pair sums added in 16 bits before
/// `vpmaddwd` by the chunk's scale.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C; `p..p + 8 * block_bytes * a.len()` must be readable.
#[inline(always)]
unsafe fn k4<const FIFTH: bool>(p: *const u8, a: &[Q8KBlock]) -> __m256 {
    let at = k4_layout::<FIFTH>();
    let per_i16 = if FIFTH { 4 } else { 8 };
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    for (b, a) in a.iter().enumerate() {
        let blk = p.add(at.block * b);
        prefetch(blk, at.block);
        let (d, dmin) = (halves(blk), halves(blk.add(16)));
        let (sc, mn) = q4_k_scales_mins(blk);
        let y = a.qs.as_ptr();
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let (c0, c1) = (2 * j, 2 * j + 1);
            let (s0, s1) = (pick(sc[c0 / 4], c0), pick(sc[c1 / 4], c1));
            for t in 0..8 / per_i16 {
                let (mut lo16, mut hi16) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for w in t * per_i16..(t + 1) * per_i16 {
                    let (lo, hi) = k4_words::<FIFTH>(blk, at, j, w, m4);
                    let ylo = broadcast(y.add(64 * j + 4 * w));
                    let yhi = broadcast(y.add(64 * j + 32 + 4 * w));
                    lo16 = _mm256_add_epi16(lo16, _mm256_maddubs_epi16(lo, ylo));
                    hi16 = _mm256_add_epi16(hi16, _mm256_maddubs_epi16(hi, yhi));
                }
                let s = _mm256_add_epi32(_mm256_madd_epi16(lo16, s0), _mm256_madd_epi16(hi16, s1));
                sumi = _mm256_add_epi32(sumi, s);
            }
        }
        let summ = group_sums(&std::array::from_fn(|c| pick(mn[c / 4], c)), a);
        acc = _mm256_add_ps(acc, block_values(d, dmin, _mm256_set1_ps(a.d), sumi, summ));
    }
    acc
}

/// # Safety
/// The CPU must have AVX2, FMA, F16C; `p..p + 1152 * a.len()` must be readable.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k(p: *const u8, a: &[Q8KBlock]) -> __m256 {
    k4::<false>(p, a)
}

/// # Safety
/// The CPU must have AVX2, FMA, F16C; `p..p + 1408 * a.len()` must be readable.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k(p: *const u8, a: &[Q8KBlock]) -> __m256 {
    k4::<true>(p, a)
}

/// # Safety
/// The CPU must have AVX2, FMA, F16C; `p..p + 1680 * a.len()` must be readable.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k(p: *const u8, a: &[Q8KBlock]) -> __m256 {
    const BLOCK: usize = 210 * ROWS;
    let quants = segment_at(KFormat::Q6K, 2);
    let mut acc = _mm256_setzero_ps();
    for (b, a) in a.iter().enumerate() {
        let blk = p.add(BLOCK * b);
        prefetch(blk, BLOCK);
        let d = halves(blk);
        let (half_scales, pairs) = q6_k_scales(blk);
        let y = a.qs.as_ptr();
        let mut sumi = _mm256_setzero_si256();
        for n in 0..2 {
            for t in 0..4 {
                // Words 2 t, 2 t + 1 of chunks 4 n..4 n + 4: one 16-bit sum per chunk.
                let mut s16 = [_mm256_setzero_si256(); 4];
                for w in [2 * t, 2 * t + 1] {
                    let q = q6_k_words(blk.add(quants), n, w);
                    for g in 0..4 {
                        let yw = broadcast(y.add(32 * (4 * n + g) + 4 * w));
                        s16[g] = _mm256_add_epi16(s16[g], _mm256_maddubs_epi16(q[g], yw));
                    }
                }
                for (g, &s16) in s16.iter().enumerate() {
                    // Half `2 c + t / 2` of chunk c: words 0..4 the first, 4..8 the second.
                    let h = 2 * (4 * n + g) + t / 2;
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s16, half_scales[h]));
                }
            }
        }
        // The offset: 32 times the scales against the activation's 16-element sums.
        acc = _mm256_add_ps(acc, offset_block_values::<5>(d, sumi, &pairs, a));
    }
    acc
}

#[cfg(test)]
#[path = "panel8_tests.rs"]
mod tests;
