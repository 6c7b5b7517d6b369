//! Reads a `<think>...</think>` block out of a reply as its text arrives (Qwen3, QwQ,
//! DeepSeek-R1). The block is reasoning only at the start of the reply (after whitespace), or
//! from the first byte when the prompt opened it ([`ThinkStream::new`]'s `starts_inside`);
//! everything after `</think>` is content, whatever it contains. A reply cut short inside the
//! block is all reasoning. Whitespace right after `<think>`, right before `</think>` and right
//! after `</think>` is dropped (the templates write newlines there), so the reasoning and the
//! content are what the model wrote between them.

use super::held_back;

/// Opens the block.
pub const OPEN: &str = "<think>";
/// Closes the block.
pub const CLOSE: &str = "</think>";

/// What a piece of the reply turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ThinkEvent {
    /// Text inside the block.
    Reasoning(String),
    /// Text outside it.
    Content(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing but whitespace yet: `<think>` may still open the block.
    Start,
    /// Inside the block.
    Reasoning,
    /// After the block (or there was none).
    Content,
}

/// One reply's think-block reader.
#[derive(Debug, Clone)]
pub struct ThinkStream {
    phase: Phase,
    /// Text not decided yet: a possible `<think>` at the start, a possible `</think>`, or
    /// whitespace that may precede `</think>`.
    pending: String,
    /// Nothing has been emitted in the current phase yet (its leading whitespace is dropped
    /// in the reasoning, and after `</think>` in the content).
    fresh: bool,
    /// The content follows a think block (its leading whitespace is dropped).
    after_block: bool,
}

impl ThinkStream {
    /// A reader for a reply whose prompt did (`starts_inside`) or did not open the block.
    pub fn new(starts_inside: bool) -> Self {
        Self {
            phase: if starts_inside {
                Phase::Reasoning
            } else {
                Phase::Start
            },
            pending: String::new(),
            fresh: true,
            after_block: false,
        }
    }

    /// Whether the reply is (still) inside the block.
    pub fn in_reasoning(&self) -> bool {
        self.phase == Phase::Reasoning
    }

    /// Takes the next piece of the reply.
    pub fn push(&mut self, text: &str) -> Vec<ThinkEvent> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        self.drive(false, &mut out);
        out
    }

    /// The reply ended: everything held back is decided.
    pub fn finish(&mut self) -> Vec<ThinkEvent> {
        let mut out = Vec::new();
        self.drive(true, &mut out);
        out
    }

    fn drive(&mut self, done: bool, out: &mut Vec<ThinkEvent>) {
        loop {
            match self.phase {
                Phase::Start => {
                    let rest = self.pending.trim_start();
                    if let Some(after) = rest.strip_prefix(OPEN) {
                        self.pending = after.to_owned();
                        self.enter(Phase::Reasoning);
                        continue;
                    }
                    if !done && OPEN.starts_with(rest) {
                        return;
                    }
                    self.enter(Phase::Content);
                }
                Phase::Reasoning => {
                    if self.fresh {
                        let trimmed = self.pending.trim_start().len();
                        self.pending.drain(..self.pending.len() - trimmed);
                    }
                    if let Some(at) = self.pending.find(CLOSE) {
                        let reasoning = self.pending[..at].trim_end().to_owned();
                        self.pending.drain(..at + CLOSE.len());
                        self.emit(ThinkEvent::Reasoning(reasoning), out);
                        self.after_block = true;
                        self.enter(Phase::Content);
                        continue;
                    }
                    // Held back: a possible `</think>` and the whitespace before it.
                    let hold = if done {
                        0
                    } else {
                        held_back(&self.pending, &[CLOSE])
                    };
                    let decided = &self.pending[..self.pending.len() - hold];
                    let body = decided.trim_end().len();
                    let reasoning: String = self.pending.drain(..body).collect();
                    if done {
                        self.pending.clear();
                    }
                    self.emit(ThinkEvent::Reasoning(reasoning), out);
                    return;
                }
                Phase::Content => {
                    if self.fresh && self.after_block {
                        let trimmed = self.pending.trim_start().len();
                        self.pending.drain(..self.pending.len() - trimmed);
                    }
                    let content = std::mem::take(&mut self.pending);
                    self.emit(ThinkEvent::Content(content), out);
                    return;
                }
            }
        }
    }

    fn enter(&mut self, phase: Phase) {
        self.phase = phase;
        self.fresh = true;
    }

    fn emit(&mut self, event: ThinkEvent, out: &mut Vec<ThinkEvent>) {
        let (ThinkEvent::Reasoning(text) | ThinkEvent::Content(text)) = &event;
        if text.is_empty() {
            return;
        }
        self.fresh = false;
        out.push(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (reasoning, content) of `text` read whole, one character at a time and in pieces of
    /// three bytes; all three must agree.
    fn read(starts_inside: bool, text: &str) -> (String, String) {
        let mut results = Vec::new();
        for step in [usize::MAX, 1, 3] {
            let mut stream = ThinkStream::new(starts_inside);
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
            let (mut reasoning, mut content) = (String::new(), String::new());
            for e in events {
                match e {
                    ThinkEvent::Reasoning(r) => reasoning.push_str(&r),
                    ThinkEvent::Content(c) => content.push_str(&c),
                }
            }
            results.push((reasoning, content));
        }
        assert!(
            results.windows(2).all(|w| w[0] == w[1]),
            "{text:?}: {results:?}"
        );
        results.remove(0)
    }

    #[test]
    fn think_table() {
        let cases: &[(bool, &str, &str, &str)] = &[
            (false, "Hello.", "", "Hello."),
            (false, "<think>\nI add.\n</think>\n\n4", "I add.", "4"),
            (false, "  <think>a</think>b", "a", "b"),
            (false, "<think></think>\n\nHi", "", "Hi"),
            (false, "<thinking>x", "", "<thinking>x"),
            (false, "<thi", "", "<thi"),
            (false, "Hi <think>x</think>", "", "Hi <think>x</think>"),
            // Cut short inside the block: all reasoning.
            (false, "<think>\nStill going </th", "Still going </th", ""),
            (true, "I add.\n</think>\n\n4", "I add.", "4"),
            (true, "no close", "no close", ""),
            (
                true,
                "a < b </ c </think>x </think> y",
                "a < b </ c",
                "x </think> y",
            ),
            (true, "é ü\n</think>\nñ", "é ü", "ñ"),
            (true, "  \n</think>ok", "", "ok"),
            (true, "", "", ""),
            (false, "", "", ""),
            (false, "  ", "", "  "),
        ];
        for &(inside, text, reasoning, content) in cases {
            assert_eq!(
                read(inside, text),
                (reasoning.to_owned(), content.to_owned()),
                "inside={inside} {text:?}"
            );
        }
    }

    #[test]
    fn markup_never_reaches_either_side() {
        let mut stream = ThinkStream::new(false);
        let text = "<think>\nstep one\n</think>\n\nanswer";
        let mut seen = Vec::new();
        for c in text.chars() {
            seen.extend(stream.push(&c.to_string()));
        }
        seen.extend(stream.finish());
        for e in seen {
            let (ThinkEvent::Reasoning(t) | ThinkEvent::Content(t)) = e;
            assert!(!t.contains('<') && !t.contains('>'), "{t:?}");
        }
    }

    #[test]
    fn the_phase_is_known_as_the_text_arrives() {
        let mut stream = ThinkStream::new(false);
        assert!(!stream.in_reasoning());
        stream.push("<think>");
        assert!(stream.in_reasoning());
        stream.push("hmm</think>");
        assert!(!stream.in_reasoning());
        let mut opened = ThinkStream::new(true);
        assert!(opened.in_reasoning());
        opened.push("x</think>");
        assert!(!opened.in_reasoning());
    }
}
