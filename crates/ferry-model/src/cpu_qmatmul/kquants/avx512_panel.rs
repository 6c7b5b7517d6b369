//! The multi-row GEMM kernel of the k-quants Q2_K..Q6_K on AVX-512 (F, BW, VNNI): the zmm
//! form of [`super::avx2_panel`], on 64 weight rows per panel (four blocks of sixteen).
//!
//! A panel's super-block `b` is decoded once for all of a task's activation rows (the AVX2
//! panel's [`KCodec`] decoders for the quants, its scales, mins and `d` gathered into lanes,
//! [`Panelled::lanes`]) and transposed, so one zmm holds four consecutive weights of each of
//! sixteen rows; then every activation row adds the blocks' value to its 64 accumulators
//! (block-outer: the four decoded blocks, 18 KiB, stay in L1). Each broadcast activation word
//! meets the four blocks' registers (a broadcast per `vpdpbusd` held the kernel to about
//! half the instruction's rate), two to four activation rows at a time. The scales:
//! - Q2_K: each weight byte becomes `scale * q` (`0..=15 * 0..=3`, at most 45): one `vpmullw`
//!   of the 16-bit pairs by the lane's scale (no carry crosses a byte). One `vpdpbusd` per four
//!   weights of the sixteen rows then sums the one-row kernels' `sumi`; the min term `summ` is
//!   `vpdpwssd` of the mins with the activation's `bsums`.
//! - Q3_K: each byte becomes `(4 - q) * scale + 128` (`q` the 3-bit weight `0..=7`, `scale`
//!   `-32..=31`: the product is `-128..=124`, the byte `0..=252`). Summed against the
//!   activations that is `-sumi + 128 A` (`A` the block's activation sum), so `sumi` (its
//!   `- 4 * offset` included) is `128 A` less the sum, no `bsums` term left.
//! - Q4_K / Q5_K: the bytes stay `q`; the `vpdpbusd` sums of four (Q4_K) or two (Q5_K) words,
//!   exact within an i16, are multiplied by their half-chunk's scale with `vpdpwssd`.
//! - Q6_K: likewise one word at a time (`4 * 63 * 128 < 2^15`) by its half's signed scale;
//!   its offset `32 * sum_g scale_g * bsum_g` (`vpdpwssd` of the scale pairs with `bsums`) is
//!   taken off `sumi` in the lanes.
//!
//! Each lane thus gets the exact integers `sumi` and `summ` of the one-row kernels
//! ([`super::scalar`]) and combines them with [`super::block_value`]'s f32 operations in its
//! order (`acc += (d * ad) * sumi - (dmin * ad) * summ`, block by block from 0), so the
//! outputs equal the one-row, four-/eight-row and AVX2-panel kernels' bit for bit.

// The panel's chunks, rows and lanes are indexed in lockstep.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::activation::{Q8KBlock, QK_K};
use super::avx2_panel::{KCodec, Q2K, Q3K, Q4K, Q5K, Q6K};
use super::avx512_tile::Avx512;
use super::tile::Path;
use super::KFormat;
use crate::cpu_qmatmul::avx2::PREFETCH_AHEAD;
use crate::cpu_qmatmul::avx2_panel::transpose;
use crate::cpu_qmatmul::tile::checked_blocks;
use crate::cpu_qmatmul::Kernel;

/// Weight rows per panel (the lanes of one register of i32).
const PANEL: usize = 16;
/// 32-element chunks per super-block.
const CHUNKS: usize = QK_K / 32;
/// 32-bit words per chunk.
const WORDS: usize = 8;
/// 16-element groups (half chunks) per super-block.
const HALVES: usize = 16;

/// Calls of at least this many activation rows take the kernel (see [`takes`]). Measured on
/// the AVX-512 VM (4096 x 4096, 2 threads, against the kernels before it): at 8 rows Q4_K /
/// Q5_K ran at about 0.7-1.0x the eight-row zmm tiles and Q2_K / Q3_K at 0.75-1.0x the AVX2
/// panel (a panel's decoding shared by only 8 rows); from 16 rows it wins (1.2-2.5x, 1.7-2.7x
/// at 512).
pub const MIN_ROWS: usize = 16;

/// Whether `format` has a kernel here (every k-quant).
pub fn handles(format: KFormat) -> bool {
    let _ = format;
    true
}

/// A k-quant the panel runs: [`KCodec`] plus how its scales are applied.
trait Panelled: KCodec {
    /// Words whose `vpdpbusd` sums are added up before `vpdpwssd` multiplies them by their
    /// scale (their sum must fit an i16: Q4_K four, `16 * 15 * 128 < 2^15`; Q5_K two,
    /// `8 * 31 * 128 < 2^15`; Q6_K one, `4 * 63 * 128 < 2^15`); 0 for the formats whose bytes
    /// carry their scale (Q2_K, Q3_K).
    const SCALE_WORDS: usize;
    /// The scales, mins, `d` and `dmin` of one super-block of the panel's rows in lanes
    /// (gathered: lane r's block at `at + offsets[r]`, lanes outside `rows` zero).
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, BW; the blocks of the `rows` lanes must be readable.
    unsafe fn lanes(at: *const u8, offsets: __m512i, rows: __mmask16) -> Lanes;
}

/// A super-block's per-lane scale terms ([`Panelled::lanes`]).
struct Lanes {
    /// Half h's scale: Q2_K in both i16 of the lane, Q3_K likewise (signed), Q4_K / Q5_K in
    /// the low one (the high one 0).
    scales: [__m512i; HALVES],
    /// Q3_K: the byte `128 + 4 scale` in every byte of the lane.
    bias: [__m512i; HALVES],
    /// The mins of groups `2 k, 2 k + 1` (two i16 per lane) at `[k]` (Q2_K, Q4_K, Q5_K; Q6_K:
    /// its scales, whose offset term they carry).
    mins: [__m512i; HALVES / 2],
    d: __m512,
    dmin: __m512,
}

/// `vpdpwssd` as the one instruction: LLVM rewrites the intrinsic's accumulating chains into
/// `vpmaddwd` + `vpaddd`, two operations on the ports the `vpdpbusd` need (measured: Q6_K,
/// one scale multiply per word, ran at two thirds of the speed).
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut acc = acc;
    // SAFETY: the callers run with AVX-512 VNNI enabled; registers only.
    std::arch::asm!(
        "vpdpwssd {acc}, {a}, {b}",
        acc = inout(zmm_reg) acc,
        a = in(zmm_reg) a,
        b = in(zmm_reg) b,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

/// The u32 at `at + offsets[r] + off` in lane r (0 outside `rows`).
#[inline(always)]
unsafe fn gather(at: *const u8, off: usize, offsets: __m512i, rows: __mmask16) -> __m512i {
    _mm512_mask_i32gather_epi32::<1>(_mm512_setzero_si512(), rows, offsets, at.add(off).cast())
}

/// Byte `e` of each lane of `v`, as an i32.
#[inline(always)]
unsafe fn byte(v: __m512i, e: usize) -> __m512i {
    let s = _mm512_srl_epi32(v, _mm_cvtsi32_si128(8 * e as i32));
    _mm512_and_si512(s, _mm512_set1_epi32(0xFF))
}

/// Each lane's low i16 in both halves.
#[inline(always)]
unsafe fn both_halves(v: __m512i) -> __m512i {
    let lo = _mm512_and_si512(v, _mm512_set1_epi32(0xFFFF));
    _mm512_or_si512(lo, _mm512_slli_epi32::<16>(lo))
}

/// The f16 in the low (`HIGH = false`) or high half of each lane, as f32.
#[inline(always)]
unsafe fn halves_f16<const HIGH: bool>(v: __m512i) -> __m512 {
    let v = if HIGH { _mm512_srli_epi32::<16>(v) } else { v };
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v))
}

/// The masks `0x0F0F_0F0F`, `0x0303_0303` and `0x3F3F_3F3F` in every lane.
#[inline(always)]
unsafe fn masks() -> (__m512i, __m512i, __m512i) {
    (
        _mm512_set1_epi32(0x0F0F_0F0F),
        _mm512_set1_epi32(0x0303_0303),
        _mm512_set1_epi32(0x3F3F_3F3F),
    )
}

/// `(v >> shift) & mask`, per lane.
#[inline(always)]
unsafe fn field<const SHIFT: u32>(v: __m512i, mask: __m512i) -> __m512i {
    _mm512_and_si512(_mm512_srli_epi32::<SHIFT>(v), mask)
}

/// `(t & 0x0303_0303) << 4`, per lane (Q3_K's and the 6-bit scales' top bits).
#[inline(always)]
unsafe fn top2(t: __m512i) -> __m512i {
    _mm512_slli_epi32::<4>(_mm512_and_si512(t, _mm512_set1_epi32(0x0303_0303)))
}

/// Lanes with every field zero (filled in by the formats; loops, not closures, so that the
/// intrinsics are compiled with the caller's target features).
#[inline(always)]
unsafe fn zero_lanes() -> Lanes {
    Lanes {
        scales: [_mm512_setzero_si512(); HALVES],
        bias: [_mm512_setzero_si512(); HALVES],
        mins: [_mm512_setzero_si512(); HALVES / 2],
        d: _mm512_setzero_ps(),
        dmin: _mm512_setzero_ps(),
    }
}

impl Panelled for Q2K {
    const SCALE_WORDS: usize = 0;
    #[inline(always)]
    unsafe fn lanes(at: *const u8, offsets: __m512i, rows: __mmask16) -> Lanes {
        let mut out = zero_lanes();
        let nib = _mm512_set1_epi32(0x0F);
        let mut mins = [_mm512_setzero_si512(); HALVES];
        for k in 0..4 {
            let g = gather(at, 4 * k, offsets, rows);
            for e in 0..4 {
                let byte = byte(g, e);
                out.scales[4 * k + e] = both_halves(_mm512_and_si512(byte, nib));
                mins[4 * k + e] = _mm512_srli_epi32::<4>(byte);
            }
        }
        for k in 0..HALVES / 2 {
            out.mins[k] = _mm512_or_si512(mins[2 * k], _mm512_slli_epi32::<16>(mins[2 * k + 1]));
        }
        let dd = gather(at, 80, offsets, rows);
        out.d = halves_f16::<false>(dd);
        out.dmin = halves_f16::<true>(dd);
        out
    }
}
impl Panelled for Q3K {
    const SCALE_WORDS: usize = 0;
    #[inline(always)]
    unsafe fn lanes(at: *const u8, offsets: __m512i, rows: __mmask16) -> Lanes {
        let mut out = zero_lanes();
        // `scale_words_q3_k` in lanes.
        let a0 = gather(at, 96, offsets, rows);
        let a1 = gather(at, 100, offsets, rows);
        let t = gather(at, 104, offsets, rows);
        let (low, _, _) = masks();
        let words = [
            _mm512_or_si512(_mm512_and_si512(a0, low), top2(t)),
            _mm512_or_si512(_mm512_and_si512(a1, low), top2(_mm512_srli_epi32::<2>(t))),
            _mm512_or_si512(field::<4>(a0, low), top2(_mm512_srli_epi32::<4>(t))),
            _mm512_or_si512(field::<4>(a1, low), top2(_mm512_srli_epi32::<6>(t))),
        ];
        let (thirty_two, bias_at) = (_mm512_set1_epi32(32), _mm512_set1_epi32(128));
        for h in 0..HALVES {
            let s = _mm512_sub_epi32(byte(words[h / 4], h % 4), thirty_two);
            out.scales[h] = both_halves(s);
            let b = _mm512_add_epi32(_mm512_slli_epi32::<2>(s), bias_at);
            let b = _mm512_and_si512(b, _mm512_set1_epi32(0xFF));
            let b = _mm512_or_si512(b, _mm512_slli_epi32::<8>(b));
            out.bias[h] = _mm512_or_si512(b, _mm512_slli_epi32::<16>(b));
        }
        // The last u32 of the block: its f16 `d` in the high half.
        out.d = halves_f16::<true>(gather(at, 106, offsets, rows));
        out
    }
}

/// [`Panelled::lanes`] of Q4_K and Q5_K (`scales_mins_k4` in lanes).
#[inline(always)]
unsafe fn lanes_k4(at: *const u8, offsets: __m512i, rows: __mmask16) -> Lanes {
    let mut out = zero_lanes();
    let a0 = gather(at, 4, offsets, rows);
    let a1 = gather(at, 8, offsets, rows);
    let a2 = gather(at, 12, offsets, rows);
    let (low, _, six) = masks();
    let sc = [
        _mm512_and_si512(a0, six),
        _mm512_or_si512(_mm512_and_si512(a2, low), top2(_mm512_srli_epi32::<6>(a0))),
    ];
    let mn = [
        _mm512_and_si512(a1, six),
        _mm512_or_si512(field::<4>(a2, low), top2(_mm512_srli_epi32::<6>(a1))),
    ];
    for c in 0..CHUNKS {
        let s = byte(sc[c / 4], c % 4);
        out.scales[2 * c] = s;
        out.scales[2 * c + 1] = s;
        out.mins[c] = both_halves(byte(mn[c / 4], c % 4));
    }
    let dd = gather(at, 0, offsets, rows);
    out.d = halves_f16::<false>(dd);
    out.dmin = halves_f16::<true>(dd);
    out
}

impl Panelled for Q4K {
    const SCALE_WORDS: usize = 4;
    #[inline(always)]
    unsafe fn lanes(at: *const u8, offsets: __m512i, rows: __mmask16) -> Lanes {
        lanes_k4(at, offsets, rows)
    }
}
impl Panelled for Q5K {
    const SCALE_WORDS: usize = 2;
    #[inline(always)]
    unsafe fn lanes(at: *const u8, offsets: __m512i, rows: __mmask16) -> Lanes {
        lanes_k4(at, offsets, rows)
    }
}

impl Panelled for Q6K {
    const SCALE_WORDS: usize = 1;
    #[inline(always)]
    unsafe fn lanes(at: *const u8, offsets: __m512i, rows: __mmask16) -> Lanes {
        let mut out = zero_lanes();
        // Sixteen signed byte scales at 192, the f16 `d` at 208 (read from 206: the high half,
        // so the gather stays inside the 210-byte block).
        let words: [__m512i; 4] = std::array::from_fn(|k| gather(at, 192 + 4 * k, offsets, rows));
        let (sign, low) = (_mm512_set1_epi32(0x80), _mm512_set1_epi32(0xFFFF));
        for h in 0..HALVES {
            let b = _mm512_sub_epi32(_mm512_xor_si512(byte(words[h / 4], h % 4), sign), sign);
            out.scales[h] = _mm512_and_si512(b, low);
        }
        for k in 0..HALVES / 2 {
            let hi = _mm512_slli_epi32::<16>(out.scales[2 * k + 1]);
            out.mins[k] = _mm512_or_si512(out.scales[2 * k], hi);
        }
        out.d = halves_f16::<true>(gather(at, 206, offsets, rows));
        out
    }
}

/// Whether a call of `m` activation rows of `format` runs here under `kernel`: from
/// [`MIN_ROWS`] rows of every k-quant where the k-quant tiles' path is AVX-512 (on AMX CPUs the
/// AMX GEMM, checked first, keeps the Q4_K..Q6_K calls it takes). Bit for bit the tiles' and
/// the AVX2 panel's result.
pub fn takes(kernel: Kernel, format: KFormat, m: usize) -> bool {
    m >= MIN_ROWS && handles(format) && Path::detect(kernel) == Some(Path::Avx512)
}

/// Computes `acts[i] . W[r]` for every activation row `i` of `acts` and weight row `r` in
/// `weights` of the `format` matrix `data` (`row_stride` bytes per row), handing them out as
/// `out(i, r0, values of rows r0..)`; returns whether it did (every k-quant, rows of less than
/// 128 MiB).
pub fn run(
    k: Avx512,
    format: KFormat,
    data: &[u8],
    row_stride: usize,
    weights: Range<usize>,
    acts: &[&[Q8KBlock]],
    out: &mut dyn FnMut(usize, usize, &[f32]),
) -> bool {
    let _ = k;
    if !handles(format) || acts.is_empty() || weights.is_empty() {
        return false;
    }
    if row_stride > i32::MAX as usize / PANEL {
        // The gathers' lane offsets are i32.
        return false;
    }
    let bytes = |kb: usize| Some(format.block_bytes() * kb);
    checked_blocks(acts, data, row_stride, &weights, bytes, &format);
    // SAFETY: `k` proves AVX-512 F, BW, VNNI and AVX2, FMA, F16C; the asserts bound every read
    // of `data`.
    unsafe {
        let args = (data.as_ptr(), row_stride, weights, acts, out);
        match format {
            KFormat::Q2K => panels::<Q2K>(args),
            KFormat::Q3K => panels::<Q3K>(args),
            KFormat::Q4K => panels::<Q4K>(args),
            KFormat::Q5K => panels::<Q5K>(args),
            KFormat::Q6K => panels::<Q6K>(args),
        }
    }
    true
}

/// The arguments of [`run`] past the format.
type Args<'a, 'b> = (
    *const u8,
    usize,
    Range<usize>,
    &'a [&'a [Q8KBlock]],
    &'b mut dyn FnMut(usize, usize, &[f32]),
);

/// One decoded super-block of a panel's sixteen rows.
struct Block {
    /// Chunk c's scaled word j of the sixteen rows at `[c * WORDS + j]`.
    packed: [__m512i; CHUNKS * WORDS],
    /// The mins of groups `2 k, 2 k + 1` (two i16 per lane) at `[k]` (Q2_K, Q4_K, Q5_K; Q6_K:
    /// its scales, whose offset term they carry).
    mins: [__m512i; HALVES / 2],
    /// Q4_K / Q5_K: half h's scale (the low i16 of each lane, the high one 0) at `[h]`.
    scales: [__m512i; HALVES],
    /// `d` and `dmin` of the sixteen rows.
    d: __m512,
    dmin: __m512,
}

/// Q2_K's scaled weights of four transposed words `w` (each lane's bytes `0..=3`) times the
/// lane's scale `s` (`0..=15`, in both i16 halves): `s * q` per byte.
#[inline(always)]
unsafe fn scaled_q2(w: __m512i, s: __m512i) -> __m512i {
    _mm512_mullo_epi16(w, s)
}

/// Q3_K's shifted weights of four transposed words `w` (each lane's bytes `q` in `0..=7`), the
/// lane's scale `s` (`-32..=31`, in both i16 halves) and `bias` (the byte `128 + 4 s` in every
/// byte of the lane): `(4 - q) * s + 128 = bias - q * s` per byte, exact in `0..=252` (the byte
/// products are taken modulo 256: even bytes from `w * s`, odd ones from `(w & 0xFF00) * s`).
#[inline(always)]
unsafe fn shifted_q3(w: __m512i, s: __m512i, bias: __m512i) -> __m512i {
    let even = _mm512_mullo_epi16(w, s);
    let odd = _mm512_mullo_epi16(_mm512_and_si512(w, _mm512_set1_epi16(0xFF00u16 as i16)), s);
    let qs = _mm512_mask_blend_epi8(0xAAAA_AAAA_AAAA_AAAA, even, odd);
    _mm512_sub_epi8(bias, qs)
}

/// Sixteen-row blocks per panel: each broadcast activation word meets this many weight
/// registers. Broadcasting an activation word costs a load port slot (the `{1to16}` operand);
/// measured alone on the AVX-512 VM (a loop of `vpdpbusd` over registers and broadcasts):
/// one weight register per broadcast ran at 2.9-3.2 G `vpdpbusd`/s per core, two at
/// 3.7-4.4, four (by four activation rows) at 5.1, the register-only peak 5.9.
const GROUPS: usize = 4;
/// Weight rows per panel (the tiled matmul hands out weight ranges in multiples of it).
pub const PANEL_ROWS: usize = PANEL * GROUPS;

/// Activation rows per sweep of Q2_K / Q3_K (sixteen accumulators: one per row and group).
const SWEEP: usize = 4;
/// Activation rows per sweep of Q4_K..Q6_K (twelve accumulators and twelve half sums; two
/// rows measured at most as fast).
const SWEEP_SCALED: usize = 3;

/// # Safety
/// The CPU must have AVX-512 F, BW, VNNI and AVX2, FMA, F16C; rows `weights` of `row_stride`
/// bytes at `data` must each hold `acts[0].len()` super-blocks and every row of `acts` as many
/// ([`checked_blocks`]) and `16 * row_stride` fit an i32.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn panels<C: Panelled>(args: Args<'_, '_>) {
    let (data, row_stride, weights, acts, out) = args;
    let kb = acts[0].len();
    let m = acts.len();
    // Blocks past a short last panel's rows keep what they held (zero or an earlier panel's
    // decoding): their lanes are computed and never handed out.
    let mut blocks: [Block; GROUPS] = std::array::from_fn(|_| Block {
        packed: [_mm512_setzero_si512(); CHUNKS * WORDS],
        mins: [_mm512_setzero_si512(); HALVES / 2],
        scales: [_mm512_setzero_si512(); HALVES],
        d: _mm512_setzero_ps(),
        dmin: _mm512_setzero_ps(),
    });
    // Q3_K: `128 A` of each activation row's blocks (`A` the block's activation sum), at
    // `[i * kb + b]`; empty for the other formats (no shift).
    let shifts: Vec<i32> = match C::MIN || C::SCALE_WORDS != 0 {
        true => Vec::new(),
        false => acts
            .iter()
            .flat_map(|a| a.iter())
            .map(|blk| 128 * blk.bsums.iter().map(|&s| i32::from(s)).sum::<i32>())
            .collect(),
    };
    let mut acc = vec![[_mm512_setzero_ps(); GROUPS]; m];
    let mut lanes = [0f32; PANEL_ROWS];
    for first in weights.clone().step_by(PANEL_ROWS) {
        let n = (weights.end - first).min(PANEL_ROWS);
        acc.fill([_mm512_setzero_ps(); GROUPS]);
        // Block-outer: the decoded blocks (4 x 4.5 KiB) stay in L1 while every activation row
        // adds their value, block after block, to its accumulators (the lanes' order of
        // `block_value`s is the one-row kernels').
        for b in 0..kb {
            for (g, block) in blocks.iter_mut().enumerate().take(n.div_ceil(PANEL)) {
                let rows = (n - PANEL * g).min(PANEL);
                decode::<C>(block, data, row_stride, first + PANEL * g, rows, b);
            }
            let rows = match C::SCALE_WORDS {
                0 => sweep_rows::<SWEEP, C>(&blocks, acts, b, &shifts, &mut acc, 0),
                _ => sweep_rows::<SWEEP_SCALED, C>(&blocks, acts, b, &shifts, &mut acc, 0),
            };
            sweep_rows::<1, C>(&blocks, acts, b, &shifts, &mut acc, rows);
        }
        for (i, acc) in acc.iter().enumerate() {
            for (g, &acc) in acc.iter().enumerate() {
                _mm512_storeu_ps(lanes.as_mut_ptr().add(PANEL * g), acc);
            }
            out(i, first, &lanes[..n]);
        }
    }
}

/// Sweeps super-block `b` of every activation row from `from` on, `R` rows at a time, over the
/// decoded `blocks` (`shifts` as in [`panels`]); returns the first row it left (fewer than `R`
/// remain).
///
/// # Safety
/// As [`panels`].
#[inline(always)]
unsafe fn sweep_rows<const R: usize, C: Panelled>(
    blocks: &[Block; GROUPS],
    acts: &[&[Q8KBlock]],
    b: usize,
    shifts: &[i32],
    acc: &mut [[__m512; GROUPS]],
    from: usize,
) -> usize {
    let mut i = from;
    while i + R <= acts.len() {
        let a: [&Q8KBlock; R] = std::array::from_fn(|r| acts[i + r].get_unchecked(b));
        let kb = acts[i].len();
        let sh: [i32; R] = std::array::from_fn(|r| match shifts.is_empty() {
            true => 0,
            false => shifts[(i + r) * kb + b],
        });
        let acc = &mut *acc.as_mut_ptr().add(i).cast::<[[__m512; GROUPS]; R]>();
        sweep::<R, C>(blocks, a, sh, acc);
        i += R;
    }
    i
}

/// Decodes super-block `b` of the `n` rows from `first` (of `row_stride` bytes at `data`)
/// into `block` (rows past `n` zero).
///
/// # Safety
/// As [`panels`].
#[inline(always)]
unsafe fn decode<C: Panelled>(
    block: &mut Block,
    data: *const u8,
    row_stride: usize,
    first: usize,
    n: usize,
    b: usize,
) {
    let mut q = [[_mm256_setzero_si256(); PANEL]; CHUNKS];
    for r in 0..n {
        let row = data.add((first + r) * row_stride);
        _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(C::BYTES * b + PREFETCH_AHEAD).cast());
        // Only the quants are used (the scalar scale decoding is dead code here).
        let dec = C::block(row, b);
        for c in 0..CHUNKS {
            q[c][r] = dec.q[c];
        }
    }
    let at = data.add(first * row_stride + C::BYTES * b);
    let stride = row_stride as i32;
    let offsets = _mm512_mullo_epi32(
        _mm512_set1_epi32(stride),
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
    );
    let lanes = C::lanes(at, offsets, ((1u32 << n) - 1) as __mmask16);
    for (c, q) in q.iter().enumerate() {
        let [lo, hi]: [[__m256i; 8]; 2] =
            std::array::from_fn(|g| std::array::from_fn(|r| q[8 * g + r]));
        let (lo, hi) = (transpose(lo), transpose(hi));
        for j in 0..WORDS {
            // Words 0..4 are the chunk's first 16-element half, 4..8 its second.
            let h = 2 * c + j / 4;
            let w = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo[j]), hi[j]);
            let s = lanes.scales[h];
            block.packed[c * WORDS + j] = match (C::SCALE_WORDS, C::MIN) {
                (0, true) => scaled_q2(w, s),
                (0, false) => shifted_q3(w, s, lanes.bias[h]),
                _ => w,
            };
        }
    }
    block.scales = lanes.scales;
    block.mins = lanes.mins;
    block.d = lanes.d;
    block.dmin = lanes.dmin;
}

/// Adds the decoded blocks' value for each of the `R` activation blocks `a` to their
/// accumulators `acc` (one per row and group; `shifts`: Q3_K's `128 A` of each block, zero for
/// the others).
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VNNI.
#[inline(always)]
unsafe fn sweep<const R: usize, C: Panelled>(
    blocks: &[Block; GROUPS],
    a: [&Q8KBlock; R],
    shifts: [i32; R],
    acc: &mut [[__m512; GROUPS]; R],
) {
    // One integer chain per row and group (any order is exact). Q3_K starts at `-128 A`, so
    // the sum is `-sumi`.
    let mut s = [[_mm512_setzero_si512(); GROUPS]; R];
    if !C::MIN && C::SCALE_WORDS == 0 {
        for r in 0..R {
            s[r] = [_mm512_set1_epi32(-shifts[r]); GROUPS];
        }
    }
    // Activation word `k` (of four bytes) of row `r`, in every lane.
    let y = |r: usize, k: usize| {
        let q = a[r].qs.as_ptr().cast::<i32>();
        _mm512_set1_epi32(q.add(k).read_unaligned())
    };
    // Runtime loops over the words (not unrolled): each iteration is one small block of
    // loads, broadcasts and `vpdpbusd` on the R x GROUPS accumulators, which the compiler keeps
    // in registers; fully unrolled, its scheduler interleaved the rows' chains and spilled.
    let words = std::hint::black_box(CHUNKS * WORDS);
    if C::SCALE_WORDS == 0 {
        for k in 0..words {
            let w: [__m512i; GROUPS] = std::array::from_fn(|g| blocks[g].packed[k]);
            for r in 0..R {
                let y = y(r, k);
                for g in 0..GROUPS {
                    s[r][g] = _mm512_dpbusd_epi32(s[r][g], w[g], y);
                }
            }
        }
    } else {
        // Q4_K..Q6_K: the words' exact sum (within i16) times their half's scale.
        for k0 in (0..words).step_by(C::SCALE_WORDS) {
            let mut t = [[_mm512_setzero_si512(); GROUPS]; R];
            for k in k0..k0 + C::SCALE_WORDS {
                let w: [__m512i; GROUPS] = std::array::from_fn(|g| blocks[g].packed[k]);
                for r in 0..R {
                    let y = y(r, k);
                    for g in 0..GROUPS {
                        t[r][g] = _mm512_dpbusd_epi32(t[r][g], w[g], y);
                    }
                }
            }
            // Words 4h..4h + 4 are half h.
            for g in 0..GROUPS {
                let scale = blocks[g].scales[k0 / 4];
                for r in 0..R {
                    s[r][g] = dpwssd(s[r][g], t[r][g], scale);
                }
            }
        }
    }
    for r in 0..R {
        let ad = _mm512_set1_ps(a[r].d);
        let sums = a[r].bsums.as_ptr().cast::<i32>();
        for g in 0..GROUPS {
            let block = &blocks[g];
            let sum = s[r][g];
            let (sumi, summ) = match C::MIN {
                true => {
                    let mut m = _mm512_setzero_si512();
                    for k in 0..HALVES / 2 {
                        let bs = _mm512_set1_epi32(sums.add(k).read_unaligned());
                        m = dpwssd(m, block.mins[k], bs);
                    }
                    (sum, m)
                }
                false if C::SCALE_WORDS == 0 => (
                    _mm512_sub_epi32(_mm512_setzero_si512(), sum),
                    _mm512_setzero_si512(),
                ),
                // Q6_K: the offset through the group sums, `sumi - 32 * sum_g scale_g * bsum_g`.
                false => {
                    let mut m = _mm512_setzero_si512();
                    for k in 0..HALVES / 2 {
                        let bs = _mm512_set1_epi32(sums.add(k).read_unaligned());
                        m = dpwssd(m, block.mins[k], bs);
                    }
                    let offset = _mm512_mullo_epi32(m, _mm512_set1_epi32(C::OFFSET));
                    (_mm512_sub_epi32(sum, offset), _mm512_setzero_si512())
                }
            };
            // `block_value`, lane by lane: (d * ad) * sumi - (dmin * ad) * summ.
            let t = _mm512_mul_ps(_mm512_mul_ps(block.d, ad), _mm512_cvtepi32_ps(sumi));
            let m = _mm512_mul_ps(_mm512_mul_ps(block.dmin, ad), _mm512_cvtepi32_ps(summ));
            acc[r][g] = _mm512_add_ps(acc[r][g], _mm512_sub_ps(t, m));
        }
    }
}

#[cfg(test)]
#[path = "avx512_panel_tests.rs"]
mod tests;
