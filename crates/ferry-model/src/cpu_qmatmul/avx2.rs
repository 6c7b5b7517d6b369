//! AVX2 dot products of one raw GGUF weight row with one quantized activation row (same
//! contract as [`super::scalar`]; see there for the block layouts).
//!
//! Per 32-element block the weights are widened to 32 bytes, multiplied with the int8
//! activations by `vpmaddubsw` (unsigned x signed byte pairs summed into i16; no saturation is
//! possible with 4-bit weights, nor with 8-bit weights after the sign trick) and `vpmaddwd`
//! (into i32), then scaled in f32 and accumulated with FMA. The f16 scales are converted with
//! F16C. The weight stream is prefetched [`PREFETCH_AHEAD`] bytes ahead. Only [`Avx2`],
//! which exists only when the CPU has AVX2, FMA and F16C, can call them.

use std::arch::x86_64::*;

use super::activation::Q8Block;
use super::avx2_tile::{has_vnni, vnni_sums};

/// Proof that this CPU has AVX2, FMA and F16C.
#[derive(Debug, Clone, Copy)]
pub struct Avx2(());

impl Avx2 {
    /// `Some` when the running CPU supports the kernels.
    pub fn detect() -> Option<Self> {
        let ok = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        ok.then_some(Avx2(()))
    }

    /// Dot product of a Q4_0 row (at least `18 * a.len()` bytes) with `a`.
    pub fn dot_q4_0(self, w: &[u8], a: &[Q8Block]) -> f32 {
        assert!(w.len() >= 18 * a.len(), "q4_0 row too short");
        // SAFETY: `self` proves the features; the assert bounds every read of `w`.
        unsafe { q4_0(w.as_ptr(), a) }
    }

    /// Dot product of a Q4_1 row (at least `20 * a.len()` bytes) with `a`.
    pub fn dot_q4_1(self, w: &[u8], a: &[Q8Block]) -> f32 {
        assert!(w.len() >= 20 * a.len(), "q4_1 row too short");
        // SAFETY: as in `dot_q4_0`.
        unsafe { q4_1(w.as_ptr(), a) }
    }

    /// Dot product of a Q8_0 row (at least `34 * a.len()` bytes) with `a`.
    pub fn dot_q8_0(self, w: &[u8], a: &[Q8Block]) -> f32 {
        assert!(w.len() >= 34 * a.len(), "q8_0 row too short");
        // SAFETY: as in `dot_q4_0`.
        unsafe { q8_0_plain(w.as_ptr(), a) }
    }

    /// [`dot_q8_0`](Self::dot_q8_0) with AVX-VNNI's `vpdpbusd` where the CPU has it
    /// ([`has_vnni`]): the same lane sums, so the same result bit for bit.
    pub fn dot_q8_0_vnni(self, w: &[u8], a: &[Q8Block]) -> f32 {
        if !has_vnni() {
            return self.dot_q8_0(w, a);
        }
        assert!(w.len() >= 34 * a.len(), "q8_0 row too short");
        // SAFETY: as in `dot_q4_0`, and `has_vnni` proves AVX-VNNI.
        unsafe { q8_0_vnni(w.as_ptr(), a) }
    }
}

/// How far ahead of the block being read the weight stream is prefetched, in bytes. Weights
/// are read once per token from far outside the caches, and on the machines measured the
/// hardware prefetcher alone left the kernels waiting on memory; 2 KiB ahead (tried 512 B to
/// 4 KiB) cut the single-thread decode time by about a third.
pub(super) const PREFETCH_AHEAD: usize = 2048;

/// Horizontal sum of eight f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// The 32 nibbles of 16 packed bytes at `p`, low halves first, as unsigned bytes.
///
/// # Safety
/// `p..p + 16` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn nibbles(p: *const u8) -> __m256i {
    let mask = _mm_set1_epi8(0x0F);
    let q = _mm_loadu_si128(p.cast());
    let lo = _mm_and_si128(q, mask);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(q), mask);
    _mm256_set_m128i(hi, lo)
}

/// Sums of `u8 * i8` products, eight i32 lanes as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_u8_i8(w: __m256i, y: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(sums_u8_i8(w, y))
}

/// Sums of `u8 * i8` products (four per lane), eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn sums_u8_i8(w: __m256i, y: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(w, y);
    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
}

/// The activation block's int8 values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load_act(a: &Q8Block) -> __m256i {
    // SAFETY: `qs` is 32 bytes.
    unsafe { _mm256_loadu_si256(a.qs.as_ptr().cast()) }
}

/// The f16 at `p` as f32.
///
/// By `vmovd` from a general register (which zeroes the vector register's other lanes) and
/// `vcvtph2ps`, in `asm!`: from the intrinsics the compiler, seeing one lane used, loads the
/// f16 with a `vpinsrw` into whatever register is at hand, which makes the conversion wait for
/// that register's last writer. In the Q4_0 / Q5_0 / Q5_1 row kernels that was the scalar
/// offset sum, chaining every block's scale to the previous block's offset term: those kernels
/// ran at about a third of Q8_0's bytes per second at m = 1.
///
/// # Safety
/// `p..p + 2` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = u32::from(p.cast::<u16>().read_unaligned());
    let out: __m128;
    // SAFETY: F16C is enabled for this function; the instructions touch registers only.
    std::arch::asm!(
        "vmovd {x}, {bits:e}",
        "vcvtph2ps {x}, {x}",
        bits = in(reg) bits,
        x = out(xmm_reg) out,
        options(pure, nomem, nostack, preserves_flags),
    );
    _mm_cvtss_f32(out)
}

/// `d * a.d` in lane 0, for the block at `p` whose f16 scale `d` comes first (Q8_0, Q5_0):
/// `d` converted straight from memory (`vcvtph2ps` of the block's first 8 bytes, whose other
/// three lanes are unused), in `asm!` as [`f16_at`] and for its reason (from the intrinsics the
/// compiler loaded the f16 with a `vpinsrw` into the Q5_0 row's accumulator, which made every
/// block wait for the previous one), and two instructions fewer than [`f16_at`]. The value is
/// `f16_at(p) * a.d` exactly.
///
/// # Safety
/// `p..p + 8` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn block_scale(p: *const u8, a: &Q8Block) -> __m128 {
    let d: __m128;
    // SAFETY: F16C is enabled for this function; the caller makes `p..p + 8` readable.
    std::arch::asm!(
        "vcvtph2ps {d}, qword ptr [{p}]",
        p = in(reg) p,
        d = out(xmm_reg) d,
        options(pure, readonly, nostack, preserves_flags),
    );
    _mm_mul_ss(d, _mm_load_ss(&a.d))
}

/// # Safety
/// The CPU must have AVX2, FMA, F16C; `w..w + 18 * a.len()` must be readable.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0(w: *const u8, a: &[Q8Block]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut offset = 0f32;
    for (i, a) in a.iter().enumerate() {
        let p = w.add(18 * i);
        if i % 2 == 0 {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD).cast());
        }
        let scale = f16_at(p) * a.d;
        let prod = dot_u8_i8(nibbles(p.add(2)), load_act(a));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(scale), prod, acc);
        offset += scale * (8 * a.isum) as f32;
    }
    hsum(acc) - offset
}

/// # Safety
/// The CPU must have AVX2, FMA, F16C; `w..w + 20 * a.len()` must be readable.
///
/// Each block's two scalar products, `d * a.d` (its scale) and `m * a.s` (its offset term),
/// are one `vmulps` of `[d, m]` (one F16C conversion) by `[a.d, a.s]` (adjacent fields of
/// [`Q8Block`]), and the offset sum `offset + (m0 s0 + m1 s1)` is kept in lane 1 of a
/// register: the scalar operations and order, in two fewer multiplies and no lane moves per
/// block (the loop was bound by the vector ports at m = 1).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1(w: *const u8, a: &[Q8Block]) -> f32 {
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    // Lane 1: the offset sum (lane 0 sums the scales, unused).
    let mut offset = _mm_setzero_ps();
    let mut pairs = a.chunks_exact(2);
    let mut p = w;
    for pair in &mut pairs {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD).cast());
        // Lanes [d0 * a0.d, m0 * a0.s, 0, 0] and the same of block 1.
        let t0 = _mm_mul_ps(dm_at(p), d_s(&pair[0]));
        let t1 = _mm_mul_ps(dm_at(p.add(20)), d_s(&pair[1]));
        let prod0 = dot_u8_i8(nibbles(p.add(4)), load_act(&pair[0]));
        let prod1 = dot_u8_i8(nibbles(p.add(24)), load_act(&pair[1]));
        acc0 = _mm256_fmadd_ps(_mm256_broadcastss_ps(t0), prod0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_broadcastss_ps(t1), prod1, acc1);
        offset = _mm_add_ps(offset, _mm_add_ps(t0, t1));
        p = p.add(40);
    }
    if let [last] = pairs.remainder() {
        let t = _mm_mul_ps(dm_at(p), d_s(last));
        let prod = dot_u8_i8(nibbles(p.add(4)), load_act(last));
        acc0 = _mm256_fmadd_ps(_mm256_broadcastss_ps(t), prod, acc0);
        offset = _mm_add_ps(offset, t);
    }
    hsum(_mm256_add_ps(acc0, acc1)) + _mm_cvtss_f32(_mm_movehdup_ps(offset))
}

/// The f16 pair `[d, m]` at `p` as `[d, m, 0, 0]`.
///
/// # Safety
/// `p..p + 4` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dm_at(p: *const u8) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128(p.cast::<i32>().read_unaligned()))
}

/// `[a.d, a.s, 0, 0]` (adjacent `f32` fields of the `repr(C)` [`Q8Block`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn d_s(a: &Q8Block) -> __m128 {
    // SAFETY: `d` and `s` are the block's first eight bytes.
    unsafe { _mm_castsi128_ps(_mm_loadl_epi64((a as *const Q8Block).cast())) }
}

/// # Safety
/// The CPU must have AVX2, FMA, F16C; `w..w + 34 * a.len()` must be readable.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_plain(w: *const u8, a: &[Q8Block]) -> f32 {
    q8_0::<false>(w, a)
}

/// # Safety
/// As [`q8_0_plain`], and the CPU must have AVX-VNNI.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_vnni(w: *const u8, a: &[Q8Block]) -> f32 {
    q8_0::<true>(w, a)
}

/// The Q8_0 row loop, with `vpdpbusd` for `vpmaddubsw` + `vpmaddwd` when `VNNI`.
///
/// # Safety
/// As [`q8_0_plain`] (inlined into it and [`q8_0_vnni`]).
#[inline(always)]
unsafe fn q8_0<const VNNI: bool>(w: *const u8, a: &[Q8Block]) -> f32 {
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut pairs = a.chunks_exact(2);
    let mut p = w;
    for pair in &mut pairs {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD).cast());
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD + 64).cast());
        acc0 = q8_0_block::<VNNI>(p, &pair[0], acc0);
        acc1 = q8_0_block::<VNNI>(p.add(34), &pair[1], acc1);
        p = p.add(68);
    }
    if let [last] = pairs.remainder() {
        acc0 = q8_0_block::<VNNI>(p, last, acc0);
    }
    hsum(_mm256_add_ps(acc0, acc1))
}

/// `acc + scale * (w . y)` for the Q8_0 block at `p`.
///
/// # Safety
/// `p..p + 34` must be readable (and the CPU must have AVX-VNNI when `VNNI`).
#[inline(always)]
unsafe fn q8_0_block<const VNNI: bool>(p: *const u8, a: &Q8Block, acc: __m256) -> __m256 {
    let wv = _mm256_loadu_si256(p.add(2).cast());
    let yv = load_act(a);
    // |w| * (y * sign(w)) == w * y, with the unsigned operand first as vpmaddubsw needs.
    let (u, s) = (_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(yv, wv));
    let sums = if VNNI {
        vnni_sums(u, s)
    } else {
        sums_u8_i8(u, s)
    };
    let scale = _mm256_broadcastss_ps(block_scale(p, a));
    _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(sums), acc)
}

/// The 32 signed bytes `table[nibble_j]` for the 16 packed index bytes at `p` (low halves
/// first): the weights of an IQ4_NL / IQ4_XS / MXFP4 block, looked up with `vpshufb`.
///
/// # Safety
/// `p..p + 16` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn table_block(table: __m128i, p: *const u8) -> __m256i {
    let mask = _mm_set1_epi8(0x0F);
    let q = _mm_loadu_si128(p.cast());
    let lo = _mm_shuffle_epi8(table, _mm_and_si128(q, mask));
    let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16::<4>(q), mask));
    _mm256_set_m128i(hi, lo)
}

/// How a table-coded block's header holds its scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum BlockScale {
    /// An f16 (IQ4_NL: 2 bytes).
    F16,
    /// An E8M0 exponent, halved ([`super::mxfp4::e8m0_half`]; MXFP4: 1 byte).
    E8m0Half,
}

impl BlockScale {
    /// Bytes of the header before the 16 index bytes.
    pub(super) const fn header_bytes(self) -> usize {
        match self {
            BlockScale::F16 => 2,
            BlockScale::E8m0Half => 1,
        }
    }
}

/// The scale in the header at `p`.
///
/// # Safety
/// `p..p + scale.header_bytes()` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scale_at(scale: BlockScale, p: *const u8) -> f32 {
    match scale {
        BlockScale::F16 => f16_at(p),
        BlockScale::E8m0Half => super::mxfp4::e8m0_half(*p),
    }
}

/// Dot product of a row of table-coded 32-element blocks (a scale header, then 16 bytes of
/// 4-bit indices into `table`: IQ4_NL, MXFP4) with `a`, two blocks per step in two
/// accumulators.
///
/// # Safety
/// `w..w + (scale.header_bytes() + 16) * a.len()` must be readable.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn table_row(
    table: __m128i,
    scale: BlockScale,
    w: *const u8,
    a: &[Q8Block],
) -> f32 {
    let head = scale.header_bytes();
    let block = head + 16;
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut pairs = a.chunks_exact(2);
    let mut p = w;
    for pair in &mut pairs {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD).cast());
        let w0 = table_block(table, p.add(head));
        let w1 = table_block(table, p.add(head + block));
        let s0 = scale_at(scale, p) * pair[0].d;
        let s1 = scale_at(scale, p.add(block)) * pair[1].d;
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(s0), table_product(w0, &pair[0]), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(s1), table_product(w1, &pair[1]), acc1);
        p = p.add(2 * block);
    }
    if let [last] = pairs.remainder() {
        let w0 = table_block(table, p.add(head));
        let s0 = scale_at(scale, p) * last.d;
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(s0), table_product(w0, last), acc0);
    }
    hsum(_mm256_add_ps(acc0, acc1))
}

/// Sums of the signed weight bytes `w` times the block's activations, eight i32 lanes as f32
/// (the sign trick of Q8_0; `w` holds no -128).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn table_product(w: __m256i, a: &Q8Block) -> __m256 {
    let y = load_act(a);
    dot_u8_i8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(y, w))
}
