//! Finding and opening CUDA devices, and asking the driver how much memory is free.
//!
//! candle links cudarc with `dynamic-linking`: a CUDA build does not start without libcuda.so.1,
//! cuBLAS 13, cudart 13 and curand on the library path (README, "CUDA"). With the libraries
//! present but no usable GPU (no device, a driver too old), the driver's errors, and any panic
//! while opening a device, become [`GpuError::Driver`] so the caller can report it.

use std::panic::{catch_unwind, AssertUnwindSafe};

use candle_core::cuda_backend::cudarc::driver::CudaContext;
use candle_core::Device;

use super::cuda_device;
use crate::{GpuError, MemoryInfo, Result};

/// Number of CUDA devices the driver sees (0 without a driver or on any error).
pub fn device_count() -> usize {
    catch_unwind(CudaContext::device_count)
        .ok()
        .and_then(|r| r.ok())
        .map_or(0, |n| n.max(0) as usize)
}

/// Opens CUDA device `ordinal` with a compute stream of its own (not the legacy default stream,
/// so the copy stream can overlap it).
pub fn open(ordinal: usize) -> Result<Device> {
    let count = device_count();
    if ordinal >= count {
        return Err(GpuError::Driver(format!(
            "cuda:{ordinal} does not exist: the driver sees {count} device(s)"
        )));
    }
    match catch_unwind(AssertUnwindSafe(|| Device::new_cuda_with_stream(ordinal))) {
        Ok(Ok(device)) => {
            untracked(&device)?;
            Ok(device)
        }
        Ok(Err(err)) => Err(GpuError::Candle(err)),
        Err(panic) => Err(GpuError::Driver(format!(
            "opening cuda:{ordinal} failed: {} (are cuBLAS 13 and cudart 13 on the library path?)",
            panic_text(&panic)
        ))),
    }
}

/// Turns cudarc's per-buffer event tracking off for `device`'s context, right after opening it
/// and before ferry allocates any buffer (tracking applies to buffers allocated while it is on).
///
/// With tracking on (the default for a context whose compute stream comes from `new_stream`, as
/// `new_cuda_with_stream` makes it), cudarc records an event for every read and write of every
/// buffer and makes each kernel launch wait on the events of its arguments: one wait and one
/// record per kernel argument, for ordering that ferry does not need. Every candle tensor lives
/// on the one compute stream, whose order already serialises them; the only other stream is the
/// offload engine's copy stream, whose raw copies cudarc never sees anyway and which ferry
/// orders itself with explicit events (`CopyLink`: *loaded* / *consumed*), waiting for the
/// compute stream before copying into new buffers and draining the copy stream before any
/// buffer it writes is freed.
fn untracked(device: &Device) -> Result<()> {
    let dev = cuda_device(device)?;
    // SAFETY: the conditions above: buffers are used on the compute stream only, except the
    // slots and slabs the copy stream touches, which the offload engine orders explicitly.
    unsafe { dev.disable_event_tracking() };
    Ok(())
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
