//! The multi-row GEMM kernel of the AVX2 path (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS,
//! MXFP4): [`super::avx512_panel`] on AVX2's sixteen 256-bit registers, for CPUs without
//! AVX-512 (and for `Kernel::Avx2` / `Kernel::AvxVnni` on those with it).
//!
//! A task's weight rows are taken eight at a time (a panel): every block of the eight rows is
//! decoded once by the AVX-512 path's block decoders ([`super::avx512::Codec`], which use AVX2
//! and F16C instructions only) and transposed (an 8 x 8 transpose of 32-bit words), so one
//! register holds four consecutive weights of each of the eight rows. Then every activation
//! row sweeps the panel, four rows at a time: per block, the four activation bytes of each
//! 32-bit word are broadcast and multiplied with the eight rows' four bytes, giving the eight
//! rows' exact integer block sums in eight lanes, and one FMA per block adds
//! `sumi * (d * a.d)` to the row's eight outputs (Q4_1 / Q5_1 then `m * a.s`).
//!
//! The byte products:
//! - with AVX-VNNI (`vnni`), one `vpdpbusd` per word on the unsigned decoded weights
//!   `w + offset`, the offset taken off through `offset * sum(a)` (as the AVX-512 panel);
//! - with AVX2 alone, the weights of at most five bits (Q4_0, Q4_1, Q5_0, Q5_1: `w + offset`
//!   at most 31) by `vpmaddubsw`, whose 16-bit pair sums are summed in 16 bits over
//!   [`Codec16::WORDS_PER_I16`] words (at most `8 * 2 * 15 * 128` or `4 * 2 * 31 * 128`, no
//!   saturation) before one `vpmaddwd` widens them; the 8-bit ones (Q8_0 and the table-coded
//!   formats, signed weights up to 128 in magnitude) by the sign trick of the one-row kernels
//!   (`|w| * (a * sign(w))`, at most `2 * 128 * 127` per pair) widened every word.
//!
//! Every integer sum is exact, so each lane computes exactly the AVX-512 one-row kernel's sequence
//! ([`super::avx512`]: `acc = fma(sumi_b, d_b * a.d_b, acc)` block by block from 0): the outputs
//! equal that kernel's (and the AVX-512 panel's) bit for bit on any CPU. Against the AVX2 one-row
//! kernels ([`super::avx2`], [`super::q5::avx2`], decode) they differ by float summation order
//! only. [`takes`] says which calls run here. An IQ4_XS, IQ4_NL, MXFP4, Q5_0 or Q5_1 matrix in the
//! eight-row panel layout ([`super::panel8`]) fills its decoded panels straight from it
//! ([`run_panels`], [`super::table_panel::fill`], [`super::q5_panel::fill`]), with the same
//! results.

use std::arch::x86_64::*;
use std::ops::Range;

use super::activation::Q8Block;
use super::avx2::Avx2;
use super::avx2_tile::{dpbusd, has_vnni};
use super::avx512::{row_bytes, Codec, Iq4Nl, Iq4Xs, Mxfp4, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use super::panel8::{PanelFormat, Panels, ROWS};
use super::tile::{checked_blocks, GEMM_MIN_ROWS};
use super::{amx_panel, q5_panel, table_panel, Format, Kernel};

/// Weight rows per panel (the lanes of one register of i32), those of the panel layout's.
const PANEL: usize = ROWS;
/// 32-bit words per decoded block (32 bytes).
const WORDS: usize = 8;

/// Whether `format` has a kernel here.
pub(super) fn supports(format: Format) -> bool {
    row_bytes(format, 0).is_some()
}

/// Whether a call of `m` activation rows of `format` runs here under `kernel` (on the AVX2
/// path: where the AVX-512 kernels do not take the format). Q4_0, Q5_0, Q5_1 and the
/// table-coded formats from [`GEMM_MIN_ROWS`] rows, as on the AVX-512 path
/// ([`super::avx512::Avx512::enabled`]); Q8_0 from [`amx_panel::AMX_MIN_ROWS`] rows, as on
/// AMX CPUs (the suite's parity checks against candle, whose prompts are shorter, keep its
/// AVX2 order); Q4_1 (the default model) never: its kernel is tested but left off for the
/// same parity checks (see `Avx512::enabled`).
pub(super) fn takes(kernel: Kernel, format: Format, m: usize) -> bool {
    let from = match format {
        Format::Q4_1 => return false,
        Format::Q8_0 => amx_panel::AMX_MIN_ROWS,
        _ => GEMM_MIN_ROWS,
    };
    kernel != Kernel::Scalar && m >= from && supports(format)
}

/// Whether the kernel choice `kernel` multiplies bytes with AVX-VNNI here (`Kernel::Avx2`
/// never; the others where the CPU has it).
pub(super) fn vnni_for(kernel: Kernel) -> bool {
    kernel != Kernel::Avx2 && has_vnni()
}

/// Computes `acts[i] . W[r]` for every activation row `i` of `acts` and weight row `r` in
/// `weights` of the `format` matrix `data` (`row_stride` bytes per row), when `format` has a
/// kernel here, handing them out as `out(i, r0, values of rows r0..)`; returns whether it did.
/// With `vnni` (ignored where the CPU lacks AVX-VNNI: [`has_vnni`]) the byte products are
/// `vpdpbusd`; the results are the same either way.
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    k: Avx2,
    vnni: bool,
    format: Format,
    data: &[u8],
    row_stride: usize,
    weights: Range<usize>,
    acts: &[&[Q8Block]],
    out: &mut dyn FnMut(usize, usize, &[f32]),
) -> bool {
    let _ = k;
    if !supports(format) || acts.is_empty() || weights.is_empty() {
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
    let vnni = vnni && has_vnni();
    // SAFETY: `k` proves AVX2, FMA and F16C (and `has_vnni` AVX-VNNI where `vnni`); the
    // asserts bound every read of `data`.
    unsafe {
        let data = data.as_ptr();
        let args = (data, row_stride, weights, acts, out);
        match (format, vnni) {
            (Format::Q4_0, false) => plain::panels::<Q4_0>(args),
            (Format::Q4_1, false) => plain::panels::<Q4_1>(args),
            (Format::Q5_0, false) => plain::panels::<Q5_0>(args),
            (Format::Q5_1, false) => plain::panels::<Q5_1>(args),
            (Format::Q8_0, false) => plain::panels::<Q8_0>(args),
            (Format::IQ4_NL, false) => plain::panels::<Iq4Nl>(args),
            (Format::IQ4_XS, false) => plain::panels::<Iq4Xs>(args),
            (Format::MXFP4, false) => plain::panels::<Mxfp4>(args),
            (Format::Q4_0, true) => vnni::panels::<Q4_0>(args),
            (Format::Q4_1, true) => vnni::panels::<Q4_1>(args),
            (Format::Q5_0, true) => vnni::panels::<Q5_0>(args),
            (Format::Q5_1, true) => vnni::panels::<Q5_1>(args),
            (Format::Q8_0, true) => vnni::panels::<Q8_0>(args),
            (Format::IQ4_NL, true) => vnni::panels::<Iq4Nl>(args),
            (Format::IQ4_XS, true) => vnni::panels::<Iq4Xs>(args),
            (Format::MXFP4, true) => vnni::panels::<Mxfp4>(args),
            _ => return false,
        }
    }
    true
}

/// [`run`] over an IQ4_XS, IQ4_NL, MXFP4, Q5_0 or Q5_1 matrix in the panel layout ([`Panels`]):
/// each panel is filled straight from the layout ([`table_panel::fill`], [`q5_panel::fill`], no
/// transposition), then swept as [`run`] sweeps it; the outputs equal [`run`]'s over the GGUF rows
/// bit for bit. `weights` must start at a multiple of [`ROWS`]; `false` (nothing done) for panels
/// of another format.
pub(super) fn run_panels(
    k: Avx2,
    vnni: bool,
    panels: &Panels,
    weights: Range<usize>,
    acts: &[&[Q8Block]],
    out: &mut dyn FnMut(usize, usize, &[f32]),
) -> bool {
    let _ = k;
    let format = panels.format();
    // The k-quants have their own GEMM (`kquants::avx2_panel::run_panels`).
    let k_quant = matches!(format, PanelFormat::K(_));
    if k_quant || acts.is_empty() || weights.is_empty() {
        return false;
    }
    let blocks = panels.kb() * format.block_elements() / 32;
    panels.check_task(&weights, acts.iter().map(|a| a.len()), blocks);
    // SAFETY: `k` proves AVX2, FMA and F16C (and `has_vnni` AVX-VNNI where `vnni`); the
    // panels are read through checked slices.
    unsafe {
        match vnni && has_vnni() {
            false => plain::layout_panels((panels, weights, acts, out)),
            true => vnni::layout_panels((panels, weights, acts, out)),
        }
    }
    true
}

/// The eight dot products of one activation row `a` with the panel `panel` of an IQ4_XS,
/// IQ4_NL, MXFP4, Q5_0 or Q5_1 matrix in the panel layout (the decode kernels of
/// [`table_panel`] and [`q5_panel`]: bit for bit [`run_panels`]' outputs for that row); `None`
/// for a k-quant (`kquants::panel8_avx2::dots`).
pub(super) fn panel_dots(
    k: Avx2,
    format: PanelFormat,
    panel: &[u8],
    a: &[Q8Block],
) -> Option<[f32; ROWS]> {
    use table_panel::{dots, Mx, Nl, Xs};
    Some(match format {
        PanelFormat::Iq4Xs => dots::<Xs>(k, panel, a),
        PanelFormat::Iq4Nl => dots::<Nl>(k, panel, a),
        PanelFormat::Mxfp4 => dots::<Mx>(k, panel, a),
        PanelFormat::Q5_0 => q5_panel::dots::<false>(k, panel, a),
        PanelFormat::Q5_1 => q5_panel::dots::<true>(k, panel, a),
        PanelFormat::K(_) => return None,
    })
}

/// The arguments of [`run_panels`] as the two variants take them.
type PanelArgs<'a, 'b> = (
    &'a Panels,
    Range<usize>,
    &'a [&'a [Q8Block]],
    &'b mut dyn FnMut(usize, usize, &[f32]),
);

/// The arguments of [`run`] past the format, as the two variants take them.
type Args<'a, 'b> = (
    *const u8,
    usize,
    Range<usize>,
    &'a [&'a [Q8Block]],
    &'b mut dyn FnMut(usize, usize, &[f32]),
);

/// How many words' `vpmaddubsw` pair sums a [`Codec`] may add in 16 bits (plain AVX2 only):
/// 8 for four-bit weights, 4 for five-bit ones, 1 (widen every word) for the signed 8-bit
/// ones, which take the sign trick.
trait Codec16: Codec {
    const WORDS_PER_I16: usize;
    /// Whether the weights are signed bytes (`OFFSET` 128), multiplied by the sign trick.
    const SIGNED: bool = Self::OFFSET == 128;
}
impl Codec16 for Q4_0 {
    const WORDS_PER_I16: usize = 8;
}
impl Codec16 for Q4_1 {
    const WORDS_PER_I16: usize = 8;
}
impl Codec16 for Q5_0 {
    const WORDS_PER_I16: usize = 4;
}
impl Codec16 for Q5_1 {
    const WORDS_PER_I16: usize = 4;
}
impl Codec16 for Q8_0 {
    const WORDS_PER_I16: usize = 1;
}
impl Codec16 for Iq4Nl {
    const WORDS_PER_I16: usize = 1;
}
impl Codec16 for Iq4Xs {
    const WORDS_PER_I16: usize = 1;
}
impl Codec16 for Mxfp4 {
    const WORDS_PER_I16: usize = 1;
}

/// The two variants: the same loop compiled with and without AVX-VNNI's `vpdpbusd`.
macro_rules! variant {
    ($module:ident, $vnni:expr) => {
        mod $module {
            use super::*;

            /// # Safety
            /// The CPU must have AVX2, FMA, F16C (and AVX-VNNI in the `vnni` variant); rows
            /// `weights` of `row_stride` bytes at `data` must each hold `acts[0].len()` blocks
            /// and every row of `acts` as many ([`checked_blocks`]).
            #[target_feature(enable = "avx2,fma,f16c")]
            pub(super) unsafe fn panels<C: Codec16>(args: Args<'_, '_>) {
                super::panels::<C, { $vnni }>(args)
            }

            /// # Safety
            /// The CPU must have AVX2, FMA, F16C (and AVX-VNNI in the `vnni` variant); the
            /// arguments as [`run_panels`] checks them.
            #[target_feature(enable = "avx2,fma,f16c")]
            pub(super) unsafe fn layout_panels(args: PanelArgs<'_, '_>) {
                match args.0.format() {
                    PanelFormat::Iq4Xs => super::layout_panels::<Iq4Xs, { $vnni }>(args),
                    PanelFormat::Iq4Nl => super::layout_panels::<Iq4Nl, { $vnni }>(args),
                    PanelFormat::Mxfp4 => super::layout_panels::<Mxfp4, { $vnni }>(args),
                    PanelFormat::Q5_0 => super::layout_panels::<Q5_0, { $vnni }>(args),
                    PanelFormat::Q5_1 => super::layout_panels::<Q5_1, { $vnni }>(args),
                    _ => {}
                }
            }
        }
    };
}
variant!(plain, false);
variant!(vnni, true);

/// The panel loop: decode eight weight rows, sweep every activation row over them.
///
/// # Safety
/// As the variants' `panels`; inlined into them.
#[inline(always)]
unsafe fn panels<C: Codec16, const VNNI: bool>(args: Args<'_, '_>) {
    let (data, row_stride, weights, acts, out) = args;
    let kb = acts[0].len();
    // Signed weights without AVX-VNNI: their magnitudes in `packed`, the weights in `signs`.
    let signed = C::SIGNED && !VNNI;
    let mut panel = Panel::new::<C, VNNI>(kb);
    for first in weights.clone().step_by(PANEL) {
        let n = (weights.end - first).min(PANEL);
        let rows: [*const u8; PANEL] =
            std::array::from_fn(|r| data.wrapping_add((first + r.min(n - 1)) * row_stride));
        for b in 0..kb {
            let Panel {
                packed,
                signs,
                scales,
                mins,
            } = &mut panel;
            let mut u = [_mm256_setzero_si256(); PANEL];
            for r in 0..n {
                C::prefetch(rows[r], b);
                let (w, d) = C::block(rows[r], b);
                u[r] = w;
                scales[b * PANEL + r] = d;
                if C::MIN {
                    mins[b * PANEL + r] = C::min(rows[r], b);
                }
            }
            for r in n..PANEL {
                scales[b * PANEL + r] = 0.0;
                if C::MIN {
                    mins[b * PANEL + r] = 0.0;
                }
            }
            let t = transpose(u);
            let at = b * WORDS * PANEL;
            for (j, &word) in t.iter().enumerate() {
                if signed {
                    let w = _mm256_xor_si256(word, _mm256_set1_epi8(0x80u8 as i8));
                    let abs = _mm256_sign_epi8(w, w);
                    _mm256_storeu_si256(packed.as_mut_ptr().add(at + j * PANEL).cast(), abs);
                    _mm256_storeu_si256(signs.as_mut_ptr().add(at + j * PANEL).cast(), w);
                } else {
                    _mm256_storeu_si256(packed.as_mut_ptr().add(at + j * PANEL).cast(), word);
                }
            }
        }
        sweep_all::<C, VNNI>(&panel, acts, first, n, out);
    }
}

/// The panel loop of [`run_panels`]: fill the decoded panel from each panel of the layout
/// (by the format's fill: `C` is its decoder, whose sweep follows), sweep every activation
/// row over it.
///
/// # Safety
/// As the variants' `layout_panels`; inlined into them.
#[inline(always)]
unsafe fn layout_panels<C: Codec16, const VNNI: bool>(args: PanelArgs<'_, '_>) {
    let (panels, weights, acts, out) = args;
    let mut decoded = Panel::new::<C, VNNI>(acts[0].len());
    let format = panels.format();
    let block = format.block_bytes() * ROWS;
    for first in weights.step_by(PANEL) {
        for (b, blk) in panels.panel(first / PANEL).chunks_exact(block).enumerate() {
            let blk = blk.as_ptr();
            let Panel {
                packed: p,
                signs: s,
                scales: d,
                mins: m,
            } = &mut decoded;
            match format {
                PanelFormat::Iq4Xs => table_panel::fill::<table_panel::Xs, VNNI>(blk, p, s, d, b),
                PanelFormat::Iq4Nl => table_panel::fill::<table_panel::Nl, VNNI>(blk, p, s, d, b),
                PanelFormat::Mxfp4 => table_panel::fill::<table_panel::Mx, VNNI>(blk, p, s, d, b),
                PanelFormat::Q5_0 => q5_panel::fill::<false>(blk, p, d, m, b),
                PanelFormat::Q5_1 => q5_panel::fill::<true>(blk, p, d, m, b),
                // `run_panels` hands the k-quants back.
                PanelFormat::K(_) => return,
            }
        }
        sweep_all::<C, VNNI>(&decoded, acts, first, PANEL, out);
    }
}

/// Every activation row of `acts` swept over the decoded panel of weight rows
/// `first..first + n`, four at a time, the results handed to `out`.
///
/// # Safety
/// As [`sweep`].
#[inline(always)]
unsafe fn sweep_all<C: Codec16, const VNNI: bool>(
    panel: &Panel,
    acts: &[&[Q8Block]],
    first: usize,
    n: usize,
    out: &mut dyn FnMut(usize, usize, &[f32]),
) {
    let mut lanes = [0f32; PANEL];
    let mut emit = |i: usize, acc: __m256| {
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        out(i, first, &lanes[..n]);
    };
    let mut i = 0;
    while i + 4 <= acts.len() {
        let a = [acts[i], acts[i + 1], acts[i + 2], acts[i + 3]];
        for (di, acc) in sweep::<4, C, VNNI>(panel, a).into_iter().enumerate() {
            emit(i + di, acc);
        }
        i += 4;
    }
    for (i, &a) in acts.iter().enumerate().skip(i) {
        let [acc] = sweep::<1, C, VNNI>(panel, [a]);
        emit(i, acc);
    }
}

/// A decoded panel of eight weight rows, shared by every activation row of a task ([`Panel::new`]
/// says where what is).
struct Panel {
    packed: Vec<u32>,
    signs: Vec<u32>,
    scales: Vec<f32>,
    mins: Vec<f32>,
}

impl Panel {
    /// A decoded panel of `kb` blocks for the decoder `C`: block `b`'s word `w` of lane (row)
    /// `r` at `packed[(b * WORDS + w) * PANEL + r]`, its scale at `scales[b * PANEL + r]`;
    /// signed weights without AVX-VNNI have their magnitudes in `packed` and the weights in
    /// `signs`; `mins` where `C` has them.
    fn new<C: Codec16, const VNNI: bool>(kb: usize) -> Panel {
        let signed = C::SIGNED && !VNNI;
        Panel {
            packed: vec![0; kb * WORDS * PANEL],
            signs: vec![0; if signed { kb * WORDS * PANEL } else { 0 }],
            scales: vec![0.0; kb * PANEL],
            mins: vec![0.0; if C::MIN { kb * PANEL } else { 0 }],
        }
    }
}

/// Words `j` of the eight registers `r` as register `j` (word `r` of it from `r[r]`).
///
/// # Safety
/// The CPU must have AVX2 (inlined into callers that enable it).
#[inline(always)]
pub(super) unsafe fn transpose(r: [__m256i; 8]) -> [__m256i; 8] {
    let t0 = _mm256_unpacklo_epi32(r[0], r[1]);
    let t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    let t2 = _mm256_unpacklo_epi32(r[2], r[3]);
    let t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    let t4 = _mm256_unpacklo_epi32(r[4], r[5]);
    let t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    let t6 = _mm256_unpacklo_epi32(r[6], r[7]);
    let t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    // Words (0, 4) of rows 0-3 in u0 and of rows 4-7 in u4, (1, 5) in u1 / u5, and so on.
    let u0 = _mm256_unpacklo_epi64(t0, t2);
    let u1 = _mm256_unpackhi_epi64(t0, t2);
    let u2 = _mm256_unpacklo_epi64(t1, t3);
    let u3 = _mm256_unpackhi_epi64(t1, t3);
    let u4 = _mm256_unpacklo_epi64(t4, t6);
    let u5 = _mm256_unpackhi_epi64(t4, t6);
    let u6 = _mm256_unpacklo_epi64(t5, t7);
    let u7 = _mm256_unpackhi_epi64(t5, t7);
    [
        _mm256_permute2x128_si256::<0x20>(u0, u4),
        _mm256_permute2x128_si256::<0x20>(u1, u5),
        _mm256_permute2x128_si256::<0x20>(u2, u6),
        _mm256_permute2x128_si256::<0x20>(u3, u7),
        _mm256_permute2x128_si256::<0x31>(u0, u4),
        _mm256_permute2x128_si256::<0x31>(u1, u5),
        _mm256_permute2x128_si256::<0x31>(u2, u6),
        _mm256_permute2x128_si256::<0x31>(u3, u7),
    ]
}

/// The exact integer block sums of the eight panel rows (lanes) with activation block `blk`,
/// the decoded words of the block in `w` (unsigned ones: the signed formats without VNNI take
/// [`sweep_signed`]).
///
/// # Safety
/// The CPU must have AVX2 (and AVX-VNNI when `VNNI`).
#[inline(always)]
unsafe fn block_sums<C: Codec16, const VNNI: bool>(w: &[__m256i; WORDS], blk: &Q8Block) -> __m256i {
    let q = blk.qs.as_ptr().cast::<i32>();
    // Word j of the activations in every lane (a plain loop, not a closure, so that it is
    // compiled with the caller's target features).
    let mut y = [_mm256_setzero_si256(); WORDS];
    for (j, y) in y.iter_mut().enumerate() {
        *y = _mm256_set1_epi32(q.add(j).read_unaligned());
    }
    if VNNI {
        // The offset correction first: integer sums are exact in any order.
        let mut s0 = _mm256_set1_epi32(-C::OFFSET * blk.isum);
        let mut s1 = _mm256_setzero_si256();
        for j in (0..WORDS).step_by(2) {
            s0 = dpbusd(s0, w[j], y[j]);
            s1 = dpbusd(s1, w[j + 1], y[j + 1]);
        }
        return _mm256_add_epi32(s0, s1);
    }
    debug_assert!(!C::SIGNED);
    let ones = _mm256_set1_epi16(1);
    let mut s = _mm256_set1_epi32(-C::OFFSET * blk.isum);
    for group in (0..WORDS).step_by(C::WORDS_PER_I16) {
        let mut s16 = _mm256_maddubs_epi16(w[group], y[group]);
        for j in group + 1..group + C::WORDS_PER_I16 {
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[j], y[j]));
        }
        s = _mm256_add_epi32(s, _mm256_madd_epi16(s16, ones));
    }
    s
}

/// The eight outputs of each of the `R` activation rows `a` against a decoded panel.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C (and AVX-VNNI when `VNNI`); the panel holds `a[0].len()`
/// blocks (see [`panels`]).
#[inline(always)]
unsafe fn sweep<const R: usize, C: Codec16, const VNNI: bool>(
    panel: &Panel,
    a: [&[Q8Block]; R],
) -> [__m256; R] {
    let kb = a[0].len();
    debug_assert!(panel.packed.len() >= kb * WORDS * PANEL && panel.scales.len() >= kb * PANEL);
    if C::SIGNED && !VNNI {
        return sweep_signed::<R, C>(panel, a);
    }
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..kb {
        let base = panel.packed.as_ptr().add(b * WORDS * PANEL);
        let mut w = [_mm256_setzero_si256(); WORDS];
        for (j, w) in w.iter_mut().enumerate() {
            *w = _mm256_loadu_si256(base.add(j * PANEL).cast());
        }
        let ws = _mm256_loadu_ps(panel.scales.as_ptr().add(b * PANEL));
        let wm = match C::MIN {
            true => _mm256_loadu_ps(panel.mins.as_ptr().add(b * PANEL)),
            false => _mm256_setzero_ps(),
        };
        for r in 0..R {
            let blk = a[r].get_unchecked(b);
            let sumi = _mm256_cvtepi32_ps(block_sums::<C, VNNI>(&w, blk));
            let scale = _mm256_mul_ps(ws, _mm256_set1_ps(blk.d));
            acc[r] = _mm256_fmadd_ps(sumi, scale, acc[r]);
            if C::MIN {
                acc[r] = _mm256_fmadd_ps(wm, _mm256_set1_ps(blk.s), acc[r]);
            }
        }
    }
    acc
}

/// [`sweep`] for the signed formats without AVX-VNNI (the sign trick): words outer, rows inner, so
/// one word's magnitudes and weights are in registers at a time. (Holding all eight words of both,
/// sixteen registers, spilled the rows' accumulators to the stack every block: Q8_0 and IQ4_XS ran
/// at 0.6-0.7x the unsigned formats' rate on Zen 3.) The word loop is a runtime loop (unrolled, the
/// scheduler hoists every load again). The integer sums are exact, so the order of their terms
/// changes nothing.
///
/// # Safety
/// As [`sweep`]; the panel's `signs` hold the weights (`C::SIGNED`).
#[inline(always)]
unsafe fn sweep_signed<const R: usize, C: Codec16>(
    panel: &Panel,
    a: [&[Q8Block]; R],
) -> [__m256; R] {
    debug_assert!(C::SIGNED && !C::MIN);
    let kb = a[0].len();
    debug_assert!(panel.signs.len() >= kb * WORDS * PANEL);
    let ones = _mm256_set1_epi16(1);
    let words = std::hint::black_box(WORDS);
    let mut acc = [_mm256_setzero_ps(); R];
    for b in 0..kb {
        let magnitudes = panel.packed.as_ptr().add(b * WORDS * PANEL);
        let signs = panel.signs.as_ptr().add(b * WORDS * PANEL);
        let mut sums = [_mm256_setzero_si256(); R];
        for j in 0..words {
            let w = _mm256_loadu_si256(magnitudes.add(j * PANEL).cast());
            let s = _mm256_loadu_si256(signs.add(j * PANEL).cast());
            for r in 0..R {
                let q = a[r].get_unchecked(b).qs.as_ptr().cast::<i32>();
                let y = _mm256_set1_epi32(q.add(j).read_unaligned());
                let pairs = _mm256_maddubs_epi16(w, _mm256_sign_epi8(y, s));
                sums[r] = _mm256_add_epi32(sums[r], _mm256_madd_epi16(pairs, ones));
            }
        }
        let ws = _mm256_loadu_ps(panel.scales.as_ptr().add(b * PANEL));
        for r in 0..R {
            let blk = a[r].get_unchecked(b);
            let scale = _mm256_mul_ps(ws, _mm256_set1_ps(blk.d));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), scale, acc[r]);
        }
    }
    acc
}
