//! `/v1/chat/completions` wire types: the request as read from JSON (types checked, unsupported
//! fields rejected), the response (`object: "chat.completion"`) and its stream chunks
//! (`object: "chat.completion.chunk"`).
//!
//! Accepted: `model`, `messages`, `max_tokens`, `max_completion_tokens`, `logprobs`,
//! `top_logprobs`, the shared sampling fields ([`super::common::SAMPLING_FIELDS`]: `n` and
//! `logit_bias` among them, with the ignored ones of [`super::common::IGNORED_FIELDS`]),
//! `metadata` (ignored), `store` (false only), `response_format` (`text`, `json_object`, `json_schema`),
//! `tools`, `tool_choice`, `parallel_tool_calls` ([`super::tools`]), `chat_template_kwargs`
//! and `reasoning_effort` (template variables), `verbosity` (checked, ignored) and
//! `modalities` (`["text"]` only).
//! Messages: `role` (`system`, `user`, `assistant`, `tool`, and `developer`, treated as
//! `system`), `content` (a string, an array of `{"type":"text","text"}` parts, or null for an
//! assistant), `name` (passed to the chat template, which may render it), an assistant's
//! `tool_calls`, `reasoning_content` (a reply's reasoning sent back; passed to the template as
//! `reasoning_content` and `thinking`) and a tool message's `tool_call_id` (passed to the
//! template). Everything else is rejected with `param` naming it.
//!
//! The response's message carries `refusal: null` and `annotations: []` (in a stream, the first
//! chunk's delta), and every choice its `logprobs` (null unless asked): the fields OpenAI's
//! schema has even when empty. A reply that called
//! tools has `tool_calls`, `content` null when there was no other text, and `finish_reason`
//! `tool_calls`.

use serde::Serialize;
use serde_json::{Map, Value};

use super::common::{SamplingWire, SAMPLING_FIELDS};
use super::fields::Fields;
use super::tools::{read_message_calls, ToolCallDelta, ToolCallWire, ToolsWire};
use crate::error::ApiError;
use ferry_engine::{ChatMessage, FinishReason, GrammarSpec, TokenLogprob, TokenOutput, Usage};

/// A `/v1/chat/completions` request body, types checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// `model`.
    pub model: String,
    /// `messages`, content parts joined.
    pub messages: Vec<ChatMessage>,
    /// `max_completion_tokens`, or the deprecated `max_tokens`.
    pub max_tokens: Option<i64>,
    /// Which of the two fields gave `max_tokens` (for error messages).
    pub max_tokens_param: &'static str,
    /// `logprobs`.
    pub logprobs: bool,
    /// `top_logprobs`.
    pub top_logprobs: Option<i64>,
    /// Sampling, stop and streaming fields.
    pub sampling: SamplingWire,
    /// `response_format`'s grammar, not yet compiled; `None` for plain text.
    pub response_format: Option<GrammarSpec>,
    /// `tools`, `tool_choice`, `parallel_tool_calls`.
    pub tools: ToolsWire,
    /// Extra chat template variables: `chat_template_kwargs` (vLLM's and llama.cpp's field),
    /// with `reasoning_effort` added as the variable of that name (gpt-oss's template reads it)
    /// unless the kwargs set it.
    pub template_variables: Map<String, Value>,
}

const OWN_FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
    "store",
    "metadata",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "reasoning_effort",
    "verbosity",
    "modalities",
];
/// Fields other servers accept that would change the output and that ferry does not
/// implement: a 400 naming the field (README, "Fields other servers accept").
const UNSUPPORTED: &[&str] = &[
    "functions",
    "function_call",
    "audio",
    "prediction",
    "web_search_options",
    "suffix",
    "echo",
    "best_of",
    "min_tokens",
    "stop_token_ids",
    "include_stop_str_in_output",
    "add_generation_prompt",
    "continue_final_message",
    "documents",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
];

/// The `reasoning_effort` values OpenAI defines.
const REASONING_EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high", "xhigh"];
/// The `verbosity` values OpenAI defines.
const VERBOSITIES: &[&str] = &["low", "medium", "high"];

impl ChatRequest {
    /// Reads a request body.
    pub fn from_json(map: Map<String, Value>) -> Result<Self, ApiError> {
        let mut f = Fields::new(map, "");
        let known: Vec<&str> = OWN_FIELDS.iter().chain(SAMPLING_FIELDS).copied().collect();
        f.reject_others(&known, UNSUPPORTED)?;
        f.only("store", "a boolean", false)?;
        let response_format = read_response_format(&mut f)?;
        let tools = ToolsWire::read(&mut f)?;
        let template_variables = read_template_variables(&mut f)?;
        let _metadata: Option<Map<String, Value>> = f.optional("metadata", "an object")?;
        let model = f.required("model", "a string")?;
        let messages = match f.take_raw("messages") {
            Some(value) => read_messages(value)?,
            None => return Err(ApiError::missing("messages")),
        };
        let old: Option<i64> = f.optional("max_tokens", "an integer")?;
        let new: Option<i64> = f.optional("max_completion_tokens", "an integer")?;
        let (max_tokens, max_tokens_param) = match (new, old) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid_value(
                    "max_tokens",
                    "Give either `max_tokens` or `max_completion_tokens`, not both.",
                ))
            }
            (Some(n), None) => (Some(n), "max_completion_tokens"),
            (None, old) => (old, "max_tokens"),
        };
        Ok(Self {
            model,
            messages,
            max_tokens,
            max_tokens_param,
            logprobs: f.optional("logprobs", "a boolean")?.unwrap_or(false),
            top_logprobs: f.optional("top_logprobs", "an integer")?,
            sampling: SamplingWire::read(&mut f)?,
            response_format,
            tools,
            template_variables,
        })
    }
}

/// `chat_template_kwargs` (an object of template variables, none of the reserved ones),
/// `reasoning_effort` (one of OpenAI's values, a template variable unless the kwargs set it),
/// `verbosity` (checked and ignored: it steers OpenAI's own models; no open model's template
/// reads it) and `modalities` (`["text"]` only).
fn read_template_variables(f: &mut Fields) -> Result<Map<String, Value>, ApiError> {
    let param = f.param("chat_template_kwargs");
    let mut variables: Map<String, Value> = f
        .optional("chat_template_kwargs", "an object")?
        .unwrap_or_default();
    if let Some(name) = variables
        .keys()
        .find(|k| ferry_engine::RESERVED_TEMPLATE_VARIABLES.contains(&k.as_str()))
    {
        return Err(ApiError::invalid_value(
            &param,
            format!(
                "`{param}` may not set `{name}`: the server sets it from the request (reserved: {}).",
                ferry_engine::RESERVED_TEMPLATE_VARIABLES.join(", ")
            ),
        ));
    }
    let one_of =
        |f: &mut Fields, name: &str, allowed: &[&str]| -> Result<Option<String>, ApiError> {
            let value: Option<String> = f.optional(name, "a string")?;
            match value {
                Some(v) if !allowed.contains(&v.as_str()) => Err(ApiError::invalid_value(
                    &f.param(name),
                    format!("`{name}` must be one of {}, got `{v}`.", allowed.join(", ")),
                )),
                other => Ok(other),
            }
        };
    if let Some(effort) = one_of(f, "reasoning_effort", REASONING_EFFORTS)? {
        variables
            .entry("reasoning_effort")
            .or_insert(Value::String(effort));
    }
    one_of(f, "verbosity", VERBOSITIES)?;
    let modalities: Option<Vec<String>> = f.optional("modalities", "an array of strings")?;
    if let Some(other) = modalities.iter().flatten().find(|m| *m != "text") {
        return Err(ApiError::unsupported_value(
            &f.param("modalities"),
            format!("This server writes text only; `modalities` may not include `{other}`."),
        ));
    }
    Ok(variables)
}

/// `response_format`: `{"type": "text"}` (plain text, the default) gives `None`;
/// `{"type": "json_object"}` any JSON object; `{"type": "json_schema", "json_schema": {"name",
/// "schema", "description", "strict"}}` JSON valid against `schema` (`strict` true or false
/// alike: the grammar is always enforced; no `schema` allows any JSON). Any other type is
/// invalid. The schema itself is compiled (and its errors reported) during validation.
fn read_response_format(f: &mut Fields) -> Result<Option<GrammarSpec>, ApiError> {
    let param = f.param("response_format");
    let Some(value) = f.take_raw("response_format") else {
        return Ok(None);
    };
    let mut format = Fields::from_value(value, &param)?;
    let kind: String = format.required("type", "a string")?;
    match kind.as_str() {
        "text" => format.reject_others(&["type"], &[]).map(|()| None),
        "json_object" => format
            .reject_others(&["type"], &[])
            .map(|()| Some(GrammarSpec::JsonObject)),
        "json_schema" => {
            format.reject_others(&["type", "json_schema"], &[])?;
            let inner_param = format.param("json_schema");
            let Some(inner) = format.take_raw("json_schema") else {
                return Err(ApiError::missing(&inner_param));
            };
            let mut inner = Fields::from_value(inner, &inner_param)?;
            inner.reject_others(&["name", "description", "schema", "strict"], &[])?;
            let _name: String = inner.required("name", "a string")?;
            let _description: Option<String> = inner.optional("description", "a string")?;
            let _strict: Option<bool> = inner.optional("strict", "a boolean")?;
            let schema: Option<Map<String, Value>> = inner.optional("schema", "an object")?;
            Ok(Some(GrammarSpec::JsonSchema(
                schema.map_or_else(|| Value::Object(Map::new()), Value::Object),
            )))
        }
        other => Err(ApiError::invalid_value(
            &format.param("type"),
            format!("Unknown `response_format` type `{other}`; expected text, json_object or json_schema."),
        )),
    }
}

fn read_messages(value: Value) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match value {
        Value::Array(items) => items,
        other => return Err(ApiError::invalid_type("messages", "an array", &other)),
    };
    if items.is_empty() {
        return Err(ApiError::invalid_value(
            "messages",
            "`messages` must contain at least one message.",
        ));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| read_message(item, &format!("messages[{i}]")))
        .collect()
}

fn read_message(item: Value, param: &str) -> Result<ChatMessage, ApiError> {
    let mut f = Fields::from_value(item, param)?;
    f.reject_others(
        &[
            "role",
            "content",
            "name",
            "tool_call_id",
            "tool_calls",
            "reasoning_content",
            "annotations",
        ],
        &["function_call", "audio", "refusal"],
    )?;
    // A reply's citations, sent back with it when a client replays the reply's message object
    // (the openai SDK's does, with `annotations: []` and `refusal: null`): not model input.
    let _: Option<Vec<Value>> = f.optional("annotations", "an array")?;
    let role: String = f.required("role", "a string")?;
    let role = match role.as_str() {
        "system" | "developer" => "system",
        "user" => "user",
        "assistant" => "assistant",
        "tool" => "tool",
        other => {
            return Err(ApiError::invalid_value(
                &f.param("role"),
                format!(
                    "Unknown role `{other}`; expected system, developer, user, assistant or tool."
                ),
            ))
        }
    };
    let tool_call_id: Option<String> = f.optional("tool_call_id", "a string")?;
    let calls_param = f.param("tool_calls");
    let tool_calls = match f.take_raw("tool_calls") {
        None => None,
        Some(_) if role != "assistant" => {
            return Err(ApiError::invalid_value(
                &calls_param,
                "Only assistant messages carry `tool_calls`.",
            ))
        }
        Some(value) => Some(read_message_calls(value, &calls_param)?),
    };
    let name: Option<String> = f.optional("name", "a string")?;
    // A reply's reasoning sent back with it (the openai SDK replays the message's extra fields).
    let reasoning_param = f.param("reasoning_content");
    let reasoning_content: Option<String> = f.optional("reasoning_content", "a string")?;
    if reasoning_content.is_some() && role != "assistant" {
        return Err(ApiError::invalid_value(
            &reasoning_param,
            "Only assistant messages carry `reasoning_content`.",
        ));
    }
    let content_param = f.param("content");
    let content = match f.take_raw("content") {
        None if role == "assistant" => String::new(),
        None => return Err(ApiError::missing(&content_param)),
        Some(Value::String(s)) => s,
        Some(Value::Array(parts)) => read_parts(parts, &content_param)?,
        Some(other) => {
            return Err(ApiError::invalid_type(
                &content_param,
                "a string or an array of content parts",
                &other,
            ))
        }
    };
    Ok(ChatMessage {
        role: role.to_owned(),
        content,
        name,
        tool_calls,
        tool_call_id,
        reasoning_content,
    })
}

/// Joins `{"type":"text","text"}` parts with newlines (as vLLM does); other part types are 400.
fn read_parts(parts: Vec<Value>, param: &str) -> Result<String, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for (j, part) in parts.into_iter().enumerate() {
        let mut f = Fields::from_value(part, &format!("{param}[{j}]"))?;
        let kind: String = f.required("type", "a string")?;
        if kind != "text" {
            return Err(ApiError::unsupported_value(
                &f.param("type"),
                format!("Content parts of type `{kind}` are not supported; only `text` parts are."),
            ));
        }
        f.reject_others(&["text"], &[])?;
        texts.push(f.required::<String>("text", "a string")?);
    }
    Ok(texts.join("\n"))
}

/// A non-streamed chat completion.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletionResponse {
    /// `chatcmpl-...`.
    pub id: String,
    /// Always `"chat.completion"`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model name as the client sent it.
    pub model: String,
    /// One choice per `n`, in index order.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
}

/// One choice of a chat completion.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    /// Its place among the `n` choices.
    pub index: u32,
    /// The assistant's message.
    pub message: ChatResponseMessage,
    /// Per-token logprobs when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// Why generation ended.
    pub finish_reason: Option<ChatFinishReason>,
}

/// A chat choice's `finish_reason`: the engine's, or `tool_calls` when the reply called tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatFinishReason {
    /// EOS or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The reply ended after calling tools.
    ToolCalls,
}

impl ChatFinishReason {
    /// The reason of a reply that ended for `reason` having made `calls` calls.
    pub fn of(reason: FinishReason, calls: usize) -> Self {
        match reason {
            FinishReason::Length => Self::Length,
            FinishReason::Stop if calls > 0 => Self::ToolCalls,
            FinishReason::Stop => Self::Stop,
        }
    }
}

/// `{"role":"assistant","content":...,"refusal":null,"annotations":[]}`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatResponseMessage {
    /// Always `"assistant"`.
    pub role: &'static str,
    /// The generated text; `null` when the reply was only tool calls.
    pub content: Option<String>,
    /// A reasoning template's thinking, apart from `content` (vLLM's and llama.cpp's field);
    /// absent when the reply had none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Always `null` (this server never refuses in words); required by OpenAI's schema.
    pub refusal: Option<String>,
    /// Always empty (this server cites no sources); OpenAI's message always has it.
    pub annotations: Vec<Value>,
    /// The reply's tool calls; absent when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallWire>>,
}

/// One `chat.completion.chunk` event.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletionChunk {
    /// The same in every chunk of a stream.
    pub id: String,
    /// Always `"chat.completion.chunk"`.
    pub object: &'static str,
    /// The same in every chunk of a stream.
    pub created: u64,
    /// The model name as the client sent it.
    pub model: String,
    /// One choice (any of the `n`), or none in the final usage chunk.
    pub choices: Vec<ChatChunkChoice>,
    /// `null` except in the final usage chunk when `stream_options.include_usage`; absent
    /// otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// A chunk's choice.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChunkChoice {
    /// Which of the `n` choices this chunk continues.
    pub index: u32,
    /// What this chunk adds.
    pub delta: ChatDelta,
    /// This chunk's token logprobs when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// Non-null in exactly one chunk per choice, its last.
    pub finish_reason: Option<ChatFinishReason>,
}

/// A chunk's delta: the role (with empty `content` and `annotations`) in the first chunk,
/// then content.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatDelta {
    /// `"assistant"` in the first chunk only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// New reasoning text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// `[]` in the first chunk only, as in the whole message.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Vec<Value>>,
    /// Pieces of tool calls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// `{"content": [...]}`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<ChatTokenLogprob>,
}

/// One generated token's logprob with its alternatives.
#[derive(Debug, Clone, Serialize)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its logprob.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely alternatives, most likely first.
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// An alternative token.
#[derive(Debug, Clone, Serialize)]
pub struct ChatTopLogprob {
    /// The token's text.
    pub token: String,
    /// Its logprob.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
}

impl From<&TokenLogprob> for ChatTopLogprob {
    fn from(l: &TokenLogprob) -> Self {
        Self {
            token: l.token.clone(),
            logprob: l.logprob,
            bytes: l.bytes.clone(),
        }
    }
}

impl ChatTokenLogprob {
    /// The entry for one generated token, if the engine reported its logprob.
    pub fn from_output(out: &TokenOutput) -> Option<Self> {
        let chosen = out.logprob.as_ref()?;
        Some(Self {
            token: chosen.token.clone(),
            logprob: chosen.logprob,
            bytes: chosen.bytes.clone(),
            top_logprobs: out.top_logprobs.iter().map(ChatTopLogprob::from).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_engine::tool_calls::ToolChoice;
    use serde_json::json;

    fn req(v: Value) -> Result<ChatRequest, ApiError> {
        let Value::Object(map) = v else { panic!() };
        ChatRequest::from_json(map)
    }

    #[test]
    fn a_replayed_reply_with_its_annotations_and_null_refusal_is_accepted() {
        let r = req(json!({"model": "m", "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello", "refusal": null, "annotations": [],
             "audio": null, "function_call": null, "tool_calls": null},
            {"role": "user", "content": "again"}]}))
        .unwrap();
        assert_eq!(r.messages[1].content.as_str(), "hello");
        let err = req(json!({"model": "m", "messages": [
            {"role": "assistant", "content": "x", "annotations": "none"}]}))
        .unwrap_err();
        assert!(format!("{err:?}").contains("annotations"), "{err:?}");
        let err = req(json!({"model": "m", "messages": [
            {"role": "assistant", "content": "x", "refusal": "no"}]}))
        .unwrap_err();
        assert!(format!("{err:?}").contains("refusal"), "{err:?}");
    }

    #[test]
    fn messages_and_parts() {
        let r = req(json!({"model": "m", "messages": [
            {"role": "developer", "content": "be nice"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null}]}))
        .unwrap();
        let got: Vec<(&str, &str)> = r
            .messages
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect();
        assert_eq!(
            got,
            [("system", "be nice"), ("user", "a\nb"), ("assistant", "")]
        );
        let r = req(
            json!({"model": "m", "response_format": {"type": "text"}, "messages": [
            {"role": "user", "content": "hi", "name": "bob"}]}),
        )
        .unwrap();
        assert_eq!(r.messages[0].name.as_deref(), Some("bob"));
        assert_eq!(r.messages[0].content, "hi");
    }

    #[test]
    fn tools_and_past_calls_are_read() {
        let r = req(json!({"model": "m",
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "d",
                "parameters": {"type": "object"}, "strict": true}}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": false,
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]}))
        .unwrap();
        assert_eq!(r.tools.tools[0].name, "get_weather");
        assert_eq!(
            r.tools.choice,
            Some(ToolChoice::Named("get_weather".into()))
        );
        assert!(!r.tools.parallel);
        let calls = r.messages[1].tool_calls.as_ref().unwrap();
        assert_eq!(
            calls[0]["function"]["arguments"],
            json!({"city": "Paris"}),
            "arguments reach the template as JSON"
        );
        assert_eq!(r.messages[2].tool_call_id.as_deref(), Some("call_1"));
        let r = req(json!({"model": "m", "messages": [{"role": "user", "content": "x"}]})).unwrap();
        assert_eq!(
            (
                r.tools.tools.len(),
                r.tools.choice.clone(),
                r.tools.parallel
            ),
            (0, None, true)
        );
    }

    #[test]
    fn rejections_name_their_param() {
        let cases = [
            (
                json!({"model": "m", "messages": []}),
                "messages",
                "invalid_value",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}),
                "messages[0].content[0].type",
                "unsupported_value",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x", "name": 7}]}),
                "messages[0].name",
                "invalid_type",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}}),
                "response_format.json_schema",
                "missing_required_parameter",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": 5}}}),
                "response_format.json_schema.schema",
                "invalid_type",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}}),
                "response_format.type",
                "invalid_value",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": "text"}),
                "response_format",
                "invalid_type",
            ),
            (
                json!({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}),
                "messages[0].role",
                "invalid_value",
            ),
            (
                json!({"model": "m", "messages": [], "functions": []}),
                "functions",
                "unsupported_parameter",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"description": "d"}}]}),
                "tools[0].function.name",
                "missing_required_parameter",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "a b"}}]}),
                "tools[0].function.name",
                "invalid_value",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}),
                "tools[0].function.parameters",
                "invalid_type",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}),
                "tool_choice",
                "invalid_value",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
                "tool_choice",
                "invalid_value",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x", "tool_calls": []}]}),
                "messages[0].tool_calls",
                "invalid_value",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "max_completion_tokens": 2}),
                "max_tokens",
                "invalid_value",
            ),
        ];
        for (body, param, code) in cases {
            let e = req(body.clone()).unwrap_err();
            assert_eq!((e.param(), e.code()), (Some(param), Some(code)), "{body}");
        }
    }
}
