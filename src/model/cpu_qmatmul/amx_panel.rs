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
//! [`super::avx512_panel`]) bit for bit. Two result tiles alternate, so the multiply of block
//! `b + 1` runs while block `b`'s sums are scaled.

use std::arch::x86_64::*;
use std::ops::Range;

use super::activation::Q8Block;
use super::amx::{self, dot, load, store, zero, Amx, TileConfig};
use super::avx512::{row_bytes, Codec, Iq4Nl, Iq4Xs, Mxfp4, Q4_0, Q4_1, Q8_0};
use super::Format;

/// Weight rows per panel and activation rows per group (a tile's rows and columns).
const LANES: usize = 16;
/// Bytes of one 32-element block of sixteen rows in either operand (16 x 32).
const BLOCK_BYTES: usize = LANES * 32;

/// Calls of at least this many activation rows take this kernel where it runs their format
/// (all of the call's rows, so one call never mixes kernels).
pub const AMX_MIN_ROWS: usize = 16;

/// Whether this kernel has `format`.
pub(super) fn supports(format: Format) -> bool {
    matches!(
        format,
        Format::Q4_0
            | Format::Q4_1
            | Format::Q8_0
            | Format::IQ4_NL
            | Format::IQ4_XS
            | Format::MXFP4
    )
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
/// `weights` of the `format` matrix `data` (`row_stride` bytes per row), handing each out as
/// `out(j, r, value)`; returns whether `format` has a kernel here.
pub(super) fn run(
    amx: Amx,
    format: Format,
    data: &[u8],
    row_stride: usize,
    weights: Range<usize>,
    acts: &[&[Q8Block]],
    out: &mut dyn FnMut(usize, usize, f32),
) -> bool {
    if !supports(format) || acts.is_empty() || weights.is_empty() {
        return false;
    }
    let kb = acts[0].len();
    assert!(
        acts.iter().all(|a| a.len() == kb),
        "activation rows differ in length"
    );
    let need = row_bytes(format, kb).unwrap_or(usize::MAX);
    assert!(
        row_stride >= need && data.len() >= (weights.end - 1) * row_stride + need,
        "{format:?} weights too short"
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
fn pack(acts: &[&[Q8Block]], kb: usize, sums: bool) -> Packed {
    let groups = acts.len().div_ceil(LANES);
    let mut p = Packed {
        lines: vec![ZERO_LINE; groups * kb * 8],
        d: vec![0.0; groups * kb * LANES],
        s: vec![0.0; if sums { groups * kb * LANES } else { 0 }],
    };
    for (j, row) in acts.iter().enumerate() {
        let (g, lane) = (j / LANES, j % LANES);
        for (b, blk) in row.iter().enumerate() {
            let at = g * kb + b;
            let lines = &mut p.lines[at * 8..at * 8 + 8];
            for (line, quad) in lines.iter_mut().zip(blk.qs.chunks_exact(4)) {
                line.0[4 * lane..4 * lane + 4].copy_from_slice(quad);
            }
            p.d[at * LANES + lane] = blk.d;
            if sums {
                p.s[at * LANES + lane] = blk.s;
            }
        }
    }
    p
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
    out: &mut dyn FnMut(usize, usize, f32),
) {
    let kb = acts[0].len();
    let packed = pack(acts, kb, C::MIN);
    let mut panel = Panel {
        lines: vec![ZERO_LINE; kb * 8],
        d: vec![0.0; kb * LANES],
        m: vec![0.0; if C::MIN { kb * LANES } else { 0 }],
    };
    // Tiles 0 and 1: results; 2 and 3: weights (16 rows of 32 bytes); 4 and 5: activations
    // (8 rows of 64 bytes).
    let cfg = TileConfig::new()
        .tile(0, LANES, 64)
        .tile(1, LANES, 64)
        .tile(2, LANES, 32)
        .tile(3, LANES, 32)
        .tile(4, 8, 64)
        .tile(5, 8, 64);
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
            let acc = group::<C>(&panel, &packed, g, kb);
            let mut lanes = [0f32; LANES];
            for (i, acc) in acc.iter().enumerate().take(n) {
                _mm512_storeu_ps(lanes.as_mut_ptr(), *acc);
                for (j, &y) in lanes.iter().enumerate().take(rows.len()) {
                    out(g * LANES + j, first + i, y);
                }
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
    // Step `b` (tile `t = b % 2`, the other `u`): start block `b`'s multiply in tile `t`,
    // store block `b - 1`'s sums from tile `u` to buffer `u`, and scale block `b - 2`'s, stored
    // to buffer `t` a step earlier: the vector loads never wait on a tile store just made.
    macro_rules! step {
        ($b:expr, $t:literal, $at:literal, $bt:literal, $u:literal, $ti:expr, $ui:expr) => {{
            let b: usize = $b;
            if b < kb {
                load!($at, a(b), sa);
                load!($bt, bt(b), sb);
                zero!($t);
                dot!("tdpbssd", $t, $at, $bt);
            }
            if b >= 1 && b - 1 < kb {
                store!($u, c[$ui].as_mut_ptr(), sb);
            }
            if b >= 2 {
                scale::<C>(&mut acc, &c[$ti], panel, packed, g, kb, b - 2);
            }
        }};
    }
    let mut b = 0;
    while b < kb + 2 {
        step!(b, "0", "2", "4", "1", 0, 1);
        if b + 1 < kb + 2 {
            step!(b + 1, "1", "3", "5", "0", 1, 0);
        }
        b += 2;
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
