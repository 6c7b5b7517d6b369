//! Stop strings found across token boundaries and never emitted: text arrives in increments, and
//! the matcher releases only what can no longer be part of a stop string.

/// What one increment made final.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopStep {
    /// Text safe to emit now.
    pub text: String,
    /// A stop string matched; `text` is everything before it and generation must end.
    pub stopped: bool,
}

/// Watches generated text for any of several stop strings.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released: a suffix that may still start a stop string.
    pending: String,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        Self {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
        }
    }

    /// Feeds the next piece of text. On a match, the earliest occurrence of any stop string
    /// wins and everything from it on is dropped.
    pub fn push(&mut self, text: &str) -> StopStep {
        if self.stops.is_empty() {
            return StopStep {
                text: text.to_owned(),
                stopped: false,
            };
        }
        self.pending.push_str(text);
        let earliest = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(pos) = earliest {
            self.pending.truncate(pos);
            return StopStep {
                text: std::mem::take(&mut self.pending),
                stopped: true,
            };
        }
        let hold = self.held_suffix_start();
        let rest = self.pending.split_off(hold);
        StopStep {
            text: std::mem::replace(&mut self.pending, rest),
            stopped: false,
        }
    }

    /// Releases whatever is still held back (generation ended for another reason).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    /// Start of the longest suffix of `pending` that is a proper prefix of some stop string
    /// (`pending.len()` when there is none).
    fn held_suffix_start(&self) -> usize {
        self.pending
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let suffix = &self.pending[i..];
                self.stops
                    .iter()
                    .any(|s| s.len() > suffix.len() && s.starts_with(suffix))
            })
            .unwrap_or(self.pending.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` and returns (what was emitted per step, stopped, what `finish` released).
    fn feed(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool, String) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = Vec::new();
        for p in pieces {
            let step = m.push(p);
            out.push(step.text);
            if step.stopped {
                return (out, true, m.finish());
            }
        }
        (out, false, m.finish())
    }

    #[test]
    fn table() {
        struct Case {
            name: &'static str,
            stops: &'static [&'static str],
            pieces: &'static [&'static str],
            emitted: &'static [&'static str],
            stopped: bool,
            trailing: &'static str,
        }
        let cases = [
            Case {
                name: "no stops passes text through",
                stops: &[],
                pieces: &["a", "b"],
                emitted: &["a", "b"],
                stopped: false,
                trailing: "",
            },
            Case {
                name: "stop split over three increments",
                stops: &["STOP"],
                pieces: &["hello S", "T", "OP world"],
                emitted: &["hello ", "", ""],
                stopped: true,
                trailing: "",
            },
            Case {
                name: "stop at the very start",
                stops: &["##"],
                pieces: &["##x"],
                emitted: &[""],
                stopped: true,
                trailing: "",
            },
            Case {
                name: "held prefix that is not a stop is released",
                stops: &["END"],
                pieces: &["a E", "N", "d b"],
                emitted: &["a ", "", "ENd b"],
                stopped: false,
                trailing: "",
            },
            Case {
                name: "held prefix released by finish",
                stops: &["END"],
                pieces: &["x EN"],
                emitted: &["x "],
                stopped: false,
                trailing: "EN",
            },
            Case {
                name: "overlapping stops: the longer one starting first wins",
                stops: &["bc", "abcd"],
                pieces: &["xa", "bcd"],
                emitted: &["x", ""],
                stopped: true,
                trailing: "",
            },
            Case {
                name: "self-overlapping stop found after a false start",
                stops: &["aab"],
                pieces: &["a", "a", "a", "b!"],
                emitted: &["", "", "a", ""],
                stopped: true,
                trailing: "",
            },
            Case {
                name: "several stops: earliest occurrence wins",
                stops: &["world", "lo"],
                pieces: &["hello world"],
                emitted: &["hel"],
                stopped: true,
                trailing: "",
            },
            Case {
                name: "multi-byte text around a stop",
                stops: &["é!"],
                pieces: &["caf", "é", "!"],
                emitted: &["caf", "", ""],
                stopped: true,
                trailing: "",
            },
        ];
        for c in cases {
            let (emitted, stopped, trailing) = feed(c.stops, c.pieces);
            assert_eq!(emitted, c.emitted, "{}", c.name);
            assert_eq!(stopped, c.stopped, "{}", c.name);
            assert_eq!(trailing, c.trailing, "{}", c.name);
        }
    }

    #[test]
    fn emitted_text_plus_trailing_is_the_input_when_nothing_stops() {
        let (emitted, stopped, trailing) = feed(&["xyz", "yy"], &["ax", "y", "by", "x", "yx"]);
        assert!(!stopped);
        assert_eq!(emitted.concat() + &trailing, "axybyxyx");
    }
}
