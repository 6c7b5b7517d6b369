//! Dot products of raw GGUF Q5_0 / Q5_1 rows with 32-element int8 activation blocks
//! ([`Q8Block`]), portable and AVX2 / AVX-VNNI (same contract as [`super::scalar`] /
//! [`super::avx2`]; the AVX-512 one is [`super::q5_avx512`]).
//!
//! Layouts (little endian, 32 elements per block): Q5_0, 22 bytes: `d: f16`, `qh: u32`,
//! `qs: [u8; 16]`; Q5_1, 24 bytes: `d: f16`, `m: f16`, `qh: u32`, `qs: [u8; 16]`. Element `j`
//! has the 5-bit value `q_j = nibble_j | 16 * ((qh >> j) & 1)` (nibbles as in Q4_0) and is
//! `d * (q_j - 16)` (Q5_0) or `d * q_j + m` (Q5_1). Both kernels take the unsigned `q_j`
//! against the activations and apply the offset through the block sums (`isum`, `s`).

use super::activation::{Q8Block, BLOCK};
use super::scalar::f16_at;

/// `sum_j q_j * a.qs[j]` for one block's high bits `qh` and nibbles `qs`.
#[inline]
fn dot5(qh: u32, qs: &[u8], a: &Q8Block) -> i32 {
    let (lo, hi) = a.qs.split_at(BLOCK / 2);
    qs.iter()
        .zip(lo.iter().zip(hi))
        .enumerate()
        .map(|(j, (&q, (&l, &h)))| {
            let q0 = (q & 0x0F) | (((qh >> j) & 1) << 4) as u8;
            let q1 = (q >> 4) | (((qh >> (j + 16)) & 1) << 4) as u8;
            i32::from(q0) * i32::from(l) + i32::from(q1) * i32::from(h)
        })
        .sum()
}

/// The 32 unsigned 5-bit values `q_j` of one block's high bits `qh` and nibbles `qs` (the
/// four-row kernels of [`super::scalar_tile`] unpack each block once).
#[inline]
pub(super) fn unpack5(qh: u32, qs: &[u8]) -> [i32; BLOCK] {
    let mut q = [0i32; BLOCK];
    for (j, &b) in qs.iter().enumerate().take(BLOCK / 2) {
        q[j] = i32::from(b & 0x0F) | (((qh >> j) & 1) << 4) as i32;
        q[j + BLOCK / 2] = i32::from(b >> 4) | (((qh >> (j + 16)) & 1) << 4) as i32;
    }
    q
}

/// The little-endian u32 at `b[at..at + 4]`.
#[inline]
pub(super) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Dot product of a Q5_0 row (`a.len()` blocks of 22 bytes) with `a`.
pub fn dot_q5_0(w: &[u8], a: &[Q8Block]) -> f32 {
    w.chunks_exact(22)
        .zip(a)
        .map(|(b, a)| {
            let sumi = dot5(u32_at(b, 2), &b[6..22], a) - 16 * a.isum;
            f16_at(b, 0) * a.d * sumi as f32
        })
        .sum()
}

/// Dot product of a Q5_1 row (`a.len()` blocks of 24 bytes) with `a`.
pub fn dot_q5_1(w: &[u8], a: &[Q8Block]) -> f32 {
    w.chunks_exact(24)
        .zip(a)
        .map(|(b, a)| {
            let sumi = dot5(u32_at(b, 4), &b[8..24], a);
            f16_at(b, 0) * a.d * sumi as f32 + f16_at(b, 2) * a.s
        })
        .sum()
}

/// The AVX2 kernels: the 32 high bits are spread to one byte per element (`0x10` where set)
/// and OR-ed into the nibbles, the bytes multiplied with the activations into eight i32 lanes
/// (`vpmaddubsw` + `vpmaddwd`, or AVX-VNNI's `vpdpbusd` in the `vnni` variants: the same
/// sums), and the block's integer dot product finished in those lanes: Q5_0's offset
/// `-16 * isum` is subtracted from lane 0 before the one conversion to f32, so no scalar
/// float work per block is left but the scale (`d * a.d`, and Q5_1's `m * a.s`, one multiply
/// of `[d, m]` by `[a.d, a.s]`). Even blocks go into one f32 accumulator and odd into another;
/// Q5_1's offset terms are summed in block order in lane 1 of a register.
/// [`super::super::avx2_tile`]'s four-row kernels repeat these operations exactly.
#[cfg(target_arch = "x86_64")]
pub mod avx2 {
    use std::arch::x86_64::*;

    use super::super::activation::Q8Block;
    use super::super::avx2::{
        block_scale, d_s, dm_at, hsum, load_act, sums_u8_i8, Avx2, PREFETCH_AHEAD,
    };
    use super::super::avx2_tile::{has_vnni, vnni_sums};

    /// Dot product of a Q5_0 row (at least `22 * a.len()` bytes) with `a`.
    pub fn dot_q5_0(k: Avx2, w: &[u8], a: &[Q8Block]) -> f32 {
        let _ = k;
        assert!(w.len() >= 22 * a.len(), "q5_0 row too short");
        // SAFETY: `k` proves the features; the assert bounds every read of `w`.
        unsafe { plain::q5::<22, false>(w.as_ptr(), a) }
    }

    /// Dot product of a Q5_1 row (at least `24 * a.len()` bytes) with `a`.
    pub fn dot_q5_1(k: Avx2, w: &[u8], a: &[Q8Block]) -> f32 {
        let _ = k;
        assert!(w.len() >= 24 * a.len(), "q5_1 row too short");
        // SAFETY: as in `dot_q5_0`.
        unsafe { plain::q5::<24, true>(w.as_ptr(), a) }
    }

    /// [`dot_q5_0`] with AVX-VNNI's `vpdpbusd` where the CPU has it ([`has_vnni`]): the same
    /// result, bit for bit.
    pub fn dot_q5_0_vnni(k: Avx2, w: &[u8], a: &[Q8Block]) -> f32 {
        if !has_vnni() {
            return dot_q5_0(k, w, a);
        }
        assert!(w.len() >= 22 * a.len(), "q5_0 row too short");
        // SAFETY: `k` and `has_vnni` prove the features; the assert bounds every read of `w`.
        unsafe { vnni::q5::<22, false>(w.as_ptr(), a) }
    }

    /// [`dot_q5_1`] with AVX-VNNI's `vpdpbusd` where the CPU has it (see [`dot_q5_0_vnni`]).
    pub fn dot_q5_1_vnni(k: Avx2, w: &[u8], a: &[Q8Block]) -> f32 {
        if !has_vnni() {
            return dot_q5_1(k, w, a);
        }
        assert!(w.len() >= 24 * a.len(), "q5_1 row too short");
        // SAFETY: as in `dot_q5_0_vnni`.
        unsafe { vnni::q5::<24, true>(w.as_ptr(), a) }
    }

    /// `0x10` in byte `j` where bit `j` of `qh` is set, else 0.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::cpu_qmatmul) fn high_bits(qh: u32) -> __m256i {
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(qh as i32),
            _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                3, 3, 3, 3,
            ),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }

    /// The 32 nibbles of the 16 bytes at `p`, low halves first: the bytes broadcast to both
    /// halves of the register and the upper half shifted right by 4 (in 32-bit lanes, whose
    /// bits from the next byte the mask drops), one shift and one mask for the four
    /// instructions of [`super::super::avx2::nibbles`].
    ///
    /// # Safety
    /// `p..p + 16` must be readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::cpu_qmatmul) unsafe fn nibbles(p: *const u8) -> __m256i {
        let q = _mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()));
        let shifted = _mm256_srlv_epi32(q, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
        _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F))
    }

    /// The 32 unsigned 5-bit values of the block whose `qh` is at `qh`, nibbles at `qh + 4`.
    ///
    /// # Safety
    /// `qh..qh + 20` must be readable.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::cpu_qmatmul) unsafe fn five_bits(qh: *const u8) -> __m256i {
        let bits = u32::from_le(qh.cast::<u32>().read_unaligned());
        _mm256_or_si256(nibbles(qh.add(4)), high_bits(bits))
    }

    /// `sums` less `16 * isum` in lane 0: Q5_0's exact block dot product in eight lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in crate::cpu_qmatmul) fn less_offset(sums: __m256i, isum: i32) -> __m256i {
        _mm256_sub_epi32(sums, _mm256_zextsi128_si256(_mm_cvtsi32_si128(16 * isum)))
    }

    /// The row loop, compiled without AVX-VNNI (`plain`) and with it (`vnni`).
    macro_rules! variant {
        ($module:ident, $vnni:expr) => {
            mod $module {
                use super::*;

                /// Q5_0 (`MIN = false`, 22-byte blocks) or Q5_1 (`MIN = true`, 24-byte
                /// blocks).
                ///
                /// # Safety
                /// The CPU must have AVX2, FMA, F16C (and AVX-VNNI in `vnni`);
                /// `w..w + BYTES * a.len()` must be readable.
                #[target_feature(enable = "avx2,fma,f16c")]
                pub(super) unsafe fn q5<const BYTES: usize, const MIN: bool>(
                    w: *const u8,
                    a: &[Q8Block],
                ) -> f32 {
                    super::row::<BYTES, MIN, Spread<{ $vnni }>>(w, a)
                }
            }
        };
    }
    variant!(plain, false);
    variant!(vnni, true);

    /// How a kernel reduces one block to eight i32 lanes whose sum is its exact integer dot
    /// product (Q5_0's offset `-16 * isum` included): the one part [`row`]'s kernels (these
    /// and [`super::super::q5_avx512`]) do differently.
    pub(in crate::cpu_qmatmul) trait LaneSums {
        /// The lanes of the Q5_0 (`MIN = false`) or Q5_1 block at `p` against `a`.
        ///
        /// # Safety
        /// The CPU must have the kernel's features; the block at `p` must be readable.
        unsafe fn lanes<const MIN: bool>(p: *const u8, a: &Q8Block) -> __m256i;
    }

    /// AVX2's lanes: the high bits spread to bytes ([`five_bits`]), `vpmaddubsw` +
    /// `vpmaddwd` (or AVX-VNNI's `vpdpbusd` where `VNNI`), Q5_0's offset off lane 0.
    struct Spread<const VNNI: bool>;

    impl<const VNNI: bool> LaneSums for Spread<VNNI> {
        #[inline(always)]
        unsafe fn lanes<const MIN: bool>(p: *const u8, a: &Q8Block) -> __m256i {
            let q = five_bits(p.add(if MIN { 4 } else { 2 }));
            let y = load_act(a);
            let sums = if VNNI {
                vnni_sums(q, y)
            } else {
                sums_u8_i8(q, y)
            };
            if MIN {
                sums
            } else {
                less_offset(sums, a.isum)
            }
        }
    }

    /// The row loop of every Q5 row kernel, `S` its lane sums: blocks in pairs, even ones into
    /// one f32 accumulator and odd ones into another, Q5_1's offset terms in lane 1.
    ///
    /// # Safety
    /// Inlined into the kernels' `#[target_feature]` functions; the CPU must have their
    /// features and `w..w + BYTES * a.len()` must be readable.
    #[inline(always)]
    pub(in crate::cpu_qmatmul) unsafe fn row<const BYTES: usize, const MIN: bool, S: LaneSums>(
        w: *const u8,
        a: &[Q8Block],
    ) -> f32 {
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        // Lane 1: Q5_1's offset sum (lane 0 sums the scales, unused).
        let mut offset = _mm_setzero_ps();
        let mut pairs = a.chunks_exact(2);
        let mut p = w;
        for pair in &mut pairs {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD).cast());
            acc0 = block::<MIN, S>(p, &pair[0], acc0, &mut offset);
            acc1 = block::<MIN, S>(p.add(BYTES), &pair[1], acc1, &mut offset);
            p = p.add(2 * BYTES);
        }
        if let [last] = pairs.remainder() {
            acc0 = block::<MIN, S>(p, last, acc0, &mut offset);
        }
        let sum = hsum(_mm256_add_ps(acc0, acc1));
        if MIN {
            sum + _mm_cvtss_f32(_mm_movehdup_ps(offset))
        } else {
            sum
        }
    }

    /// `acc` plus the block at `p` times `a` (Q5_1: its offset term into lane 1 of `offset`).
    ///
    /// # Safety
    /// As [`row`]; the block at `p` must be readable.
    #[inline(always)]
    unsafe fn block<const MIN: bool, S: LaneSums>(
        p: *const u8,
        a: &Q8Block,
        acc: __m256,
        offset: &mut __m128,
    ) -> __m256 {
        let prod = _mm256_cvtepi32_ps(S::lanes::<MIN>(p, a));
        if MIN {
            // [d * a.d, m * a.s, 0, 0].
            let t = _mm_mul_ps(dm_at(p), d_s(a));
            *offset = _mm_add_ps(*offset, t);
            _mm256_fmadd_ps(_mm256_broadcastss_ps(t), prod, acc)
        } else {
            _mm256_fmadd_ps(_mm256_broadcastss_ps(block_scale(p, a)), prod, acc)
        }
    }
}
