//! Q5_0 and Q5_1 in the eight-row panel layout ([`super::panel8`]) on AVX2: the decode kernel
//! (one activation row against the eight rows of a panel: [`dots`]) and the fill of the AVX2
//! GEMM's decoded panel straight from the layout ([`fill`], for
//! [`super::avx2_panel::run_panels`]).
//!
//! A panel block (block `b` of eight rows, 32 elements each) holds the eight f16 `d` (Q5_1: then
//! the eight f16 `m`), the eight u32 `qh`, then the 16 nibble bytes of each row as four words,
//! word `j` of all eight rows in one 32-byte load: its low nibbles are elements `4 j..4 j + 4`,
//! its high ones elements `16 + 4 j..`; element `e`'s fifth bit is bit `e` of `qh`. The fifth
//! bits of four elements are one byte of each lane's `qh` broadcast to the lane's four bytes by
//! `vpshufb`, tested against one bit per byte and turned into `0x10`. The unsigned weights
//! (`q`, below 32) meet the activation by `vpmaddubsw`, four products' pair sums added in 16
//! bits (at most `8 * 31 * 127`), then widened: exact integers. The decode kernel then adds
//! `(sumi - 16 isum) * (d * a.d)` (Q5_0) or `sumi * (d * a.d)`, then `m * a.s` (Q5_1), block by
//! block from 0 in each row's lane: the sequence of [`super::avx2_panel`]'s GEMM, so with panels
//! a prompt and its decode give the same bits for a row.

use std::arch::x86_64::*;

use super::activation::Q8Block;
use super::avx2::Avx2;
use super::kquants::panel8_avx2::prefetch;
use super::panel8::{PanelFormat, ROWS};

/// Words of nibbles per block (16 bytes of each row).
const WORDS: usize = 4;

/// Where a panel block's parts are, and its size (constants: `const { Layout::of::<MIN>() }`).
#[derive(Clone, Copy)]
struct Layout {
    /// The `m` of Q5_1.
    mins: usize,
    highs: usize,
    quants: usize,
    block: usize,
}

impl Layout {
    const fn of<const MIN: bool>() -> Layout {
        let format = format::<MIN>();
        let highs = if MIN { 2 } else { 1 };
        Layout {
            mins: format.offset(1),
            highs: format.offset(highs),
            quants: format.offset(highs + 1),
            block: format.block_bytes() * ROWS,
        }
    }
}

/// Q5_1 (`MIN`) or Q5_0.
const fn format<const MIN: bool>() -> PanelFormat {
    if MIN {
        PanelFormat::Q5_1
    } else {
        PanelFormat::Q5_0
    }
}

/// The eight dot products of the Q5_0 (`MIN = false`) or Q5_1 panel `panel` (`a.len()` panel
/// blocks) with the activation row `a`, row `r` of the panel in lane `r`.
pub fn dots<const MIN: bool>(k: Avx2, panel: &[u8], a: &[Q8Block]) -> [f32; ROWS] {
    let _ = k;
    let at = const { Layout::of::<MIN>() };
    assert!(panel.len() >= at.block * a.len(), "q5 panel too short");
    let mut out = [0f32; ROWS];
    // SAFETY: `k` proves AVX2, FMA and F16C; the assert bounds every read of `panel`.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), decode::<MIN>(panel.as_ptr(), a)) };
    out
}

/// See [`dots`].
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C; `panel` must hold `a.len()` panel blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode<const MIN: bool>(panel: *const u8, a: &[Q8Block]) -> __m256 {
    let at = const { Layout::of::<MIN>() };
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for (b, a) in a.iter().enumerate() {
        let blk = panel.add(b * at.block);
        prefetch(blk, at.block);
        let qh = _mm256_loadu_si256(blk.add(at.highs).cast());
        let y = a.qs.as_ptr().cast::<i32>();
        let mut sumi = _mm256_set1_epi32(if MIN { 0 } else { -16 * a.isum });
        // Words 0, 1 and then 2, 3: four pair sums of at most 2 * 31 * 127 each in 16 bits.
        for half in 0..2 {
            let mut s16 = _mm256_setzero_si256();
            for j in 2 * half..2 * half + 2 {
                let (lo, hi) = weights(blk.add(at.quants + 32 * j), qh, j);
                let ylo = _mm256_set1_epi32(y.add(j).read_unaligned());
                let yhi = _mm256_set1_epi32(y.add(WORDS + j).read_unaligned());
                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(lo, ylo));
                s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(hi, yhi));
            }
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s16, ones));
        }
        let d = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        let scale = _mm256_mul_ps(d, _mm256_set1_ps(a.d));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), scale, acc);
        if MIN {
            let m = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(at.mins).cast()));
            acc = _mm256_fmadd_ps(m, _mm256_set1_ps(a.s), acc);
        }
    }
    acc
}

/// Fills block `b` of the AVX2 GEMM's decoded panel from the panel block at `blk`: the
/// unsigned weights `q` (the GEMM's `w + 16` for Q5_0, `w` for Q5_1) in `packed`, `d` in
/// `scales` and Q5_1's `m` in `mins`. The layout of the arrays is [`super::avx2_panel`]'s
/// (block `b`'s word `w` of row `r` at `(8 b + w) * 8 + r`, its scales at `8 b + r`), and the
/// values those of its decoders.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C; `blk` must hold one panel block; `packed` must hold
/// `64 (b + 1)` words, `scales` (and `mins` where `MIN`) `8 (b + 1)` values.
#[inline(always)]
pub(super) unsafe fn fill<const MIN: bool>(
    blk: *const u8,
    packed: &mut [u32],
    scales: &mut [f32],
    mins: &mut [f32],
    b: usize,
) {
    let at = const { Layout::of::<MIN>() };
    let qh = _mm256_loadu_si256(blk.add(at.highs).cast());
    for j in 0..WORDS {
        let (lo, hi) = weights(blk.add(at.quants + 32 * j), qh, j);
        let to = packed.as_mut_ptr().add(b * 2 * WORDS * ROWS);
        _mm256_storeu_si256(to.add(j * ROWS).cast(), lo);
        _mm256_storeu_si256(to.add((WORDS + j) * ROWS).cast(), hi);
    }
    let d = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
    _mm256_storeu_ps(scales.as_mut_ptr().add(b * ROWS), d);
    if MIN {
        let m = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(at.mins).cast()));
        _mm256_storeu_ps(mins.as_mut_ptr().add(b * ROWS), m);
    }
}

/// The unsigned five-bit weights of word `j` of each lane: elements `4 j..4 j + 4` (`lo`) and
/// `16 + 4 j..` (`hi`) of each row, from the nibble word at `q` and the rows' `qh`.
#[inline(always)]
unsafe fn weights(q: *const u8, qh: __m256i, j: usize) -> (__m256i, __m256i) {
    let m4 = _mm256_set1_epi8(0x0F);
    let x = _mm256_loadu_si256(q.cast());
    let lo = _mm256_and_si256(x, m4);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(x), m4);
    // Elements 4 j.. have their fifth bits in byte j / 2 of `qh` (bits 4 (j % 2)..), elements
    // 16 + 4 j.. in byte 2 + j / 2.
    (
        _mm256_or_si256(lo, fifth_bits(qh, j / 2, j % 2)),
        _mm256_or_si256(hi, fifth_bits(qh, 2 + j / 2, j % 2)),
    )
}

/// `0x10` in byte `k` of each lane where bit `4 nibble + k` of byte `byte` of the lane's `qh`
/// is set, else 0.
#[inline(always)]
unsafe fn fifth_bits(qh: __m256i, byte: usize, nibble: usize) -> __m256i {
    let spread = _mm256_shuffle_epi8(qh, _mm256_loadu_si256(SPREAD[byte].as_ptr().cast()));
    let bits = _mm256_loadu_si256(BITS[nibble].as_ptr().cast());
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bits), bits);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// `vpshufb` patterns putting byte `n` of each 32-bit lane into all four of its bytes.
const SPREAD: [[u8; 32]; 4] = {
    let mut p = [[0u8; 32]; 4];
    let mut n = 0;
    while n < 4 {
        let mut i = 0;
        while i < 32 {
            p[n][i] = (4 * ((i % 16) / 4) + n) as u8;
            i += 1;
        }
        n += 1;
    }
    p
};

/// Bit `4 h + k` in byte `k` of each lane, for `h` 0 and 1.
const BITS: [[u8; 32]; 2] = {
    let mut p = [[0u8; 32]; 2];
    let mut h = 0;
    while h < 2 {
        let mut i = 0;
        while i < 32 {
            p[h][i] = 1 << (4 * h + i % 4);
            i += 1;
        }
        h += 1;
    }
    p
};
