//! Tool calling on the wire: `tools`, `tool_choice` and `parallel_tool_calls` as read from a
//! chat request, an assistant message's `tool_calls` in the history, and the calls of a
//! response (`message.tool_calls`) and of its stream chunks (`delta.tool_calls`).
//!
//! `tools[i]` must be `{"type": "function", "function": {"name", "description", "parameters",
//! "strict"}}` with a name of letters, digits, `_` and `-` (at most 64, as OpenAI's); `strict`
//! is accepted (the grammar of `required` is always strict). `tool_choice` is `none`, `auto`,
//! `required` or `{"type": "function", "function": {"name"}}` naming one of the tools; without
//! tools only `none` and `auto` make sense.

use serde::Serialize;
use serde_json::{Map, Value};

use super::fields::Fields;
use crate::error::ApiError;
use ferry_engine::tool_calls::{ToolChoice, ToolSpec};

/// The tool fields of a chat request.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolsWire {
    /// `tools` (empty when not given).
    pub tools: Vec<ToolSpec>,
    /// `tool_choice`, checked against `tools`; `None` when not given.
    pub choice: Option<ToolChoice>,
    /// `parallel_tool_calls` (default true).
    pub parallel: bool,
}

impl ToolsWire {
    /// Reads `tools`, `tool_choice` and `parallel_tool_calls` from a request.
    pub fn read(f: &mut Fields) -> Result<Self, ApiError> {
        let tools = match f.take_raw("tools") {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .into_iter()
                .enumerate()
                .map(|(i, item)| read_tool(item, &f.param(&format!("tools[{i}]"))))
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(ApiError::invalid_type(
                    &f.param("tools"),
                    "an array",
                    &other,
                ))
            }
        };
        let param = f.param("tool_choice");
        let choice = f
            .take_raw("tool_choice")
            .map(|v| read_choice(v, &param, &tools))
            .transpose()?;
        let parallel = f
            .optional("parallel_tool_calls", "a boolean")?
            .unwrap_or(true);
        Ok(Self {
            tools,
            choice,
            parallel,
        })
    }
}

fn read_tool(item: Value, param: &str) -> Result<ToolSpec, ApiError> {
    let mut f = Fields::from_value(item, param)?;
    f.reject_others(&["type", "function"], &[])?;
    let kind: String = f.required("type", "a string")?;
    if kind != "function" {
        return Err(ApiError::invalid_value(
            &f.param("type"),
            format!("Unknown tool type `{kind}`; only `function` tools are supported."),
        ));
    }
    let function_param = f.param("function");
    let Some(function) = f.take_raw("function") else {
        return Err(ApiError::missing(&function_param));
    };
    let mut g = Fields::from_value(function, &function_param)?;
    g.reject_others(&["name", "description", "parameters", "strict"], &[])?;
    read_function(&mut g)
}

/// A function's `name`, `description`, `parameters` and `strict`, read from `g` (chat's
/// `tools[i].function`, or a Responses tool, where they sit beside `type`).
pub fn read_function(g: &mut Fields) -> Result<ToolSpec, ApiError> {
    let name: String = g.required("name", "a string")?;
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(ApiError::invalid_value(
            &g.param("name"),
            format!(
                "Invalid function name `{name}`: use 1 to 64 letters, digits, underscores or \
                 dashes."
            ),
        ));
    }
    let description: Option<String> = g.optional("description", "a string")?;
    let _strict: Option<bool> = g.optional("strict", "a boolean")?;
    let parameters: Option<Map<String, Value>> = g.optional("parameters", "an object")?;
    Ok(ToolSpec {
        name,
        description,
        parameters: Value::Object(parameters.unwrap_or_default()),
    })
}

fn read_choice(value: Value, param: &str, tools: &[ToolSpec]) -> Result<ToolChoice, ApiError> {
    let choice = match value {
        Value::String(s) => choice_keyword(&s, param)?,
        other => {
            let mut f = Fields::from_value(other, param)?;
            f.reject_others(&["type", "function"], &[])?;
            let kind: String = f.required("type", "a string")?;
            if kind != "function" {
                return Err(ApiError::invalid_value(
                    &f.param("type"),
                    format!("Unknown `tool_choice` type `{kind}`; expected function."),
                ));
            }
            let function_param = f.param("function");
            let Some(function) = f.take_raw("function") else {
                return Err(ApiError::missing(&function_param));
            };
            let mut g = Fields::from_value(function, &function_param)?;
            g.reject_others(&["name"], &[])?;
            ToolChoice::Named(g.required("name", "a string")?)
        }
    };
    check_choice(choice, param, tools)
}

/// `tool_choice` given as a string: `none`, `auto` or `required` (chat's and the Responses
/// API's alike).
pub(crate) fn choice_keyword(text: &str, param: &str) -> Result<ToolChoice, ApiError> {
    match text {
        "none" => Ok(ToolChoice::None),
        "auto" => Ok(ToolChoice::Auto),
        "required" => Ok(ToolChoice::Required),
        other => Err(ApiError::invalid_value(
            param,
            format!(
                "Unknown `tool_choice` `{other}`; expected none, auto, required or a function."
            ),
        )),
    }
}

/// `choice` if the offered `tools` allow it: `required` needs a tool, a named function must be
/// one of them.
pub(crate) fn check_choice(
    choice: ToolChoice,
    param: &str,
    tools: &[ToolSpec],
) -> Result<ToolChoice, ApiError> {
    match &choice {
        ToolChoice::Required if tools.is_empty() => Err(ApiError::invalid_value(
            param,
            "`tool_choice` is `required` but the request offers no `tools`.",
        )),
        ToolChoice::Named(name) if !tools.iter().any(|t| &t.name == name) => {
            Err(ApiError::invalid_value(
                param,
                format!("`tool_choice` names the function `{name}`, which is not in `tools`."),
            ))
        }
        _ => Ok(choice),
    }
}

/// An assistant message's `tool_calls`, as the chat template sees them: OpenAI's shape with
/// `arguments` parsed into a JSON value (templates write it with `tojson`), kept as the string
/// when it is not JSON.
pub fn read_message_calls(value: Value, param: &str) -> Result<Vec<Value>, ApiError> {
    let items = match value {
        Value::Array(items) => items,
        other => return Err(ApiError::invalid_type(param, "an array", &other)),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let mut f = Fields::from_value(item, &format!("{param}[{i}]"))?;
            f.reject_others(&["id", "type", "function"], &[])?;
            let id: Option<String> = f.optional("id", "a string")?;
            let _kind: Option<String> = f.optional("type", "a string")?;
            let function_param = f.param("function");
            let Some(function) = f.take_raw("function") else {
                return Err(ApiError::missing(&function_param));
            };
            let mut g = Fields::from_value(function, &function_param)?;
            g.reject_others(&["name", "arguments"], &[])?;
            let name: String = g.required("name", "a string")?;
            let arguments: String = g.optional("arguments", "a string")?.unwrap_or_default();
            let arguments =
                serde_json::from_str::<Value>(&arguments).unwrap_or(Value::String(arguments));
            Ok(serde_json::json!({
                "id": id.unwrap_or_default(),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }))
        })
        .collect()
}

/// One call in a response's `message.tool_calls`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallWire {
    /// `call_...`, unique in the response.
    pub id: String,
    /// Always `"function"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The call.
    pub function: FunctionWire,
}

/// A call's function: its name and arguments (a JSON object's text).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionWire {
    /// The function's name.
    pub name: String,
    /// The arguments' JSON text.
    pub arguments: String,
}

/// One call's piece in a chunk's `delta.tool_calls`: the first carries `id`, `type` and the
/// name, the later ones only argument fragments; `index` says which call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallDelta {
    /// The call's place among the choice's calls.
    pub index: usize,
    /// In the call's first piece only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `"function"` in the first piece only.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// The name (first piece) and/or an arguments fragment.
    pub function: FunctionDelta,
}

/// A function's piece in a stream.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionDelta {
    /// In the call's first piece only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The next fragment of the arguments (`""` in the first piece).
    pub arguments: String,
}
