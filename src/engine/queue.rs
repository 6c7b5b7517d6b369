//! The requests waiting for one model's engine thread. Plain state without threads or locks, so
//! it is unit-tested directly; this is where a continuous-batching scheduler will grow.

use std::collections::VecDeque;
use std::time::Instant;

use tokio::sync::mpsc;

use super::request::{GenerationEvent, GenerationRequest};

/// One queued generation: the request and where its events go.
pub struct Job {
    /// The validated request.
    pub request: GenerationRequest,
    /// The client's event channel; closed when the client went away.
    pub events: mpsc::Sender<GenerationEvent>,
    /// When `submit` accepted it (the start of its time to first token).
    pub accepted: Instant,
}

impl Job {
    /// The client dropped its receiver: nothing to do any more.
    pub fn is_cancelled(&self) -> bool {
        self.events.is_closed()
    }
}

/// Requests waiting for a model's thread, oldest first.
#[derive(Default)]
pub struct RequestQueue {
    waiting: VecDeque<Job>,
}

impl RequestQueue {
    /// Adds a request at the back.
    pub fn push(&mut self, job: Job) {
        self.waiting.push_back(job);
    }

    /// The oldest request whose client is still there; cancelled ones ahead of it are dropped.
    /// Returns the job (if any) and how many cancelled ones were dropped.
    pub fn next_live(&mut self) -> (Option<Job>, usize) {
        let mut dropped = 0;
        while let Some(job) = self.waiting.pop_front() {
            if !job.is_cancelled() {
                return (Some(job), dropped);
            }
            dropped += 1;
        }
        (None, dropped)
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// No request is waiting.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::request::{GenerationParams, PromptInput};

    #[test]
    fn queue_is_fifo_and_skips_cancelled_jobs() {
        let mut q = RequestQueue::default();
        let mut keep = Vec::new();
        for i in 0..4u32 {
            let (tx, rx) = mpsc::channel(1);
            q.push(Job {
                request: GenerationRequest {
                    model: "a".into(),
                    prompt: PromptInput::Tokens(vec![i]),
                    params: GenerationParams::default(),
                },
                events: tx,
                accepted: Instant::now(),
            });
            if i != 0 && i != 2 {
                keep.push(rx);
            }
        }
        assert_eq!(q.len(), 4);
        let first = |job: Option<Job>| match job.map(|j| j.request.prompt) {
            Some(PromptInput::Tokens(t)) => t[0],
            None => u32::MAX,
        };
        let (job, dropped) = q.next_live();
        assert_eq!((first(job), dropped), (1, 1));
        let (job, dropped) = q.next_live();
        assert_eq!((first(job), dropped), (3, 1));
        let (job, dropped) = q.next_live();
        assert!(job.is_none() && dropped == 0 && q.is_empty());
    }
}
