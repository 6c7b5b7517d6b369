//! The serving loop of one model's engine thread: continuous batching.
//!
//! Jobs arriving on the channel become [`Generation`]s (validated, with a fresh model sequence)
//! and wait in the [`Scheduler`]. Each iteration is one step: drop cancelled requests, admit
//! waiting ones into free slots (`max_batch`), run one [`LanguageModel::forward_batch`] over
//! every scheduled sequence (a prompt chunk or one decode token each), sample each one's next
//! token, and retire the finished. A client that goes away is therefore dropped within one step.
//!
//! The gauges and counters of [`Metrics`] are kept here: `waiting` and `running` move with the
//! scheduler, the `pending` count (for `max_queue`) drops when a request leaves for good.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;

use crate::metrics::{Metrics, RequestTracker};

use super::generate::{Generation, Outcome, Progress, Started};
use super::queue::Job;
use super::scheduler::{Schedulable, Scheduler, Slot};
use super::traits::{LanguageModel, TextCodec};
use super::worker::panic_message;
use super::EngineError;

/// What the loop shares with the handles, and its limits.
pub(super) struct LoopContext<'a> {
    /// The model's served id (for logs).
    pub name: &'a str,
    /// Incoming jobs; the loop ends when every sender is gone and nothing is left to run.
    pub jobs: &'a std_mpsc::Receiver<Job>,
    /// Requests accepted and not finished (for `max_queue`).
    pub pending: &'a AtomicUsize,
    /// Where gauges, counters and latencies go.
    pub metrics: &'a Metrics,
    /// Most sequences per step.
    pub max_batch: usize,
    /// Prompt tokens per step shared by prefilling sequences.
    pub prefill_chunk: usize,
}

/// A request in the scheduler: its generation state and its model-side sequence.
struct Active<S> {
    generation: Box<Generation>,
    seq: S,
}

impl<S> Schedulable for Active<S> {
    fn is_cancelled(&self) -> bool {
        self.generation.is_cancelled()
    }

    fn prefill_remaining(&self) -> usize {
        self.generation.prefill_remaining()
    }
}

/// Serves jobs until the channel closes and every accepted request is done.
pub(super) fn serve_requests<M: LanguageModel>(
    model: &mut M,
    codec: &dyn TextCodec,
    ctx: &LoopContext<'_>,
) {
    let mut scheduler = Scheduler::new(ctx.max_batch, ctx.prefill_chunk);
    let mut open = true;
    loop {
        if scheduler.is_idle() {
            if !open {
                break;
            }
            match ctx.jobs.recv() {
                Ok(job) => accept(model, ctx, &mut scheduler, job),
                Err(_) => break,
            }
        }
        loop {
            match ctx.jobs.try_recv() {
                Ok(job) => accept(model, ctx, &mut scheduler, job),
                Err(std_mpsc::TryRecvError::Empty) => break,
                Err(std_mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let admission = scheduler.admit();
        for _ in &admission.dropped_waiting {
            ctx.metrics.request_dequeued();
            ctx.pending.fetch_sub(1, Ordering::SeqCst);
        }
        for _ in &admission.dropped_running {
            tracing::debug!(model = ctx.name, "generation cancelled");
            ctx.metrics.request_ended();
            ctx.pending.fetch_sub(1, Ordering::SeqCst);
        }
        for _ in 0..admission.started {
            ctx.metrics.request_started();
        }
        if scheduler.running_len() == 0 {
            continue;
        }
        let finished = step(model, codec, ctx.name, &mut scheduler);
        for _ in scheduler.retire(&finished) {
            ctx.metrics.request_ended();
            ctx.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Turns a job into a waiting sequence, or ends it at once (invalid, cancelled, nothing to do).
fn accept<M: LanguageModel>(
    model: &M,
    ctx: &LoopContext<'_>,
    scheduler: &mut Scheduler<Active<M::Sequence>>,
    job: Job,
) {
    let tracker = RequestTracker::new(ctx.metrics, job.accepted);
    let started = Generation::start(
        &job.request,
        model.max_context(),
        model.vocab_size(),
        job.events,
        tracker,
    );
    match started {
        Started::Running(generation) => scheduler.push(Active {
            generation,
            seq: model.new_sequence(),
        }),
        Started::Ended(outcome) => {
            log_outcome(ctx.name, &outcome);
            ctx.metrics.request_dequeued();
            ctx.pending.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// One batched forward step over the scheduled sequences; returns the running indices of the
/// sequences that ended.
fn step<M: LanguageModel>(
    model: &mut M,
    codec: &dyn TextCodec,
    name: &str,
    scheduler: &mut Scheduler<Active<M::Sequence>>,
) -> Vec<usize> {
    let plan = scheduler.plan();
    let running = scheduler.running_mut();
    let inputs: Vec<Vec<u32>> = plan
        .iter()
        .map(|slot| running[slot.index].generation.input(slot.budget).to_vec())
        .collect();
    let result = {
        let mut members = plan.iter().peekable();
        let mut batch: Vec<(&mut M::Sequence, &[u32])> = Vec::with_capacity(plan.len());
        for (index, active) in running.iter_mut().enumerate() {
            if members.next_if(|slot| slot.index == index).is_some() {
                batch.push((&mut active.seq, &inputs[batch.len()]));
            }
        }
        catch_unwind(AssertUnwindSafe(|| model.forward_batch(&mut batch)))
    };
    let logits = match result {
        Ok(Ok(rows)) if rows.len() == plan.len() => rows,
        Ok(Ok(rows)) => {
            let message = format!(
                "the model returned {} rows for {} sequences",
                rows.len(),
                plan.len()
            );
            return fail_all(name, running, &plan, EngineError::Internal(message));
        }
        Ok(Err(e)) => return fail_all(name, running, &plan, e),
        Err(panic) => {
            let message = panic_message(&*panic);
            tracing::error!(model = name, panic = %message, "the model panicked during a step");
            let err = EngineError::Internal(format!("the model panicked: {message}"));
            return fail_all(name, running, &plan, err);
        }
    };
    let mut finished = Vec::new();
    for ((slot, row), input) in plan.iter().zip(logits).zip(&inputs) {
        let generation = &mut running[slot.index].generation;
        if !generation.fed(input.len()) {
            continue;
        }
        let progress = catch_unwind(AssertUnwindSafe(|| generation.advance(row, codec)))
            .unwrap_or_else(|panic| {
                let message = panic_message(&*panic);
                Progress::Done(generation.fail(EngineError::Internal(format!(
                    "sampling panicked: {message}"
                ))))
            });
        if let Progress::Done(outcome) = progress {
            log_outcome(name, &outcome);
            finished.push(slot.index);
        }
    }
    finished
}

/// Fails every sequence of the step with `err`; returns their running indices.
fn fail_all<S>(name: &str, running: &[Active<S>], plan: &[Slot], err: EngineError) -> Vec<usize> {
    for slot in plan {
        let outcome = running[slot.index].generation.fail(err.clone());
        log_outcome(name, &outcome);
    }
    plan.iter().map(|slot| slot.index).collect()
}

fn log_outcome(name: &str, outcome: &Outcome) {
    match outcome {
        Outcome::Failed(e) => tracing::warn!(model = name, error = %e, "generation failed"),
        Outcome::Cancelled => tracing::debug!(model = name, "generation cancelled"),
        Outcome::Finished(reason, usage) => {
            tracing::debug!(model = name, ?reason, ?usage, "generation finished")
        }
    }
}
