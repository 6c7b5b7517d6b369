//! Picks the compute device from the configuration. This build has no CUDA backend yet, so
//! `auto` means the CPU and `cuda:N` is a clear error rather than a silent fallback.

use candle_core::Device;

use super::RuntimeError;
use crate::config::DeviceChoice;

/// The candle device for `choice`.
pub fn select_device(choice: DeviceChoice) -> Result<Device, RuntimeError> {
    match choice {
        DeviceChoice::Auto | DeviceChoice::Cpu => Ok(Device::Cpu),
        DeviceChoice::Cuda(index) => Err(RuntimeError::Device(format!(
            "cuda:{index} was requested, but this ferry was built without CUDA support; \
             rebuild with `--features cuda` (see README) or use --device cpu"
        ))),
    }
}

/// A short human name for logs ("cpu", "cuda:0").
pub fn describe(device: &Device) -> String {
    match device {
        Device::Cpu => "cpu".to_string(),
        Device::Cuda(_) => "cuda".to_string(),
        Device::Metal(_) => "metal".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_auto_give_the_cpu() {
        assert!(matches!(select_device(DeviceChoice::Cpu), Ok(Device::Cpu)));
        assert!(matches!(select_device(DeviceChoice::Auto), Ok(Device::Cpu)));
    }

    #[test]
    fn cuda_without_the_feature_says_how_to_get_it() {
        let err = select_device(DeviceChoice::Cuda(0)).expect_err("no CUDA in this build");
        assert!(err.to_string().contains("--features cuda"), "{err}");
    }
}
