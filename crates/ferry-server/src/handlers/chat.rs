//! `POST /v1/chat/completions`: validate, submit, then answer with one `chat.completion` or an
//! SSE stream of `chat.completion.chunk`s (first one role chunk per choice; every chunk names
//! its choice by `index`). With tools offered or a reasoning template, each choice's text goes
//! through its [`ReplyReader`]: reasoning chunks carry `reasoning_content`, content chunks
//! only what is neither reasoning nor call markup, each call's first chunk its `index`, `id`
//! and name, the next ones its argument fragments. A whole reply is read by the same reader, so
//! `message.reasoning_content`, `content` and `tool_calls` are what the chunks add up to.

use axum::extract::State;
use axum::response::Response;
use axum::Extension;
use serde_json::{Map, Value};

use super::{respond, usage_of, Collected, ResponseFormatter};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::JsonObject;
use crate::metrics::ModelLabel;
use crate::openai::chat::{
    ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionResponse, ChatDelta,
    ChatFinishReason, ChatLogprobs, ChatRequest, ChatResponseMessage, ChatTokenLogprob,
};
use crate::openai::common::{new_id, unix_now};
use crate::openai::tools::{FunctionDelta, FunctionWire, ToolCallDelta, ToolCallWire};
use crate::sse::{to_data, ChunkFormatter};
use crate::validate::{self, ValidRequest};
use crate::AppState;
use ferry_engine::reasoning::{ParsedReply, ReasoningParsing, ReplyEvent, ReplyReader};
use ferry_engine::tool_calls::{ParsedOutput, ToolCallFormat, ToolEvent, ToolParsing};
use ferry_engine::{FinishReason, TokenOutput, Usage};

/// The handler; its response carries the model label for `ferry_requests_total`.
pub async fn chat_completions(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    JsonObject(body): JsonObject,
) -> Response {
    let label = ModelLabel::of(&state, &body);
    label.attach(run(state, caller.map(|c| c.0), body).await)
}

async fn run(
    state: AppState,
    caller: Option<Caller>,
    body: Map<String, Value>,
) -> Result<Response, ApiError> {
    let req = ChatRequest::from_json(body)?;
    let valid = validate::chat(&state, req, caller).await?;
    respond(&state, &valid, Formatter::new(&valid)).await
}

/// Builds the response or the chunks of one chat completion.
struct Formatter {
    id: String,
    created: u64,
    model: String,
    include_usage: bool,
    logprobs: bool,
    /// How many choices (`n`).
    choices: u32,
    /// How to read tool calls, when tools are offered.
    tools: Option<ToolParsing>,
    /// How to read the reasoning, for a reasoning template.
    reasoning: Option<ReasoningParsing>,
    /// Per choice (streaming), when tools are offered or the template reasons: its reader.
    readers: Vec<ReplyReader>,
}

impl Formatter {
    fn new(valid: &ValidRequest) -> Self {
        Self {
            id: new_id("chatcmpl-"),
            created: unix_now(),
            model: valid.served_name().to_owned(),
            include_usage: valid.include_usage(),
            logprobs: valid.params().logprobs.is_some(),
            choices: u32::try_from(valid.n()).unwrap_or(u32::MAX),
            tools: valid.tool_calls().cloned(),
            reasoning: valid.params().reasoning,
            readers: if valid.tool_calls().is_some() || valid.params().reasoning.is_some() {
                (0..valid.n())
                    .map(|_| ReplyReader::new(valid.params().reasoning, valid.tool_calls()))
                    .collect()
            } else {
                Vec::new()
            },
        }
    }

    /// A choice's message: its text, or read for its reasoning, content and calls.
    fn message(&self, text: String) -> (ChatResponseMessage, usize) {
        if self.tools.is_none() && self.reasoning.is_none() {
            return (message(Some(text), None, None), 0);
        }
        let ParsedReply {
            reasoning,
            output: ParsedOutput { content, calls },
        } = ReplyReader::parse(self.reasoning, self.tools.as_ref(), &text);
        let reasoning = (!reasoning.is_empty()).then_some(reasoning);
        let n = calls.len();
        let wire = (!calls.is_empty()).then(|| {
            calls
                .into_iter()
                .map(|call| ToolCallWire {
                    id: call_id(self.format()),
                    kind: "function",
                    function: FunctionWire {
                        name: call.name,
                        arguments: call.arguments,
                    },
                })
                .collect()
        });
        // Only an answer with nothing else in it keeps an empty `content`.
        let alone = wire.is_none() && reasoning.is_none();
        let content = (alone || !content.is_empty()).then_some(content);
        (message(content, reasoning, wire), n)
    }

    /// The tool-call format call ids are made for.
    fn format(&self) -> ToolCallFormat {
        self.tools
            .as_ref()
            .map_or(ToolCallFormat::Hermes, |t| t.format)
    }

    /// The chunks for a choice's new text: as it is, or through its tool-call reader.
    fn text_chunks(
        &mut self,
        index: u32,
        text: &str,
        finished: bool,
        mut logprobs: Option<ChatLogprobs>,
    ) -> Vec<String> {
        let events = match self.readers.get_mut(index as usize) {
            None if text.is_empty() && logprobs.is_none() => Vec::new(),
            None => vec![ReplyEvent::Output(ToolEvent::Content(text.to_owned()))],
            Some(reader) => {
                let mut events = reader.push(text);
                if finished {
                    events.extend(reader.finish());
                }
                events
            }
        };
        let mut chunks = Vec::with_capacity(events.len().max(1));
        for event in events {
            let delta = match event {
                ReplyEvent::Reasoning(reasoning) => ChatDelta {
                    reasoning_content: Some(reasoning),
                    ..ChatDelta::default()
                },
                ReplyEvent::Output(ToolEvent::Content(content)) => ChatDelta {
                    content: Some(content),
                    ..ChatDelta::default()
                },
                ReplyEvent::Output(ToolEvent::CallStart { index: call, name }) => {
                    tool_delta(ToolCallDelta {
                        index: call,
                        id: Some(call_id(self.format())),
                        kind: Some("function"),
                        function: FunctionDelta {
                            name: Some(name),
                            arguments: String::new(),
                        },
                    })
                }
                ReplyEvent::Output(ToolEvent::Arguments {
                    index: call,
                    fragment,
                }) => tool_delta(ToolCallDelta {
                    index: call,
                    id: None,
                    kind: None,
                    function: FunctionDelta {
                        name: None,
                        arguments: fragment,
                    },
                }),
            };
            let choice = self.choice(index, delta, logprobs.take());
            chunks.push(self.chunk(vec![choice], self.chunk_usage()));
        }
        if let Some(logprobs) = logprobs {
            let choice = self.choice(index, ChatDelta::default(), Some(logprobs));
            chunks.push(self.chunk(vec![choice], self.chunk_usage()));
        }
        chunks
    }

    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Option<Usage>>) -> String {
        to_data(&ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        })
    }

    fn choice(
        &self,
        index: u32,
        delta: ChatDelta,
        logprobs: Option<ChatLogprobs>,
    ) -> ChatChunkChoice {
        ChatChunkChoice {
            index,
            delta,
            logprobs,
            finish_reason: None,
        }
    }

    /// Usage field of a non-final chunk: `null` with include_usage, absent otherwise.
    fn chunk_usage(&self) -> Option<Option<Usage>> {
        self.include_usage.then_some(None)
    }
}

impl ResponseFormatter for Formatter {
    type Full = ChatCompletionResponse;

    fn full(&self, done: &[Collected]) -> ChatCompletionResponse {
        let choices = done
            .iter()
            .enumerate()
            .map(|(index, choice)| {
                let (message, calls) = self.message(choice.text());
                ChatChoice {
                    index: index as u32,
                    message,
                    logprobs: self.logprobs.then(|| ChatLogprobs {
                        content: choice
                            .tokens
                            .iter()
                            .filter_map(ChatTokenLogprob::from_output)
                            .collect(),
                    }),
                    finish_reason: Some(ChatFinishReason::of(choice.reason, calls)),
                }
            })
            .collect();
        ChatCompletionResponse {
            id: self.id.clone(),
            object: "chat.completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: usage_of(done),
        }
    }
}

impl ChunkFormatter for Formatter {
    /// One role chunk per choice.
    fn start(&mut self) -> Vec<String> {
        (0..self.choices)
            .map(|index| {
                let delta = ChatDelta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                    annotations: Some(Vec::new()),
                    ..ChatDelta::default()
                };
                self.chunk(vec![self.choice(index, delta, None)], self.chunk_usage())
            })
            .collect()
    }

    fn token(&mut self, index: u32, out: &TokenOutput) -> Vec<String> {
        let logprobs = self.logprobs.then(|| ChatLogprobs {
            content: ChatTokenLogprob::from_output(out).into_iter().collect(),
        });
        self.text_chunks(index, &out.text, false, logprobs)
    }

    fn finish(&mut self, index: u32, reason: FinishReason, trailing_text: &str) -> Vec<String> {
        if self.readers.is_empty() {
            let delta = ChatDelta {
                content: (!trailing_text.is_empty()).then(|| trailing_text.to_owned()),
                ..ChatDelta::default()
            };
            let mut last = self.choice(index, delta, None);
            last.finish_reason = Some(ChatFinishReason::of(reason, 0));
            return vec![self.chunk(vec![last], self.chunk_usage())];
        }
        let mut chunks = self.text_chunks(index, trailing_text, true, None);
        let calls = self
            .readers
            .get(index as usize)
            .map_or(0, ReplyReader::calls);
        let mut last = self.choice(index, ChatDelta::default(), None);
        last.finish_reason = Some(ChatFinishReason::of(reason, calls));
        chunks.push(self.chunk(vec![last], self.chunk_usage()));
        chunks
    }

    fn usage(&mut self, usage: Usage) -> Vec<String> {
        self.include_usage
            .then(|| self.chunk(Vec::new(), Some(Some(usage))))
            .into_iter()
            .collect()
    }
}

fn message(
    content: Option<String>,
    reasoning_content: Option<String>,
    tool_calls: Option<Vec<ToolCallWire>>,
) -> ChatResponseMessage {
    ChatResponseMessage {
        role: "assistant",
        content,
        reasoning_content,
        refusal: None,
        annotations: Vec::new(),
        tool_calls,
    }
}

fn tool_delta(call: ToolCallDelta) -> ChatDelta {
    ChatDelta {
        tool_calls: Some(vec![call]),
        ..ChatDelta::default()
    }
}

/// A new call id: `call_` and 24 letters or digits; Mistral's templates require exactly nine
/// letters or digits of the ids they get back in the history, so its calls get those.
pub(crate) fn call_id(format: ToolCallFormat) -> String {
    match format {
        ToolCallFormat::Mistral => {
            use rand::distr::{Alphanumeric, SampleString};
            Alphanumeric.sample_string(&mut rand::rng(), 9)
        }
        _ => new_id("call_"),
    }
}
