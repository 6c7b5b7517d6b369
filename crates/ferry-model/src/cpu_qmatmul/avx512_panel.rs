//! The multi-row GEMM kernel of the AVX-512 path (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS,
//! MXFP4): a prompt's matmul computed as int8 outer products instead of one dot product per
//! output.
//!
//! A task's weight rows are taken 64 at a time (a panel, four blocks of sixteen): every block
//! of the panel's rows is decoded once ([`super::avx512::Codec`]: 32 unsigned bytes and a
//! scale; Q5_0 / Q5_1 merge their high bits from `qh` into the nibbles there), sixteen rows at
//! a time transposed in registers, so one 512-bit register holds four consecutive weights of
//! each of sixteen rows. Then the task's activation rows (up to
//! [`super::tile::GEMM_TASK_ROWS`]) sweep the panel three at a time, four blocks (a chunk,
//! 8 KiB, kept in L1) at a time: per block, eight
//! broadcast activation words, each meeting the four weight registers by `vpdpbusd`, give the
//! 64 rows' exact integer block sums in lanes (no horizontal sums), and one FMA per block and
//! register adds `sumi * (d * a.d)` to the row's outputs. That is, lane for lane, the
//! arithmetic of the one-row kernel in [`super::avx512`], so the outputs are equal to it bit
//! for bit.
//!
//! The decoding (the only format-specific step) costs one pass over the panel's weights per
//! task, shared by all of the task's activation rows. Sharing each broadcast between four
//! registers (one broadcast per `vpdpbusd` held the instruction to about half its rate) made
//! the sweep 1.4-1.5x as fast (5632 x 2048, 512 rows, IQ4_XS / Q4_0 / Q5_0).

use std::arch::x86_64::*;
use std::ops::Range;

use super::activation::Q8Block;
use super::avx2_panel::transpose;
use super::avx512::{row_bytes, Avx512, Codec, Iq4Nl, Iq4Xs, Mxfp4, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use super::tile::checked_blocks;
use super::Format;

/// Weight rows per block of a panel (the lanes of one register of i32).
const PANEL: usize = 16;
/// Sixteen-row blocks per panel: each broadcast activation word meets this many weight
/// registers (a broadcast per `vpdpbusd` holds the instruction to about half its rate, see
/// [`super::kquants::avx512_panel`]).
const GROUPS: usize = 4;
/// Weight rows per panel (the tiled matmul hands out weight ranges in multiples of it).
pub const PANEL_ROWS: usize = PANEL * GROUPS;
/// Activation rows per sweep (twelve block sums, each a chain of eight `vpdpbusd` per block,
/// and twelve accumulators; two rows, eight chains, measured 4-13 % slower).
const SWEEP: usize = 3;
/// Blocks per chunk: a chunk's decoded weights (2 KiB a block) stay in L1 while the task's
/// activation rows sweep it.
const CHUNK_BLOCKS: usize = 4;
/// 32-bit words per decoded block (32 bytes).
const WORDS: usize = 8;

/// Computes `acts[i] . W[r]` for every activation row `i` of `acts` and weight row `r` in
/// `weights` of the `format` matrix `data` (`row_stride` bytes per row), when `format` has a
/// kernel here, handing them out as `out(i, r0, values of rows r0..)`; returns whether it did.
pub(super) fn run(
    k: Avx512,
    format: Format,
    data: &[u8],
    row_stride: usize,
    weights: Range<usize>,
    acts: &[&[Q8Block]],
    out: &mut dyn FnMut(usize, usize, &[f32]),
) -> bool {
    let _ = k;
    if !Avx512::supports(format) || acts.is_empty() || weights.is_empty() {
        return false;
    }
    checked_blocks(
        acts,
        data,
        row_stride,
        &weights,
        |kb| row_bytes(format, kb),
        &format,
    );
    // SAFETY: `k` proves the CPU features; the asserts bound every read of `data`.
    unsafe {
        let data = data.as_ptr();
        match format {
            Format::Q4_0 => panels::<Q4_0>(data, row_stride, weights, acts, out),
            Format::Q4_1 => panels::<Q4_1>(data, row_stride, weights, acts, out),
            Format::Q5_0 => panels::<Q5_0>(data, row_stride, weights, acts, out),
            Format::Q5_1 => panels::<Q5_1>(data, row_stride, weights, acts, out),
            Format::Q8_0 => panels::<Q8_0>(data, row_stride, weights, acts, out),
            Format::IQ4_NL => panels::<Iq4Nl>(data, row_stride, weights, acts, out),
            Format::IQ4_XS => panels::<Iq4Xs>(data, row_stride, weights, acts, out),
            Format::MXFP4 => panels::<Mxfp4>(data, row_stride, weights, acts, out),
            _ => return false,
        }
    }
    true
}

/// # Safety
/// The CPU must have the features of [`Avx512`]; rows `weights` of `row_stride` bytes at
/// `data` must each hold `acts[0].len()` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn panels<C: Codec>(
    data: *const u8,
    row_stride: usize,
    weights: Range<usize>,
    acts: &[&[Q8Block]],
    out: &mut dyn FnMut(usize, usize, &[f32]),
) {
    let kb = acts[0].len();
    // Block b's word w of lane (row) r at [(b * WORDS + w) * PANEL_ROWS + r]; scales at
    // [b * PANEL_ROWS + r].
    let mut packed = vec![0u32; kb * WORDS * PANEL_ROWS];
    let mut scales = vec![0f32; kb * PANEL_ROWS];
    let mut mins = vec![0f32; if C::MIN { kb * PANEL_ROWS } else { 0 }];
    let mut lanes = [0f32; PANEL_ROWS];
    let mut acc = vec![[_mm512_setzero_ps(); GROUPS]; acts.len()];
    for first in weights.clone().step_by(PANEL_ROWS) {
        let n = (weights.end - first).min(PANEL_ROWS);
        if n < PANEL_ROWS {
            packed.fill(0);
            scales.fill(0.0);
            mins.fill(0.0);
        }
        for g in 0..n.div_ceil(PANEL) {
            let rows = (n - PANEL * g).min(PANEL);
            let at = data.add((first + PANEL * g) * row_stride);
            decode::<C>(
                at,
                row_stride,
                rows,
                kb,
                &mut packed,
                &mut scales,
                &mut mins,
                g,
            );
        }
        // Chunk-outer: a chunk's decoded blocks (8 KiB) stay in L1 while every activation row
        // adds their value to its accumulators (the lanes' order of block terms is the one-row
        // kernel's).
        acc.fill([_mm512_setzero_ps(); GROUPS]);
        for chunk in (0..kb).step_by(CHUNK_BLOCKS) {
            let blocks = chunk..(chunk + CHUNK_BLOCKS).min(kb);
            let mut i = 0;
            while i + SWEEP <= acts.len() {
                // A loop, not `from_fn`: its closure was left a call (and a `vzeroupper`).
                let mut rows: [&[Q8Block]; SWEEP] = [&[]; SWEEP];
                for (r, row) in rows.iter_mut().enumerate() {
                    *row = acts[i + r];
                }
                let acc = &mut *acc.as_mut_ptr().add(i).cast::<[[__m512; GROUPS]; SWEEP]>();
                sweep::<SWEEP, C>(&packed, &scales, &mins, rows, blocks.clone(), acc);
                i += SWEEP;
            }
            for (i, &a) in acts.iter().enumerate().skip(i) {
                let acc = &mut *acc.as_mut_ptr().add(i).cast::<[[__m512; GROUPS]; 1]>();
                sweep::<1, C>(&packed, &scales, &mins, [a], blocks.clone(), acc);
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            for (g, &acc) in acc.iter().enumerate() {
                _mm512_storeu_ps(lanes.as_mut_ptr().add(PANEL * g), acc);
            }
            out(i, first, &lanes[..n]);
        }
    }
}

/// Decodes the `rows` (at most sixteen) rows of `row_stride` bytes at `at` into block `g` of the
/// panel (`packed`, `scales`, `mins` as in [`panels`]), every one of their `kb` blocks: the
/// sixteen rows' blocks transposed in registers, so each word of sixteen lanes is one store.
///
/// # Safety
/// As [`panels`]; the buffers hold `kb` blocks of the panel.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn decode<C: Codec>(
    at: *const u8,
    row_stride: usize,
    rows: usize,
    kb: usize,
    packed: &mut [u32],
    scales: &mut [f32],
    mins: &mut [f32],
    g: usize,
) {
    debug_assert!(packed.len() >= kb * WORDS * PANEL_ROWS && rows <= PANEL);
    let lane0 = PANEL * g;
    for b in 0..kb {
        let mut q = [_mm256_setzero_si256(); PANEL];
        for (r, q) in q.iter_mut().enumerate().take(rows) {
            let row = at.add(r * row_stride);
            let (u, d) = C::block(row, b);
            *q = u;
            *scales.get_unchecked_mut(b * PANEL_ROWS + lane0 + r) = d;
            if C::MIN {
                *mins.get_unchecked_mut(b * PANEL_ROWS + lane0 + r) = C::min(row, b);
            }
        }
        let lo = transpose(std::array::from_fn(|r| q[r]));
        let hi = transpose(std::array::from_fn(|r| q[8 + r]));
        for j in 0..WORDS {
            let w = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo[j]), hi[j]);
            let to = packed
                .as_mut_ptr()
                .add((b * WORDS + j) * PANEL_ROWS + lane0);
            _mm512_storeu_si512(to.cast(), w);
        }
    }
}

/// Adds blocks `blocks` of each of the `R` activation rows `a` against a decoded panel to the
/// rows' 64 accumulators (four registers) `acc`.
///
/// # Safety
/// The CPU must have the features of [`Avx512`]; `packed` and `scales` hold `a[0].len()`
/// blocks (see [`panels`]).
#[inline(always)]
unsafe fn sweep<const R: usize, C: Codec>(
    packed: &[u32],
    scales: &[f32],
    mins: &[f32],
    a: [&[Q8Block]; R],
    blocks: Range<usize>,
    out: &mut [[__m512; GROUPS]; R],
) {
    let offset = C::OFFSET;
    let kb = a[0].len();
    debug_assert!(packed.len() >= kb * WORDS * PANEL_ROWS && scales.len() >= kb * PANEL_ROWS);
    debug_assert!(blocks.end <= kb);
    let mut acc = *out;
    for b in blocks {
        let base = packed.as_ptr().add(b * WORDS * PANEL_ROWS);
        let blk: [&Q8Block; R] = std::array::from_fn(|r| a[r].get_unchecked(b));
        // Each block sum starts at the offset correction: integer sums are exact, so
        // sum(u * a) - offset * sum(a) in any order is the block's dot product.
        let mut s: [[__m512i; GROUPS]; R] =
            std::array::from_fn(|r| [_mm512_set1_epi32(-offset * blk[r].isum); GROUPS]);
        for j in 0..WORDS {
            let w: [__m512i; GROUPS] = std::array::from_fn(|g| {
                _mm512_loadu_si512(base.add(j * PANEL_ROWS + g * PANEL).cast())
            });
            for r in 0..R {
                let q = blk[r].qs.as_ptr().cast::<i32>();
                let y = _mm512_set1_epi32(q.add(j).read_unaligned());
                for g in 0..GROUPS {
                    s[r][g] = _mm512_dpbusd_epi32(s[r][g], w[g], y);
                }
            }
        }
        for g in 0..GROUPS {
            let at = b * PANEL_ROWS + g * PANEL;
            let ws = _mm512_loadu_ps(scales.as_ptr().add(at));
            let wm = match C::MIN {
                true => _mm512_loadu_ps(mins.as_ptr().add(at)),
                false => _mm512_setzero_ps(),
            };
            for r in 0..R {
                let sumi = _mm512_cvtepi32_ps(s[r][g]);
                let scale = _mm512_mul_ps(ws, _mm512_set1_ps(blk[r].d));
                acc[r][g] = _mm512_fmadd_ps(sumi, scale, acc[r][g]);
                if C::MIN {
                    acc[r][g] = _mm512_fmadd_ps(wm, _mm512_set1_ps(blk[r].s), acc[r][g]);
                }
            }
        }
    }
    *out = acc;
}
