//! Incremental detokenisation: turns generated token ids into text as they arrive.
//!
//! Decoding each token alone loses spaces (SentencePiece strips a leading "▁" at the start of a
//! decode) and splits multi-byte characters (byte-level BPE may spread one character over several
//! tokens, and the partial bytes decode to U+FFFD). So, as TGI and vLLM do, each step decodes a
//! short window of already-emitted tokens plus the new ones and emits only the difference, and
//! holds the new text back while it still ends in U+FFFD.

use super::{traits::TextCodec, EngineResult};

/// How many prompt tokens seed the window, so the first generated token decodes in context.
const PROMPT_CONTEXT: usize = 5;

/// Incremental decoder for one sequence.
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    /// The window's tokens: a few context tokens, then everything not yet released.
    ids: Vec<u32>,
    /// Start of the window that is decoded for context.
    prefix_offset: usize,
    /// Tokens before this have had their text emitted.
    read_offset: usize,
    skip_special_tokens: bool,
}

impl IncrementalDecoder {
    /// A decoder whose window starts with the last few `prompt` tokens (for context only; their
    /// text is never emitted).
    pub fn new(prompt: &[u32], skip_special_tokens: bool) -> Self {
        let tail = &prompt[prompt.len().saturating_sub(PROMPT_CONTEXT)..];
        Self {
            ids: tail.to_vec(),
            prefix_offset: 0,
            read_offset: tail.len(),
            skip_special_tokens,
        }
    }

    /// Adds one generated token and returns the text that became final (possibly empty).
    pub fn push(&mut self, codec: &dyn TextCodec, id: u32) -> EngineResult<String> {
        self.ids.push(id);
        let prefix = codec.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special_tokens,
        )?;
        let full = codec.decode(&self.ids[self.prefix_offset..], self.skip_special_tokens)?;
        if full.len() <= prefix.len() || full.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let new = suffix_after(&prefix, &full).to_owned();
        // Slide the window: the released tokens become the next step's context.
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        self.compact();
        Ok(new)
    }

    /// Releases whatever is still held back (e.g. bytes of a character the generation never
    /// completed, which then decode to U+FFFD).
    pub fn finish(&mut self, codec: &dyn TextCodec) -> EngineResult<String> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let prefix = codec.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special_tokens,
        )?;
        let full = codec.decode(&self.ids[self.prefix_offset..], self.skip_special_tokens)?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(suffix_after(&prefix, &full).to_owned())
    }

    /// Drops tokens before the window so memory stays bounded on long generations.
    fn compact(&mut self) {
        if self.prefix_offset > 64 {
            self.ids.drain(..self.prefix_offset);
            self.read_offset -= self.prefix_offset;
            self.prefix_offset = 0;
        }
    }
}

/// The part of `full` after its common prefix with `prefix` (at a char boundary). Normally
/// `prefix` is a prefix of `full`; decoders that clean up text may rewrite the boundary.
fn suffix_after<'a>(prefix: &str, full: &'a str) -> &'a str {
    if let Some(rest) = full.strip_prefix(prefix) {
        return rest;
    }
    let common = prefix
        .char_indices()
        .zip(full.chars())
        .find(|((_, a), b)| a != b)
        .map(|((i, _), _)| i)
        .unwrap_or(prefix.len().min(full.len()));
    full.get(common..).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{TestCodec, EOS};

    /// Feeds `text`'s tokens one at a time; returns the emitted pieces and the finish() text.
    fn stream(codec: &TestCodec, prompt: &str, ids: &[u32]) -> (Vec<String>, String) {
        let prompt_ids = codec.encode(prompt, false).unwrap();
        let mut d = IncrementalDecoder::new(&prompt_ids, true);
        let pieces = ids.iter().map(|&id| d.push(codec, id).unwrap()).collect();
        (pieces, d.finish(codec).unwrap())
    }

    #[test]
    fn emoji_and_accents_stream_without_replacement_chars() {
        let codec = TestCodec::new();
        for text in ["he wo café 😀!", "😀😀 éé wo", "naïve — ünïcödé ✓ 🦀 end"]
        {
            let ids = codec.encode(text, false).unwrap();
            assert!(ids.len() > text.chars().count() / 2);
            let (pieces, rest) = stream(&codec, "prompt: ", &ids);
            for p in &pieces {
                assert!(!p.contains('\u{FFFD}'), "{text:?}: emitted {p:?}");
            }
            assert_eq!(pieces.concat(), text);
            assert_eq!(rest, "");
        }
    }

    #[test]
    fn split_emoji_is_held_until_complete() {
        let codec = TestCodec::new();
        let ids = codec.encode("a😀", false).unwrap();
        assert_eq!(ids.len(), 4);
        let (pieces, _) = stream(&codec, "", &ids);
        assert_eq!(pieces, vec!["a", "", "", "😀"]);
    }

    #[test]
    fn special_tokens_are_skipped_and_spaces_kept() {
        let codec = TestCodec::new();
        let mut ids = codec.encode(" wo he", false).unwrap();
        ids.insert(1, EOS);
        let (pieces, _) = stream(&codec, "x", &ids);
        assert_eq!(pieces.concat(), " wo he");
    }

    #[test]
    fn an_unfinished_character_is_released_by_finish() {
        let codec = TestCodec::new();
        let ids = codec.encode("ok😀", false).unwrap();
        let (pieces, rest) = stream(&codec, "", &ids[..ids.len() - 1]);
        assert_eq!(pieces.concat(), "ok");
        assert!(rest.contains('\u{FFFD}'));
    }

    #[test]
    fn long_generations_keep_a_bounded_window() {
        let codec = TestCodec::new();
        let text = "he wo ".repeat(100);
        let ids = codec.encode(&text, false).unwrap();
        let prompt: Vec<u32> = Vec::new();
        let mut d = IncrementalDecoder::new(&prompt, true);
        let out: String = ids.iter().map(|&id| d.push(&codec, id).unwrap()).collect();
        assert_eq!(out, text);
        assert!(d.ids.len() < 80);
    }

    #[test]
    fn suffix_after_handles_rewritten_prefixes() {
        assert_eq!(suffix_after("ab", "abc"), "c");
        assert_eq!(suffix_after("ab ", "abé"), "é");
        assert_eq!(suffix_after("", "x"), "x");
    }
}
