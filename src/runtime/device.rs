//! Picks the compute device from the configuration: `cpu`, `cuda:N`, or `auto` (cuda:0 when this
//! build has CUDA and the driver sees a device, else the CPU). Asking for CUDA in a build without
//! it, or for a device the driver does not see, is a clear error, never a silent fallback.
//!
//! Also the device's free memory, which the planner resolves `gpu_memory = "90%"` against: the
//! driver's number on CUDA, `MemAvailable` on the CPU.

use candle_core::Device;

use super::planning::cpu_free_bytes;
use super::RuntimeError;
use ferry_config::DeviceChoice;

/// The candle device for `choice`.
pub fn select_device(choice: DeviceChoice) -> Result<Device, RuntimeError> {
    match choice {
        DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Auto if ferry_gpu::device_count() > 0 => open_cuda(0),
        DeviceChoice::Auto => Ok(Device::Cpu),
        DeviceChoice::Cuda(index) => open_cuda(index),
    }
}

fn open_cuda(index: usize) -> Result<Device, RuntimeError> {
    let device =
        ferry_gpu::open(index).map_err(|e| RuntimeError::Device(format!("cuda:{index}: {e}")))?;
    if let Ok(mem) = ferry_gpu::memory_info(&device) {
        tracing::info!(
            device = %describe(&device),
            free_mib = mem.free >> 20,
            total_mib = mem.total >> 20,
            "CUDA device opened"
        );
    }
    Ok(device)
}

/// A short human name for logs ("cpu", "cuda:0").
pub fn describe(device: &Device) -> String {
    ferry_gpu::describe(device)
}

/// Bytes free on `device` right now: the driver's figure on CUDA, `MemAvailable` on the CPU.
pub fn free_bytes(device: &Device) -> Result<u64, RuntimeError> {
    if device.is_cuda() {
        return ferry_gpu::memory_info(device).map(|m| m.free).map_err(|e| {
            RuntimeError::Device(format!("free memory of {}: {e}", describe(device)))
        });
    }
    cpu_free_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_gives_the_cpu() {
        assert!(matches!(select_device(DeviceChoice::Cpu), Ok(Device::Cpu)));
    }

    #[test]
    fn auto_gives_the_cpu_without_a_cuda_device() {
        if ferry_gpu::device_count() == 0 {
            assert!(matches!(select_device(DeviceChoice::Auto), Ok(Device::Cpu)));
        }
    }

    #[test]
    fn the_cpu_has_free_memory() {
        assert!(free_bytes(&Device::Cpu).expect("meminfo") > 0);
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_says_how_to_get_it() {
        let err = select_device(DeviceChoice::Cuda(0)).expect_err("no CUDA in this build");
        assert!(err.to_string().contains("--features cuda"), "{err}");
    }

    #[test]
    fn a_device_the_driver_does_not_see_is_an_error() {
        let err = select_device(DeviceChoice::Cuda(97)).expect_err("no such device");
        assert!(err.to_string().contains("cuda:97"), "{err}");
    }
}
