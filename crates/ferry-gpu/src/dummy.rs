//! [`crate`] in a build without the `cuda` feature: the same items, and every constructor
//! returns [`GpuError::NotBuilt`]. The types cannot be constructed, so their methods are never
//! reached; they exist so that callers compile without `cfg`.

use std::convert::Infallible;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};

use super::{DeviceAddress, GpuError, MemoryInfo, Result};

/// No CUDA devices in this build.
pub fn device_count() -> usize {
    0
}

/// Always [`GpuError::NotBuilt`].
pub fn open(ordinal: usize) -> Result<Device> {
    let _ = ordinal;
    Err(GpuError::NotBuilt)
}

/// Always [`GpuError::NotBuilt`].
pub fn memory_info(device: &Device) -> Result<MemoryInfo> {
    let _ = device;
    Err(GpuError::NotBuilt)
}

/// Always [`GpuError::NotBuilt`].
pub fn dense_zeros(device: &Device, elems: usize, dtype: DType) -> Result<(Tensor, DeviceAddress)> {
    let _ = (device, elems, dtype);
    Err(GpuError::NotBuilt)
}

/// Always [`GpuError::NotBuilt`].
pub fn quantized_zeros(
    device: &Device,
    shape: &[usize],
    dtype: GgmlDType,
) -> Result<(QTensor, DeviceAddress)> {
    let _ = (device, shape, dtype);
    Err(GpuError::NotBuilt)
}

/// Page-locked host memory (not available in this build).
#[derive(Debug)]
pub struct PinnedBytes {
    never: Infallible,
}

impl PinnedBytes {
    /// Always [`GpuError::NotBuilt`].
    ///
    /// # Safety
    ///
    /// As for the CUDA build's `PinnedBytes::uninit` (nothing is allocated here).
    pub unsafe fn uninit(device: &Device, len: usize) -> Result<Self> {
        let _ = (device, len);
        Err(GpuError::NotBuilt)
    }

    /// The start of the buffer, for writing.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        match self.never {}
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self.never {}
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        match self.never {}
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self.never {}
    }

    /// The bytes, mutably.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        match self.never {}
    }
}

/// The copy stream and slot events (not available in this build).
#[derive(Debug)]
pub struct CopyLink {
    never: Infallible,
}

impl CopyLink {
    /// Always [`GpuError::NotBuilt`].
    pub fn new(device: &Device, slots: usize) -> Result<Self> {
        let _ = (device, slots);
        Err(GpuError::NotBuilt)
    }

    /// Copies wait for the compute stream to release `slot`.
    pub fn copy_after_consumed(&self, _slot: usize) -> Result<()> {
        match self.never {}
    }

    /// Marks the end of the copies into `slot`.
    pub fn mark_loaded(&self, _slot: usize) -> Result<()> {
        match self.never {}
    }

    /// Kernels wait for `slot`'s copies.
    pub fn compute_after_loaded(&self, _slot: usize) -> Result<()> {
        match self.never {}
    }

    /// Marks the end of the kernels reading `slot`.
    pub fn mark_consumed(&self, _slot: usize) -> Result<()> {
        match self.never {}
    }

    /// Copies wait for the compute stream's work so far.
    pub fn copy_after_compute(&self) -> Result<()> {
        match self.never {}
    }

    /// Waits for every queued copy.
    pub fn synchronize(&self) -> Result<()> {
        match self.never {}
    }

    /// Queues a raw copy to the device.
    ///
    /// # Safety
    ///
    /// As for the CUDA build's `CopyLink::copy_to_device` (never reached: no value exists).
    pub unsafe fn copy_to_device(&self, _dst: DeviceAddress, _src: &[u8]) -> Result<()> {
        match self.never {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_constructor_says_cuda_is_not_built() {
        assert_eq!(device_count(), 0);
        let err = open(0).expect_err("no CUDA");
        assert!(err.to_string().contains("--features cuda"), "{err}");
        assert!(matches!(memory_info(&Device::Cpu), Err(GpuError::NotBuilt)));
        // SAFETY: nothing is allocated (and so nothing read) in this build.
        assert!(unsafe { PinnedBytes::uninit(&Device::Cpu, 8) }.is_err());
        assert!(CopyLink::new(&Device::Cpu, 2).is_err());
        assert!(dense_zeros(&Device::Cpu, 8, DType::F32).is_err());
        assert!(quantized_zeros(&Device::Cpu, &[32], GgmlDType::Q8_0).is_err());
    }
}
