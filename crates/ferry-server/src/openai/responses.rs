//! `POST /v1/responses` request as read from JSON (OpenAI's Responses API): types checked,
//! unsupported fields rejected, and turned into the chat request the rest of the server already
//! validates ([`ResponsesRequest::chat`]), plus what only the Responses API has (`instructions`,
//! `previous_response_id`, `store`) and the fields the response object echoes.
//!
//! Accepted: `model`, `input` (a string: one user message; or an array of items, below),
//! `instructions` (a system message before everything, not carried over to a continuation),
//! `previous_response_id`, `store` (default true), `stream`, `stream_options`
//! (`include_obfuscation`, ignored: ferry adds no obfuscation), `max_output_tokens`,
//! `temperature`, `top_p`, `tools` (flat function tools `{"type":"function","name",
//! "description","parameters","strict"}`), `tool_choice` (`none`, `auto`, `required`,
//! `{"type":"function","name"}`), `parallel_tool_calls`, `text` (`format`: `text`, `json_object`
//! or `{"type":"json_schema","name","schema","description","strict"}`, compiled into the same
//! grammar as chat's `response_format`; `verbosity` checked, ignored), `reasoning` (`effort`,
//! `summary`: echoed; `effort` becomes the template variable `reasoning_effort`; a reasoning
//! template's thinking comes back as a `reasoning` item, without summaries), `truncation` (`disabled` only), `metadata` (echoed), `include` (empty only), and
//! ferry's sampling extensions shared with chat (`top_k`, `min_p`, `seed`, the penalties,
//! `stop`, `ignore_eos`, `cache_salt`). Accepted and ignored: `user`, `prompt_cache_key`,
//! `safety_identifier`, `service_tier` ([`super::common::IGNORED_FIELDS`]).
//!
//! Input items ([`super::response_input`]): messages (`{"role","content"}` with `type: "message"` optional; roles `user`,
//! `system`, `developer` (as system), `assistant`; content a string or `input_text` /
//! `output_text` parts), `function_call` (`call_id`, `name`, `arguments`: joined to the
//! assistant turn before it), `function_call_output` (`call_id`, `output`: a tool message) and
//! `reasoning` (dropped: the templates drop past reasoning too). Item `id` and `status` are accepted and
//! ignored. Anything else (images, files, audio, other item and tool types, `background`,
//! `conversation`, `prompt`, `max_tool_calls`, `top_logprobs`) is rejected with `param` naming
//! it.

use serde_json::{Map, Value};

use super::chat::ChatRequest;
use super::common::{SamplingWire, SAMPLING_FIELDS};
use super::fields::Fields;
use super::response_input::{message, read_items};
use super::tools::{check_choice, choice_keyword, read_function, ToolsWire};
use crate::error::ApiError;
use ferry_engine::tool_calls::{ToolChoice, ToolSpec};
use ferry_engine::GrammarSpec;

/// A `/v1/responses` request, types checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesRequest {
    /// The chat request it stands for, `messages` holding only this request's `input` (the
    /// handler puts `instructions` and the previous conversation before them).
    pub chat: ChatRequest,
    /// `instructions`.
    pub instructions: Option<String>,
    /// `previous_response_id`.
    pub previous_response_id: Option<String>,
    /// `store` (default true).
    pub store: bool,
    /// What the response object echoes.
    pub echo: Echo,
}

/// The request fields a response object repeats, as the client sent them (or their defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct Echo {
    /// `max_output_tokens`.
    pub max_output_tokens: Option<i64>,
    /// `temperature`.
    pub temperature: Option<f64>,
    /// `top_p`.
    pub top_p: Option<f64>,
    /// `tools` as sent.
    pub tools: Vec<Value>,
    /// `tool_choice` as sent (`"auto"` when absent).
    pub tool_choice: Value,
    /// `parallel_tool_calls`.
    pub parallel_tool_calls: bool,
    /// `text` with its `format` (`{"format":{"type":"text"}}` when absent).
    pub text: Value,
    /// `reasoning` as sent (`{"effort":null,"summary":null}` when absent).
    pub reasoning: Value,
    /// `metadata` (`{}` when absent).
    pub metadata: Map<String, Value>,
    /// `user`.
    pub user: Option<String>,
}

const OWN_FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "previous_response_id",
    "store",
    "max_output_tokens",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "reasoning",
    "truncation",
    "metadata",
    "include",
];

/// Responses fields ferry does not implement (each would change what is generated or how).
const UNSUPPORTED: &[&str] = &[
    "background",
    "conversation",
    "prompt",
    "max_tool_calls",
    "top_logprobs",
];

/// Chat-only fields of [`SAMPLING_FIELDS`] that the Responses API does not have.
const NOT_RESPONSES: &[&str] = &["n", "logit_bias"];

impl ResponsesRequest {
    /// Reads a request body.
    pub fn from_json(map: Map<String, Value>) -> Result<Self, ApiError> {
        let mut f = Fields::new(map, "");
        let known: Vec<&str> = OWN_FIELDS
            .iter()
            .chain(
                SAMPLING_FIELDS
                    .iter()
                    .filter(|k| !NOT_RESPONSES.contains(k)),
            )
            .copied()
            .collect();
        f.reject_others(&known, UNSUPPORTED)?;
        let model: String = f.required("model", "a string")?;
        let instructions: Option<String> = f.optional("instructions", "a string")?;
        let previous_response_id: Option<String> =
            f.optional("previous_response_id", "a string")?;
        let store = f.optional("store", "a boolean")?.unwrap_or(true);
        f.only("truncation", "a string", "disabled".to_owned())?;
        read_include(&mut f)?;
        let metadata: Option<Map<String, Value>> = f.optional("metadata", "an object")?;
        let reasoning = read_reasoning(&mut f)?;
        let (response_format, text) = read_text(&mut f)?;
        let echo_tools = match f.take_raw("tools") {
            None => Vec::new(),
            Some(Value::Array(items)) => items,
            Some(other) => return Err(ApiError::invalid_type("tools", "an array", &other)),
        };
        let tools = echo_tools
            .iter()
            .enumerate()
            .map(|(i, item)| read_tool(item.clone(), &format!("tools[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        let echo_choice = f.take_raw("tool_choice");
        let choice = echo_choice
            .clone()
            .map(|v| read_choice(v, &tools))
            .transpose()?;
        let parallel = f
            .optional("parallel_tool_calls", "a boolean")?
            .unwrap_or(true);
        let max_output_tokens: Option<i64> = f.optional("max_output_tokens", "an integer")?;
        let messages = match f.take_raw("input") {
            Some(Value::String(text)) => vec![message("user", text)],
            Some(Value::Array(items)) => read_items(items)?,
            Some(other) => {
                return Err(ApiError::invalid_type(
                    "input",
                    "a string or an array of input items",
                    &other,
                ))
            }
            None => return Err(ApiError::missing("input")),
        };
        if messages.is_empty() && previous_response_id.is_none() {
            return Err(ApiError::invalid_value(
                "input",
                "`input` must contain at least one item.",
            ));
        }
        // Read before the sampling fields ignore it: the response echoes it.
        let user: Option<String> = f.optional("user", "a string")?;
        let sampling = read_sampling(&mut f)?;
        // `reasoning.effort` reaches the chat template as `reasoning_effort`, as chat's field
        // does (gpt-oss's template reads it).
        let mut template_variables = Map::new();
        if let Some(effort) = reasoning.get("effort").filter(|e| e.is_string()) {
            template_variables.insert("reasoning_effort".to_owned(), effort.clone());
        }
        let echo = Echo {
            max_output_tokens,
            temperature: sampling.temperature,
            top_p: sampling.top_p,
            tools: echo_tools,
            tool_choice: echo_choice.unwrap_or_else(|| Value::from("auto")),
            parallel_tool_calls: parallel,
            text,
            reasoning,
            metadata: metadata.unwrap_or_default(),
            user,
        };
        let chat = ChatRequest {
            model,
            messages,
            max_tokens: max_output_tokens,
            max_tokens_param: "max_output_tokens",
            logprobs: false,
            top_logprobs: None,
            sampling,
            response_format,
            tools: ToolsWire {
                tools,
                choice,
                parallel,
            },
            template_variables,
        };
        Ok(Self {
            chat,
            instructions,
            previous_response_id,
            store,
            echo,
        })
    }
}

/// The shared sampling fields; Responses' `stream_options` (`include_obfuscation`) is read
/// here, since chat's `include_usage` means nothing to a Responses stream.
fn read_sampling(f: &mut Fields) -> Result<SamplingWire, ApiError> {
    let options = f.take_raw("stream_options");
    let mut sampling = SamplingWire::read(f)?;
    if let Some(value) = options {
        if !sampling.stream {
            return Err(ApiError::invalid_value(
                "stream_options",
                "`stream_options` is only allowed when `stream` is true.",
            ));
        }
        let mut options = Fields::from_value(value, "stream_options")?;
        options.reject_others(&["include_obfuscation"], &[])?;
        let _ignored: Option<bool> = options.optional("include_obfuscation", "a boolean")?;
    }
    sampling.include_usage = false;
    Ok(sampling)
}

/// `include`: only an empty list (every extra it names is output ferry does not produce).
fn read_include(f: &mut Fields) -> Result<(), ApiError> {
    match f.take_raw("include") {
        None => Ok(()),
        Some(Value::Array(items)) if items.is_empty() => Ok(()),
        Some(Value::Array(_)) => Err(ApiError::unsupported_value(
            "include",
            "`include` is not supported by this server; send it empty or leave it out.",
        )),
        Some(other) => Err(ApiError::invalid_type("include", "an array", &other)),
    }
}

/// `reasoning`: `effort` and `summary` are read and echoed, not applied.
fn read_reasoning(f: &mut Fields) -> Result<Value, ApiError> {
    let Some(value) = f.take_raw("reasoning") else {
        return Ok(serde_json::json!({"effort": null, "summary": null}));
    };
    let mut r = Fields::from_value(value, "reasoning")?;
    r.reject_others(&["effort", "summary", "generate_summary"], &[])?;
    let effort: Option<String> = r.optional("effort", "a string")?;
    if let Some(effort) = &effort {
        if !["none", "minimal", "low", "medium", "high", "xhigh"].contains(&effort.as_str()) {
            return Err(ApiError::invalid_value(
                "reasoning.effort",
                format!("Unknown `reasoning.effort` `{effort}`; expected none, minimal, low, medium, high or xhigh."),
            ));
        }
    }
    let summary: Option<String> = r.optional("summary", "a string")?;
    let _old: Option<String> = r.optional("generate_summary", "a string")?;
    Ok(serde_json::json!({"effort": effort, "summary": summary}))
}

/// `text`: its `format` as a grammar (`None` for plain text) and the echo of `text`.
fn read_text(f: &mut Fields) -> Result<(Option<GrammarSpec>, Value), ApiError> {
    let plain = serde_json::json!({"format": {"type": "text"}, "verbosity": "medium"});
    let Some(value) = f.take_raw("text") else {
        return Ok((None, plain));
    };
    let mut text = Fields::from_value(value, "text")?;
    text.reject_others(&["format", "verbosity"], &[])?;
    // `verbosity` steers OpenAI's own models; accepted and ignored as in chat.
    let verbosity: Option<String> = text.optional("verbosity", "a string")?;
    if let Some(v) = verbosity.filter(|v| !["low", "medium", "high"].contains(&v.as_str())) {
        return Err(ApiError::invalid_value(
            "text.verbosity",
            format!("`text.verbosity` must be one of low, medium, high, got `{v}`."),
        ));
    }
    let Some(format) = text.take_raw("format") else {
        return Ok((None, plain));
    };
    let echo = serde_json::json!({"format": format.clone(), "verbosity": "medium"});
    let mut format = Fields::from_value(format, "text.format")?;
    let kind: String = format.required("type", "a string")?;
    let spec = match kind.as_str() {
        "text" => format.reject_others(&["type"], &[]).map(|()| None)?,
        "json_object" => format
            .reject_others(&["type"], &[])
            .map(|()| Some(GrammarSpec::JsonObject))?,
        "json_schema" => {
            format.reject_others(&["type", "name", "description", "schema", "strict"], &[])?;
            let _name: String = format.required("name", "a string")?;
            let _description: Option<String> = format.optional("description", "a string")?;
            let _strict: Option<bool> = format.optional("strict", "a boolean")?;
            let schema: Option<Map<String, Value>> = format.optional("schema", "an object")?;
            Some(GrammarSpec::JsonSchema(
                schema.map_or_else(|| Value::Object(Map::new()), Value::Object),
            ))
        }
        other => {
            return Err(ApiError::invalid_value(
                "text.format.type",
                format!(
                    "Unknown `text.format` type `{other}`; expected text, json_object or \
                     json_schema."
                ),
            ))
        }
    };
    Ok((spec, echo))
}

/// A flat function tool: `{"type":"function","name","description","parameters","strict"}`.
fn read_tool(item: Value, param: &str) -> Result<ToolSpec, ApiError> {
    let mut f = Fields::from_value(item, param)?;
    let kind: String = f.required("type", "a string")?;
    if kind != "function" {
        return Err(ApiError::unsupported_value(
            &f.param("type"),
            format!("Tools of type `{kind}` are not supported; only `function` tools are."),
        ));
    }
    f.reject_others(&["name", "description", "parameters", "strict"], &[])?;
    read_function(&mut f)
}

/// `tool_choice`: `none`, `auto`, `required` or `{"type":"function","name"}` naming a tool.
fn read_choice(value: Value, tools: &[ToolSpec]) -> Result<ToolChoice, ApiError> {
    const PARAM: &str = "tool_choice";
    let choice = match value {
        Value::String(s) => choice_keyword(&s, PARAM)?,
        other => {
            let mut f = Fields::from_value(other, PARAM)?;
            let kind: String = f.required("type", "a string")?;
            if kind != "function" {
                return Err(ApiError::unsupported_value(
                    "tool_choice.type",
                    format!("`tool_choice` of type `{kind}` is not supported; expected function."),
                ));
            }
            f.reject_others(&["name"], &[])?;
            ToolChoice::Named(f.required("name", "a string")?)
        }
    };
    check_choice(choice, PARAM, tools)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(v: Value) -> Result<ResponsesRequest, ApiError> {
        let Value::Object(map) = v else { panic!() };
        ResponsesRequest::from_json(map)
    }

    #[test]
    fn a_string_input_is_one_user_message() {
        let r = req(
            json!({"model": "m", "input": "hi", "instructions": "be brief",
            "max_output_tokens": 5, "temperature": 0.5, "user": "u"}),
        )
        .unwrap();
        assert_eq!(r.chat.messages, vec![message("user", "hi".into())]);
        assert_eq!(r.instructions.as_deref(), Some("be brief"));
        assert_eq!(r.chat.max_tokens, Some(5));
        assert_eq!(r.chat.max_tokens_param, "max_output_tokens");
        assert_eq!(r.chat.sampling.temperature, Some(0.5));
        assert!(r.store);
        assert_eq!(r.echo.user.as_deref(), Some("u"));
        assert_eq!(r.echo.tool_choice, json!("auto"));
    }

    #[test]
    fn items_become_chat_messages() {
        let r = req(json!({"model": "m", "store": false, "input": [
            {"role": "developer", "content": "sys"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "c", "annotations": []}]},
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{\"x\": 1}"},
            {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": "oops"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call_output", "call_id": "call_1", "output": "42"}
        ]}));
        let r = r.unwrap_or_else(|e| panic!("{e:?}"));
        assert!(!r.store);
        let m = &r.chat.messages;
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        assert_eq!(m[1].content, "a\nb");
        assert_eq!(m[2].content, "c");
        let calls = m[2].tool_calls.as_ref().unwrap();
        assert_eq!(calls[0]["function"]["arguments"], json!({"x": 1}));
        assert_eq!(calls[1]["function"]["arguments"], json!("oops"));
        assert_eq!(m[3].tool_call_id.as_deref(), Some("call_1"));
        assert_eq!(m[3].content, "42");
    }

    #[test]
    fn tools_text_format_and_reasoning_are_read() {
        let r = req(json!({"model": "m", "input": "x",
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "parallel_tool_calls": false,
            "reasoning": {"effort": "low"},
            "text": {"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"}}},
            "stream": true, "stream_options": {"include_obfuscation": false}}))
        .unwrap();
        assert_eq!(r.chat.tools.tools[0].name, "get_weather");
        assert_eq!(
            r.chat.tools.choice,
            Some(ToolChoice::Named("get_weather".into()))
        );
        assert!(!r.chat.tools.parallel);
        assert_eq!(
            r.chat.response_format,
            Some(GrammarSpec::JsonSchema(json!({"type": "object"})))
        );
        assert_eq!(r.echo.reasoning["effort"], "low");
        assert_eq!(r.echo.text["format"]["name"], "s");
        assert!(r.chat.sampling.stream && !r.chat.sampling.include_usage);
        let r =
            req(json!({"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}}))
                .unwrap();
        assert_eq!(r.chat.response_format, Some(GrammarSpec::JsonObject));
    }

    #[test]
    fn rejections_name_their_param() {
        let cases = [
            (json!({"model": "m"}), "input", "missing_required_parameter"),
            (json!({"input": "x"}), "model", "missing_required_parameter"),
            (json!({"model": "m", "input": []}), "input", "invalid_value"),
            (json!({"model": "m", "input": 5}), "input", "invalid_type"),
            (
                json!({"model": "m", "input": "x", "n": 2}),
                "n",
                "unknown_parameter",
            ),
            (
                json!({"model": "m", "input": "x", "messages": []}),
                "messages",
                "unknown_parameter",
            ),
            (
                json!({"model": "m", "input": "x", "background": true}),
                "background",
                "unsupported_parameter",
            ),
            (
                json!({"model": "m", "input": "x", "truncation": "auto"}),
                "truncation",
                "unsupported_value",
            ),
            (
                json!({"model": "m", "input": "x", "include": ["reasoning.encrypted_content"]}),
                "include",
                "unsupported_value",
            ),
            (
                json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}),
                "input[0].content[0].type",
                "unsupported_value",
            ),
            (
                json!({"model": "m", "input": [{"role": "wizard", "content": "x"}]}),
                "input[0].role",
                "invalid_value",
            ),
            (
                json!({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}),
                "input[0].type",
                "unsupported_value",
            ),
            (
                json!({"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
                "input[0].call_id",
                "missing_required_parameter",
            ),
            (
                json!({"model": "m", "input": [{"type": "function_call_output", "call_id": "c"}]}),
                "input[0].output",
                "missing_required_parameter",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "web_search"}]}),
                "tools[0].type",
                "unsupported_value",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "function", "name": "a b"}]}),
                "tools[0].name",
                "invalid_value",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}),
                "tools[0].function",
                "unknown_parameter",
            ),
            (
                json!({"model": "m", "input": "x", "tool_choice": "required"}),
                "tool_choice",
                "invalid_value",
            ),
            (
                json!({"model": "m", "input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function", "name": "g"}}),
                "tool_choice",
                "invalid_value",
            ),
            (
                json!({"model": "m", "input": "x", "text": {"format": {"type": "yaml"}}}),
                "text.format.type",
                "invalid_value",
            ),
            (
                json!({"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}),
                "text.format.name",
                "missing_required_parameter",
            ),
            (
                json!({"model": "m", "input": "x", "reasoning": {"effort": "extreme"}}),
                "reasoning.effort",
                "invalid_value",
            ),
            (
                json!({"model": "m", "input": "x", "stream_options": {"include_obfuscation": true}}),
                "stream_options",
                "invalid_value",
            ),
            (
                json!({"model": "m", "input": "x", "store": "yes"}),
                "store",
                "invalid_type",
            ),
        ];
        for (body, param, code) in cases {
            let e = req(body.clone()).unwrap_err();
            assert_eq!((e.param(), e.code()), (Some(param), Some(code)), "{body}");
        }
    }
}
