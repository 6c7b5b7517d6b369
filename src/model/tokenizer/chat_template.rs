//! Chat templates: the Jinja template a model ships (GGUF `tokenizer.chat_template` or
//! `chat_template` in tokenizer_config.json), rendered with minijinja the way Hugging Face
//! transformers renders it with Jinja2.
//!
//! Like transformers' `apply_chat_template`: `trim_blocks` and `lstrip_blocks` on, a trailing
//! newline of the template dropped, variables `messages`, `add_generation_prompt`, `bos_token`,
//! `eos_token` (plus `unk_token`/`pad_token` when known), a `raise_exception(msg)` function that
//! aborts rendering with `msg`, Python string/dict methods (`.strip()`, `.startswith()`,
//! `.items()`, ...) through minijinja-contrib's pycompat callback, loop controls (`break`,
//! `continue`) and a `tojson` filter that writes JSON as Python's `json.dumps` does
//! (`ensure_ascii=False`, `", "`/`": "` separators, `indent`, `sort_keys`, `separators`).

use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::Serialize;

use crate::engine::ChatMessage;
use crate::model::error::{ModelError, Result};

/// Name of the single template in the environment.
const NAME: &str = "chat";

/// Everything a chat template is rendered with.
#[derive(Debug, Clone, Serialize)]
pub struct TemplateContext<'a> {
    /// The conversation.
    pub messages: &'a [ChatMessage],
    /// End with the header of an assistant turn, so the model writes the reply.
    pub add_generation_prompt: bool,
    /// The BOS token's text (`""` when the model has none, so templates can still concatenate it).
    pub bos_token: &'a str,
    /// The EOS token's text (`""` when unknown).
    pub eos_token: &'a str,
    /// The unknown token's text, when the model has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unk_token: Option<&'a str>,
    /// The padding token's text, when the model has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pad_token: Option<&'a str>,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .finish()
    }
}

/// The error `raise_exception` raises, kept as the source of minijinja's error so the message
/// can be handed back verbatim.
#[derive(Debug)]
struct RaisedByTemplate(String);

impl std::fmt::Display for RaisedByTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedByTemplate {}

impl ChatTemplate {
    /// Compiles `source`; a syntax error is a [`ModelError::Template`].
    pub fn new(source: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| ModelError::Template(format!("cannot compile: {}", describe(&e))))?;
        Ok(Self {
            env,
            source: source.to_string(),
        })
    }

    /// The template's source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders the template. A `raise_exception(msg)` in the template gives
    /// `ModelError::Template(msg)`; other failures describe the minijinja error.
    pub fn render(&self, ctx: &TemplateContext<'_>) -> Result<String> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| ModelError::Template(describe(&e)))?;
        template
            .render(Value::from_serialize(ctx))
            .map_err(|e| match raised_message(&e) {
                Some(msg) => ModelError::Template(msg),
                None => ModelError::Template(format!("cannot render: {}", describe(&e))),
            })
    }
}

/// `raise_exception(msg)`: stop rendering with `msg` as the error.
fn raise_exception(msg: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg.clone()).with_source(RaisedByTemplate(msg)))
}

/// The message of a `raise_exception` somewhere in `err`'s source chain.
fn raised_message(err: &Error) -> Option<String> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(raised) = e.downcast_ref::<RaisedByTemplate>() {
            return Some(raised.0.clone());
        }
        cur = e.source();
    }
    None
}

/// One line for a minijinja error: kind, detail and template line.
fn describe(err: &Error) -> String {
    err.to_string()
}

/// Python `json.dumps` options used by `tojson`.
struct JsonStyle {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`.
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_usize(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n)),
            (None, Some(s)) => Some(s.to_string()),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ))
            }
        },
    };
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be two strings",
            ))
        }
        // Python's defaults: no spaces at line ends when indenting.
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let style = JsonStyle {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    write_json(&mut out, value, &style, 0)?;
    Ok(Value::from_safe_string(out))
}

fn newline(out: &mut String, style: &JsonStyle, depth: usize) {
    if let Some(indent) = &style.indent {
        out.push('\n');
        for _ in 0..depth {
            out.push_str(indent);
        }
    }
}

fn write_json(
    out: &mut String,
    value: &Value,
    style: &JsonStyle,
    depth: usize,
) -> std::result::Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value),
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default(), style),
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if style.sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, style, depth + 1);
                match key.as_str() {
                    Some(s) => write_string(out, s, style),
                    None => write_string(out, &key.to_string(), style),
                }
                out.push_str(&style.key_sep);
                write_json(out, &value.get_item(key)?, style, depth + 1)?;
            }
            newline(out, style, depth);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_sep);
                }
                newline(out, style, depth + 1);
                write_json(out, item, style, depth + 1)?;
            }
            newline(out, style, depth);
            out.push(']');
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: cannot serialize a {} value", value.kind()),
            ))
        }
    }
    Ok(())
}

fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        out.push_str(&value.to_string());
        return;
    }
    match f64::try_from(value.clone()) {
        Ok(f) if f.is_nan() => out.push_str("NaN"),
        Ok(f) if f.is_infinite() => out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" }),
        // Debug prints the shortest round-trip form with a ".0" on whole numbers, like Python.
        Ok(f) => {
            let _ = write!(out, "{f:?}");
        }
        Err(_) => out.push_str(&value.to_string()),
    }
}

fn write_string(out: &mut String, s: &str, style: &JsonStyle) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if style.ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs() -> Vec<ChatMessage> {
        vec![
            ChatMessage {
                role: "system".into(),
                content: "  Be brief.  ".into(),
            },
            ChatMessage {
                role: "user".into(),
                content: "Héllo \"you\"\n".into(),
            },
        ]
    }

    fn render(src: &str, add_gen: bool) -> Result<String> {
        let m = msgs();
        ChatTemplate::new(src)?.render(&TemplateContext {
            messages: &m,
            add_generation_prompt: add_gen,
            bos_token: "<s>",
            eos_token: "</s>",
            unk_token: None,
            pad_token: None,
        })
    }

    #[test]
    fn trim_and_lstrip_blocks_like_transformers() {
        let src = "{{ bos_token }}\n{% for m in messages %}\n    {{ m.role }}|\n{% endfor %}\n";
        assert_eq!(
            render(src, false).map_err(|e| e.to_string()).unwrap(),
            "<s>\n    system|\n    user|\n"
        );
    }

    #[test]
    fn pycompat_methods_and_loop_controls() {
        let src = "{% for m in messages %}{% if m.role.startswith('sys') %}[{{ m.content.strip() }}]{% continue %}{% endif %}{{ m.content.upper().rstrip() }}{% break %}{% endfor %}";
        assert_eq!(
            render(src, false).map_err(|e| e.to_string()).unwrap(),
            "[Be brief.]HÉLLO \"YOU\""
        );
    }

    #[test]
    fn tojson_writes_like_python_json_dumps() {
        let src = "{{ messages[1] | tojson }}|{{ {'b': [1, 2.5, none, true], 'a': {}} | tojson(sort_keys=true) }}|{{ [1, [2]] | tojson(indent=2) }}";
        assert_eq!(
            render(src, false).map_err(|e| e.to_string()).unwrap(),
            "{\"role\": \"user\", \"content\": \"Héllo \\\"you\\\"\\n\"}|{\"a\": {}, \"b\": [1, 2.5, null, true]}|[\n  1,\n  [\n    2\n  ]\n]"
        );
    }

    #[test]
    fn raise_exception_message_comes_back() {
        let src = "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}";
        match render(src, true) {
            Err(ModelError::Template(msg)) => assert_eq!(msg, "System role not supported"),
            other => panic!("expected a template error, got {other:?}"),
        }
    }

    #[test]
    fn syntax_errors_are_template_errors() {
        match ChatTemplate::new("{% for m in messages %}") {
            Err(ModelError::Template(msg)) => assert!(msg.contains("cannot compile"), "{msg}"),
            other => panic!("expected a template error, got {other:?}"),
        }
    }
}
