//! AVX2 dot products of one raw GGUF weight row with four quantized activation rows at once
//! (the micro-kernels of [`super::tile`]): each weight block is loaded and unpacked once and
//! multiplied with the four activation rows' blocks while it sits in registers.
//!
//! Every output is computed with exactly the operations, in exactly the order, of the
//! one-row kernel in [`super::avx2`] or [`super::q5::avx2`] (same accumulators, same offset
//! sums, in the same lanes or scalars), so a tiled
//! matmul returns bit for bit what the row-by-row one does. Where the CPU has AVX-VNNI the
//! byte products are summed by one `vpdpbusd` instead of `vpmaddubsw` + `vpmaddwd`: both give
//! the same 32-bit sums of the same four products per lane (the 16-bit stage cannot saturate,
//! see [`super::avx2`]), so that too leaves every result unchanged.

// The four rows' blocks are indexed in lockstep, by block and by row.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::avx2::{
    dot_u8_i8, f16_at, hsum, load_act, nibbles, scale_at, table_block, Avx2, BlockScale,
    PREFETCH_AHEAD,
};
use super::iq4::{self, IQ4_NL_BYTES, IQ4_XS_BYTES, XS_SUB};
use super::mxfp4::{self, MXFP4_BYTES};
use super::tile::Rows4;

fn check(w: &[u8], a: &Rows4<'_>, block_bytes: usize, what: &str) {
    let kb = a[0].len();
    assert!(
        a.iter().all(|r| r.len() == kb),
        "{what}: activation rows differ in length"
    );
    assert!(w.len() >= block_bytes * kb, "{what} row too short");
}

/// Whether the CPU has AVX-VNNI (CPUID leaf 7, sub-leaf 1, EAX bit 4; read once). The
/// standard library's detection and intrinsics for it are newer than this crate's MSRV, so
/// the instruction is issued by `asm!` in [`dot`].
pub fn has_vnni() -> bool {
    static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VNNI.get_or_init(|| {
        // SAFETY: CPUID is available on every x86_64 CPU (the intrinsics are safe functions
        // in newer Rust, unsafe at the MSRV); leaf 7 is read only when it exists.
        #[allow(unused_unsafe)]
        let leaf7 = unsafe { (__cpuid(0).eax >= 7).then(|| __cpuid_count(7, 1).eax) };
        leaf7.is_some_and(|eax| (eax >> 4) & 1 == 1) && Avx2::detect().is_some()
    })
}

/// [`Avx2::dot_q4_0`] of `w` with each of the four rows `a` (with `vnni` where the CPU has
/// it: [`has_vnni`]).
pub fn q4_0(k: Avx2, vnni: bool, w: &[u8], a: Rows4<'_>) -> [f32; 4] {
    let _ = k;
    check(w, &a, 18, "q4_0");
    // SAFETY: the `Avx2` token proves the features (`run` checks AVX-VNNI and AVX-512 VL);
    // `check` bounds every read of `w`.
    unsafe { q4_0_variants::run(vnni, w.as_ptr(), a) }
}

/// [`Avx2::dot_q4_1`] of `w` with each of the four rows `a` (see [`q4_0`] for `vnni`).
pub fn q4_1(k: Avx2, vnni: bool, w: &[u8], a: Rows4<'_>) -> [f32; 4] {
    let _ = k;
    check(w, &a, 20, "q4_1");
    // SAFETY: as in `q4_0`.
    unsafe { q4_1_variants::run(vnni, w.as_ptr(), a) }
}

/// [`Avx2::dot_q8_0`] of `w` with each of the four rows `a` (see [`q4_0`] for `vnni`).
pub fn q8_0(k: Avx2, vnni: bool, w: &[u8], a: Rows4<'_>) -> [f32; 4] {
    let _ = k;
    check(w, &a, 34, "q8_0");
    // SAFETY: as in `q4_0`.
    unsafe { q8_0_variants::run(vnni, w.as_ptr(), a) }
}

/// Sums of `u8 * i8` products, eight i32 lanes of four products each, as f32.
///
/// # Safety
/// The CPU must have AVX2 (and AVX-VNNI when `VNNI`); inlined into the callers below.
#[inline(always)]
unsafe fn dot<const VNNI: bool>(w: __m256i, y: __m256i) -> __m256 {
    if VNNI {
        vnni_dot(w, y)
    } else {
        dot_u8_i8(w, y)
    }
}

/// [`dot_u8_i8`] by one `vpdpbusd` (AVX-VNNI, VEX encoded).
///
/// # Safety
/// The CPU must have AVX2 and AVX-VNNI.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vnni_dot(w: __m256i, y: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(vnni_sums(w, y))
}

/// [`super::avx2::sums_u8_i8`] by one `vpdpbusd` (AVX-VNNI, VEX encoded).
///
/// # Safety
/// The CPU must have AVX2 and AVX-VNNI.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn vnni_sums(w: __m256i, y: __m256i) -> __m256i {
    dpbusd(_mm256_setzero_si256(), w, y)
}

/// `vpdpbusd`: `acc` plus the sums of four `u8 * i8` products per lane (AVX-VNNI, VEX
/// encoded, by `asm!`: see [`has_vnni`]).
///
/// # Safety
/// The CPU must have AVX2 and AVX-VNNI.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dpbusd(acc: __m256i, u: __m256i, y: __m256i) -> __m256i {
    let mut acc = acc;
    // SAFETY: the caller has AVX-VNNI; the instruction reads and writes registers only.
    std::arch::asm!(
        "{{vex}} vpdpbusd {acc}, {u}, {y}",
        acc = inout(ymm_reg) acc,
        u = in(ymm_reg) u,
        y = in(ymm_reg) y,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

/// Three entry points per format: the kernel body compiled without AVX-VNNI, with it, and with
/// it where the CPU also has AVX-512 VL ([`wide_registers`]), whose 32 vector registers hold
/// all of a body's accumulators. With AVX2's 16 a body that spills one to the stack every block
/// loses when the heap happens to place the activations at the stack slot's address modulo
/// 4 KiB: every load after that store waits for it (measured with Q4_1: the default model's
/// 512-token prefill 0.7x as fast, depending on where an earlier allocation was freed). The
/// two-block bodies therefore compute one block at a time ([`signed_block`],
/// [`unsigned_block`]) and none of the bodies spills a vector on 16 registers either (checked
/// in the disassembly); the wide variant is kept for the CPUs that have AVX-512 VL.
macro_rules! variants {
    ($module:ident, $body:ident) => {
        mod $module {
            use super::*;

            /// # Safety
            /// The CPU must have AVX2, FMA, F16C; the row's bytes must be readable and every
            /// row of `a` as long as the first ([`check`]).
            #[target_feature(enable = "avx2,fma,f16c")]
            pub(super) unsafe fn plain(w: *const u8, a: Rows4<'_>) -> [f32; 4] {
                $body::<false>(w, a)
            }

            /// # Safety
            /// As [`plain`], and the CPU must have AVX-VNNI.
            #[target_feature(enable = "avx2,fma,f16c")]
            pub(super) unsafe fn vnni(w: *const u8, a: Rows4<'_>) -> [f32; 4] {
                $body::<true>(w, a)
            }

            /// # Safety
            /// As [`vnni`], and the CPU must have AVX-512 F and VL.
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
            pub(super) unsafe fn wide(w: *const u8, a: Rows4<'_>) -> [f32; 4] {
                $body::<true>(w, a)
            }

            /// The fastest of the three this CPU runs, AVX-VNNI only when `vnni` allows it.
            ///
            /// # Safety
            /// As [`plain`].
            pub(super) unsafe fn run(vnni: bool, w: *const u8, a: Rows4<'_>) -> [f32; 4] {
                let vnni = vnni && has_vnni();
                match (vnni, vnni && wide_registers()) {
                    (true, true) => wide(w, a),
                    (true, false) => super::$module::vnni(w, a),
                    (false, _) => plain(w, a),
                }
            }
        }
    };
}

/// The AVX-VNNI variant compiled for AVX2's sixteen registers of `format` (`None` for one
/// without a four-row body, or without AVX-VNNI), even where `run` would take the wide one:
/// the path of [`super::Kernel::AvxVnni`], and for the tests, which hold it equal to the
/// others on CPUs that would never run it.
pub(super) fn narrow_vnni(format: super::Format, w: &[u8], a: Rows4<'_>) -> Option<[f32; 4]> {
    use super::Format;
    if !has_vnni() {
        return None;
    }
    let bytes = match format {
        Format::Q4_0 => 18,
        Format::Q4_1 => 20,
        Format::Q8_0 => 34,
        Format::Q5_0 => 22,
        Format::Q5_1 => 24,
        Format::IQ4_NL => IQ4_NL_BYTES,
        Format::MXFP4 => MXFP4_BYTES,
        Format::IQ4_XS => {
            assert!(a[0].len().is_multiple_of(XS_SUB));
            IQ4_XS_BYTES / XS_SUB
        }
        _ => return None,
    };
    check(w, &a, bytes, "narrow_vnni");
    // SAFETY: `has_vnni` proves AVX2 and AVX-VNNI; `check` bounds every read of `w` and makes
    // the rows equally long.
    unsafe {
        Some(match format {
            Format::Q4_0 => q4_0_variants::vnni(w.as_ptr(), a),
            Format::Q4_1 => q4_1_variants::vnni(w.as_ptr(), a),
            Format::Q8_0 => q8_0_variants::vnni(w.as_ptr(), a),
            Format::Q5_0 => q5_0_variants::vnni(w.as_ptr(), a),
            Format::Q5_1 => q5_1_variants::vnni(w.as_ptr(), a),
            Format::IQ4_NL => iq4_nl_variants::vnni(w.as_ptr(), a),
            Format::MXFP4 => mxfp4_variants::vnni(w.as_ptr(), a),
            _ => iq4_xs_variants::vnni(w.as_ptr(), a),
        })
    }
}

/// Whether the CPU has AVX-512 F and VL (ymm16-31 for the AVX-VNNI bodies; read once).
fn wide_registers() -> bool {
    static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WIDE
        .get_or_init(|| is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl"))
}

variants!(q4_0_variants, q4_0_body);
variants!(q4_1_variants, q4_1_body);
variants!(q8_0_variants, q8_0_body);

/// # Safety
/// Inlined into its variants (see `variants!`); `w..w + 18 * a[0].len()` must be readable.
#[inline(always)]
unsafe fn q4_0_body<const VNNI: bool>(w: *const u8, a: Rows4<'_>) -> [f32; 4] {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut offset = [0f32; 4];
    for i in 0..a[0].len() {
        let p = w.add(18 * i);
        if i % 2 == 0 {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD).cast());
        }
        let dw = f16_at(p);
        let wq = nibbles(p.add(2));
        for r in 0..4 {
            let b = &a[r][i];
            let scale = dw * b.d;
            let prod = dot::<VNNI>(wq, load_act(b));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(scale), prod, acc[r]);
            offset[r] += scale * (8 * b.isum) as f32;
        }
    }
    std::array::from_fn(|r| hsum(acc[r]) - offset[r])
}

/// # Safety
/// Inlined into its variants (see `variants!`); `w..w + 20 * a[0].len()` must be readable and
/// every row of `a` as long as the first ([`check`]).
#[inline(always)]
unsafe fn q4_1_body<const VNNI: bool>(w: *const u8, a: Rows4<'_>) -> [f32; 4] {
    let kb = a[0].len();
    let mut acc0 = [_mm256_setzero_ps(); 4];
    let mut acc1 = [_mm256_setzero_ps(); 4];
    // The four rows' offset terms in one register (lane `r`: row `r`), each lane the scalar
    // `offset += m0 * s0 + m1 * s1` of the one-row kernel: four fewer live registers, so
    // the body spills less on AVX2's sixteen.
    let mut offset = _mm_setzero_ps();
    // SAFETY (each `get_unchecked`): the rows hold `kb` blocks and `i < kb`.
    let s_of = |i: usize| {
        let s = |r: usize| unsafe { a[r].get_unchecked(i).s };
        _mm_set_ps(s(3), s(2), s(1), s(0))
    };
    let mut p = w;
    for j in 0..kb / 2 {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD).cast());
        let dm0 = _mm_cvtph_ps(_mm_cvtsi32_si128(p.cast::<i32>().read_unaligned()));
        let d0 = _mm_cvtss_f32(dm0);
        unsigned_block::<VNNI>(nibbles(p.add(4)), d0, a, 2 * j, &mut acc0);
        let dm1 = _mm_cvtph_ps(_mm_cvtsi32_si128(p.add(20).cast::<i32>().read_unaligned()));
        let d1 = _mm_cvtss_f32(dm1);
        unsigned_block::<VNNI>(nibbles(p.add(24)), d1, a, 2 * j + 1, &mut acc1);
        // Lane-wise `m0 * s0 + m1 * s1`, then added: the scalar's operations and order.
        let m0 = _mm_shuffle_ps::<0b01_01_01_01>(dm0, dm0);
        let m1 = _mm_shuffle_ps::<0b01_01_01_01>(dm1, dm1);
        let terms = _mm_add_ps(_mm_mul_ps(m0, s_of(2 * j)), _mm_mul_ps(m1, s_of(2 * j + 1)));
        offset = _mm_add_ps(offset, terms);
        p = p.add(40);
    }
    if kb % 2 == 1 {
        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(p.cast::<i32>().read_unaligned()));
        let d = _mm_cvtss_f32(dm);
        unsigned_block::<VNNI>(nibbles(p.add(4)), d, a, kb - 1, &mut acc0);
        let m = _mm_shuffle_ps::<0b01_01_01_01>(dm, dm);
        offset = _mm_add_ps(offset, _mm_mul_ps(m, s_of(kb - 1)));
    }
    let mut offsets = [0f32; 4];
    _mm_storeu_ps(offsets.as_mut_ptr(), offset);
    std::array::from_fn(|r| hsum(_mm256_add_ps(acc0[r], acc1[r])) + offsets[r])
}

/// # Safety
/// Inlined into its variants (see `variants!`); `w..w + 34 * a[0].len()` must be readable and
/// every row of `a` as long as the first ([`check`]).
#[inline(always)]
unsafe fn q8_0_body<const VNNI: bool>(w: *const u8, a: Rows4<'_>) -> [f32; 4] {
    let kb = a[0].len();
    let mut acc0 = [_mm256_setzero_ps(); 4];
    let mut acc1 = [_mm256_setzero_ps(); 4];
    let mut p = w;
    for j in 0..kb / 2 {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD).cast());
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD + 64).cast());
        let wv = _mm256_loadu_si256(p.add(2).cast());
        signed_block::<VNNI>(wv, f16_at(p), a, 2 * j, &mut acc0);
        let wv = _mm256_loadu_si256(p.add(36).cast());
        signed_block::<VNNI>(wv, f16_at(p.add(34)), a, 2 * j + 1, &mut acc1);
        p = p.add(68);
    }
    if kb % 2 == 1 {
        let wv = _mm256_loadu_si256(p.add(2).cast());
        signed_block::<VNNI>(wv, f16_at(p), a, kb - 1, &mut acc0);
    }
    std::array::from_fn(|r| hsum(_mm256_add_ps(acc0[r], acc1[r])))
}

/// Block `i` of the four rows `a` against the unsigned weights `wq` (nibbles) scaled by `d`,
/// into `sums`, as [`signed_block`] does for signed ones.
///
/// # Safety
/// As [`signed_block`].
#[inline(always)]
unsafe fn unsigned_block<const VNNI: bool>(
    wq: __m256i,
    d: f32,
    a: Rows4<'_>,
    i: usize,
    sums: &mut [__m256; 4],
) {
    for (row, sum) in a.iter().zip(sums.iter_mut()) {
        let b = row.get_unchecked(i);
        let prod = dot::<VNNI>(wq, load_act(b));
        *sum = _mm256_fmadd_ps(_mm256_set1_ps(d * b.d), prod, *sum);
    }
}

/// Block `i` of the four rows `a` against the signed weights `wv` scaled by `d`, into `sums`
/// (row `r` into `sums[r]`). The bodies that take two blocks per iteration (even blocks into one
/// set of sums, odd into another, as their one-row kernels do) call it once per block, so that
/// only one block's weights are live beside the eight sums: within AVX2's sixteen registers.
///
/// # Safety
/// The CPU must have AVX2 (and AVX-VNNI when `VNNI`); every row of `a` must hold block `i`.
#[inline(always)]
unsafe fn signed_block<const VNNI: bool>(
    wv: __m256i,
    d: f32,
    a: Rows4<'_>,
    i: usize,
    sums: &mut [__m256; 4],
) {
    let abs = _mm256_sign_epi8(wv, wv);
    for (row, sum) in a.iter().zip(sums.iter_mut()) {
        let b = row.get_unchecked(i);
        let prod = dot::<VNNI>(abs, _mm256_sign_epi8(load_act(b), wv));
        *sum = _mm256_fmadd_ps(_mm256_set1_ps(d * b.d), prod, *sum);
    }
}

/// [`super::q5::avx2::dot_q5_0`] of `w` with each of the four rows `a` (see [`q4_0`] for
/// `vnni`).
pub fn q5_0(k: Avx2, vnni: bool, w: &[u8], a: Rows4<'_>) -> [f32; 4] {
    let _ = k;
    check(w, &a, 22, "q5_0");
    // SAFETY: as in `q4_0`.
    unsafe { q5_0_variants::run(vnni, w.as_ptr(), a) }
}

/// [`super::q5::avx2::dot_q5_1`] of `w` with each of the four rows `a` (see [`q4_0`] for
/// `vnni`).
pub fn q5_1(k: Avx2, vnni: bool, w: &[u8], a: Rows4<'_>) -> [f32; 4] {
    let _ = k;
    check(w, &a, 24, "q5_1");
    // SAFETY: as in `q4_0`.
    unsafe { q5_1_variants::run(vnni, w.as_ptr(), a) }
}

variants!(q5_0_variants, q5_0_body);
variants!(q5_1_variants, q5_1_body);

/// # Safety
/// Inlined into its variants (see `variants!`); `w..w + 22 * a[0].len()` must be readable and
/// every row of `a` as long as the first ([`check`]).
#[inline(always)]
unsafe fn q5_0_body<const VNNI: bool>(w: *const u8, a: Rows4<'_>) -> [f32; 4] {
    q5_body::<22, false, VNNI>(w, a)
}

/// # Safety
/// Inlined into its variants (see `variants!`); `w..w + 24 * a[0].len()` must be readable and
/// every row of `a` as long as the first ([`check`]).
#[inline(always)]
unsafe fn q5_1_body<const VNNI: bool>(w: *const u8, a: Rows4<'_>) -> [f32; 4] {
    q5_body::<24, true, VNNI>(w, a)
}

/// The four-row form of the AVX2 Q5 row kernel (Q5_0: `MIN = false`, 22-byte blocks; Q5_1:
/// `MIN = true`, 24-byte blocks): even blocks into one set of sums and odd into another, each
/// block's 5-bit weights made once for the four rows; Q5_0's offset in each row's integer
/// sums, Q5_1's offset terms summed block by block in the row kernel's order, the four rows'
/// in the lanes of one register (lane `r`: row `r`; lane-wise products and sums round as the
/// row kernel's lane 1 does).
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C (and AVX-VNNI when `VNNI`); `w..w + BYTES * a[0].len()`
/// must be readable and every row of `a` as long as the first ([`check`]).
#[inline(always)]
unsafe fn q5_body<const BYTES: usize, const MIN: bool, const VNNI: bool>(
    w: *const u8,
    a: Rows4<'_>,
) -> [f32; 4] {
    let kb = a[0].len();
    let mut acc0 = [_mm256_setzero_ps(); 4];
    let mut acc1 = [_mm256_setzero_ps(); 4];
    let mut offset = _mm_setzero_ps();
    let mut p = w;
    for j in 0..kb / 2 {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD).cast());
        offset = q5_block::<MIN, VNNI>(p, a, 2 * j, &mut acc0, offset);
        offset = q5_block::<MIN, VNNI>(p.add(BYTES), a, 2 * j + 1, &mut acc1, offset);
        p = p.add(2 * BYTES);
    }
    if kb % 2 == 1 {
        offset = q5_block::<MIN, VNNI>(p, a, kb - 1, &mut acc0, offset);
    }
    let mut offsets = [0f32; 4];
    _mm_storeu_ps(offsets.as_mut_ptr(), offset);
    std::array::from_fn(|r| {
        let sum = hsum(_mm256_add_ps(acc0[r], acc1[r]));
        if MIN {
            sum + offsets[r]
        } else {
            sum
        }
    })
}

/// Block `i` of a Q5 row at `p` for the four rows `a`, as the row kernel does it: its
/// weights into `sums` (Q5_0: each row's integer sums less `16 * isum` in lane 0 before the
/// conversion; Q5_1 as [`unsigned_block`]), and for Q5_1 `offset` plus its offset terms,
/// returned (lane `r`: row `r`'s `+ m * a.s`, as the row kernel's lane 1).
/// A function, not a closure, so that it is compiled with its caller's target features.
///
/// # Safety
/// As [`q5_body`]; every row of `a` must hold block `i`.
#[inline(always)]
unsafe fn q5_block<const MIN: bool, const VNNI: bool>(
    p: *const u8,
    a: Rows4<'_>,
    i: usize,
    sums: &mut [__m256; 4],
    offset: __m128,
) -> __m128 {
    use super::q5::avx2::{five_bits, less_offset};
    let d = f16_at(p);
    let q = five_bits(p.add(if MIN { 4 } else { 2 }));
    if MIN {
        unsigned_block::<VNNI>(q, d, a, i, sums);
        let b = [0, 1, 2, 3].map(|r| a[r].get_unchecked(i));
        let s = _mm_set_ps(b[3].s, b[2].s, b[1].s, b[0].s);
        return _mm_add_ps(offset, _mm_mul_ps(_mm_set1_ps(f16_at(p.add(2))), s));
    }
    for (row, sum) in a.iter().zip(sums.iter_mut()) {
        let b = row.get_unchecked(i);
        let y = load_act(b);
        let ints = if VNNI {
            vnni_sums(q, y)
        } else {
            super::avx2::sums_u8_i8(q, y)
        };
        let prod = _mm256_cvtepi32_ps(less_offset(ints, b.isum));
        *sum = _mm256_fmadd_ps(_mm256_set1_ps(d * b.d), prod, *sum);
    }
    offset
}

/// [`super::avx2::table_row`] (IQ4_NL: the f16-scaled table blocks) of `w` with each of the
/// four rows `a` (see [`q4_0`] for `vnni`).
pub fn iq4_nl(k: Avx2, vnni: bool, w: &[u8], a: Rows4<'_>) -> [f32; 4] {
    let _ = k;
    check(w, &a, IQ4_NL_BYTES, "iq4_nl");
    // SAFETY: as in `q4_0`.
    unsafe { iq4_nl_variants::run(vnni, w.as_ptr(), a) }
}

/// [`super::avx2::table_row`] (MXFP4: E8M0-scaled table blocks) of `w` with each of the four
/// rows `a` (see [`q4_0`] for `vnni`).
pub fn mxfp4(k: Avx2, vnni: bool, w: &[u8], a: Rows4<'_>) -> [f32; 4] {
    let _ = k;
    check(w, &a, MXFP4_BYTES, "mxfp4");
    // SAFETY: as in `q4_0`.
    unsafe { mxfp4_variants::run(vnni, w.as_ptr(), a) }
}

/// [`super::iq4::avx2_dot_iq4_xs`] of `w` with each of the four rows `a` (see [`q4_0`] for
/// `vnni`).
pub fn iq4_xs(k: Avx2, vnni: bool, w: &[u8], a: Rows4<'_>) -> [f32; 4] {
    let _ = k;
    assert!(
        a[0].len().is_multiple_of(XS_SUB),
        "iq4_xs: activation rows are not whole super-blocks"
    );
    check(w, &a, IQ4_XS_BYTES / XS_SUB, "iq4_xs");
    // SAFETY: as in `q4_0`.
    unsafe { iq4_xs_variants::run(vnni, w.as_ptr(), a) }
}

variants!(iq4_nl_variants, iq4_nl_body);
variants!(mxfp4_variants, mxfp4_body);
variants!(iq4_xs_variants, iq4_xs_body);

/// # Safety
/// Inlined into its variants (see `variants!`); `w..w + 18 * a[0].len()` must be readable and
/// every row of `a` as long as the first ([`check`]).
#[inline(always)]
unsafe fn iq4_nl_body<const VNNI: bool>(w: *const u8, a: Rows4<'_>) -> [f32; 4] {
    let table = _mm_loadu_si128(iq4::KVALUES.as_ptr().cast());
    table_body::<VNNI>(table, BlockScale::F16, w, a)
}

/// # Safety
/// Inlined into its variants (see `variants!`); `w..w + 17 * a[0].len()` must be readable and
/// every row of `a` as long as the first ([`check`]).
#[inline(always)]
unsafe fn mxfp4_body<const VNNI: bool>(w: *const u8, a: Rows4<'_>) -> [f32; 4] {
    let table = _mm_loadu_si128(mxfp4::KVALUES.as_ptr().cast());
    table_body::<VNNI>(table, BlockScale::E8m0Half, w, a)
}

/// The four-row form of [`super::avx2::table_row`]: the same two accumulators per row, the
/// same scale products, the same block order.
///
/// # Safety
/// The CPU must have AVX2, FMA, F16C (and AVX-VNNI when `VNNI`);
/// `w..w + (scale.header_bytes() + 16) * a[0].len()` must be readable and every row of `a` as
/// long as the first ([`check`]).
#[inline(always)]
unsafe fn table_body<const VNNI: bool>(
    table: __m128i,
    scale: BlockScale,
    w: *const u8,
    a: Rows4<'_>,
) -> [f32; 4] {
    let kb = a[0].len();
    let head = scale.header_bytes();
    let block = head + 16;
    let mut acc0 = [_mm256_setzero_ps(); 4];
    let mut acc1 = [_mm256_setzero_ps(); 4];
    let mut p = w;
    for j in 0..kb / 2 {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD).cast());
        let w0 = table_block(table, p.add(head));
        signed_block::<VNNI>(w0, scale_at(scale, p), a, 2 * j, &mut acc0);
        let w1 = table_block(table, p.add(head + block));
        signed_block::<VNNI>(w1, scale_at(scale, p.add(block)), a, 2 * j + 1, &mut acc1);
        p = p.add(2 * block);
    }
    if kb % 2 == 1 {
        let w0 = table_block(table, p.add(head));
        signed_block::<VNNI>(w0, scale_at(scale, p), a, kb - 1, &mut acc0);
    }
    std::array::from_fn(|r| hsum(_mm256_add_ps(acc0[r], acc1[r])))
}

/// The four-row form of the AVX2 IQ4_XS row kernel: one accumulator per row, sub-blocks in
/// order, each sub-block's weights and scale `d * (ls - 32)` made once for the four rows.
///
/// # Safety
/// Inlined into its variants (see `variants!`); `w` must hold `a[0].len() / 8` super-blocks.
#[inline(always)]
unsafe fn iq4_xs_body<const VNNI: bool>(w: *const u8, a: Rows4<'_>) -> [f32; 4] {
    let table = _mm_loadu_si128(iq4::KVALUES.as_ptr().cast());
    let mut acc = [_mm256_setzero_ps(); 4];
    for s in 0..a[0].len() / XS_SUB {
        let p = w.add(IQ4_XS_BYTES * s);
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD).cast());
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD + 64).cast());
        let b = std::slice::from_raw_parts(p, IQ4_XS_BYTES);
        let d = f16_at(p);
        for i in 0..XS_SUB {
            let wv = table_block(table, p.add(8 + 16 * i));
            let abs = _mm256_sign_epi8(wv, wv);
            let dw = d * iq4::xs_scale(b, i) as f32;
            for r in 0..4 {
                let blk = &a[r][XS_SUB * s + i];
                let prod = dot::<VNNI>(abs, _mm256_sign_epi8(load_act(blk), wv));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * blk.d), prod, acc[r]);
            }
        }
    }
    std::array::from_fn(|r| hsum(acc[r]))
}
