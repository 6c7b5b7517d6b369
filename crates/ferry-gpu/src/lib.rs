//! # ferry-gpu
//!
//! The bottom layer of ferry's CUDA side (docs/ARCHITECTURE.md, "Crates"): primitives over
//! candle's CUDA backend and cudarc, in every build. It depends on no other ferry crate and may
//! know nothing of layers, slabs, models or plans: the offload engine (`ferry-offload`) builds
//! its host slabs and device slots from these. Build it with the `cuda` feature for the real
//! backend (the CUDA 13 toolchain, README "CUDA"); without it every constructor answers
//! [`GpuError::NotBuilt`], so code above compiles and runs on CPU-only machines unchanged.
//!
//! The CUDA side of ferry, behind one API that exists in every build.
//!
//! With the `cuda` cargo feature this module talks to the driver through candle's CUDA backend
//! and cudarc ([`cuda`]); without it the same items come from [`dummy`], whose constructors
//! return [`GpuError::NotBuilt`] (candle's `dummy_cuda_backend` pattern). The crates above
//! call `ferry_gpu::*` and need no `cfg` of their own.
//!
//! What lives here (primitives only: nothing here knows layers, slabs or models; the offload
//! engine builds its host slabs and device slots from these, in `offload/slot_gpu.rs`):
//!
//! - devices: [`device_count`], [`open`] (the compute device on a stream of its own, as
//!   `Device::new_cuda_with_stream` makes it), [`memory_info`] (the driver's free/total bytes);
//! - driver memory: [`dense_zeros`] and [`quantized_zeros`], device buffers of candle's types
//!   with their raw [`DeviceAddress`];
//! - [`PinnedBytes`]: page-locked host memory, the storage of the offload engine's host slabs on
//!   CUDA, so copies to the device are true DMA transfers that overlap compute;
//! - [`CopyLink`]: the copy stream beside candle's compute stream, one *loaded* and one
//!   *consumed* event per slot (DESIGN.md 4.3), and raw asynchronous host-to-device copies on it.
//!
//! [`is_out_of_memory`] tells a CUDA out-of-memory error apart from other failures, so the
//! server can answer 503 and live on.

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub use cuda::*;

#[cfg(not(feature = "cuda"))]
mod dummy;
#[cfg(not(feature = "cuda"))]
pub use dummy::*;

use thiserror::Error;

/// A raw device address (the driver's `CUdeviceptr`), the destination of a raw copy.
pub type DeviceAddress = u64;

/// Whether this binary was built with the `cuda` feature.
pub const BUILT_WITH_CUDA: bool = cfg!(feature = "cuda");

/// Result alias for GPU operations.
pub type Result<T> = std::result::Result<T, GpuError>;

/// Failures of the CUDA layer.
#[derive(Debug, Error)]
pub enum GpuError {
    /// This binary has no CUDA backend.
    #[error(
        "this ferry was built without CUDA support; rebuild with `--features cuda` \
         (see README: scripts/build-cuda.sh) or use --device cpu"
    )]
    NotBuilt,
    /// The driver reported an error (no device, out of memory, ...).
    #[error("CUDA driver: {0}")]
    Driver(String),
    /// A candle operation on the device failed.
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
    /// The tensors of a layer do not fit the slot built for them.
    #[error("slot layout: {0}")]
    Layout(String),
    /// The operation needs a CUDA device and got another one.
    #[error("expected a CUDA device, got {0}")]
    NotCuda(&'static str),
}

/// Device memory as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Bytes free right now.
    pub free: u64,
    /// Bytes on the card.
    pub total: u64,
}

impl MemoryInfo {
    /// Bytes in use (by this process and every other one).
    pub fn used(&self) -> u64 {
        self.total.saturating_sub(self.free)
    }
}

/// Whether `message` (an error rendered with `Display` or `Debug`) is a CUDA out-of-memory
/// error. candle and cudarc wrap the driver's `CUDA_ERROR_OUT_OF_MEMORY` (and cuBLAS its
/// `CUBLAS_STATUS_ALLOC_FAILED`) in strings, so the text is what survives every layer.
pub fn is_out_of_memory(message: &str) -> bool {
    const MARKERS: [&str; 4] = [
        "CUDA_ERROR_OUT_OF_MEMORY",
        "CUBLAS_STATUS_ALLOC_FAILED",
        "out of memory",
        "OutOfMemory",
    ];
    MARKERS.iter().any(|m| message.contains(m))
}

/// A short name for a device: "cpu", "cuda:0".
pub fn describe(device: &candle_core::Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".to_string(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_memory_is_recognised_in_driver_and_cublas_texts() {
        assert!(is_out_of_memory(
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")"
        ));
        assert!(is_out_of_memory("cublas: CUBLAS_STATUS_ALLOC_FAILED"));
        assert!(!is_out_of_memory("CUDA_ERROR_ILLEGAL_ADDRESS"));
        assert!(!is_out_of_memory("shape mismatch in matmul"));
    }

    #[test]
    fn memory_info_used_is_total_minus_free() {
        let m = MemoryInfo {
            free: 3 << 30,
            total: 8 << 30,
        };
        assert_eq!(m.used(), 5 << 30);
    }

    #[test]
    fn the_cpu_is_described_as_cpu() {
        assert_eq!(describe(&candle_core::Device::Cpu), "cpu");
    }
}
