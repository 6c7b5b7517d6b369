//! The emulated host-to-device link of the CPU device: `device.link_bandwidth` makes every copy
//! into device memory (a streamed layer into its slot, a swapped model's slabs into their
//! buffers) last at least bytes / bandwidth, so the CPU behaves like a PCIe link.

use std::time::{Duration, Instant};

/// Sleeps until a copy of `bytes` that began at `started` has lasted `bytes / bandwidth`;
/// returns at once without a bandwidth (or with 0: unthrottled).
pub(super) fn throttle(bandwidth: Option<u64>, bytes: u64, started: Instant) {
    if let Some(bandwidth) = bandwidth.filter(|&b| b > 0) {
        let target = Duration::from_secs_f64(bytes as f64 / bandwidth as f64);
        let elapsed = started.elapsed();
        if target > elapsed {
            std::thread::sleep(target - elapsed);
        }
    }
}
