//! Server-sent events: turns the engine's event receivers (one per choice) into
//! `data: {json}\n\n` events ending with `data: [DONE]`. What each chunk contains is the
//! endpoint's business ([`ChunkFormatter`]); the order and the failure handling live here:
//!
//! 1. `start()` chunks (chat's role chunks),
//! 2. one call to `token()` per generated token of any choice, as the choices produce them,
//! 3. `finish()` chunks for each choice as it ends (its finish_reason chunk),
//! 4. once every choice ended, `usage()` chunks (the usage chunk, the prompt counted once),
//! 5. `[DONE]`.
//!
//! A failure after the stream started (`GenerationEvent::Failed`, the engine dropping a
//! channel without finishing, or the server's shutdown deadline) becomes
//! `data: {"error":{...}}` followed by `data: [DONE]`.
//! The stream owns the receivers: when the client goes away, axum drops the stream, the
//! receivers drop with it, and the engine sees every choice cancelled.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{BoxStream, SelectAll};
use futures::{Stream, StreamExt};
use serde::Serialize;
use tokio::sync::mpsc;

use super::error::ApiError;
use super::openai::common::choices_usage;
use super::shutdown::Lifecycle;
use ferry_engine::{EngineError, FinishReason, GenerationEvent, TokenOutput, Usage};

/// The data of the last event of every stream.
pub const DONE: &str = "[DONE]";

/// Builds one endpoint's chunks; each returned string is one event's JSON data.
pub trait ChunkFormatter: Send + 'static {
    /// Chunks before the first token.
    fn start(&mut self) -> Vec<String>;
    /// Chunks for one generated token of choice `index` (none when it adds nothing visible).
    fn token(&mut self, index: u32, out: &TokenOutput) -> Vec<String>;
    /// The chunks that end choice `index`: the one with its `finish_reason`.
    fn finish(&mut self, index: u32, reason: FinishReason, trailing_text: &str) -> Vec<String>;
    /// The chunks after every choice ended (the usage chunk, if asked for).
    fn usage(&mut self, usage: Usage) -> Vec<String>;
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

/// One choice's next event, or `None` once its channel closed.
type Tagged = (u32, Option<GenerationEvent>);

/// Choice `index`'s events, then one `(index, None)` when its channel closes.
fn tagged(index: u32, rx: mpsc::Receiver<GenerationEvent>) -> BoxStream<'static, Tagged> {
    futures::stream::unfold(Some(rx), move |rx| async move {
        let mut rx = rx?;
        match rx.recv().await {
            Some(event) => Some(((index, Some(event)), Some(rx))),
            None => Some(((index, None), None)),
        }
    })
    .boxed()
}

struct State<F> {
    events: SelectAll<BoxStream<'static, Tagged>>,
    /// Per choice: whether it ended.
    finished: Vec<bool>,
    /// The usage of every choice that ended.
    usages: Vec<Usage>,
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

    /// The error for a stream that stopped before every choice finished.
    fn cut_short(&self) -> ApiError {
        if self.lifecycle.phase() == super::shutdown::Phase::Deadline {
            ApiError::shutting_down()
        } else {
            EngineError::Unavailable.into()
        }
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
                    Some((index, Some(GenerationEvent::Token(out)))) => {
                        self.pending.extend(self.formatter.token(index, &out));
                    }
                    Some((
                        index,
                        Some(GenerationEvent::Finished {
                            reason,
                            usage,
                            trailing_text,
                        }),
                    )) => {
                        let chunks = self.formatter.finish(index, reason, &trailing_text);
                        self.pending.extend(chunks);
                        self.usages.push(usage);
                        if let Some(done) = self.finished.get_mut(index as usize) {
                            *done = true;
                        }
                        if self.finished.iter().all(|&done| done) {
                            let usage = choices_usage(&self.usages);
                            self.pending.extend(self.formatter.usage(usage));
                            self.pending.push_back(DONE.to_owned());
                            self.phase = Phase::Ended;
                        }
                    }
                    Some((_, Some(GenerationEvent::Failed(err)))) => {
                        self.end_with_error(err.into())
                    }
                    // A channel that closes after its choice finished is the normal end.
                    Some((index, None)) if self.finished.get(index as usize) == Some(&true) => {}
                    Some((_, None)) | None => self.end_with_error(self.cut_short()),
                },
            }
        }
    }

    /// The next event of any choice; `None` when every channel closed or the shutdown
    /// deadline came.
    async fn next_event(&mut self) -> Option<Tagged> {
        tokio::select! {
            event = self.events.next() => event,
            () = self.lifecycle.deadline() => None,
        }
    }
}

/// The event data strings of a stream, in order (the framing-free core, unit-testable): one
/// receiver per choice, in index order. At `lifecycle`'s shutdown deadline the stream ends
/// with an error event and `[DONE]`.
pub fn data_stream<F: ChunkFormatter>(
    receivers: Vec<mpsc::Receiver<GenerationEvent>>,
    formatter: F,
    lifecycle: Lifecycle,
) -> impl Stream<Item = String> + Send {
    let finished = vec![false; receivers.len()];
    let events = futures::stream::select_all(
        receivers
            .into_iter()
            .enumerate()
            .map(|(index, rx)| tagged(index as u32, rx)),
    );
    let state = State {
        events,
        finished,
        usages: Vec::new(),
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
    receivers: Vec<mpsc::Receiver<GenerationEvent>>,
    formatter: F,
    keep_alive: Duration,
    lifecycle: Lifecycle,
) -> Response {
    let events = data_stream(receivers, formatter, lifecycle)
        .map(|data| Ok::<_, Infallible>(Event::default().data(data)));
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(keep_alive))
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Plain;
    impl ChunkFormatter for Plain {
        fn start(&mut self) -> Vec<String> {
            vec!["start".into()]
        }
        fn token(&mut self, index: u32, out: &TokenOutput) -> Vec<String> {
            match index {
                0 => vec![out.text.clone()],
                i => vec![format!("{i}:{}", out.text)],
            }
        }
        fn finish(&mut self, index: u32, reason: FinishReason, trailing: &str) -> Vec<String> {
            match index {
                0 => vec![format!("{reason:?}{trailing}")],
                i => vec![format!("{i}:{reason:?}{trailing}")],
            }
        }
        fn usage(&mut self, usage: Usage) -> Vec<String> {
            (usage.total_tokens > 0)
                .then(|| format!("usage {}+{}", usage.prompt_tokens, usage.completion_tokens))
                .into_iter()
                .collect()
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
            data_stream(vec![rx], Plain, Lifecycle::new())
                .collect()
                .await
        } else {
            let out = data_stream(vec![rx], Plain, Lifecycle::new())
                .collect()
                .await;
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
    async fn choices_interleave_and_usage_comes_after_the_last() {
        let finished = |completion_tokens| GenerationEvent::Finished {
            reason: FinishReason::Stop,
            usage: Usage {
                prompt_tokens: 5,
                completion_tokens,
                total_tokens: 5 + completion_tokens,
                prompt_tokens_details: None,
                completion_tokens_details: None,
            },
            trailing_text: String::new(),
        };
        let (tx0, rx0) = mpsc::channel(16);
        let (tx1, rx1) = mpsc::channel(16);
        tx1.send(token("x")).await.unwrap();
        tx1.send(finished(1)).await.unwrap();
        drop(tx1);
        let stream = data_stream(vec![rx0, rx1], Plain, Lifecycle::new());
        tokio::pin!(stream);
        assert_eq!(stream.next().await.as_deref(), Some("start"));
        assert_eq!(stream.next().await.as_deref(), Some("1:x"));
        assert_eq!(stream.next().await.as_deref(), Some("1:Stop"));
        // Choice 0 is still running: nothing more until it sends.
        tx0.send(token("a")).await.unwrap();
        tx0.send(token("b")).await.unwrap();
        tx0.send(finished(2)).await.unwrap();
        let rest: Vec<String> = stream.collect().await;
        assert_eq!(rest, ["a", "b", "Stop", "usage 5+3", DONE]);
        drop(tx0);
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
        let stream = data_stream(vec![rx], Plain, lifecycle.clone());
        tokio::pin!(stream);
        assert_eq!(stream.next().await.as_deref(), Some("start"));
        assert_eq!(stream.next().await.as_deref(), Some("a"));
        // The engine is still generating (the sender is alive) when the deadline comes.
        lifecycle.enter(crate::shutdown::Phase::Deadline);
        let rest: Vec<String> = stream.collect().await;
        assert_eq!(rest.len(), 2, "{rest:?}");
        let error: serde_json::Value = serde_json::from_str(&rest[0]).unwrap();
        assert_eq!(error["error"]["code"], "shutting_down");
        assert_eq!(error["error"]["type"], "server_error");
        assert_eq!(rest[1], DONE);
        drop(tx);
    }
}
