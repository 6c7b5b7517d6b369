//! Moving a parked model onto the device (offload mode `model`): every host slab is copied into
//! device buffers of its own, and the layers come back as views of those buffers.
//!
//! - CUDA: one [`GpuSlot`] per layer, every slab queued as bulk copies on a copy stream from
//!   pinned memory, one host wait at the end (a swap-in is not in the forward loop).
//! - CPU: the streaming ring's [`SlotBuffers`] fill path, throttled to `link_bandwidth`
//!   ([`super::link`]) so a swap costs what the emulated link would.

use std::time::Instant;

use candle_core::Device;

use super::host::{HostStore, Result};
use super::link::throttle;
use super::slot::SlotBuffers;
use super::slot_gpu::GpuSlot;
use crate::gpu::CopyLink;
use crate::model::weights::LayerWeights;

/// Copies every slab of `host` into new device buffers and returns the layers viewing them.
pub(super) fn copy_to_device(
    host: &HostStore,
    device: &Device,
    bandwidth: Option<u64>,
) -> Result<Vec<LayerWeights>> {
    if device.is_cuda() {
        return copy_to_gpu(host, device);
    }
    let started = Instant::now();
    let mut bytes = 0u64;
    let mut layers = Vec::with_capacity(host.layers().len());
    for layer in host.layers() {
        let buffers = SlotBuffers::new(
            layer.blocks_len,
            layer.dense_len,
            host.dense_dtype(),
            device,
        )?;
        bytes += buffers.fill(layer)?;
        layers.push(buffers.views(layer)?);
    }
    throttle(bandwidth, bytes, started);
    Ok(layers)
}

fn copy_to_gpu(host: &HostStore, device: &Device) -> Result<Vec<LayerWeights>> {
    let link = CopyLink::new(device, 1)?;
    let mut layers = Vec::with_capacity(host.layers().len());
    for layer in host.layers() {
        let slot = GpuSlot::new(device, &[layer], host.dense_dtype())?;
        slot.enqueue_fill(&link, layer)?;
        layers.push(slot.views(layer)?);
    }
    // The copies read the pinned slabs and write buffers the compute stream reads next: wait
    // for them once here.
    link.synchronize()?;
    Ok(layers)
}
