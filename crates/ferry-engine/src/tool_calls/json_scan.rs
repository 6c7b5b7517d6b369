//! Where a JSON value or object ends in text that may still be arriving: just enough JSON
//! lexing (strings with escapes, nesting, literals) for the region readers to find a call's
//! name and the extent of its arguments without waiting for the whole call.

use super::skip_ws;

/// How far a JSON value reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Extent {
    /// It ends just before this byte.
    Complete(usize),
    /// The text ends inside it.
    Partial,
    /// It is not JSON.
    Invalid,
}

/// One `"key": value` of an object, seen once its key is complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    pub key: String,
    /// Where the value starts (the text's end when it has not started yet).
    pub value_start: usize,
    /// Where it ends, once complete.
    pub value_end: Option<usize>,
}

impl Entry {
    /// The value's text so far, trailing whitespace held back (it may be followed by more).
    pub fn text<'a>(&self, text: &'a str) -> &'a str {
        match self.value_end {
            Some(end) => &text[self.value_start..end],
            None => text[self.value_start..].trim_end(),
        }
    }

    /// The value as a string, once it is a complete JSON string.
    pub fn string(&self, text: &str) -> Option<String> {
        self.value_end
            .and_then(|end| serde_json::from_str(&text[self.value_start..end]).ok())
    }
}

/// An object's entries so far and its extent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ObjectScan {
    pub entries: Vec<Entry>,
    pub extent: Extent,
}

impl ObjectScan {
    /// The first entry named one of `keys`.
    pub fn get(&self, keys: &[&str]) -> Option<&Entry> {
        self.entries.iter().find(|e| keys.contains(&e.key.as_str()))
    }
}

/// A JSON object read as a call: its `name` once complete and its arguments so far (the
/// value of the first of `argument_keys`; `{}` when the object closed without one).
pub(super) fn object_call(
    text: &str,
    at: usize,
    argument_keys: &[&str],
) -> (super::PartialCall, ObjectScan) {
    let scan = scan_object(text, at);
    let name = scan.get(&["name"]).and_then(|e| e.string(text));
    let arguments = match scan.get(argument_keys) {
        Some(entry) => entry.text(text).to_owned(),
        None if matches!(scan.extent, Extent::Complete(_)) => "{}".to_owned(),
        None => String::new(),
    };
    (super::PartialCall { name, arguments }, scan)
}

/// Scans the object whose `{` is at `at`.
pub(super) fn scan_object(text: &str, at: usize) -> ObjectScan {
    let bytes = text.as_bytes();
    let mut entries = Vec::new();
    let done = |entries, extent| ObjectScan { entries, extent };
    if bytes.get(at) != Some(&b'{') {
        return done(entries, Extent::Invalid);
    }
    let mut pos = at + 1;
    loop {
        pos = skip_ws(text, pos);
        let Some(&b) = bytes.get(pos) else {
            return done(entries, Extent::Partial);
        };
        if b == b'}' {
            return done(entries, Extent::Complete(pos + 1));
        }
        if !entries.is_empty() {
            if b != b',' {
                return done(entries, Extent::Invalid);
            }
            pos = skip_ws(text, pos + 1);
        }
        match bytes.get(pos) {
            None => return done(entries, Extent::Partial),
            Some(b'"') => {}
            Some(_) => return done(entries, Extent::Invalid),
        }
        let key_end = match string_end(text, pos) {
            Extent::Complete(end) => end,
            other => return done(entries, other),
        };
        let Ok(key) = serde_json::from_str::<String>(&text[pos..key_end]) else {
            return done(entries, Extent::Invalid);
        };
        pos = skip_ws(text, key_end);
        match bytes.get(pos) {
            None => return done(entries, Extent::Partial),
            Some(b':') => {}
            Some(_) => return done(entries, Extent::Invalid),
        }
        let value_start = skip_ws(text, pos + 1);
        match value_end(text, value_start) {
            Extent::Complete(end) => {
                entries.push(Entry {
                    key,
                    value_start,
                    value_end: Some(end),
                });
                pos = end;
            }
            Extent::Partial => {
                entries.push(Entry {
                    key,
                    value_start,
                    value_end: None,
                });
                return done(entries, Extent::Partial);
            }
            Extent::Invalid => {
                // Kept open, so the value's text keeps growing rather than vanishing.
                entries.push(Entry {
                    key,
                    value_start,
                    value_end: None,
                });
                return done(entries, Extent::Invalid);
            }
        }
    }
}

/// The extent of the JSON value starting at `at`.
pub(super) fn value_end(text: &str, at: usize) -> Extent {
    let bytes = text.as_bytes();
    match bytes.get(at) {
        None => Extent::Partial,
        Some(b'"') => string_end(text, at),
        Some(b'{' | b'[') => nested_end(text, at),
        Some(_) => {
            let len = bytes[at..]
                .iter()
                .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
                .count();
            if at + len == bytes.len() {
                Extent::Partial
            } else if len > 0
                && serde_json::from_str::<serde_json::Value>(&text[at..at + len]).is_ok()
            {
                Extent::Complete(at + len)
            } else {
                Extent::Invalid
            }
        }
    }
}

/// The end of the string whose `"` is at `at`.
fn string_end(text: &str, at: usize) -> Extent {
    let bytes = text.as_bytes();
    let mut i = at + 1;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'\\' => i += 2,
            b'"' => return Extent::Complete(i + 1),
            _ => i += 1,
        }
    }
    Extent::Partial
}

/// The end of the object or array whose bracket is at `at`.
fn nested_end(text: &str, at: usize) -> Extent {
    let bytes = text.as_bytes();
    let mut open = Vec::new();
    let mut i = at;
    while let Some(&b) = bytes.get(i) {
        match b {
            b'"' => match string_end(text, i) {
                Extent::Complete(end) => {
                    i = end;
                    continue;
                }
                other => return other,
            },
            b'{' => open.push(b'}'),
            b'[' => open.push(b']'),
            b'}' | b']' => {
                if open.pop() != Some(b) {
                    return Extent::Invalid;
                }
                if open.is_empty() {
                    return Extent::Complete(i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
    Extent::Partial
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_end_where_json_says() {
        let cases = [
            (r#"{"a": [1, "}"]} x"#, Extent::Complete(15)),
            (r#"{"a": [1, "}"#, Extent::Partial),
            (r#""a\"b" x"#, Extent::Complete(6)),
            ("12, ", Extent::Complete(2)),
            ("12", Extent::Partial),
            ("true}", Extent::Complete(4)),
            ("tru}", Extent::Invalid),
            ("{]", Extent::Invalid),
            ("", Extent::Partial),
        ];
        for (text, want) in cases {
            assert_eq!(value_end(text, 0), want, "{text}");
        }
    }

    #[test]
    fn objects_list_their_entries_as_they_arrive() {
        let text = r#"{"name": "f", "arguments": {"x": 1"#;
        let scan = scan_object(text, 0);
        assert_eq!(scan.extent, Extent::Partial);
        assert_eq!(
            scan.get(&["name"]).unwrap().string(text).as_deref(),
            Some("f")
        );
        assert_eq!(scan.get(&["arguments"]).unwrap().text(text), r#"{"x": 1"#);
        let text = r#"{"name": "f", "arguments": {}}"#;
        let scan = scan_object(text, 0);
        assert_eq!(scan.extent, Extent::Complete(text.len()));
        assert_eq!(scan.get(&["arguments"]).unwrap().text(text), "{}");
        assert_eq!(scan_object(r#"{"a" 1}"#, 0).extent, Extent::Invalid);
        assert_eq!(scan_object(r#"{"na"#, 0).entries, []);
    }
}
