//! [`GpuSlot`]: one slot of the streaming ring on a CUDA device, allocated once at start; the
//! CUDA twin of [`super::slot::SlotBuffers`].
//!
//! The slot mirrors a host slab (see [`super::host`]):
//!
//! - the dense region is one 1-D tensor of the compute dtype; dense weights are `narrow` +
//!   `reshape` views of it, and a fill is one copy of the slab's dense bytes;
//! - GGUF matrices cannot be views (candle's quantized CUDA storage owns its buffer), so the slot
//!   keeps one persistent quantized tensor per (part, GGML type, shape) the streamed layers use
//!   (one per part for a uniform model; a mixed-type file such as Q4_K_M adds a few), and a fill
//!   copies each matrix's raw GGUF bytes into its tensor's buffer.
//!
//! Fills are asynchronous copies on the [`CopyLink`]'s copy stream; the caller orders them with
//! the link's events. Nothing is allocated after [`GpuSlot::new`], which allocates exactly the
//! [`SlotLayout`] the plan counted (the union of the streamed layers' matrix buffers, with
//! candle's padding), so the device holds what the plan says. The device work goes through
//! [`ferry_gpu`]'s primitives, so this file is the same in every build: without the `cuda`
//! feature the constructor fails with [`ferry_gpu::GpuError::NotBuilt`].

use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Tensor};

use super::assemble::{dense_region_view, layer_weights, SlotTensors};
use super::error::OffloadError;
use super::host::{HostLayer, Result, TensorEntry, TensorKind, TENSOR_ALIGN};
use super::layout::{SlotKind, SlotLayout, SlotMatrix};
use ferry_gpu::{CopyLink, DeviceAddress, GpuError};
use ferry_model::weights::LayerWeights;

/// A persistent quantized matrix buffer of the slot: one [`SlotMatrix`] of the layout.
struct MatrixBuffer {
    layout: SlotMatrix,
    tensor: Arc<QTensor>,
    address: DeviceAddress,
}

/// The device buffers of one slot.
pub struct GpuSlot {
    dense: Tensor,
    dense_dtype: DType,
    dense_address: DeviceAddress,
    dense_len: usize,
    matrices: Vec<MatrixBuffer>,
    allocated: u64,
}

impl std::fmt::Debug for GpuSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSlot")
            .field("dense_len", &self.dense_len)
            .field("matrices", &self.matrices.len())
            .field("allocated", &self.allocated)
            .finish()
    }
}

impl GpuSlot {
    /// Allocates exactly `layout` (a [`SlotKind::Cuda`] layout, the plan's
    /// [`super::Plan::slot_layout`]) on `device`: a dense region of `layout.dense_bytes` in
    /// `dense_dtype` and one quantized buffer per [`SlotMatrix`], each as candle pads it.
    ///
    /// Nothing waits here: candle zeroes the buffers on the compute stream, so the caller makes
    /// the copy stream wait for it ([`CopyLink::copy_after_compute`]) once after allocating
    /// every slot, before the first fill.
    pub fn new(device: &Device, layout: &SlotLayout, dense_dtype: DType) -> Result<Self> {
        if layout.kind != SlotKind::Cuda {
            return Err(GpuError::Layout(format!(
                "a CUDA slot needs a cuda slot layout, got {}",
                layout.kind.as_str()
            ))
            .into());
        }
        let size = dense_dtype.size_in_bytes();
        let elems = layout.dense_bytes.div_ceil(size).max(1);
        let (dense, dense_address) = ferry_gpu::dense_zeros(device, elems, dense_dtype)?;
        // Entries sit at multiples of TENSOR_ALIGN inside the region; with the region's start
        // aligned too, every dense view is, as cuBLAS wants it (and as resident tensors are).
        check_aligned(dense_address)?;
        let matrices = layout
            .matrices
            .iter()
            .map(|m| {
                let (tensor, address) = ferry_gpu::quantized_zeros(device, &m.shape, m.dtype)?;
                Ok(MatrixBuffer {
                    layout: m.clone(),
                    tensor: Arc::new(tensor),
                    address,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let allocated =
            (elems * size + layout.matrices.iter().map(|m| m.allocated).sum::<usize>()) as u64;
        Ok(Self {
            dense,
            dense_dtype,
            dense_address,
            dense_len: elems * size,
            matrices,
            allocated,
        })
    }

    /// Bytes this slot holds on the device: its layout's [`SlotLayout::total_bytes`], the
    /// figure the plan counts (candle's row padding included).
    pub fn allocated_bytes(&self) -> u64 {
        self.allocated
    }

    /// Queues the copies of `layer`'s slab into this slot on `link`'s copy stream and returns
    /// the bytes queued. The slab must stay alive until the copy stream passes them.
    pub fn enqueue_fill(&self, link: &CopyLink, layer: &HostLayer) -> Result<u64> {
        let mut bytes = 0u64;
        for entry in &layer.entries {
            if !matches!(entry.kind, TensorKind::Blocks(_)) {
                continue;
            }
            let m = find(&self.matrices, entry).ok_or_else(|| unfit(layer, entry))?;
            let src = layer
                .blocks()?
                .get(entry.offset..entry.offset + entry.len)
                .filter(|_| entry.len <= m.layout.bytes)
                .ok_or_else(|| unfit(layer, entry))?;
            // SAFETY: `m.address` addresses a live buffer of at least `m.layout.bytes` bytes
            // owned by this slot; `src` lives in a host slab kept alive (and unmodified) while copies are in
            // flight.
            unsafe { link.copy_to_device(m.address, src) }?;
            bytes += src.len() as u64;
        }
        let dense = layer.dense()?;
        if dense.len() > self.dense_len {
            return Err(GpuError::Layout(format!(
                "layer {}'s dense tensors ({} bytes) exceed the slot ({} bytes)",
                layer.index,
                dense.len(),
                self.dense_len
            ))
            .into());
        }
        // SAFETY: as above; the dense buffer holds at least `self.dense_len` bytes.
        unsafe { link.copy_to_device(self.dense_address, dense) }?;
        bytes += dense.len() as u64;
        Ok(bytes)
    }

    /// The weights of `layer` as the tensors of this slot (valid once its fill has landed, which
    /// the compute stream learns from the link's *loaded* event).
    pub fn views(&self, layer: &HostLayer) -> Result<LayerWeights> {
        layer_weights(layer, self)
    }
}

impl SlotTensors for GpuSlot {
    fn dense(&self, entry: &TensorEntry) -> Result<Tensor> {
        dense_region_view(&self.dense, self.dense_dtype, entry)
    }

    fn blocks(&self, entry: &TensorEntry) -> Result<Arc<QTensor>> {
        find(&self.matrices, entry)
            .map(|m| m.tensor.clone())
            .ok_or_else(|| OffloadError::Gpu(unfit_entry(entry)))
    }
}

fn find<'a>(matrices: &'a [MatrixBuffer], entry: &TensorEntry) -> Option<&'a MatrixBuffer> {
    let dtype = super::layout::candle_blocks(entry)?;
    matrices.iter().find(|m| {
        m.layout.part == entry.part
            && m.layout.unit == entry.unit
            && m.layout.dtype == dtype
            && m.layout.shape == entry.shape
    })
}

/// A dense region must start at a multiple of [`TENSOR_ALIGN`] (the driver's allocations do).
fn check_aligned(address: DeviceAddress) -> Result<()> {
    if !address.is_multiple_of(TENSOR_ALIGN as DeviceAddress) {
        return Err(GpuError::Layout(format!(
            "the slot's dense region starts at {address:#x}, not a multiple of {TENSOR_ALIGN} bytes"
        ))
        .into());
    }
    Ok(())
}

fn unfit(layer: &HostLayer, entry: &TensorEntry) -> OffloadError {
    GpuError::Layout(format!("layer {}: {}", layer.index, unfit_entry(entry))).into()
}

fn unfit_entry(entry: &TensorEntry) -> GpuError {
    GpuError::Layout(format!(
        "`{}` ({:?}, shape {:?}) has no buffer in this slot",
        entry.name, entry.kind, entry.shape
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn without_cuda_a_slot_cannot_be_made() {
        let layout = SlotLayout::new(SlotKind::Cuda);
        let err = GpuSlot::new(&Device::Cpu, &layout, DType::F32).expect_err("no CUDA");
        assert!(
            matches!(err, OffloadError::Gpu(GpuError::NotBuilt)),
            "{err}"
        );
    }

    #[test]
    fn a_cuda_slot_refuses_a_cpu_layout() {
        let layout = SlotLayout::new(SlotKind::Cpu);
        let err = GpuSlot::new(&Device::Cpu, &layout, DType::F32).expect_err("cpu layout");
        assert!(err.to_string().contains("cuda slot layout"), "{err}");
    }

    #[test]
    fn dense_regions_must_start_256_byte_aligned() {
        assert!(check_aligned(0x7f00_0000_0000).is_ok());
        assert!(check_aligned(0x7f00_0000_0100).is_ok());
        let err = check_aligned(0x7f00_0000_0008).expect_err("8-byte aligned only");
        assert!(err.to_string().contains("multiple of 256"), "{err}");
    }
}
