//! Server-sent events: turns the engine's event receiver into `data: {json}\n\n` events ending
//! with `data: [DONE]`. What each chunk contains is the endpoint's business ([`ChunkFormatter`]);
//! the order and the failure handling live here:
//!
//! 1. `start()` chunks (chat's role chunk), 2. one call to `token()` per generated token,
//! 3. `finish()` chunks (the finish_reason chunk, then the usage chunk), 4. `[DONE]`.
//!
//! A failure after the stream started (`GenerationEvent::Failed`, the engine dropping the
//! channel without finishing, or the server's shutdown deadline) becomes
//! `data: {"error":{...}}` followed by `data: [DONE]`.
//! The stream owns the receiver: when the client goes away, axum drops the stream, the receiver
//! drops with it, and the engine sees the request cancelled.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::Stream;
use serde::Serialize;
use tokio::sync::mpsc;

use super::error::ApiError;
use super::shutdown::Lifecycle;
use crate::engine::{EngineError, FinishReason, GenerationEvent, TokenOutput, Usage};

/// The data of the last event of every stream.
pub const DONE: &str = "[DONE]";

/// Builds one endpoint's chunks; each returned string is one event's JSON data.
pub trait ChunkFormatter: Send + 'static {
    /// Chunks before the first token.
    fn start(&mut self) -> Vec<String>;
    /// Chunks for one generated token (none when it adds nothing visible).
    fn token(&mut self, out: &TokenOutput) -> Vec<String>;
    /// The final chunks: the one with `finish_reason`, then usage if asked for.
    fn finish(&mut self, reason: FinishReason, usage: Usage, trailing_text: &str) -> Vec<String>;
}

/// Serialises a chunk; a failure (not expected for our types) becomes an error chunk.
pub fn to_data<T: Serialize>(chunk: &T) -> String {
    serde_json::to_string(chunk).unwrap_or_else(|e| {
        ApiError::internal(format!("could not serialise a chunk: {e}")).to_json()
    })
}

enum Phase {
    Start,
    Running,
    Ended,
}

struct State<F> {
    rx: mpsc::Receiver<GenerationEvent>,
    formatter: F,
    pending: VecDeque<String>,
    phase: Phase,
    lifecycle: Lifecycle,
}

impl<F: ChunkFormatter> State<F> {
    fn end_with_error(&mut self, err: ApiError) {
        self.pending.push_back(err.to_json());
        self.pending.push_back(DONE.to_owned());
        self.phase = Phase::Ended;
    }

    /// Advances until there is something to send; `None` when the stream is over.
    async fn next_data(&mut self) -> Option<String> {
        loop {
            if let Some(data) = self.pending.pop_front() {
                return Some(data);
            }
            match self.phase {
                Phase::Ended => return None,
                Phase::Start => {
                    self.pending.extend(self.formatter.start());
                    self.phase = Phase::Running;
                }
                Phase::Running => match self.next_event().await {
                    Some(GenerationEvent::Token(out)) => {
                        self.pending.extend(self.formatter.token(&out));
                    }
                    Some(GenerationEvent::Finished {
                        reason,
                        usage,
                        trailing_text,
                    }) => {
                        let chunks = self.formatter.finish(reason, usage, &trailing_text);
                        self.pending.extend(chunks);
                        self.pending.push_back(DONE.to_owned());
                        self.phase = Phase::Ended;
                    }
                    Some(GenerationEvent::Failed(err)) => self.end_with_error(err.into()),
                    None if self.lifecycle.phase() == super::shutdown::Phase::Deadline => {
                        self.end_with_error(ApiError::shutting_down())
                    }
                    None => self.end_with_error(EngineError::Unavailable.into()),
                },
            }
        }
    }

    /// The next engine event; `None` when the channel closed or the shutdown deadline came.
    async fn next_event(&mut self) -> Option<GenerationEvent> {
        tokio::select! {
            event = self.rx.recv() => event,
            () = self.lifecycle.deadline() => None,
        }
    }
}

/// The event data strings of a stream, in order (the framing-free core, unit-testable). At
/// `lifecycle`'s shutdown deadline the stream ends with an error event and `[DONE]`.
pub fn data_stream<F: ChunkFormatter>(
    rx: mpsc::Receiver<GenerationEvent>,
    formatter: F,
    lifecycle: Lifecycle,
) -> impl Stream<Item = String> + Send {
    let state = State {
        rx,
        formatter,
        pending: VecDeque::new(),
        phase: Phase::Start,
        lifecycle,
    };
    futures::stream::unfold(state, |mut state| async move {
        let data = state.next_data().await?;
        Some((data, state))
    })
}

/// The SSE response for a generation; comments keep idle connections alive every `keep_alive`.
pub fn response<F: ChunkFormatter>(
    rx: mpsc::Receiver<GenerationEvent>,
    formatter: F,
    keep_alive: Duration,
    lifecycle: Lifecycle,
) -> Response {
    use futures::StreamExt;
    let events = data_stream(rx, formatter, lifecycle)
        .map(|data| Ok::<_, Infallible>(Event::default().data(data)));
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(keep_alive))
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    struct Plain;
    impl ChunkFormatter for Plain {
        fn start(&mut self) -> Vec<String> {
            vec!["start".into()]
        }
        fn token(&mut self, out: &TokenOutput) -> Vec<String> {
            vec![out.text.clone()]
        }
        fn finish(&mut self, reason: FinishReason, _: Usage, trailing: &str) -> Vec<String> {
            vec![format!("{reason:?}{trailing}")]
        }
    }

    fn token(text: &str) -> GenerationEvent {
        GenerationEvent::Token(TokenOutput {
            text: text.into(),
            token_id: 1,
            logprob: None,
            top_logprobs: vec![],
        })
    }

    async fn run(events: Vec<GenerationEvent>, close: bool) -> Vec<String> {
        let (tx, rx) = mpsc::channel(16);
        for e in events {
            tx.send(e).await.unwrap();
        }
        if close {
            drop(tx);
            data_stream(rx, Plain, Lifecycle::new()).collect().await
        } else {
            let out = data_stream(rx, Plain, Lifecycle::new()).collect().await;
            drop(tx);
            out
        }
    }

    #[tokio::test]
    async fn orders_events() {
        let finished = GenerationEvent::Finished {
            reason: FinishReason::Length,
            usage: Usage::default(),
            trailing_text: "!".into(),
        };
        let got = run(vec![token("a"), token("b"), finished], false).await;
        assert_eq!(got, ["start", "a", "b", "Length!", DONE]);
    }

    #[tokio::test]
    async fn failures_end_with_error_then_done() {
        let failed = GenerationEvent::Failed(EngineError::Internal("boom".into()));
        let got = run(vec![token("a"), failed], false).await;
        assert_eq!(got.len(), 4);
        assert!(
            got[2].contains("\"error\"") && got[2].contains("boom"),
            "{got:?}"
        );
        assert_eq!(got[3], DONE);
        let got = run(vec![token("a")], true).await;
        assert!(got[2].contains("engine_unavailable"), "{got:?}");
        assert_eq!(got[3], DONE);
    }

    #[tokio::test]
    async fn the_shutdown_deadline_ends_a_stream_with_an_error_event() {
        let (tx, rx) = mpsc::channel(16);
        tx.send(token("a")).await.unwrap();
        let lifecycle = Lifecycle::new();
        let stream = data_stream(rx, Plain, lifecycle.clone());
        tokio::pin!(stream);
        assert_eq!(stream.next().await.as_deref(), Some("start"));
        assert_eq!(stream.next().await.as_deref(), Some("a"));
        // The engine is still generating (the sender is alive) when the deadline comes.
        lifecycle.enter(crate::server::shutdown::Phase::Deadline);
        let rest: Vec<String> = stream.collect().await;
        assert_eq!(rest.len(), 2, "{rest:?}");
        let error: serde_json::Value = serde_json::from_str(&rest[0]).unwrap();
        assert_eq!(error["error"]["code"], "shutting_down");
        assert_eq!(error["error"]["type"], "server_error");
        assert_eq!(rest[1], DONE);
        drop(tx);
    }
}
