//! # ferry-chat
//!
//! The chat message, the one plain type that both the tokenizer (`ferry-model`, which renders
//! chat templates over it) and the generation engine (`ferry-engine`, whose requests carry it
//! from the HTTP layer) need. It lives in a crate of its own at the bottom layer so that neither
//! of the two depends on the other: a change to the model (its families, kernels or loader) does
//! not rebuild the engine and the HTTP layer, and the engine knows models only through its
//! `LanguageModel` and `TextCodec` traits. `ferry_model::tokenizer::ChatMessage` and
//! `ferry_engine::ChatMessage` are this type. It depends on no ferry crate. Beside it,
//! [`RESERVED_TEMPLATE_VARIABLES`]: the template variables every render sets, which a request's
//! `chat_template_kwargs` may not replace (the server refuses them, the renderer ignores them).

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

/// The chat template variables every render sets (as transformers' `apply_chat_template`
/// does), which a request's `chat_template_kwargs` may not replace.
pub const RESERVED_TEMPLATE_VARIABLES: &[&str] = &[
    "messages",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "tools",
    "documents",
];

/// One chat message after validation: role and flattened text content (what the HTTP layer hands
/// the engine, and what the template renders; the engine re-exports it).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatMessage {
    /// "system", "user", "assistant" or "tool".
    pub role: String,
    /// The message text (content parts already joined).
    pub content: String,
    /// The participant's name (`messages[].name`), for templates that render it; absent from
    /// the template's view when not given.
    pub name: Option<String>,
    /// An assistant message's calls, in OpenAI's shape (`{"id", "type": "function",
    /// "function": {"name", "arguments"}}`) with `arguments` as a JSON object, as templates
    /// expect them; absent when none.
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool message's `tool_call_id`; absent when none.
    pub tool_call_id: Option<String>,
    /// An assistant message's reasoning, as a client sends a reply's `reasoning_content` back;
    /// templates see it as `reasoning_content` (Qwen3's name) and `thinking` (gpt-oss's), and
    /// neither when absent.
    pub reasoning_content: Option<String>,
}

/// What a template sees of a message: `role` and `content` always, the optional fields only
/// when present, the reasoning under both names templates read.
impl Serialize for ChatMessage {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("role", &self.role)?;
        map.serialize_entry("content", &self.content)?;
        if let Some(name) = &self.name {
            map.serialize_entry("name", name)?;
        }
        if let Some(calls) = &self.tool_calls {
            map.serialize_entry("tool_calls", calls)?;
        }
        if let Some(id) = &self.tool_call_id {
            map.serialize_entry("tool_call_id", id)?;
        }
        if let Some(reasoning) = &self.reasoning_content {
            map.serialize_entry("reasoning_content", reasoning)?;
            map.serialize_entry("thinking", reasoning)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_see_present_fields_only_and_the_reasoning_under_both_names() {
        let plain = ChatMessage {
            role: "user".into(),
            content: "hi".into(),
            ..ChatMessage::default()
        };
        assert_eq!(
            serde_json::to_value(&plain).unwrap(),
            serde_json::json!({"role": "user", "content": "hi"})
        );
        let replayed = ChatMessage {
            role: "assistant".into(),
            content: "4".into(),
            tool_call_id: Some("c".into()),
            reasoning_content: Some("2 + 2".into()),
            ..ChatMessage::default()
        };
        assert_eq!(
            serde_json::to_value(&replayed).unwrap(),
            serde_json::json!({"role": "assistant", "content": "4", "tool_call_id": "c",
                "reasoning_content": "2 + 2", "thinking": "2 + 2"})
        );
    }
}
