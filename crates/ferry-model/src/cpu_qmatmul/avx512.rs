//! AVX-512 (F, BW, VL, VNNI) dot products of one raw GGUF weight row with one quantized
//! activation row, for the formats whose blocks are 32 integer weights times one scale (Q4_0,
//! Q5_0, Q8_0, IQ4_NL, IQ4_XS, MXFP4; Q4_1 and Q5_1 with their minimum), and the block decoders
//! they share with the multi-row GEMM kernels in [`super::avx512_panel`] and
//! [`super::avx2_panel`].
//!
//! Each block is decoded to 32 *unsigned* bytes `u_j = w_j + offset` ([`Codec`]: the signed
//! weights of Q8_0 and of the IQ4 / MXFP4 tables shifted by 128, Q4_0's nibbles as they are
//! with offset 8, Q5_0's 5-bit values (nibble plus the high bit from `qh`) with offset 16, and
//! Q4_1's / Q5_1's unsigned values with offset 0) and its f32 scale; `vpdpbusd` sums
//! `u_j * a_j` exactly in i32, and `sum_j u_j a_j - offset * sum_j a_j` is the block's exact
//! integer dot product. The row's result is then, in block order,
//! `acc = fma(sumi_b, d_b * a.d_b, acc)` from `acc = 0`: one rounding per block, no lane
//! partial sums. The GEMM kernel computes each output with exactly this sequence (Q4_1 and
//! Q5_1 add `acc = fma(m_b, a.s_b, acc)` after each block's term; one lane per weight row), so
//! the two are equal bit for bit, whichever of them the tiled loop uses for a row. Against the AVX2 and scalar kernels the results differ
//! by float summation order only (the integer block sums are the same). Which formats use
//! this row kernel outside the GEMM is [`Avx512::row_wins`].

use std::arch::x86_64::*;

use super::activation::Q8Block;
use super::avx2::{Avx2, PREFETCH_AHEAD};
use super::iq4::{self, IQ4_NL_BYTES, IQ4_XS_BYTES, XS_SUB};
use super::mxfp4::{self, MXFP4_BYTES};
use super::{q5, Format};

/// Proof that this CPU has AVX-512 F, BW, VL and VNNI (and AVX2, FMA, F16C).
#[derive(Debug, Clone, Copy)]
pub struct Avx512(());

impl Avx512 {
    /// `Some` when the running CPU supports the kernels.
    pub fn detect() -> Option<Self> {
        let ok = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
            && Avx2::detect().is_some();
        ok.then_some(Avx512(()))
    }

    /// Whether `format` has kernels here.
    pub(super) fn supports(format: Format) -> bool {
        matches!(
            format,
            Format::Q4_0
                | Format::Q4_1
                | Format::Q5_0
                | Format::Q5_1
                | Format::Q8_0
                | Format::IQ4_NL
                | Format::IQ4_XS
                | Format::MXFP4
        )
    }

    /// Whether `Kernel::Auto` runs `format` on this path: Q4_0, Q5_0, Q5_1 and the table-coded
    /// formats (Q5_0 / Q5_1 only their prompts: see [`row_wins`](Self::row_wins)). Q4_1 and
    /// Q8_0 have kernels here ([`supports`](Self::supports)) but stay on AVX2: the
    /// suite's parity checks against candle (the default Q4_1 model's greedy tokens, the
    /// quantized Phi-3's logits within 1e-3) follow candle's AVX2 float summation order, and
    /// a one-ulp change before an activation is re-quantized to int8 can move it by a whole
    /// step, which those checks see (measured: 7.4e-3 on Phi-3 against 2.4e-7 on AVX2).
    /// On AMX CPUs Q8_0's prompts of >= 16 rows take [`super::amx_panel`], in this path's
    /// order (those checks' prompts are shorter).
    pub(super) fn enabled(format: Format) -> bool {
        matches!(
            format,
            Format::Q4_0
                | Format::Q5_0
                | Format::Q5_1
                | Format::IQ4_NL
                | Format::IQ4_XS
                | Format::MXFP4
        )
    }

    /// Whether the one-row kernel also serves `format`'s row-at-a-time products (decode, and
    /// calls of fewer than [`super::tile::GEMM_MIN_ROWS`] rows): none of the formats
    /// [`enabled`](Self::enabled) here. Measured at m = 1 (2 threads, 4096 x 4096, idle):
    /// Q4_0 0.42x the AVX2 row kernel (6.8 against 16.1 GB/s), the table-coded formats
    /// 0.45-0.75x, whose per-block table lookup and horizontal sum cost more than the AVX2
    /// lane sums. So their decode keeps the AVX2 row kernels ([`super::avx2`]), Q5_0 / Q5_1's
    /// takes [`super::q5_avx512`] (lane sums like the AVX2 kernels', with AVX-512's byte
    /// masks and `vpdpbusd`: 1.6x the AVX2 row kernel before it at m = 1), and only their
    /// prompts take this path's order (the GEMM's). Q4_1 and Q8_0 (not enabled on this path
    /// for candle parity) would take it: on par with AVX2 at m = 1.
    pub(super) fn row_wins(format: Format) -> bool {
        matches!(format, Format::Q4_1 | Format::Q8_0)
    }

    /// Dot product of one weight row `w` of `format` with `a` (`None`: no kernel here).
    pub(super) fn row(self, format: Format, w: &[u8], a: &[Q8Block]) -> Option<f32> {
        let kb = a.len();
        assert!(
            w.len() >= row_bytes(format, kb)?,
            "{format:?} row too short for {kb} blocks"
        );
        let w = w.as_ptr();
        // SAFETY: `self` proves the CPU features; the assert bounds every read of `w`.
        unsafe {
            Some(match format {
                Format::Q4_0 => row::<Q4_0>(w, a),
                Format::Q4_1 => row::<Q4_1>(w, a),
                Format::Q5_0 => row::<Q5_0>(w, a),
                Format::Q5_1 => row::<Q5_1>(w, a),
                Format::Q8_0 => row::<Q8_0>(w, a),
                Format::IQ4_NL => row::<Iq4Nl>(w, a),
                Format::IQ4_XS => row::<Iq4Xs>(w, a),
                Format::MXFP4 => row::<Mxfp4>(w, a),
                _ => return None,
            })
        }
    }
}

/// Bytes of a row of `kb` 32-element blocks of `format` (`None`: not one of these formats;
/// IQ4_XS needs whole super-blocks).
pub(super) fn row_bytes(format: Format, kb: usize) -> Option<usize> {
    Some(match format {
        Format::Q4_0 => 18 * kb,
        Format::Q4_1 => 20 * kb,
        Format::Q5_0 => 22 * kb,
        Format::Q5_1 => 24 * kb,
        Format::Q8_0 => 34 * kb,
        Format::IQ4_NL => IQ4_NL_BYTES * kb,
        Format::MXFP4 => MXFP4_BYTES * kb,
        Format::IQ4_XS => {
            assert!(kb.is_multiple_of(XS_SUB), "iq4_xs: not whole super-blocks");
            IQ4_XS_BYTES * (kb / XS_SUB)
        }
        _ => return None,
    })
}

/// A block format as 32 unsigned bytes `w_j + OFFSET` and a scale per 32-element block. The
/// decoders use AVX2 and F16C instructions only, so the AVX2 GEMM kernel
/// ([`super::avx2_panel`]) shares them.
pub(super) trait Codec {
    /// What was added to every weight to make it unsigned.
    const OFFSET: i32;
    /// Block `b` of the row at `row`: its 32 shifted weights and its scale.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C (which [`Avx512`] implies); the row must hold
    /// block `b`.
    unsafe fn block(row: *const u8, b: usize) -> (__m256i, f32);
    /// Whether blocks also carry a minimum `m` (Q4_1, Q5_1: element `j` is `d * u_j + m`), whose
    /// term `m * a.s` follows the block's in the sum.
    const MIN: bool = false;
    /// Block `b`'s minimum (when [`MIN`](Self::MIN)).
    ///
    /// # Safety
    /// As [`block`](Self::block).
    #[inline(always)]
    unsafe fn min(row: *const u8, b: usize) -> f32 {
        let _ = (row, b);
        0.0
    }
    /// Prefetches the weights some way ahead of block `b`.
    ///
    /// # Safety
    /// As [`block`](Self::block) (the prefetch itself may point past the row).
    unsafe fn prefetch(row: *const u8, b: usize);
}

/// The f16 at `p` as f32.
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = i32::from(p.cast::<u16>().read_unaligned());
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
}

/// The 32 bytes `table[nibble_j]` of the 16 index bytes at `p`, low nibbles first.
#[inline(always)]
unsafe fn lookup(table: __m128i, p: *const u8) -> __m256i {
    let mask = _mm_set1_epi8(0x0F);
    let q = _mm_loadu_si128(p.cast());
    let lo = _mm_shuffle_epi8(table, _mm_and_si128(q, mask));
    let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(q), mask));
    _mm256_set_m128i(hi, lo)
}

/// A 16-value int8 table shifted by 128, as unsigned bytes in a register.
#[inline(always)]
unsafe fn shifted_table(values: &[i8; 16]) -> __m128i {
    _mm_xor_si128(
        _mm_loadu_si128(values.as_ptr().cast()),
        _mm_set1_epi8(0x80u8 as i8),
    )
}

#[inline(always)]
unsafe fn prefetch_at(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD).cast());
}

/// Q8_0: `d: f16`, 32 `i8`.
pub(super) struct Q8_0;
impl Codec for Q8_0 {
    const OFFSET: i32 = 128;
    #[inline(always)]
    unsafe fn block(row: *const u8, b: usize) -> (__m256i, f32) {
        let p = row.add(34 * b);
        let w = _mm256_loadu_si256(p.add(2).cast());
        (
            _mm256_xor_si256(w, _mm256_set1_epi8(0x80u8 as i8)),
            f16_at(p),
        )
    }
    #[inline(always)]
    unsafe fn prefetch(row: *const u8, b: usize) {
        if b.is_multiple_of(2) {
            prefetch_at(row.wrapping_add(34 * b));
            prefetch_at(row.wrapping_add(34 * b + 64));
        }
    }
}

/// Q4_0: `d: f16`, 16 bytes of nibbles; element `j` is `d * (nibble_j - 8)`.
pub(super) struct Q4_0;
impl Codec for Q4_0 {
    const OFFSET: i32 = 8;
    #[inline(always)]
    unsafe fn block(row: *const u8, b: usize) -> (__m256i, f32) {
        let p = row.add(18 * b);
        let mask = _mm_set1_epi8(0x0F);
        let q = _mm_loadu_si128(p.add(2).cast());
        let lo = _mm_and_si128(q, mask);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), mask);
        (_mm256_set_m128i(hi, lo), f16_at(p))
    }
    #[inline(always)]
    unsafe fn prefetch(row: *const u8, b: usize) {
        if b.is_multiple_of(2) {
            prefetch_at(row.wrapping_add(18 * b));
        }
    }
}

/// Q4_1: `d: f16`, `m: f16`, 16 bytes of nibbles; element `j` is `d * nibble_j + m`.
pub(super) struct Q4_1;
impl Codec for Q4_1 {
    const OFFSET: i32 = 0;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn block(row: *const u8, b: usize) -> (__m256i, f32) {
        let p = row.add(20 * b);
        let mask = _mm_set1_epi8(0x0F);
        let q = _mm_loadu_si128(p.add(4).cast());
        let lo = _mm_and_si128(q, mask);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), mask);
        (_mm256_set_m128i(hi, lo), f16_at(p))
    }
    #[inline(always)]
    unsafe fn min(row: *const u8, b: usize) -> f32 {
        f16_at(row.add(20 * b + 2))
    }
    #[inline(always)]
    unsafe fn prefetch(row: *const u8, b: usize) {
        if b.is_multiple_of(2) {
            prefetch_at(row.wrapping_add(20 * b));
        }
    }
}

/// The 32 five-bit values of a Q5 block: the nibbles at `qs` (low nibbles first, as Q4_0)
/// with `0x10` OR-ed in where bit `j` of the little-endian `qh` at `qh` is set.
#[inline(always)]
unsafe fn five_bits(qh: *const u8, qs: *const u8) -> __m256i {
    let mask = _mm_set1_epi8(0x0F);
    let q = _mm_loadu_si128(qs.cast());
    let lo = _mm_and_si128(q, mask);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), mask);
    let qh = u32::from_le(qh.cast::<u32>().read_unaligned());
    _mm256_or_si256(_mm256_set_m128i(hi, lo), q5::avx2::high_bits(qh))
}

/// Q5_0: `d: f16`, `qh: u32`, 16 bytes of nibbles; element `j` is `d * (q_j - 16)`
/// ([`super::q5`]).
pub(super) struct Q5_0;
impl Codec for Q5_0 {
    const OFFSET: i32 = 16;
    #[inline(always)]
    unsafe fn block(row: *const u8, b: usize) -> (__m256i, f32) {
        let p = row.add(22 * b);
        (five_bits(p.add(2), p.add(6)), f16_at(p))
    }
    #[inline(always)]
    unsafe fn prefetch(row: *const u8, b: usize) {
        if b.is_multiple_of(2) {
            prefetch_at(row.wrapping_add(22 * b));
        }
    }
}

/// Q5_1: `d: f16`, `m: f16`, `qh: u32`, 16 bytes of nibbles; element `j` is `d * q_j + m`.
pub(super) struct Q5_1;
impl Codec for Q5_1 {
    const OFFSET: i32 = 0;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn block(row: *const u8, b: usize) -> (__m256i, f32) {
        let p = row.add(24 * b);
        (five_bits(p.add(4), p.add(8)), f16_at(p))
    }
    #[inline(always)]
    unsafe fn min(row: *const u8, b: usize) -> f32 {
        f16_at(row.add(24 * b + 2))
    }
    #[inline(always)]
    unsafe fn prefetch(row: *const u8, b: usize) {
        if b.is_multiple_of(2) {
            prefetch_at(row.wrapping_add(24 * b));
        }
    }
}

/// IQ4_NL: `d: f16`, 16 bytes of indices into [`iq4::KVALUES`].
pub(super) struct Iq4Nl;
impl Codec for Iq4Nl {
    const OFFSET: i32 = 128;
    #[inline(always)]
    unsafe fn block(row: *const u8, b: usize) -> (__m256i, f32) {
        let p = row.add(IQ4_NL_BYTES * b);
        (lookup(shifted_table(&iq4::KVALUES), p.add(2)), f16_at(p))
    }
    #[inline(always)]
    unsafe fn prefetch(row: *const u8, b: usize) {
        if b.is_multiple_of(2) {
            prefetch_at(row.wrapping_add(IQ4_NL_BYTES * b));
        }
    }
}

/// MXFP4: an E8M0 byte, 16 bytes of indices into [`mxfp4::KVALUES`].
pub(super) struct Mxfp4;
impl Codec for Mxfp4 {
    const OFFSET: i32 = 128;
    #[inline(always)]
    unsafe fn block(row: *const u8, b: usize) -> (__m256i, f32) {
        let p = row.add(MXFP4_BYTES * b);
        let table = shifted_table(&mxfp4::KVALUES);
        (lookup(table, p.add(1)), mxfp4::e8m0_half(*p))
    }
    #[inline(always)]
    unsafe fn prefetch(row: *const u8, b: usize) {
        if b.is_multiple_of(2) {
            prefetch_at(row.wrapping_add(MXFP4_BYTES * b));
        }
    }
}

/// IQ4_XS: 32-element sub-block `b % 8` of super-block `b / 8`, scale `d * (ls - 32)`.
pub(super) struct Iq4Xs;
impl Codec for Iq4Xs {
    const OFFSET: i32 = 128;
    #[inline(always)]
    unsafe fn block(row: *const u8, b: usize) -> (__m256i, f32) {
        let p = row.add(IQ4_XS_BYTES * (b / XS_SUB));
        let i = b % XS_SUB;
        let sb = std::slice::from_raw_parts(p, IQ4_XS_BYTES);
        let scale = f16_at(p) * iq4::xs_scale(sb, i) as f32;
        (
            lookup(shifted_table(&iq4::KVALUES), p.add(8 + 16 * i)),
            scale,
        )
    }
    #[inline(always)]
    unsafe fn prefetch(row: *const u8, b: usize) {
        if b.is_multiple_of(XS_SUB) {
            let p = row.wrapping_add(IQ4_XS_BYTES * (b / XS_SUB));
            prefetch_at(p);
            prefetch_at(p.wrapping_add(64));
        }
    }
}

/// The exact integer dot product of a decoded block `u` (offset `offset`) with `a`.
#[inline(always)]
unsafe fn block_sum(u: __m256i, offset: i32, a: &Q8Block) -> i32 {
    let y = _mm256_loadu_si256(a.qs.as_ptr().cast());
    let s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, y);
    let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s) - offset * a.isum
}

/// The row kernel of every [`Codec`] (see the module header for the arithmetic).
///
/// # Safety
/// The CPU must have the features of [`Avx512`]; the row at `w` must hold `a.len()` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn row<C: Codec>(w: *const u8, a: &[Q8Block]) -> f32 {
    let mut acc = 0f32;
    for (b, a) in a.iter().enumerate() {
        C::prefetch(w, b);
        let (u, d) = C::block(w, b);
        let sumi = block_sum(u, C::OFFSET, a);
        acc = (sumi as f32).mul_add(d * a.d, acc);
        if C::MIN {
            acc = C::min(w, b).mul_add(a.s, acc);
        }
    }
    acc
}
