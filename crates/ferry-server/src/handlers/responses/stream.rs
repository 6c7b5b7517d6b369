//! The Responses API's SSE stream: `event: <type>` + `data: {json}` per event, every event
//! numbered (`sequence_number` from 0), no `[DONE]` (OpenAI's Responses streams end with their
//! last event). In order: `response.created`, `response.in_progress`, then the output items'
//! events as the text arrives ([`OutputBuilder`]), then `response.completed` (or
//! `response.incomplete` at `max_output_tokens`) with the whole response, stored first when
//! `store`.
//!
//! A failure after the stream started (the engine's, a dropped channel, the shutdown
//! deadline) ends it with one `error` event (`{"type":"error","code","message","param"}`);
//! nothing is stored. When the client goes away the stream and its receiver drop, which
//! cancels the generation.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;

use super::output::OutputBuilder;
use super::Pending;
use crate::error::ApiError;
use crate::openai::response_object::StreamEvent;
use crate::shutdown::{Lifecycle, Phase};
use ferry_engine::{EngineError, FinishReason, GenerationEvent};

/// One response being streamed: its echo and its items so far.
pub struct Run {
    /// The request's side of the response.
    pub pending: Pending,
    /// The reply's items.
    pub builder: OutputBuilder,
}

struct State {
    rx: mpsc::Receiver<GenerationEvent>,
    run: Run,
    queue: VecDeque<Value>,
    sequence: u64,
    started: bool,
    ended: bool,
    lifecycle: Lifecycle,
}

fn value(event: StreamEvent) -> Value {
    serde_json::to_value(event).unwrap_or_else(|e| {
        error_value(&ApiError::internal(format!(
            "could not serialise an event: {e}"
        )))
    })
}

fn error_value(err: &ApiError) -> Value {
    serde_json::json!({
        "type": "error",
        "code": err.code(),
        "message": err.message(),
        "param": err.param(),
    })
}

impl State {
    fn fail(&mut self, err: &ApiError) {
        self.queue.push_back(error_value(err));
        self.ended = true;
    }

    /// The next event to send; `None` once the stream is over.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(mut data) = self.queue.pop_front() {
                let name = data["type"].as_str().unwrap_or("error").to_owned();
                if let Value::Object(map) = &mut data {
                    map.insert("sequence_number".into(), self.sequence.into());
                }
                self.sequence += 1;
                return Some(Event::default().event(name).data(data.to_string()));
            }
            if self.ended {
                return None;
            }
            if !self.started {
                self.started = true;
                let response = Box::new(self.run.pending.started());
                self.queue.push_back(value(StreamEvent::Created {
                    response: response.clone(),
                }));
                self.queue
                    .push_back(value(StreamEvent::InProgress { response }));
                continue;
            }
            let event = tokio::select! {
                event = self.rx.recv() => event,
                () = self.lifecycle.deadline() => {
                    self.fail(&ApiError::shutting_down());
                    continue;
                }
            };
            match event {
                Some(GenerationEvent::Token(out)) => {
                    let events = self.run.builder.push(&out.text);
                    self.queue.extend(events.into_iter().map(value));
                }
                Some(GenerationEvent::Finished {
                    reason,
                    usage,
                    trailing_text,
                }) => {
                    let cut = reason == FinishReason::Length;
                    let events = self.run.builder.finish(&trailing_text, cut);
                    self.queue.extend(events.into_iter().map(value));
                    let response =
                        self.run
                            .pending
                            .finished(self.run.builder.items(), reason, usage);
                    self.queue.push_back(value(Pending::last_event(response)));
                    self.ended = true;
                }
                Some(GenerationEvent::Failed(err)) => self.fail(&err.into()),
                None => {
                    let err = if self.lifecycle.phase() == Phase::Deadline {
                        ApiError::shutting_down()
                    } else {
                        EngineError::Unavailable.into()
                    };
                    self.fail(&err);
                }
            }
        }
    }
}

/// The SSE response; comments keep an idle connection alive every `keep_alive`.
pub fn response(
    rx: mpsc::Receiver<GenerationEvent>,
    run: Run,
    keep_alive: Duration,
    lifecycle: Lifecycle,
) -> Response {
    let state = State {
        rx,
        run,
        queue: VecDeque::new(),
        sequence: 0,
        started: false,
        ended: false,
        lifecycle,
    };
    let events = futures::stream::unfold(state, |mut state| async move {
        let event = state.next().await?;
        Some((Ok::<_, Infallible>(event), state))
    });
    Sse::new(events.boxed())
        .keep_alive(KeepAlive::new().interval(keep_alive))
        .into_response()
}
