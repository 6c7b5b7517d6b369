//! One device slot of the streaming ring: buffers allocated once at start that receive an
//! offloaded layer's slab, and the [`LayerWeights`] views the forward loop computes with.
//!
//! A slot mirrors the slab layout of [`super::host`]: a block region ([`BlockArena`], raw GGML
//! bytes viewed through [`SlotBlocks`]) and a dense region (one 1-D tensor of the compute dtype,
//! viewed with `narrow` + `reshape`). Filling a slot writes both regions in place; nothing the
//! size of a weight is allocated after start.

use std::sync::Arc;

use candle_core::quantized::{QStorage, QTensor};
use candle_core::{CpuStorage, DType, Device, InplaceOp1, Layout, Tensor};

use super::assemble::{dense_region_view, layer_weights, SlotTensors};
use super::error::OffloadError;
use super::host::{HostLayer, LayerLayout, Result, TensorEntry, TensorKind};
use super::qview::{arena_linear, BlockArena, SlotBlocks};
use ferry_model::weights::{LayerWeights, Linear};

/// The buffers of one slot.
#[derive(Debug)]
pub struct SlotBuffers {
    blocks: Arc<BlockArena>,
    dense: Tensor,
    dense_dtype: DType,
}

impl SlotBuffers {
    /// Allocates a slot with `blocks_len` bytes of block region and `dense_len` bytes of dense
    /// region in `dtype` on `device` (the CPU; the CUDA slot is its own type).
    pub fn new(blocks_len: usize, dense_len: usize, dtype: DType, device: &Device) -> Result<Self> {
        if !device.is_cpu() {
            return Err(OffloadError::Weights(
                "streaming offloaded layers is implemented for the CPU device only".into(),
            ));
        }
        let elems = dense_len / dtype.size_in_bytes();
        Ok(Self {
            blocks: BlockArena::new(blocks_len),
            dense: Tensor::zeros(elems, dtype, device)?,
            dense_dtype: dtype,
        })
    }

    /// The block region `blocks` with an empty dense region of `dtype`: the CPU view of a
    /// host slab held in one buffer (on CUDA pinned memory) that has no dense tensor, so its
    /// matrices are computed where they lie ([`super::host::HostLayer::views`]).
    pub fn over_blocks(blocks: Arc<BlockArena>, dtype: DType) -> Result<Self> {
        Ok(Self {
            blocks,
            dense: Tensor::zeros(0, dtype, &Device::Cpu)?,
            dense_dtype: dtype,
        })
    }

    /// Bytes this slot holds on the device.
    pub fn allocated_bytes(&self) -> u64 {
        (self.blocks.len() + self.dense.elem_count() * self.dense_dtype.size_in_bytes()) as u64
    }

    /// Copies `layer`'s slab into the slot (two memcpys) and returns the bytes copied.
    pub fn fill(&self, layer: &HostLayer) -> Result<u64> {
        if let Some(src) = layer.cpu_slab() {
            return self.copy_from(src, layer.layout());
        }
        {
            let mut blocks = self.blocks.write();
            let src = layer.blocks()?;
            let dst = blocks.as_bytes_mut().get_mut(..src.len()).ok_or_else(|| {
                OffloadError::Weights(format!("layer {} does not fit its slot", layer.index))
            })?;
            dst.copy_from_slice(src);
        }
        self.dense.inplace_op1(&FillDense {
            src: layer.dense()?,
            at: 0,
        })?;
        Ok((layer.blocks_len + layer.dense_len) as u64)
    }

    /// Writes `bytes` into the block region at byte `offset` (filling a host slab in CPU
    /// memory, tensor by tensor).
    pub fn put_blocks(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        let mut blocks = self.blocks.write();
        let region = blocks.len();
        let dst = blocks
            .as_bytes_mut()
            .get_mut(offset..offset + bytes.len())
            .ok_or_else(|| {
                OffloadError::Weights(format!(
                    "{} bytes at {offset} overflow a block region of {region}",
                    bytes.len()
                ))
            })?;
        dst.copy_from_slice(bytes);
        Ok(())
    }

    /// Writes `bytes` (elements of the compute dtype) into the dense region at byte `offset`.
    pub fn put_dense(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.dense.inplace_op1(&FillDense {
            src: bytes,
            at: offset,
        })?;
        Ok(())
    }

    /// Copies the regions of `layout` from `src` (a slot of the same dtype that holds it) into
    /// this slot (two memcpys) and returns the bytes copied: an offloaded expert's host slab
    /// into an expert slot of the device pool.
    pub fn copy_from(&self, src: &SlotBuffers, layout: &LayerLayout) -> Result<u64> {
        let unfit = || {
            OffloadError::Weights(format!(
                "layer {}: {} + {} bytes do not fit the slot",
                layout.index, layout.blocks_len, layout.dense_len
            ))
        };
        if layout.blocks_len > 0 {
            let from = src.blocks.read();
            let mut to = self.blocks.write();
            let src_bytes = from.as_bytes().get(..layout.blocks_len).ok_or_else(unfit)?;
            let dst = to
                .as_bytes_mut()
                .get_mut(..layout.blocks_len)
                .ok_or_else(unfit)?;
            dst.copy_from_slice(src_bytes);
        }
        if layout.dense_len > 0 {
            if src.dense_dtype != self.dense_dtype {
                return Err(unfit());
            }
            let (storage, src_layout) = src.dense.storage_and_layout();
            let candle_core::Storage::Cpu(cpu) = &*storage else {
                return Err(unfit());
            };
            let start = src_layout.start_offset();
            let bytes: &[u8] = match cpu {
                CpuStorage::F32(v) => as_bytes(&v[start..]),
                CpuStorage::F16(v) => as_bytes(&v[start..]),
                CpuStorage::BF16(v) => as_bytes(&v[start..]),
                _ => return Err(unfit()),
            };
            let src_bytes = bytes.get(..layout.dense_len).ok_or_else(unfit)?;
            self.dense.inplace_op1(&FillDense {
                src: src_bytes,
                at: 0,
            })?;
        }
        Ok((layout.blocks_len + layout.dense_len) as u64)
    }

    /// The weights of `layer` as views into this slot (call after [`SlotBuffers::fill`]).
    pub fn views(&self, layer: &LayerLayout) -> Result<LayerWeights> {
        layer_weights(layer, self)
    }
}

impl SlotTensors for SlotBuffers {
    fn dense(&self, entry: &TensorEntry) -> Result<Tensor> {
        dense_region_view(&self.dense, self.dense_dtype, entry)
    }

    fn blocks(&self, entry: &TensorEntry) -> Result<Arc<QTensor>> {
        let TensorKind::Blocks(ty) = entry.kind else {
            return Err(OffloadError::Weights(format!(
                "`{}` is not quantized",
                entry.name
            )));
        };
        // candle's view needs candle's block type; ferry's own types (IQ4_NL, IQ4_XS, MXFP4)
        // come through `quantized` below instead.
        let dtype = ty.to_candle().ok_or_else(|| {
            OffloadError::Weights(format!("`{}`: candle has no {ty} blocks", entry.name))
        })?;
        let view = SlotBlocks::new(self.blocks.clone(), entry.offset, entry.len, dtype)?;
        Ok(Arc::new(QTensor::new(
            QStorage::Cpu(Box::new(view)),
            entry.shape.clone(),
        )?))
    }

    fn quantized(&self, entry: &TensorEntry, bias: Option<Tensor>) -> Result<Linear> {
        match entry.kind {
            TensorKind::Blocks(ty) if ty.to_candle().is_none() => Ok(arena_linear(
                &self.blocks,
                entry.offset,
                entry.len,
                ty,
                &entry.shape,
                bias,
            )?),
            _ => Ok(Linear::quantized(self.blocks(entry)?, bias)?),
        }
    }
}

/// Writes raw bytes of the compute dtype into a dense slot tensor at byte `at`, in place.
struct FillDense<'a> {
    src: &'a [u8],
    at: usize,
}

impl InplaceOp1 for FillDense<'_> {
    fn name(&self) -> &'static str {
        "ferry-fill-slot"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let start = layout.start_offset();
        let dst: &mut [u8] = match storage {
            CpuStorage::F32(v) => as_bytes_mut(&mut v[start..]),
            CpuStorage::F16(v) => as_bytes_mut(&mut v[start..]),
            CpuStorage::BF16(v) => as_bytes_mut(&mut v[start..]),
            _ => return Err(candle_core::Error::Msg("slot dtype is not a float".into())),
        };
        let dst = dst
            .get_mut(self.at..self.at + self.src.len())
            .ok_or_else(|| candle_core::Error::Msg("layer does not fit its slot".into()))?;
        dst.copy_from_slice(self.src);
        Ok(())
    }
}

fn as_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: floats have no padding; viewing their memory as bytes is always valid.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

fn as_bytes_mut<T: Copy>(v: &mut [T]) -> &mut [u8] {
    let n = std::mem::size_of_val(v);
    // SAFETY: floats have no invalid bit patterns and u8 has no alignment needs; access is unique.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, n) }
}
