//! [`Blocks`]: the raw GGUF blocks of one 2-D quantized matrix `[rows, cols]`, keyed by ferry's
//! own [`GgufType`], wherever the bytes live: a range of the memory-mapped model file (the CPU
//! loader's views: nothing is copied, and the map stays alive as long as any view of it), bytes
//! of its own (tests, conversions), a CPU candle [`QTensor`] (the offload engine's slots, which
//! view their block arena through one) or bytes another owner keeps ([`ExternalBytes`]: a slot's
//! arena for the types candle has no block type for).
//!
//! The kernels of [`super::CpuQMatMul`] read [`Blocks::bytes`]; an embedding table dequantizes
//! the rows it looks up ([`Blocks::dequantize_rows`], through [`super::dequant`]).

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use candle_core::quantized::{QStorage, QTensor};
use candle_core::Device;
use memmap2::Mmap;

use super::dequant;
use crate::error::{ModelError, Result};
use crate::header::GgufType;

/// Where the bytes are.
#[derive(Debug, Clone)]
enum Bytes {
    /// `range` of a mapped file.
    Mapped { map: Arc<Mmap>, range: Range<usize> },
    /// Bytes of its own.
    Owned(Arc<[u8]>),
    /// A CPU candle tensor's blocks.
    Candle(Arc<QTensor>),
    /// Bytes another owner keeps.
    External(Arc<dyn ExternalBytes>),
}

/// Bytes of GGUF blocks that another owner keeps (an offload slot's block region), seen in place.
pub trait ExternalBytes: std::fmt::Debug + Send + Sync {
    /// The blocks, row after row. The owner keeps them valid and unchanged while any [`Blocks`]
    /// holds this source.
    fn bytes(&self) -> &[u8];
}

/// The GGUF blocks of a `[rows, cols]` matrix of type `ty` (cheap to clone: the bytes are
/// shared).
#[derive(Debug, Clone)]
pub struct Blocks {
    ty: GgufType,
    rows: usize,
    cols: usize,
    bytes: Bytes,
}

impl Blocks {
    /// A view of `map[range]` holding a matrix of `shape` (`[rows, cols]`) stored as `ty`.
    pub fn mapped(
        map: Arc<Mmap>,
        range: Range<usize>,
        ty: GgufType,
        shape: &[usize],
    ) -> Result<Self> {
        if map.get(range.clone()).is_none() {
            return Err(ModelError::Source(format!(
                "blocks {range:?} lie past the end of a {}-byte file",
                map.len()
            )));
        }
        Self::checked(ty, shape, range.len(), Bytes::Mapped { map, range })
    }

    /// Blocks of their own.
    pub fn owned(bytes: Vec<u8>, ty: GgufType, shape: &[usize]) -> Result<Self> {
        let len = bytes.len();
        Self::checked(ty, shape, len, Bytes::Owned(bytes.into()))
    }

    /// The blocks of a CPU-resident candle tensor (no copy).
    pub fn from_qtensor(weight: Arc<QTensor>) -> Result<Self> {
        if !weight.device().is_cpu() {
            return Err(ModelError::Unsupported(
                "CPU quantized matmul of a weight that is not on the CPU".into(),
            ));
        }
        let ty = GgufType::from_candle(weight.dtype());
        let shape = weight.shape().dims().to_vec();
        let len = weight.data()?.len();
        Self::checked(ty, &shape, len, Bytes::Candle(weight))
    }

    /// Blocks that `source` keeps (no copy).
    pub fn external(source: Arc<dyn ExternalBytes>, ty: GgufType, shape: &[usize]) -> Result<Self> {
        let len = source.bytes().len();
        Self::checked(ty, shape, len, Bytes::External(source))
    }

    fn checked(ty: GgufType, shape: &[usize], len: usize, bytes: Bytes) -> Result<Self> {
        let &[rows, cols] = shape else {
            return Err(ModelError::Config(format!(
                "quantized matrix of shape {shape:?} is not 2-D"
            )));
        };
        let want =
            (cols % ty.block_size() == 0).then(|| rows * (cols / ty.block_size()) * ty.type_size());
        if want != Some(len) {
            return Err(ModelError::Config(format!(
                "quantized weight {rows}x{cols} of {ty} holds {len} bytes"
            )));
        }
        Ok(Self {
            ty,
            rows,
            cols,
            bytes,
        })
    }

    /// The GGUF type of the blocks.
    pub fn ty(&self) -> GgufType {
        self.ty
    }

    /// Rows (output features of a projection, tokens of an embedding table).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (input features, hidden size of an embedding table).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_size() * self.ty.type_size()
    }

    /// Bytes of the whole matrix.
    pub fn len(&self) -> usize {
        self.rows * self.row_bytes()
    }

    /// Whether the matrix has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the bytes are a view of a mapped file.
    pub fn is_mapped(&self) -> bool {
        matches!(self.bytes, Bytes::Mapped { .. })
    }

    /// The raw blocks, row after row.
    pub fn bytes(&self) -> Result<Cow<'_, [u8]>> {
        Ok(match &self.bytes {
            Bytes::Mapped { map, range } => Cow::Borrowed(&map[range.clone()]),
            Bytes::Owned(bytes) => Cow::Borrowed(bytes),
            Bytes::Candle(q) => q.data()?,
            Bytes::External(source) => Cow::Borrowed(source.bytes()),
        })
    }

    /// Hands the mapped file's pages of these blocks back to the page cache (a mapped view
    /// whose bytes are held elsewhere too); they are read again from the file if used. No-op
    /// for blocks in memory of their own.
    pub fn release_pages(&self) {
        if let Bytes::Mapped { map, range } = &self.bytes {
            // Whole pages inside the range only: neighbours' pages stay.
            let page = 4096;
            let start = range.start.next_multiple_of(page);
            let end = range.end / page * page;
            if end > start {
                // No huge mappings over the range (it becomes a mapping of its own): otherwise
                // reading a neighbouring tensor maps the file's large pages across it again
                // (measured: a third of a Q3_K_M file's released Q4_K rows came back).
                let _ = map.advise_range(memmap2::Advice::NoHugePage, start, end - start);
                // SAFETY: the mapping is a read-only file mapping; dropping its pages only
                // makes the next read fault them in from the file again, with the same bytes.
                let _ = unsafe {
                    map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        start,
                        end - start,
                    )
                };
            }
        }
    }

    /// Dequantizes rows `ids` into `out` (`ids.len() * cols` values, row after row).
    pub fn dequantize_rows(&self, ids: &[u32], out: &mut [f32]) -> Result<()> {
        if out.len() != ids.len() * self.cols {
            return Err(ModelError::Config(format!(
                "{} rows of {} values do not fill {} outputs",
                ids.len(),
                self.cols,
                out.len()
            )));
        }
        let bytes = self.bytes()?;
        let row_bytes = self.row_bytes();
        for (&id, dst) in ids.iter().zip(out.chunks_mut(self.cols.max(1))) {
            let row = id as usize;
            if row >= self.rows {
                return Err(ModelError::Config(format!(
                    "embedding id {row} is out of range for {} rows",
                    self.rows
                )));
            }
            dequant::dequantize(self.ty, &bytes[row * row_bytes..(row + 1) * row_bytes], dst)?;
        }
        Ok(())
    }

    /// The whole matrix dequantized to f32, row major.
    pub fn dequantize(&self) -> Result<Vec<f32>> {
        let mut out = vec![0f32; self.rows * self.cols];
        dequant::dequantize(self.ty, &self.bytes()?, &mut out)?;
        Ok(out)
    }

    /// A candle tensor of these blocks on `device` (a copy; for candle's kernels, which own
    /// their storage). Fails for types candle 0.11.1 does not know.
    pub fn to_qtensor(&self, device: &Device) -> Result<QTensor> {
        let dtype = self.ty.to_candle().ok_or_else(|| {
            ModelError::Unsupported(format!("candle has no kernels for {}", self.ty))
        })?;
        let storage = QStorage::from_data(self.bytes()?, device, dtype)?;
        Ok(QTensor::new(storage, (self.rows, self.cols))?)
    }
}
