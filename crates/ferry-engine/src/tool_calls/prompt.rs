//! Tools for a chat template that does not render them (no `tools` in its source, like
//! SmolLM2's): the definitions go into the system message with instructions to answer in the
//! format's markup, past calls into their assistant message's text in that markup, and tool
//! results into user messages wrapped in `<tool_response>`.

use super::{ToolCallFormat, ToolSpec};
use crate::request::ChatMessage;

/// Rewrites `messages` so a template without tool support shows `tools` (may be empty: the
/// history is still rewritten) and the history's calls and results.
pub fn fold_into_messages(
    messages: &mut Vec<ChatMessage>,
    tools: &[ToolSpec],
    format: ToolCallFormat,
) {
    for message in messages.iter_mut() {
        if let Some(calls) = message.tool_calls.take() {
            let rendered: Vec<String> = calls
                .iter()
                .map(|call| {
                    let function = &call["function"];
                    let name = function["name"].as_str().unwrap_or_default();
                    let arguments = match &function["arguments"] {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    format.render_call(name, &arguments)
                })
                .collect();
            if !message.content.is_empty() {
                message.content.push('\n');
            }
            message.content.push_str(&rendered.join("\n"));
        }
        if message.role == "tool" {
            message.role = "user".into();
            message.content = format!("<tool_response>\n{}\n</tool_response>", message.content);
            message.tool_call_id = None;
        }
    }
    if tools.is_empty() {
        return;
    }
    let instructions = instructions(tools, format);
    match messages.first_mut() {
        Some(first) if first.role == "system" => {
            first.content = format!("{}\n\n{instructions}", first.content);
        }
        _ => messages.insert(
            0,
            ChatMessage {
                role: "system".into(),
                content: instructions,
                ..ChatMessage::default()
            },
        ),
    }
}

/// The system text that offers `tools`.
pub fn instructions(tools: &[ToolSpec], format: ToolCallFormat) -> String {
    let definitions: Vec<String> = tools
        .iter()
        .map(|t| t.to_template_value().to_string())
        .collect();
    format!(
        "You can call functions to answer. These are the functions, one JSON definition per \
         line:\n<tools>\n{}\n</tools>\nTo call one, reply with the call written like this, \
         once per call and nothing else:\n{}",
        definitions.join("\n"),
        format.render_call("function_name", "{\"argument\": \"value\"}")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tools_calls_and_results_are_folded_into_plain_messages() {
        let tools = [ToolSpec {
            name: "get_weather".into(),
            description: Some("Weather.".into()),
            parameters: json!({"type": "object"}),
        }];
        let mut messages = vec![
            ChatMessage {
                role: "system".into(),
                content: "Be brief.".into(),
                ..ChatMessage::default()
            },
            ChatMessage {
                role: "assistant".into(),
                tool_calls: Some(vec![json!({"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}})]),
                ..ChatMessage::default()
            },
            ChatMessage {
                role: "tool".into(),
                content: "cold".into(),
                tool_call_id: Some("call_1".into()),
                ..ChatMessage::default()
            },
        ];
        fold_into_messages(&mut messages, &tools, ToolCallFormat::Hermes);
        assert!(messages[0].content.starts_with("Be brief.\n\n"));
        assert!(messages[0].content.contains("\"name\":\"get_weather\""));
        assert!(messages[0].content.contains("<tool_call>"));
        assert_eq!(
            messages[1].content,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>"
        );
        assert_eq!(messages[1].tool_calls, None);
        assert_eq!(
            (messages[2].role.as_str(), messages[2].content.as_str()),
            ("user", "<tool_response>\ncold\n</tool_response>")
        );
        let mut plain = vec![ChatMessage {
            role: "user".into(),
            content: "hi".into(),
            ..ChatMessage::default()
        }];
        fold_into_messages(&mut plain, &tools, ToolCallFormat::Llama3Json);
        assert_eq!(plain[0].role, "system", "a system message is added");
        assert!(plain[0].content.contains("\"parameters\": "));
    }
}
