//! Reads gpt-oss's harmony format out of a reply as its text arrives (decoded with special
//! tokens kept, so its markers are in the text).
//!
//! The prompt ends with `<|start|>assistant`, so a reply is a header (`<|channel|>NAME`, maybe
//! ` to=RECIPIENT` before or after it, maybe `<|constrain|>json`), `<|message|>`, the body, and
//! an end: `<|end|>` (another `<|start|>` message follows), or `<|return|>` / `<|call|>`,
//! which end the generation and so never reach the text. A body in channel `analysis` is
//! reasoning; one addressed to a recipient (`to=functions.NAME`, in `commentary`) is a call
//! of NAME whose arguments are the body; any other (`final`, a `commentary` preamble) is
//! content. Nothing of the markup reaches either side. A reply that does not start with a
//! header (a model that skips harmony) is content as written.

use super::held_back;

/// Starts a message (the role follows).
pub const START: &str = "<|start|>";
/// Names the channel in a header.
pub const CHANNEL: &str = "<|channel|>";
/// Ends the header: the body follows.
pub const MESSAGE: &str = "<|message|>";
/// Ends a message; more may follow.
pub const END: &str = "<|end|>";
/// Ends the reply (an end-of-generation token).
pub const RETURN: &str = "<|return|>";
/// Ends a call message and the reply (an end-of-generation token).
pub const CALL: &str = "<|call|>";
/// Names the body's format in a header (`<|constrain|>json`).
pub const CONSTRAIN: &str = "<|constrain|>";

/// What ends a body.
const BODY_ENDS: [&str; 4] = [END, RETURN, CALL, START];
/// What may open the first header (the prompt gave `<|start|>assistant`).
const FIRST_HEADER: [&str; 4] = [CHANNEL, CONSTRAIN, " to=", "to="];

/// What a piece of the reply turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HarmonyEvent {
    /// An `analysis` body.
    Reasoning(String),
    /// A `final` (or unaddressed `commentary`) body.
    Content(String),
    /// A message addressed to `name` begins (`to=functions.NAME`: the `functions.` is dropped).
    Call(String),
    /// More of the open call's arguments.
    Arguments(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    Call,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading a header (`first`: the reply's first, which may turn out to be no header).
    Header { first: bool },
    /// Reading a body.
    Body(Body),
    /// After `<|end|>`: waiting for the next `<|start|>`.
    Between,
}

/// One reply's harmony reader.
#[derive(Debug, Clone)]
pub struct HarmonyStream {
    phase: Phase,
    /// Text not decided yet: the header so far, or a possible marker at the end of a body.
    pending: String,
}

impl Default for HarmonyStream {
    fn default() -> Self {
        Self::new()
    }
}

impl HarmonyStream {
    /// A reader for a reply to a prompt ending in `<|start|>assistant`.
    pub fn new() -> Self {
        Self {
            phase: Phase::Header { first: true },
            pending: String::new(),
        }
    }

    /// Whether the reply is in reasoning: in an `analysis` body (a header is not, until its
    /// `<|message|>` opens the body).
    pub fn in_reasoning(&self) -> bool {
        self.phase == Phase::Body(Body::Reasoning)
    }

    /// Takes the next piece of the reply.
    pub fn push(&mut self, text: &str) -> Vec<HarmonyEvent> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        self.drive(false, &mut out);
        out
    }

    /// The reply ended: everything held back is decided (an unfinished header is dropped).
    pub fn finish(&mut self) -> Vec<HarmonyEvent> {
        let mut out = Vec::new();
        self.drive(true, &mut out);
        self.pending.clear();
        out
    }

    fn drive(&mut self, done: bool, out: &mut Vec<HarmonyEvent>) {
        loop {
            match self.phase {
                Phase::Header { first } => {
                    if first && !self.could_be_header(done) {
                        self.phase = Phase::Body(Body::Content);
                        continue;
                    }
                    let Some(at) = self.pending.find(MESSAGE) else {
                        if first && done {
                            // Never became a header: the model wrote plain text.
                            self.phase = Phase::Body(Body::Content);
                            continue;
                        }
                        return;
                    };
                    let header: String = self.pending.drain(..at + MESSAGE.len()).collect();
                    let body = match recipient(&header) {
                        Some(name) => {
                            out.push(HarmonyEvent::Call(name));
                            Body::Call
                        }
                        None if channel(&header) == Some("analysis") => Body::Reasoning,
                        None => Body::Content,
                    };
                    self.phase = Phase::Body(body);
                }
                Phase::Body(body) => {
                    let end = BODY_ENDS
                        .iter()
                        .filter_map(|m| self.pending.find(m).map(|at| (at, *m)))
                        .min();
                    let cut = match end {
                        Some((at, _)) => at,
                        None if done => self.pending.len(),
                        None => self.pending.len() - held_back(&self.pending, &BODY_ENDS),
                    };
                    let text: String = self.pending.drain(..cut).collect();
                    if !text.is_empty() {
                        out.push(match body {
                            Body::Reasoning => HarmonyEvent::Reasoning(text),
                            Body::Content => HarmonyEvent::Content(text),
                            Body::Call => HarmonyEvent::Arguments(text),
                        });
                    }
                    let Some((_, marker)) = end else { return };
                    self.pending.drain(..marker.len());
                    self.phase = if marker == START {
                        Phase::Header { first: false }
                    } else {
                        Phase::Between
                    };
                }
                Phase::Between => {
                    // The next message's header; a `<|channel|>` without `<|start|>` opens
                    // one too.
                    let next = [START, CHANNEL]
                        .iter()
                        .filter_map(|m| self.pending.find(m).map(|at| (at, *m)))
                        .min();
                    let Some((at, marker)) = next else {
                        let keep = held_back(&self.pending, &[START, CHANNEL]);
                        self.pending.drain(..self.pending.len() - keep);
                        return;
                    };
                    let skip = if marker == START {
                        at + START.len()
                    } else {
                        at
                    };
                    self.pending.drain(..skip);
                    self.phase = Phase::Header { first: false };
                }
            }
        }
    }

    /// Whether the pending text (the reply's start) is, or may still become, a header.
    fn could_be_header(&self, done: bool) -> bool {
        let rest = self.pending.trim_start_matches(['\n', '\r', '\t']);
        FIRST_HEADER
            .iter()
            .any(|m| rest.starts_with(m) || (!done && m.starts_with(rest)))
    }
}

/// The recipient a header addresses (`to=functions.NAME` gives NAME), if any but the user.
fn recipient(header: &str) -> Option<String> {
    let at = header.find("to=")?;
    let name = header_word(&header[at + 3..]);
    let name = name.strip_prefix("functions.").unwrap_or(name);
    (!name.is_empty() && name != "assistant" && name != "user").then(|| name.to_owned())
}

/// The channel a header names.
fn channel(header: &str) -> Option<&str> {
    let at = header.find(CHANNEL)?;
    Some(header_word(&header[at + CHANNEL.len()..]))
}

/// The word at the start of `text`: up to whitespace or a marker.
fn header_word(text: &str) -> &str {
    let end = text
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(text.len());
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq)]
    struct Read {
        reasoning: String,
        content: String,
        calls: Vec<(String, String)>,
    }

    /// `text` read whole, one character at a time and in pieces of three bytes; all three
    /// must agree, and no piece may carry markup.
    fn read(text: &str) -> Read {
        let mut results = Vec::new();
        for step in [usize::MAX, 1, 3] {
            let mut stream = HarmonyStream::new();
            let mut events = Vec::new();
            let mut start = 0;
            while start < text.len() {
                let mut end = start.saturating_add(step).min(text.len());
                while !text.is_char_boundary(end) {
                    end += 1;
                }
                events.extend(stream.push(&text[start..end]));
                start = end;
            }
            events.extend(stream.finish());
            let mut read = Read::default();
            for e in events {
                match e {
                    HarmonyEvent::Reasoning(r) => read.reasoning.push_str(&r),
                    HarmonyEvent::Content(c) => read.content.push_str(&c),
                    HarmonyEvent::Call(name) => read.calls.push((name, String::new())),
                    HarmonyEvent::Arguments(a) => read
                        .calls
                        .last_mut()
                        .expect("a call is open")
                        .1
                        .push_str(&a),
                }
            }
            for piece in [&read.reasoning, &read.content] {
                for marker in [START, CHANNEL, MESSAGE, END, RETURN, CALL, CONSTRAIN] {
                    assert!(
                        !piece.contains(marker),
                        "markup leaked: {piece:?} of {text:?}"
                    );
                }
            }
            results.push(read);
        }
        assert!(
            results.windows(2).all(|w| w[0] == w[1]),
            "{text:?}: {results:?}"
        );
        results.remove(0)
    }

    fn expect(reasoning: &str, content: &str, calls: &[(&str, &str)]) -> Read {
        Read {
            reasoning: reasoning.into(),
            content: content.into(),
            calls: calls
                .iter()
                .map(|(n, a)| ((*n).to_owned(), (*a).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn harmony_table() {
        let cases: &[(&str, Read)] = &[
            (
                "<|channel|>analysis<|message|>User says hi.<|end|><|start|>assistant<|channel|>final<|message|>Hello!",
                expect("User says hi.", "Hello!", &[]),
            ),
            ("<|channel|>final<|message|>Just this.", expect("", "Just this.", &[])),
            (
                "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}",
                expect("Need weather.", "", &[("get_weather", "{\"city\":\"Paris\"}")]),
            ),
            // The recipient before the channel, as the template writes past calls.
            (
                " to=functions.get_weather<|channel|>commentary json<|message|>{\"days\": 2}",
                expect("", "", &[("get_weather", "{\"days\": 2}")]),
            ),
            // A preamble in commentary is content; two analysis messages add up.
            (
                "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>analysis<|message|>b<|end|><|start|>assistant<|channel|>final<|message|>done",
                expect("ab", "Checking.done", &[]),
            ),
            // Cut short in the analysis (max_tokens): what there is.
            ("<|channel|>analysis<|message|>Thinking about <|e", expect("Thinking about <|e", "", &[])),
            // Cut short in a header: nothing of it.
            ("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|chan", expect("x", "", &[])),
            // Not harmony at all: content as written.
            ("Plain answer.", expect("", "Plain answer.", &[])),
            ("<b>bold</b>", expect("", "<b>bold</b>", &[])),
            ("to", expect("", "to", &[])),
            (
                "<|channel|>final<|message|>é ü <| not a marker |>",
                expect("", "é ü <| not a marker |>", &[]),
            ),
            // `<|channel|>` without `<|start|>` after an end still opens a header.
            (
                "<|channel|>analysis<|message|>r<|end|><|channel|>final<|message|>c",
                expect("r", "c", &[]),
            ),
            ("", expect("", "", &[])),
        ];
        for (text, want) in cases {
            assert_eq!(&read(text), want, "{text:?}");
        }
    }

    #[test]
    fn the_phase_is_known_as_the_text_arrives() {
        let mut stream = HarmonyStream::new();
        assert!(!stream.in_reasoning());
        stream.push("<|channel|>analysis");
        assert!(!stream.in_reasoning());
        stream.push("<|message|>hm");
        assert!(stream.in_reasoning());
        stream.push("<|end|>");
        assert!(!stream.in_reasoning());
        stream.push("<|start|>assistant<|channel|>fin");
        assert!(!stream.in_reasoning());
        stream.push("al<|message|>x");
        assert!(!stream.in_reasoning());
        let mut call = HarmonyStream::new();
        call.push("<|channel|>commentary to=functions.f");
        assert!(!call.in_reasoning());
    }
}
