//! The AMX prompt GEMM for the 32-element block formats (Q4_0, Q4_1, Q8_0, IQ4_NL, IQ4_XS,
//! MXFP4): the integer block sums of sixteen weight rows times sixteen activation rows in one
//! tile multiply, scaled and summed in AVX-512 registers.
//!
//! A task's activation rows are packed once, sixteen at a time, into the second-operand layout
//! of a tile multiply ([`super::amx::pack_b`]'s layout: per 32-element block eight 64-byte
//! lines). Its weight rows are then taken sixteen at a time (a panel): every block of the
//! sixteen rows is decoded once to 32 *signed* bytes (the [`Codec`] bytes minus their offset,
//! so `tdpbssd` gives the exact integer block dot product with no offset correction) and kept
//! row major, 32 bytes per row, as the first operand. Per block, one `tdpbssd` fills a 16 x 16
//! tile of i32 sums `C[i][j]` (weight row `i`, activation row `j`); it is stored and every
//! weight row's sixteen sums are converted and added with one FMA,
//! `acc_i = fma(sumi, d_i * a.d, acc_i)` (Q4_1 then adds `fma(m_i, a.s, acc_i)`), lanes being
//! activation rows. That is, output for output, the float sequence of the AVX-512 one-row
//! kernel ([`super::avx512`]'s header) on the same integer sums, so the results equal it (and
//! [`super::avx512_panel`]) bit for bit. Four result tiles rotate, so block `b`'s multiply,
//! block `b - 2`'s tile store and the scaling of block `b - 3` overlap; at the end the
//! sixteen registers are transposed so each activation row's outputs are written as one run.

use std::arch::x86_64::*;
use std::ops::Range;

use super::activation::Q8Block;
use super::amx::{self, dot, load, store, zero, Amx, TileConfig};
use super::avx512::{row_bytes, Avx512, Codec, Iq4Nl, Iq4Xs, Mxfp4, Q4_0, Q4_1, Q8_0};
use super::tile::checked_blocks;
use super::Format;

/// Weight rows per panel and activation rows per group (a tile's rows and columns).
const LANES: usize = 16;
/// Bytes of one 32-element block of sixteen rows in either operand (16 x 32).
const BLOCK_BYTES: usize = LANES * 32;

/// Calls of at least this many activation rows take this kernel where it runs their format
/// (all of the call's rows, so one call never mixes kernels).
pub const AMX_MIN_ROWS: usize = 16;

/// Bytes of packed activations a task keeps (in L2) at most.
const TASK_ACT_BYTES: usize = 512 * 1024;

/// Activation rows per task for a call of `m` rows of `kb` blocks of `format` where the CPU
/// has AMX (`amx`), when this kernel takes the call: as many as keep the task's packed
/// activations within [`TASK_ACT_BYTES`] (64 to 256; a panel's decoding is shared by them).
pub(super) fn task_rows(amx: bool, format: Format, m: usize, kb: usize) -> Option<usize> {
    let takes = amx && m >= AMX_MIN_ROWS && enabled(format) && kb > 0;
    let groups = TASK_ACT_BYTES / (kb.max(1) * BLOCK_BYTES);
    takes.then(|| (groups * LANES).clamp(64, 256))
}

/// Whether this kernel has `format`.
pub(super) fn supports(format: Format) -> bool {
    // The formats of the AVX-512 kernels, whose block decoders ([`Codec`]) this one shares,
    // but Q5_0 / Q5_1 (not wired or tested here: on AMX CPUs their prompts take
    // [`super::avx512_panel`]).
    Avx512::supports(format) && !matches!(format, Format::Q5_0 | Format::Q5_1)
}

/// Whether `Kernel::Auto` runs `format`'s prompts here: all of [`supports`] but Q4_1, whose
/// prompts (the default model's) keep the AVX2 kernel and candle's summation order.
pub(super) fn enabled(format: Format) -> bool {
    supports(format) && format != Format::Q4_1
}

/// One 64-byte line of a tile operand.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([i8; 64]);

const ZERO_LINE: Line = Line([0; 64]);

/// Computes `acts[j] . W[r]` for every activation row `j` of `acts` and weight row `r` in
/// `weights` of the `format` matrix `data` (`row_stride` bytes per row), handing them out as
/// `out(j, r0, values of rows r0..)`; returns whether `format` has a kernel here.
pub(super) fn run(
    amx: Amx,
    format: Format,
    data: &[u8],
    row_stride: usize,
    weights: Range<usize>,
    acts: &[&[Q8Block]],
    out: &mut dyn FnMut(usize, usize, &[f32]),
) -> bool {
    if !supports(format) || acts.is_empty() || weights.is_empty() {
        return false;
    }
    let kb = checked_blocks(
        acts,
        data,
        row_stride,
        &weights,
        |kb| row_bytes(format, kb),
        &format,
    );
    if kb == 0 {
        return false;
    }
    // SAFETY: `amx` proves the CPU features and the tile permission; the asserts bound every
    // read of `data`.
    unsafe {
        let data = data.as_ptr();
        match format {
            Format::Q4_0 => gemm::<Q4_0>(amx, data, row_stride, weights, acts, out),
            Format::Q4_1 => gemm::<Q4_1>(amx, data, row_stride, weights, acts, out),
            Format::Q8_0 => gemm::<Q8_0>(amx, data, row_stride, weights, acts, out),
            Format::IQ4_NL => gemm::<Iq4Nl>(amx, data, row_stride, weights, acts, out),
            Format::IQ4_XS => gemm::<Iq4Xs>(amx, data, row_stride, weights, acts, out),
            Format::MXFP4 => gemm::<Mxfp4>(amx, data, row_stride, weights, acts, out),
            _ => return false,
        }
    }
    true
}

/// The activations of a task in tile-operand form: group `g` (rows `16g..16g + 16`), block `b`
/// at lines `(g * kb + b) * 8..`, and its sixteen scales (and sums `s`) at `(g * kb + b) * 16`.
struct Packed {
    lines: Vec<Line>,
    d: Vec<f32>,
    s: Vec<f32>,
}

/// Packs `acts` (see [`Packed`]); missing rows of the last group are zero.
///
/// # Safety
/// The CPU must have the features of [`super::avx512::Avx512`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pack(acts: &[&[Q8Block]], kb: usize, sums: bool) -> Packed {
    let groups = acts.len().div_ceil(LANES);
    let mut p = Packed {
        lines: vec![ZERO_LINE; groups * kb * 8],
        d: vec![0.0; groups * kb * LANES],
        s: vec![0.0; if sums { groups * kb * LANES } else { 0 }],
    };
    for (g, rows) in acts.chunks(LANES).enumerate() {
        let qs = |j: usize, b: usize| match rows.get(j) {
            Some(row) => _mm256_loadu_si256(row.get_unchecked(b).qs.as_ptr().cast()),
            None => _mm256_setzero_si256(),
        };
        for b in 0..kb {
            let at = g * kb + b;
            // Register k: the 8 words of row k, then of row k + 8; an 8 x 8 word transpose
            // in each half gives line r = word r of rows 0..8, then of rows 8..16.
            let z: [__m512i; 8] = std::array::from_fn(|k| {
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(qs(k, b)), qs(k + 8, b))
            });
            let t: [__m512i; 8] = std::array::from_fn(|k| {
                let (x, y) = (z[k & !1], z[k | 1]);
                match k & 1 {
                    0 => _mm512_unpacklo_epi32(x, y),
                    _ => _mm512_unpackhi_epi32(x, y),
                }
            });
            // u[4h + c], lane L: word 4 (L % 2) + c of rows 4h..4h + 4 (+ 8 in lanes 2, 3).
            let u: [__m512i; 8] = std::array::from_fn(|k| {
                let (h, c) = (k / 4, k % 4);
                let (x, y) = (t[4 * h + c / 2], t[4 * h + 2 + c / 2]);
                match c % 2 {
                    0 => _mm512_unpacklo_epi64(x, y),
                    _ => _mm512_unpackhi_epi64(x, y),
                }
            });
            let lo = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0);
            let hi = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
            let lines = p.lines.as_mut_ptr().add(at * 8);
            for c in 0..4 {
                let line = _mm512_permutex2var_epi64(u[c], lo, u[4 + c]);
                _mm512_store_si512(lines.add(c).cast(), line);
                let line = _mm512_permutex2var_epi64(u[c], hi, u[4 + c]);
                _mm512_store_si512(lines.add(4 + c).cast(), line);
            }
            for (lane, row) in rows.iter().enumerate() {
                let blk = row.get_unchecked(b);
                p.d[at * LANES + lane] = blk.d;
                if sums {
                    p.s[at * LANES + lane] = blk.s;
                }
            }
        }
    }
    p
}

/// The transpose of the 16 x 16 matrix whose row `i` is `r[i]`.
#[inline(always)]
unsafe fn transpose(r: [__m512; LANES]) -> [__m512; LANES] {
    // t[2k], t[2k + 1], per 128-bit lane: elements 0, 1 and 2, 3 of rows 2k, 2k + 1 interleaved.
    let t: [__m512; LANES] = std::array::from_fn(|k| {
        let (x, y) = (r[k & !1], r[k | 1]);
        match k & 1 {
            0 => _mm512_unpacklo_ps(x, y),
            _ => _mm512_unpackhi_ps(x, y),
        }
    });
    // u[4h + c], lane L: element 4L + c of rows 4h..4h + 4.
    let u: [__m512; LANES] = std::array::from_fn(|k| {
        let (h, c) = (k / 4, k % 4);
        let (x, y) = (
            _mm512_castps_pd(t[4 * h + c / 2]),
            _mm512_castps_pd(t[4 * h + 2 + c / 2]),
        );
        _mm512_castpd_ps(match c % 2 {
            0 => _mm512_unpacklo_pd(x, y),
            _ => _mm512_unpackhi_pd(x, y),
        })
    });
    let mut out = [_mm512_setzero_ps(); LANES];
    for c in 0..4 {
        let a = _mm512_shuffle_f32x4::<0x44>(u[c], u[4 + c]);
        let b = _mm512_shuffle_f32x4::<0xEE>(u[c], u[4 + c]);
        let a2 = _mm512_shuffle_f32x4::<0x44>(u[8 + c], u[12 + c]);
        let b2 = _mm512_shuffle_f32x4::<0xEE>(u[8 + c], u[12 + c]);
        out[c] = _mm512_shuffle_f32x4::<0x88>(a, a2);
        out[4 + c] = _mm512_shuffle_f32x4::<0xDD>(a, a2);
        out[8 + c] = _mm512_shuffle_f32x4::<0x88>(b, b2);
        out[12 + c] = _mm512_shuffle_f32x4::<0xDD>(b, b2);
    }
    out
}

/// A decoded panel: block `b` of row `i` at bytes `b * 512 + 32 * i` of `lines`, its scale (and
/// minimum) at `b * 16 + i`.
struct Panel {
    lines: Vec<Line>,
    d: Vec<f32>,
    m: Vec<f32>,
}

/// # Safety
/// `amx` proves the CPU; rows `weights` of `row_stride` bytes at `data` must each hold
/// `acts[0].len()` (> 0) blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn gemm<C: Codec>(
    amx: Amx,
    data: *const u8,
    row_stride: usize,
    weights: Range<usize>,
    acts: &[&[Q8Block]],
    out: &mut dyn FnMut(usize, usize, &[f32]),
) {
    let kb = acts[0].len();
    let packed = pack(acts, kb, C::MIN);
    let mut panel = Panel {
        lines: vec![ZERO_LINE; kb * 8],
        d: vec![0.0; kb * LANES],
        m: vec![0.0; if C::MIN { kb * LANES } else { 0 }],
    };
    // Tiles 0 to 3: results; 4 and 5: weights (16 rows of 32 bytes); 6 and 7: activations
    // (8 rows of 64 bytes).
    let cfg = TileConfig::new()
        .tile(0, LANES, 64)
        .tile(1, LANES, 64)
        .tile(2, LANES, 64)
        .tile(3, LANES, 64)
        .tile(4, LANES, 32)
        .tile(5, LANES, 32)
        .tile(6, 8, 64)
        .tile(7, 8, 64);
    cfg.load(amx);
    let offset = _mm256_set1_epi8(C::OFFSET as u8 as i8);
    for first in weights.clone().step_by(LANES) {
        let n = (weights.end - first).min(LANES);
        if n < LANES {
            panel.lines.fill(ZERO_LINE);
            panel.d.fill(0.0);
            panel.m.fill(0.0);
        }
        let bytes = panel.lines.as_mut_ptr().cast::<u8>();
        for i in 0..n {
            let row = data.add((first + i) * row_stride);
            for b in 0..kb {
                C::prefetch(row, b);
                let (u, d) = C::block(row, b);
                // u - offset as i8: the signed weights (wrapping: 128 is 0x80).
                let w = _mm256_sub_epi8(u, offset);
                _mm256_storeu_si256(bytes.add(b * BLOCK_BYTES + 32 * i).cast(), w);
                panel.d[b * LANES + i] = d;
                if C::MIN {
                    panel.m[b * LANES + i] = C::min(row, b);
                }
            }
        }
        for (g, rows) in acts.chunks(LANES).enumerate() {
            // Lanes of `acc[i]`: activation rows; of `cols[j]`: weight rows.
            let cols = transpose(group::<C>(&panel, &packed, g, kb));
            let mut lanes = [0f32; LANES];
            for (j, col) in cols.iter().enumerate().take(rows.len()) {
                _mm512_storeu_ps(lanes.as_mut_ptr(), *col);
                out(g * LANES + j, first, &lanes[..n]);
            }
        }
    }
    amx::release();
}

/// The sixteen weight rows of `panel` times the sixteen activation rows of group `g`: one
/// register of sixteen activation lanes per weight row.
///
/// # Safety
/// The tile configuration of [`gemm`] is loaded; `panel` and `packed` hold `kb` (> 0) blocks.
#[inline(always)]
unsafe fn group<C: Codec>(panel: &Panel, packed: &Packed, g: usize, kb: usize) -> [__m512; LANES] {
    let mut acc = [_mm512_setzero_ps(); LANES];
    let mut c = [[0i32; LANES * LANES]; 2];
    let a = |b: usize| panel.lines.as_ptr().cast::<u8>().add(b * BLOCK_BYTES);
    let bt = |b: usize| packed.lines.as_ptr().add((g * kb + b) * 8).cast::<u8>();
    let (sa, sb) = (32usize, 64usize);
    // Step `b`: start block `b`'s multiply in result tile `b % 4` (its operands in tiles
    // 4 + b % 2 and 6 + b % 2), store block `b - 2`'s sums from tile `(b + 2) % 4` to buffer
    // `b % 2`, and scale block `b - 3`'s, stored a step earlier. A result tile is reused four
    // steps on, so neither the multiplies nor the vector loads wait on a tile store just made.
    macro_rules! step {
        ($b:expr, $c:literal, $a:literal, $bb:literal, $store:literal, $sbuf:expr, $rbuf:expr) => {{
            let b: usize = $b;
            if b < kb {
                load!($a, a(b), sa);
                load!($bb, bt(b), sb);
                zero!($c);
                dot!("tdpbssd", $c, $a, $bb);
            }
            if b >= 2 && b - 2 < kb {
                store!($store, c[$sbuf].as_mut_ptr(), sb);
            }
            if b >= 3 && b - 3 < kb {
                scale::<C>(&mut acc, &c[$rbuf], panel, packed, g, kb, b - 3);
            }
        }};
    }
    let mut b = 0;
    while b < kb + 3 {
        step!(b, "0", "4", "6", "2", 0, 1);
        step!(b + 1, "1", "5", "7", "3", 1, 0);
        step!(b + 2, "2", "4", "6", "0", 0, 1);
        step!(b + 3, "3", "5", "7", "1", 1, 0);
        b += 4;
    }
    acc
}

/// Adds block `b`'s sums `c` (weight row `i` at `16 i..`) to the accumulators.
#[inline(always)]
unsafe fn scale<C: Codec>(
    acc: &mut [__m512; LANES],
    c: &[i32; LANES * LANES],
    panel: &Panel,
    packed: &Packed,
    g: usize,
    kb: usize,
    b: usize,
) {
    let at = (g * kb + b) * LANES;
    let ad = _mm512_loadu_ps(packed.d.as_ptr().add(at));
    let sums = match C::MIN {
        true => _mm512_loadu_ps(packed.s.as_ptr().add(at)),
        false => _mm512_setzero_ps(),
    };
    let wd = panel.d.as_ptr().add(b * LANES);
    for (i, acc) in acc.iter_mut().enumerate() {
        let sumi = _mm512_cvtepi32_ps(_mm512_loadu_si512(c.as_ptr().add(i * LANES).cast()));
        let scale = _mm512_mul_ps(_mm512_set1_ps(*wd.add(i)), ad);
        *acc = _mm512_fmadd_ps(sumi, scale, *acc);
        if C::MIN {
            let m = _mm512_set1_ps(*panel.m.as_ptr().add(b * LANES + i));
            *acc = _mm512_fmadd_ps(m, sums, *acc);
        }
    }
}

#[cfg(test)]
#[path = "amx_panel_tests.rs"]
mod tests;
