//! The AMX prompt GEMM of the k-quants Q4_K, Q5_K and Q6_K ([`super::super::amx`]): a task's
//! outputs as int8 tile multiplies, sixteen decoded weight rows (a panel) in the `A` tile times
//! sixteen activation rows (a group) in the `B` tile, 64 elements of `K` per multiply.
//!
//! Per super-block the one-row kernels ([`super::scalar`]) reduce each output to two exact
//! integers, `sumi` (scaled quant sums) and `summ` (the mins against the activation's group
//! sums), and add [`super::block_value`] to the row's f32 sum. This kernel computes the same
//! integers another way (integer sums are exact in any order) and then the same f32
//! operations in the same order, so its outputs are bit for bit those of the one-row kernels
//! (and of the four- and eight-row tiles, which equal them too):
//!
//! - Q4_K / Q5_K: each 6-bit chunk scale is `sc = 8 hi + lo` (`hi`, `lo` in `0..8`), so with
//!   the quants `q <= 31` the bytes `q hi` and `q lo` fit `u8` (`<= 217`). Two `A` matrices per
//!   super-block and `tdpbusd` over its 256 elements give `C_hi` and `C_lo`, and
//!   `sumi = 8 C_hi + C_lo`. `summ = sum_c min_c S_c` (`S_c` the activation's 32-element sums,
//!   as i16 pairs) is four `vpdpwssd` per weight row and group.
//! - Q6_K: with the signed scale's base-4 digits `sc = d0 + 4 d1 + 16 d2 + 64 s3`
//!   (`d0..d2` in `0..4`, `s3` in `-2..2`), the bytes `(q - 32) d` fit `i8` (`[-96, 93]`), and
//!   four `A` matrices with `tdpbssd` give `sumi - 32 offset = C0 + 4 C1 + 16 C2 + 64 C3`.
//!
//! A task packs its activation rows into `B` tiles once ([`pack_group`], a 16 x 16 dword
//! transpose per 64 elements), then for each panel decodes its rows once, eight super-blocks
//! at a time and a row at a time (row major, as stored: no transpose; sequential reads the
//! hardware prefetchers follow), and runs every group over each decoded super-block. The float sums
//! stay in a per-group 16 x 16 block (weight rows x activation lanes) for the whole row, and
//! the two sets of `C` tiles of Q4_K / Q5_K alternate so one group's tile multiplies overlap
//! the previous group's float work.

use std::arch::x86_64::*;
use std::ops::Range;

use super::super::amx::{self, Amx, TileConfig};
use super::super::avx2::f16_at;
use super::super::tile::checked_blocks;
use super::activation::Q8KBlock;
use super::avx512_tile::{broadcast32, group_scales, halves_epi16};
use super::{scales_mins_k4, KFormat};

/// Weight rows per panel (the rows of an `A` and a `C` tile).
const PANEL: usize = 16;
/// Activation rows per group (the columns of a `B` and a `C` tile).
const GROUP: usize = 16;
/// Tile multiplies of 64 elements per super-block.
const STEPS: usize = 4;

/// Super-blocks of a panel decoded at a time.
const SPAN: usize = 8;

/// Calls of at least this many activation rows of `format` take this kernel where the CPU has
/// AMX (one call never mixes kernels). Measured against the AVX-512 eight-row tiles (2
/// threads, 4096 x 4096): Q4_K and Q5_K gain from 16 rows (one group) on, Q6_K, whose decode
/// makes four `A` matrices, is even at 16 and ahead at 32.
pub fn min_rows(format: KFormat) -> usize {
    match format {
        KFormat::Q6K => 32,
        _ => 16,
    }
}

/// Bytes of packed activations (256 quant bytes per row and super-block) a task keeps in L2
/// at most.
const TASK_ACT_BYTES: usize = 1536 * 1024;

/// Activation rows per task for a call of `m` rows of `kb` super-blocks of `format` when this
/// kernel takes it (`None` when it does not): as many as keep the task's packed activations
/// within [`TASK_ACT_BYTES`], in whole groups, 64 to 256. Each panel's decoding is shared by
/// them: measured on 2 threads (Sapphire Rapids, 512 rows), 256 rows against 64 make Q6_K's
/// 5632 x 2048 matmul 1.3x and its 2048 x 5632 one 1.25x as fast.
pub fn task_rows(format: KFormat, m: usize, kb: usize) -> Option<usize> {
    (supports(format) && m >= min_rows(format) && kb > 0)
        .then(|| (TASK_ACT_BYTES / (kb * 256) / GROUP * GROUP).clamp(64, 256))
}

/// One tile's bytes (16 rows of 64), aligned to a cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Tile([u8; 1024]);

impl Tile {
    const ZERO: Tile = Tile([0; 1024]);

    /// Row `i`'s 64 bytes.
    #[inline(always)]
    fn row(&mut self, i: usize) -> *mut u8 {
        self.0[64 * i..].as_mut_ptr()
    }

    #[inline(always)]
    fn ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }
}

/// Whether `format` has a kernel here.
pub fn supports(format: KFormat) -> bool {
    matches!(format, KFormat::Q4K | KFormat::Q5K | KFormat::Q6K)
}

/// Computes `acts[i] . W[r]` for every activation row `i` of `acts` and weight row `r` in
/// `weights` of the `format` matrix `data` (`row_stride` bytes per row), handing them out as
/// `out(i, r0, values of rows r0..)`; returns whether it did (`false`: `format` has no kernel
/// here, or nothing to do).
pub fn run(
    amx: Amx,
    format: KFormat,
    data: &[u8],
    row_stride: usize,
    weights: Range<usize>,
    acts: &[&[Q8KBlock]],
    out: &mut dyn FnMut(usize, usize, &[f32]),
) -> bool {
    if !supports(format) || acts.is_empty() || weights.is_empty() {
        return false;
    }
    let bytes = |kb| Some(format.block_bytes() * kb);
    checked_blocks(acts, data, row_stride, &weights, bytes, &format);
    // SAFETY: `amx` proves AMX and the AVX-512 features; the asserts bound every read of
    // `data` and make the activation rows equally long.
    unsafe { panels(amx, format, data.as_ptr(), row_stride, weights, acts, out) };
    true
}

/// The activation side of a task: per group and super-block, the four `B` tiles, the
/// activation scales by lane and (Q4_K / Q5_K) the 32-element sums as i16 pairs.
struct Packed {
    kb: usize,
    b: Vec<Tile>,
    d: Vec<[f32; GROUP]>,
    pairs: Vec<[[i32; GROUP]; 4]>,
}

impl Packed {
    #[inline(always)]
    fn at(&self, g: usize, s: usize) -> usize {
        g * self.kb + s
    }
}

/// The decoded panel of one super-block: the `A` tiles (Q4_K / Q5_K: `hi` of step `t` at
/// `2 t`, `lo` at `2 t + 1`; Q6_K: digit `d` of step `t` at `4 t + d`), the rows' scales and
/// (Q4_K / Q5_K) their mins as i16 pairs.
#[derive(Clone)]
struct Panel {
    a: [Tile; 16],
    d: [f32; PANEL],
    dmin: [f32; PANEL],
    mins: [[i32; 4]; PANEL],
}

/// The tile multiplies of group `g`, super-block `s` of Q4_K / Q5_K into the `C` tiles `$hi`,
/// `$lo` (tiles 2 and 3 take the panel's `A` tiles, 4 and 7 the group's `B` tiles).
macro_rules! dots_k4 {
    ($panel:expr, $packed:expr, $g:expr, $s:expr, $hi:literal, $lo:literal) => {{
        let base = STEPS * $packed.at($g, $s);
        amx::zero!($hi);
        amx::zero!($lo);
        for t in 0..STEPS {
            amx::load!("2", $panel.a[2 * t].ptr(), 64usize);
            amx::load!("3", $panel.a[2 * t + 1].ptr(), 64usize);
            if t % 2 == 0 {
                amx::load!("4", $packed.b[base + t].ptr(), 64usize);
                amx::dot!("tdpbusd", $hi, "2", "4");
                amx::dot!("tdpbusd", $lo, "3", "4");
            } else {
                amx::load!("7", $packed.b[base + t].ptr(), 64usize);
                amx::dot!("tdpbusd", $hi, "2", "7");
                amx::dot!("tdpbusd", $lo, "3", "7");
            }
        }
    }};
}

/// # Safety
/// As [`run`]'s checks: AMX and AVX-512 present, rows `weights` of `row_stride` bytes at
/// `data` each hold `acts[0].len()` blocks of `format`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn panels(
    amx: Amx,
    format: KFormat,
    data: *const u8,
    row_stride: usize,
    weights: Range<usize>,
    acts: &[&[Q8KBlock]],
    out: &mut dyn FnMut(usize, usize, &[f32]),
) {
    let kb = acts[0].len();
    let groups = acts.len().div_ceil(GROUP);
    let packed = pack(acts, groups, kb, format != KFormat::Q6K);
    let mut span = vec![
        Panel {
            a: [Tile::ZERO; 16],
            d: [0.0; PANEL],
            dmin: [0.0; PANEL],
            mins: [[0; 4]; PANEL],
        };
        SPAN.min(kb)
    ];
    let mut acc = vec![Tile::ZERO; groups];
    let mut c = Box::new([[Tile::ZERO; 4]; 2]);
    let block = format.block_bytes();
    let mut cfg = TileConfig::new();
    for t in 0..amx::TILES {
        cfg = cfg.tile(t, 16, 64);
    }
    cfg.load(amx);
    for r0 in weights.clone().step_by(PANEL) {
        let n = (weights.end - r0).min(PANEL);
        for a in acc.iter_mut() {
            *a = Tile::ZERO;
        }
        for s in 0..kb {
            let ds = s % SPAN;
            if ds == 0 {
                // The panel's next `SPAN` super-blocks, a row at a time (each row's bytes
                // in order, which the hardware prefetchers follow).
                let count = (kb - s).min(SPAN);
                for i in 0..n {
                    let row = data.add((r0 + i) * row_stride + block * s);
                    for (k, panel) in span[..count].iter_mut().enumerate() {
                        let p = row.add(block * k);
                        match format {
                            KFormat::Q4K => decode_k4::<false>(panel, i, p),
                            KFormat::Q5K => decode_k4::<true>(panel, i, p),
                            _ => decode_q6_k(panel, i, p),
                        }
                    }
                }
            }
            let panel = &span[ds];
            if format == KFormat::Q6K {
                for (g, acc) in acc.iter_mut().enumerate() {
                    dots_q6_k(panel, &packed, g, s, &mut c[0]);
                    post_q6_k(panel, &packed, g, s, &c[0], acc);
                }
            } else {
                for g in 0..groups {
                    if g % 2 == 0 {
                        dots_k4!(panel, packed, g, s, "0", "1");
                    } else {
                        dots_k4!(panel, packed, g, s, "5", "6");
                    }
                    if g > 0 {
                        post_k4(panel, &packed, g - 1, s, &c[(g - 1) % 2], &mut acc[g - 1]);
                    }
                    let set = &mut c[g % 2];
                    if g % 2 == 0 {
                        amx::store!("0", set[0].row(0), 64usize);
                        amx::store!("1", set[1].row(0), 64usize);
                    } else {
                        amx::store!("5", set[0].row(0), 64usize);
                        amx::store!("6", set[1].row(0), 64usize);
                    }
                }
                let g = groups - 1;
                post_k4(panel, &packed, g, s, &c[g % 2], &mut acc[g]);
            }
        }
        for (g, a) in acc.iter().enumerate() {
            let t = transpose(load16(a.ptr()));
            for (j, row) in t
                .iter()
                .enumerate()
                .take((acts.len() - GROUP * g).min(GROUP))
            {
                let mut ys = [0f32; PANEL];
                _mm512_storeu_si512(ys.as_mut_ptr().cast(), *row);
                out(GROUP * g + j, r0, &ys[..n]);
            }
        }
    }
    amx::release();
}

/// The sixteen 64-byte rows at `p`.
///
/// # Safety
/// `p..p + 1024` must be readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn load16(p: *const u8) -> [__m512i; 16] {
    std::array::from_fn(|i| _mm512_loadu_si512(p.add(64 * i).cast()))
}

/// The 16 x 16 transpose of a matrix of 32-bit words (row `i` of the result holds word `i`
/// of each input row).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn transpose(r: [__m512i; 16]) -> [__m512i; 16] {
    // Within each 128-bit lane: `u[4 q + k]` holds lane-local column `k` of rows `4 q..4 q + 4`.
    let mut u = [_mm512_setzero_si512(); 16];
    for q in 0..4 {
        let [a, b, c, d] = [r[4 * q], r[4 * q + 1], r[4 * q + 2], r[4 * q + 3]];
        let (t0, t1) = (_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
        let (t2, t3) = (_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
        u[4 * q] = _mm512_unpacklo_epi64(t0, t2);
        u[4 * q + 1] = _mm512_unpackhi_epi64(t0, t2);
        u[4 * q + 2] = _mm512_unpacklo_epi64(t1, t3);
        u[4 * q + 3] = _mm512_unpackhi_epi64(t1, t3);
    }
    // Column `4 l + k` is lane `l` of `u[k]`, `u[4 + k]`, `u[8 + k]`, `u[12 + k]`.
    let mut out = [_mm512_setzero_si512(); 16];
    for k in 0..4 {
        let (x, y, z, w) = (u[k], u[4 + k], u[8 + k], u[12 + k]);
        let (e0, e1) = (
            _mm512_shuffle_i32x4::<0x88>(x, y),
            _mm512_shuffle_i32x4::<0xDD>(x, y),
        );
        let (f0, f1) = (
            _mm512_shuffle_i32x4::<0x88>(z, w),
            _mm512_shuffle_i32x4::<0xDD>(z, w),
        );
        out[k] = _mm512_shuffle_i32x4::<0x88>(e0, f0);
        out[4 + k] = _mm512_shuffle_i32x4::<0x88>(e1, f1);
        out[8 + k] = _mm512_shuffle_i32x4::<0xDD>(e0, f0);
        out[12 + k] = _mm512_shuffle_i32x4::<0xDD>(e1, f1);
    }
    out
}

/// Packs `groups` groups of sixteen activation rows (the last one zero-padded).
///
/// # Safety
/// The CPU must have the features of [`panels`]; every row of `acts` holds `kb` blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pack(acts: &[&[Q8KBlock]], groups: usize, kb: usize, pairs: bool) -> Packed {
    let mut p = Packed {
        kb,
        b: vec![Tile::ZERO; groups * kb * STEPS],
        d: vec![[0.0; GROUP]; groups * kb],
        pairs: vec![[[0; GROUP]; 4]; if pairs { groups * kb } else { 0 }],
    };
    for g in 0..groups {
        let rows = &acts[GROUP * g..(GROUP * g + GROUP).min(acts.len())];
        for s in 0..kb {
            let at = p.at(g, s);
            for (j, row) in rows.iter().enumerate() {
                let a = &row[s];
                p.d[at][j] = a.d;
                if pairs {
                    for (q, pair) in p.pairs[at].iter_mut().enumerate() {
                        let sum = |c: usize| i32::from(a.bsums[2 * c] + a.bsums[2 * c + 1]);
                        // Each 32-element sum is at most 32 * 128 in magnitude: an i16.
                        let (lo, hi) = (sum(2 * q) as i16 as u16, sum(2 * q + 1) as i16 as u16);
                        pair[j] = (u32::from(lo) | (u32::from(hi) << 16)) as i32;
                    }
                }
            }
            for t in 0..STEPS {
                let v: [__m512i; 16] = std::array::from_fn(|j| match rows.get(j) {
                    Some(row) => _mm512_loadu_si512(row[s].qs.as_ptr().add(64 * t).cast()),
                    None => _mm512_setzero_si512(),
                });
                let tile = &mut p.b[STEPS * at + t];
                for (i, v) in transpose(v).into_iter().enumerate() {
                    _mm512_storeu_si512(tile.row(i).cast(), v);
                }
            }
        }
    }
    p
}

/// Decodes row `i` of a Q4_K (`HIGH = false`) or Q5_K block at `p` into `panel`: per step
/// `t` (chunks `2 t`, `2 t + 1`) the bytes `q hi_c` and `q lo_c`, the scales, the mins.
///
/// # Safety
/// The CPU must have the features of [`panels`]; the block at `p` must be readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn decode_k4<const HIGH: bool>(panel: &mut Panel, i: usize, p: *const u8) {
    let (sc, mn) = scales_mins_k4(std::slice::from_raw_parts(p.add(4), 12));
    let sc = u64::from_le_bytes(sc);
    let (hi, lo) = (
        (sc >> 3) & 0x0707_0707_0707_0707,
        sc & 0x0707_0707_0707_0707,
    );
    // i16 lanes 0..8 the `hi` parts, 8..16 the `lo` parts.
    let parts = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(_mm_set_epi64x(lo as i64, hi as i64)));
    let m4 = _mm512_set1_epi8(0x0F);
    let nibble_shift = halves_epi16(0, 4);
    let qs_at = if HIGH { 48 } else { 16 };
    let h = if HIGH {
        broadcast32(p.add(16))
    } else {
        _mm512_setzero_si512()
    };
    for t in 0..STEPS {
        let q = broadcast32(p.add(qs_at + 32 * t));
        let mut q = _mm512_and_si512(_mm512_srlv_epi16(q, nibble_shift), m4);
        if HIGH {
            // Chunk `c`'s fifth bit is bit `c` of its high-bit byte.
            let bits = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_set1_epi8((1u8 << (2 * t)) as i8)),
                _mm256_set1_epi8((1u8 << (2 * t + 1)) as i8),
            );
            let set = _mm512_test_epi8_mask(h, bits);
            q = _mm512_mask_add_epi8(q, set, q, _mm512_set1_epi8(0x10));
        }
        let c = 2 * t as i16;
        let hw = _mm512_permutexvar_epi16(halves_epi16(c, c + 1), parts);
        let lw = _mm512_permutexvar_epi16(halves_epi16(c + 8, c + 9), parts);
        // Both bytes of a word share the chunk's factor and each product is below 256, so
        // one 16-bit multiply makes two byte products without carries.
        _mm512_storeu_si512(panel.a[2 * t].row(i).cast(), _mm512_mullo_epi16(q, hw));
        _mm512_storeu_si512(panel.a[2 * t + 1].row(i).cast(), _mm512_mullo_epi16(q, lw));
    }
    for (pair, m) in panel.mins[i].iter_mut().zip(mn.chunks_exact(2)) {
        *pair = i32::from(m[0]) | (i32::from(m[1]) << 16);
    }
    panel.d[i] = f16_at(p);
    panel.dmin[i] = f16_at(p.add(2));
}

/// Adds group `g`'s block values of super-block `s` (Q4_K / Q5_K) to `acc`, from the stored
/// `C` tiles `c` (`hi`, `lo`): per weight row `i`, across the group's lanes,
/// `(d * ad) * sumi - (dmin * ad) * summ` as [`super::block_value`].
///
/// # Safety
/// The CPU must have the features of [`panels`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn post_k4(
    panel: &Panel,
    packed: &Packed,
    g: usize,
    s: usize,
    c: &[Tile; 4],
    acc: &mut Tile,
) {
    let at = packed.at(g, s);
    let ad = _mm512_loadu_ps(packed.d[at].as_ptr());
    let pairs: [__m512i; 4] =
        std::array::from_fn(|q| _mm512_loadu_si512(packed.pairs[at][q].as_ptr().cast()));
    let acc = acc.0.as_mut_ptr().cast::<f32>();
    for i in 0..PANEL {
        let hi = _mm512_loadu_si512(c[0].ptr().add(64 * i).cast());
        let lo = _mm512_loadu_si512(c[1].ptr().add(64 * i).cast());
        let sumi = _mm512_add_epi32(_mm512_slli_epi32::<3>(hi), lo);
        let mut summ = _mm512_setzero_si512();
        for (q, pair) in pairs.iter().enumerate() {
            summ = _mm512_dpwssd_epi32(summ, _mm512_set1_epi32(panel.mins[i][q]), *pair);
        }
        let di = _mm512_mul_ps(_mm512_set1_ps(panel.d[i]), ad);
        let dm = _mm512_mul_ps(_mm512_set1_ps(panel.dmin[i]), ad);
        let v = _mm512_sub_ps(
            _mm512_mul_ps(di, _mm512_cvtepi32_ps(sumi)),
            _mm512_mul_ps(dm, _mm512_cvtepi32_ps(summ)),
        );
        let a = acc.add(16 * i);
        _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), v));
    }
}

/// Q6_K's two high bits at `shift` of each byte of `qh`, as `16 * bits`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn q6_high(qh: __m512i, shift: __m512i) -> __m512i {
    let m3 = _mm512_set1_epi8(3);
    _mm512_slli_epi16::<4>(_mm512_and_si512(_mm512_srlv_epi16(qh, shift), m3))
}

/// Decodes row `i` of a Q6_K block at `p` into `panel`: per step `t` and base-4 digit `d` of
/// the group scales, the bytes `(q - 32) d` (the top digit signed), and the scale.
///
/// # Safety
/// The CPU must have the features of [`panels`]; the block at `p` must be readable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn decode_q6_k(panel: &mut Panel, i: usize, p: *const u8) {
    let m4 = _mm512_set1_epi8(0x0F);
    let three = _mm512_set1_epi16(3);
    let (shift_a, shift_b) = (halves_epi16(0, 2), halves_epi16(4, 6));
    // The scales' bits as unsigned i16, and their four base-4 digits; the top one as
    // `s3 + 2` (`s3` the signed top digit, in `-2..2`).
    let sc = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(_mm_loadu_si128(p.add(192).cast())));
    let digits = [
        _mm512_and_si512(sc, three),
        _mm512_and_si512(_mm512_srli_epi16::<2>(sc), three),
        _mm512_and_si512(_mm512_srli_epi16::<4>(sc), three),
        _mm512_xor_si512(_mm512_srli_epi16::<6>(sc), _mm512_set1_epi16(2)),
    ];
    let times_32 = _mm512_set1_epi16(0x2020);
    for n in 0..2 {
        let ql = _mm512_loadu_si512(p.add(64 * n).cast());
        let qh = broadcast32(p.add(128 + 32 * n));
        let qa = _mm512_or_si512(_mm512_and_si512(ql, m4), q6_high(qh, shift_a));
        let qb = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
            q6_high(qh, shift_b),
        );
        for (t, q) in [(2 * n, qa), (2 * n + 1, qb)] {
            for (d, digit) in digits.iter().enumerate() {
                let w = group_scales(*digit, t);
                // `q w` (< 256, no carries between the bytes of a word) less `32 w` per byte.
                let mut a =
                    _mm512_sub_epi8(_mm512_mullo_epi16(q, w), _mm512_mullo_epi16(w, times_32));
                if d == 3 {
                    // `(q - 32) (w - 2)`.
                    a = _mm512_add_epi8(
                        _mm512_sub_epi8(a, _mm512_add_epi8(q, q)),
                        _mm512_set1_epi8(64),
                    );
                }
                _mm512_storeu_si512(panel.a[4 * t + d].row(i).cast(), a);
            }
        }
    }
    panel.d[i] = f16_at(p.add(208));
}

/// The tile multiplies of group `g`, super-block `s` of Q6_K, stored to `c` (`C0..C3` in
/// tiles 0-3, the `A` tiles in 4 and 6, the `B` tile in 5).
///
/// # Safety
/// The tile configuration of [`panels`] is loaded.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dots_q6_k(panel: &Panel, packed: &Packed, g: usize, s: usize, c: &mut [Tile; 4]) {
    let base = STEPS * packed.at(g, s);
    amx::zero!("0");
    amx::zero!("1");
    amx::zero!("2");
    amx::zero!("3");
    for t in 0..STEPS {
        let a = &panel.a[4 * t..4 * t + 4];
        amx::load!("5", packed.b[base + t].ptr(), 64usize);
        amx::load!("4", a[0].ptr(), 64usize);
        amx::load!("6", a[1].ptr(), 64usize);
        amx::dot!("tdpbssd", "0", "4", "5");
        amx::dot!("tdpbssd", "1", "6", "5");
        amx::load!("4", a[2].ptr(), 64usize);
        amx::load!("6", a[3].ptr(), 64usize);
        amx::dot!("tdpbssd", "2", "4", "5");
        amx::dot!("tdpbssd", "3", "6", "5");
    }
    amx::store!("0", c[0].row(0), 64usize);
    amx::store!("1", c[1].row(0), 64usize);
    amx::store!("2", c[2].row(0), 64usize);
    amx::store!("3", c[3].row(0), 64usize);
}

/// Adds group `g`'s block values of super-block `s` (Q6_K) to `acc`:
/// `(d * ad) * sumi - (0 * ad) * 0` as [`super::block_value`] with `sumi` the
/// `C0 + 4 C1 + 16 C2 + 64 C3` of the stored tiles `c`.
///
/// # Safety
/// The CPU must have the features of [`panels`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn post_q6_k(
    panel: &Panel,
    packed: &Packed,
    g: usize,
    s: usize,
    c: &[Tile; 4],
    acc: &mut Tile,
) {
    let ad = _mm512_loadu_ps(packed.d[packed.at(g, s)].as_ptr());
    let zero = _mm512_setzero_ps();
    // The min term of `block_value` with `dmin = 0` and `summ = 0` (a signed zero).
    let mins = _mm512_mul_ps(_mm512_mul_ps(zero, ad), zero);
    let acc = acc.0.as_mut_ptr().cast::<f32>();
    for i in 0..PANEL {
        let at = |k: usize| _mm512_loadu_si512(c[k].ptr().add(64 * i).cast());
        let sumi = _mm512_add_epi32(
            _mm512_add_epi32(at(0), _mm512_slli_epi32::<2>(at(1))),
            _mm512_add_epi32(_mm512_slli_epi32::<4>(at(2)), _mm512_slli_epi32::<6>(at(3))),
        );
        let di = _mm512_mul_ps(_mm512_set1_ps(panel.d[i]), ad);
        let v = _mm512_sub_ps(_mm512_mul_ps(di, _mm512_cvtepi32_ps(sumi)), mins);
        let a = acc.add(16 * i);
        _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), v));
    }
}

#[cfg(test)]
#[path = "amx_tile_tests.rs"]
mod tests;
