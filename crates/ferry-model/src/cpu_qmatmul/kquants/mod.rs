//! Dot products of raw GGUF k-quant rows (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) with 256-element int8
//! activation blocks ([`activation`]): the portable reference ([`scalar`]) and AVX2 ([`avx2`]),
//! plus four-activation-row micro-kernels for the tiled matmul ([`tile`]: AVX2, AVX-VNNI and
//! AVX-512 in [`avx2_tile`] and [`avx512_tile`]), the AVX2 prompt GEMM ([`avx2_panel`]), the
//! AVX-512 one of Q2_K / Q3_K ([`avx512_panel`]) and the AMX one ([`amx_tile`]); and the
//! decode kernel of the eight-row panel layout made at load for the AVX2 path
//! ([`super::panel8`]): [`panel8_avx2`].
//!
//! Every k-quant stores 256 weights per super-block, in eight 32-element chunks; chunk `c` covers
//! elements `32 c..32 c + 32` and has one scale per 16-element half (Q2_K, Q3_K, Q6_K) or one for
//! the whole chunk (Q4_K, Q5_K). Both kernels reduce a block to the same two exact integers (the
//! scaled dot product and the offset term) and combine them in f32 with [`block_value`] in row
//! order, so the SIMD and scalar results are bit-identical.

pub mod activation;
#[cfg(target_arch = "x86_64")]
pub mod amx_tile;
#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx2_panel;
#[cfg(target_arch = "x86_64")]
pub mod avx2_tile;
#[cfg(target_arch = "x86_64")]
pub mod avx512_panel;
#[cfg(target_arch = "x86_64")]
pub mod avx512_tile;
#[cfg(target_arch = "x86_64")]
pub mod panel8_avx2;
pub mod scalar;
pub mod tile;

/// The k-quant weight formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KFormat {
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
}

impl KFormat {
    /// Every k-quant format.
    pub const ALL: [KFormat; 5] = [
        KFormat::Q2K,
        KFormat::Q3K,
        KFormat::Q4K,
        KFormat::Q5K,
        KFormat::Q6K,
    ];

    /// Bytes per 256-element super-block.
    pub const fn block_bytes(self) -> usize {
        match self {
            KFormat::Q2K => 84,
            KFormat::Q3K => 110,
            KFormat::Q4K => 144,
            KFormat::Q5K => 176,
            KFormat::Q6K => 210,
        }
    }
}

/// One super-block's contribution: `d * sumi - dmin * summ`, both scales times the activation
/// scale `ad`. The one place this is computed, so both kernels round identically.
#[inline(always)]
fn block_value(d: f32, dmin: f32, ad: f32, sumi: i32, summ: i32) -> f32 {
    (d * ad) * sumi as f32 - (dmin * ad) * summ as f32
}

/// The little-endian u32 at `b[at..at + 4]`.
#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The eight 6-bit scales and eight 6-bit mins packed in the 12 bytes of a Q4_K / Q5_K block
/// (scales and mins `0..4` are the low 6 bits of bytes `0..4` and `4..8`; `4..8` take their
/// low 4 bits from the nibbles of bytes `8..12` and their top 2 bits from the top 2 bits of
/// bytes `0..4` (scales) and `4..8` (mins)).
#[inline(always)]
fn scales_mins_k4(b: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (a0, a1, a2) = (u32_at(b, 0), u32_at(b, 4), u32_at(b, 8));
    let sc_hi = (a2 & 0x0F0F_0F0F) | (((a0 >> 6) & 0x0303_0303) << 4);
    let mn_hi = ((a2 >> 4) & 0x0F0F_0F0F) | (((a1 >> 6) & 0x0303_0303) << 4);
    let sc = u64::from(a0 & 0x3F3F_3F3F) | (u64::from(sc_hi) << 32);
    let mn = u64::from(a1 & 0x3F3F_3F3F) | (u64::from(mn_hi) << 32);
    (sc.to_le_bytes(), mn.to_le_bytes())
}

/// The sixteen 6-bit scales packed in the 12 bytes of a Q3_K block, as four little-endian
/// words of four bytes each (still offset by 32): scale `j` takes its low 4 bits from the low
/// (`j < 8`) or high nibble of byte `j % 8`, and its top 2 bits from bits `2 (j / 4)..` of byte
/// `8 + j % 4`.
#[inline(always)]
fn scale_words_q3_k(b: &[u8]) -> [u32; 4] {
    let (a0, a1, t) = (u32_at(b, 0), u32_at(b, 4), u32_at(b, 8));
    let low = 0x0F0F_0F0F;
    let two = 0x0303_0303;
    [
        (a0 & low) | ((t & two) << 4),
        (a1 & low) | (((t >> 2) & two) << 4),
        ((a0 >> 4) & low) | (((t >> 4) & two) << 4),
        ((a1 >> 4) & low) | (((t >> 6) & two) << 4),
    ]
}

/// The sixteen signed scales (`-32..32`) of a Q3_K block ([`scale_words_q3_k`] less 32).
#[inline(always)]
fn scales_q3_k(b: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(scale_words_q3_k(b)) {
        for (o, byte) in o.iter_mut().zip(w.to_le_bytes()) {
            *o = byte as i8 - 32;
        }
    }
    out
}
