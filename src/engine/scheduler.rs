//! Continuous batching as plain state: a waiting queue and a running set for one model.
//!
//! The engine thread calls, once per step: [`Scheduler::admit`] (drop cancelled requests, move
//! waiting ones into free running slots, oldest first, up to `max_batch`), then
//! [`Scheduler::plan`] (which running sequences take part in this step and with how many
//! tokens), runs that one batched forward step, and [`Scheduler::retire`]s the sequences that
//! finished. New requests therefore join, and finished ones leave, at step boundaries.
//!
//! Prompts are prefilled in chunks: every decoding sequence feeds its one token each step, and
//! prefilling sequences share a budget of `prefill_chunk` prompt tokens per step (oldest
//! first), so a long prompt never stalls the running decodes for more than one chunk.
//!
//! No threads, channels or models here: the entries only need to say whether their client is
//! gone and how much prompt they have left ([`Schedulable`]), so it is unit-tested directly.

use std::collections::VecDeque;

/// What the scheduler needs to know about a request.
pub trait Schedulable {
    /// The client went away: drop it at the next step boundary.
    fn is_cancelled(&self) -> bool;
    /// Prompt tokens not yet through the model (0 once decoding).
    fn prefill_remaining(&self) -> usize;
}

/// What one [`Scheduler::admit`] did.
#[derive(Debug)]
pub struct Admission<T> {
    /// Waiting requests dropped because their client went away.
    pub dropped_waiting: Vec<T>,
    /// Running sequences dropped because their client went away.
    pub dropped_running: Vec<T>,
    /// Requests moved from waiting to running.
    pub started: usize,
}

/// One sequence's part in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Index into [`Scheduler::running_mut`].
    pub index: usize,
    /// Most tokens it feeds this step (1 when decoding).
    pub budget: usize,
}

/// The waiting queue and running set of one model.
#[derive(Debug)]
pub struct Scheduler<T> {
    waiting: VecDeque<T>,
    running: Vec<T>,
    max_batch: usize,
    prefill_chunk: usize,
}

impl<T: Schedulable> Scheduler<T> {
    /// At most `max_batch` sequences run together; prefills share `prefill_chunk` tokens per
    /// step. Both are raised to at least 1.
    pub fn new(max_batch: usize, prefill_chunk: usize) -> Self {
        Self {
            waiting: VecDeque::new(),
            running: Vec::new(),
            max_batch: max_batch.max(1),
            prefill_chunk: prefill_chunk.max(1),
        }
    }

    /// Queues a request behind the others.
    pub fn push(&mut self, entry: T) {
        self.waiting.push_back(entry);
    }

    /// Requests waiting for a slot.
    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    /// Sequences running.
    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    /// Nothing waits and nothing runs.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Drops cancelled requests, then fills free running slots from the front of the queue.
    pub fn admit(&mut self) -> Admission<T> {
        let (dropped_running, running): (Vec<T>, Vec<T>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(Schedulable::is_cancelled);
        self.running = running;
        let (dropped_waiting, waiting): (VecDeque<T>, VecDeque<T>) =
            std::mem::take(&mut self.waiting)
                .into_iter()
                .partition(Schedulable::is_cancelled);
        self.waiting = waiting;
        let mut started = 0;
        while self.running.len() < self.max_batch {
            let Some(entry) = self.waiting.pop_front() else {
                break;
            };
            self.running.push(entry);
            started += 1;
        }
        Admission {
            dropped_waiting: dropped_waiting.into_iter().collect(),
            dropped_running,
            started,
        }
    }

    /// The sequences of the next step, in running order: every decoding one with budget 1, and
    /// prefilling ones (oldest first) while the step's prefill budget lasts.
    pub fn plan(&self) -> Vec<Slot> {
        let mut budget = self.prefill_chunk;
        let mut slots = Vec::with_capacity(self.running.len());
        for (index, entry) in self.running.iter().enumerate() {
            match entry.prefill_remaining() {
                0 => slots.push(Slot { index, budget: 1 }),
                _ if budget == 0 => {}
                remaining => {
                    let take = remaining.min(budget);
                    budget -= take;
                    slots.push(Slot {
                        index,
                        budget: take,
                    });
                }
            }
        }
        slots
    }

    /// The running sequences, in admission order (indices as in [`Slot::index`]).
    pub fn running_mut(&mut self) -> &mut [T] {
        &mut self.running
    }

    /// Removes the running sequences at `indices` (any order, duplicates ignored) and returns
    /// them; the others keep their relative order.
    pub fn retire(&mut self, indices: &[usize]) -> Vec<T> {
        if indices.is_empty() {
            return Vec::new();
        }
        let mut done = Vec::new();
        let mut kept = Vec::with_capacity(self.running.len());
        for (i, entry) in std::mem::take(&mut self.running).into_iter().enumerate() {
            if indices.contains(&i) {
                done.push(entry);
            } else {
                kept.push(entry);
            }
        }
        self.running = kept;
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct Req {
        id: u32,
        prefill: usize,
        cancelled: bool,
    }

    impl Schedulable for Req {
        fn is_cancelled(&self) -> bool {
            self.cancelled
        }
        fn prefill_remaining(&self) -> usize {
            self.prefill
        }
    }

    fn req(id: u32, prefill: usize) -> Req {
        Req {
            id,
            prefill,
            cancelled: false,
        }
    }

    fn ids(s: &mut Scheduler<Req>) -> Vec<u32> {
        s.running_mut().iter().map(|r| r.id).collect()
    }

    #[test]
    fn admits_in_arrival_order_up_to_max_batch() {
        let mut s = Scheduler::new(2, 8);
        for id in 0..5 {
            s.push(req(id, 0));
        }
        let a = s.admit();
        assert_eq!(a.started, 2);
        assert_eq!(ids(&mut s), [0, 1]);
        assert_eq!(s.waiting_len(), 3);
        // Full: nothing joins until one leaves, then the oldest waiting one joins.
        assert_eq!(s.admit().started, 0);
        let done = s.retire(&[0]);
        assert_eq!(done[0].id, 0);
        assert_eq!(s.admit().started, 1);
        assert_eq!(ids(&mut s), [1, 2]);
        assert!(!s.is_idle());
    }

    #[test]
    fn cancelled_requests_leave_at_the_step_boundary() {
        let mut s = Scheduler::new(2, 8);
        for id in 0..4 {
            s.push(req(id, 0));
        }
        s.admit();
        s.running_mut()[0].cancelled = true;
        s.push(Req {
            id: 9,
            prefill: 0,
            cancelled: true,
        });
        let a = s.admit();
        assert_eq!(
            a.dropped_running.iter().map(|r| r.id).collect::<Vec<_>>(),
            [0]
        );
        assert_eq!(
            a.dropped_waiting.iter().map(|r| r.id).collect::<Vec<_>>(),
            [9]
        );
        assert_eq!(a.started, 1);
        assert_eq!(ids(&mut s), [1, 2]);
        assert_eq!(s.waiting_len(), 1);
    }

    #[test]
    fn prefills_share_the_chunk_budget_and_decodes_always_run() {
        let mut s = Scheduler::new(4, 10);
        s.push(req(0, 0));
        s.push(req(1, 25));
        s.push(req(2, 4));
        s.push(req(3, 0));
        s.admit();
        let slot = |index, budget| Slot { index, budget };
        assert_eq!(s.plan(), [slot(0, 1), slot(1, 10), slot(3, 1)]);
        s.running_mut()[1].prefill = 6;
        assert_eq!(s.plan(), [slot(0, 1), slot(1, 6), slot(2, 4), slot(3, 1)]);
        let mut tiny = Scheduler::new(2, 0);
        tiny.push(req(0, 3));
        tiny.admit();
        assert_eq!(
            tiny.plan(),
            [slot(0, 1)],
            "a zero chunk still makes progress"
        );
    }

    #[test]
    fn retire_keeps_the_order_of_the_rest() {
        let mut s = Scheduler::new(5, 1);
        for id in 0..5 {
            s.push(req(id, 0));
        }
        s.admit();
        let done: Vec<u32> = s.retire(&[3, 1, 3]).into_iter().map(|r| r.id).collect();
        assert_eq!(done, [1, 3]);
        assert_eq!(ids(&mut s), [0, 2, 4]);
        assert!(s.retire(&[]).is_empty());
        s.retire(&[0, 1, 2]);
        assert!(s.is_idle());
    }
}
