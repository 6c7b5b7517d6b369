//! [`Streamer`]: the slot ring, the prefetch queue and the copy engine (DESIGN.md 4.3, 4.4).
//!
//! Streamed layers are fetched in forward order, cyclically: after the last streamed layer of a
//! step comes the first streamed layer of the next one. The `t`-th fetch (its *ticket*) goes to
//! slot `t % slots`. The forward loop consumes tickets in the same order; at most `slots` tickets
//! are in flight (issued and not yet released), so a copy never targets a slot still in use.
//!
//! On the CPU a copy thread plays the copy stream: it takes commands in order, waits for the
//! slot's *consumed* event (the slot is free), fills it, and records its *loaded* event. Events
//! are slot states behind one mutex and condition variable. `link_bandwidth` throttles the
//! copies (each copy lasts at least bytes / bandwidth) so the CPU behaves like a PCIe link. A
//! CUDA backend keeps this ticket logic and replaces the thread by a copy stream and the states
//! by CUDA events.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use candle_core::Device;

use super::accounting::Accounting;
use super::error::OffloadError;
use super::host::{HostStore, Result};
use super::slot::SlotBuffers;
use crate::model::weights::LayerWeights;

/// Streaming parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamConfig {
    /// Layers copied ahead of compute; the ring has `prefetch + 1` slots (fewer if fewer layers
    /// stream).
    pub prefetch: usize,
    /// Copy throttle in bytes/s; `None`: as fast as memcpy.
    pub link_bandwidth: Option<u64>,
}

/// One slot's event state.
#[derive(Debug, Clone)]
enum SlotState {
    /// Consumed: the copy engine may overwrite it.
    Free,
    /// The copy engine is writing ticket `.0` into it.
    Loading(u64),
    /// Loaded event recorded for the ticket; the views are ready.
    Loaded(u64, LayerWeights),
    /// Handed to the forward loop, not yet released.
    InUse(u64, LayerWeights),
}

/// A copy command: fill `slot` with the streamed layer at `position` (its index in the streamed
/// order) for `ticket`.
#[derive(Debug, Clone, Copy)]
struct Command {
    ticket: u64,
    slot: usize,
    position: usize,
}

#[derive(Debug)]
struct State {
    queue: VecDeque<Command>,
    slots: Vec<SlotState>,
    shutdown: bool,
    failed: Option<String>,
}

impl State {
    fn busy(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| !matches!(s, SlotState::Free))
            .count()
    }
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, guard: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(guard).unwrap_or_else(|e| e.into_inner())
    }
}

/// The ring of device slots and the copy engine that fills them.
#[derive(Debug)]
pub struct Streamer {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Streamed layer indices, in forward order.
    order: Vec<usize>,
    slots: usize,
    /// Tickets issued ahead of the one being consumed: `min(prefetch, slots - 1)`.
    lookahead: u64,
    /// The ticket the forward loop consumes next.
    head: u64,
    /// Tickets issued so far.
    issued: u64,
    accounting: Arc<Accounting>,
}

impl Streamer {
    /// Allocates `min(prefetch + 1, streamed layers)` slots sized for the largest layer of
    /// `host`, counts them in `accounting`, and starts the copy thread.
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
        let (blocks_len, dense_len) = host.slot_regions();
        let buffers = (0..slots)
            .map(|_| SlotBuffers::new(blocks_len, dense_len, host.dense_dtype(), device))
            .collect::<Result<Vec<_>>>()?;
        for b in &buffers {
            accounting.add_slots(b.allocated_bytes());
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                slots: vec![SlotState::Free; slots],
                shutdown: false,
                failed: None,
            }),
            changed: Condvar::new(),
        });
        let engine = CopyEngine {
            shared: shared.clone(),
            host,
            buffers,
            bandwidth: config.link_bandwidth,
            accounting: accounting.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("ferry-copy".into())
            .spawn(move || engine.run())
            .map_err(|e| OffloadError::CopyThread(e.to_string()))?;
        Ok(Self {
            shared,
            thread: Some(thread),
            order,
            slots,
            lookahead: (config.prefetch.min(slots - 1)) as u64,
            head: 0,
            issued: 0,
            accounting,
        })
    }

    /// Number of slots in the ring.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Streamed layer indices, in forward order.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// Whether layer `index` is streamed.
    pub fn streams(&self, index: usize) -> bool {
        self.order.contains(&index)
    }

    /// Queues copies so that tickets `head..=head + lookahead` are issued. Never blocks on a
    /// copy (only on the queue's mutex).
    pub fn prefetch(&mut self) {
        let limit = self.head + self.lookahead;
        if self.issued > limit {
            return;
        }
        let mut state = self.shared.lock();
        while self.issued <= limit {
            let ticket = self.issued;
            state.queue.push_back(Command {
                ticket,
                slot: (ticket % self.slots as u64) as usize,
                position: (ticket % self.order.len() as u64) as usize,
            });
            self.issued += 1;
        }
        drop(state);
        self.shared.changed.notify_all();
    }

    /// The weights of streamed layer `index`, waiting for its copy to land.
    pub fn acquire(&mut self, index: usize) -> Result<LayerWeights> {
        let position = self.position(index)?;
        if self.head % self.order.len() as u64 != position as u64 {
            self.resync(position);
        }
        self.prefetch();
        let ticket = self.head;
        let slot = (ticket % self.slots as u64) as usize;
        let started = Instant::now();
        let mut state = self.shared.lock();
        loop {
            if let Some(message) = &state.failed {
                return Err(OffloadError::CopyThread(message.clone()));
            }
            match &state.slots[slot] {
                SlotState::Loaded(t, w) | SlotState::InUse(t, w) if *t == ticket => {
                    let w = w.clone();
                    state.slots[slot] = SlotState::InUse(ticket, w.clone());
                    drop(state);
                    self.accounting.record_wait(started.elapsed());
                    return Ok(w);
                }
                _ => state = self.shared.wait(state),
            }
        }
    }

    /// Marks streamed layer `index` consumed: its slot may be refilled, and the next copy is
    /// queued.
    pub fn release(&mut self, index: usize) -> Result<()> {
        let position = self.position(index)?;
        if self.head % self.order.len() as u64 != position as u64 {
            // Not the layer in flight (e.g. released twice): nothing to do.
            return Ok(());
        }
        let slot = (self.head % self.slots as u64) as usize;
        {
            let mut state = self.shared.lock();
            if matches!(&state.slots[slot], SlotState::InUse(t, _) if *t == self.head) {
                state.slots[slot] = SlotState::Free;
            } else {
                return Ok(());
            }
        }
        self.shared.changed.notify_all();
        self.head += 1;
        self.prefetch();
        Ok(())
    }

    fn position(&self, index: usize) -> Result<usize> {
        self.order
            .iter()
            .position(|&i| i == index)
            .ok_or(OffloadError::NoSuchLayer {
                index,
                n_layers: self.order.len(),
            })
    }

    /// Restarts the stream at `position` after the forward loop left the expected order (a
    /// step that failed half-way): drops queued copies, waits for the one in progress, frees
    /// every slot.
    fn resync(&mut self, position: usize) {
        let mut state = self.shared.lock();
        state.queue.clear();
        while state
            .slots
            .iter()
            .any(|s| matches!(s, SlotState::Loading(_)))
        {
            state = self.shared.wait(state);
        }
        state.slots.iter_mut().for_each(|s| *s = SlotState::Free);
        drop(state);
        let n = self.order.len() as u64;
        let mut next = self.issued;
        while next % n != position as u64 {
            next += 1;
        }
        self.head = next;
        self.issued = next;
    }
}

impl Drop for Streamer {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.changed.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The copy thread's side.
struct CopyEngine {
    shared: Arc<Shared>,
    host: Arc<HostStore>,
    buffers: Vec<SlotBuffers>,
    bandwidth: Option<u64>,
    accounting: Arc<Accounting>,
}

impl CopyEngine {
    fn run(self) {
        while let Some(cmd) = self.next_command() {
            let started = Instant::now();
            match self.copy(cmd) {
                Ok((bytes, weights)) => {
                    self.throttle(bytes, started);
                    self.accounting.record_copy(bytes, started.elapsed());
                    let mut state = self.shared.lock();
                    if matches!(state.slots[cmd.slot], SlotState::Loading(t) if t == cmd.ticket) {
                        state.slots[cmd.slot] = SlotState::Loaded(cmd.ticket, weights);
                    }
                }
                Err(err) => {
                    let mut state = self.shared.lock();
                    state.failed = Some(err.to_string());
                    state.slots[cmd.slot] = SlotState::Free;
                }
            }
            self.shared.changed.notify_all();
        }
    }

    /// Waits for a command and for its slot's consumed event; marks the slot loading.
    fn next_command(&self) -> Option<Command> {
        let mut state = self.shared.lock();
        loop {
            if state.shutdown {
                return None;
            }
            if let Some(&cmd) = state.queue.front() {
                if matches!(state.slots[cmd.slot], SlotState::Free) {
                    state.queue.pop_front();
                    state.slots[cmd.slot] = SlotState::Loading(cmd.ticket);
                    self.accounting.observe_slots_busy(state.busy());
                    return Some(cmd);
                }
            }
            state = self.shared.wait(state);
        }
    }

    fn copy(&self, cmd: Command) -> Result<(u64, LayerWeights)> {
        let layer =
            self.host.layers().get(cmd.position).ok_or_else(|| {
                OffloadError::Weights(format!("no streamed layer {}", cmd.position))
            })?;
        let slot = &self.buffers[cmd.slot];
        let bytes = slot.fill(layer)?;
        Ok((bytes, slot.views(layer)?))
    }

    /// Sleeps until `bytes` took at least `bytes / bandwidth` since `started`.
    fn throttle(&self, bytes: u64, started: Instant) {
        if let Some(bandwidth) = self.bandwidth.filter(|&b| b > 0) {
            let target = Duration::from_secs_f64(bytes as f64 / bandwidth as f64);
            let elapsed = started.elapsed();
            if target > elapsed {
                std::thread::sleep(target - elapsed);
            }
        }
    }
}
