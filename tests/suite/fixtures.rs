//! Reading the JSON fixtures under tests/fixtures: a file by its path there, a list of token
//! ids, a case's chat messages.

use std::path::PathBuf;

use ferry::model::tokenizer::ChatMessage;
use serde_json::Value;

/// `tests/fixtures/<relative>`.
pub fn path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(relative)
}

/// The JSON file `tests/fixtures/<relative>`.
pub fn json(relative: &str) -> Value {
    let text = std::fs::read_to_string(path(relative)).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A JSON array of token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// A case's `messages`: `[{"role": ..., "content": ...}, ...]`.
pub fn messages(case: &Value) -> Vec<ChatMessage> {
    case["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage {
            role: m["role"].as_str().unwrap().into(),
            content: m["content"].as_str().unwrap().into(),
            ..Default::default()
        })
        .collect()
}
