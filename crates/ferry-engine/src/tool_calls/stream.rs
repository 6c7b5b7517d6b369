//! Reads tool calls out of a reply as its text arrives. Text is content until a format's marker
//! (or, for Llama 3 and Mistral, a `{`/`[` opening the reply), a fence (```` ``` ````) or a `{`
//! at the start of a line (the [`lenient`] forms, which any format reads); text that could still
//! become a marker is held back, so markup never reaches the content. Inside a region the format's
//! reader is run over the region so far; each call is announced once its name is complete
//! ([`ToolEvent::CallStart`], with its index among the reply's calls) and its arguments follow
//! as fragments that add up to the final text. Whitespace between content and calls is dropped.
//!
//! Every decision depends only on the text seen so far, so the events add up to the same
//! content and calls however the text is cut; [`ToolCallStream::parse`] is the stream fed the
//! whole reply at once.

use std::sync::Arc;

use super::{
    hermes, lenient, llama3, mistral, qwen3_coder, ParsedCall, RegionEnd, RegionScan,
    ToolCallFormat, ToolSpec,
};

/// What a piece of the reply turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEvent {
    /// Ordinary text.
    Content(String),
    /// Call `index` (0, 1, ... in reply order) begins; its name is complete.
    CallStart {
        /// The call's place among the reply's calls.
        index: usize,
        /// The function's name.
        name: String,
    },
    /// More of call `index`'s arguments text.
    Arguments {
        /// The call's place among the reply's calls.
        index: usize,
        /// The next piece of the arguments text.
        fragment: String,
    },
}

/// A whole reply read: its content (empty when there is none) and its calls.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedOutput {
    /// The text outside the calls.
    pub content: String,
    /// The calls, in order.
    pub calls: Vec<ParsedCall>,
}

impl ParsedOutput {
    /// Adds `events` up.
    pub fn add(&mut self, events: &[ToolEvent]) {
        for event in events {
            match event {
                ToolEvent::Content(text) => self.content.push_str(text),
                ToolEvent::CallStart { name, .. } => self.calls.push(ParsedCall {
                    name: name.clone(),
                    arguments: String::new(),
                }),
                ToolEvent::Arguments { index, fragment } => {
                    if let Some(call) = self.calls.get_mut(*index) {
                        call.arguments.push_str(fragment);
                    }
                }
            }
        }
    }
}

/// What opened the region being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opening {
    /// The format's marker, or its bare `{`/`[` at the start of the reply.
    Native,
    /// A fence ([`lenient::fence`]).
    Fence,
    /// A `{` at the start of a line ([`lenient::object`]).
    Object,
}

/// One reply's tool-call reader.
#[derive(Debug, Clone)]
pub struct ToolCallStream {
    format: ToolCallFormat,
    tools: Arc<[ToolSpec]>,
    /// Text not decided yet: a possible marker's start, or the open region.
    pending: String,
    in_region: bool,
    /// What opened the region, while `in_region`.
    opening: Opening,
    /// The decided text ends at the start of a line (only spaces or tabs since the last
    /// newline, or nothing at all): a `{` there may open a call.
    line_start: bool,
    /// Whitespace after content, held until it is known not to precede a call.
    ws: String,
    /// The held whitespace when the open region began (content again if it is not a call).
    ws_before_region: String,
    /// The last thing decided was a call (whitespace after it is dropped).
    after_region: bool,
    /// Nothing but whitespace so far (a bare `{`/`[` may still open a call).
    at_start: bool,
    /// Each announced call's arguments text so far, by index.
    calls: Vec<String>,
    /// The index of the open region's first call.
    region_first: usize,
}

impl ToolCallStream {
    /// A reader for replies in `format`, offered `tools` (Qwen3-Coder reads parameter types
    /// from them).
    pub fn new(format: ToolCallFormat, tools: Arc<[ToolSpec]>) -> Self {
        Self {
            format,
            tools,
            pending: String::new(),
            in_region: false,
            opening: Opening::Native,
            line_start: true,
            ws: String::new(),
            ws_before_region: String::new(),
            after_region: false,
            at_start: true,
            calls: Vec::new(),
            region_first: 0,
        }
    }

    /// Reads a whole reply.
    pub fn parse(format: ToolCallFormat, tools: Arc<[ToolSpec]>, text: &str) -> ParsedOutput {
        let mut stream = Self::new(format, tools);
        let mut out = ParsedOutput::default();
        out.add(&stream.push(text));
        out.add(&stream.finish());
        out
    }

    /// How many calls have been announced.
    pub fn calls(&self) -> usize {
        self.calls.len()
    }

    /// Takes the next piece of the reply.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        self.drive(false, &mut out);
        out
    }

    /// The reply ended: everything held back is decided.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut out = Vec::new();
        self.drive(true, &mut out);
        if !self.after_region && !self.ws.is_empty() {
            out.push(ToolEvent::Content(std::mem::take(&mut self.ws)));
        }
        out
    }

    fn markers(&self) -> &'static [&'static str] {
        match self.format {
            ToolCallFormat::Hermes | ToolCallFormat::Qwen3Coder => &[hermes::OPEN, lenient::FENCE],
            ToolCallFormat::Llama3Json => &[llama3::PYTHON_TAG, lenient::FENCE],
            ToolCallFormat::Mistral => &[mistral::TOOL_CALLS, lenient::FENCE],
            ToolCallFormat::Harmony => &[lenient::FENCE],
        }
    }

    /// The first `{` of the pending text that starts a line.
    fn object_start(&self) -> Option<usize> {
        let mut line_start = self.line_start;
        for (i, c) in self.pending.char_indices() {
            match c {
                '{' if line_start => return Some(i),
                '\n' => line_start = true,
                ' ' | '\t' => {}
                _ => line_start = false,
            }
        }
        None
    }

    /// The character that opens a call when it starts the reply.
    fn bare_start(&self) -> Option<char> {
        match self.format {
            ToolCallFormat::Llama3Json => Some('{'),
            ToolCallFormat::Mistral => Some('['),
            ToolCallFormat::Hermes | ToolCallFormat::Qwen3Coder | ToolCallFormat::Harmony => None,
        }
    }

    fn scan(&self, done: bool) -> RegionScan {
        let region = self.pending.as_str();
        let scan = match (self.opening, self.format) {
            (Opening::Fence, format) => lenient::fence(region, format, &self.tools),
            (Opening::Object, _) => lenient::object(region, &self.tools),
            (Opening::Native, ToolCallFormat::Hermes) => hermes::scan(region),
            (Opening::Native, ToolCallFormat::Qwen3Coder) => qwen3_coder::scan(region, &self.tools),
            (Opening::Native, ToolCallFormat::Llama3Json) => llama3::scan(region),
            (Opening::Native, ToolCallFormat::Mistral) => mistral::scan(region),
            // No native marker opens a harmony region (its markup is special tokens).
            (Opening::Native, ToolCallFormat::Harmony) => RegionScan {
                calls: Vec::new(),
                end: RegionEnd::NotACall,
            },
        };
        scan.settle(region.len(), done)
    }

    fn drive(&mut self, done: bool, out: &mut Vec<ToolEvent>) {
        loop {
            if self.in_region {
                let scan = self.scan(done);
                self.announce(&scan, out);
                match scan.end {
                    RegionEnd::Open => return,
                    RegionEnd::Closed(n) => {
                        self.pending.drain(..n);
                        self.in_region = false;
                        self.after_region = true;
                        self.line_start = true;
                        self.region_first = self.calls.len();
                    }
                    RegionEnd::NotACall => {
                        // The opening is content; what follows it is read again.
                        let opening = match self.opening {
                            Opening::Fence => lenient::FENCE.len(),
                            Opening::Object => 1,
                            Opening::Native => self
                                .markers()
                                .iter()
                                .find(|m| self.pending.starts_with(**m))
                                .map_or_else(
                                    || self.pending.chars().next().map_or(0, char::len_utf8),
                                    |m| m.len(),
                                ),
                        };
                        let text: String = self.pending.drain(..opening).collect();
                        self.in_region = false;
                        self.at_start = false;
                        self.ws = std::mem::take(&mut self.ws_before_region);
                        self.content(&text, out);
                    }
                }
                continue;
            }
            let bare = self.bare_start().filter(|_| self.at_start).and_then(|c| {
                let first = self.pending.find(|ch: char| !ch.is_whitespace())?;
                let rest = &self.pending[first..];
                // Mistral's marker starts with its bare `[`: the marker wins.
                let marked = self.markers().iter().any(|m| rest.starts_with(m));
                (rest.starts_with(c) && !marked).then_some(first)
            });
            if !done && bare.is_some() {
                let rest = self.pending.trim_start();
                if self
                    .markers()
                    .iter()
                    .any(|m| m.len() > rest.len() && m.starts_with(rest))
                {
                    return;
                }
            }
            let marker = self
                .markers()
                .iter()
                .filter_map(|m| self.pending.find(m))
                .min();
            let object = self.object_start();
            let Some(at) = bare.or([marker, object].into_iter().flatten().min()) else {
                let hold = if done {
                    0
                } else {
                    held_back(&self.pending, self.markers())
                };
                let cut = self.pending.len() - hold;
                let text: String = self.pending.drain(..cut).collect();
                self.content(&text, out);
                return;
            };
            self.opening = if bare == Some(at) {
                Opening::Native
            } else if self.pending[at..].starts_with(lenient::FENCE) {
                Opening::Fence
            } else if object == Some(at) {
                Opening::Object
            } else {
                Opening::Native
            };
            let before: String = self.pending.drain(..at).collect();
            self.content(&before, out);
            self.ws_before_region = std::mem::take(&mut self.ws);
            self.in_region = true;
            self.at_start = false;
            self.region_first = self.calls.len();
        }
    }

    /// Emits decided content, holding back its trailing whitespace and dropping whitespace
    /// right after a call.
    fn content(&mut self, text: &str, out: &mut Vec<ToolEvent>) {
        match text.rfind('\n') {
            Some(i) => self.line_start = text[i + 1..].chars().all(|c| c == ' ' || c == '\t'),
            None if text.chars().all(|c| c == ' ' || c == '\t') => {}
            None => self.line_start = false,
        }
        let text = if self.after_region {
            text.trim_start()
        } else {
            text
        };
        let body = text.trim_end();
        if body.is_empty() {
            self.ws.push_str(text);
            return;
        }
        let mut piece = std::mem::take(&mut self.ws);
        piece.push_str(body);
        out.push(ToolEvent::Content(piece));
        self.ws = text[body.len()..].to_owned();
        self.after_region = false;
        self.at_start = false;
    }

    /// Announces the region's newly named calls and the new part of every call's arguments.
    fn announce(&mut self, scan: &RegionScan, out: &mut Vec<ToolEvent>) {
        for (i, call) in scan.calls.iter().enumerate() {
            let index = self.region_first + i;
            let Some(name) = &call.name else { break };
            if index == self.calls.len() {
                self.calls.push(String::new());
                out.push(ToolEvent::CallStart {
                    index,
                    name: name.clone(),
                });
            }
            let Some(sent) = self.calls.get_mut(index) else {
                break;
            };
            if call.arguments.len() > sent.len() && call.arguments.starts_with(sent.as_str()) {
                out.push(ToolEvent::Arguments {
                    index,
                    fragment: call.arguments[sent.len()..].to_owned(),
                });
                sent.clone_from(&call.arguments);
            }
        }
    }
}

/// Bytes at the end of `text` that could be the start of one of `markers` (held back while
/// more text may complete it): what every streaming reader of markup (these and the tool-call
/// stream) holds back.
pub(crate) fn held_back(text: &str, markers: &[&str]) -> usize {
    markers
        .iter()
        .filter_map(|marker| {
            text.char_indices()
                .map(|(i, _)| i)
                .filter(|&i| text.len() - i < marker.len())
                .find(|&i| marker.starts_with(&text[i..]))
                .map(|i| text.len() - i)
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools() -> Arc<[ToolSpec]> {
        vec![ToolSpec {
            name: "get_weather".into(),
            description: None,
            parameters: json!({"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"}}}),
        }]
        .into()
    }

    fn call(name: &str, arguments: &str) -> ParsedCall {
        ParsedCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// Parses `text` whole, then fed one character at a time and in pieces of three bytes
    /// (where a character allows), and checks all three agree.
    fn parse(format: ToolCallFormat, text: &str) -> ParsedOutput {
        let whole = ToolCallStream::parse(format, tools(), text);
        for step in [1, 3] {
            let mut stream = ToolCallStream::new(format, tools());
            let mut pieces = ParsedOutput::default();
            let mut contents = Vec::new();
            let mut start = 0;
            while start < text.len() {
                let mut end = (start + step).min(text.len());
                while !text.is_char_boundary(end) {
                    end += 1;
                }
                let events = stream.push(&text[start..end]);
                for e in &events {
                    if let ToolEvent::Content(c) = e {
                        contents.push(c.clone());
                    }
                }
                pieces.add(&events);
                start = end;
            }
            pieces.add(&stream.finish());
            assert_eq!(pieces, whole, "step {step}: {text:?}");
            if !whole.calls.is_empty() {
                for c in &contents {
                    for m in [
                        "<tool_call>",
                        "[TOOL_CALLS]",
                        "<|python_tag|>",
                        "</tool_call>",
                        "\"name\"",
                        "```",
                    ] {
                        assert!(!c.contains(m), "markup leaked: {c:?} in {text:?}");
                    }
                }
            }
        }
        whole
    }

    #[test]
    fn hermes_table() {
        use ToolCallFormat::Hermes;
        let cases: &[(&str, &str, &[ParsedCall])] = &[
            ("Hello there.", "Hello there.", &[]),
            (
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
                "",
                &[call("get_weather", "{\"city\": \"Paris\"}")],
            ),
            (
                "Let me check.\n<tool_call>\n{\"arguments\": {\"city\": \"Oslo\"}, \"name\": \"get_weather\"}\n</tool_call>\n<tool_call>{\"name\": \"get_weather\"}</tool_call>\n",
                "Let me check.",
                &[call("get_weather", "{\"city\": \"Oslo\"}"), call("get_weather", "{}")],
            ),
            ("a <tool_call> not json </tool_call> b", "a <tool_call> not json </tool_call> b", &[]),
            ("<tool_call>{\"foo\": 1}</tool_call>", "<tool_call>{\"foo\": 1}</tool_call>", &[]),
            // Cut short inside the arguments (max_tokens): the call so far.
            (
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa",
                "",
                &[call("get_weather", "{\"city\": \"Pa")],
            ),
            ("I use < and <tool_ca", "I use < and <tool_ca", &[]),
            ("<tool_call>\n{\"name\": \"get_", "<tool_call>\n{\"name\": \"get_", &[]),
            ("é<tool_call>{\"name\":\"x\",\"arguments\":{\"a\":\"ü\"}}</tool_call>ok", "éok", &[call("x", "{\"a\":\"ü\"}")]),
            // What real models write besides the markup (`lenient`).
            (
                "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n```",
                "",
                &[call("get_weather", "{\"city\": \"Paris\"}")],
            ),
            (
                "Sure.\n```xml\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 2}}\n</tool_call>\n```\nDone.",
                "Sure.Done.",
                &[call("get_weather", "{\"days\": 2}")],
            ),
            (
                "```\n{\"name\": \"get_weather\", \"arguments\": {}}\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 1}}\n```",
                "",
                &[call("get_weather", "{}"), call("get_weather", "{\"days\": 1}")],
            ),
            (
                "```json\n[{\"name\": \"get_weather\", \"arguments\": {}}]\n```",
                "",
                &[call("get_weather", "{}")],
            ),
            (
                "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}",
                "",
                &[call("get_weather", "{\"city\": \"Oslo\"}")],
            ),
            (
                "I will look it up.\n  {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n",
                "I will look it up.",
                &[call("get_weather", "{\"city\": \"Oslo\"}")],
            ),
            // Cut short inside a fenced call.
            (
                "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa",
                "",
                &[call("get_weather", "{\"city\": \"Pa")],
            ),
        ];
        for (text, content, calls) in cases {
            let got = parse(Hermes, text);
            assert_eq!(
                (got.content.as_str(), got.calls.as_slice()),
                (*content, *calls),
                "{text:?}"
            );
        }
    }

    #[test]
    fn llama3_table() {
        use ToolCallFormat::Llama3Json;
        let cases: &[(&str, &str, &[ParsedCall])] = &[
            (
                " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
                "",
                &[call("get_weather", "{\"city\": \"Rome\"}")],
            ),
            (
                "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"x\": [1, 2]}}",
                "",
                &[call("a", "{}"), call("b", "{\"x\": [1, 2]}")],
            ),
            ("{\"answer\": 42}", "{\"answer\": 42}", &[]),
            ("The answer is {\"name\": 1}", "The answer is {\"name\": 1}", &[]),
            ("{\"name\": \"a\", \"parameters\": {\"q\": 1", "", &[call("a", "{\"q\": 1")]),
        ];
        for (text, content, calls) in cases {
            let got = parse(Llama3Json, text);
            assert_eq!(
                (got.content.as_str(), got.calls.as_slice()),
                (*content, *calls),
                "{text:?}"
            );
        }
    }

    #[test]
    fn mistral_table() {
        use ToolCallFormat::Mistral;
        let cases: &[(&str, &str, &[ParsedCall])] = &[
            (
                "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"b\", \"arguments\": {}}]",
                "",
                &[call("get_weather", "{\"city\": \"Paris\"}"), call("b", "{}")],
            ),
            (
                "[{\"name\": \"get_weather\", \"arguments\": {\"days\": 3}}]",
                "",
                &[call("get_weather", "{\"days\": 3}")],
            ),
            ("[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Lima\"}", "", &[call("get_weather", "{\"city\": \"Lima\"}")]),
            ("[TOOL_CALLS]get_weather{\"city\": \"Lima\"}", "", &[call("get_weather", "{\"city\": \"Lima\"}")]),
            ("[1, 2, 3]", "[1, 2, 3]", &[]),
            ("Sure: [{\"name\": \"x\"}]", "Sure: [{\"name\": \"x\"}]", &[]),
        ];
        for (text, content, calls) in cases {
            let got = parse(Mistral, text);
            assert_eq!(
                (got.content.as_str(), got.calls.as_slice()),
                (*content, *calls),
                "{text:?}"
            );
        }
    }

    #[test]
    fn qwen3_coder_table() {
        use ToolCallFormat::Qwen3Coder;
        let cases: &[(&str, &str, &[ParsedCall])] = &[
            (
                "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
                "",
                &[call("get_weather", "{\"city\": \"New York\", \"days\": 3}")],
            ),
            (
                "Checking.\n<tool_call>\n<function=other>\n<parameter=n>\n7\n</parameter>\n</function>\n</tool_call>",
                "Checking.",
                &[call("other", "{\"n\": \"7\"}")],
            ),
            (
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>",
                "",
                &[call("get_weather", "{}")],
            ),
            (
                "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
                "",
                &[call("get_weather", "{")],
            ),
        ];
        for (text, content, calls) in cases {
            let got = parse(Qwen3Coder, text);
            assert_eq!(
                (got.content.as_str(), got.calls.as_slice()),
                (*content, *calls),
                "{text:?}"
            );
        }
    }

    /// Text that only looks like the lenient forms stays content, byte for byte, in every format.
    #[test]
    fn lookalikes_of_the_lenient_forms_stay_text() {
        let texts = [
            "```json\n{\"name\": \"launch_rocket\", \"arguments\": {}}\n```",
            "{\"name\": \"launch_rocket\", \"arguments\": {}}",
            "{\"name\": \"get_weather_report\", \"arguments\": {}}",
            "{\"city\": \"Paris\", \"name\": \"get_weather\"}",
            "{\"name\": 3}",
            "```python\nprint({\"name\": \"get_weather\"})\n```",
            "Use ``` to fence code, and {braces} inline: {\"name\": \"get_weather\"}.",
            "fn main() {\n    {\n    }\n}",
            "```\n```",
            "Two backticks `` and one `.",
            "{\"name\": \"get_",
            "```json\n{\"name\": \"get_weather\"",
        ];
        for format in [
            ToolCallFormat::Hermes,
            ToolCallFormat::Qwen3Coder,
            ToolCallFormat::Llama3Json,
            ToolCallFormat::Mistral,
        ] {
            for text in texts {
                let got = parse(format, text);
                // Llama 3 reads a reply that opens with a named object as its own call.
                if format == ToolCallFormat::Llama3Json && text.starts_with("{\"name\": \"") {
                    continue;
                }
                let cut_call = text.ends_with("\"get_weather\"");
                if cut_call {
                    assert_eq!(got.calls, [call("get_weather", "")], "{format:?} {text:?}");
                    continue;
                }
                assert_eq!(
                    (got.content.as_str(), got.calls.as_slice()),
                    (text, &[][..]),
                    "{format:?}"
                );
            }
        }
    }

    /// Every format reads the fenced and bare forms beside its own markup.
    #[test]
    fn every_format_reads_fenced_and_bare_calls() {
        let weather = call("get_weather", "{\"city\": \"Rome\"}");
        let cases: &[(ToolCallFormat, &str)] = &[
            (
                ToolCallFormat::Qwen3Coder,
                "```xml\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>\n```",
            ),
            (
                ToolCallFormat::Qwen3Coder,
                "```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n```",
            ),
            (
                ToolCallFormat::Qwen3Coder,
                "Checking.\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}",
            ),
            (
                ToolCallFormat::Llama3Json,
                "```json\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}\n```",
            ),
            (
                ToolCallFormat::Llama3Json,
                "Checking.\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
            ),
            (
                ToolCallFormat::Mistral,
                "```json\n[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]\n```",
            ),
            (
                ToolCallFormat::Mistral,
                "```\n[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]\n```",
            ),
            (
                ToolCallFormat::Mistral,
                "Checking.\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}",
            ),
        ];
        for (format, text) in cases {
            let got = parse(*format, text);
            let content = if text.starts_with("Checking.") {
                "Checking."
            } else {
                ""
            };
            assert_eq!(
                (got.content.as_str(), got.calls.as_slice()),
                (content, std::slice::from_ref(&weather)),
                "{format:?} {text:?}"
            );
        }
    }

    #[test]
    fn calls_are_announced_before_their_arguments_with_stable_indices() {
        let mut stream = ToolCallStream::new(ToolCallFormat::Hermes, tools());
        let mut events = Vec::new();
        for piece in [
            "<tool_call>{\"name\": \"get_weather\", ",
            "\"arguments\": {\"city\": ",
            "\"Paris\"}}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>",
        ] {
            events.extend(stream.push(piece));
        }
        events.extend(stream.finish());
        assert_eq!(
            events,
            [
                ToolEvent::CallStart {
                    index: 0,
                    name: "get_weather".into()
                },
                ToolEvent::Arguments {
                    index: 0,
                    fragment: "{\"city\":".into()
                },
                ToolEvent::Arguments {
                    index: 0,
                    fragment: " \"Paris\"}".into()
                },
                ToolEvent::CallStart {
                    index: 1,
                    name: "b".into()
                },
                ToolEvent::Arguments {
                    index: 1,
                    fragment: "{}".into()
                },
            ]
        );
    }
}
