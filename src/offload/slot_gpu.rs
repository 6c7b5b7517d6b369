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
//! the link's events. Nothing is allocated after [`GpuSlot::new`]. The device work goes through
//! [`crate::gpu`]'s primitives, so this file is the same in every build: without the `cuda`
//! feature the constructor fails with [`crate::gpu::GpuError::NotBuilt`].

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use super::assemble::{dense_region_view, layer_weights, SlotTensors};
use super::error::OffloadError;
use super::host::{HostLayer, Part, Result, TensorEntry, TensorKind};
use crate::gpu::{self, CopyLink, DeviceAddress, GpuError};
use crate::model::weights::LayerWeights;

/// A persistent quantized matrix buffer of the slot.
struct SlotMatrix {
    part: Part,
    unit: usize,
    dtype: GgmlDType,
    shape: Vec<usize>,
    tensor: Arc<QTensor>,
    address: DeviceAddress,
    len: usize,
}

/// The device buffers of one slot.
pub struct GpuSlot {
    device: Device,
    dense: Tensor,
    dense_dtype: DType,
    dense_address: DeviceAddress,
    dense_len: usize,
    matrices: Vec<SlotMatrix>,
}

impl std::fmt::Debug for GpuSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuSlot")
            .field("dense_len", &self.dense_len)
            .field("matrices", &self.matrices.len())
            .finish()
    }
}

impl GpuSlot {
    /// Allocates a slot on `device` that can hold any of `layers` (dense tensors in
    /// `dense_dtype`), and waits until the allocations are initialised.
    pub fn new(device: &Device, layers: &[&HostLayer], dense_dtype: DType) -> Result<Self> {
        let size = dense_dtype.size_in_bytes();
        let dense_len = layers.iter().map(|l| l.dense_len).max().unwrap_or(0);
        let (dense, dense_address) =
            gpu::dense_zeros(device, dense_len.div_ceil(size).max(1), dense_dtype)?;
        let mut matrices: Vec<SlotMatrix> = Vec::new();
        for entry in layers.iter().flat_map(|l| l.entries.iter()) {
            let TensorKind::Blocks(dtype) = entry.kind else {
                continue;
            };
            if find(&matrices, entry).is_some() {
                continue;
            }
            let (tensor, address) = gpu::quantized_zeros(device, &entry.shape, dtype)?;
            matrices.push(SlotMatrix {
                part: entry.part,
                unit: entry.unit,
                dtype,
                shape: entry.shape.clone(),
                tensor: Arc::new(tensor),
                address,
                len: entry.len,
            });
        }
        // The zeroing above was queued on the compute stream; copies on the copy stream must not
        // overtake it.
        gpu::synchronize(device)?;
        Ok(Self {
            device: device.clone(),
            dense,
            dense_dtype,
            dense_address,
            dense_len,
            matrices,
        })
    }

    /// Bytes this slot holds on the device.
    pub fn allocated_bytes(&self) -> u64 {
        let dense = self.dense.elem_count() * self.dense_dtype.size_in_bytes();
        let blocks: usize = self
            .matrices
            .iter()
            .map(|m| m.tensor.storage_size_in_bytes())
            .sum();
        (dense + blocks) as u64
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
                .blocks()
                .get(entry.offset..entry.offset + entry.len)
                .filter(|_| entry.len <= m.len)
                .ok_or_else(|| unfit(layer, entry))?;
            // SAFETY: `m.address` addresses a live buffer of at least `m.len` bytes owned by this
            // slot; `src` lives in a host slab kept alive (and unmodified) while copies are in
            // flight.
            unsafe { link.copy_to_device(m.address, src) }?;
            bytes += src.len() as u64;
        }
        let dense = layer.dense();
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

    /// The CUDA device the slot lives on.
    pub fn device(&self) -> Device {
        self.device.clone()
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

fn find<'a>(matrices: &'a [SlotMatrix], entry: &TensorEntry) -> Option<&'a SlotMatrix> {
    let TensorKind::Blocks(dtype) = entry.kind else {
        return None;
    };
    matrices.iter().find(|m| {
        m.part == entry.part && m.unit == entry.unit && m.dtype == dtype && m.shape == entry.shape
    })
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

#[cfg(all(test, not(feature = "cuda")))]
mod tests {
    use super::*;

    #[test]
    fn without_cuda_a_slot_cannot_be_made() {
        let err = GpuSlot::new(&Device::Cpu, &[], DType::F32).expect_err("no CUDA");
        assert!(
            matches!(err, OffloadError::Gpu(GpuError::NotBuilt)),
            "{err}"
        );
    }
}
