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

use serde::Serialize;

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
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct ChatMessage {
    /// "system", "user", "assistant" or "tool".
    pub role: String,
    /// The message text (content parts already joined).
    pub content: String,
    /// The participant's name (`messages[].name`), for templates that render it; absent from
    /// the template's view when not given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant message's calls, in OpenAI's shape (`{"id", "type": "function",
    /// "function": {"name", "arguments"}}`) with `arguments` as a JSON object, as templates
    /// expect them; absent when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool message's `tool_call_id`; absent when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}
