//! One reply read for everything a chat answer carries apart: reasoning, content and tool
//! calls. The reasoning reader (think or harmony) sees the text first; a think reply's content
//! then goes through the tool-call reader of the template's format (so calls after the
//! reasoning are parsed, calls mentioned inside it are not), while harmony names its calls
//! itself (`commentary` messages `to=functions.NAME`). Without either reader the text is
//! content as it is. [`ReplyReader::parse`] is the reader fed a whole reply at once, so a
//! whole reply and its streamed events always agree.

use crate::tool_calls::{ParsedOutput, ToolCallStream, ToolEvent, ToolParsing};

use super::harmony::{HarmonyEvent, HarmonyStream};
use super::think::{ThinkEvent, ThinkStream};
use super::{ReasoningFormat, ReasoningParsing};

/// What a piece of the reply turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplyEvent {
    /// Reasoning text (`reasoning_content`).
    Reasoning(String),
    /// Content or a tool call's piece.
    Output(ToolEvent),
}

/// A whole reply read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedReply {
    /// The reasoning (empty when there is none).
    pub reasoning: String,
    /// The content and the calls.
    pub output: ParsedOutput,
}

impl ParsedReply {
    /// Adds `events` up.
    pub fn add(&mut self, events: &[ReplyEvent]) {
        for event in events {
            match event {
                ReplyEvent::Reasoning(text) => self.reasoning.push_str(text),
                ReplyEvent::Output(e) => self.output.add(std::slice::from_ref(e)),
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Reasoner {
    Think(ThinkStream),
    Harmony(HarmonyStream),
}

/// One reply's reader.
#[derive(Debug, Clone)]
pub struct ReplyReader {
    reasoner: Option<Reasoner>,
    tools: Option<ToolCallStream>,
    /// Calls harmony announced.
    harmony_calls: usize,
}

impl ReplyReader {
    /// A reader that splits off reasoning when `reasoning` is given and reads calls when
    /// `tools` are offered.
    pub fn new(reasoning: Option<ReasoningParsing>, tools: Option<&ToolParsing>) -> Self {
        let reasoner = reasoning.map(|r| match r.format {
            ReasoningFormat::Think => Reasoner::Think(ThinkStream::new(r.starts_inside)),
            ReasoningFormat::Harmony => Reasoner::Harmony(HarmonyStream::new()),
        });
        let harmony = matches!(reasoner, Some(Reasoner::Harmony(_)));
        Self {
            tools: tools
                .filter(|_| !harmony)
                .map(|t| ToolCallStream::new(t.format, t.tools.clone())),
            reasoner,
            harmony_calls: 0,
        }
    }

    /// Reads a whole reply.
    pub fn parse(
        reasoning: Option<ReasoningParsing>,
        tools: Option<&ToolParsing>,
        text: &str,
    ) -> ParsedReply {
        let mut reader = Self::new(reasoning, tools);
        let mut out = ParsedReply::default();
        out.add(&reader.push(text));
        out.add(&reader.finish());
        out
    }

    /// How many calls have been announced.
    pub fn calls(&self) -> usize {
        self.harmony_calls + self.tools.as_ref().map_or(0, ToolCallStream::calls)
    }

    /// Whether the reply is (still) in its reasoning.
    pub fn in_reasoning(&self) -> bool {
        match &self.reasoner {
            Some(Reasoner::Think(t)) => t.in_reasoning(),
            Some(Reasoner::Harmony(h)) => h.in_reasoning(),
            None => false,
        }
    }

    /// Takes the next piece of the reply.
    pub fn push(&mut self, text: &str) -> Vec<ReplyEvent> {
        let mut out = Vec::new();
        match &mut self.reasoner {
            None => self.content(text.to_owned(), &mut out),
            Some(Reasoner::Think(t)) => {
                let events = t.push(text);
                self.think(events, &mut out);
            }
            Some(Reasoner::Harmony(h)) => {
                let events = h.push(text);
                self.harmony(events, &mut out);
            }
        }
        out
    }

    /// The reply ended: everything held back is decided.
    pub fn finish(&mut self) -> Vec<ReplyEvent> {
        let mut out = Vec::new();
        match &mut self.reasoner {
            None => {}
            Some(Reasoner::Think(t)) => {
                let events = t.finish();
                self.think(events, &mut out);
            }
            Some(Reasoner::Harmony(h)) => {
                let events = h.finish();
                self.harmony(events, &mut out);
            }
        }
        if let Some(tools) = &mut self.tools {
            out.extend(tools.finish().into_iter().map(ReplyEvent::Output));
        }
        out
    }

    fn think(&mut self, events: Vec<ThinkEvent>, out: &mut Vec<ReplyEvent>) {
        for event in events {
            match event {
                ThinkEvent::Reasoning(text) => out.push(ReplyEvent::Reasoning(text)),
                ThinkEvent::Content(text) => self.content(text, out),
            }
        }
    }

    fn harmony(&mut self, events: Vec<HarmonyEvent>, out: &mut Vec<ReplyEvent>) {
        for event in events {
            out.push(match event {
                HarmonyEvent::Reasoning(text) => ReplyEvent::Reasoning(text),
                HarmonyEvent::Content(text) => ReplyEvent::Output(ToolEvent::Content(text)),
                HarmonyEvent::Call(name) => {
                    self.harmony_calls += 1;
                    ReplyEvent::Output(ToolEvent::CallStart {
                        index: self.harmony_calls - 1,
                        name,
                    })
                }
                HarmonyEvent::Arguments(fragment) => ReplyEvent::Output(ToolEvent::Arguments {
                    index: self.harmony_calls.saturating_sub(1),
                    fragment,
                }),
            });
        }
    }

    fn content(&mut self, text: String, out: &mut Vec<ReplyEvent>) {
        match &mut self.tools {
            Some(tools) => out.extend(tools.push(&text).into_iter().map(ReplyEvent::Output)),
            None if text.is_empty() => {}
            None => out.push(ReplyEvent::Output(ToolEvent::Content(text))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::tool_calls::{ParsedCall, ToolCallFormat, ToolSpec};

    fn tools() -> ToolParsing {
        ToolParsing {
            format: ToolCallFormat::Hermes,
            tools: Arc::from(vec![ToolSpec {
                name: "get_weather".into(),
                description: None,
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
            }]),
        }
    }

    fn think(starts_inside: bool) -> Option<ReasoningParsing> {
        Some(ReasoningParsing {
            format: ReasoningFormat::Think,
            starts_inside,
        })
    }

    fn harmony() -> Option<ReasoningParsing> {
        Some(ReasoningParsing {
            format: ReasoningFormat::Harmony,
            starts_inside: false,
        })
    }

    /// Streams `text` in pieces of `step` bytes (whole, 1 and 3) and checks that the streamed
    /// events add up to the whole reply's reading.
    fn read(
        reasoning: Option<ReasoningParsing>,
        tools: Option<&ToolParsing>,
        text: &str,
    ) -> ParsedReply {
        let whole = ReplyReader::parse(reasoning, tools, text);
        for step in [1, 3] {
            let mut reader = ReplyReader::new(reasoning, tools);
            let mut streamed = ParsedReply::default();
            let mut start = 0;
            while start < text.len() {
                let mut end = (start + step).min(text.len());
                while !text.is_char_boundary(end) {
                    end += 1;
                }
                streamed.add(&reader.push(&text[start..end]));
                start = end;
            }
            streamed.add(&reader.finish());
            assert_eq!(streamed, whole, "step {step}: {text:?}");
            assert_eq!(reader.calls(), whole.output.calls.len());
        }
        whole
    }

    fn reply(reasoning: &str, content: &str, calls: &[(&str, &str)]) -> ParsedReply {
        ParsedReply {
            reasoning: reasoning.into(),
            output: ParsedOutput {
                content: content.into(),
                calls: calls
                    .iter()
                    .map(|(n, a)| ParsedCall {
                        name: (*n).into(),
                        arguments: (*a).into(),
                    })
                    .collect(),
            },
        }
    }

    #[test]
    fn calls_after_the_reasoning_are_read_and_calls_inside_it_are_not() {
        let t = tools();
        let text = "<think>\nMaybe <tool_call>{\"name\": \"get_weather\"}</tool_call>? Yes.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        assert_eq!(
            read(think(false), Some(&t), text),
            reply(
                "Maybe <tool_call>{\"name\": \"get_weather\"}</tool_call>? Yes.",
                "",
                &[("get_weather", "{\"city\": \"Oslo\"}")]
            )
        );
        let opened = "Oslo, then.</think>Checking.\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>";
        assert_eq!(
            read(think(true), Some(&t), opened),
            reply("Oslo, then.", "Checking.", &[("get_weather", "{}")])
        );
    }

    #[test]
    fn without_a_reasoning_format_the_markup_stays_in_the_content() {
        let text = "<think>hm</think>4";
        assert_eq!(read(None, None, text), reply("", text, &[]));
        assert_eq!(read(think(false), None, text), reply("hm", "4", &[]));
    }

    #[test]
    fn harmony_names_its_calls_itself() {
        let t = tools();
        let text = "<|channel|>analysis<|message|>Weather needed.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Rome\"}";
        let want = reply(
            "Weather needed.",
            "",
            &[("get_weather", "{\"city\":\"Rome\"}")],
        );
        assert_eq!(read(harmony(), Some(&t), text), want);
        let reader = {
            let mut r = ReplyReader::new(harmony(), Some(&t));
            r.push(text);
            r
        };
        assert_eq!(reader.calls(), 1);
        let answer = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|><tool_call>is text here";
        assert_eq!(
            read(harmony(), Some(&t), answer),
            reply("Easy.", "<tool_call>is text here", &[])
        );
    }

    #[test]
    fn the_reasoning_phase_follows_the_reply() {
        let mut reader = ReplyReader::new(think(true), None);
        assert!(reader.in_reasoning());
        reader.push("a</think>");
        assert!(!reader.in_reasoning());
        assert!(!ReplyReader::new(None, None).in_reasoning());
    }
}
