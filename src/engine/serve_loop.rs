//! The serving loop of one model's engine thread: continuous batching.
//!
//! Jobs arriving on the channel become [`Generation`]s (validated, with a fresh model sequence)
//! and wait in the [`Scheduler`]. Each iteration is one step: drop cancelled requests, admit
//! waiting ones into free places in the batch (`max_batch`), run one
//! [`LanguageModel::forward_batch`] over every scheduled sequence (one decode token each, then
//! prompt chunks within the step's token budget), sample each one's next token, and retire the
//! finished. A client that goes away is therefore dropped within one step.
//!
//! The gauges and counters of [`Metrics`] are kept here: `waiting` and `running` move with the
//! scheduler, the `pending` count (for `max_queue`) drops when a request leaves for good, and
//! each request's [`RequestTracker`] hears of its admission, of the tokens each step feeds
//! through the model (its KV entries, for `ferry_kv_cache_usage_ratio`) and of its end, when it
//! writes the request's log line.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;

use crate::metrics::{Metrics, RequestEnd, RequestTracker, TrackedRequest};

use super::generate::{Generation, Outcome, Progress, Started};
use super::queue::Job;
use super::request::FinishReason;
use super::scheduler::{Schedulable, Scheduler, StepLimits, StepShare};
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
    /// What one step may hold.
    pub limits: StepLimits,
}

/// A request in the scheduler: its generation state and its model-side sequence.
struct Active<S> {
    generation: Box<Generation>,
    seq: S,
    /// The generation's tracker, shared with it (admission, tokens fed, the end).
    tracker: RequestTracker,
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
    let mut scheduler = Scheduler::new(ctx.limits);
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
        for active in &admission.dropped_waiting {
            end_request(&active.tracker, &Outcome::Cancelled);
            ctx.metrics.request_dequeued();
            ctx.pending.fetch_sub(1, Ordering::SeqCst);
        }
        for active in &admission.dropped_running {
            end_request(&active.tracker, &Outcome::Cancelled);
            ctx.metrics.request_ended();
            ctx.pending.fetch_sub(1, Ordering::SeqCst);
        }
        let running = scheduler.running_mut();
        for active in &running[running.len() - admission.started..] {
            active.tracker.admitted();
            ctx.metrics.request_started();
        }
        if scheduler.running_len() > 0 {
            let finished = step(model, codec, ctx.name, &mut scheduler);
            for _ in scheduler.retire(&finished) {
                ctx.metrics.request_ended();
                ctx.pending.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let kv_tokens = scheduler
            .running_mut()
            .iter()
            .map(|a| a.tracker.kv_tokens())
            .sum();
        let kv_capacity = ctx
            .limits
            .max_batch
            .max(1)
            .saturating_mul(model.max_context());
        ctx.metrics.set_kv_usage(ctx.name, kv_tokens, kv_capacity);
    }
}

/// Turns a job into a waiting sequence, or ends it at once (invalid, cancelled, nothing to do).
fn accept<M: LanguageModel>(
    model: &M,
    ctx: &LoopContext<'_>,
    scheduler: &mut Scheduler<Active<M::Sequence>>,
    job: Job,
) {
    let tracker = RequestTracker::new(
        ctx.metrics,
        TrackedRequest {
            model: ctx.name.to_owned(),
            accepted: job.accepted,
            prompt_tokens: job.request.prompt.len(),
            context: job.context,
        },
    );
    let started = Generation::start(
        &job.request,
        model.max_context(),
        model.vocab_size(),
        job.events,
        tracker.clone(),
    );
    match started {
        Started::Running(generation) => scheduler.push(Active {
            generation,
            seq: model.new_sequence(),
            tracker,
        }),
        Started::Ended(outcome) => {
            end_request(&tracker, &outcome);
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
        .map(|share| running[share.index].generation.input(share.budget).to_vec())
        .collect();
    let result = {
        let mut members = plan.iter().peekable();
        let mut batch: Vec<(&mut M::Sequence, &[u32])> = Vec::with_capacity(plan.len());
        for (index, active) in running.iter_mut().enumerate() {
            if members.next_if(|share| share.index == index).is_some() {
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
    for ((share, row), input) in plan.iter().zip(logits).zip(&inputs) {
        let active = &mut running[share.index];
        active.tracker.fed(input.len());
        let generation = &mut active.generation;
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
            end_request(&active.tracker, &outcome);
            finished.push(share.index);
        }
    }
    finished
}

/// Fails every sequence of the step with `err`; returns their running indices.
fn fail_all<S>(
    name: &str,
    running: &[Active<S>],
    plan: &[StepShare],
    err: EngineError,
) -> Vec<usize> {
    tracing::debug!(model = name, error = %err, "step failed");
    for share in plan {
        let active = &running[share.index];
        end_request(&active.tracker, &active.generation.fail(err.clone()));
    }
    plan.iter().map(|share| share.index).collect()
}

/// Ends `tracker`'s request with `outcome` (which writes the request's log line).
fn end_request(tracker: &RequestTracker, outcome: &Outcome) {
    match outcome {
        Outcome::Failed(e) => tracker.end(RequestEnd::Failed {
            error: &e.to_string(),
        }),
        Outcome::Cancelled => tracker.end(RequestEnd::Cancelled),
        Outcome::Finished(reason, _) => tracker.end(RequestEnd::Finished {
            reason: match reason {
                FinishReason::Stop => "stop",
                FinishReason::Length => "length",
            },
        }),
    }
}
