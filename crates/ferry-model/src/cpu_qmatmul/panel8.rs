//! The eight-row interleaved ("panel") layout of k-quant, IQ4_XS, IQ4_NL, MXFP4, Q5_0 and Q5_1
//! weights, made once at load for the AVX2 kernels that read it ([`super::kquants::panel8_avx2`],
//! [`super::table_panel`], [`super::q5_panel`]).
//!
//! A matrix of `rows` (a multiple of [`ROWS`]) by `kb` super-blocks is stored panel after
//! panel (rows `8 p..8 p + 8`), and within a panel super-block after super-block; one panel
//! block holds the eight rows' GGUF blocks with the same bytes, regrouped: each format's block
//! is cut into segments of equal units ([`PanelFormat::segments`]), and a segment of `count` units
//! of `unit` bytes is stored unit-major, row-minor (unit `k` of rows 0..8, then unit `k + 1`).
//! So one 32-byte load gives four quant bytes of each of the eight rows, and one 16-byte load
//! the f16 `d` of all eight. Q6_K's, Q5_K's and Q3_K's quant words are then recoded bit by bit
//! so that most weights are one mask or a shift and a mask away ([`recode`]). The layout is
//! lossless ([`Panels::unpack_row`] gives a row's GGUF bytes back) and exactly as large as the
//! GGUF rows; every k-quant (Q2_K..Q6_K) has one, and
//! so have IQ4_XS (256-element super-blocks too), IQ4_NL, MXFP4, Q5_0 and Q5_1 (32-element blocks,
//! `kb` of them per row).
//! Panels live in memory of their own ([`Panels::pack`]) or in a mapped file that holds them
//! as [`Panels::as_bytes`] gave them ([`Panels::mapped`]: the loader's panel cache).

use std::ops::Range;
use std::sync::Arc;

use super::iq4::{IQ4_NL_BYTES, IQ4_XS_BYTES};
use super::kquants::KFormat;
use super::mxfp4::MXFP4_BYTES;

/// Weight rows per panel.
pub const ROWS: usize = 8;
/// Bytes of one 32-bit word of every row of a panel (a unit of 4 bytes, rows 0..8): what the
/// recodings walk byte position by byte position.
const WORD: usize = 4 * ROWS;

/// A run of equal units of a block: `(byte offset in the GGUF block, unit bytes, units)`.
type Segment = (usize, usize, usize);

/// The formats with a panel layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PanelFormat {
    /// A k-quant.
    K(KFormat),
    /// IQ4_XS.
    Iq4Xs,
    /// IQ4_NL (32-element blocks).
    Iq4Nl,
    /// MXFP4 (32-element blocks).
    Mxfp4,
    /// Q5_0 (32-element blocks).
    Q5_0,
    /// Q5_1 (32-element blocks).
    Q5_1,
}

impl From<KFormat> for PanelFormat {
    fn from(format: KFormat) -> Self {
        PanelFormat::K(format)
    }
}

impl PanelFormat {
    /// Every format with a panel layout.
    pub const ALL: [PanelFormat; 10] = [
        PanelFormat::K(KFormat::Q2K),
        PanelFormat::K(KFormat::Q3K),
        PanelFormat::K(KFormat::Q4K),
        PanelFormat::K(KFormat::Q5K),
        PanelFormat::K(KFormat::Q6K),
        PanelFormat::Iq4Xs,
        PanelFormat::Iq4Nl,
        PanelFormat::Mxfp4,
        PanelFormat::Q5_0,
        PanelFormat::Q5_1,
    ];

    /// Bytes per block (a 256-element super-block; IQ4_NL, MXFP4, Q5_0, Q5_1: a 32-element block).
    pub const fn block_bytes(self) -> usize {
        match self {
            PanelFormat::K(format) => format.block_bytes(),
            PanelFormat::Iq4Xs => IQ4_XS_BYTES,
            PanelFormat::Iq4Nl => IQ4_NL_BYTES,
            PanelFormat::Mxfp4 => MXFP4_BYTES,
            PanelFormat::Q5_0 => 22,
            PanelFormat::Q5_1 => 24,
        }
    }

    /// Elements per block.
    pub const fn block_elements(self) -> usize {
        match self {
            PanelFormat::K(_) | PanelFormat::Iq4Xs => 256,
            PanelFormat::Iq4Nl | PanelFormat::Mxfp4 | PanelFormat::Q5_0 | PanelFormat::Q5_1 => 32,
        }
    }

    /// The segments a panel block is made of, in panel order; they cover the GGUF block once.
    pub const fn segments(self) -> &'static [Segment] {
        match self {
            PanelFormat::K(format) => k_segments(format),
            // d, scales_h, scales_l as one word, the 128 index bytes as 32 words (sub-block
            // `i`'s four words are units `4 i..4 i + 4`).
            PanelFormat::Iq4Xs => &[(0, 2, 1), (2, 2, 1), (4, 4, 1), (8, 4, 32)],
            // d, the 16 index bytes as four words.
            PanelFormat::Iq4Nl => &[(0, 2, 1), (2, 4, 4)],
            // The E8M0 byte, the 16 index bytes as four words.
            PanelFormat::Mxfp4 => &[(0, 1, 1), (1, 4, 4)],
            // d, qh, the 16 nibble bytes as four words.
            PanelFormat::Q5_0 => &[(0, 2, 1), (2, 4, 1), (6, 4, 4)],
            // d, m, qh, the nibbles.
            PanelFormat::Q5_1 => &[(0, 2, 1), (2, 2, 1), (4, 4, 1), (8, 4, 4)],
        }
    }

    /// Byte offset within a panel block of segment `s`'s first unit (a constant where the
    /// format is one: the kernels' offsets).
    pub const fn offset(self, s: usize) -> usize {
        let segments = self.segments();
        let (mut at, mut i) = (0, 0);
        while i < s {
            let (_, unit, count) = segments[i];
            at += unit * count * ROWS;
            i += 1;
        }
        at
    }
}

/// A k-quant's segments ([`PanelFormat::segments`]).
const fn k_segments(format: KFormat) -> &'static [Segment] {
    match format {
        // d, dmin, the 12 scale bytes as three words, the 128 quant bytes as 32 words.
        KFormat::Q4K => &[(0, 2, 1), (2, 2, 1), (4, 4, 3), (16, 4, 32)],
        // Q4_K's, with the 32 fifth-bit bytes as eight words before the quants.
        KFormat::Q5K => &[(0, 2, 1), (2, 2, 1), (4, 4, 3), (16, 4, 8), (48, 4, 32)],
        KFormat::Q6K => &Q6K_SEGMENTS,
        // d, dmin, the 16 scale-and-min bytes as four words, the quants as 16.
        KFormat::Q2K => &[(80, 2, 1), (82, 2, 1), (0, 4, 4), (16, 4, 16)],
        KFormat::Q3K => &Q3K_SEGMENTS,
    }
}

/// Q6_K: d, the 16 scales as four words, then for each half `n` and word `w` the three words
/// a kernel reads together (`ql` words `16 n + w`, `16 n + 8 + w`, `qh` word `8 n + w`), so
/// the quants are read front to back (in three separate runs the hardware prefetchers lost
/// them: the decode was a fifth slower than the one-row kernel's).
const Q6K_SEGMENTS: [Segment; 50] = {
    let mut s = [(0, 0, 0); 50];
    (s[0], s[1]) = ((208, 2, 1), (192, 4, 4));
    let mut i = 0;
    while i < 16 {
        let (n, w) = (i / 8, i % 8);
        s[2 + 3 * i] = (64 * n + 4 * w, 4, 1);
        s[3 + 3 * i] = (64 * n + 32 + 4 * w, 4, 1);
        s[4 + 3 * i] = (128 + 32 * n + 4 * w, 4, 1);
        i += 1;
    }
    s
};

/// The revision of the bit recodings applied to the regrouped bytes ([`recode`]): part of the
/// panel cache's layout version, with the segments.
pub const RECODING: u32 = 3;

/// Which way [`recode`] goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Recode {
    /// From the regrouped GGUF bytes to the panel's.
    ToPanel,
    /// Back.
    ToGguf,
}

/// Recodes the quant words of a panel block of `format` byte position by byte position, where
/// the format has a recoding: Q6_K's sixteen and Q3_K's eight word triples ([`recode_triples`]:
/// [`q6_k_bytes`], [`q3_k_bytes`]) and Q5_K's words ([`recode_q5_k`]).
fn recode(format: PanelFormat, block: &mut [u8], way: Recode) {
    match format {
        PanelFormat::K(KFormat::Q6K) => recode_triples(format, block, 16, q6_k_bytes, way),
        PanelFormat::K(KFormat::Q3K) => recode_triples(format, block, 8, q3_k_bytes, way),
        PanelFormat::K(KFormat::Q5K) => recode_q5_k(block, way),
        _ => {}
    }
}

/// Recodes the `triples` quant word triples of a panel block of `format` (segments
/// `2 + 3 t..5 + 3 t`, 96 bytes), whose byte `i` holds weights of one row, by `bytes`.
fn recode_triples(
    format: PanelFormat,
    block: &mut [u8],
    triples: usize,
    bytes: fn([u8; 3], Recode) -> [u8; 3],
    way: Recode,
) {
    let quants = format.offset(2);
    assert_eq!(
        block.len(),
        quants + triples * 3 * WORD,
        "{format:?} panel block size"
    );
    for triple in block[quants..].chunks_exact_mut(3 * WORD) {
        let (first, rest) = triple.split_at_mut(WORD);
        let (second, third) = rest.split_at_mut(WORD);
        for ((x, y), z) in first
            .iter_mut()
            .zip(second.iter_mut())
            .zip(third.iter_mut())
        {
            [*x, *y, *z] = bytes([*x, *y, *z], way);
        }
    }
}

/// One byte position of a Q6_K word triple (`ql` words `16 n + w` and `16 n + 8 + w`, `qh`
/// word `8 n + w`). In the GGUF form weight 0 is the low nibble of the first byte with bits
/// 0-1 of the third above it, weight 1 the low nibble of the second with bits 2-3, weight 2 the
/// first's high nibble with bits 4-5, weight 3 the second's high nibble with bits 6-7. In the
/// panel the first byte holds weight 0 in bits 0-5 and bits 0-1 of weight 3 in bits 6-7, the
/// second weight 1 and bits 2-3 of weight 3, the third weight 2 and bits 4-5 of weight 3: a
/// mask gives three weights, and the fourth is three shifted masks ORed (the kernels'
/// `q6_k_words`), where the GGUF form takes about four operations for each.
fn q6_k_bytes([a, b, c]: [u8; 3], way: Recode) -> [u8; 3] {
    match way {
        Recode::ToPanel => {
            let w = [
                a & 0x0F | (c & 3) << 4,
                b & 0x0F | (c >> 2 & 3) << 4,
                a >> 4 | (c >> 4 & 3) << 4,
                b >> 4 | (c >> 6) << 4,
            ];
            [
                w[0] | w[3] << 6,
                w[1] | (w[3] >> 2) << 6,
                w[2] | (w[3] >> 4) << 6,
            ]
        }
        Recode::ToGguf => {
            let w = [
                a & 0x3F,
                b & 0x3F,
                c & 0x3F,
                a >> 6 | (b >> 6) << 2 | (c >> 6) << 4,
            ];
            [
                w[0] & 0x0F | (w[2] & 0x0F) << 4,
                w[1] & 0x0F | (w[3] & 0x0F) << 4,
                w[0] >> 4 | (w[1] >> 4) << 2 | (w[2] >> 4) << 4 | (w[3] >> 4) << 6,
            ]
        }
    }
}

/// Recodes a Q5_K panel block: byte `i` of its fifth-bit word `w` (segment 3) and of its quant
/// words `w`, `8 + w`, `16 + w`, `24 + w` (segment 4) hold the eight 5-bit weights of one row
/// at that position, chunk pair `j`'s in quant word `8 j + w` ([`q5_k_bytes`] says how, each
/// way).
fn recode_q5_k(block: &mut [u8], way: Recode) {
    let format = PanelFormat::K(KFormat::Q5K);
    let (highs, quants) = (format.offset(3), format.offset(4));
    assert_eq!(block.len(), quants + 32 * WORD, "Q5_K panel block size");
    for w in 0..8 {
        for i in 0..WORD {
            let h = highs + w * WORD + i;
            let x: [usize; 4] = std::array::from_fn(|j| quants + (8 * j + w) * WORD + i);
            let (high, low) = q5_k_bytes(block[h], x.map(|at| block[at]), way);
            block[h] = high;
            for (at, byte) in x.into_iter().zip(low) {
                block[at] = byte;
            }
        }
    }
}

/// One byte position of a Q5_K fifth-bit word and its four quant words: the weights `q` of
/// chunks `2 j` and `2 j + 1` (0..32). In the GGUF form the `j`-th quant byte holds their low
/// four bits (low and high nibble) and the fifth-bit byte their fifth bits as bits `2 j`,
/// `2 j + 1`. In the panel the `j`-th quant byte holds chunk `2 j` in bits 0-4 and bits 0-2 of
/// chunk `2 j + 1` in bits 5-7, and the fifth-bit byte bits 3-4 of chunk `2 j + 1` as its bits
/// `2 j`, `2 j + 1`: a mask gives the first chunk, two shifted masks ORed the second (the
/// kernels' `k4_words`), where the GGUF form takes about four operations and a half for each.
fn q5_k_bytes(high: u8, low: [u8; 4], way: Recode) -> (u8, [u8; 4]) {
    match way {
        Recode::ToPanel => {
            let q: [[u8; 2]; 4] = std::array::from_fn(|j| {
                [
                    low[j] & 0x0F | (high >> (2 * j) & 1) << 4,
                    low[j] >> 4 | (high >> (2 * j + 1) & 1) << 4,
                ]
            });
            let top = (0..4).fold(0, |h, j| h | (q[j][1] >> 3) << (2 * j));
            (top, q.map(|[a, b]| a | (b & 7) << 5))
        }
        Recode::ToGguf => {
            let q: [[u8; 2]; 4] =
                std::array::from_fn(|j| [low[j] & 0x1F, low[j] >> 5 | (high >> (2 * j) & 3) << 3]);
            let fifth = (0..4).fold(0, |h, j| {
                h | (q[j][0] >> 4) << (2 * j) | (q[j][1] >> 4) << (2 * j + 1)
            });
            (fifth, q.map(|[a, b]| a & 0x0F | (b & 0x0F) << 4))
        }
    }
}

/// One byte position of a Q3_K word triple (high-bit mask word `w`, quant words `w`, `8 + w`):
/// eight 3-bit weights `q`, chunk `c`'s (0..8, before the offset of 4). In the GGUF form `q`'s
/// bit 2 is bit `c` of the first byte and its bits 0-1 bits `2 (c % 4)` of the second (`c < 4`)
/// or third byte. In the panel the first byte holds chunk 0 in bits 0-2, chunk 1 in bits 3-5
/// and bits 0-1 of chunk 6 in bits 6-7; the second chunks 2, 3 and bits 0-1 of chunk 7; the
/// third chunks 4, 5, bit 2 of chunk 6 in bit 6 and of chunk 7 in bit 7: six chunks are a mask
/// or a shift and a mask away, the other two two of each ORed (the kernels' `q3_k_chunk`),
/// where the GGUF form takes about six operations for each.
fn q3_k_bytes([a, b, c]: [u8; 3], way: Recode) -> [u8; 3] {
    match way {
        Recode::ToPanel => {
            let q: [u8; 8] = std::array::from_fn(|k| {
                let low = if k < 4 { b } else { c };
                (low >> (2 * (k % 4)) & 3) | (a >> k & 1) << 2
            });
            [
                q[0] | q[1] << 3 | (q[6] & 3) << 6,
                q[2] | q[3] << 3 | (q[7] & 3) << 6,
                q[4] | q[5] << 3 | (q[6] >> 2) << 6 | (q[7] >> 2) << 7,
            ]
        }
        Recode::ToGguf => {
            let q = [
                a & 7,
                a >> 3 & 7,
                b & 7,
                b >> 3 & 7,
                c & 7,
                c >> 3 & 7,
                a >> 6 | (c >> 6 & 1) << 2,
                b >> 6 | (c >> 7) << 2,
            ];
            let high = (0..8).fold(0, |h, k| h | (q[k] >> 2) << k);
            let low = |first: usize| (0..4).fold(0, |x, k| x | (q[first + k] & 3) << (2 * k));
            [high, low(0), low(4)]
        }
    }
}

/// Q3_K: d, the 12 scale bytes as three words, then for each word `w` the high-bit mask's word
/// `w` and the quant words `w`, `8 + w` (read together, front to back; recoded, see
/// [`q3_k_bytes`]).
const Q3K_SEGMENTS: [Segment; 26] = {
    let mut s = [(0, 0, 0); 26];
    (s[0], s[1]) = ((108, 2, 1), (96, 4, 3));
    let mut w = 0;
    while w < 8 {
        s[2 + 3 * w] = (4 * w, 4, 1);
        s[3 + 3 * w] = (32 + 4 * w, 4, 1);
        s[4 + 3 * w] = (64 + 4 * w, 4, 1);
        w += 1;
    }
    s
};

/// Byte offset within a panel block of segment `s`'s first unit ([`PanelFormat::offset`]).
pub fn segment_at(format: impl Into<PanelFormat>, s: usize) -> usize {
    format.into().offset(s)
}

/// Whether a `rows` x `kb` super-block matrix can take the panel layout.
pub fn fits(rows: usize, kb: usize) -> bool {
    rows.is_multiple_of(ROWS) && rows > 0 && kb > 0
}

/// What a matrix's panel layout is: its format, weight rows and blocks per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PanelShape {
    pub format: PanelFormat,
    pub rows: usize,
    pub kb: usize,
}

impl PanelShape {
    /// Bytes of the layout (as many as the GGUF rows').
    pub fn bytes(self) -> usize {
        self.rows * self.kb * self.format.block_bytes()
    }
}

/// A matrix in the panel layout.
#[derive(Debug)]
pub struct Panels {
    shape: PanelShape,
    bytes: PanelBytes,
}

/// Where a [`Panels`]' bytes are.
#[derive(Debug)]
enum PanelBytes {
    /// Anonymous memory of their own.
    Own(memmap2::Mmap),
    /// A range of a mapped file.
    Mapped {
        map: Arc<memmap2::Mmap>,
        range: Range<usize>,
    },
}

impl Panels {
    /// The panel layout of `raw` (`rows` GGUF rows of `kb` super-blocks each, row after row;
    /// [`fits`] must hold), the panels made in parallel; an error when no memory could be
    /// mapped for them.
    pub fn pack(
        format: PanelFormat,
        raw: &[u8],
        rows: usize,
        kb: usize,
    ) -> std::io::Result<Panels> {
        use rayon::prelude::*;
        let bytes = format.block_bytes();
        assert!(fits(rows, kb), "{format:?} {rows}x{kb} has no panel layout");
        assert_eq!(raw.len(), rows * kb * bytes, "{format:?} matrix size");
        let panel_bytes = ROWS * kb * bytes;
        // Anonymous memory of its own, its pages made as the packing threads write them
        // (measured on the Zen 3 VM of docs/BENCHMARKS.md: `MAP_POPULATE` made them on one
        // thread at about 2 GB/s, a load 5 % slower; `MADV_HUGEPAGE` stalled some loads 3x
        // in compaction).
        let mut out = memmap2::MmapOptions::new().len(raw.len()).map_anon()?;
        out.par_chunks_mut(panel_bytes)
            .enumerate()
            .for_each(|(panel, out)| {
                let rows = &raw[panel * panel_bytes..(panel + 1) * panel_bytes];
                pack_panel(format, kb, rows, out);
            });
        Ok(Panels {
            shape: PanelShape { format, rows, kb },
            bytes: PanelBytes::Own(out.make_read_only()?),
        })
    }

    /// The panels of a matrix of `shape` held in `map[range]` as
    /// [`Panels::as_bytes`] gave them (a panel cache file); `None` when the shape has no panel
    /// layout or `range` does not hold exactly its bytes inside `map`. The bytes
    /// are read as they are: the caller vouches for where they came from.
    pub fn mapped(
        shape: PanelShape,
        map: Arc<memmap2::Mmap>,
        range: Range<usize>,
    ) -> Option<Panels> {
        let fits_range = range.end <= map.len() && range.len() == shape.bytes();
        (fits(shape.rows, shape.kb) && fits_range).then_some(Panels {
            shape,
            bytes: PanelBytes::Mapped { map, range },
        })
    }

    /// Format, rows and super-blocks per row.
    pub fn shape(&self) -> PanelShape {
        self.shape
    }

    /// Every panel, front to back (what [`Panels::mapped`] reads back).
    pub fn as_bytes(&self) -> &[u8] {
        match &self.bytes {
            PanelBytes::Own(map) => map,
            PanelBytes::Mapped { map, range } => &map[range.clone()],
        }
    }

    pub fn format(&self) -> PanelFormat {
        self.shape.format
    }

    /// Weight rows.
    pub fn rows(&self) -> usize {
        self.shape.rows
    }

    /// Super-blocks per row.
    pub fn kb(&self) -> usize {
        self.shape.kb
    }

    /// Panics unless `weights` are whole panels of this matrix and every length in
    /// `act_rows` (activation rows' blocks) is `blocks`: the panel GEMMs' argument check.
    pub fn check_task(
        &self,
        weights: &Range<usize>,
        act_rows: impl IntoIterator<Item = usize>,
        blocks: usize,
    ) {
        assert!(
            weights.start.is_multiple_of(ROWS) && weights.end <= self.rows(),
            "weight rows {weights:?} are not whole panels of the {} rows",
            self.rows()
        );
        assert!(
            act_rows.into_iter().all(|n| n == blocks),
            "activation rows of other than {blocks} blocks"
        );
    }

    /// Bytes held.
    pub fn len(&self) -> usize {
        self.as_bytes().len()
    }

    /// Whether there are no rows (never: a matrix with a panel layout has some).
    pub fn is_empty(&self) -> bool {
        self.shape.rows == 0
    }

    /// The `kb` panel blocks of the panel holding rows `8 p..8 p + 8`.
    pub fn panel(&self, p: usize) -> &[u8] {
        let n = ROWS * self.shape.kb * self.shape.format.block_bytes();
        &self.as_bytes()[p * n..(p + 1) * n]
    }

    /// The eight rows' GGUF blocks of super-block `b` of panel `p`, row after row, in `out`
    /// (`8 * block_bytes` long).
    fn unpack_block(&self, p: usize, b: usize, out: &mut [u8]) {
        let bytes = self.shape.format.block_bytes();
        let block = &self.panel(p)[b * ROWS * bytes..(b + 1) * ROWS * bytes];
        unpack_block(self.shape.format, block, out);
    }

    /// Row `row`'s GGUF bytes (`kb` super-blocks), in `out`.
    pub fn unpack_row(&self, row: usize, out: &mut [u8]) {
        let bytes = self.shape.format.block_bytes();
        assert_eq!(
            out.len(),
            self.shape.kb * bytes,
            "{:?} row size",
            self.shape.format
        );
        let mut blocks = vec![0u8; ROWS * bytes];
        for b in 0..self.shape.kb {
            self.unpack_block(row / ROWS, b, &mut blocks);
            let r = row % ROWS;
            out[b * bytes..(b + 1) * bytes].copy_from_slice(&blocks[r * bytes..(r + 1) * bytes]);
        }
    }
}

/// One panel (`rows`: its eight GGUF rows of `kb` blocks of `format`) into `out`, unit by
/// unit, then recoded where the format is ([`recode`]).
fn pack_panel(format: PanelFormat, kb: usize, rows: &[u8], out: &mut [u8]) {
    let (segments, bytes) = (format.segments(), format.block_bytes());
    let row_len = kb * bytes;
    assert!(rows.len() == ROWS * row_len && out.len() == rows.len());
    assert!(segments
        .iter()
        .all(|&(offset, unit, count)| offset + unit * count <= bytes));
    assert_eq!(
        segments.iter().map(|&(_, u, c)| u * c).sum::<usize>(),
        bytes
    );
    let src = rows.as_ptr();
    let mut to = out.as_mut_ptr();
    for b in 0..kb {
        for &(offset, unit, count) in segments {
            for k in 0..count {
                let at = b * bytes + offset + k * unit;
                // SAFETY: `at + unit <= row_len` (the segments lie inside a block), so every
                // read is inside `rows`; the writes fill `out` once, front to back (the
                // segments cover a block exactly once), so they stay inside it.
                unsafe {
                    let from = |r: usize| src.add(r * row_len + at);
                    match unit {
                        4 => {
                            for r in 0..ROWS {
                                to.cast::<u32>()
                                    .write_unaligned(from(r).cast::<u32>().read_unaligned());
                                to = to.add(4);
                            }
                        }
                        _ => {
                            for r in 0..ROWS {
                                std::ptr::copy_nonoverlapping(from(r), to, unit);
                                to = to.add(unit);
                            }
                        }
                    }
                }
            }
        }
    }
    debug_assert_eq!(to as usize - out.as_ptr() as usize, out.len());
    for block in out.chunks_exact_mut(ROWS * bytes) {
        recode(format, block, Recode::ToPanel);
    }
}

/// The eight rows' GGUF blocks (row after row, in `out`) of one panel block.
fn unpack_block(format: PanelFormat, block: &[u8], out: &mut [u8]) {
    let bytes = format.block_bytes();
    let segments = format.segments();
    assert_eq!(block.len(), ROWS * bytes, "{format:?} panel block size");
    assert_eq!(out.len(), ROWS * bytes, "{format:?} block rows size");
    let mut gguf = block.to_vec();
    recode(format, &mut gguf, Recode::ToGguf);
    let block = &gguf[..];
    let mut at = 0;
    for &(offset, unit, count) in segments {
        for k in 0..count {
            for r in 0..ROWS {
                let to = r * bytes + offset + k * unit;
                out[to..to + unit].copy_from_slice(&block[at..at + unit]);
                at += unit;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every byte triple of the recoded formats (Q5_K: a fifth-bit byte and four quant bytes
    /// made from it): the panel form gives the GGUF form back, and the weights the kernels take
    /// from the panel form (the scalar image of `q6_k_words`, `k4_words` and `q3_k_chunk`'s
    /// masks and shifts) are the GGUF form's.
    #[test]
    fn the_recodings_keep_every_weight_of_every_byte_triple() {
        for x in 0..1u32 << 24 {
            let gguf = [x as u8, (x >> 8) as u8, (x >> 16) as u8];
            let [a, b, c] = gguf;

            let p = q6_k_bytes(gguf, Recode::ToPanel);
            assert_eq!(q6_k_bytes(p, Recode::ToGguf), gguf, "Q6_K {gguf:?}");
            let want = [
                a & 0x0F | (c & 3) << 4,
                b & 0x0F | (c >> 2 & 3) << 4,
                a >> 4 | (c >> 4 & 3) << 4,
                b >> 4 | (c >> 6) << 4,
            ];
            let got = [
                p[0] & 0x3F,
                p[1] & 0x3F,
                p[2] & 0x3F,
                (p[0] >> 6) & 0x03 | (p[1] >> 4) & 0x0C | (p[2] >> 2) & 0x30,
            ];
            assert_eq!(got, want, "Q6_K weights of {gguf:?}");

            // Q5_K: the fifth-bit byte and quant byte j from the triple's first two bytes, the
            // other quant bytes from its third.
            let high = a;
            let low = [b, c, c.rotate_left(3), !b];
            let (ph, pl) = q5_k_bytes(high, low, Recode::ToPanel);
            assert_eq!(
                q5_k_bytes(ph, pl, Recode::ToGguf),
                (high, low),
                "Q5_K {gguf:?}"
            );
            for j in 0..4 {
                let want = [
                    low[j] & 0x0F | (high >> (2 * j) & 1) << 4,
                    low[j] >> 4 | (high >> (2 * j + 1) & 1) << 4,
                ];
                let moved = if j < 2 {
                    ph << (3 - 2 * j)
                } else {
                    ph >> (2 * j - 3)
                };
                let got = [pl[j] & 0x1F, (pl[j] >> 5) & 7 | moved & 0x18];
                assert_eq!(got, want, "Q5_K chunks {} of {gguf:?}", 2 * j);
            }

            let p = q3_k_bytes(gguf, Recode::ToPanel);
            assert_eq!(q3_k_bytes(p, Recode::ToGguf), gguf, "Q3_K {gguf:?}");
            for k in 0..8 {
                let low = if k < 4 { b } else { c };
                let want = (low >> (2 * (k % 4))) & 3 | ((a >> k) & 1) << 2;
                let got = match k {
                    0..=5 => (p[k / 2] >> (3 * (k % 2))) & 7,
                    _ => (p[k - 6] >> 6) & 3 | (p[2] >> (k - 2)) & 4,
                };
                assert_eq!(got, want, "Q3_K chunk {k} of {gguf:?}");
            }
        }
    }
}
