//! The multi-row GEMM kernel of Q2_K and Q3_K on AVX-512 (F, BW, VNNI): the zmm form of
//! [`super::avx2_panel`], with each weight pre-multiplied by its 16-element group's scale so
//! that one `vpdpbusd` per four weights of sixteen rows gives the scaled sums directly.
//!
//! A task's weight rows are taken sixteen at a time (a panel): every super-block of the
//! sixteen rows is decoded once (the AVX2 panel's [`KCodec`] decoders) and transposed, so one
//! zmm holds four consecutive weights of each of the sixteen rows, and each weight byte is
//! replaced by an unsigned byte that already carries its group's scale:
//! - Q2_K: `scale * q` (`0..=15 * 0..=3`, at most 45): one `vpmullw` of the 16-bit pairs by
//!   the lane's scale (no carry crosses a byte). Summed against the int8 activations that is
//!   the one-row kernels' `sumi`; the min term `summ` is `vpdpwssd` of the mins with the
//!   activation's `bsums`.
//! - Q3_K: `(4 - q) * scale + 128` (`q` the 3-bit weight `0..=7`, `scale` `-32..=31`, so the
//!   product is `-128..=124` and the byte `0..=252`). Summed against the activations that is
//!   `-sumi + 128 A` (`A` the block's activation sum): `sumi` (its `- 4 * offset` included) is
//!   `128 A` less the sum, no `bsums` term left.
//!
//! Then every activation row sweeps the panel, four rows at a time: per super-block, 64
//! `vpdpbusd` with four activation bytes broadcast (two accumulator chains per row) give the
//! sixteen rows' exact integers in sixteen lanes. Both are the exact integers of the one-row
//! kernels ([`super::scalar`]), and each lane combines them with [`super::block_value`]'s f32
//! operations in its order (`acc += (d * ad) * sumi - (dmin * ad) * summ`, block by block from
//! 0), so the outputs equal the one-row, four-row and AVX2-panel kernels' bit for bit.

// The panel's chunks, rows and lanes are indexed in lockstep.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;
use std::ops::Range;

use super::activation::{Q8KBlock, QK_K};
use super::avx2_panel::{KCodec, Q2K, Q3K, Q4K, Q5K};
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

/// Calls of at least this many activation rows take the kernel (see [`takes`]).
pub const MIN_ROWS: usize = 16;

/// Whether `format` has a kernel here (Q2_K and Q3_K: their scaled weights fit a byte).
pub fn handles(format: KFormat) -> bool {
    matches!(
        format,
        KFormat::Q2K | KFormat::Q3K | KFormat::Q4K | KFormat::Q5K
    )
}

/// A k-quant the panel runs: [`KCodec`] plus how its scales are applied.
trait Panelled: KCodec {
    /// Words whose `vpdpbusd` sums are added up before `vpdpwssd` multiplies them by their
    /// scale (their sum must fit an i16: Q4_K four, `16 * 15 * 128 < 2^15`; Q5_K two,
    /// `8 * 31 * 128 < 2^15`); 0 for the formats whose bytes carry their scale (Q2_K, Q3_K).
    const SCALE_WORDS: usize;
}

impl Panelled for Q2K {
    const SCALE_WORDS: usize = 0;
}
impl Panelled for Q3K {
    const SCALE_WORDS: usize = 0;
}
impl Panelled for Q4K {
    const SCALE_WORDS: usize = 4;
}
impl Panelled for Q5K {
    const SCALE_WORDS: usize = 2;
}

/// Whether a call of `m` activation rows of `format` runs here under `kernel`: from
/// [`MIN_ROWS`] rows of Q2_K / Q3_K where the k-quant tiles' path is AVX-512 (on AMX CPUs too:
/// the AMX GEMM has no Q2_K / Q3_K kernel). Bit for bit the tiles' and AVX2 panel's result.
pub fn takes(kernel: Kernel, format: KFormat, m: usize) -> bool {
    m >= MIN_ROWS && handles(format) && Path::detect(kernel) == Some(Path::Avx512)
}

/// Activation rows per task of a call [`takes`] (the tiled matmul's default is 64): the
/// decoding of a panel's block is shared by all of them, the block (4.5 KiB) and their
/// activation blocks (`TASK_ROWS * 292` bytes) stay in L1.
pub const TASK_ROWS: usize = 256;

/// Activation rows per task of a call of `m` rows of `format` under `kernel`: [`TASK_ROWS`]
/// where [`takes`] it, `None` where not.
pub fn task_rows(kernel: Kernel, format: KFormat, m: usize) -> Option<usize> {
    takes(kernel, format, m).then_some(TASK_ROWS)
}

/// Computes `acts[i] . W[r]` for every activation row `i` of `acts` and weight row `r` in
/// `weights` of the `format` matrix `data` (`row_stride` bytes per row), handing them out as
/// `out(i, r0, values of rows r0..)`; returns whether it did (Q2_K and Q3_K only).
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
            KFormat::Q6K => return false,
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
    /// The mins of groups `2 k, 2 k + 1` (two i16 per lane) at `[k]` (Q2_K, Q4_K, Q5_K).
    mins: [__m512i; HALVES / 2],
    /// Q4_K / Q5_K: half h's scale (the low i16 of each lane, the high one 0) at `[h]`.
    scales: [__m512i; HALVES],
    /// `d` and `dmin` of the sixteen rows.
    d: __m512,
    dmin: __m512,
}

/// Two i16 as the halves of one u32 (`lo` in the low half).
#[inline(always)]
fn pair(lo: i16, hi: i16) -> u32 {
    u32::from(lo as u16) | (u32::from(hi as u16) << 16)
}

/// The sixteen u32 of `v` as a zmm.
#[inline(always)]
unsafe fn lanes_u32(v: &[u32; PANEL]) -> __m512i {
    _mm512_loadu_si512(v.as_ptr().cast())
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

/// Rows per sweep of a decoded block.
const SWEEP: usize = 4;

/// # Safety
/// The CPU must have AVX-512 F, BW, VNNI and AVX2, FMA, F16C; rows `weights` of `row_stride`
/// bytes at `data` must each hold `acts[0].len()` super-blocks and every row of `acts` as many
/// ([`checked_blocks`]); `C` is Q2_K (`C::MIN`) or Q3_K.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn panels<C: Panelled>(args: Args<'_, '_>) {
    let (data, row_stride, weights, acts, out) = args;
    let kb = acts[0].len();
    let m = acts.len();
    let mut block = Block {
        packed: [_mm512_setzero_si512(); CHUNKS * WORDS],
        mins: [_mm512_setzero_si512(); HALVES / 2],
        scales: [_mm512_setzero_si512(); HALVES],
        d: _mm512_setzero_ps(),
        dmin: _mm512_setzero_ps(),
    };
    // Q3_K: `128 A` of each activation row's blocks (`A` the block's activation sum), at
    // `[i * kb + b]`.
    let shifts: Vec<i32> = match C::MIN {
        true => vec![0; m * kb],
        false => acts
            .iter()
            .flat_map(|a| a.iter())
            .map(|blk| 128 * blk.bsums.iter().map(|&s| i32::from(s)).sum::<i32>())
            .collect(),
    };
    let mut acc = vec![_mm512_setzero_ps(); m];
    let mut lanes = [0f32; PANEL];
    for first in weights.clone().step_by(PANEL) {
        let n = (weights.end - first).min(PANEL);
        acc.fill(_mm512_setzero_ps());
        // Block-outer: one decoded block (4.5 KiB) stays in L1 while every activation row
        // adds its value, block after block, to its accumulator (the lanes' order of
        // `block_value`s is the one-row kernels').
        for b in 0..kb {
            decode::<C>(&mut block, data, row_stride, first, n, b);
            let mut i = 0;
            while i + SWEEP <= m {
                let a: [&Q8KBlock; SWEEP] = std::array::from_fn(|r| acts[i + r].get_unchecked(b));
                let sh: [i32; SWEEP] = std::array::from_fn(|r| shifts[(i + r) * kb + b]);
                let acc = &mut *acc.as_mut_ptr().add(i).cast::<[__m512; SWEEP]>();
                sweep::<SWEEP, C>(&block, a, sh, acc);
                i += SWEEP;
            }
            for i in i..m {
                let acc = &mut *acc.as_mut_ptr().add(i).cast::<[__m512; 1]>();
                sweep::<1, C>(
                    &block,
                    [acts[i].get_unchecked(b)],
                    [shifts[i * kb + b]],
                    acc,
                );
            }
        }
        for (i, &acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(lanes.as_mut_ptr(), acc);
            out(i, first, &lanes[..n]);
        }
    }
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
    let mut scales = [[0u32; PANEL]; HALVES];
    let mut bias = [[0u32; PANEL]; HALVES];
    let mut mins = [[0u32; PANEL]; HALVES / 2];
    let (mut d, mut dmin) = ([0f32; PANEL], [0f32; PANEL]);
    for r in 0..n {
        let row = data.add((first + r) * row_stride);
        _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(C::BYTES * b + PREFETCH_AHEAD).cast());
        let dec = C::block(row, b);
        for c in 0..CHUNKS {
            q[c][r] = dec.q[c];
        }
        (d[r], dmin[r]) = (dec.d, dec.dmin);
        for (h, &s) in dec.scales.iter().enumerate() {
            scales[h][r] = match C::SCALE_WORDS {
                0 => pair(s, s),
                _ => pair(s, 0),
            };
            bias[h][r] = u32::from((128 + 4 * s) as u8) * 0x0101_0101;
        }
        if C::MIN {
            for k in 0..HALVES / 2 {
                mins[k][r] = pair(dec.groups[2 * k], dec.groups[2 * k + 1]);
            }
        }
    }
    for (c, q) in q.iter().enumerate() {
        let [lo, hi]: [[__m256i; 8]; 2] =
            std::array::from_fn(|g| std::array::from_fn(|r| q[8 * g + r]));
        let (lo, hi) = (transpose(lo), transpose(hi));
        for j in 0..WORDS {
            // Words 0..4 are the chunk's first 16-element half, 4..8 its second.
            let h = 2 * c + j / 4;
            let w = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo[j]), hi[j]);
            let s = lanes_u32(&scales[h]);
            block.packed[c * WORDS + j] = match (C::SCALE_WORDS, C::MIN) {
                (0, true) => scaled_q2(w, s),
                (0, false) => shifted_q3(w, s, lanes_u32(&bias[h])),
                _ => w,
            };
        }
    }
    if C::SCALE_WORDS > 0 {
        for h in 0..HALVES {
            block.scales[h] = lanes_u32(&scales[h]);
        }
    }
    if C::MIN {
        for k in 0..HALVES / 2 {
            block.mins[k] = lanes_u32(&mins[k]);
        }
    }
    block.d = _mm512_loadu_ps(d.as_ptr());
    block.dmin = _mm512_loadu_ps(dmin.as_ptr());
}

/// Adds the decoded block's value for each of the `R` activation blocks `a` to their sixteen
/// accumulators `acc` (`shifts`: Q3_K's `128 A` of each block, zero for Q2_K).
///
/// # Safety
/// The CPU must have AVX-512 F, BW, VNNI.
#[inline(always)]
unsafe fn sweep<const R: usize, C: Panelled>(
    block: &Block,
    a: [&Q8KBlock; R],
    shifts: [i32; R],
    acc: &mut [__m512; R],
) {
    // Two chains per row (integer sums: any order is exact). Q3_K starts at `-128 A`, so the
    // sum is `-sumi`.
    let mut s0 = [_mm512_setzero_si512(); R];
    let mut s1 = [_mm512_setzero_si512(); R];
    if !C::MIN {
        for r in 0..R {
            s0[r] = _mm512_set1_epi32(-shifts[r]);
        }
    }
    for c in 0..CHUNKS {
        let w: [__m512i; WORDS] = std::array::from_fn(|j| block.packed[c * WORDS + j]);
        for r in 0..R {
            let q = a[r].qs.as_ptr().add(32 * c).cast::<i32>();
            let y = |j: usize| _mm512_set1_epi32(q.add(j).read_unaligned());
            if C::SCALE_WORDS == 0 {
                for j in (0..WORDS).step_by(2) {
                    s0[r] = _mm512_dpbusd_epi32(s0[r], w[j], y(j));
                    s1[r] = _mm512_dpbusd_epi32(s1[r], w[j + 1], y(j + 1));
                }
                continue;
            }
            // Q4_K / Q5_K: the words' exact sum (within i16) times their half's scale.
            for start in (0..WORDS).step_by(C::SCALE_WORDS) {
                let mut t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[start], y(start));
                for j in start + 1..start + C::SCALE_WORDS {
                    t = _mm512_dpbusd_epi32(t, w[j], y(j));
                }
                let scale = block.scales[2 * c + start / 4];
                match start / C::SCALE_WORDS % 2 {
                    0 => s0[r] = _mm512_dpwssd_epi32(s0[r], t, scale),
                    _ => s1[r] = _mm512_dpwssd_epi32(s1[r], t, scale),
                }
            }
        }
    }
    for r in 0..R {
        let sum = _mm512_add_epi32(s0[r], s1[r]);
        let (sumi, summ) = match C::MIN {
            true => {
                let sums = a[r].bsums.as_ptr().cast::<i32>();
                let mut g = _mm512_setzero_si512();
                for k in 0..HALVES / 2 {
                    let bs = _mm512_set1_epi32(sums.add(k).read_unaligned());
                    g = _mm512_dpwssd_epi32(g, block.mins[k], bs);
                }
                (sum, g)
            }
            false => (
                _mm512_sub_epi32(_mm512_setzero_si512(), sum),
                _mm512_setzero_si512(),
            ),
        };
        // `block_value`, lane by lane: (d * ad) * sumi - (dmin * ad) * summ.
        let ad = _mm512_set1_ps(a[r].d);
        let t = _mm512_mul_ps(_mm512_mul_ps(block.d, ad), _mm512_cvtepi32_ps(sumi));
        let m = _mm512_mul_ps(_mm512_mul_ps(block.dmin, ad), _mm512_cvtepi32_ps(summ));
        acc[r] = _mm512_add_ps(acc[r], _mm512_sub_ps(t, m));
    }
}

#[cfg(test)]
#[path = "avx512_panel_tests.rs"]
mod tests;
