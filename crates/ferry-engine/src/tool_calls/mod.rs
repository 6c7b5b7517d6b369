//! Tool calling: which markup a model writes its function calls in, how to read them out of its
//! text (whole or token by token), how to make it write one (a grammar for `tool_choice:
//! required` or a named function) and how to show tools to a template that does not render them.
//!
//! The format ([`ToolCallFormat`]) is chosen from the chat template's source
//! ([`ToolSupport::from_template`]): gpt-oss's harmony (`<|channel|>`: its calls are read by
//! [`crate::reasoning::harmony`] with the rest of its channels, [`harmony`] writes and forces
//! them), Qwen3-Coder's XML (`<function=` in a template with
//! `<tool_call>`), Hermes/Qwen `<tool_call>{json}</tool_call>`, Mistral `[TOOL_CALLS]`, Llama 3.x
//! JSON (`<|python_tag|>` or `ipython`); anything else falls back to Hermes. One file per
//! format ([`hermes`], [`qwen3_coder`], [`llama3`], [`mistral`]) reads a *region* (the text from a
//! call's opening markup on) as far as it goes, and [`lenient`] the forms models write whatever
//! their family (a fenced block around the calls, a bare JSON object naming an offered tool);
//! [`stream`] drives a region reader over text as it arrives, holding back whatever could still
//! be markup, so non-streamed parsing is the stream fed everything at once and both give the
//! same calls. [`constrain`] builds the Lark
//! grammar that enforces a call; [`prompt`] folds tools and past calls into the messages of a
//! template that does not know them.

pub mod constrain;
pub mod harmony;
pub mod hermes;
mod json_scan;
pub mod lenient;
pub mod llama3;
pub mod mistral;
pub mod prompt;
pub mod qwen3_coder;
pub mod stream;

pub use stream::{ParsedOutput, ToolCallStream, ToolEvent};

use std::sync::Arc;

use serde_json::Value;

/// How a chat reply's tool calls are read: the model's format and the offered tools.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolParsing {
    /// The markup the model writes calls in.
    pub format: ToolCallFormat,
    /// The tools offered (Qwen3-Coder's parser reads parameter types from them; the lenient
    /// forms are calls only when they name one).
    pub tools: Arc<[ToolSpec]>,
}

/// One tool the client offers (`tools[].function`).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The function's name.
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// Its arguments' JSON schema (`{}` when the client gave none).
    pub parameters: Value,
}

impl ToolSpec {
    /// The definition as OpenAI's wire shape, which chat templates expect as `tools[i]`.
    pub fn to_template_value(&self) -> Value {
        let mut function = serde_json::Map::new();
        function.insert("name".into(), Value::String(self.name.clone()));
        if let Some(d) = &self.description {
            function.insert("description".into(), Value::String(d.clone()));
        }
        function.insert("parameters".into(), self.parameters.clone());
        serde_json::json!({"type": "function", "function": Value::Object(function)})
    }
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Tools are not offered and nothing is parsed.
    None,
    /// The model may call tools; whatever it writes is parsed.
    Auto,
    /// The model must call at least one tool (enforced by a grammar).
    Required,
    /// The model must call this function (enforced by a grammar).
    Named(String),
}

/// The markup a model family writes tool calls in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// `<tool_call>\n{"name": .., "arguments": {..}}\n</tool_call>` (Hermes, Qwen 2.5/3, and
    /// the fallback).
    Hermes,
    /// `<tool_call>\n<function=name>\n<parameter=p>\nvalue\n</parameter>\n</function>\n</tool_call>`.
    Qwen3Coder,
    /// `{"name": .., "parameters": {..}}` at the start of the reply (after `<|python_tag|>` when
    /// that token is kept), several separated by `;`.
    Llama3Json,
    /// `[TOOL_CALLS][{"name": .., "arguments": {..}}, ..]`, or `[TOOL_CALLS]name[ARGS]{..}`.
    Mistral,
    /// gpt-oss: `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{..}`
    /// (special tokens; read by the harmony reasoning reader, never by [`ToolCallStream`],
    /// which for this format reads only the fenced and bare forms).
    Harmony,
}

impl ToolCallFormat {
    /// The format's name, as logs and docs spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Hermes => "hermes",
            Self::Qwen3Coder => "qwen3_coder",
            Self::Llama3Json => "llama3_json",
            Self::Mistral => "mistral",
            Self::Harmony => "harmony",
        }
    }

    /// How one call is written in this format (for the history of a template that does not
    /// render `tool_calls` itself). `arguments` is the call's JSON text.
    pub fn render_call(self, name: &str, arguments: &str) -> String {
        match self {
            Self::Hermes => hermes::render_call(name, arguments),
            Self::Qwen3Coder => qwen3_coder::render_call(name, arguments),
            Self::Llama3Json => llama3::render_call(name, arguments),
            Self::Mistral => mistral::render_call(name, arguments),
            Self::Harmony => harmony::render_call(name, arguments),
        }
    }
}

/// What a model's chat template does with tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolSupport {
    /// The markup its calls are parsed from.
    pub format: ToolCallFormat,
    /// The template reads `tools` (so definitions and `tool_calls` go to it as they are);
    /// otherwise [`prompt`] folds them into the messages.
    pub template_renders_tools: bool,
}

impl Default for ToolSupport {
    /// No template knowledge: Hermes markup, tools folded into the messages.
    fn default() -> Self {
        Self {
            format: ToolCallFormat::Hermes,
            template_renders_tools: false,
        }
    }
}

impl ToolSupport {
    /// Reads the format off a chat template's source (see the module docs for the order).
    pub fn from_template(source: Option<&str>) -> Self {
        let Some(src) = source else {
            return Self::default();
        };
        let format = if src.contains("<|channel|>") {
            ToolCallFormat::Harmony
        } else if src.contains("<tool_call>") && src.contains("<function=") {
            ToolCallFormat::Qwen3Coder
        } else if src.contains("<tool_call>") {
            ToolCallFormat::Hermes
        } else if src.contains("[TOOL_CALLS]") {
            ToolCallFormat::Mistral
        } else if src.contains("<|python_tag|>") || src.contains("ipython") {
            ToolCallFormat::Llama3Json
        } else {
            ToolCallFormat::Hermes
        };
        Self {
            format,
            template_renders_tools: renders_tools(src),
        }
    }
}

/// Whether a template reads the `tools` variable (`tools` as a whole word outside strings is
/// close enough: templates that mention it use it).
fn renders_tools(src: &str) -> bool {
    static WORD: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    let word = WORD.get_or_init(|| regex::Regex::new(r"\btools\b").expect("static regex"));
    word.is_match(src)
}

/// One call as parsed: the function's name and its arguments' JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function's name.
    pub name: String,
    /// The arguments as the model wrote them (a JSON object's text; may be cut short when
    /// generation stopped inside the call).
    pub arguments: String,
}

/// A call while its region is read: the name once it is complete, and the arguments' text so
/// far (each later reading extends it).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PartialCall {
    /// Known once written out completely.
    pub name: Option<String>,
    /// The arguments' text read so far: always a prefix of the final text.
    pub arguments: String,
}

/// How far a region reader got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionEnd {
    /// More text may extend the region.
    Open,
    /// The region ended after this many bytes; what follows is ordinary text again.
    Closed(usize),
    /// This was not a call after all: the region's text is content.
    NotACall,
}

/// A region reader's result: the calls found so far and where the region stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionScan {
    /// Calls in the region, in order.
    pub calls: Vec<PartialCall>,
    /// Whether the region is still open, ended, or not a call.
    pub end: RegionEnd,
}

impl RegionScan {
    fn open(calls: Vec<PartialCall>) -> Self {
        Self {
            calls,
            end: RegionEnd::Open,
        }
    }

    fn not_a_call() -> Self {
        Self {
            calls: Vec::new(),
            end: RegionEnd::NotACall,
        }
    }

    /// Open regions at the end of the text close there (or are not calls when no call has a
    /// name yet); a region without any named call is content.
    fn settle(mut self, text_len: usize, done: bool) -> Self {
        let named = self.calls.first().is_some_and(|c| c.name.is_some());
        if done && self.end == RegionEnd::Open {
            self.end = if named {
                RegionEnd::Closed(text_len)
            } else {
                RegionEnd::NotACall
            };
        }
        if matches!(self.end, RegionEnd::Closed(_)) && !named {
            self.end = RegionEnd::NotACall;
        }
        if self.end == RegionEnd::NotACall {
            self.calls.clear();
        }
        self.calls.retain(|c| c.name.is_some());
        self
    }
}

/// Skips ASCII whitespace from `at`.
fn skip_ws(text: &str, at: usize) -> usize {
    at + text[at..].len() - text[at..].trim_start().len()
}

/// Whether `rest` could still grow into `word` (it is a prefix of it).
fn could_be(rest: &str, word: &str) -> bool {
    word.starts_with(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_come_from_the_template() {
        let cases = [
            (None, ToolCallFormat::Hermes, false),
            (Some("{{ messages }}"), ToolCallFormat::Hermes, false),
            (
                Some("{% if tools %}<tool_call>{{ tools }}{% endif %}"),
                ToolCallFormat::Hermes,
                true,
            ),
            (
                Some("{% for tool in tools %}<tool_call><function={{ x }}>{% endfor %}"),
                ToolCallFormat::Qwen3Coder,
                true,
            ),
            (
                Some("{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]"),
                ToolCallFormat::Mistral,
                true,
            ),
            (
                Some("{% if tools is not none %}<|start_header_id|>ipython{% endif %}"),
                ToolCallFormat::Llama3Json,
                true,
            ),
            (
                Some("{% if tools %}namespace functions{% endif %}<|channel|>commentary"),
                ToolCallFormat::Harmony,
                true,
            ),
        ];
        for (src, format, renders) in cases {
            let got = ToolSupport::from_template(src);
            assert_eq!(
                (got.format, got.template_renders_tools),
                (format, renders),
                "{src:?}"
            );
        }
    }
}
