//! A BPE vocabulary model made straight from a GGUF's token list and merges, for the
//! `tokenizers` pipeline ([`super::pipeline`]): byte-level vocabularies (`tokenizer.ggml.model =
//! "gpt2"`, [`CompactBpe::new`]) and SentencePiece ones as BPE by score ([`super::gguf_spm`],
//! [`CompactBpe::with_sentencepiece`]).
//!
//! It tokenizes exactly as `tokenizers`' own BPE model does with the settings ferry gives it
//! for these vocabularies (no dropout, no subword prefix or suffix; byte-level: no unknown
//! token, no byte fallback, `ignore_merges` from the pre type; SentencePiece: byte fallback and
//! the unknown token, not fused): each character of a pre-token becomes its token (else its
//! `<0xNN>` byte tokens, else the unknown token, else nothing), then the adjacent pair of lowest
//! merge rank is merged, the leftmost first on ties, until no pair has a merge. What differs is
//! how it is built: the crate's model wants every token and both halves of every merge as
//! owned strings in hash maps (and keeps a reversed copy), about 250,000 small allocations for a
//! 49k-token vocabulary, which made the tokenizer the longest part of loading a small model
//! (docs/BENCHMARKS.md). Here the token texts are one string, indexed by a hash table of ids,
//! and the merges a map of id pairs.

use std::borrow::Cow;
use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashMap, HashTable};
use rayon::prelude::*;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::Token;

use crate::error::{ModelError, Result};

/// Fewest merges a rayon task resolves (a 49k-merge vocabulary: a dozen tasks).
const MERGES_PER_TASK: usize = 4096;

/// Code points below this have their one-character token in [`CompactBpe::chars`].
const CHAR_TABLE: u32 = 0x200;

/// A BPE model: token texts, their index and the merges.
pub struct CompactBpe {
    /// Every token's text, one after the other.
    text: String,
    /// Token `id` is `text[starts[id]..starts[id + 1]]`.
    starts: Vec<u32>,
    /// Token ids by their text; a text spelled by several ids finds the last (as the crate's
    /// vocabulary map, built in id order, keeps it).
    index: HashTable<u32>,
    hasher: DefaultHashBuilder,
    /// `(left, right)` -> `(rank, merged id)`; a pair listed twice keeps its later rank.
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// A pre-token that is a token is that token, merges or not (Llama 3's pre types).
    ignore_merges: bool,
    /// The ids of the one-character tokens below U+0200 (the byte alphabet is U+0021-U+0143),
    /// by code point: a pre-token's characters are looked up here first.
    chars: Vec<Option<u32>>,
    /// The `<0xNN>` token of each byte, for characters without a token of their own (all 256
    /// must be tokens for a character's bytes to be used); empty without byte fallback.
    byte_tokens: Vec<Option<u32>>,
    /// The token of a character that has neither its own nor byte tokens.
    unk: Option<u32>,
}

impl std::fmt::Debug for CompactBpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompactBpe")
            .field("tokens", &self.len())
            .field("merges", &self.merges.len())
            .field("ignore_merges", &self.ignore_merges)
            .finish()
    }
}

impl CompactBpe {
    /// The byte-level model of `tokens` (id order, spelled in the byte alphabet) and `merges`
    /// (`"a b"`, rank order). Errors name a merge that is not `a b` or whose halves or result
    /// are not tokens.
    pub fn new(
        tokens: &[Cow<'_, str>],
        merges: &[Cow<'_, str>],
        ignore_merges: bool,
    ) -> Result<Self> {
        let mut model = Self::vocabulary(tokens)?;
        model.ignore_merges = ignore_merges;
        let missing = |t: &str| {
            ModelError::Tokenizer(format!(
                "cannot build BPE from GGUF vocab: merge token `{t}` is not in the vocabulary"
            ))
        };
        // The lookups (three per merge) on rayon's threads, in chunks; the map filled in rank
        // order after.
        let ids: Vec<(u32, u32, u32)> = merges
            .par_iter()
            .with_min_len(MERGES_PER_TASK)
            .map_init(String::new, |joined, merge| {
                let (a, b) = merge.split_once(' ').ok_or_else(|| {
                    ModelError::Config(format!("GGUF merge `{merge}` is not `a b`"))
                })?;
                let left = model.id(a).ok_or_else(|| missing(a))?;
                let right = model.id(b).ok_or_else(|| missing(b))?;
                joined.clear();
                joined.push_str(a);
                joined.push_str(b);
                let merged = model.id(joined).ok_or_else(|| missing(joined))?;
                Ok((left, right, merged))
            })
            .collect::<Result<_>>()?;
        model.set_merges(&ids);
        Ok(model)
    }

    /// The SentencePiece model: `self` (a [`CompactBpe::vocabulary`]) with `merges`
    /// (`(left, right, merged)` ids, rank order), byte fallback and `unk` for characters that
    /// have no token.
    pub fn with_sentencepiece(
        mut self,
        merges: &[(u32, u32, u32)],
        unk: Option<u32>,
    ) -> Result<Self> {
        let n = self.len() as u32;
        if let Some(&(l, r, m)) = merges.iter().find(|&&(l, r, m)| l.max(r).max(m) >= n) {
            return Err(ModelError::Config(format!(
                "SentencePiece merge ({l}, {r}) -> {m} is outside the {n} tokens"
            )));
        }
        self.set_merges(merges);
        self.byte_tokens = (0..=255u8)
            .map(|b| self.id(&format!("<{b:#04X}>")))
            .collect();
        self.unk = unk.filter(|&u| u < n);
        Ok(self)
    }

    /// The token texts (id order) and their index, no merges yet: [`Self::id`] answers, for
    /// finding the merges ([`Self::with_sentencepiece`]).
    pub fn vocabulary(tokens: &[Cow<'_, str>]) -> Result<Self> {
        let bytes: usize = tokens.iter().map(|t| t.len()).sum();
        if bytes > u32::MAX as usize || tokens.len() > u32::MAX as usize {
            return Err(ModelError::Config(
                "GGUF vocabulary over 4 GiB of text".into(),
            ));
        }
        let mut model = CompactBpe {
            text: String::with_capacity(bytes),
            starts: Vec::with_capacity(tokens.len() + 1),
            index: HashTable::with_capacity(tokens.len()),
            hasher: DefaultHashBuilder::default(),
            merges: HashMap::new(),
            ignore_merges: false,
            chars: Vec::new(),
            byte_tokens: Vec::new(),
            unk: None,
        };
        model.starts.push(0);
        for (id, token) in tokens.iter().enumerate() {
            model.text.push_str(token);
            model.starts.push(model.text.len() as u32);
            model.insert(id as u32);
        }
        model.chars = (0..CHAR_TABLE)
            .map(|c| char::from_u32(c).and_then(|c| model.id(c.encode_utf8(&mut [0; 4]))))
            .collect();
        Ok(model)
    }

    /// Makes `merges` (`(left, right, merged)` ids, rank order) the model's merges; a pair
    /// listed twice keeps its later rank.
    fn set_merges(&mut self, merges: &[(u32, u32, u32)]) {
        self.merges.clear();
        self.merges.reserve(merges.len());
        for (rank, &(left, right, merged)) in merges.iter().enumerate() {
            self.merges.insert((left, right), (rank as u32, merged));
        }
    }

    /// Tokens in the vocabulary (ids `0..len`).
    fn len(&self) -> usize {
        self.starts.len() - 1
    }

    /// The text of token `id` as stored (`None` past the vocabulary).
    fn text_of(&self, id: u32) -> Option<&str> {
        let id = id as usize;
        let (start, end) = (*self.starts.get(id)?, *self.starts.get(id + 1)?);
        Some(&self.text[start as usize..end as usize])
    }

    /// Indexes token `id` by its text (replacing an earlier id of the same text).
    fn insert(&mut self, id: u32) {
        let Self {
            text,
            starts,
            index,
            hasher,
            ..
        } = self;
        let at = |i: u32| &text[starts[i as usize] as usize..starts[i as usize + 1] as usize];
        let key = at(id);
        let hash = hasher.hash_one(key);
        match index.find_mut(hash, |&i| at(i) == key) {
            Some(slot) => *slot = id,
            None => {
                index.insert_unique(hash, id, |&i| hasher.hash_one(at(i)));
            }
        }
    }

    /// The id of the token spelled `token`.
    pub fn id(&self, token: &str) -> Option<u32> {
        let hash = self.hasher.hash_one(token);
        self.index
            .find(hash, |&i| self.text_of(i) == Some(token))
            .copied()
    }

    /// The id of the one-character token `c` (a pre-token's character, `c` its text).
    fn char_id(&self, c: &str) -> Option<u32> {
        let code = c.chars().next()? as usize;
        match self.chars.get(code) {
            Some(&id) => id,
            None => self.id(c),
        }
    }

    /// The text of token `id`, for ids the index finds (an id whose text a later id also
    /// spells has none, as in the crate's reversed vocabulary).
    pub fn token(&self, id: u32) -> Option<&str> {
        let text = self.text_of(id)?;
        (self.id(text) == Some(id)).then_some(text)
    }

    /// The ids the index finds, with their texts, in id order.
    fn entries(&self) -> impl Iterator<Item = (u32, &str)> + '_ {
        (0..self.len() as u32).filter_map(|id| self.token(id).map(|t| (id, t)))
    }

    /// Entries of [`Self::vocab`] (distinct texts), without making it.
    pub fn vocab_len(&self) -> usize {
        self.index.len()
    }

    /// The vocabulary as the crate's model has it (text -> id).
    pub fn vocab(&self) -> std::collections::HashMap<String, u32> {
        self.entries().map(|(id, t)| (t.to_owned(), id)).collect()
    }

    /// The tokens of one pre-token, with byte offsets into it.
    pub fn tokenize(&self, sequence: &str) -> Vec<Token> {
        if sequence.is_empty() {
            return Vec::new();
        }
        if self.ignore_merges {
            if let Some(id) = self.id(sequence) {
                return vec![Token::new(id, sequence.to_owned(), (0, sequence.len()))];
            }
        }
        SCRATCH.with_borrow_mut(|word| {
            self.fill(word, sequence);
            word.merge_all(&self.merges);
            let mut at = 0;
            let tokens = word
                .symbols
                .iter()
                .filter(|s| s.len != 0)
                .map(|s| {
                    let offsets = (at, at + s.len);
                    at += s.len;
                    let text = self.text_of(s.id).unwrap_or_default();
                    Token::new(s.id, text.to_owned(), offsets)
                })
                .collect();
            word.trim();
            tokens
        })
    }

    /// Starts `word` over with the symbols of `sequence`'s characters: each its own token, else
    /// its byte tokens, else the unknown token (one per character, added when the next
    /// character's own token is, as the crate does), else nothing.
    fn fill(&self, word: &mut Word, sequence: &str) {
        word.symbols.clear();
        let mut unknown: Option<(u32, usize)> = None;
        for (i, c) in sequence.char_indices() {
            let len = c.len_utf8();
            if let Some(id) = self.char_id(&sequence[i..i + len]) {
                if let Some((unk, unk_len)) = unknown.take() {
                    word.push(unk, unk_len);
                }
                word.push(id, len);
                continue;
            }
            if !self.byte_tokens.is_empty() {
                let bytes = &sequence.as_bytes()[i..i + len];
                if bytes
                    .iter()
                    .all(|&b| self.byte_tokens[b as usize].is_some())
                {
                    for &b in bytes {
                        word.push(self.byte_tokens[b as usize].unwrap_or_default(), 1);
                    }
                    continue;
                }
            }
            if let Some(unk) = self.unk {
                if let Some((unk, unk_len)) = unknown.replace((unk, len)) {
                    word.push(unk, unk_len);
                }
            }
        }
        if let Some((unk, unk_len)) = unknown {
            word.push(unk, unk_len);
        }
    }

    /// The same model as the crate builds it (for serializing: the pipeline's JSON is the
    /// crate's `BPE` with this vocabulary and these merges in rank order).
    pub fn to_crate_bpe(&self) -> tokenizers::Result<BPE> {
        let mut merges: Vec<_> = self.merges.iter().collect();
        merges.sort_by_key(|(_, &(rank, _))| rank);
        let text = |id: u32| self.text_of(id).unwrap_or_default().to_owned();
        let merges = merges
            .into_iter()
            .map(|(&(a, b), _)| (text(a), text(b)))
            .collect();
        let mut builder = BPE::builder()
            .vocab_and_merges(self.vocab().into_iter().collect::<Vocab>(), merges)
            .ignore_merges(self.ignore_merges)
            .byte_fallback(!self.byte_tokens.is_empty());
        if let Some(unk) = self.unk.and_then(|u| self.text_of(u)) {
            builder = builder.unk_token(unk.to_owned());
        }
        builder.build()
    }
}

/// Symbols a thread's [`Word`] keeps room for between pre-tokens: a SentencePiece run is a
/// whole text between special tokens, and a long prompt's should not stay allocated.
const KEPT_SYMBOLS: usize = 1 << 10;

thread_local! {
    /// Each thread's [`Word`], reused from one pre-token to the next (trimmed to
    /// [`KEPT_SYMBOLS`] after each).
    static SCRATCH: RefCell<Word> = const {
        RefCell::new(Word {
            symbols: Vec::new(),
            queue: BinaryHeap::new(),
        })
    };
}

/// One pre-token's symbols while merging (a doubly linked list over a vector, merged-away
/// symbols left in place with length 0) and the queue of candidate merges.
struct Word {
    symbols: Vec<Symbol>,
    /// `(rank, position of the left symbol, merged id)`, smallest first.
    queue: BinaryHeap<Reverse<(u32, usize, u32)>>,
}

#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    /// Bytes of the pre-token it covers (0: merged into its left neighbour).
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl Word {
    /// Gives back the room of a long pre-token ([`KEPT_SYMBOLS`] stays).
    fn trim(&mut self) {
        if self.symbols.capacity() > KEPT_SYMBOLS {
            self.symbols = Vec::with_capacity(KEPT_SYMBOLS);
        }
        if self.queue.capacity() > KEPT_SYMBOLS {
            self.queue = BinaryHeap::with_capacity(KEPT_SYMBOLS);
        }
    }

    /// Appends a symbol of token `id` covering `len` bytes.
    fn push(&mut self, id: u32, len: usize) {
        let at = self.symbols.len();
        let prev = at.checked_sub(1);
        if let Some(p) = prev {
            self.symbols[p].next = Some(at);
        }
        self.symbols.push(Symbol {
            id,
            len,
            prev,
            next: None,
        });
    }

    /// Merges the lowest-ranked adjacent pair (leftmost on ties) until none has a merge.
    fn merge_all(&mut self, merges: &HashMap<(u32, u32), (u32, u32)>) {
        let queue = &mut self.queue;
        queue.clear();
        queue.extend(self.symbols.windows(2).enumerate().filter_map(|(pos, w)| {
            let &(rank, merged) = merges.get(&(w[0].id, w[1].id))?;
            Some(Reverse((rank, pos, merged)))
        }));
        while let Some(Reverse((_, pos, merged))) = queue.pop() {
            let left = self.symbols[pos];
            let Some(next) = left.next.filter(|_| left.len != 0) else {
                continue;
            };
            let right = self.symbols[next];
            // An entry made before one of the two symbols changed.
            if merges.get(&(left.id, right.id)).map(|m| m.1) != Some(merged) {
                continue;
            }
            self.symbols[pos].id = merged;
            self.symbols[pos].len += right.len;
            self.symbols[pos].next = right.next;
            self.symbols[next].len = 0;
            if let Some(after) = right.next {
                self.symbols[after].prev = Some(pos);
            }
            let current = self.symbols[pos];
            if let Some(prev) = current.prev {
                if let Some(&(rank, merged)) = merges.get(&(self.symbols[prev].id, current.id)) {
                    queue.push(Reverse((rank, prev, merged)));
                }
            }
            if let Some(after) = current.next {
                if let Some(&(rank, merged)) = merges.get(&(current.id, self.symbols[after].id)) {
                    queue.push(Reverse((rank, pos, merged)));
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "compact_bpe_tests.rs"]
mod tests;
