//! Device memory for the offload engine's slots: zero-filled dense and quantized buffers of
//! candle's own types (so the forward loop computes on them as on any tensor) together with
//! their raw device addresses (so the copy stream can write into them). The zeroing is queued on
//! the compute stream: copies into these buffers must wait for it
//! ([`crate::CopyLink::copy_after_compute`]).

use candle_core::cuda_backend::cudarc::driver::DevicePtr;
use candle_core::quantized::cuda::QCudaStorage;
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{CudaDevice, DType, Device, Storage, Tensor};

use super::cuda_device;
use crate::{DeviceAddress, GpuError, Result};

/// A 1-D zero tensor of `elems` elements of the float type `dtype` on `device`, and the device
/// address of its first element. The zeroing is queued on the compute stream.
pub fn dense_zeros(device: &Device, elems: usize, dtype: DType) -> Result<(Tensor, DeviceAddress)> {
    let dev = cuda_device(device)?;
    let tensor = Tensor::zeros(elems, dtype, device)?;
    let address = dense_address(&tensor, dev)?;
    Ok((tensor, address))
}

/// A zero quantized matrix of `shape` in `dtype` on `device` (candle's storage, with its row
/// padding), and the device address of its first block. The zeroing is queued on the compute
/// stream.
pub fn quantized_zeros(
    device: &Device,
    shape: &[usize],
    dtype: GgmlDType,
) -> Result<(QTensor, DeviceAddress)> {
    let dev = cuda_device(device)?;
    let elems: usize = shape.iter().product();
    let storage = QCudaStorage::zeros(dev, elems, dtype)?;
    let address = storage.device_ptr()? as DeviceAddress;
    let tensor = QTensor::new(QStorage::Cuda(storage), shape.to_vec())?;
    Ok((tensor, address))
}

/// The device address of a contiguous float tensor's first element.
fn dense_address(t: &Tensor, dev: &CudaDevice) -> Result<DeviceAddress> {
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
    Ok(base + (layout.start_offset() * t.dtype().size_in_bytes()) as DeviceAddress)
}
