//! The table-coded formats (IQ4_XS, IQ4_NL, MXFP4) in the eight-row panel layout
//! ([`super::panel8`]) on AVX2: the decode kernel (one activation row against the eight rows of
//! a panel: [`dots`]) and the fill of the AVX2 GEMM's decoded panel straight from the layout
//! ([`fill`], for [`super::avx2_panel::run_panels`]).
//!
//! An IQ4_XS panel block (super-block `b` of eight rows) holds the eight f16 `d`, the eight u16
//! `scales_h`, the eight u32 `scales_l`, then the 128 index bytes of each row as 32 words, word
//! `k` of all eight rows in one 32-byte load; an IQ4_NL one (block `b`, 32 elements) the eight
//! `d` and four such words, an MXFP4 one the eight E8M0 bytes `e` and four words. Sub-block `i`
//! (32 elements) is words `4 i..4 i + 4`; the low nibbles of its word `j` index elements
//! `4 j..4 j + 4`, the high ones elements `16 + 4 j..`. Both kernels look the nibbles up with
//! `vpshufb` in the value table and in its magnitudes, so one register holds four weights of
//! each of the eight rows, as the GEMM's transposed panel does, with no transposition. The
//! products take the sign trick (`|w| * (a * sign(w))` by `vpmaddubsw`, widened by
//! `vpmaddwd`): exact integers. The decode kernel adds `sumi * (scale * a.d)` (the scale:
//! `d * (ls - 32)`, `d`, or `2^(e - 128)`) sub-block by sub-block from 0 in each row's lane,
//! the sequence of [`super::avx2_panel`]'s GEMM (and of the AVX-512 one-row kernel): with
//! panels, a prompt and its decode give the same bits for a row.

use std::arch::x86_64::*;

use super::activation::Q8Block;
use super::avx2::Avx2;
use super::iq4::XS_SUB;
use super::kquants::panel8_avx2::prefetch;
use super::panel8::{PanelFormat, ROWS};
use super::{iq4, mxfp4};

/// Index words per (sub-)block of 32 elements (16 bytes of each row).
const SUB_WORDS: usize = 4;

/// A table-coded format: its layout, value table and scales.
pub trait TableFormat {
    /// Its panel layout.
    const FORMAT: PanelFormat;
    /// Its value table as bytes: the weights, their magnitudes, the weights plus 128.
    const TABLES: [[u8; 16]; 3];
    /// Each 32-element (sub-)block's scale, row `r` of the panel block at `blk` in lane `r` of
    /// entry `i` (entries past the format's sub-blocks unused).
    ///
    /// # Safety
    /// The CPU must have AVX2, F16C; `blk` must hold one panel block.
    unsafe fn scales(blk: *const u8) -> [__m256; XS_SUB];
}

/// IQ4_XS.
pub struct Xs;
/// IQ4_NL.
pub struct Nl;
/// MXFP4.
pub struct Mx;

impl TableFormat for Xs {
    const FORMAT: PanelFormat = PanelFormat::Iq4Xs;
    const TABLES: [[u8; 16]; 3] = tables(&iq4::KVALUES);
    #[inline(always)]
    unsafe fn scales(blk: *const u8) -> [__m256; XS_SUB] {
        sub_block_scales(blk)
    }
}

impl TableFormat for Nl {
    const FORMAT: PanelFormat = PanelFormat::Iq4Nl;
    const TABLES: [[u8; 16]; 3] = tables(&iq4::KVALUES);
    #[inline(always)]
    unsafe fn scales(blk: *const u8) -> [__m256; XS_SUB] {
        let mut out = [_mm256_setzero_ps(); XS_SUB];
        out[0] = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        out
    }
}

impl TableFormat for Mx {
    const FORMAT: PanelFormat = PanelFormat::Mxfp4;
    const TABLES: [[u8; 16]; 3] = tables(&mxfp4::KVALUES);
    /// [`mxfp4::e8m0_half`] of each row's `e`, lane by lane: `(e - 1) << 23` as f32 bits, or
    /// the denormal `0x0020_0000 << e` for `e < 2`.
    #[inline(always)]
    unsafe fn scales(blk: *const u8) -> [__m256; XS_SUB] {
        let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(blk.cast()));
        let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
        let denormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
        let is_normal = _mm256_cmpgt_epi32(e, _mm256_set1_epi32(1));
        let bits = _mm256_blendv_epi8(denormal, normal, is_normal);
        let mut out = [_mm256_setzero_ps(); XS_SUB];
        out[0] = _mm256_castsi256_ps(bits);
        out
    }
}

/// Where a panel block's index words start, its 32-element (sub-)blocks and its bytes
/// (constants: `const { layout::<F>() }`).
const fn layout<F: TableFormat>() -> (usize, usize, usize) {
    let format = F::FORMAT;
    let quants = format.offset(format.segments().len() - 1);
    let subs = format.block_elements() / 32;
    (quants, subs, format.block_bytes() * ROWS)
}

/// The eight dot products of the `F` panel `panel` with the activation row `a` (32-element
/// blocks), row `r` of the panel in lane `r`.
pub fn dots<F: TableFormat>(k: Avx2, panel: &[u8], a: &[Q8Block]) -> [f32; ROWS] {
    let _ = k;
    let (_, subs, block) = const { layout::<F>() };
    assert!(
        a.len().is_multiple_of(subs) && panel.len() >= block * (a.len() / subs),
        "{:?} panel too short",
        F::FORMAT
    );
    let mut out = [0f32; ROWS];
    // SAFETY: `k` proves AVX2, FMA and F16C; the assert bounds every read of `panel`.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), decode::<F>(panel.as_ptr(), a)) };
    out
}

/// See [`dots`].
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C; `panel` must hold the panel blocks of `a`'s blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode<F: TableFormat>(panel: *const u8, a: &[Q8Block]) -> __m256 {
    let tables = Tables::new(&F::TABLES);
    let (quants, subs, block) = const { layout::<F>() };
    let mut acc = _mm256_setzero_ps();
    for (b, a) in a.chunks_exact(subs).enumerate() {
        let blk = panel.add(b * block);
        prefetch(blk, quants);
        let scales = F::scales(blk);
        for (i, a) in a.iter().enumerate() {
            let q = blk.add(quants + i * SUB_WORDS * 32);
            prefetch(q, SUB_WORDS * 32);
            let y = a.qs.as_ptr().cast::<i32>();
            let mut sumi = _mm256_setzero_si256();
            for j in 0..SUB_WORDS {
                let (lo, hi) = nibbles(q.add(32 * j));
                let ylo = _mm256_set1_epi32(y.add(j).read_unaligned());
                let yhi = _mm256_set1_epi32(y.add(SUB_WORDS + j).read_unaligned());
                sumi = _mm256_add_epi32(sumi, tables.product(lo, ylo));
                sumi = _mm256_add_epi32(sumi, tables.product(hi, yhi));
            }
            let scale = _mm256_mul_ps(scales[i], _mm256_set1_ps(a.d));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), scale, acc);
        }
    }
    acc
}

/// Fills the 32-element blocks of panel block `b` (IQ4_XS: blocks `8 b..8 b + 8`; the others:
/// block `b`) of the AVX2 GEMM's decoded panel from the panel block at `blk`: the weights'
/// magnitudes in `packed` and the weights in `signs` (plain AVX2), or the weights plus 128 in
/// `packed` (`VNNI`); each block's scale ([`TableFormat::scales`]) in `scales`. The
/// layout of the arrays is [`super::avx2_panel`]'s (block `c`'s word `w` of row `r` at
/// `(8 c + w) * 8 + r`, its scales at `8 c + r`), and the values those of its decoders.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C; `blk` must hold one panel block; `packed` (and `signs`
/// unless `VNNI`) must hold those blocks' words, `scales` their values.
#[inline(always)]
pub(super) unsafe fn fill<F: TableFormat, const VNNI: bool>(
    blk: *const u8,
    packed: &mut [u32],
    signs: &mut [u32],
    scales: &mut [f32],
    b: usize,
) {
    let tables = Tables::new(&F::TABLES);
    let (quants, subs, _) = const { layout::<F>() };
    let words = 2 * SUB_WORDS;
    for (i, scale) in F::scales(blk).into_iter().take(subs).enumerate() {
        let c = subs * b + i;
        _mm256_storeu_ps(scales.as_mut_ptr().add(c * ROWS), scale);
        let q = blk.add(quants + i * SUB_WORDS * 32);
        for j in 0..SUB_WORDS {
            let (lo, hi) = nibbles(q.add(32 * j));
            for (w, idx) in [(j, lo), (SUB_WORDS + j, hi)] {
                let at = (c * words + w) * ROWS;
                // (Plain stores, not a closure: one would not inline the intrinsics.)
                if VNNI {
                    let v = _mm256_shuffle_epi8(tables.shifted, idx);
                    _mm256_storeu_si256(packed.as_mut_ptr().add(at).cast(), v);
                } else {
                    let m = _mm256_shuffle_epi8(tables.magnitudes, idx);
                    _mm256_storeu_si256(packed.as_mut_ptr().add(at).cast(), m);
                    let v = _mm256_shuffle_epi8(tables.values, idx);
                    _mm256_storeu_si256(signs.as_mut_ptr().add(at).cast(), v);
                }
            }
        }
    }
}

/// A value table as bytes: the weights, their magnitudes, the weights plus 128.
const fn tables(values: &[i8; 16]) -> [[u8; 16]; 3] {
    let mut t = [[0u8; 16]; 3];
    let mut n = 0;
    while n < 16 {
        let v = values[n];
        t[0][n] = v as u8;
        t[1][n] = v.unsigned_abs();
        t[2][n] = (v as i16 + 128) as u8;
        n += 1;
    }
    t
}

/// The value table in the three forms the kernels look nibbles up in (both lanes).
#[derive(Clone, Copy)]
struct Tables {
    /// The weights.
    values: __m256i,
    /// Their magnitudes.
    magnitudes: __m256i,
    /// The weights plus 128, unsigned (the AVX-VNNI products').
    shifted: __m256i,
}

impl Tables {
    #[inline(always)]
    unsafe fn new(tables: &[[u8; 16]; 3]) -> Tables {
        let (values, magnitudes, shifted) = (&tables[0], &tables[1], &tables[2]);
        Tables {
            values: _mm256_broadcastsi128_si256(_mm_loadu_si128(values.as_ptr().cast())),
            magnitudes: _mm256_broadcastsi128_si256(_mm_loadu_si128(magnitudes.as_ptr().cast())),
            shifted: _mm256_broadcastsi128_si256(_mm_loadu_si128(shifted.as_ptr().cast())),
        }
    }

    /// Each lane's exact sum of the four products of the weights indexed by `idx` (nibbles)
    /// with the four signed bytes of `y`.
    #[inline(always)]
    unsafe fn product(self, idx: __m256i, y: __m256i) -> __m256i {
        let w = _mm256_shuffle_epi8(self.values, idx);
        let m = _mm256_shuffle_epi8(self.magnitudes, idx);
        // At most 2 * 127 * 127 per pair: no saturation.
        let pairs = _mm256_maddubs_epi16(m, _mm256_sign_epi8(y, w));
        _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
    }
}

/// The low and the high nibbles of the 32 bytes at `q`.
#[inline(always)]
unsafe fn nibbles(q: *const u8) -> (__m256i, __m256i) {
    let m4 = _mm256_set1_epi8(0x0F);
    let x = _mm256_loadu_si256(q.cast());
    (
        _mm256_and_si256(x, m4),
        _mm256_and_si256(_mm256_srli_epi16::<4>(x), m4),
    )
}

/// Sub-block `i`'s scale `d * (ls - 32)` of each row of the panel block at `blk` in lane `r`
/// of entry `i` (the scalar `f16 d * xs_scale as f32`, one rounding).
#[inline(always)]
unsafe fn sub_block_scales(blk: *const u8) -> [__m256; XS_SUB] {
    let d = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
    let high = _mm_loadu_si128(blk.add(const { PanelFormat::Iq4Xs.offset(1) }).cast());
    let high = _mm256_cvtepu16_epi32(high);
    let low = _mm256_loadu_si256(blk.add(const { PanelFormat::Iq4Xs.offset(2) }).cast());
    let mut out = [_mm256_setzero_ps(); XS_SUB];
    for (i, out) in out.iter_mut().enumerate() {
        // Sub-block i's low four bits are bits 4i.. of `scales_l`, its top two bits 2i.. of
        // `scales_h`.
        let low = _mm256_srl_epi32(low, _mm_cvtsi32_si128(4 * i as i32));
        let high = _mm256_srl_epi32(high, _mm_cvtsi32_si128(2 * i as i32));
        let ls = _mm256_or_si256(
            _mm256_and_si256(low, _mm256_set1_epi32(0x0F)),
            _mm256_slli_epi32::<4>(_mm256_and_si256(high, _mm256_set1_epi32(3))),
        );
        let ls = _mm256_sub_epi32(ls, _mm256_set1_epi32(32));
        *out = _mm256_mul_ps(d, _mm256_cvtepi32_ps(ls));
    }
    out
}
