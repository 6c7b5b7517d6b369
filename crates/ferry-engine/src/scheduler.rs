//! Continuous batching as plain state: a waiting queue and a running set for one model.
//!
//! The engine thread calls, once per step: [`Scheduler::admit`] (drop cancelled requests, move
//! waiting ones into free places in the batch, oldest first, up to `max_batch` places; an entry
//! may take several, [`Schedulable::places`]), then
//! [`Scheduler::plan`] (which running sequences take part in this step and with how many
//! tokens), runs that one batched forward step, [`Scheduler::retire`]s the sequences that
//! finished and [`Scheduler::adopt`]s the ones the step split off an entry (the other choices
//! of a request, which held their places in it). New requests therefore join, and finished ones
//! leave, at step boundaries.
//!
//! Every step has a token budget, at most [`StepLimits::max_step_tokens`] (the serving loop
//! lowers it to what fits its time target, [`super::pacer`]): every decoding sequence feeds its
//! one token first (decodes are never starved by prefill), then the prefilling sequences share
//! what the budget leaves ([`Scheduler::plan_within`]): each gets a share of at least the floor
//! (the shortest chunk that computes as a long one does, so sharing never changes a result),
//! in turn when the budget cannot give every one of them a share, and what is left is split
//! evenly among them, each up to a chunk of [`StepLimits::prefill_chunk`]. So a short prompt
//! arriving beside a long one starts within a step or two instead of waiting for the long one
//! to finish. A step never computes more than its budget, which bounds the gap between a
//! stream's tokens however long the prompts beside it are. A prompt chunk never crosses a
//! multiple of `prefill_chunk` counted from the prompt's start ([`Schedulable::prefill_fed`]),
//! so a prompt restored part-way from the prefix cache is cut where one prefilled from the
//! start is.
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
    /// Prompt tokens already through the model (or restored): prompt chunks end at multiples
    /// of `prefill_chunk` counted from the prompt's start, so a prefill that starts part-way
    /// (from the prefix cache) is cut where one from the start would be. Default 0.
    fn prefill_fed(&self) -> usize {
        0
    }
    /// Places in the batch it takes (more than 1 for a request whose other choices wait to be split
    /// off it). Default 1.
    fn places(&self) -> usize {
        1
    }
    /// Tokens it feeds in a decode step: its last sampled token and the tokens speculation
    /// proposed after it. Default 1.
    fn decode_tokens(&self) -> usize {
        1
    }
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

/// One sequence's share of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepShare {
    /// Index into [`Scheduler::running_mut`].
    pub index: usize,
    /// Most tokens it feeds this step (when decoding: 1, plus its proposals when it speculates).
    pub budget: usize,
}

/// How much one step may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepLimits {
    /// Most sequences running together.
    pub max_batch: usize,
    /// Most prompt tokens one sequence feeds in a step.
    pub prefill_chunk: usize,
    /// Most tokens in a step, decodes and prompt chunks together.
    pub max_step_tokens: usize,
    /// The time a step shared by several sequences aims at; the serving loop lowers the
    /// step's tokens to what fits it ([`super::pacer`]). `None`: no target.
    pub step_time: Option<std::time::Duration>,
}

impl StepLimits {
    /// The limits made usable: each at least 1, and `max_step_tokens` at least `max_batch` so
    /// a step always has room for every decode plus one prompt token.
    pub fn sanitized(self) -> Self {
        let max_batch = self.max_batch.max(1);
        Self {
            max_batch,
            prefill_chunk: self.prefill_chunk.max(1),
            max_step_tokens: self.max_step_tokens.max(max_batch),
            step_time: self.step_time,
        }
    }
}

/// The waiting queue and running set of one model.
#[derive(Debug)]
pub struct Scheduler<T> {
    waiting: VecDeque<T>,
    running: Vec<T>,
    limits: StepLimits,
    /// Which prefilling sequence is served first when the budget cannot serve them all:
    /// advances every such step, so each gets its turn.
    turn: usize,
}

impl<T: Schedulable> Scheduler<T> {
    /// A scheduler within `limits` (made usable with [`StepLimits::sanitized`]).
    pub fn new(limits: StepLimits) -> Self {
        Self {
            waiting: VecDeque::new(),
            running: Vec::new(),
            limits: limits.sanitized(),
            turn: 0,
        }
    }

    /// Queues a request behind the others.
    pub fn push(&mut self, entry: T) {
        self.waiting.push_back(entry);
    }

    /// Requests waiting for a place in the batch.
    pub fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    /// Sequences running.
    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    /// Places in the batch taken (sequences, plus the choices they hold for later).
    fn places_taken(&self) -> usize {
        self.running.iter().map(Schedulable::places).sum()
    }

    /// Nothing waits and nothing runs.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Drops cancelled requests, then fills free places in the batch from the front of the queue.
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
        let mut taken = self.places_taken();
        while let Some(front) = self.waiting.front() {
            // An entry wider than the whole batch still runs alone rather than never.
            let need = front.places().min(self.limits.max_batch);
            if taken + need > self.limits.max_batch {
                break;
            }
            taken += front.places();
            self.running.extend(self.waiting.pop_front());
            started += 1;
        }
        Admission {
            dropped_waiting: dropped_waiting.into_iter().collect(),
            dropped_running,
            started,
        }
    }

    /// The limits in force (made usable).
    pub fn limits(&self) -> StepLimits {
        self.limits
    }

    /// Tokens the decoding sequences (their prompt done) feed next step: one each, plus what
    /// speculation proposed ([`Schedulable::decode_tokens`]).
    pub fn decoding_tokens(&self) -> usize {
        self.running
            .iter()
            .filter(|e| e.prefill_remaining() == 0)
            .map(|e| e.decode_tokens().max(1))
            .sum()
    }

    /// [`Self::plan_within`] the whole `max_step_tokens`, with no floor (for tests).
    #[cfg(test)]
    pub fn plan(&mut self) -> Vec<StepShare> {
        self.plan_within(self.limits.max_step_tokens, 1)
    }

    /// The sequences of the next step, in running order: every decoding one with budget 1 (or
    /// its [`Schedulable::decode_tokens`] when it speculates), then the prefilling ones share what is left of `step_tokens` (at most
    /// `max_step_tokens`): first a share of `floor` tokens each (or all its chunk needs, if
    /// less), in turn from [`Self::turn`] while the budget lasts, then the rest evenly, each
    /// up to the end of its chunk. A share that stops short of its chunk's end leaves at least
    /// `floor` tokens to it where it can, so the next chunk is not short either. The budgets
    /// add up to at most `step_tokens`, or to the decodes when they alone take more. A floor
    /// above what the decodes leave of `step_tokens` is lowered to it.
    pub fn plan_within(&mut self, step_tokens: usize, floor: usize) -> Vec<StepShare> {
        let step_tokens = step_tokens.clamp(1, self.limits.max_step_tokens);
        let mut budget = step_tokens.saturating_sub(self.decoding_tokens());
        // A budget set below the floor (a small `max_step_tokens`) is kept: shares shrink.
        let floor = floor.clamp(1, budget.max(1));
        let chunk = self.limits.prefill_chunk;
        // (running index, tokens to the end of its chunk) of every prefilling sequence.
        let wants: Vec<(usize, usize)> = self
            .running
            .iter()
            .enumerate()
            .filter_map(|(index, entry)| match entry.prefill_remaining() {
                0 => None,
                remaining => Some((index, remaining.min(chunk - entry.prefill_fed() % chunk))),
            })
            .collect();
        let mut take = vec![0usize; wants.len()];
        let first = if wants.is_empty() {
            0
        } else {
            self.turn % wants.len()
        };
        let mut served_all = true;
        for k in (0..wants.len()).map(|k| (first + k) % wants.len()) {
            // A chunk end within two floors is taken whole where it fits, so no share leaves a
            // sliver (else a floor of it: a tight budget must not stall a prompt).
            let want = wants[k].1;
            let least = if want < 2 * floor && want <= budget {
                want
            } else {
                floor.min(want)
            };
            if least <= budget {
                take[k] = least;
                budget -= least;
            } else {
                served_all = false;
            }
        }
        if !served_all {
            self.turn = self.turn.wrapping_add(1);
        }
        // The rest, evenly, to the sequences already served, each up to its chunk's end.
        loop {
            let open: Vec<usize> = (0..wants.len())
                .filter(|&k| take[k] > 0 && take[k] < wants[k].1)
                .collect();
            if open.is_empty() || budget == 0 {
                break;
            }
            let each = (budget / open.len()).max(1);
            for k in open {
                let more = each.min(wants[k].1 - take[k]).min(budget);
                take[k] += more;
                budget -= more;
            }
        }
        // Never leave a sliver of a chunk: a share short of its chunk's end leaves `floor`.
        for (k, &(_, want)) in wants.iter().enumerate() {
            let left = want - take[k];
            if take[k] > 0 && left > 0 && left < floor {
                if left <= budget {
                    budget -= left;
                    take[k] = want;
                } else if want >= 2 * floor {
                    budget += take[k] - (want - floor);
                    take[k] = want - floor;
                }
            }
        }
        let mut shares = Vec::with_capacity(self.running.len());
        let mut prefills = wants.iter().zip(&take).peekable();
        for (index, entry) in self.running.iter().enumerate() {
            if entry.prefill_remaining() == 0 {
                shares.push(StepShare {
                    index,
                    budget: entry.decode_tokens().max(1),
                });
            } else if let Some((_, &taken)) = prefills.next_if(|((i, _), _)| *i == index) {
                if taken > 0 {
                    shares.push(StepShare {
                        index,
                        budget: taken,
                    });
                }
            }
        }
        if shares.is_empty() && !wants.is_empty() {
            // Zero limits still make progress: one token of the first prompt.
            shares.push(StepShare {
                index: wants[0].0,
                budget: 1,
            });
        }
        shares
    }

    /// The running sequences, in admission order (indices as in [`StepShare::index`]).
    pub fn running_mut(&mut self) -> &mut [T] {
        &mut self.running
    }

    /// Adds sequences split off a running entry (their places were that entry's), after the
    /// others.
    pub fn adopt(&mut self, entries: impl IntoIterator<Item = T>) {
        self.running.extend(entries);
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

    fn limits(max_batch: usize, prefill_chunk: usize, max_step_tokens: usize) -> StepLimits {
        StepLimits {
            max_batch,
            prefill_chunk,
            max_step_tokens,
            step_time: None,
        }
    }

    fn ids(s: &mut Scheduler<Req>) -> Vec<u32> {
        s.running_mut().iter().map(|r| r.id).collect()
    }

    #[test]
    fn admits_in_arrival_order_up_to_max_batch() {
        let mut s = Scheduler::new(limits(2, 8, 8));
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
        let mut s = Scheduler::new(limits(2, 8, 8));
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
    fn prefills_share_the_step_budget_and_decodes_always_run() {
        // Budget 12: two decodes first, then 10 prompt tokens, at most 8 per sequence.
        let mut s = Scheduler::new(limits(4, 8, 12));
        s.push(req(0, 0));
        s.push(req(1, 25));
        s.push(req(2, 4));
        s.push(req(3, 0));
        s.admit();
        let share = |index, budget| StepShare { index, budget };
        assert_eq!(
            s.plan(),
            [share(0, 1), share(1, 6), share(2, 4), share(3, 1)],
            "the two prompts share the 10 tokens the decodes leave"
        );
        s.running_mut()[1].prefill = 6;
        assert_eq!(
            s.plan(),
            [share(0, 1), share(1, 6), share(2, 4), share(3, 1)]
        );
        let mut tiny = Scheduler::new(limits(2, 0, 0));
        tiny.push(req(0, 3));
        tiny.admit();
        assert_eq!(
            tiny.plan(),
            [share(0, 1)],
            "zero limits still make progress"
        );
    }

    #[test]
    fn prompt_chunks_end_on_the_chunk_grid() {
        #[derive(Debug)]
        struct Partway(usize, usize);
        impl Schedulable for Partway {
            fn is_cancelled(&self) -> bool {
                false
            }
            fn prefill_remaining(&self) -> usize {
                self.1
            }
            fn prefill_fed(&self) -> usize {
                self.0
            }
        }
        let mut s = Scheduler::new(limits(2, 8, 100));
        // 5 of 30 prompt tokens restored: the first chunk ends at 8, then whole chunks.
        s.push(Partway(5, 25));
        s.push(Partway(16, 3));
        s.admit();
        let share = |index, budget| StepShare { index, budget };
        assert_eq!(s.plan(), [share(0, 3), share(1, 3)]);
        s.running_mut()[0] = Partway(8, 22);
        assert_eq!(s.plan()[0], share(0, 8));
    }

    #[test]
    fn no_step_exceeds_the_token_budget_however_long_the_prompts() {
        let mut s = Scheduler::new(limits(4, 512, 16));
        s.push(req(0, 0));
        s.push(req(1, 4000));
        s.push(req(2, 0));
        s.push(req(3, 9000));
        s.admit();
        for _ in 0..50 {
            let plan = s.plan();
            let tokens: usize = plan.iter().map(|share| share.budget).sum();
            assert!(tokens <= 16, "{plan:?}");
            // Both decodes are in every step.
            assert!(plan
                .iter()
                .any(|share| share.index == 0 && share.budget == 1));
            assert!(plan
                .iter()
                .any(|share| share.index == 2 && share.budget == 1));
            for share in plan {
                let entry = &mut s.running_mut()[share.index];
                entry.prefill = entry.prefill.saturating_sub(share.budget);
            }
        }
        assert_eq!(
            (s.running_mut()[1].prefill, s.running_mut()[3].prefill),
            (4000 - 50 * 7, 9000 - 50 * 7),
            "the prompts share what the decodes leave"
        );
        assert_eq!(
            StepLimits {
                max_batch: 8,
                prefill_chunk: 4,
                max_step_tokens: 2,
                step_time: None,
            }
            .sanitized()
            .max_step_tokens,
            8
        );
    }

    #[test]
    fn a_short_prompt_beside_a_long_one_starts_at_once() {
        // A long prompt alone takes whole chunks; a short one arriving beside it gets a share
        // in the very next step and finishes within a few, not after the long one.
        let mut s = Scheduler::new(limits(4, 512, 512));
        s.push(req(0, 4000));
        s.admit();
        assert_eq!(
            s.plan_within(512, 64),
            [StepShare {
                index: 0,
                budget: 512
            }]
        );
        s.running_mut()[0].prefill -= 512;
        s.push(req(1, 100));
        s.admit();
        let mut steps = 0;
        while s.running_mut()[1].prefill > 0 {
            steps += 1;
            let plan = s.plan_within(128, 64);
            assert!(
                plan.iter().map(|p| p.budget).sum::<usize>() <= 128,
                "{plan:?}"
            );
            for share in plan {
                assert!(share.budget >= 36, "shares are not slivers: {share:?}");
                s.running_mut()[share.index].prefill -= share.budget;
            }
        }
        assert!(steps <= 2, "the short prompt took {steps} steps");
        assert!(s.running_mut()[0].prefill < 3488, "the long one kept going");
    }

    #[test]
    fn when_the_budget_cannot_serve_every_prompt_they_take_turns() {
        let mut s = Scheduler::new(limits(8, 512, 512));
        for id in 0..4 {
            s.push(req(id, 1000));
        }
        s.push(req(9, 0));
        s.admit();
        let mut served = [0usize; 4];
        for _ in 0..8 {
            // One decode and room for two prompt shares of 64.
            let plan = s.plan_within(129, 64);
            assert_eq!(plan.iter().map(|p| p.budget).sum::<usize>(), 129);
            assert!(plan.contains(&StepShare {
                index: 4,
                budget: 1
            }));
            for share in plan.iter().filter(|p| p.index < 4) {
                served[share.index] += 1;
                assert_eq!(share.budget, 64);
            }
        }
        assert_eq!(served, [4, 4, 4, 4], "every prompt gets its turns");
    }

    #[test]
    fn a_share_leaves_no_sliver_of_its_chunk() {
        let mut s = Scheduler::new(limits(2, 512, 512));
        s.push(req(0, 130));
        s.admit();
        // 100 or 110 of 130 would leave 30 or 20 (< 64): the share stops at 66, so the next
        // chunk is long too; with room for all of it, the share takes the whole chunk.
        assert_eq!(
            s.plan_within(100, 64),
            [StepShare {
                index: 0,
                budget: 66
            }]
        );
        assert_eq!(
            s.plan_within(110, 64),
            [StepShare {
                index: 0,
                budget: 66
            }]
        );
        assert_eq!(
            s.plan_within(130, 64),
            [StepShare {
                index: 0,
                budget: 130
            }]
        );
        // A chunk end within two floors is taken whole or not at all.
        s.running_mut()[0].prefill = 100;
        assert_eq!(
            s.plan_within(100, 64),
            [StepShare {
                index: 0,
                budget: 100
            }]
        );
    }

    #[test]
    fn wide_entries_wait_for_all_their_places() {
        #[derive(Debug)]
        struct Wide(usize);
        impl Schedulable for Wide {
            fn is_cancelled(&self) -> bool {
                false
            }
            fn prefill_remaining(&self) -> usize {
                0
            }
            fn places(&self) -> usize {
                self.0
            }
        }
        let mut s = Scheduler::new(limits(4, 8, 8));
        s.push(Wide(1));
        s.push(Wide(3));
        s.push(Wide(2));
        assert_eq!(s.admit().started, 2, "1 + 3 places fill the batch");
        assert_eq!(s.admit().started, 0, "the 2-place entry waits");
        // The 3-place entry splits into three sequences of one place: still full.
        s.running_mut()[1].0 = 1;
        s.adopt([Wide(1), Wide(1)]);
        assert_eq!(s.admit().started, 0);
        s.retire(&[0, 2]);
        assert_eq!(s.admit().started, 1);
        assert_eq!(s.running_len(), 3);
        let mut narrow = Scheduler::new(limits(2, 8, 8));
        narrow.push(Wide(5));
        assert_eq!(
            narrow.admit().started,
            1,
            "wider than the batch: runs alone"
        );
    }

    #[test]
    fn retire_keeps_the_order_of_the_rest() {
        let mut s = Scheduler::new(limits(5, 1, 5));
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
