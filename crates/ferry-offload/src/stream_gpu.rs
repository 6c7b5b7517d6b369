//! The CUDA backend of [`super::Streamer`]: a copy stream and per-slot events, no copy thread.
//!
//! Issuing ticket `t` into slot `s` queues, on the copy stream: wait for `consumed[s]`, the
//! slab's copies, record `loaded[s]`. Acquiring it makes the compute stream wait for
//! `loaded[s]`; releasing it records `consumed[s]` on the compute stream. All of it is queued
//! from the forward loop's thread in ticket order and none of it blocks the host, so the copies
//! of the next layers run while the GPU computes the current one.
//!
//! The copy time is not measured here (that would need a host wait); the accounting counts the
//! bytes and copies, and the GPU check script measures the link.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use candle_core::Device;

use super::accounting::Accounting;
use super::error::OffloadError;
use super::host::{HostLayer, HostStore, Result};
use super::layout::SlotKind;
use super::slot_gpu::GpuSlot;
use super::stream::Command;
use ferry_gpu::CopyLink;
use ferry_model::weights::LayerWeights;

/// The slot ring on a CUDA device.
#[derive(Debug)]
pub(super) struct GpuCopies {
    /// First field: dropped first, it drains the copy stream before slots and slabs are freed.
    link: CopyLink,
    slots: Vec<GpuSlot>,
    host: Arc<HostStore>,
    /// Views per (slot, streamed position), built on first use (handles only, no weights).
    views: HashMap<(usize, usize), LayerWeights>,
    /// The ticket each slot was last filled for and not yet released.
    held: Vec<Option<u64>>,
    accounting: Arc<Accounting>,
}

impl GpuCopies {
    /// Allocates `slots` slots on `device` for the layers of `host` and creates the copy stream.
    pub fn start(
        host: Arc<HostStore>,
        slots: usize,
        device: &Device,
        accounting: Arc<Accounting>,
    ) -> Result<Self> {
        // The plan's slot layout: load_placed checked that it is this one.
        let layout = host.slot_layout(SlotKind::Cuda);
        let buffers = (0..slots)
            .map(|_| GpuSlot::new(device, &layout, host.dense_dtype()))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        for b in &buffers {
            accounting.add_slots(b.allocated_bytes());
        }
        let link = CopyLink::new(device, slots)?;
        // Once for the whole ring: no copy overtakes the zeroing of the slots (no host wait).
        link.copy_after_compute()?;
        Ok(Self {
            link,
            slots: buffers,
            host,
            views: HashMap::new(),
            held: vec![None; slots],
            accounting,
        })
    }

    /// Queues the copies of `cmd` behind the release of its slot. `head` is the ticket the
    /// forward loop consumes next (for the in-flight count).
    pub fn issue(&mut self, cmd: Command, head: u64) -> Result<()> {
        let layer = self.layer(cmd.position)?;
        let slot = self.slot(cmd.slot)?;
        self.link.copy_after_consumed(cmd.slot)?;
        let bytes = slot.enqueue_fill(&self.link, layer)?;
        self.link.mark_loaded(cmd.slot)?;
        self.accounting.record_copy(bytes, Duration::ZERO);
        self.accounting
            .observe_slots_busy((cmd.ticket + 1).saturating_sub(head) as usize);
        self.held[cmd.slot] = Some(cmd.ticket);
        Ok(())
    }

    /// The weights of `ticket` (layer at `position`) in `slot`; the compute stream waits for
    /// the slot's copies.
    pub fn acquire(&mut self, ticket: u64, slot: usize, position: usize) -> Result<LayerWeights> {
        if self.held.get(slot) != Some(&Some(ticket)) {
            return Err(OffloadError::Weights(format!(
                "slot {slot} was not filled for ticket {ticket}"
            )));
        }
        self.link.compute_after_loaded(slot)?;
        if let Some(w) = self.views.get(&(slot, position)) {
            return Ok(w.clone());
        }
        let w = self.slot(slot)?.views(self.layer(position)?)?;
        self.views.insert((slot, position), w.clone());
        Ok(w)
    }

    /// Records that the kernels queued so far are the last to read `slot` for `ticket`;
    /// returns whether the slot held that ticket.
    pub fn release(&mut self, ticket: u64, slot: usize) -> Result<bool> {
        if self.held.get(slot) != Some(&Some(ticket)) {
            return Ok(false);
        }
        self.link.mark_consumed(slot)?;
        self.held[slot] = None;
        Ok(true)
    }

    /// After a step that failed half-way: every slot counts as consumed once the kernels queued
    /// so far finish; copies in flight complete in stream order before any new copy.
    pub fn resync(&mut self) -> Result<()> {
        for slot in 0..self.slots.len() {
            self.link.mark_consumed(slot)?;
        }
        self.held.iter_mut().for_each(|h| *h = None);
        Ok(())
    }

    fn layer(&self, position: usize) -> Result<&HostLayer> {
        self.host
            .layers()
            .get(position)
            .ok_or_else(|| OffloadError::Weights(format!("no streamed layer {position}")))
    }

    fn slot(&self, slot: usize) -> Result<&GpuSlot> {
        self.slots
            .get(slot)
            .ok_or_else(|| OffloadError::Weights(format!("no slot {slot}")))
    }
}
