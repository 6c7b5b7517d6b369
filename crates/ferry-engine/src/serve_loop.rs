//! The serving loop of one model's engine thread: continuous batching.
//!
//! Jobs arriving on the channel become [`Generation`]s (validated, with a fresh model sequence)
//! and wait in the [`Scheduler`]. Each iteration is one step: drop cancelled requests, admit
//! waiting ones into free places in the batch (`max_batch`), run one
//! [`LanguageModel::forward_rows`] over every scheduled sequence (one decode token each, then
//! prompt chunks within the step's token budget), sample each one's next token, and retire the
//! finished. A client that goes away is therefore dropped within one step.
//!
//! With speculation on ([`LanguageModel::speculation`]), a decoding sequence feeds the tokens
//! proposed after its last one too ([`Speculating::propose`], lengths from
//! [`crate::speculative::length`]), gets the logits after each of them from the same step, and
//! samples them in order until a sampled token differs from its proposal; the rejected
//! positions are dropped ([`LanguageModel::truncate_sequence`]) (see [`crate::speculative`]).
//!
//! A request with `n` > 1 choices enters as one entry holding `n` places: the first choice's
//! sequence prefills the prompt, and in the step that completes it the other choices split off
//! with copies of its KV cache ([`LanguageModel::fork_sequence`]), each sampling its first token
//! from the same logits. A model that cannot copy sequences gets fresh ones, which prefill the
//! prompt themselves. Every choice is a request of its own for the gauges and `pending`.
//!
//! Each step's tokens are fitted to the step time target when other sequences wait on the step
//! ([`StepPacer`]: timed steps give the device's rate), and the prefilling sequences share
//! what the decodes leave ([`Scheduler::plan_within`]), no share shorter than the chunks that
//! compute as long ones do, so pacing and sharing never change a result.
//!
//! With the model's prefix cache on ([`PrefixCache`]), a sequence joining the batch starts from
//! the cached blocks its prompt begins with, and a sequence whose prefill completes copies its
//! prompt's new blocks in. Before each step the cache shrinks to the KV room the running
//! sequences leave ([`kv_room`]), so it never holds memory a running request may need.
//!
//! Embedding requests ([`EmbedQueue`]) run between the steps, one input per iteration, each on
//! a fresh sequence of its own; the batch of running generations is untouched.
//!
//! The gauges and counters of [`Metrics`] are kept here: `waiting` and `running` move with the
//! scheduler, the `pending` count (for `max_queue`) drops when a request leaves for good, and
//! each request's [`RequestTracker`] hears of its admission, of the tokens each step feeds
//! through the model (its KV entries, for `ferry_kv_cache_usage_ratio`) and of its end, when it
//! writes the request's log line.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::time::Instant;

use ferry_metrics::{Metrics, RequestEnd, RequestTracker, TrackedRequest};

use super::embed::EmbedQueue;
use super::generate::{Generation, Outcome, Progress, Started};
use super::pacer::StepPacer;
use super::prefix_cache::{PrefixCache, PrefixCacheOptions};
use super::queue::{Job, Work};
use super::request::FinishReason;
use super::scheduler::{Schedulable, Scheduler, StepLimits, StepShare};
use super::speculative::length::{Acceptance, StepCost};
use super::speculative::{ngram, DraftAsk, Speculation, SpeculationMethod, STEADY_CATCH_UP};
use super::traits::{LanguageModel, TextCodec};
use super::worker::panic_message;
use super::EngineError;

/// What the loop shares with the handles, and its limits.
pub(super) struct LoopContext<'a> {
    /// The model's served id (for logs).
    pub name: &'a str,
    /// Incoming jobs; the loop ends when every sender is gone and nothing is left to run.
    pub jobs: &'a std_mpsc::Receiver<Work>,
    /// Requests accepted and not finished (for `max_queue`).
    pub pending: &'a AtomicUsize,
    /// Where gauges, counters and latencies go.
    pub metrics: &'a Metrics,
    /// What one step may hold.
    pub limits: StepLimits,
    /// The model's prefix cache.
    pub prefix: PrefixCacheOptions,
}

/// A request in the scheduler: its generation state and its model-side sequence.
struct Active<S> {
    generation: Box<Generation>,
    seq: S,
    /// The generation's tracker, shared with it (admission, tokens fed, the end).
    tracker: RequestTracker,
    /// The request's other choices, waiting for this one's prompt to be prefilled.
    forks: Vec<Fork>,
    /// Prompt positions computed as a prefill of the prompt alone computes them (restored
    /// ones included): up to the first prompt chunk too short to be
    /// ([`PrefixCacheOptions::exact_chunk_rows`]).
    /// Only these are offered to the prefix cache.
    exact: usize,
    /// How its speculative proposals fared (the next ones' length follows it).
    acceptance: Acceptance,
}

/// A choice that starts once its request's first choice has prefilled the prompt.
struct Fork {
    generation: Box<Generation>,
    tracker: RequestTracker,
}

impl<S> Active<S> {
    /// Every request it stands for: its own tracker, then its forks'.
    fn trackers(&self) -> impl Iterator<Item = &RequestTracker> {
        std::iter::once(&self.tracker).chain(self.forks.iter().map(|f| &f.tracker))
    }

    /// Ends the forks that never split off with `outcome` (the failure is sent to them too).
    fn end_forks(&mut self, outcome: &Outcome) {
        for fork in self.forks.drain(..) {
            let outcome = match outcome {
                Outcome::Failed(err) => fork.generation.fail(err.clone()),
                other => other.clone(),
            };
            end_request(&fork.tracker, &outcome);
        }
    }
}

impl<S> Schedulable for Active<S> {
    fn is_cancelled(&self) -> bool {
        self.generation.is_cancelled()
    }

    fn prefill_remaining(&self) -> usize {
        self.generation.prefill_remaining()
    }

    fn prefill_fed(&self) -> usize {
        self.generation.prompt_len() - self.generation.prefill_remaining()
    }

    fn places(&self) -> usize {
        1 + self.forks.len()
    }

    fn decode_tokens(&self) -> usize {
        1 + self.generation.proposed()
    }
}

/// Serves jobs until the channel closes and every accepted request is done.
pub(super) fn serve_requests<M: LanguageModel>(
    model: &mut M,
    codec: &dyn TextCodec,
    ctx: &LoopContext<'_>,
) {
    let mut scheduler = Scheduler::new(ctx.limits);
    let mut pacer = StepPacer::new(ctx.limits.step_time);
    let mut prefix = PrefixCache::from_options(&ctx.prefix).filter(|_| model.supports_blocks());
    let mut embeds = EmbedQueue::default();
    let mut speculating = Speculating::new(&*model);
    let mut open = true;
    loop {
        if scheduler.is_idle() && embeds.is_empty() {
            if !open {
                break;
            }
            match ctx.jobs.recv() {
                Ok(Work::Generate(job)) => accept(model, ctx, &mut scheduler, *job),
                Ok(Work::Embed(job)) => embeds.push(ctx, job),
                Err(_) => break,
            }
        }
        loop {
            match ctx.jobs.try_recv() {
                Ok(Work::Generate(job)) => accept(model, ctx, &mut scheduler, *job),
                Ok(Work::Embed(job)) => embeds.push(ctx, job),
                Err(std_mpsc::TryRecvError::Empty) => break,
                Err(std_mpsc::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        let admission = scheduler.admit();
        for mut active in admission.dropped_waiting {
            let places = active.places();
            end_request(&active.tracker, &Outcome::Cancelled);
            active.end_forks(&Outcome::Cancelled);
            for _ in 0..places {
                ctx.metrics.request_dequeued();
            }
            ctx.pending.fetch_sub(places, Ordering::SeqCst);
        }
        for mut active in admission.dropped_running {
            let places = active.places();
            end_request(&active.tracker, &Outcome::Cancelled);
            active.end_forks(&Outcome::Cancelled);
            for _ in 0..places {
                ctx.metrics.request_ended();
            }
            ctx.pending.fetch_sub(places, Ordering::SeqCst);
        }
        let running = scheduler.running_mut();
        let first_new = running.len() - admission.started;
        for active in &mut running[first_new..] {
            for tracker in active.trackers() {
                tracker.admitted();
                ctx.metrics.request_started();
            }
            if let Some(cache) = prefix.as_mut() {
                start_cached(&*model, ctx, cache, active);
            }
        }
        let room = kv_room(&*model, &mut scheduler, ctx.limits);
        if let Some(cache) = prefix.as_mut() {
            cache.shrink_to(room);
        }
        if scheduler.running_len() > 0 {
            let cache = prefix.as_mut().map(|cache| (cache, room));
            let pacing = (&mut pacer, ctx.prefix.exact_chunk_rows);
            speculating.propose(model, &mut scheduler);
            let done = step(model, codec, ctx.name, &mut scheduler, pacing, cache);
            if done.tokens > 0 {
                speculating.cost.observe(done.took, done.tokens);
            }
            let retired = scheduler.retire(&done.finished);
            let ended = retired.len() + done.forks_ended;
            for _ in 0..ended {
                ctx.metrics.request_ended();
            }
            ctx.pending.fetch_sub(ended, Ordering::SeqCst);
            scheduler.adopt(done.split_off);
        }
        // Between generation steps: one embedding input (the streams wait for it once).
        embeds.step(model, ctx);
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
        if let Some(cache) = &prefix {
            ctx.metrics
                .set_prefix_cache_tokens(ctx.name, cache.tokens_held());
        }
    }
}

/// Starts a sequence that just joined the batch from the cached blocks its prompt begins with
/// (its first choice's; the others copy it), counting the lookup.
fn start_cached<M: LanguageModel>(
    model: &M,
    ctx: &LoopContext<'_>,
    cache: &mut PrefixCache<M::Block>,
    active: &mut Active<M::Sequence>,
) {
    let chunk = ctx.limits.prefill_chunk;
    let restored = cache.restore(
        model,
        &mut active.seq,
        (
            active.generation.cache_partition(),
            active.generation.prompt(),
        ),
        chunk,
    );
    active.generation.start_cached(restored);
    active.tracker.fed(restored);
    ctx.metrics
        .prefix_cache_lookup(ctx.name, active.generation.prompt_len(), restored);
}

/// KV positions the prefix cache may hold: the model's KV budget (`max_batch x max_context`
/// positions, what the plan reserved) less the most every running sequence, and every choice
/// waiting to split off one, may grow to.
fn kv_room<M: LanguageModel>(
    model: &M,
    scheduler: &mut Scheduler<Active<M::Sequence>>,
    limits: StepLimits,
) -> usize {
    let max_context = model.max_context();
    let budget = limits.max_batch.max(1).saturating_mul(max_context);
    let reserved: usize = scheduler
        .running_mut()
        .iter()
        .map(|a| a.places() * model.kv_reserve(a.generation.max_len().min(max_context)))
        .sum();
    budget.saturating_sub(reserved)
}

/// Turns a job into a waiting sequence (with its other choices as forks), or ends it at once
/// (invalid, cancelled, nothing to do).
fn accept<M: LanguageModel>(
    model: &M,
    ctx: &LoopContext<'_>,
    scheduler: &mut Scheduler<Active<M::Sequence>>,
    job: Job,
) {
    let channels = std::iter::once(job.events).chain(job.forks);
    let mut started = Vec::new();
    for (index, events) in channels.enumerate() {
        let tracker = RequestTracker::new(
            ctx.metrics,
            TrackedRequest {
                model: ctx.name.to_owned(),
                accepted: job.accepted,
                prompt_tokens: job.request.prompt.len(),
                context: job.context.clone(),
            },
        );
        let outcome = Generation::start(
            &job.request.for_choice(index),
            model.max_context(),
            model.vocab_size(),
            events,
            tracker.clone(),
        );
        match outcome {
            Started::Running(generation) => started.push(Fork {
                generation,
                tracker,
            }),
            Started::Ended(outcome) => {
                end_request(&tracker, &outcome);
                ctx.metrics.request_dequeued();
                ctx.pending.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
    let mut choices = started.into_iter();
    if let Some(first) = choices.next() {
        scheduler.push(Active {
            generation: first.generation,
            seq: model.new_sequence(),
            tracker: first.tracker,
            forks: choices.collect(),
            exact: usize::MAX,
            acceptance: Acceptance::default(),
        });
    }
}

/// What one step did besides sampling.
struct StepDone<S> {
    /// Running indices of the sequences that ended.
    finished: Vec<usize>,
    /// Choices split off their first choice this step, to join the running set.
    split_off: Vec<Active<S>>,
    /// Choices split off this step that ended at once (their first token ended them).
    forks_ended: usize,
    /// The forward pass's time and tokens (for speculation's cost model).
    took: std::time::Duration,
    tokens: usize,
}

/// The shares of the next step: its tokens fitted to the time target by `pacer` when the step
/// is shared (several sequences run, or requests wait), no prompt share under `floor` rows
/// (the chunks that compute as long ones do, [`PrefixCacheOptions::exact_chunk_rows`]).
fn plan_step<S>(
    scheduler: &mut Scheduler<Active<S>>,
    pacer: &StepPacer,
    floor: usize,
) -> Vec<StepShare> {
    let shared = scheduler.running_len() > 1 || scheduler.waiting_len() > 0;
    let least = scheduler.decoding_tokens() + floor;
    let tokens = pacer.budget(shared, least, scheduler.limits().max_step_tokens);
    scheduler.plan_within(tokens, floor)
}

/// One batched forward step over the scheduled sequences (timed for the pacer): samples each
/// one whose prompt is complete (a speculating one from the logits after each of its proposed
/// tokens, forgetting the positions it rejected), and splits off the other choices of a request
/// whose prompt it completed.
fn step<M: LanguageModel>(
    model: &mut M,
    codec: &dyn TextCodec,
    name: &str,
    scheduler: &mut Scheduler<Active<M::Sequence>>,
    (pacer, floor): (&mut StepPacer, usize),
    mut prefix: Option<(&mut PrefixCache<M::Block>, usize)>,
) -> StepDone<M::Sequence> {
    let plan = plan_step(scheduler, pacer, floor);
    let exact_rows = prefix.as_ref().map_or(0, |(c, _)| c.exact_chunk_rows());
    let running = scheduler.running_mut();
    let inputs: Vec<Vec<u32>> = plan
        .iter()
        .map(|share| running[share.index].generation.input(share.budget).to_vec())
        .collect();
    // A decoding sequence wants the logits after each of its tokens (its proposals'
    // verification), a prefilling one after its chunk's last.
    let outputs: Vec<usize> = plan
        .iter()
        .zip(&inputs)
        .map(
            |(share, input)| match running[share.index].generation.prefill_remaining() {
                0 => input.len(),
                _ => 1,
            },
        )
        .collect();
    let tokens = inputs.iter().map(Vec::len).sum();
    let started = Instant::now();
    let result = {
        let mut members = plan.iter().peekable();
        let mut batch: Vec<(&mut M::Sequence, &[u32])> = Vec::with_capacity(plan.len());
        for (index, active) in running.iter_mut().enumerate() {
            if members.next_if(|share| share.index == index).is_some() {
                batch.push((&mut active.seq, &inputs[batch.len()]));
            }
        }
        let result = catch_unwind(AssertUnwindSafe(|| {
            model.forward_rows(&mut batch, &outputs)
        }));
        pacer.observe(started.elapsed(), tokens);
        result
    };
    let took = started.elapsed();
    let wanted: usize = outputs.iter().sum();
    let mut logits = match result {
        Ok(Ok(rows)) if rows.len() == wanted => rows.into_iter(),
        Ok(Ok(rows)) => {
            let message = format!(
                "the model returned {} rows for {} sequences wanting {wanted}",
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
    let mut done = StepDone {
        finished: Vec::new(),
        split_off: Vec::new(),
        forks_ended: 0,
        took,
        tokens,
    };
    for ((share, input), &wanted) in plan.iter().zip(&inputs).zip(&outputs) {
        let rows: Vec<Vec<f32>> = logits.by_ref().take(wanted).collect();
        let active = &mut running[share.index];
        active.tracker.fed(input.len());
        let prefilling = active.generation.prefill_remaining() > 0;
        if prefilling && input.len() < exact_rows {
            let start = active.generation.prompt_len() - active.generation.prefill_remaining();
            active.exact = active.exact.min(start);
        }
        if !active.generation.fed(input.len()) {
            continue;
        }
        if !prefilling {
            if let Some(outcome) = verify(&*model, active, rows, codec) {
                end_request(&active.tracker, &outcome);
                done.finished.push(share.index);
            }
            continue;
        }
        let row = rows.into_iter().next().unwrap_or_default();
        if let (true, Some((cache, room))) = (prefilling, prefix.as_mut()) {
            let prompt = active.generation.prompt();
            let exact = &prompt[..active.exact.min(prompt.len())];
            let partition = active.generation.cache_partition();
            cache.remember(&*model, &active.seq, (partition, exact), *room);
        }
        for fork in std::mem::take(&mut active.forks) {
            let prefilled = (&active.seq, active.generation.cached());
            split_off(&*model, codec, prefilled, fork, &row, &mut done);
        }
        if let Some(outcome) = sample(&mut active.generation, vec![row], codec) {
            end_request(&active.tracker, &outcome);
            done.finished.push(share.index);
        }
    }
    done
}

/// A decode step's sampling: from the logits after the last token and after each proposed
/// one (`rows`), until the first sampled token that differs from its proposal. The positions
/// after the last accepted proposal are forgotten (the sequence then holds every emitted token
/// but the last, as after a plain decode step). The outcome if that ended the request.
fn verify<M: LanguageModel>(
    model: &M,
    active: &mut Active<M::Sequence>,
    rows: Vec<Vec<f32>>,
    codec: &dyn TextCodec,
) -> Option<Outcome> {
    let proposed = active.generation.proposed();
    let generation = &mut active.generation;
    let (progress, accepted) = catch_unwind(AssertUnwindSafe(|| generation.advance(rows, codec)))
        .unwrap_or_else(|panic| {
            let message = panic_message(&*panic);
            let failed = generation.fail(EngineError::Internal(format!(
                "sampling panicked: {message}"
            )));
            (Progress::Done(failed), 0)
        });
    active.acceptance.observe(proposed, accepted);
    if let Progress::Done(outcome) = progress {
        return Some(outcome);
    }
    if accepted < proposed {
        let keep = active.generation.positions();
        let truncated = catch_unwind(AssertUnwindSafe(|| {
            model.truncate_sequence(&mut active.seq, keep)
        }))
        .unwrap_or_else(|panic| {
            Err(EngineError::Internal(format!(
                "forgetting rejected positions panicked: {}",
                panic_message(&*panic)
            )))
        });
        if let Err(err) = truncated {
            return Some(active.generation.fail(err));
        }
        active.tracker.unfed(proposed - accepted);
    }
    None
}

/// Speculative decoding in one model's loop: the model's method and the cost of its steps,
/// which with each sequence's acceptance sets how many tokens it proposes
/// ([`crate::speculative::length`]).
struct Speculating {
    speculation: Speculation,
    cost: StepCost,
}

impl Speculating {
    /// The model's speculation, off when it cannot forget positions.
    fn new<M: LanguageModel>(model: &M) -> Self {
        let speculation = if model.supports_truncate() {
            model.speculation()
        } else {
            Speculation::default()
        };
        Self {
            speculation,
            cost: StepCost::default(),
        }
    }

    /// Sets the proposals of every decoding sequence for the next step, their lengths chosen
    /// per sequence and their total within what the step's token budget leaves. A draft model
    /// that fails proposes nothing this step (logged); the step goes on without.
    fn propose<M: LanguageModel>(
        &mut self,
        model: &mut M,
        scheduler: &mut Scheduler<Active<M::Sequence>>,
    ) {
        let max = self.speculation.max_proposals();
        if max == 0 {
            return;
        }
        let step_tokens = scheduler.limits().max_step_tokens;
        let running = scheduler.running_mut();
        let decoding = running
            .iter()
            .filter(|a| a.generation.prefill_remaining() == 0)
            .count();
        let mut left = step_tokens.saturating_sub(decoding);
        let mut lengths = Vec::with_capacity(running.len());
        for active in running.iter() {
            let room = active.generation.proposal_room().min(left);
            let k = match active.generation.prefill_remaining() {
                0 => active
                    .acceptance
                    .length(&self.cost, decoding, max.min(room)),
                _ => 0,
            };
            left -= k;
            lengths.push(k);
        }
        match self.speculation.method {
            SpeculationMethod::Off => {}
            SpeculationMethod::Ngram => {
                for (active, &k) in running.iter_mut().zip(&lengths) {
                    if k > 0 {
                        let tokens = ngram::propose(&active.generation.context(), k);
                        active.generation.propose(&tokens);
                    }
                }
            }
            SpeculationMethod::Draft => {
                let contexts: Vec<Vec<u32>> = running
                    .iter()
                    .zip(&lengths)
                    .filter(|(_, &k)| k > 0)
                    .map(|(a, _)| a.generation.context())
                    .collect();
                if contexts.is_empty() {
                    return;
                }
                let mut batch: Vec<(&mut M::Sequence, DraftAsk)> = running
                    .iter_mut()
                    .zip(&lengths)
                    .filter(|(_, &k)| k > 0)
                    .zip(&contexts)
                    .map(|((a, &k), context)| {
                        let draws = a.generation.draft_draws(k);
                        let ask = DraftAsk {
                            context: context.as_slice(),
                            max: k,
                            draws,
                        };
                        (&mut a.seq, ask)
                    })
                    .collect();
                let started = Instant::now();
                let proposed = catch_unwind(AssertUnwindSafe(|| model.propose(&mut batch)))
                    .unwrap_or_else(|panic| {
                        Err(EngineError::Internal(format!(
                            "the draft model panicked: {}",
                            panic_message(&*panic)
                        )))
                    });
                drop(batch);
                let proposals = match proposed {
                    Ok(p) if p.len() == contexts.len() => p,
                    Ok(p) => {
                        tracing::warn!(
                            proposals = p.len(),
                            sequences = contexts.len(),
                            "the draft model answered for another number of sequences"
                        );
                        return;
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "the draft model failed; no proposals this step");
                        return;
                    }
                };
                let total: usize = proposals.iter().map(|p| p.tokens.len()).sum();
                if proposals.iter().all(|p| p.caught_up <= STEADY_CATCH_UP) {
                    self.cost.observe_draft(started.elapsed(), total);
                }
                let speculating = running.iter_mut().zip(&lengths).filter(|(_, &k)| k > 0);
                for ((active, _), proposal) in speculating.zip(proposals) {
                    active
                        .generation
                        .propose_drawn(&proposal.tokens, proposal.q);
                }
            }
        }
    }
}

/// Starts `fork` from a copy of `prefilled` (the sequence of its request's first choice, whose
/// prompt just completed) and samples its first token from the same `logits`; without a copy,
/// it starts from a fresh sequence and prefills the prompt itself.
fn split_off<M: LanguageModel>(
    model: &M,
    codec: &dyn TextCodec,
    (prefilled, cached): (&M::Sequence, Option<usize>),
    mut fork: Fork,
    logits: &[f32],
    done: &mut StepDone<M::Sequence>,
) {
    let copied =
        catch_unwind(AssertUnwindSafe(|| model.fork_sequence(prefilled))).unwrap_or_else(|panic| {
            Err(EngineError::Internal(format!(
                "copying a sequence panicked: {}",
                panic_message(&*panic)
            )))
        });
    let outcome = match copied {
        Ok(None) => None,
        Ok(Some(seq)) => {
            fork.generation.skip_prefill(cached);
            fork.tracker.fed(fork.generation.prompt_len());
            match sample(&mut fork.generation, vec![logits.to_vec()], codec) {
                None => {
                    done.split_off.push(Active {
                        generation: fork.generation,
                        seq,
                        tracker: fork.tracker,
                        forks: Vec::new(),
                        exact: usize::MAX,
                        acceptance: Acceptance::default(),
                    });
                    return;
                }
                ended => ended,
            }
        }
        Err(err) => Some(fork.generation.fail(err)),
    };
    match outcome {
        Some(outcome) => {
            end_request(&fork.tracker, &outcome);
            done.forks_ended += 1;
        }
        None => done.split_off.push(Active {
            generation: fork.generation,
            seq: model.new_sequence(),
            tracker: fork.tracker,
            forks: Vec::new(),
            exact: usize::MAX,
            acceptance: Acceptance::default(),
        }),
    }
}

/// Samples `generation`'s next token from `logits` (one row); the outcome if that ended it.
fn sample(
    generation: &mut Generation,
    logits: Vec<Vec<f32>>,
    codec: &dyn TextCodec,
) -> Option<Outcome> {
    let progress = catch_unwind(AssertUnwindSafe(|| generation.advance(logits, codec).0))
        .unwrap_or_else(|panic| {
            let message = panic_message(&*panic);
            Progress::Done(generation.fail(EngineError::Internal(format!(
                "sampling panicked: {message}"
            ))))
        });
    match progress {
        Progress::Continue => None,
        Progress::Done(outcome) => Some(outcome),
    }
}

/// Fails every sequence of the step with `err`, the choices still waiting on them too.
fn fail_all<S>(
    name: &str,
    running: &mut [Active<S>],
    plan: &[StepShare],
    err: EngineError,
) -> StepDone<S> {
    tracing::debug!(model = name, error = %err, "step failed");
    let mut forks_ended = 0;
    for share in plan {
        let active = &mut running[share.index];
        end_request(&active.tracker, &active.generation.fail(err.clone()));
        forks_ended += active.forks.len();
        active.end_forks(&Outcome::Failed(err.clone()));
    }
    StepDone {
        finished: plan.iter().map(|share| share.index).collect(),
        split_off: Vec::new(),
        forks_ended,
        took: std::time::Duration::ZERO,
        tokens: 0,
    }
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

#[cfg(test)]
#[path = "serve_loop_tests.rs"]
mod tests;
