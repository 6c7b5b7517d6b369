//! The CPU backend of [`super::Streamer`]: a copy thread plays the copy stream.
//!
//! It takes commands in order, waits for the slot's *consumed* event (the slot is free), fills
//! it, and records its *loaded* event. Events are slot states behind one mutex and condition
//! variable. `link_bandwidth` throttles the copies ([`super::link`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use candle_core::Device;

use super::accounting::Accounting;
use super::copy_shared::{self, ShutDown};
use super::error::OffloadError;
use super::host::{HostStore, Result};
use super::link::throttle;
use super::slot::SlotBuffers;
use super::stream::Command;
use ferry_model::weights::LayerWeights;

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

impl ShutDown for State {
    fn shut_down(&mut self) {
        self.shutdown = true;
    }
}

/// The forward loop and the copy thread wait on each other's progress (slot loaded / slot
/// consumed).
type Shared = copy_shared::Shared<State>;

/// The forward loop's handle on the copy thread (stops and joins it on drop).
#[derive(Debug)]
pub(super) struct ThreadCopies {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    accounting: Arc<Accounting>,
}

impl ThreadCopies {
    /// Allocates `slots` slot buffers on `device`, counts them in `accounting`, starts the thread.
    pub fn start(
        host: Arc<HostStore>,
        slots: usize,
        device: &Device,
        bandwidth: Option<u64>,
        accounting: Arc<Accounting>,
    ) -> Result<Self> {
        let (blocks_len, dense_len) = host.slot_regions();
        let buffers = (0..slots)
            .map(|_| SlotBuffers::new(blocks_len, dense_len, host.dense_dtype(), device))
            .collect::<Result<Vec<_>>>()?;
        for b in &buffers {
            accounting.add_slots(b.allocated_bytes());
        }
        let shared = Arc::new(Shared::new(State {
            queue: VecDeque::new(),
            slots: vec![SlotState::Free; slots],
            shutdown: false,
            failed: None,
        }));
        let engine = CopyThread {
            shared: shared.clone(),
            host,
            buffers,
            bandwidth,
            accounting: accounting.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("ferry-copy".into())
            .spawn(move || engine.run())
            .map_err(|e| OffloadError::CopyThread(e.to_string()))?;
        Ok(Self {
            shared,
            thread: Some(thread),
            accounting,
        })
    }

    /// Queues `commands` (never blocks on a copy, only on the queue's mutex).
    pub fn issue(&self, commands: &[Command]) {
        self.shared.lock().queue.extend(commands.iter().copied());
        self.shared.changed.notify_all();
    }

    /// Waits until `ticket` landed in `slot` and hands out its weights.
    pub fn acquire(&self, ticket: u64, slot: usize) -> Result<LayerWeights> {
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

    /// Frees `slot` if it holds `ticket` in use; returns whether it did.
    pub fn release(&self, ticket: u64, slot: usize) -> bool {
        {
            let mut state = self.shared.lock();
            if matches!(&state.slots[slot], SlotState::InUse(t, _) if *t == ticket) {
                state.slots[slot] = SlotState::Free;
            } else {
                return false;
            }
        }
        self.shared.changed.notify_all();
        true
    }

    /// Drops queued copies, waits for the one in progress, frees every slot.
    pub fn resync(&self) {
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
    }
}

impl Drop for ThreadCopies {
    fn drop(&mut self) {
        self.shared.stop(&mut self.thread);
    }
}

/// The copy thread's side.
struct CopyThread {
    shared: Arc<Shared>,
    host: Arc<HostStore>,
    buffers: Vec<SlotBuffers>,
    bandwidth: Option<u64>,
    accounting: Arc<Accounting>,
}

impl CopyThread {
    fn run(self) {
        while let Some(cmd) = self.next_command() {
            let started = Instant::now();
            match self.copy(cmd) {
                Ok((bytes, weights)) => {
                    throttle(self.bandwidth, bytes, started);
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
}
