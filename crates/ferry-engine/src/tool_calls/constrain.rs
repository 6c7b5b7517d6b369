//! `tool_choice: required` or a named function, enforced while sampling: a Lark grammar (for
//! llguidance, see [`crate::grammar`]) whose sentences are exactly the format's markup
//! around calls of the allowed tools, each call's arguments valid against its `parameters`
//! schema. With `parallel_tool_calls` the grammar allows one or more calls, else exactly one.

use serde_json::{json, Value};

use super::{harmony, ToolCallFormat, ToolSpec};

/// The Lark grammar for calls of `tools` (already narrowed to the named one, if any).
pub fn lark(format: ToolCallFormat, tools: &[ToolSpec], parallel: bool) -> String {
    let (one, sep, head, tail) = match format {
        ToolCallFormat::Hermes => (
            "\"<tool_call>\\n\" call \"\\n</tool_call>\"",
            "\"\\n\"",
            "",
            "",
        ),
        ToolCallFormat::Qwen3Coder => (
            "\"<tool_call>\\n\" call \"</tool_call>\"",
            "\"\\n\"",
            "",
            "",
        ),
        ToolCallFormat::Llama3Json => ("call", "\"; \"", "", ""),
        ToolCallFormat::Mistral => ("call", "\", \"", "\"[\" ", " \"]\""),
        ToolCallFormat::Harmony => {
            return harmony::lark(tools, |tool| format!("%json {}", schema(&tool.parameters)))
        }
    };
    let calls: Vec<String> = tools
        .iter()
        .enumerate()
        .map(|(i, tool)| format!("call_{i}: {}", call_rule(format, tool)))
        .collect();
    let alternatives: Vec<String> = (0..tools.len()).map(|i| format!("call_{i}")).collect();
    let body = if parallel {
        format!("{head}block ({sep} block)*{tail}")
    } else {
        format!("{head}block{tail}")
    };
    let mut grammar = format!(
        "start: {body}\nblock: {one}\ncall: {}\n",
        alternatives.join(" | ")
    );
    for rule in calls {
        grammar.push_str(&rule);
        grammar.push('\n');
    }
    if format == ToolCallFormat::Qwen3Coder {
        grammar.push_str("VALUE: /[^<]*\\n<\\/parameter>\\n/\n");
    }
    grammar
}

/// The rule body of one tool's call.
fn call_rule(format: ToolCallFormat, tool: &ToolSpec) -> String {
    let name = lit(&serde_json::to_string(&tool.name).unwrap_or_default());
    let args = format!("%json {}", schema(&tool.parameters));
    match format {
        // Harmony's calls are written by `harmony::lark`; its arm is never taken.
        ToolCallFormat::Hermes | ToolCallFormat::Mistral | ToolCallFormat::Harmony => {
            format!(
                "{} {name} {} {args} \"}}\"",
                lit("{\"name\": "),
                lit(", \"arguments\": ")
            )
        }
        ToolCallFormat::Llama3Json => {
            format!(
                "{} {name} {} {args} \"}}\"",
                lit("{\"name\": "),
                lit(", \"parameters\": ")
            )
        }
        ToolCallFormat::Qwen3Coder => {
            let keys: Vec<String> = tool
                .parameters
                .get("properties")
                .and_then(Value::as_object)
                .map(|p| p.keys().map(|k| lit(k)).collect())
                .unwrap_or_default();
            let params = if keys.is_empty() {
                String::new()
            } else {
                format!("(\"<parameter=\" ({}) \">\\n\" VALUE)* ", keys.join(" | "))
            };
            format!(
                "{} {params}\"</function>\\n\"",
                lit(&format!("<function={}>\n", tool.name))
            )
        }
    }
}

/// A Lark string literal of `text` (JSON's escapes are Lark's).
fn lit(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}

/// The arguments' schema as llguidance compiles it: an object schema (`{}` means any object),
/// written with `", "` and `": "` between items and no free whitespace, unless the schema
/// sets its own `x-guidance` options.
fn schema(parameters: &Value) -> String {
    let mut schema = match parameters {
        Value::Object(map) if !map.is_empty() => parameters.clone(),
        _ => json!({"type": "object"}),
    };
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance").or_insert_with(
            || json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema.to_string()
}
