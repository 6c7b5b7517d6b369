//! The expert pool's copy thread: plays the copy stream for [`super::experts::ExpertStore`] as
//! the layer ring's copy thread ([`super::stream_thread`]) does for streamed layers, with the
//! same pattern (commands in order, completion events behind one mutex and condition variable)
//! and the same emulated link ([`super::link::throttle`]). An expert copy is a host slab copied
//! into a pool slot; the store issues one as soon as it knows an expert will be wanted (after
//! the router ran, or predicted ahead of it) and waits for its ticket only when the expert's
//! compute needs it, so copies overlap the compute of the experts already on the device.
//!
//! Why not the layer ring's thread itself: its slots are a ring filled from whole host layers
//! and emptied on release, while an expert slot keeps its expert across steps (the cache of
//! hot experts) and is filled from a slab of its own.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::accounting::Accounting;
use super::copy_shared::{self, ShutDown};
use super::error::OffloadError;
use super::host::{LayerLayout, Result};
use super::link::throttle;
use super::slot::SlotBuffers;

/// Why an expert is copied (what the accounting counts it as).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CopyKind {
    /// A routed expert missing from the device (a miss).
    Routed,
    /// An expert predicted for a layer that has not routed yet (a prefetch).
    Predicted,
}

/// One copy: `layout`'s regions of `src` into `dst`.
pub(super) struct CopyJob {
    pub dst: Arc<SlotBuffers>,
    pub src: Arc<SlotBuffers>,
    pub layout: Arc<LayerLayout>,
    pub kind: CopyKind,
}

struct Queued {
    ticket: u64,
    job: CopyJob,
}

/// Tickets count up from 1 and finish in order (one thread, one queue): ticket `t` has
/// finished once `completed >= t`.
#[derive(Default)]
struct State {
    queue: VecDeque<Queued>,
    /// The last ticket issued.
    issued: u64,
    /// The last ticket finished.
    completed: u64,
    /// Finished tickets whose copy failed, with the error.
    failed: HashMap<u64, String>,
    shutdown: bool,
}

impl ShutDown for State {
    fn shut_down(&mut self) {
        self.shutdown = true;
    }
}

type Shared = copy_shared::Shared<State>;

/// The store's handle on its copy thread (stops and joins it on drop).
pub(super) struct ExpertCopier {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    accounting: Arc<Accounting>,
}

impl std::fmt::Debug for ExpertCopier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpertCopier").finish_non_exhaustive()
    }
}

impl ExpertCopier {
    /// Starts the thread; copies last at least bytes / `bandwidth` (the CPU device's link).
    pub fn start(bandwidth: Option<u64>, accounting: Arc<Accounting>) -> Result<Self> {
        let shared = Arc::new(Shared::new(State::default()));
        let engine = Engine {
            shared: shared.clone(),
            bandwidth,
            accounting: accounting.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("ferry-expert-copy".into())
            .spawn(move || engine.run())
            .map_err(|e| OffloadError::CopyThread(e.to_string()))?;
        Ok(Self {
            shared,
            thread: Some(thread),
            accounting,
        })
    }

    /// Queues `job` (never waits for a copy) and returns its ticket.
    pub fn issue(&self, job: CopyJob) -> u64 {
        let ticket = {
            let mut state = self.shared.lock();
            state.issued += 1;
            let ticket = state.issued;
            state.queue.push_back(Queued { ticket, job });
            ticket
        };
        self.shared.changed.notify_all();
        ticket
    }

    /// Whether `ticket`'s copy has finished (without waiting).
    pub fn is_done(&self, ticket: u64) -> bool {
        self.shared.lock().completed >= ticket
    }

    /// Waits until `ticket`'s copy has landed (counted as waiting in the accounting); its
    /// error if it failed.
    pub fn wait(&self, ticket: u64) -> Result<()> {
        let started = Instant::now();
        let mut state = self.shared.lock();
        while state.completed < ticket {
            state = self.shared.wait(state);
        }
        let failed = state.failed.get(&ticket).cloned();
        drop(state);
        self.accounting.record_wait(started.elapsed());
        failed.map_or(Ok(()), |e| Err(OffloadError::CopyThread(e)))
    }

    /// Waits until every issued copy has finished.
    pub fn settle(&self) {
        let mut state = self.shared.lock();
        while state.completed < state.issued {
            state = self.shared.wait(state);
        }
    }
}

impl Drop for ExpertCopier {
    fn drop(&mut self) {
        self.shared.stop(&mut self.thread);
    }
}

/// The copy thread's side.
struct Engine {
    shared: Arc<Shared>,
    bandwidth: Option<u64>,
    accounting: Arc<Accounting>,
}

impl Engine {
    fn run(self) {
        loop {
            let next = {
                let mut state = self.shared.lock();
                loop {
                    if state.shutdown {
                        return;
                    }
                    if let Some(q) = state.queue.pop_front() {
                        break q;
                    }
                    state = self.shared.wait(state);
                }
            };
            let started = Instant::now();
            let job = &next.job;
            let result = job.dst.copy_from(&job.src, &job.layout);
            let result = match result {
                Ok(bytes) => {
                    throttle(self.bandwidth, bytes, started);
                    match job.kind {
                        CopyKind::Routed => {
                            self.accounting.record_expert_miss(bytes, started.elapsed())
                        }
                        CopyKind::Predicted => self
                            .accounting
                            .record_expert_prefetch(bytes, started.elapsed()),
                    }
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            };
            {
                let mut state = self.shared.lock();
                if let Err(e) = result {
                    state.failed.insert(next.ticket, e);
                }
                state.completed = next.ticket;
            }
            self.shared.changed.notify_all();
        }
    }
}
