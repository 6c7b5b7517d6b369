//! Finding and opening CUDA devices, and asking the driver how much memory is free.
//!
//! cudarc loads libcuda, cuBLAS and friends at run time and panics when one is missing; every
//! entry point here checks for the driver library first and turns a panic while opening a device
//! into an error, so a CUDA build on a machine without a GPU reports "no device" and goes on.

use std::panic::{catch_unwind, AssertUnwindSafe};

use candle_core::cuda_backend::cudarc::driver::{sys, CudaContext};
use candle_core::Device;

use super::cuda_device;
use crate::gpu::{GpuError, MemoryInfo, Result};

/// Whether the driver library (libcuda.so.1) can be loaded.
fn driver_present() -> bool {
    // SAFETY: only tries to open the shared library; no driver call is made.
    catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

/// Number of CUDA devices the driver sees (0 without a driver or on any error).
pub fn device_count() -> usize {
    if !driver_present() {
        return 0;
    }
    catch_unwind(CudaContext::device_count)
        .ok()
        .and_then(|r| r.ok())
        .map_or(0, |n| n.max(0) as usize)
}

/// Opens CUDA device `ordinal` with a compute stream of its own (not the legacy default stream,
/// so the copy stream can overlap it).
pub fn open(ordinal: usize) -> Result<Device> {
    if !driver_present() {
        return Err(GpuError::Driver(
            "libcuda.so.1 (the NVIDIA driver) was not found; is this a GPU machine?".into(),
        ));
    }
    let count = device_count();
    if ordinal >= count {
        return Err(GpuError::Driver(format!(
            "cuda:{ordinal} does not exist: the driver sees {count} device(s)"
        )));
    }
    match catch_unwind(AssertUnwindSafe(|| Device::new_cuda_with_stream(ordinal))) {
        Ok(Ok(device)) => Ok(device),
        Ok(Err(err)) => Err(GpuError::Candle(err)),
        Err(panic) => Err(GpuError::Driver(format!(
            "opening cuda:{ordinal} failed: {} (are cuBLAS 13 and cudart 13 on the library path?)",
            panic_text(&panic)
        ))),
    }
}

/// Free and total memory of `device`'s card, from the driver.
pub fn memory_info(device: &Device) -> Result<MemoryInfo> {
    let dev = cuda_device(device)?;
    let (free, total) = dev.cuda_stream().context().mem_get_info()?;
    Ok(MemoryInfo {
        free: free as u64,
        total: total as u64,
    })
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}
