//! Responses API wire types going out: the response object (`object: "response"`), its output
//! items (`message` with `output_text` parts, `function_call`), its usage, and the stream's
//! events, each a JSON object whose `type` is also the SSE `event:` name. The stream numbers
//! the events (`sequence_number`) as it sends them.
//!
//! Statuses: a response is `completed`, or `incomplete` with `incomplete_details.reason`
//! `max_output_tokens` when it stopped at the limit (its last stream event is then
//! `response.incomplete`, as OpenAI's); `in_progress` only in the stream's first events.

use serde::Serialize;
use serde_json::{Map, Value};

use ferry_engine::Usage;

/// A response object, as returned, streamed and stored.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseObject {
    /// `resp_...`.
    pub id: String,
    /// Always `"response"`.
    pub object: &'static str,
    /// Unix seconds.
    pub created_at: u64,
    /// `in_progress`, `completed` or `incomplete`.
    pub status: &'static str,
    /// Always false (background responses are not supported).
    pub background: bool,
    /// Always null here (a failed generation is an error, not a response).
    pub error: Option<Value>,
    /// Why the response is `incomplete`.
    pub incomplete_details: Option<IncompleteDetails>,
    /// `instructions` as sent.
    pub instructions: Option<String>,
    /// `max_output_tokens` as sent.
    pub max_output_tokens: Option<i64>,
    /// Always null.
    pub max_tool_calls: Option<i64>,
    /// The model name as the client sent it.
    pub model: String,
    /// The output items, in order.
    pub output: Vec<OutputItem>,
    /// `parallel_tool_calls`.
    pub parallel_tool_calls: bool,
    /// `previous_response_id` as sent.
    pub previous_response_id: Option<String>,
    /// `reasoning` as sent (accepted, not applied).
    pub reasoning: Value,
    /// Whether the response is stored.
    pub store: bool,
    /// The sampling temperature used.
    pub temperature: Option<f64>,
    /// `text` (its `format`).
    pub text: Value,
    /// `tool_choice` as sent.
    pub tool_choice: Value,
    /// `tools` as sent.
    pub tools: Vec<Value>,
    /// The nucleus mass used.
    pub top_p: Option<f64>,
    /// Always `"disabled"`.
    pub truncation: &'static str,
    /// Token counts; null while in progress.
    pub usage: Option<ResponseUsage>,
    /// `user` as sent.
    pub user: Option<String>,
    /// `metadata` as sent.
    pub metadata: Map<String, Value>,
}

/// `{"reason": "max_output_tokens"}`.
#[derive(Debug, Clone, Serialize)]
pub struct IncompleteDetails {
    /// Why generation stopped early.
    pub reason: &'static str,
}

/// A response's usage in the Responses API's names.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ResponseUsage {
    /// Prompt tokens (instructions, the previous conversation and the input).
    pub input_tokens: usize,
    /// Their breakdown.
    pub input_tokens_details: InputTokensDetails,
    /// Generated tokens.
    pub output_tokens: usize,
    /// Their breakdown.
    pub output_tokens_details: OutputTokensDetails,
    /// Sum of both.
    pub total_tokens: usize,
}

/// `{"cached_tokens": n}`: prompt tokens the prefix cache supplied (0 when it is off).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct InputTokensDetails {
    /// Prompt tokens reused from the prefix cache.
    pub cached_tokens: usize,
}

/// `{"reasoning_tokens": n}`: generated tokens that were reasoning (0 unless the model's
/// template is a reasoning one).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct OutputTokensDetails {
    /// Reasoning tokens among the output tokens.
    pub reasoning_tokens: usize,
}

impl From<Usage> for ResponseUsage {
    fn from(u: Usage) -> Self {
        Self {
            input_tokens: u.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: u.prompt_tokens_details.map_or(0, |d| d.cached_tokens),
            },
            output_tokens: u.completion_tokens,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: u
                    .completion_tokens_details
                    .map_or(0, |d| d.reasoning_tokens),
            },
            total_tokens: u.total_tokens,
        }
    }
}

/// An output item.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// Assistant text.
    Message {
        /// `msg_...`.
        id: String,
        /// `in_progress` while streamed, then `completed`.
        status: &'static str,
        /// Always `"assistant"`.
        role: &'static str,
        /// Its one `output_text` part (none in `response.output_item.added`).
        content: Vec<OutputText>,
    },
    /// A reasoning model's thinking (its text in one `reasoning_text` part; no summary).
    Reasoning {
        /// `rs_...`.
        id: String,
        /// Always empty (ferry writes no summaries).
        summary: Vec<Value>,
        /// The reasoning text (empty in `response.output_item.added`).
        content: Vec<ReasoningText>,
        /// `in_progress` while streamed, then `completed` (or `incomplete`).
        status: &'static str,
    },
    /// A tool call.
    FunctionCall {
        /// `fc_...`.
        id: String,
        /// The id a `function_call_output` answers (`call_...`).
        call_id: String,
        /// The function's name.
        name: String,
        /// The arguments' JSON text.
        arguments: String,
        /// `in_progress` while streamed, then `completed`.
        status: &'static str,
    },
}

/// `{"type":"reasoning_text","text"}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReasoningText {
    /// Always `"reasoning_text"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The text.
    pub text: String,
}

impl ReasoningText {
    /// A part holding `text`.
    pub fn new(text: String) -> Self {
        Self {
            kind: "reasoning_text",
            text,
        }
    }
}

/// `{"type":"output_text","text","annotations":[],"logprobs":[]}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutputText {
    /// Always `"output_text"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The text.
    pub text: String,
    /// Always empty.
    pub annotations: Vec<Value>,
    /// Always empty (logprobs are not offered here).
    pub logprobs: Vec<Value>,
}

impl OutputText {
    /// A part holding `text`.
    pub fn new(text: String) -> Self {
        Self {
            kind: "output_text",
            text,
            annotations: Vec::new(),
            logprobs: Vec::new(),
        }
    }
}

/// One stream event before numbering; its `type` is the SSE event name.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type")]
pub enum StreamEvent {
    /// First event.
    #[serde(rename = "response.created")]
    Created {
        /// The response, `in_progress`, no output.
        response: Box<ResponseObject>,
    },
    /// Second event.
    #[serde(rename = "response.in_progress")]
    InProgress {
        /// As in `response.created`.
        response: Box<ResponseObject>,
    },
    /// An item begins.
    #[serde(rename = "response.output_item.added")]
    ItemAdded {
        /// Its place in `output`.
        output_index: usize,
        /// The item so far.
        item: OutputItem,
    },
    /// A message's text part begins.
    #[serde(rename = "response.content_part.added")]
    PartAdded {
        /// The message's id.
        item_id: String,
        /// Its place in `output`.
        output_index: usize,
        /// Always 0.
        content_index: usize,
        /// The part, empty.
        part: OutputText,
    },
    /// New text.
    #[serde(rename = "response.output_text.delta")]
    TextDelta {
        /// The message's id.
        item_id: String,
        /// Its place in `output`.
        output_index: usize,
        /// Always 0.
        content_index: usize,
        /// The text added.
        delta: String,
        /// Always empty.
        logprobs: Vec<Value>,
    },
    /// A text part is complete.
    #[serde(rename = "response.output_text.done")]
    TextDone {
        /// The message's id.
        item_id: String,
        /// Its place in `output`.
        output_index: usize,
        /// Always 0.
        content_index: usize,
        /// The whole text.
        text: String,
        /// Always empty.
        logprobs: Vec<Value>,
    },
    /// A part is complete.
    #[serde(rename = "response.content_part.done")]
    PartDone {
        /// The message's id.
        item_id: String,
        /// Its place in `output`.
        output_index: usize,
        /// Always 0.
        content_index: usize,
        /// The whole part.
        part: OutputText,
    },
    /// New reasoning text.
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningDelta {
        /// The reasoning item's id.
        item_id: String,
        /// Its place in `output`.
        output_index: usize,
        /// Always 0.
        content_index: usize,
        /// The text added.
        delta: String,
    },
    /// A reasoning item's text is complete.
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningDone {
        /// The reasoning item's id.
        item_id: String,
        /// Its place in `output`.
        output_index: usize,
        /// Always 0.
        content_index: usize,
        /// The whole text.
        text: String,
    },
    /// A call's next argument text.
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgumentsDelta {
        /// The call's item id.
        item_id: String,
        /// Its place in `output`.
        output_index: usize,
        /// The text added.
        delta: String,
    },
    /// A call's arguments are complete.
    #[serde(rename = "response.function_call_arguments.done")]
    ArgumentsDone {
        /// The call's item id.
        item_id: String,
        /// Its place in `output`.
        output_index: usize,
        /// The function's name.
        name: String,
        /// The whole arguments text.
        arguments: String,
    },
    /// An item is complete.
    #[serde(rename = "response.output_item.done")]
    ItemDone {
        /// Its place in `output`.
        output_index: usize,
        /// The whole item.
        item: OutputItem,
    },
    /// Last event of a response that ended normally.
    #[serde(rename = "response.completed")]
    Completed {
        /// The whole response.
        response: Box<ResponseObject>,
    },
    /// Last event of a response cut at `max_output_tokens`.
    #[serde(rename = "response.incomplete")]
    Incomplete {
        /// The whole response.
        response: Box<ResponseObject>,
    },
}
