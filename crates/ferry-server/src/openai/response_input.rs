//! The Responses API's `input` items as chat messages: messages (`{"role","content"}`, `type:
//! "message"` optional) with `input_text` / `output_text` parts, `function_call` items joined
//! to the assistant turn before them as its calls (in the shape chat templates read),
//! `function_call_output` items as tool messages, and `reasoning` items dropped (reasoning
//! templates drop past reasoning). Item `id` and `status` are accepted and ignored; other item and part types
//! are 400 `unsupported_value` naming them.

use serde_json::Value;

use super::fields::Fields;
use crate::error::ApiError;
use ferry_engine::ChatMessage;

/// A message of `role` holding `content`.
pub fn message(role: &str, content: String) -> ChatMessage {
    ChatMessage {
        role: role.to_owned(),
        content,
        ..ChatMessage::default()
    }
}

/// `input` items as chat messages: consecutive `function_call`s join the assistant turn before
/// them (or start one), a `function_call_output` is a tool message.
pub fn read_items(items: Vec<Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let mut messages: Vec<ChatMessage> = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let param = format!("input[{i}]");
        let mut f = Fields::from_value(item, &param)?;
        let kind: Option<String> = f.optional("type", "a string")?;
        match kind.as_deref() {
            None | Some("message") => messages.push(read_message(f)?),
            Some("function_call") => {
                f.reject_others(&["call_id", "name", "arguments", "id", "status"], &[])?;
                let call_id: String = f.required("call_id", "a string")?;
                let name: String = f.required("name", "a string")?;
                let arguments: String = f.required("arguments", "a string")?;
                let _ignored: (Option<String>, Option<String>) = (
                    f.optional("id", "a string")?,
                    f.optional("status", "a string")?,
                );
                let call = template_call(&call_id, &name, &arguments);
                match messages.last_mut() {
                    Some(m) if m.role == "assistant" => {
                        m.tool_calls.get_or_insert_with(Vec::new).push(call)
                    }
                    _ => messages.push(ChatMessage {
                        tool_calls: Some(vec![call]),
                        ..message("assistant", String::new())
                    }),
                }
            }
            Some("function_call_output") => {
                f.reject_others(&["call_id", "output", "id", "status"], &[])?;
                let call_id: String = f.required("call_id", "a string")?;
                let output_param = f.param("output");
                let output = match f.take_raw("output") {
                    None => return Err(ApiError::missing(&output_param)),
                    Some(Value::String(s)) => s,
                    Some(Value::Array(parts)) => read_parts(parts, &output_param)?,
                    Some(other) => {
                        return Err(ApiError::invalid_type(
                            &output_param,
                            "a string or an array of content parts",
                            &other,
                        ))
                    }
                };
                let _ignored: (Option<String>, Option<String>) = (
                    f.optional("id", "a string")?,
                    f.optional("status", "a string")?,
                );
                messages.push(ChatMessage {
                    tool_call_id: Some(call_id),
                    ..message("tool", output)
                });
            }
            // A reasoning item sent back (as OpenAI's clients replay output) is dropped: the
            // reasoning templates drop past turns' reasoning too.
            Some("reasoning") => {}
            Some(other) => {
                return Err(ApiError::unsupported_value(
                    &format!("{param}.type"),
                    format!(
                        "Input items of type `{other}` are not supported; expected message, \
                         function_call, function_call_output or reasoning."
                    ),
                ))
            }
        }
    }
    Ok(messages)
}

/// A call in the shape chat templates read (`arguments` as JSON when it parses).
pub fn template_call(call_id: &str, name: &str, arguments: &str) -> Value {
    let arguments =
        serde_json::from_str::<Value>(arguments).unwrap_or_else(|_| Value::from(arguments));
    serde_json::json!({
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    })
}

fn read_message(mut f: Fields) -> Result<ChatMessage, ApiError> {
    f.reject_others(&["role", "content", "id", "status"], &[])?;
    let role: String = f.required("role", "a string")?;
    let role = match role.as_str() {
        "system" | "developer" => "system",
        "user" => "user",
        "assistant" => "assistant",
        other => {
            return Err(ApiError::invalid_value(
                &f.param("role"),
                format!("Unknown role `{other}`; expected user, system, developer or assistant."),
            ))
        }
    };
    let _ignored: (Option<String>, Option<String>) = (
        f.optional("id", "a string")?,
        f.optional("status", "a string")?,
    );
    let param = f.param("content");
    let content = match f.take_raw("content") {
        None => return Err(ApiError::missing(&param)),
        Some(Value::String(s)) => s,
        Some(Value::Array(parts)) => read_parts(parts, &param)?,
        Some(other) => {
            return Err(ApiError::invalid_type(
                &param,
                "a string or an array of content parts",
                &other,
            ))
        }
    };
    Ok(message(role, content))
}

/// Joins `input_text` / `output_text` parts with newlines; other part types are 400.
fn read_parts(parts: Vec<Value>, param: &str) -> Result<String, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for (j, part) in parts.into_iter().enumerate() {
        let mut f = Fields::from_value(part, &format!("{param}[{j}]"))?;
        let kind: String = f.required("type", "a string")?;
        match kind.as_str() {
            "input_text" => f.reject_others(&["text"], &[])?,
            // An earlier response's output sent back as input.
            "output_text" => f.reject_others(&["text", "annotations", "logprobs"], &[])?,
            other => {
                return Err(ApiError::unsupported_value(
                    &f.param("type"),
                    format!(
                        "Content parts of type `{other}` are not supported; only `input_text` \
                         and `output_text` parts are."
                    ),
                ))
            }
        }
        texts.push(f.required::<String>("text", "a string")?);
    }
    Ok(texts.join("\n"))
}
