//! [`Streamer`]: the slot ring and its tickets (DESIGN.md 4.3, 4.4).
//!
//! Streamed layers are fetched in forward order, cyclically: after the last streamed layer of a
//! step comes the first streamed layer of the next one, so the end of a step already prefetches
//! the next step's first layers. The `t`-th fetch (its *ticket*) goes to slot `t % slots`. The
//! forward loop consumes tickets in the same order; at most `slots` tickets are in flight (issued
//! and not yet released), so a copy never targets a slot still in use.
//!
//! Which of the offloaded layers stream is chosen per step ([`Streamer::select`]): a layer the
//! step computes on the host (the host tier) is left out of the cycle, so no copy is issued for
//! it. A step that selects another set than the one before drops what was prefetched for the
//! old set and starts the cycle afresh.
//!
//! The copies themselves are done by a backend chosen by the device:
//!
//! - the CPU ([`super::stream_thread`]): a copy thread plays the copy stream, slot states behind a
//!   mutex play the events, and `link_bandwidth` can throttle it like a PCIe link;
//! - CUDA ([`super::stream_gpu`]): a real copy stream and per-slot *loaded* / *consumed* events;
//!   the host never waits in the forward loop.

use std::sync::Arc;

use candle_core::Device;

use super::accounting::Accounting;
use super::error::OffloadError;
use super::host::{HostStore, Result};
use super::stream_gpu::GpuCopies;
use super::stream_thread::ThreadCopies;
use ferry_model::weights::LayerWeights;

/// Streaming parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamConfig {
    /// Layers copied ahead of compute; the ring has `prefetch + 1` slots (fewer if fewer layers
    /// stream).
    pub prefetch: usize,
    /// Copy throttle in bytes/s on the CPU device; `None`: as fast as memcpy. CUDA copies run
    /// at the speed of the link.
    pub link_bandwidth: Option<u64>,
}

/// A copy command: fill `slot` with the streamed layer at `position` (its index in the streamed
/// order) for `ticket`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Command {
    pub ticket: u64,
    pub slot: usize,
    pub position: usize,
}

/// The backend that performs the copies.
#[derive(Debug)]
enum Copies {
    Thread(ThreadCopies),
    Gpu(GpuCopies),
}

/// The ring of device slots and the copy engine that fills them.
#[derive(Debug)]
pub struct Streamer {
    copies: Copies,
    /// Offloaded layer indices, in forward order (their positions in the host store).
    offloaded: Vec<usize>,
    /// Positions (into `offloaded`) of the layers that stream, in forward order.
    cycle: Vec<usize>,
    /// The ticket of the first layer of `cycle` (tickets before it served another selection).
    base: u64,
    slots: usize,
    /// Tickets issued ahead of the one being consumed: `min(prefetch, slots - 1)`.
    lookahead: u64,
    /// The ticket the forward loop consumes next.
    head: u64,
    /// Tickets issued so far.
    issued: u64,
}

impl Streamer {
    /// Allocates `min(prefetch + 1, streamed layers)` slots sized for the largest layer of
    /// `host` on `device`, counts them in `accounting`, and starts the copy engine.
    pub fn start(
        host: Arc<HostStore>,
        config: StreamConfig,
        device: &Device,
        accounting: Arc<Accounting>,
    ) -> Result<Self> {
        let order: Vec<usize> = host.layers().iter().map(|l| l.index).collect();
        if order.is_empty() {
            return Err(OffloadError::Weights("no layer to stream".into()));
        }
        let slots = (config.prefetch + 1).min(order.len());
        let copies = if device.is_cuda() {
            if config.link_bandwidth.is_some() {
                tracing::warn!(
                    "device.link_bandwidth only throttles the CPU device; ignored on CUDA"
                );
            }
            Copies::Gpu(GpuCopies::start(host, slots, device, accounting)?)
        } else {
            Copies::Thread(ThreadCopies::start(
                host,
                slots,
                device,
                config.link_bandwidth,
                accounting,
            )?)
        };
        Ok(Self {
            copies,
            cycle: (0..order.len()).collect(),
            offloaded: order,
            base: 0,
            slots,
            lookahead: (config.prefetch.min(slots - 1)) as u64,
            head: 0,
            issued: 0,
        })
    }

    /// Number of slots in the ring.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Offloaded layer indices, in forward order.
    pub fn order(&self) -> &[usize] {
        &self.offloaded
    }

    /// Whether layer `index` is offloaded (streamed, or computed on the host when a step
    /// selects so).
    pub fn streams(&self, index: usize) -> bool {
        self.offloaded.contains(&index)
    }

    /// The offloaded layers that stream in the current selection, in forward order.
    pub fn selected(&self) -> Vec<usize> {
        self.cycle.iter().map(|&p| self.offloaded[p]).collect()
    }

    /// Makes the offloaded layers for which `streams(index)` holds the ones that stream from
    /// now on (the others are computed on the host and get no copy). The same selection as
    /// before changes nothing (its prefetched copies serve); another one drops what is queued
    /// or loaded, waits for a copy in progress, and restarts the cycle at its first layer.
    pub fn select(&mut self, streams: impl Fn(usize) -> bool) -> Result<()> {
        let order: Vec<usize> = (0..self.offloaded.len())
            .filter(|&p| streams(self.offloaded[p]))
            .collect();
        if order == self.cycle {
            return Ok(());
        }
        match &mut self.copies {
            Copies::Thread(t) => t.resync(),
            Copies::Gpu(g) => g.resync()?,
        }
        self.cycle = order;
        self.base = self.issued;
        self.head = self.issued;
        Ok(())
    }

    /// Which entry of `cycle` ticket `ticket` serves.
    fn nth(&self, ticket: u64) -> usize {
        ((ticket - self.base) % self.cycle.len() as u64) as usize
    }

    /// Queues copies so that tickets `head..=head + lookahead` are issued. Never waits for a
    /// copy.
    pub fn prefetch(&mut self) -> Result<()> {
        if self.cycle.is_empty() {
            return Ok(());
        }
        let limit = self.head + self.lookahead;
        let (slots, base, cycle) = (self.slots as u64, self.base, &self.cycle);
        let command = |ticket: u64| Command {
            ticket,
            slot: (ticket % slots) as usize,
            position: cycle[((ticket - base) % cycle.len() as u64) as usize],
        };
        match &mut self.copies {
            Copies::Thread(t) => {
                let commands: Vec<Command> = (self.issued..=limit).map(command).collect();
                if !commands.is_empty() {
                    t.issue(&commands);
                    self.issued = limit + 1;
                }
            }
            Copies::Gpu(g) => {
                // One at a time: a ticket whose copies could not be queued is issued again by
                // the next call instead of leaving a slot that never loads.
                while self.issued <= limit {
                    g.issue(command(self.issued), self.head)?;
                    self.issued += 1;
                }
            }
        }
        Ok(())
    }

    /// The weights of streamed layer `index`. On the CPU this waits for its copy to land; on
    /// CUDA it makes the compute stream wait, and returns at once.
    pub fn acquire(&mut self, index: usize) -> Result<LayerWeights> {
        let nth = self.position(index)?;
        if self.nth(self.head) != nth {
            self.resync(nth)?;
        }
        self.prefetch()?;
        let ticket = self.head;
        let slot = (ticket % self.slots as u64) as usize;
        let position = self.cycle[nth];
        match &mut self.copies {
            Copies::Thread(t) => t.acquire(ticket, slot),
            Copies::Gpu(g) => g.acquire(ticket, slot, position),
        }
    }

    /// Marks streamed layer `index` consumed: its slot may be refilled, and the next copy is
    /// queued.
    pub fn release(&mut self, index: usize) -> Result<()> {
        let Ok(nth) = self.position(index) else {
            // Computed on the host this step: no slot to free.
            return Ok(());
        };
        if self.nth(self.head) != nth {
            // Not the layer in flight (e.g. released twice): nothing to do.
            return Ok(());
        }
        let slot = (self.head % self.slots as u64) as usize;
        let released = match &mut self.copies {
            Copies::Thread(t) => t.release(self.head, slot),
            Copies::Gpu(g) => g.release(self.head, slot)?,
        };
        if released {
            self.head += 1;
            self.prefetch()?;
        }
        Ok(())
    }

    /// Which entry of the selection streams layer `index`.
    fn position(&self, index: usize) -> Result<usize> {
        self.cycle
            .iter()
            .position(|&p| self.offloaded[p] == index)
            .ok_or(OffloadError::NoSuchLayer {
                index,
                n_layers: self.cycle.len(),
            })
    }

    /// Restarts the stream at entry `nth` of the selection after the forward loop left the
    /// expected order (a step that failed half-way): the backend drops or drains what is in
    /// flight and frees every slot, and the next ticket is the first one at `nth`.
    fn resync(&mut self, nth: usize) -> Result<()> {
        match &mut self.copies {
            Copies::Thread(t) => t.resync(),
            Copies::Gpu(g) => g.resync()?,
        }
        let mut next = self.issued;
        while self.nth(next) != nth {
            next += 1;
        }
        self.head = next;
        self.issued = next;
        Ok(())
    }
}
