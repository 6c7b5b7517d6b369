//! One generation request's life, as the logs and the metrics see it.
//!
//! - [`RequestContext`]: what the HTTP layer knows about a request (its `x-request-id`), carried
//!   to the engine in a tokio task-local, so no API between them changes: the request-id
//!   middleware runs the handler inside [`RequestContext::scope`], and the engine's `submit`
//!   picks it up with [`RequestContext::current`].
//! - [`RequestTracker`]: created when the engine accepts a request, shared (a cheap `Clone`)
//!   by the generation state machine (prefill, every sampled token) and the serving loop
//!   (admission into the batch, tokens fed through the model, the end). It feeds the token
//!   counters, the latency histograms and the KV usage, and at the end writes the request's
//!   one log line:
//!
//! ```text
//! INFO ferry::metrics::tracker: request finished request_id=7f3a.. model=smollm2 prompt_tokens=6
//!      completion_tokens=8 queue_ms=0.1 ttft_ms=42.5 e2e_ms=180.2 tok_s=56.3 status=finished
//!      finish_reason=length
//! ```
//!
//! A chat request offered tools adds `tool_calls=N`, and its `finish_reason` is the API's
//! (`tool_calls` when the reply called tools). A request whose decode steps speculated adds
//! `spec_drafted=N spec_accepted=M spec_acceptance=R` (tokens proposed, accepted, and M / N).
//!
//! A failed request logs the same line at WARN with `status=failed` and its `error`.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::Metrics;

tokio::task_local! {
    static CURRENT: RequestContext;
}

/// A request's identity across the HTTP layer and the engine. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RequestContext {
    id: Arc<str>,
    /// Set when the engine thread takes the request (it will write the request's line), so the
    /// HTTP layer does not write a second one. Set before the engine sends any event for the
    /// request, so a handler that has an answer from the engine sees it set. An atomic: set on
    /// an engine thread, read on a task.
    engine_took_it: Arc<AtomicBool>,
}

impl RequestContext {
    /// A context for the request `id`.
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        Self {
            id: id.into(),
            engine_took_it: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The request id (`x-request-id`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Runs `work` with this context as [`RequestContext::current`].
    pub async fn scope<F: Future>(self, work: F) -> F::Output {
        CURRENT.scope(self, work).await
    }

    /// The context of the request being handled on this task, if any.
    pub fn current() -> Option<Self> {
        CURRENT.try_with(Clone::clone).ok()
    }

    /// Whether the request reached an engine thread, which logs its line when it ends.
    pub fn reached_engine(&self) -> bool {
        self.engine_took_it.load(Ordering::Acquire)
    }
}

/// What the engine knows about a request when it accepts it.
#[derive(Debug, Clone)]
pub struct TrackedRequest {
    /// The served model id.
    pub model: String,
    /// When `submit` accepted it (the start of its queue wait, TTFT and end-to-end latency).
    pub accepted: Instant,
    /// Tokens in its prompt.
    pub prompt_tokens: usize,
    /// Its identity from the HTTP layer (`None` outside a request: `ferry generate`, benches).
    pub context: Option<RequestContext>,
}

/// How a request ended, for its log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestEnd<'a> {
    /// Generation ended normally; `reason` is OpenAI's `finish_reason` (`stop`, `length`).
    Finished {
        /// The finish reason.
        reason: &'a str,
    },
    /// Generation failed.
    Failed {
        /// Why (the error's message).
        error: &'a str,
    },
    /// The client went away first.
    Cancelled,
}

#[derive(Debug, Default)]
struct Progress {
    admitted: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    generated: usize,
    /// Tokens fed through the model: the entries this request holds in its KV cache.
    fed: usize,
    /// With tools offered, the calls the reply made (the chat API then answers `tool_calls`).
    tool_calls: Option<usize>,
    /// Speculative decoding: tokens proposed and accepted, once it proposed any.
    speculated: Option<(usize, usize)>,
    ended: bool,
}

#[derive(Debug)]
struct Tracked {
    metrics: Metrics,
    request: TrackedRequest,
    /// Touched a few times per token by the engine thread that owns the request: uncontended.
    progress: Mutex<Progress>,
}

/// Per-request bookkeeping on the engine thread (see the module docs). A detached tracker
/// ([`RequestTracker::detached`]) records and logs nothing.
#[derive(Debug, Clone)]
pub struct RequestTracker {
    tracked: Option<Arc<Tracked>>,
}

impl RequestTracker {
    /// Tracks `request` into `metrics` (the engine thread calls it as it takes the request).
    pub fn new(metrics: &Metrics, request: TrackedRequest) -> Self {
        if let Some(context) = &request.context {
            context.engine_took_it.store(true, Ordering::Release);
        }
        Self {
            tracked: Some(Arc::new(Tracked {
                metrics: metrics.clone(),
                request,
                progress: Mutex::new(Progress::default()),
            })),
        }
    }

    /// A tracker that records nothing (unit tests, one-off generation).
    pub fn detached() -> Self {
        Self { tracked: None }
    }

    fn with<R>(&self, f: impl FnOnce(&Tracked, &mut Progress) -> R) -> Option<R> {
        let tracked = self.tracked.as_deref()?;
        let mut progress = tracked
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Some(f(tracked, &mut progress))
    }

    /// The request joined the running batch (the end of its queue wait).
    pub fn admitted(&self) {
        self.with(|t, p| {
            let now = Instant::now();
            p.admitted.get_or_insert(now);
            t.metrics
                .observe_queue_time(now.saturating_duration_since(t.request.accepted));
        });
    }

    /// `n` of its tokens went through the model in a step.
    pub fn fed(&self, n: usize) {
        self.with(|_, p| p.fed += n);
    }

    /// The model forgot `n` of the tokens fed (speculative proposals it rejected).
    pub fn unfed(&self, n: usize) {
        self.with(|_, p| p.fed = p.fed.saturating_sub(n));
    }

    /// A speculative step proposed `drafted` tokens, of which the model accepted `accepted`.
    pub fn speculated(&self, drafted: usize, accepted: usize) {
        self.with(|t, p| {
            t.metrics.speculated(&t.request.model, drafted, accepted);
            let (d, a) = p.speculated.get_or_insert((0, 0));
            *d += drafted;
            *a += accepted;
        });
    }

    /// Tokens this request holds in its KV cache (0 for a detached tracker).
    pub fn kv_tokens(&self) -> usize {
        self.with(|_, p| p.fed).unwrap_or(0)
    }

    /// The prompt (`n` tokens) went through the model.
    pub fn prefilled(&mut self, n: usize) {
        self.with(|t, _| t.metrics.add_model_prompt_tokens(&t.request.model, n));
    }

    /// One token was sampled.
    pub fn token(&mut self) {
        self.with(|t, p| {
            let now = Instant::now();
            t.metrics.add_model_generated_tokens(&t.request.model, 1);
            match p.last_token {
                None => t
                    .metrics
                    .observe_time_to_first_token(now.saturating_duration_since(t.request.accepted)),
                Some(last) => t
                    .metrics
                    .observe_inter_token_latency(now.saturating_duration_since(last)),
            }
            p.first_token.get_or_insert(now);
            p.last_token = Some(now);
            p.generated += 1;
        });
    }

    /// The reply, read for the tools the request offered, made `n` calls.
    pub fn tool_calls(&self, n: usize) {
        self.with(|_, p| p.tool_calls = Some(n));
    }

    /// The request ended: records its end-to-end latency (finished requests only) and writes
    /// its log line. Only the first call has an effect.
    pub fn end(&self, end: RequestEnd<'_>) {
        self.with(|t, p| {
            if std::mem::replace(&mut p.ended, true) {
                return;
            }
            let now = Instant::now();
            let e2e = now.saturating_duration_since(t.request.accepted);
            if let RequestEnd::Finished { .. } = end {
                t.metrics.observe_request_duration(&t.request.model, e2e);
            }
            log_line(&t.request, p, e2e, end);
        });
    }
}

fn millis(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

/// Decode speed: tokens after the first over the time since the first.
fn decode_rate(p: &Progress) -> f64 {
    match (p.first_token, p.last_token) {
        (Some(first), Some(last)) if p.generated > 1 && last > first => {
            let rate = (p.generated - 1) as f64 / (last - first).as_secs_f64();
            (rate * 10.0).round() / 10.0
        }
        _ => 0.0,
    }
}

/// Accepted over proposed tokens, two decimals.
fn acceptance(drafted: usize, accepted: usize) -> f64 {
    if drafted == 0 {
        return 0.0;
    }
    (accepted as f64 / drafted as f64 * 100.0).round() / 100.0
}

fn log_line(request: &TrackedRequest, p: &Progress, e2e: Duration, end: RequestEnd<'_>) {
    let request_id = request.context.as_ref().map_or("-", RequestContext::id);
    let queue_ms = p
        .admitted
        .map_or(f64::NAN, |at| millis(at - request.accepted));
    let ttft_ms = p
        .first_token
        .map_or(f64::NAN, |at| millis(at - request.accepted));
    let (status, finish_reason, error) = match end {
        // As the chat API answers (`ChatFinishReason::of`): a stop after calls is `tool_calls`.
        RequestEnd::Finished { reason: "stop" } if p.tool_calls.is_some_and(|n| n > 0) => {
            ("finished", "tool_calls", None)
        }
        RequestEnd::Finished { reason } => ("finished", reason, None),
        RequestEnd::Failed { error } => ("failed", "none", Some(error)),
        RequestEnd::Cancelled => ("cancelled", "none", None),
    };
    macro_rules! line {
        ($level:ident) => {
            tracing::$level!(
                request_id = %request_id,
                model = %request.model,
                prompt_tokens = request.prompt_tokens,
                completion_tokens = p.generated,
                queue_ms,
                ttft_ms,
                e2e_ms = millis(e2e),
                tok_s = decode_rate(p),
                status = %status,
                finish_reason = %finish_reason,
                tool_calls = p.tool_calls,
                spec_drafted = p.speculated.map(|(d, _)| d),
                spec_accepted = p.speculated.map(|(_, a)| a),
                spec_acceptance = p.speculated.map(|(d, a)| acceptance(d, a)),
                error = error.map(tracing::field::display),
                "request finished"
            )
        };
    }
    if error.is_some() {
        line!(warn);
    } else {
        line!(info);
    }
}
