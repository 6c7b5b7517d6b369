//! [`CopyLink`]: the copy stream and the per-slot events that order it against candle's compute
//! stream (DESIGN.md 4.3). Nothing here blocks the host:
//!
//! ```text
//! copy stream:    wait consumed[s] -> memcpy slab -> slot s -> record loaded[s]
//! compute stream: wait loaded[s]   -> layer kernels reading slot s -> record consumed[s]
//! ```
//!
//! Waiting on an event that was never recorded completes at once, so the first fill of every
//! slot needs no special case.

use std::sync::Arc;

use candle_core::cuda_backend::cudarc::driver::{result, CudaEvent, CudaStream};
use candle_core::Device;

use super::cuda_device;
use crate::{DeviceAddress, GpuError, Result};

/// A copy stream in the compute device's context, and `slots` pairs of events.
pub struct CopyLink {
    compute: Arc<CudaStream>,
    copy: Arc<CudaStream>,
    loaded: Vec<CudaEvent>,
    consumed: Vec<CudaEvent>,
}

impl std::fmt::Debug for CopyLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CopyLink")
            .field("slots", &self.loaded.len())
            .finish()
    }
}

impl CopyLink {
    /// Creates the copy stream and the events of `slots` slots on `device`.
    pub fn new(device: &Device, slots: usize) -> Result<Self> {
        let compute = cuda_device(device)?.cuda_stream();
        let ctx = compute.context().clone();
        let copy = ctx.new_stream()?;
        let events = || -> Result<Vec<CudaEvent>> {
            (0..slots)
                .map(|_| ctx.new_event(None).map_err(GpuError::from))
                .collect()
        };
        Ok(Self {
            loaded: events()?,
            consumed: events()?,
            compute,
            copy,
        })
    }

    /// Copies queued from now on wait until the compute stream released `slot`.
    pub fn copy_after_consumed(&self, slot: usize) -> Result<()> {
        Ok(self.copy.wait(self.event(&self.consumed, slot)?)?)
    }

    /// Marks the end of the copies queued so far into `slot`.
    pub fn mark_loaded(&self, slot: usize) -> Result<()> {
        Ok(self.event(&self.loaded, slot)?.record(&self.copy)?)
    }

    /// Kernels queued from now on wait until `slot`'s copies landed.
    pub fn compute_after_loaded(&self, slot: usize) -> Result<()> {
        Ok(self.compute.wait(self.event(&self.loaded, slot)?)?)
    }

    /// Marks the end of the kernels queued so far that read `slot`.
    pub fn mark_consumed(&self, slot: usize) -> Result<()> {
        Ok(self.event(&self.consumed, slot)?.record(&self.compute)?)
    }

    /// Copies queued from now on wait until everything queued on the compute stream so far has
    /// run (new slot buffers: candle zeroes them on the compute stream). No host wait.
    pub fn copy_after_compute(&self) -> Result<()> {
        Ok(self.copy.join(&self.compute)?)
    }

    /// Blocks until every queued copy finished (swap-ins, shutdown; never in the forward loop).
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.copy.synchronize()?)
    }

    /// Queues a copy of `src` to the device address `dst` on the copy stream (asynchronous:
    /// it returns before the bytes land).
    ///
    /// # Safety
    ///
    /// `dst` must address at least `src.len()` bytes of a device buffer in this link's context
    /// that stays allocated until the copy stream passed this copy, and `src` must stay alive
    /// and unmodified until then (a host slab, pinned for a true asynchronous copy).
    pub unsafe fn copy_to_device(&self, dst: DeviceAddress, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        self.copy.context().bind_to_thread()?;
        // SAFETY: the caller's contract above.
        Ok(unsafe { result::memcpy_htod_async(dst, src, self.copy.cu_stream()) }?)
    }

    fn event<'a>(&self, events: &'a [CudaEvent], slot: usize) -> Result<&'a CudaEvent> {
        events
            .get(slot)
            .ok_or_else(|| GpuError::Layout(format!("no slot {slot} in the copy link")))
    }
}

impl Drop for CopyLink {
    fn drop(&mut self) {
        // Copies in flight read host slabs and write slots that are about to be freed.
        if let Err(err) = self.copy.synchronize() {
            tracing::warn!("copy stream did not drain on shutdown: {err:?}");
        }
    }
}
