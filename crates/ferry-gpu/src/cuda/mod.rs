//! The real CUDA backend of [`crate`] (feature `cuda`): candle's CUDA device plus cudarc for
//! what candle does not expose (a second stream, events, pinned memory, raw asynchronous copies).

mod device;
mod link;
mod memory;
mod pinned;

pub use device::{device_count, memory_info, open};
pub use link::CopyLink;
pub use memory::{dense_zeros, quantized_zeros};
pub use pinned::PinnedBytes;

use candle_core::cuda_backend::cudarc::driver::DriverError;
use candle_core::{CudaDevice, Device};

use super::GpuError;

impl From<DriverError> for GpuError {
    fn from(err: DriverError) -> Self {
        GpuError::Driver(format!("{err:?}"))
    }
}

/// The candle CUDA device behind `device`.
fn cuda_device(device: &Device) -> Result<&CudaDevice, GpuError> {
    match device {
        Device::Cuda(dev) => Ok(dev),
        Device::Cpu => Err(GpuError::NotCuda("cpu")),
        Device::Metal(_) => Err(GpuError::NotCuda("metal")),
    }
}
