//! [`OutputBuilder`]: a reply's text becomes Responses output items and the stream events that
//! build them. With tools offered or a reasoning template, the text goes through the model's
//! [`ReplyReader`] as in chat: reasoning opens (or continues) a `reasoning` item (its text
//! streamed as `response.reasoning_text.delta`), plain text a `message` item, each call a
//! `function_call` item, and a new item closes the one before it. The non-streamed response runs the whole text
//! through the same builder, so both answers have the same items. A reply with nothing in it
//! still gets one (empty) message. A reply cut at `max_output_tokens` has its last item
//! `incomplete`, as OpenAI's.

use super::super::chat::call_id;
use crate::openai::common::new_id;
use crate::openai::response_object::{OutputItem, OutputText, ReasoningText, StreamEvent};
use ferry_engine::reasoning::{ReasoningParsing, ReplyEvent, ReplyReader};
use ferry_engine::tool_calls::{ToolCallFormat, ToolEvent, ToolParsing};

/// The items of one reply, built as its text arrives.
pub struct OutputBuilder {
    reader: Option<ReplyReader>,
    format: ToolCallFormat,
    items: Vec<OutputItem>,
    /// Whether the last item is still open.
    open: bool,
}

impl OutputBuilder {
    /// A builder for a reply with `tools` offered (or none), read for `reasoning` (or not).
    pub fn new(tools: Option<&ToolParsing>, reasoning: Option<ReasoningParsing>) -> Self {
        Self {
            reader: (tools.is_some() || reasoning.is_some())
                .then(|| ReplyReader::new(reasoning, tools)),
            format: tools.map_or(ToolCallFormat::Hermes, |t| t.format),
            items: Vec::new(),
            open: false,
        }
    }

    /// The events for the reply's next `text`.
    pub fn push(&mut self, text: &str) -> Vec<StreamEvent> {
        let events = match &mut self.reader {
            Some(reader) => reader.push(text),
            None => vec![ReplyEvent::Output(ToolEvent::Content(text.to_owned()))],
        };
        let mut out = Vec::new();
        for event in events {
            self.apply(event, &mut out);
        }
        out
    }

    /// The events for the reply's last text (`trailing`), closing the last item (as
    /// `incomplete` when the reply was `cut` at the token limit).
    pub fn finish(&mut self, trailing: &str, cut: bool) -> Vec<StreamEvent> {
        let mut out = self.push(trailing);
        if let Some(reader) = &mut self.reader {
            for event in reader.finish() {
                self.apply(event, &mut out);
            }
        }
        if self.items.is_empty() {
            self.open_message(&mut out);
        }
        self.close_as(if cut { "incomplete" } else { "completed" }, &mut out);
        out
    }

    /// The items so far.
    pub fn items(&self) -> &[OutputItem] {
        &self.items
    }

    fn apply(&mut self, event: ReplyEvent, out: &mut Vec<StreamEvent>) {
        let event = match event {
            ReplyEvent::Reasoning(text) => return self.reasoning(text, out),
            ReplyEvent::Output(event) => event,
        };
        match event {
            ToolEvent::Content(text) if text.is_empty() => {}
            ToolEvent::Content(text) => {
                if !(self.open && matches!(self.items.last(), Some(OutputItem::Message { .. }))) {
                    self.close(out);
                    self.open_message(out);
                }
                let output_index = self.items.len() - 1;
                if let Some(OutputItem::Message { id, content, .. }) = self.items.last_mut() {
                    if let Some(part) = content.first_mut() {
                        part.text.push_str(&text);
                    }
                    out.push(StreamEvent::TextDelta {
                        item_id: id.clone(),
                        output_index,
                        content_index: 0,
                        delta: text,
                        logprobs: Vec::new(),
                    });
                }
            }
            ToolEvent::CallStart { name, .. } => {
                self.close(out);
                let item = OutputItem::FunctionCall {
                    id: new_id("fc_"),
                    call_id: call_id(self.format),
                    name,
                    arguments: String::new(),
                    status: "in_progress",
                };
                out.push(StreamEvent::ItemAdded {
                    output_index: self.items.len(),
                    item: item.clone(),
                });
                self.items.push(item);
                self.open = true;
            }
            ToolEvent::Arguments { fragment, .. } => {
                let output_index = self.items.len().saturating_sub(1);
                if let (true, Some(OutputItem::FunctionCall { id, arguments, .. })) =
                    (self.open, self.items.last_mut())
                {
                    arguments.push_str(&fragment);
                    out.push(StreamEvent::ArgumentsDelta {
                        item_id: id.clone(),
                        output_index,
                        delta: fragment,
                    });
                }
            }
        }
    }

    /// Adds reasoning text to the open `reasoning` item, opening one first if need be.
    fn reasoning(&mut self, text: String, out: &mut Vec<StreamEvent>) {
        if text.is_empty() {
            return;
        }
        if !(self.open && matches!(self.items.last(), Some(OutputItem::Reasoning { .. }))) {
            self.close(out);
            let item = OutputItem::Reasoning {
                id: new_id("rs_"),
                summary: Vec::new(),
                content: Vec::new(),
                status: "in_progress",
            };
            out.push(StreamEvent::ItemAdded {
                output_index: self.items.len(),
                item: item.clone(),
            });
            self.items.push(item);
            self.open = true;
        }
        let output_index = self.items.len() - 1;
        if let Some(OutputItem::Reasoning { id, content, .. }) = self.items.last_mut() {
            match content.first_mut() {
                Some(part) => part.text.push_str(&text),
                None => content.push(ReasoningText::new(text.clone())),
            }
            out.push(StreamEvent::ReasoningDelta {
                item_id: id.clone(),
                output_index,
                content_index: 0,
                delta: text,
            });
        }
    }

    fn open_message(&mut self, out: &mut Vec<StreamEvent>) {
        let id = new_id("msg_");
        let output_index = self.items.len();
        out.push(StreamEvent::ItemAdded {
            output_index,
            item: OutputItem::Message {
                id: id.clone(),
                status: "in_progress",
                role: "assistant",
                content: Vec::new(),
            },
        });
        out.push(StreamEvent::PartAdded {
            item_id: id.clone(),
            output_index,
            content_index: 0,
            part: OutputText::new(String::new()),
        });
        self.items.push(OutputItem::Message {
            id,
            status: "in_progress",
            role: "assistant",
            content: vec![OutputText::new(String::new())],
        });
        self.open = true;
    }

    /// Closes the open item, if any, with its `done` events.
    fn close(&mut self, out: &mut Vec<StreamEvent>) {
        self.close_as("completed", out);
    }

    /// Closes the open item, if any, as `done_status`.
    fn close_as(&mut self, done_status: &'static str, out: &mut Vec<StreamEvent>) {
        if !self.open {
            return;
        }
        self.open = false;
        let output_index = self.items.len() - 1;
        let Some(item) = self.items.last_mut() else {
            return;
        };
        match item {
            OutputItem::Message {
                id,
                status,
                content,
                ..
            } => {
                *status = done_status;
                let part = content
                    .first()
                    .cloned()
                    .unwrap_or_else(|| OutputText::new(String::new()));
                out.push(StreamEvent::TextDone {
                    item_id: id.clone(),
                    output_index,
                    content_index: 0,
                    text: part.text.clone(),
                    logprobs: Vec::new(),
                });
                out.push(StreamEvent::PartDone {
                    item_id: id.clone(),
                    output_index,
                    content_index: 0,
                    part,
                });
            }
            OutputItem::Reasoning {
                id,
                content,
                status,
                ..
            } => {
                *status = done_status;
                out.push(StreamEvent::ReasoningDone {
                    item_id: id.clone(),
                    output_index,
                    content_index: 0,
                    text: content.first().map(|p| p.text.clone()).unwrap_or_default(),
                });
            }
            OutputItem::FunctionCall {
                id,
                name,
                arguments,
                status,
                ..
            } => {
                *status = done_status;
                out.push(StreamEvent::ArgumentsDone {
                    item_id: id.clone(),
                    output_index,
                    name: name.clone(),
                    arguments: arguments.clone(),
                });
            }
        }
        out.push(StreamEvent::ItemDone {
            output_index,
            item: item.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_engine::tool_calls::ToolSpec;
    use serde_json::json;

    fn names(events: &[StreamEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| {
                serde_json::to_value(e).unwrap()["type"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn plain_text_is_one_message() {
        let mut b = OutputBuilder::new(None, None);
        let mut events = b.push("Hel");
        events.extend(b.push(""));
        events.extend(b.push("lo"));
        events.extend(b.finish("!", false));
        assert_eq!(
            names(&events),
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
            ]
        );
        let [OutputItem::Message {
            status, content, ..
        }] = b.items()
        else {
            panic!("{:?}", b.items())
        };
        assert_eq!((*status, content[0].text.as_str()), ("completed", "Hello!"));
    }

    #[test]
    fn an_empty_reply_is_an_empty_message() {
        let mut b = OutputBuilder::new(None, None);
        let events = b.finish("", true);
        assert_eq!(events.len(), 5, "{:?}", names(&events));
        assert!(
            matches!(&b.items()[0], OutputItem::Message { content, status, .. }
                if content[0].text.is_empty() && *status == "incomplete")
        );
    }

    #[test]
    fn calls_become_function_call_items() {
        let tools = ToolParsing {
            format: ToolCallFormat::Hermes,
            tools: vec![ToolSpec {
                name: "get_weather".into(),
                description: None,
                parameters: json!({"type": "object"}),
            }]
            .into(),
        };
        let mut b = OutputBuilder::new(Some(&tools), None);
        let text = "Let me look.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let mut events = Vec::new();
        for piece in text.as_bytes().chunks(7) {
            events.extend(b.push(std::str::from_utf8(piece).unwrap()));
        }
        events.extend(b.finish("", false));
        let names = names(&events);
        assert_eq!(
            names.first().map(String::as_str),
            Some("response.output_item.added")
        );
        assert!(names.contains(&"response.function_call_arguments.delta".to_owned()));
        assert_eq!(
            names.last().map(String::as_str),
            Some("response.output_item.done")
        );
        let [OutputItem::Message { content, .. }, OutputItem::FunctionCall {
            name,
            arguments,
            call_id,
            status,
            ..
        }] = b.items()
        else {
            panic!("{:?}", b.items())
        };
        assert_eq!(content[0].text, "Let me look.");
        assert_eq!(name, "get_weather");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(arguments).unwrap(),
            json!({"city": "Paris"})
        );
        assert!(call_id.starts_with("call_"));
        assert_eq!(*status, "completed");
    }

    #[test]
    fn reasoning_becomes_a_reasoning_item_before_the_message() {
        use ferry_engine::reasoning::{ReasoningFormat, ReasoningParsing};
        let reasoning = ReasoningParsing {
            format: ReasoningFormat::Think,
            starts_inside: true,
        };
        let text = "Two and two.\n</think>\n\nFour.";
        let mut whole = OutputBuilder::new(None, Some(reasoning));
        let mut events = whole.push(text);
        events.extend(whole.finish("", false));
        let mut pieces = OutputBuilder::new(None, Some(reasoning));
        let mut streamed = Vec::new();
        for c in text.chars() {
            streamed.extend(pieces.push(&c.to_string()));
        }
        streamed.extend(pieces.finish("", false));
        let [OutputItem::Reasoning {
            content, status, ..
        }, OutputItem::Message {
            content: message, ..
        }] = whole.items()
        else {
            panic!("{:?}", whole.items())
        };
        assert_eq!(
            (content[0].text.as_str(), *status),
            ("Two and two.", "completed")
        );
        assert_eq!(message[0].text, "Four.");
        let names = names(&events);
        assert_eq!(names[0], "response.output_item.added");
        assert_eq!(names[1], "response.reasoning_text.delta");
        assert!(names.contains(&"response.reasoning_text.done".to_owned()));
        // The streamed items are the whole reply's, ids aside.
        let text_of = |items: &[OutputItem]| -> Vec<String> {
            items
                .iter()
                .map(|i| match i {
                    OutputItem::Reasoning { content, .. } => format!("r:{}", content[0].text),
                    OutputItem::Message { content, .. } => format!("m:{}", content[0].text),
                    OutputItem::FunctionCall { name, .. } => format!("f:{name}"),
                })
                .collect()
        };
        assert_eq!(text_of(pieces.items()), text_of(whole.items()));
        let deltas: String = streamed
            .iter()
            .filter_map(|e| match e {
                StreamEvent::ReasoningDelta { delta, .. } => Some(delta.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(deltas, "Two and two.");
    }
}
