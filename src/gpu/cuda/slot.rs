//! [`GpuSlot`]: one slot of the streaming ring on a CUDA device, allocated once at start.
//!
//! The slot mirrors a host slab (see [`crate::offload::host`]):
//!
//! - the dense region is one 1-D tensor of the compute dtype; dense weights are `narrow` +
//!   `reshape` views of it, and a fill is one copy of the slab's dense bytes;
//! - GGUF matrices cannot be views (candle's quantized CUDA storage owns its buffer), so the slot
//!   keeps one persistent quantized tensor per (part, GGML type, shape) the streamed layers use
//!   (one per part for a uniform model; a mixed-type file such as Q4_K_M adds a few), and a fill
//!   copies each matrix's raw GGUF bytes into its tensor's buffer.
//!
//! Fills are asynchronous copies on the [`CopyLink`]'s copy stream; the caller orders them with
//! the link's events. Nothing is allocated after [`GpuSlot::new`].

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{result, sys, DevicePtr};
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{CudaDevice, DType, Device, Storage, Tensor};

use super::{cuda_device, CopyLink};
use crate::gpu::{GpuError, Result};
use crate::model::weights::LayerWeights;
use crate::offload::assemble::{dense_region_view, layer_weights, SlotTensors};
use crate::offload::host::{HostLayer, TensorEntry, TensorKind};
use crate::offload::host::{Part, Result as OffloadResult};
use crate::offload::OffloadError;

/// A persistent quantized matrix buffer of the slot.
struct SlotMatrix {
    part: Part,
    dtype: GgmlDType,
    shape: Vec<usize>,
    tensor: Arc<QTensor>,
    ptr: sys::CUdeviceptr,
    len: usize,
}

/// The device buffers of one slot.
pub struct GpuSlot {
    device: CudaDevice,
    dense: Tensor,
    dense_dtype: DType,
    dense_ptr: sys::CUdeviceptr,
    dense_len: usize,
    matrices: Vec<SlotMatrix>,
}

// SAFETY: the raw device pointers are addresses inside buffers owned by `dense` and the matrices'
// tensors, which are themselves Send + Sync; they are only used to queue copies.
unsafe impl Send for GpuSlot {}
// SAFETY: as above.
unsafe impl Sync for GpuSlot {}

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
        let dev = cuda_device(device)?.clone();
        let size = dense_dtype.size_in_bytes();
        let dense_len = layers.iter().map(|l| l.dense_len).max().unwrap_or(0);
        let dense = Tensor::zeros(dense_len.div_ceil(size).max(1), dense_dtype, device)?;
        let dense_ptr = dense_pointer(&dense, &dev)?;
        let mut matrices: Vec<SlotMatrix> = Vec::new();
        for entry in layers.iter().flat_map(|l| l.entries.iter()) {
            let TensorKind::Blocks(dtype) = entry.kind else {
                continue;
            };
            if find(&matrices, entry).is_some() {
                continue;
            }
            let elems: usize = entry.shape.iter().product();
            let storage = candle_core::quantized::cuda::QCudaStorage::zeros(&dev, elems, dtype)?;
            let ptr = storage.device_ptr()? as sys::CUdeviceptr;
            let tensor = QTensor::new(QStorage::Cuda(storage), entry.shape.clone())?;
            matrices.push(SlotMatrix {
                part: entry.part,
                dtype,
                shape: entry.shape.clone(),
                tensor: Arc::new(tensor),
                ptr,
                len: entry.len,
            });
        }
        // The zeroing above was queued on the compute stream; copies on the copy stream must not
        // overtake it.
        dev.cuda_stream().synchronize()?;
        Ok(Self {
            device: dev,
            dense,
            dense_dtype,
            dense_ptr,
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
        let stream = link.copy_stream();
        stream.context().bind_to_thread()?;
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
            // SAFETY: `m.ptr` addresses a live buffer of at least `m.len` bytes; `src` lives in a
            // host slab kept alive (and unmodified) while copies are in flight.
            unsafe { result::memcpy_htod_async(m.ptr, src, stream.cu_stream()) }?;
            bytes += src.len() as u64;
        }
        let dense = layer.dense();
        if dense.len() > self.dense_len {
            return Err(GpuError::Layout(format!(
                "layer {}'s dense tensors ({} bytes) exceed the slot ({} bytes)",
                layer.index,
                dense.len(),
                self.dense_len
            )));
        }
        if !dense.is_empty() {
            // SAFETY: as above; the dense buffer holds at least `self.dense_len` bytes.
            unsafe { result::memcpy_htod_async(self.dense_ptr, dense, stream.cu_stream()) }?;
            bytes += dense.len() as u64;
        }
        Ok(bytes)
    }

    /// The weights of `layer` as the tensors of this slot (valid once its fill has landed, which
    /// the compute stream learns from the link's *loaded* event).
    pub fn views(&self, layer: &HostLayer) -> OffloadResult<LayerWeights> {
        layer_weights(layer, self)
    }

    /// The CUDA device the slot lives on.
    pub fn device(&self) -> Device {
        Device::Cuda(self.device.clone())
    }
}

impl SlotTensors for GpuSlot {
    fn dense(&self, entry: &TensorEntry) -> OffloadResult<Tensor> {
        dense_region_view(&self.dense, self.dense_dtype, entry)
    }

    fn blocks(&self, entry: &TensorEntry) -> OffloadResult<Arc<QTensor>> {
        find(&self.matrices, entry)
            .map(|m| m.tensor.clone())
            .ok_or_else(|| OffloadError::Gpu(unfit_entry(entry)))
    }
}

fn find<'a>(matrices: &'a [SlotMatrix], entry: &TensorEntry) -> Option<&'a SlotMatrix> {
    let TensorKind::Blocks(dtype) = entry.kind else {
        return None;
    };
    matrices
        .iter()
        .find(|m| m.part == entry.part && m.dtype == dtype && m.shape == entry.shape)
}

fn unfit(layer: &HostLayer, entry: &TensorEntry) -> GpuError {
    GpuError::Layout(format!("layer {}: {}", layer.index, unfit_entry(entry)))
}

fn unfit_entry(entry: &TensorEntry) -> GpuError {
    GpuError::Layout(format!(
        "`{}` ({:?}, shape {:?}) has no buffer in this slot",
        entry.name, entry.kind, entry.shape
    ))
}

/// The device address of a contiguous float tensor's first element.
fn dense_pointer(t: &Tensor, dev: &CudaDevice) -> Result<sys::CUdeviceptr> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else {
        return Err(GpuError::NotCuda("cpu"));
    };
    let stream = dev.cuda_stream();
    let base = match t.dtype() {
        DType::F32 => cuda.as_cuda_slice::<f32>()?.device_ptr(&stream).0,
        DType::F16 => cuda.as_cuda_slice::<half::f16>()?.device_ptr(&stream).0,
        DType::BF16 => cuda.as_cuda_slice::<half::bf16>()?.device_ptr(&stream).0,
        other => {
            return Err(GpuError::Layout(format!(
                "dense slot dtype {other:?} is not a float type"
            )))
        }
    };
    Ok(base + (layout.start_offset() * t.dtype().size_in_bytes()) as sys::CUdeviceptr)
}
