//! Embedding requests in the engine: the request ([`EmbeddingRequest`]), the job that carries it
//! to the model's thread ([`EmbedJob`]) and the serving loop's queue of them ([`EmbedQueue`]).
//!
//! The serving loop runs embeddings between its generation steps, one input per loop iteration
//! ([`EmbedQueue::step`]: one [`LanguageModel::embed`] call on a fresh sequence of its own), so
//! the running streams wait at most one input's forward pass between two tokens and the
//! continuous batch is never taken apart. A request whose client went away (its reply receiver
//! dropped) is dropped before its next input. Each request counts in the gauges and `pending`
//! as one request and writes the request's log line when it ends.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::time::Instant;

use tokio::sync::oneshot;

use ferry_metrics::{RequestContext, RequestEnd, RequestTracker, TrackedRequest};

use super::serve_loop::LoopContext;
use super::traits::LanguageModel;
use super::worker::panic_message;
use super::{EngineError, EngineResult};

/// Embed `inputs` (token ids, each non-empty and within the context) with `model`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddingRequest {
    /// The served model id.
    pub model: String,
    /// The inputs, in the order their vectors come back.
    pub inputs: Vec<Vec<u32>>,
}

impl EmbeddingRequest {
    /// Tokens over every input.
    pub fn tokens(&self) -> usize {
        self.inputs.iter().map(Vec::len).sum()
    }
}

/// What an embedding request gets back: one vector per input, in order, or why it failed.
pub type EmbeddingReply = EngineResult<Vec<Vec<f32>>>;

/// One queued embedding request and where its vectors go.
pub struct EmbedJob {
    /// The validated request.
    pub request: EmbeddingRequest,
    /// The client's reply channel; closed when the client went away.
    pub reply: oneshot::Sender<EmbeddingReply>,
    /// When `embed` accepted it.
    pub accepted: Instant,
    /// The HTTP request it came from, if any.
    pub context: Option<RequestContext>,
}

/// An accepted request, part done.
struct Embedding {
    job: EmbedJob,
    vectors: Vec<Vec<f32>>,
    tracker: RequestTracker,
}

/// The embedding requests of one model's serving loop, in arrival order.
#[derive(Default)]
pub(super) struct EmbedQueue {
    queue: VecDeque<Embedding>,
}

impl EmbedQueue {
    /// Whether no request waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Queues `job` (counted as queued already by the handle).
    pub fn push(&mut self, ctx: &LoopContext<'_>, job: EmbedJob) {
        let tracker = RequestTracker::new(
            ctx.metrics,
            TrackedRequest {
                model: ctx.name.to_owned(),
                accepted: job.accepted,
                prompt_tokens: job.request.tokens(),
                context: job.context.clone(),
            },
        );
        self.queue.push_back(Embedding {
            job,
            vectors: Vec::new(),
            tracker,
        });
    }

    /// Embeds the next input of the oldest request (dropping requests whose clients left), and
    /// answers the request when it was its last input or failed.
    pub fn step<M: LanguageModel>(&mut self, model: &mut M, ctx: &LoopContext<'_>) {
        let Some(mut current) = self.queue.pop_front() else {
            return;
        };
        let started = !current.vectors.is_empty();
        if current.job.reply.is_closed() {
            current.tracker.end(RequestEnd::Cancelled);
            if started {
                ctx.metrics.request_ended();
            } else {
                ctx.metrics.request_dequeued();
            }
            ctx.pending.fetch_sub(1, Ordering::SeqCst);
            return;
        }
        if !started {
            current.tracker.admitted();
            ctx.metrics.request_started();
        }
        let input = &current.job.request.inputs[current.vectors.len()];
        let result = catch_unwind(AssertUnwindSafe(|| model.embed(input))).unwrap_or_else(|p| {
            let message = panic_message(&*p);
            tracing::error!(model = ctx.name, panic = %message, "the model panicked embedding");
            Err(EngineError::Internal(format!(
                "the model panicked: {message}"
            )))
        });
        current.tracker.fed(input.len());
        match result {
            Ok(vector) => {
                current.vectors.push(vector);
                if current.vectors.len() < current.job.request.inputs.len() {
                    // Not done: back at the front, so requests finish in arrival order.
                    self.queue.push_front(current);
                    return;
                }
                current.tracker.prefilled(current.job.request.tokens());
                current.tracker.end(RequestEnd::Finished { reason: "stop" });
                let _ = current.job.reply.send(Ok(current.vectors));
            }
            Err(err) => {
                current.tracker.end(RequestEnd::Failed {
                    error: &err.to_string(),
                });
                let _ = current.job.reply.send(Err(err));
            }
        }
        ctx.metrics.request_ended();
        ctx.pending.fetch_sub(1, Ordering::SeqCst);
    }
}
