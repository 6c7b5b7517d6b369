//! Quantized views into a slot: [`SlotBlocks`] lets candle's quantized matmul read GGML blocks
//! that live in a device slot's block region, without copying them into a `QTensor` of its own.
//!
//! candle's CPU `QTensor` owns its blocks (`QStorage::Cpu(Box<dyn QuantizedType>)`), and the only
//! way to build one from bytes (`QStorage::from_data`) copies them into a fresh `Vec` per tensor:
//! a weight-sized allocation per tensor per slot fill. Instead, [`SlotBlocks`] implements
//! `QuantizedType` over a range of the slot's [`BlockArena`] and dispatches to the same
//! `k_quants` kernels candle's own storage uses, so results are bit-identical to resident weights.
//!
//! A new `QTensor` wraps the view at every slot fill (three small handle allocations per matrix,
//! never the weight bytes): a `QTensor` caches repacked copies of its blocks for some types on
//! some CPUs, and a fresh one guarantees that cache never describes a previous layer.
//!
//! The types candle has no block type for (IQ4_NL, IQ4_XS, MXFP4) cannot be a `QTensor`; their
//! matrices are [`ArenaBytes`] views instead, read in place by ferry's own CPU kernels
//! ([`arena_linear`]), so their layers stream like the others.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use candle_core::quantized::k_quants::{
    self, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1,
    BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
};
use candle_core::quantized::{GgmlDType, GgmlType, QuantizedType};
use candle_core::{CpuStorage, Result};
use half::{bf16, f16};

use super::buffer::AlignedBytes;
use ferry_model::cpu_qmatmul::blocks::ExternalBytes;
use ferry_model::cpu_qmatmul::Blocks;
use ferry_model::header::GgufType;
use ferry_model::weights::Linear;

/// Runs `$body` with `$t` bound to the block type of `$dtype`.
macro_rules! with_block_type {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            GgmlDType::F32 => {
                type $t = f32;
                $body
            }
            GgmlDType::F16 => {
                type $t = f16;
                $body
            }
            GgmlDType::BF16 => {
                type $t = bf16;
                $body
            }
            GgmlDType::Q4_0 => {
                type $t = BlockQ4_0;
                $body
            }
            GgmlDType::Q4_1 => {
                type $t = BlockQ4_1;
                $body
            }
            GgmlDType::Q5_0 => {
                type $t = BlockQ5_0;
                $body
            }
            GgmlDType::Q5_1 => {
                type $t = BlockQ5_1;
                $body
            }
            GgmlDType::Q8_0 => {
                type $t = BlockQ8_0;
                $body
            }
            GgmlDType::Q8_1 => {
                type $t = BlockQ8_1;
                $body
            }
            GgmlDType::Q2K => {
                type $t = BlockQ2K;
                $body
            }
            GgmlDType::Q3K => {
                type $t = BlockQ3K;
                $body
            }
            GgmlDType::Q4K => {
                type $t = BlockQ4K;
                $body
            }
            GgmlDType::Q5K => {
                type $t = BlockQ5K;
                $body
            }
            GgmlDType::Q6K => {
                type $t = BlockQ6K;
                $body
            }
            GgmlDType::Q8K => {
                type $t = BlockQ8K;
                $body
            }
        }
    };
}

/// The block region of one slot: raw GGML bytes, rewritten by the copy engine at each fill and
/// read by the quantized matmul kernels in between.
#[derive(Debug)]
pub struct BlockArena {
    data: RwLock<AlignedBytes>,
}

impl BlockArena {
    /// A zeroed region of `len` bytes (allocated once, at start).
    pub fn new(len: usize) -> Arc<Self> {
        Arc::new(Self {
            data: RwLock::new(AlignedBytes::zeroed(len)),
        })
    }

    /// A region over `bytes` as they are (a host slab written once: on CUDA pinned memory,
    /// which the copy stream reads and ferry's CPU kernels compute from alike).
    pub fn from_bytes(bytes: AlignedBytes) -> Arc<Self> {
        Arc::new(Self {
            data: RwLock::new(bytes),
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Read access (a poisoned lock still holds plain bytes, so it is used as is).
    pub fn read(&self) -> RwLockReadGuard<'_, AlignedBytes> {
        self.data.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Write access, for the copy engine.
    pub fn write(&self) -> RwLockWriteGuard<'_, AlignedBytes> {
        self.data.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// `len` bytes of GGML blocks of type `dtype` at `offset` in a slot's block region.
#[derive(Debug, Clone)]
pub struct SlotBlocks {
    arena: Arc<BlockArena>,
    offset: usize,
    len: usize,
    dtype: GgmlDType,
}

impl SlotBlocks {
    /// A view of `arena[offset..offset + len]`; fails if the range or its alignment is wrong for
    /// `dtype`.
    pub fn new(
        arena: Arc<BlockArena>,
        offset: usize,
        len: usize,
        dtype: GgmlDType,
    ) -> Result<Self> {
        let view = Self {
            arena,
            offset,
            len,
            dtype,
        };
        let guard = view.arena.read();
        let bytes = view.bytes(&guard)?;
        with_block_type!(view.dtype, T => cast::<T>(bytes).map(|_| ()))?;
        drop(guard);
        Ok(view)
    }

    fn bytes<'g>(&self, guard: &'g AlignedBytes) -> Result<&'g [u8]> {
        guard
            .as_bytes()
            .get(self.offset..self.offset + self.len)
            .ok_or_else(|| candle_core::Error::Msg("slot view out of range".into()))
    }
}

/// Views `bytes` as blocks of `T`, checking size and alignment.
fn cast<T: GgmlType>(bytes: &[u8]) -> Result<&[T]> {
    let size = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(size)
        || !(bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>())
    {
        return Err(candle_core::Error::Msg(format!(
            "slot view of {} bytes at {:p} is not a whole, aligned run of {:?} blocks",
            bytes.len(),
            bytes.as_ptr(),
            T::DTYPE
        )));
    }
    // SAFETY: GGML block types are plain old data (integers and floats, every bit pattern
    // valid), the length is a whole number of blocks and the start is aligned for `T`.
    Ok(unsafe { std::slice::from_raw_parts(bytes.as_ptr() as *const T, bytes.len() / size) })
}

/// Mutable form of [`cast`].
fn cast_mut<T: GgmlType>(bytes: &mut [u8]) -> Result<&mut [T]> {
    cast::<T>(bytes)?;
    let n = bytes.len() / std::mem::size_of::<T>();
    // SAFETY: checked by `cast` above; access is unique through `&mut`.
    Ok(unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut T, n) })
}

fn embedding_rows<T: GgmlType>(
    blocks: &[T],
    ids: &[u32],
    rows: usize,
    hidden: usize,
) -> Result<CpuStorage> {
    if !hidden.is_multiple_of(T::BLCK_SIZE) || blocks.len() != rows * (hidden / T::BLCK_SIZE) {
        return Err(candle_core::Error::Msg(
            "slot view does not hold a [rows, hidden] table".into(),
        ));
    }
    let row_blocks = hidden / T::BLCK_SIZE;
    let mut out = vec![0f32; ids.len() * hidden];
    for (i, &id) in ids.iter().enumerate() {
        let row = id as usize;
        if row >= rows {
            return Err(candle_core::Error::Msg(format!(
                "embedding id {row} is out of range for {rows} rows"
            )));
        }
        T::to_float(
            &blocks[row * row_blocks..(row + 1) * row_blocks],
            &mut out[i * hidden..(i + 1) * hidden],
        );
    }
    Ok(CpuStorage::F32(out))
}

impl QuantizedType for SlotBlocks {
    fn dtype(&self) -> GgmlDType {
        self.dtype
    }

    fn matmul_t(&self, mkn: (usize, usize, usize), lhs: &[f32], dst: &mut [f32]) -> Result<()> {
        let guard = self.arena.read();
        let bytes = self.bytes(&guard)?;
        with_block_type!(self.dtype, T => k_quants::matmul::<T>(mkn, lhs, cast::<T>(bytes)?, dst))
    }

    fn matmul_t_f16(&self, mkn: (usize, usize, usize), lhs: &[f16], dst: &mut [f16]) -> Result<()> {
        let guard = self.arena.read();
        let bytes = self.bytes(&guard)?;
        with_block_type!(self.dtype, T => k_quants::matmul_f16::<T>(mkn, lhs, cast::<T>(bytes)?, dst))
    }

    fn embedding(&self, ids: &[u32], rows: usize, hidden: usize) -> Result<CpuStorage> {
        let guard = self.arena.read();
        let bytes = self.bytes(&guard)?;
        with_block_type!(self.dtype, T => embedding_rows::<T>(cast::<T>(bytes)?, ids, rows, hidden))
    }

    fn dequantize(&self, elem_count: usize) -> Result<CpuStorage> {
        let guard = self.arena.read();
        let bytes = self.bytes(&guard)?;
        let mut ys = vec![0f32; elem_count];
        with_block_type!(self.dtype, T => T::to_float(cast::<T>(bytes)?, &mut ys));
        Ok(CpuStorage::F32(ys))
    }

    fn storage_size_in_bytes(&self) -> usize {
        self.len
    }

    /// The start of the view. Valid while the slot holds this layer: the copy engine rewrites the
    /// region only after the forward loop has released the layer.
    fn as_ptr(&self) -> *const u8 {
        let guard = self.arena.read();
        guard.as_bytes()[self.offset..].as_ptr()
    }

    fn block_size(&self) -> usize {
        self.dtype.block_size()
    }

    fn from_float(&mut self, xs: &[f32]) {
        let mut guard = self.arena.write();
        let range = self.offset..self.offset + self.len;
        if let Some(bytes) = guard.as_bytes_mut().get_mut(range) {
            with_block_type!(self.dtype, T => if let Ok(ys) = cast_mut::<T>(bytes) {
                T::from_float(xs, ys)
            });
        }
    }

    fn from_float_imatrix(&mut self, xs: &[f32], imatrix_weights: &[f32], n_per_row: usize) {
        let mut guard = self.arena.write();
        let range = self.offset..self.offset + self.len;
        if let Some(bytes) = guard.as_bytes_mut().get_mut(range) {
            with_block_type!(self.dtype, T => if let Ok(ys) = cast_mut::<T>(bytes) {
                T::from_float_imatrix(xs, ys, imatrix_weights, n_per_row)
            });
        }
    }

    fn size(&self) -> usize {
        self.len
    }
}

/// `len` bytes at `offset` of a slot's block region, as raw GGUF blocks for ferry's kernels.
#[derive(Debug)]
pub struct ArenaBytes {
    arena: Arc<BlockArena>,
    offset: usize,
    len: usize,
}

impl ArenaBytes {
    /// A view of `arena[offset..offset + len]`; `None` if the range lies outside the region.
    pub fn new(arena: Arc<BlockArena>, offset: usize, len: usize) -> Option<Self> {
        let end = offset.checked_add(len)?;
        (end <= arena.len()).then_some(Self { arena, offset, len })
    }
}

impl ExternalBytes for ArenaBytes {
    /// Valid while the slot holds this layer, as [`SlotBlocks::as_ptr`]: the region is allocated
    /// once and never resized, and the copy engine rewrites it only after the forward loop has
    /// released the layer.
    fn bytes(&self) -> &[u8] {
        let guard = self.arena.read();
        let start = guard.as_bytes()[self.offset..].as_ptr();
        // SAFETY: `new` checked the range against the region, which is never reallocated while
        // `self.arena` keeps it alive; the bytes are plain data.
        unsafe { std::slice::from_raw_parts(start, self.len) }
    }
}

/// A linear layer over `len` bytes of `ty` blocks at `offset` of `arena`, shaped `shape`
/// (`[out, in]`), computed by ferry's CPU kernels in place.
pub fn arena_linear(
    arena: &Arc<BlockArena>,
    offset: usize,
    len: usize,
    ty: GgufType,
    shape: &[usize],
    bias: Option<candle_core::Tensor>,
) -> std::result::Result<Linear, ferry_model::ModelError> {
    let bytes = ArenaBytes::new(arena.clone(), offset, len).ok_or_else(|| {
        ferry_model::ModelError::Config(format!(
            "{ty} matrix at {offset}+{len} lies outside its slot's {}-byte block region",
            arena.len()
        ))
    })?;
    Linear::from_blocks(Blocks::external(Arc::new(bytes), ty, shape)?, bias)
}
