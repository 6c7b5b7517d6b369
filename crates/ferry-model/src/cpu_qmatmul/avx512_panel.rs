//! The multi-row GEMM kernel of the AVX-512 path (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS,
//! MXFP4): a prompt's matmul computed as int8 outer products instead of one dot product per
//! output.
//!
//! A task's weight rows are taken sixteen at a time (a panel): every block of the sixteen
//! rows is decoded once ([`super::avx512::Codec`]: 32 unsigned bytes and a scale; Q5_0 / Q5_1
//! merge their high bits from `qh` into the nibbles there) and stored
//! transposed, so one 512-bit register holds four consecutive weights of each of the sixteen
//! rows. Then every activation row sweeps the panel, four rows at a time: per block, eight
//! `vpdpbusd` with four activation bytes broadcast give the sixteen rows' exact integer block
//! sums in sixteen lanes (no horizontal sums), and one FMA per block adds
//! `sumi * (d * a.d)` to the row's sixteen outputs. That is, lane for lane, the arithmetic of
//! the one-row kernel in [`super::avx512`], so the outputs are equal to it bit for bit.
//!
//! The decoding (the only format-specific step) costs one pass over the panel's weights per
//! task, shared by all of the task's activation rows; the sweep costs about twelve
//! instructions per 512 multiply-adds.

use std::arch::x86_64::*;
use std::ops::Range;

use super::activation::Q8Block;
use super::avx512::{row_bytes, Avx512, Codec, Iq4Nl, Iq4Xs, Mxfp4, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use super::tile::checked_blocks;
use super::Format;

/// Weight rows per panel (the lanes of one register of i32).
const PANEL: usize = 16;
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
    // Block b's word w of lane (row) r at [(b * WORDS + w) * PANEL + r]; scales at [b * PANEL + r].
    let mut packed = vec![0u32; kb * WORDS * PANEL];
    let mut scales = vec![0f32; kb * PANEL];
    let mut mins = vec![0f32; if C::MIN { kb * PANEL } else { 0 }];
    let mut lanes = [0f32; PANEL];
    for first in weights.clone().step_by(PANEL) {
        let n = (weights.end - first).min(PANEL);
        if n < PANEL {
            packed.fill(0);
            scales.fill(0.0);
            mins.fill(0.0);
        }
        for r in 0..n {
            let row = data.add((first + r) * row_stride);
            let mut words = [0u32; WORDS];
            for b in 0..kb {
                let (u, d) = C::block(row, b);
                _mm256_storeu_si256(words.as_mut_ptr().cast(), u);
                for (w, &word) in words.iter().enumerate() {
                    packed[(b * WORDS + w) * PANEL + r] = word;
                }
                scales[b * PANEL + r] = d;
                if C::MIN {
                    mins[b * PANEL + r] = C::min(row, b);
                }
            }
        }
        let mut emit = |i: usize, acc: __m512| {
            _mm512_storeu_ps(lanes.as_mut_ptr(), acc);
            out(i, first, &lanes[..n]);
        };
        let mut i = 0;
        while i + 4 <= acts.len() {
            let acc = sweep::<4, C>(
                &packed,
                &scales,
                &mins,
                [acts[i], acts[i + 1], acts[i + 2], acts[i + 3]],
            );
            for (di, acc) in acc.into_iter().enumerate() {
                emit(i + di, acc);
            }
            i += 4;
        }
        for (i, &a) in acts.iter().enumerate().skip(i) {
            let [acc] = sweep::<1, C>(&packed, &scales, &mins, [a]);
            emit(i, acc);
        }
    }
}

/// The sixteen outputs of each of the `R` activation rows `a` against a decoded panel.
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
) -> [__m512; R] {
    let offset = C::OFFSET;
    let kb = a[0].len();
    debug_assert!(packed.len() >= kb * WORDS * PANEL && scales.len() >= kb * PANEL);
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..kb {
        let base = packed.as_ptr().add(b * WORDS * PANEL);
        let w: [__m512i; WORDS] =
            std::array::from_fn(|j| _mm512_loadu_si512(base.add(j * PANEL).cast()));
        let ws = _mm512_loadu_ps(scales.as_ptr().add(b * PANEL));
        let wm = match C::MIN {
            true => _mm512_loadu_ps(mins.as_ptr().add(b * PANEL)),
            false => _mm512_setzero_ps(),
        };
        for r in 0..R {
            let blk = a[r].get_unchecked(b);
            let q = blk.qs.as_ptr().cast::<i32>();
            // The block sum starts at the offset correction: integer sums are exact, so
            // sum(u * a) - offset * sum(a) in any order is the block's dot product.
            let mut s0 = _mm512_set1_epi32(-offset * blk.isum);
            let mut s1 = _mm512_setzero_si512();
            for j in (0..WORDS).step_by(2) {
                let y0 = _mm512_set1_epi32(q.add(j).read_unaligned());
                let y1 = _mm512_set1_epi32(q.add(j + 1).read_unaligned());
                s0 = _mm512_dpbusd_epi32(s0, w[j], y0);
                s1 = _mm512_dpbusd_epi32(s1, w[j + 1], y1);
            }
            let sumi = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
            let scale = _mm512_mul_ps(ws, _mm512_set1_ps(blk.d));
            acc[r] = _mm512_fmadd_ps(sumi, scale, acc[r]);
            if C::MIN {
                acc[r] = _mm512_fmadd_ps(wm, _mm512_set1_ps(blk.s), acc[r]);
            }
        }
    }
    acc
}
