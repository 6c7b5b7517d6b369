//! The multi-row GEMM kernel of the k-quants (Q2_K..Q6_K) on AVX2 (plain AVX2, FMA, F16C; the
//! AVX-VNNI path runs it too): the k-quant form of [`crate::cpu_qmatmul::avx2_panel`].
//!
//! A task's weight rows are taken eight at a time (a panel): every super-block of the eight
//! rows is decoded once ([`KCodec`]: its eight 32-element chunks as unsigned bytes, its
//! sixteen half-chunk scales, its sixteen 16-element group weights (the mins of Q2_K / Q4_K /
//! Q5_K, the scales of Q3_K / Q6_K, whose offset they carry) and `d`, `dmin`) and transposed,
//! so one register holds four consecutive weights of each of the eight rows, and one 32-bit
//! lane per row holds a scale twice (as two i16). Then every activation row sweeps the panel,
//! four rows at a time: per chunk, the four activation bytes of each word are broadcast and
//! `vpmaddubsw`-multiplied with the eight rows' bytes, the 16-bit pair sums summed over at most
//! [`KCodec::WORDS_PER_I16`] words (no saturation) and `vpmaddwd`-multiplied by the lane's
//! scale; the group term is `vpmaddwd` of the group weights with the activation's `bsums`.
//!
//! That gives, lane for lane, the exact integers `sumi` and `summ` of the one-row kernels
//! ([`super::scalar`]), and each lane combines them with [`super::block_value`]'s f32
//! operations in its order (`acc += (d * ad) * sumi - (dmin * ad) * summ`, block by block
//! from 0), so the outputs equal the one-row and four-row kernels' bit for bit.

// The panel's chunks, rows and lanes are indexed in lockstep.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::activation::{Q8KBlock, GROUP, QK_K};
use super::avx2::block_values;
use super::panel8_avx2;
use super::tile::{has_rows8, Path};
use super::{scales_mins_k4, scales_q3_k, KFormat};
use crate::cpu_qmatmul::avx2::{f16_at, Avx2, PREFETCH_AHEAD};
use crate::cpu_qmatmul::avx2_panel::transpose;
use crate::cpu_qmatmul::panel8::{self, PanelFormat, Panels};
use crate::cpu_qmatmul::tile::checked_blocks;
use crate::cpu_qmatmul::Kernel;

/// Weight rows per panel (the lanes of one register of i32).
const PANEL: usize = 8;
const _: () = assert!(PANEL == panel8::ROWS);
/// 32-element chunks per super-block.
const CHUNKS: usize = QK_K / 32;
/// 32-bit words per chunk.
const WORDS: usize = 8;
/// 16-element groups (half chunks) per super-block.
const HALVES: usize = QK_K / GROUP;

/// Calls of at least this many activation rows take the kernel (measured on AVX2 against the
/// four-row tiles, 4864 x 1024, 2 threads: Q4_K 0.96x and Q6_K 0.72x at 4 rows, 1.1-1.4x at
/// 8, 1.5-2.5x from 16; the decoding of a panel is shared by fewer rows than the 32-element
/// formats' cheaper one).
pub const MIN_ROWS: usize = 8;

/// Whether a call of `m` activation rows of `format` runs here under `kernel`: from
/// [`MIN_ROWS`] rows where the k-quant tiles' path is AVX2 or AVX-VNNI, and on the AVX-512
/// path for the formats it has no eight-row zmm tile for (Q2_K, Q3_K: there the four-row ymm
/// tiles ran them, at about 0.65x this kernel's speed in a whole-model prompt) below
/// [`super::avx512_panel::MIN_ROWS`], from where the zmm GEMM takes them. Q4_K..Q6_K keep
/// the zmm tiles on AVX-512
/// CPUs below that GEMM's rows, and on AMX ones the AMX GEMM (which comes first). It is bit
/// for bit the tiles' result either way.
pub fn takes(kernel: Kernel, format: KFormat, m: usize) -> bool {
    m >= MIN_ROWS
        && match Path::detect(kernel) {
            Some(Path::Avx2 | Path::Avx2Vnni) => true,
            Some(Path::Avx512) => {
                !has_rows8(Path::Avx512, format) && !super::avx512_panel::takes(kernel, format, m)
            }
            None => false,
        }
}

/// Computes `acts[i] . W[r]` for every activation row `i` of `acts` and weight row `r` in
/// `weights` of the `format` matrix `data` (`row_stride` bytes per row), handing them out as
/// `out(i, r0, values of rows r0..)`; returns whether it did (every k-quant has a kernel).
pub fn run(
    k: Avx2,
    format: KFormat,
    data: &[u8],
    row_stride: usize,
    weights: Range<usize>,
    acts: &[&[Q8KBlock]],
    out: &mut dyn FnMut(usize, usize, &[f32]),
) -> bool {
    let _ = k;
    if acts.is_empty() || weights.is_empty() {
        return false;
    }
    let bytes = |kb: usize| Some(format.block_bytes() * kb);
    checked_blocks(acts, data, row_stride, &weights, bytes, &format);
    let source = Source::Rows {
        data: data.as_ptr(),
        stride: row_stride,
    };
    // SAFETY: `k` proves AVX2, FMA and F16C; the asserts bound every read of `data`.
    unsafe { dispatch(format, (source, weights, acts, out)) };
    true
}

/// [`run`] over a matrix in the panel layout ([`Panels`]): each panel block fills the
/// decoded panel straight from the layout ([`KCodec::fill`], no transposition), once per task
/// and shared by all its activation rows. `weights` must start at a multiple of
/// [`panel8::ROWS`].
pub fn run_panels(
    k: Avx2,
    panels: &Panels,
    weights: Range<usize>,
    acts: &[&[Q8KBlock]],
    out: &mut dyn FnMut(usize, usize, &[f32]),
) -> bool {
    let _ = k;
    let PanelFormat::K(format) = panels.format() else {
        return false;
    };
    if acts.is_empty() || weights.is_empty() {
        return false;
    }
    panels.check_task(&weights, acts.iter().map(|a| a.len()), panels.kb());
    // SAFETY: `k` proves AVX2, FMA and F16C; the panels are read through checked slices.
    unsafe { dispatch(format, (Source::Panels(panels), weights, acts, out)) };
    true
}

/// [`panels`] for `format`.
///
/// # Safety
/// As [`panels`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dispatch(format: KFormat, args: Args<'_, '_>) {
    match format {
        KFormat::Q2K => panels::<Q2K>(args),
        KFormat::Q3K => panels::<Q3K>(args),
        KFormat::Q4K => panels::<Q4K>(args),
        KFormat::Q5K => panels::<Q5K>(args),
        KFormat::Q6K => panels::<Q6K>(args),
    }
}

/// Where a task's GGUF blocks are read from.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// Rows of `stride` bytes at `data` (bounded by [`checked_blocks`]).
    Rows { data: *const u8, stride: usize },
    /// A matrix in the panel layout.
    Panels(&'a Panels),
}

/// The arguments of [`run`] past the format.
type Args<'a, 'b> = (
    Source<'a>,
    Range<usize>,
    &'a [&'a [Q8KBlock]],
    &'b mut dyn FnMut(usize, usize, &[f32]),
);

/// One decoded super-block of one row.
pub(super) struct Decoded {
    /// Chunk `c`'s 32 unsigned weights (the one-row kernels' integer `q`, before any offset).
    pub(super) q: [__m256i; CHUNKS],
    /// The scale of each 16-element half (Q4_K / Q5_K: their chunk's, twice).
    pub(super) scales: [i16; HALVES],
    /// What each 16-element group's activation sum is multiplied by (mins or scales).
    pub(super) groups: [i16; HALVES],
    pub(super) d: f32,
    pub(super) dmin: f32,
}

/// A k-quant as [`Decoded`] super-blocks.
pub(super) trait KCodec {
    /// Bytes per super-block.
    const BYTES: usize;
    /// How many words' `vpmaddubsw` pair sums may be added in 16 bits before they are
    /// scaled (at most the eight of a chunk with one scale, four of a half with its own).
    const WORDS_PER_I16: usize;
    /// Whether the group term is `summ` (times `dmin`; Q2_K, Q4_K, Q5_K) rather than an offset
    /// taken off `sumi` (`sumi - OFFSET * groups`; Q3_K, Q6_K).
    const MIN: bool;
    /// See [`MIN`](Self::MIN).
    const OFFSET: i32 = 0;
    /// Super-block `b` of the row at `row`.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA, F16C; the row must hold super-block `b`.
    unsafe fn block(row: *const u8, b: usize) -> Decoded;
    /// Fills super-block `b` of `panel` straight from one panel block of the
    /// [`panel8`] layout at `blk` (equal to decoding its eight GGUF rows).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA, F16C; `blk` must hold one panel block of the format.
    unsafe fn fill(blk: *const u8, panel: &mut Panel, b: usize);
}

/// The bytes `(v >> shift) & mask` of `v`.
#[inline(always)]
unsafe fn bits(v: __m256i, shift: i32, mask: i8) -> __m256i {
    let s = _mm256_srl_epi16(v, _mm_cvtsi32_si128(shift));
    _mm256_and_si256(s, _mm256_set1_epi8(mask))
}

/// The 32 bytes at `p`.
#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p.cast())
}

/// The f16 at byte `at` of `p` as f32.
#[inline(always)]
unsafe fn half(p: *const u8, at: usize) -> f32 {
    f16_at(p.add(at))
}

pub(super) struct Q2K;
impl KCodec for Q2K {
    const BYTES: usize = 84;
    const WORDS_PER_I16: usize = 4;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn block(row: *const u8, b: usize) -> Decoded {
        let p = row.add(Self::BYTES * b);
        let sc = std::slice::from_raw_parts(p, 16);
        // Loops, not closures, so that they are compiled with the caller's target features.
        let mut q = [_mm256_setzero_si256(); CHUNKS];
        for (c, q) in q.iter_mut().enumerate() {
            *q = bits(load(p.add(16 + 32 * (c / 4))), 2 * (c as i32 % 4), 3);
        }
        Decoded {
            q,
            scales: std::array::from_fn(|h| i16::from(sc[h] & 0x0F)),
            groups: std::array::from_fn(|g| i16::from(sc[g] >> 4)),
            d: half(p, 80),
            dmin: half(p, 82),
        }
    }
    #[inline(always)]
    unsafe fn fill(blk: *const u8, panel: &mut Panel, b: usize) {
        panel8_avx2::fill_q2_k(blk, panel, b);
    }
}

pub(super) struct Q3K;
impl KCodec for Q3K {
    const BYTES: usize = 110;
    const WORDS_PER_I16: usize = 4;
    const MIN: bool = false;
    const OFFSET: i32 = 4;
    #[inline(always)]
    unsafe fn block(row: *const u8, b: usize) -> Decoded {
        let p = row.add(Self::BYTES * b);
        let sc = scales_q3_k(std::slice::from_raw_parts(p.add(96), 12));
        let hmask = load(p);
        let mut q = [_mm256_setzero_si256(); CHUNKS];
        for (c, q) in q.iter_mut().enumerate() {
            let low = bits(load(p.add(32 + 32 * (c / 4))), 2 * (c as i32 % 4), 3);
            let high = _mm256_slli_epi16::<2>(bits(hmask, c as i32, 1));
            *q = _mm256_or_si256(low, high);
        }
        Decoded {
            q,
            scales: sc.map(i16::from),
            groups: sc.map(i16::from),
            d: half(p, 108),
            dmin: 0.0,
        }
    }
    #[inline(always)]
    unsafe fn fill(blk: *const u8, panel: &mut Panel, b: usize) {
        panel8_avx2::fill_q3_k(blk, panel, b);
    }
}

/// The shared decoder of Q4_K and Q5_K (`QH`: the fifth bits at byte 16, quants at 48).
#[inline(always)]
unsafe fn k4<const BYTES: usize, const QH: bool>(row: *const u8, b: usize) -> Decoded {
    let p = row.add(BYTES * b);
    let (sc, mn) = scales_mins_k4(std::slice::from_raw_parts(p.add(4), 12));
    let qs = p.add(if QH { 48 } else { 16 });
    let qh = if QH {
        load(p.add(16))
    } else {
        _mm256_setzero_si256()
    };
    let mut q = [_mm256_setzero_si256(); CHUNKS];
    for (c, q) in q.iter_mut().enumerate() {
        let nib = bits(load(qs.add(32 * (c / 2))), 4 * (c as i32 % 2), 0x0F);
        *q = match QH {
            true => _mm256_or_si256(nib, _mm256_slli_epi16::<4>(bits(qh, c as i32, 1))),
            false => nib,
        };
    }
    Decoded {
        q,
        scales: std::array::from_fn(|h| i16::from(sc[h / 2])),
        groups: std::array::from_fn(|g| i16::from(mn[g / 2])),
        d: half(p, 0),
        dmin: half(p, 2),
    }
}

pub(super) struct Q4K;
impl KCodec for Q4K {
    const BYTES: usize = 144;
    const WORDS_PER_I16: usize = 8;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn block(row: *const u8, b: usize) -> Decoded {
        k4::<{ Self::BYTES }, false>(row, b)
    }
    #[inline(always)]
    unsafe fn fill(blk: *const u8, panel: &mut Panel, b: usize) {
        panel8_avx2::fill_q4_k(blk, panel, b);
    }
}

pub(super) struct Q5K;
impl KCodec for Q5K {
    const BYTES: usize = 176;
    const WORDS_PER_I16: usize = 4;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn block(row: *const u8, b: usize) -> Decoded {
        k4::<{ Self::BYTES }, true>(row, b)
    }
    #[inline(always)]
    unsafe fn fill(blk: *const u8, panel: &mut Panel, b: usize) {
        panel8_avx2::fill_q5_k(blk, panel, b);
    }
}

pub(super) struct Q6K;
impl KCodec for Q6K {
    const BYTES: usize = 210;
    // Six-bit weights: 2 * 63 * 128 per pair sum, two words in 16 bits.
    const WORDS_PER_I16: usize = 2;
    const MIN: bool = false;
    const OFFSET: i32 = 32;
    #[inline(always)]
    unsafe fn block(row: *const u8, b: usize) -> Decoded {
        let p = row.add(Self::BYTES * b);
        let sc = std::slice::from_raw_parts(p.add(192), 16);
        let mut q = [_mm256_setzero_si256(); CHUNKS];
        for (c, q) in q.iter_mut().enumerate() {
            let (n, g) = (c / 4, c as i32 % 4);
            let nib = bits(load(p.add(64 * n + 32 * (c % 2))), 4 * (g / 2), 0x0F);
            let high = bits(load(p.add(128 + 32 * n)), 2 * g, 3);
            *q = _mm256_or_si256(nib, _mm256_slli_epi16::<4>(high));
        }
        Decoded {
            q,
            scales: std::array::from_fn(|h| i16::from(sc[h] as i8)),
            groups: std::array::from_fn(|g| i16::from(sc[g] as i8)),
            d: half(p, 208),
            dmin: 0.0,
        }
    }
    #[inline(always)]
    unsafe fn fill(blk: *const u8, panel: &mut Panel, b: usize) {
        panel8_avx2::fill_q6_k(blk, panel, b);
    }
}

/// A decoded panel of `kb` super-blocks (layouts in [`panels`]).
pub(super) struct Panel {
    /// Super-block b's chunk c's word j of lane r at `[((b * CHUNKS + c) * WORDS + j) * PANEL + r]`.
    pub(super) packed: Vec<u32>,
    /// Half h's scale of lane r, twice, at `[(b * HALVES + h) * PANEL + r]`.
    pub(super) scales: Vec<u32>,
    /// Groups `2 k, 2 k + 1`'s weights of lane r at `[(b * HALVES / 2 + k) * PANEL + r]`.
    pub(super) groups: Vec<u32>,
    /// `d` and `dmin` of lane r at `[b * PANEL + r]`.
    pub(super) d: Vec<f32>,
    pub(super) dmin: Vec<f32>,
}

/// Two i16 as the halves of one u32 (`lo` in the low half).
#[inline(always)]
fn pair(lo: i16, hi: i16) -> u32 {
    u32::from(lo as u16) | (u32::from(hi as u16) << 16)
}

/// # Safety
/// The CPU must have AVX2, FMA, F16C; rows `weights` of `row_stride` bytes at `data` must each
/// hold `acts[0].len()` super-blocks and every row of `acts` as many ([`checked_blocks`]).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn panels<C: KCodec>(args: Args<'_, '_>) {
    let (source, weights, acts, out) = args;
    let kb = acts[0].len();
    let mut panel = Panel {
        packed: vec![0; kb * CHUNKS * WORDS * PANEL],
        scales: vec![0; kb * HALVES * PANEL],
        groups: vec![0; kb * HALVES / 2 * PANEL],
        d: vec![0.0; kb * PANEL],
        dmin: vec![0.0; kb * PANEL],
    };
    let mut lanes = [0f32; PANEL];
    for first in weights.clone().step_by(PANEL) {
        let n = (weights.end - first).min(PANEL);
        for b in 0..kb {
            let (data, stride) = match source {
                Source::Rows { data, stride } => (data, stride),
                Source::Panels(panels) => {
                    let blk = &panels.panel(first / PANEL)[b * PANEL * C::BYTES..];
                    assert!(blk.len() >= PANEL * C::BYTES);
                    // Every format with a panel layout fills from it.
                    C::fill(blk.as_ptr(), &mut panel, b);
                    continue;
                }
            };
            let mut q = [[_mm256_setzero_si256(); PANEL]; CHUNKS];
            for r in 0..PANEL {
                let lane = b * PANEL + r;
                if r >= n {
                    (panel.d[lane], panel.dmin[lane]) = (0.0, 0.0);
                    for h in 0..HALVES {
                        panel.scales[(b * HALVES + h) * PANEL + r] = 0;
                    }
                    for g in 0..HALVES / 2 {
                        panel.groups[(b * HALVES / 2 + g) * PANEL + r] = 0;
                    }
                    continue;
                }
                let row = data.add((first + r) * stride);
                _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(C::BYTES * b + PREFETCH_AHEAD).cast());
                let dec = C::block(row, b);
                for c in 0..CHUNKS {
                    q[c][r] = dec.q[c];
                }
                (panel.d[lane], panel.dmin[lane]) = (dec.d, dec.dmin);
                for (h, &s) in dec.scales.iter().enumerate() {
                    panel.scales[(b * HALVES + h) * PANEL + r] = pair(s, s);
                }
                for g in 0..HALVES / 2 {
                    let word = pair(dec.groups[2 * g], dec.groups[2 * g + 1]);
                    panel.groups[(b * HALVES / 2 + g) * PANEL + r] = word;
                }
            }
            for (c, q) in q.iter().enumerate() {
                let at = (b * CHUNKS + c) * WORDS * PANEL;
                for (j, word) in transpose(*q).into_iter().enumerate() {
                    let to = panel.packed.as_mut_ptr().add(at + j * PANEL);
                    _mm256_storeu_si256(to.cast(), word);
                }
            }
        }
        let mut emit = |i: usize, acc: __m256| {
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
            out(i, first, &lanes[..n]);
        };
        let mut i = 0;
        while i + 4 <= acts.len() {
            let a = [acts[i], acts[i + 1], acts[i + 2], acts[i + 3]];
            for (di, acc) in sweep::<4, C>(&panel, a).into_iter().enumerate() {
                emit(i + di, acc);
            }
            i += 4;
        }
        for (i, &a) in acts.iter().enumerate().skip(i) {
            let [acc] = sweep::<1, C>(&panel, [a]);
            emit(i, acc);
        }
    }
}

/// The eight outputs of each of the `R` activation rows `a` against a decoded panel.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C; the panel holds `a[0].len()` super-blocks.
#[inline(always)]
unsafe fn sweep<const R: usize, C: KCodec>(panel: &Panel, a: [&[Q8KBlock]; R]) -> [__m256; R] {
    let kb = a[0].len();
    debug_assert!(panel.packed.len() >= kb * CHUNKS * WORDS * PANEL);
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..kb {
        let mut blk = [&Q8KBlock::ZERO; R];
        for (r, blk) in blk.iter_mut().enumerate() {
            *blk = a[r].get_unchecked(b);
        }
        let mut sumi = [_mm256_setzero_si256(); R];
        // Words outer, rows inner: one weight word and the rows' 16-bit sums in registers (a
        // chunk's eight words and a row's eight broadcasts at once spilled). A runtime chunk
        // loop, so that the scheduler does not hoist the next chunks' loads.
        for c in 0..std::hint::black_box(CHUNKS) {
            let base = panel.packed.as_ptr().add((b * CHUNKS + c) * WORDS * PANEL);
            let scales = panel.scales.as_ptr().add((b * HALVES + 2 * c) * PANEL);
            for start in (0..WORDS).step_by(C::WORDS_PER_I16) {
                let mut s16 = [_mm256_setzero_si256(); R];
                for j in start..start + C::WORDS_PER_I16 {
                    let w = _mm256_loadu_si256(base.add(j * PANEL).cast());
                    for r in 0..R {
                        let q = blk[r].qs.as_ptr().add(32 * c).cast::<i32>();
                        let y = _mm256_set1_epi32(q.add(j).read_unaligned());
                        let p = _mm256_maddubs_epi16(w, y);
                        s16[r] = if j == start {
                            p
                        } else {
                            _mm256_add_epi16(s16[r], p)
                        };
                    }
                }
                // Words 0..4 are the chunk's first half, 4..8 its second.
                let scale = _mm256_loadu_si256(scales.add(start / 4 * PANEL).cast());
                for r in 0..R {
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(s16[r], scale));
                }
            }
        }
        let groups = panel.groups.as_ptr().add(b * HALVES / 2 * PANEL);
        let d = _mm256_loadu_ps(panel.d.as_ptr().add(b * PANEL));
        let dmin = _mm256_loadu_ps(panel.dmin.as_ptr().add(b * PANEL));
        for r in 0..R {
            let sums = blk[r].bsums.as_ptr().cast::<i32>();
            let mut g = _mm256_setzero_si256();
            for k in 0..HALVES / 2 {
                let gw = _mm256_loadu_si256(groups.add(k * PANEL).cast());
                let bs = _mm256_set1_epi32(sums.add(k).read_unaligned());
                g = _mm256_add_epi32(g, _mm256_madd_epi16(gw, bs));
            }
            let (sumi, summ) = match C::MIN {
                true => (sumi[r], g),
                false => {
                    let offset = _mm256_mullo_epi32(g, _mm256_set1_epi32(C::OFFSET));
                    (_mm256_sub_epi32(sumi[r], offset), _mm256_setzero_si256())
                }
            };
            let values = block_values(d, dmin, _mm256_set1_ps(blk[r].d), sumi, summ);
            acc[r] = _mm256_add_ps(acc[r], values);
        }
    }
    acc
}

#[cfg(test)]
#[path = "avx2_panel_tests.rs"]
mod tests;
