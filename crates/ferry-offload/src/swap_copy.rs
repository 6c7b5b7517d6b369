//! Moving a parked model onto the device (offload mode `model`): every host slab is copied into
//! device buffers of its own, and the layers come back as views of those buffers.
//!
//! One procedure for every device ([`swap_in`]): allocate the buffers of every layer first (a
//! swap-in under a tight budget is expected to fail part-way with out-of-memory, before any copy
//! is queued), then queue every copy, then wait once. Whatever fails, the copies already queued
//! are drained before any buffer they write can be freed: on CUDA a freed buffer goes back to
//! the driver's pool at once, and another model could be handed that memory while a late copy
//! still lands in it. The device side is a [`SwapTarget`]:
//!
//! - CUDA ([`GpuSwap`]): one [`GpuSlot`] per layer (its own slot layout), bulk copies from the
//!   pinned slabs on a copy stream that waits once for the zeroing of the new buffers, one host
//!   wait at the end (a swap-in is not in the forward loop).
//! - CPU ([`CpuSwap`]): the streaming ring's [`SlotBuffers`] fill path, throttled to
//!   `link_bandwidth` ([`super::link`]) so a swap costs what the emulated link would.

use std::time::Instant;

use candle_core::{DType, Device};

use super::host::{HostLayer, HostStore, Result};
use super::layout::{SlotKind, SlotLayout};
use super::link::throttle;
use super::slot::SlotBuffers;
use super::slot_gpu::GpuSlot;
use ferry_gpu::CopyLink;
use ferry_model::weights::LayerWeights;

/// Copies every slab of `host` into new device buffers and returns the layers viewing them.
pub(super) fn copy_to_device(
    host: &HostStore,
    device: &Device,
    bandwidth: Option<u64>,
) -> Result<Vec<LayerWeights>> {
    if device.is_cuda() {
        swap_in(&mut GpuSwap::new(device, host.dense_dtype())?, host)
    } else {
        swap_in(
            &mut CpuSwap::new(device, host.dense_dtype(), bandwidth),
            host,
        )
    }
}

/// The device side of a swap-in.
pub(super) trait SwapTarget {
    /// The device buffers of one layer.
    type Buffers;
    /// Allocates buffers that can hold `layer` (no copy).
    fn allocate(&mut self, layer: &HostLayer) -> Result<Self::Buffers>;
    /// Called once after every allocation succeeded, before the first copy.
    fn allocated(&mut self) -> Result<()>;
    /// Queues the copies of `layer`'s slab into `buffers`; returns the bytes queued.
    fn enqueue(&mut self, buffers: &Self::Buffers, layer: &HostLayer) -> Result<u64>;
    /// Waits until every queued copy has landed.
    fn drain(&mut self) -> Result<()>;
    /// `layer`'s weights as views of `buffers` (after the drain).
    fn views(&self, buffers: &Self::Buffers, layer: &HostLayer) -> Result<LayerWeights>;
}

/// Allocates every layer's buffers, queues every copy, drains once, and returns the views. The
/// drain runs on every path, before `buffers` (and with it any buffer a copy writes) is dropped.
pub(super) fn swap_in<T: SwapTarget>(
    target: &mut T,
    host: &HostStore,
) -> Result<Vec<LayerWeights>> {
    let mut buffers = Vec::with_capacity(host.layers().len());
    let queued = queue(target, host, &mut buffers);
    let drained = target.drain();
    queued?;
    drained?;
    host.layers()
        .iter()
        .zip(&buffers)
        .map(|(layer, b)| target.views(b, layer))
        .collect()
}

fn queue<T: SwapTarget>(
    target: &mut T,
    host: &HostStore,
    buffers: &mut Vec<T::Buffers>,
) -> Result<()> {
    for layer in host.layers() {
        buffers.push(target.allocate(layer)?);
    }
    target.allocated()?;
    for (layer, b) in host.layers().iter().zip(buffers.iter()) {
        target.enqueue(b, layer)?;
    }
    Ok(())
}

/// A swap-in onto a CUDA device.
pub(super) struct GpuSwap {
    device: Device,
    dtype: DType,
    link: CopyLink,
}

impl GpuSwap {
    fn new(device: &Device, dtype: DType) -> Result<Self> {
        Ok(Self {
            device: device.clone(),
            dtype,
            link: CopyLink::new(device, 1)?,
        })
    }
}

impl SwapTarget for GpuSwap {
    type Buffers = GpuSlot;

    fn allocate(&mut self, layer: &HostLayer) -> Result<GpuSlot> {
        let layout = SlotLayout::of(SlotKind::Cuda, [layer.layout()]);
        GpuSlot::new(&self.device, &layout, self.dtype)
    }

    fn allocated(&mut self) -> Result<()> {
        // The new buffers are zeroed on the compute stream: the copies wait for that, once.
        Ok(self.link.copy_after_compute()?)
    }

    fn enqueue(&mut self, buffers: &GpuSlot, layer: &HostLayer) -> Result<u64> {
        buffers.enqueue_fill(&self.link, layer)
    }

    fn drain(&mut self) -> Result<()> {
        // The copies read the pinned slabs and write buffers the compute stream reads next.
        Ok(self.link.synchronize()?)
    }

    fn views(&self, buffers: &GpuSlot, layer: &HostLayer) -> Result<LayerWeights> {
        buffers.views(layer)
    }
}

/// A swap-in onto the CPU device: plain copies, throttled to the emulated link in the drain.
pub(super) struct CpuSwap {
    device: Device,
    dtype: DType,
    bandwidth: Option<u64>,
    started: Instant,
    bytes: u64,
}

impl CpuSwap {
    pub(super) fn new(device: &Device, dtype: DType, bandwidth: Option<u64>) -> Self {
        Self {
            device: device.clone(),
            dtype,
            bandwidth,
            started: Instant::now(),
            bytes: 0,
        }
    }
}

impl SwapTarget for CpuSwap {
    type Buffers = SlotBuffers;

    fn allocate(&mut self, layer: &HostLayer) -> Result<SlotBuffers> {
        SlotBuffers::new(layer.blocks_len, layer.dense_len, self.dtype, &self.device)
    }

    fn allocated(&mut self) -> Result<()> {
        self.started = Instant::now();
        Ok(())
    }

    fn enqueue(&mut self, buffers: &SlotBuffers, layer: &HostLayer) -> Result<u64> {
        let bytes = buffers.fill(layer)?;
        self.bytes += bytes;
        Ok(bytes)
    }

    fn drain(&mut self) -> Result<()> {
        throttle(self.bandwidth, self.bytes, self.started);
        Ok(())
    }

    fn views(&self, buffers: &SlotBuffers, layer: &HostLayer) -> Result<LayerWeights> {
        buffers.views(layer)
    }
}

#[cfg(test)]
#[path = "swap_copy_tests.rs"]
mod tests;
