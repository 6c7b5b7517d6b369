//! Prefix caching: requests whose prompts start with the same tokens (the turns of a chat, a
//! shared system prompt, an agent's tool list) reuse the KV state of those positions instead
//! of prefilling them again.
//!
//! A prompt is cut into blocks of `block_tokens` tokens; block `i` is keyed by a hash chained
//! over the token ids of blocks `0..=i`, so one key names a whole prefix. [`PrefixCache`] maps
//! keys to copies of the blocks' KV state (the model's [`LanguageModel::Block`]) and checks
//! each hit against the block's own tokens and its parent's key, so a hash collision cannot
//! change a result. A sequence's prompt blocks are copied in once its prefill completes
//! ([`PrefixCache::remember`]); a new sequence starts from the longest cached run of whole
//! blocks of its prompt that [`reuse_len`] allows ([`PrefixCache::restore`]), at most all but
//! the prompt's last token (whose logits the first sample needs).
//!
//! Reuse does not change a result: a cached position is what a prefill of the same prompt
//! computes, bit for bit, on kernels that compute long chunks alike. Measured on SmolLM2 on the CPU, prompt chunks from 24 rows up give
//! bit-identical logits whatever their length, while shorter chunks and positions decoded one by
//! one differ in the last bits (which the int8 activations turn into steps). So only prefilled
//! positions are cached, never those of sampled tokens (the next turn of a chat still reuses
//! its whole previous prompt, which holds the earlier replies), and only those computed in
//! chunks of [`EXACT_CHUNK_ROWS`] rows or more; prompt chunks end on multiples of
//! `prefill_chunk` (the scheduler), and [`reuse_len`] keeps a restored prompt's first chunk long,
//! or the very chunk an uncached prefill makes.
//!
//! Memory: blocks are copies, so the cache holds at most the KV positions the running
//! sequences leave of the model's KV budget (`max_batch x max_context` positions, what the
//! offload plan reserved), less each running sequence's most it may grow to
//! ([`LanguageModel::kv_reserve`] of its prompt plus `max_tokens`), and at most `max_tokens`
//! of [`PrefixCacheOptions`]. The serving loop shrinks the cache to that room before every
//! step ([`PrefixCache::shrink_to`]), so a cached prefix never takes memory a running request
//! may need. Eviction is least recently used first; a block is used (looked up or inserted)
//! together with every block before it, and among blocks used together the deepest goes first,
//! so a prefix never loses a block while keeping a later one.

use std::cmp::Reverse;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeSet, HashMap};
use std::hash::{Hash, Hasher};

use super::traits::LanguageModel;

/// Default [`PrefixCacheOptions::block_tokens`].
pub const DEFAULT_BLOCK_TOKENS: usize = 16;

/// Prompt chunks of at least this many rows compute every position bit for bit alike, however
/// long the chunk (candle's CPU matmul of the attention probabilities by the values takes
/// another path below about 72 rows of query heads; measured on SmolLM2, 3 query heads per KV
/// head, from 24 tokens up). Shorter chunks are exact only where an uncached prefill makes the
/// same chunk.
pub const EXACT_CHUNK_ROWS: usize = 64;

/// Where a prompt of `len` tokens whose first `hit` tokens are cached (whole blocks of `block`)
/// starts computing, so that every position it computes is what a prefill of the whole prompt
/// in chunks ending on multiples of `chunk` computes: either the position's chunk is long
/// ([`EXACT_CHUNK_ROWS`]) in both, or it is the same chunk. The first chunk then runs from
/// the result to the next multiple of `chunk` (or the end): it must be long, or start on that
/// grid; if it is the prompt's last, the uncached prefill's last chunk must be long too. Long is
/// `long_rows` rows ([`PrefixCacheOptions::exact_chunk_rows`]).
pub fn reuse_len(hit: usize, len: usize, chunk: usize, block: usize, long_rows: usize) -> usize {
    let (chunk, block) = (chunk.max(1), block.max(1));
    let hit = hit.min(len.saturating_sub(1)) / block * block;
    let start = hit / chunk * chunk;
    if hit == start {
        return hit;
    }
    let end = (start + chunk).min(len);
    let on_grid = start / block * block;
    if end - start < long_rows {
        // The uncached prefill's chunk here is short: only the same chunk is exact.
        return on_grid;
    }
    let long = end.saturating_sub(long_rows) / block * block;
    hit.min(long).max(on_grid)
}

/// How a model's serving loop caches prompt prefixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixCacheOptions {
    /// Whether prefixes are cached at all. Default true.
    pub enabled: bool,
    /// Most tokens the cache holds; `None` = as many as the KV budget leaves room for (the
    /// room bounds it either way). Default `None`.
    pub max_tokens: Option<usize>,
    /// Tokens per block, the unit of hashing, reuse and eviction. Default
    /// [`DEFAULT_BLOCK_TOKENS`].
    pub block_tokens: usize,
    /// Prompt chunks at least this long compute alike whatever their length
    /// ([`EXACT_CHUNK_ROWS`], the default); only positions computed so are cached, and a
    /// restored prompt's first chunk is kept this long ([`reuse_len`]).
    pub exact_chunk_rows: usize,
}

impl Default for PrefixCacheOptions {
    fn default() -> Self {
        Self {
            enabled: true,
            max_tokens: None,
            block_tokens: DEFAULT_BLOCK_TOKENS,
            exact_chunk_rows: EXACT_CHUNK_ROWS,
        }
    }
}

/// The chained keys of the whole blocks of `tokens` in `partition`: key `i` hashes key `i - 1`
/// (the partition for the first block) and the ids of block `i`, so it stands for the prefix
/// `tokens[..(i + 1) * block]` of that partition alone. `None` is the shared partition.
pub fn block_keys(partition: Option<u64>, tokens: &[u32], block: usize) -> Vec<u64> {
    let mut keys = Vec::with_capacity(tokens.len() / block.max(1));
    let mut parent: Option<u64> = partition;
    for chunk in tokens.chunks_exact(block.max(1)) {
        // SipHash with fixed keys: the same ids give the same key for the life of the process.
        let mut hasher = DefaultHasher::new();
        parent.hash(&mut hasher);
        chunk.hash(&mut hasher);
        let key = hasher.finish();
        keys.push(key);
        parent = Some(key);
    }
    keys
}

/// One cached block.
struct Entry<B> {
    /// The previous block's key; for a prompt's first block its partition (`None`: shared).
    parent: Option<u64>,
    /// The block's own token ids.
    tokens: Box<[u32]>,
    /// Its index in the prompt (0 for the first block).
    depth: usize,
    /// When it was last used (a tick of [`PrefixCache`]'s clock).
    stamp: u64,
    /// The model's copy of its KV state.
    data: B,
}

/// Cached prompt blocks of one model, by chained key, with least-recently-used eviction.
pub struct PrefixCache<B> {
    block: usize,
    /// [`PrefixCacheOptions::exact_chunk_rows`].
    long_rows: usize,
    /// Most tokens held whatever the room ([`PrefixCacheOptions::max_tokens`]).
    limit: usize,
    entries: HashMap<u64, Entry<B>>,
    /// Eviction order: oldest use first, and among blocks used together the deepest first.
    order: BTreeSet<(u64, Reverse<usize>, u64)>,
    clock: u64,
}

impl<B> PrefixCache<B> {
    /// An empty cache of blocks of `block_tokens` tokens (at least 1), holding at most
    /// `max_tokens` tokens when set.
    pub fn new(block_tokens: usize, max_tokens: Option<usize>) -> Self {
        Self {
            block: block_tokens.max(1),
            long_rows: EXACT_CHUNK_ROWS,
            limit: max_tokens.unwrap_or(usize::MAX),
            entries: HashMap::new(),
            order: BTreeSet::new(),
            clock: 0,
        }
    }

    /// The cache `options` ask for, if any.
    pub fn from_options(options: &PrefixCacheOptions) -> Option<Self> {
        options.enabled.then(|| Self {
            long_rows: options.exact_chunk_rows,
            ..Self::new(options.block_tokens, options.max_tokens)
        })
    }

    /// Tokens per block.
    pub fn block_tokens(&self) -> usize {
        self.block
    }

    /// Rows from which a prompt chunk computes alike whatever its length
    /// ([`PrefixCacheOptions::exact_chunk_rows`]).
    pub fn exact_chunk_rows(&self) -> usize {
        self.long_rows
    }

    /// Tokens held (whole blocks).
    pub fn tokens_held(&self) -> usize {
        self.entries.len() * self.block
    }

    /// The keys of the longest run of cached blocks `tokens` starts with in `partition`, at
    /// most `max_tokens` tokens of it.
    fn matching(&self, partition: Option<u64>, tokens: &[u32], max_tokens: usize) -> Vec<u64> {
        let usable = &tokens[..max_tokens.min(tokens.len())];
        let mut matched = Vec::new();
        let mut parent = partition;
        for (key, chunk) in block_keys(partition, usable, self.block)
            .into_iter()
            .zip(usable.chunks_exact(self.block))
        {
            match self.entries.get(&key) {
                Some(e) if e.parent == parent && *e.tokens == *chunk => matched.push(key),
                _ => break,
            }
            parent = Some(key);
        }
        matched
    }

    /// Marks the blocks `keys` as used now (one tick for all of them).
    fn touch(&mut self, keys: &[u64]) -> u64 {
        self.clock += 1;
        let now = self.clock;
        for key in keys {
            if let Some(e) = self.entries.get_mut(key) {
                self.order.remove(&(e.stamp, Reverse(e.depth), *key));
                e.stamp = now;
                self.order.insert((now, Reverse(e.depth), *key));
            }
        }
        now
    }

    /// The longest run of cached whole blocks that `tokens` starts with in `partition`, at most
    /// `max_tokens` tokens of it, in order; marks them used.
    pub fn lookup(&mut self, partition: Option<u64>, tokens: &[u32], max_tokens: usize) -> Vec<&B> {
        let keys = self.matching(partition, tokens, max_tokens);
        self.touch(&keys);
        keys.iter().map(|key| &self.entries[key].data).collect()
    }

    /// Caches the whole blocks of `tokens` that `partition` does not hold yet, in order, each made by
    /// `copy(start, len)`, while the cache holds at most `room` tokens (and its own limit):
    /// least recently used blocks are evicted for them, never blocks of this prefix. Stops at
    /// the first block `copy` declines (`None`). Returns the tokens added.
    pub fn insert(
        &mut self,
        partition: Option<u64>,
        tokens: &[u32],
        room: usize,
        mut copy: impl FnMut(usize, usize) -> Option<B>,
    ) -> usize {
        let cap = room.min(self.limit);
        let present = self.matching(partition, tokens, tokens.len());
        let now = self.touch(&present);
        let keys = block_keys(partition, tokens, self.block);
        let mut parent = present.last().copied().or(partition);
        let mut added = 0;
        for (depth, &key) in keys.iter().enumerate().skip(present.len()) {
            if self.entries.contains_key(&key) {
                // A colliding key holds another prefix's block: keep it, stop here.
                break;
            }
            while self.tokens_held() + self.block > cap {
                if !self.evict_older_than(now) {
                    return added;
                }
            }
            let start = depth * self.block;
            let Some(data) = copy(start, self.block) else {
                return added;
            };
            self.entries.insert(
                key,
                Entry {
                    parent,
                    tokens: tokens[start..start + self.block].into(),
                    depth,
                    stamp: now,
                    data,
                },
            );
            self.order.insert((now, Reverse(depth), key));
            parent = Some(key);
            added += self.block;
        }
        added
    }

    /// Evicts least recently used blocks until at most `room` tokens (and the limit) are held.
    /// Returns the tokens evicted.
    pub fn shrink_to(&mut self, room: usize) -> usize {
        let cap = room.min(self.limit);
        let mut evicted = 0;
        while self.tokens_held() > cap && self.evict_older_than(u64::MAX) {
            evicted += self.block;
        }
        evicted
    }

    /// Evicts the least recently used block if it was last used before `now`.
    fn evict_older_than(&mut self, now: u64) -> bool {
        match self.order.first().copied() {
            Some(first @ (stamp, _, key)) if stamp < now => {
                self.order.remove(&first);
                self.entries.remove(&key);
                true
            }
            _ => false,
        }
    }

    /// Starts the empty sequence `seq` from the longest cached run of whole blocks of `prompt`
    /// in `partition` that leaves the rest to compute exactly as an uncached prefill in chunks of `chunk` would
    /// ([`reuse_len`]; at least the last token is left). Returns the positions restored (0 when
    /// nothing matched or the model could not take them, leaving `seq` empty).
    pub fn restore<M>(
        &mut self,
        model: &M,
        seq: &mut M::Sequence,
        (partition, prompt): (Option<u64>, &[u32]),
        chunk: usize,
    ) -> usize
    where
        M: LanguageModel<Block = B>,
    {
        let block = self.block;
        let hit = self
            .matching(partition, prompt, prompt.len().saturating_sub(1))
            .len()
            * block;
        let reuse = reuse_len(hit, prompt.len(), chunk, block, self.long_rows);
        let mut blocks = self.lookup(partition, prompt, reuse);
        blocks.truncate(reuse / block);
        if blocks.is_empty() {
            return 0;
        }
        let restored = blocks.len() * block;
        match model.extend_sequence(seq, &blocks) {
            Ok(()) => restored,
            Err(err) => {
                tracing::debug!(error = %err, "cannot start a sequence from cached blocks");
                0
            }
        }
    }

    /// Copies the whole blocks of `prompt` that `seq` (whose prefill of `prompt` just completed)
    /// holds and `partition` lacks into the cache, within `room` tokens. Returns the tokens
    /// added.
    pub fn remember<M>(
        &mut self,
        model: &M,
        seq: &M::Sequence,
        (partition, prompt): (Option<u64>, &[u32]),
        room: usize,
    ) -> usize
    where
        M: LanguageModel<Block = B>,
    {
        self.insert(partition, prompt, room, |start, len| {
            match model.copy_block(seq, start, len) {
                Ok(block) => block,
                Err(err) => {
                    tracing::debug!(error = %err, "cannot copy a prompt block into the prefix cache");
                    None
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache of 4-token blocks whose data is the block's start position.
    fn cache(limit: Option<usize>) -> PrefixCache<usize> {
        PrefixCache::new(4, limit)
    }

    fn insert(c: &mut PrefixCache<usize>, tokens: &[u32], room: usize) -> usize {
        c.insert(None, tokens, room, |start, _| Some(start))
    }

    #[test]
    fn keys_chain_over_whole_blocks() {
        let a = block_keys(None, &[1, 2, 3, 4, 5, 6, 7, 8, 9], 4);
        assert_eq!(a.len(), 2, "the partial block has no key");
        let b = block_keys(None, &[1, 2, 3, 4, 5, 6, 7, 8], 4);
        assert_eq!(a, b);
        // The same second block after another first block is another key.
        let c = block_keys(None, &[0, 2, 3, 4, 5, 6, 7, 8], 4);
        assert_ne!(a[0], c[0]);
        assert_ne!(a[1], c[1]);
        // A block's key depends on its position in the chain, not only on its tokens.
        let d = block_keys(None, &[5, 6, 7, 8], 4);
        assert_ne!(d[0], a[1]);
    }

    #[test]
    fn lookup_finds_the_longest_cached_prefix_in_whole_blocks() {
        let mut c = cache(None);
        let prompt: Vec<u32> = (0..14).collect();
        assert_eq!(insert(&mut c, &prompt, usize::MAX), 12);
        assert_eq!(c.tokens_held(), 12);
        assert_eq!(c.lookup(None, &prompt, 13), [&0, &4, &8]);
        assert_eq!(c.lookup(None, &prompt, 11), [&0, &4], "at most 11 tokens");
        // A prompt that leaves the cached one in its third block reuses two blocks.
        let mut other = prompt.clone();
        other[9] = 99;
        assert_eq!(c.lookup(None, &other, 14), [&0, &4]);
        other[0] = 99;
        assert!(c.lookup(None, &other, 14).is_empty());
        // Inserting a longer prompt adds only its new blocks.
        let longer: Vec<u32> = (0..20).collect();
        let mut copied = Vec::new();
        c.insert(None, &longer, usize::MAX, |start, len| {
            copied.push((start, len));
            Some(start)
        });
        assert_eq!(copied, [(12, 4), (16, 4)]);
        assert_eq!(c.lookup(None, &longer, 20), [&0, &4, &8, &12, &16]);
    }

    #[test]
    fn partitions_never_see_each_others_blocks() {
        let mut c = cache(None);
        let prompt: Vec<u32> = (0..9).collect();
        assert_eq!(c.insert(Some(7), &prompt, usize::MAX, |s, _| Some(s)), 8);
        assert!(c.lookup(None, &prompt, 9).is_empty(), "shared");
        assert!(
            c.lookup(Some(8), &prompt, 9).is_empty(),
            "another partition"
        );
        assert_eq!(c.lookup(Some(7), &prompt, 9), [&0, &4]);
        // The same prompt in the shared partition is cached again, as its own blocks.
        assert_eq!(insert(&mut c, &prompt, usize::MAX), 8);
        assert_eq!(c.tokens_held(), 16);
        assert_ne!(
            block_keys(Some(7), &prompt, 4),
            block_keys(None, &prompt, 4)
        );
        // A first block planted under the shared key with the partition's parent is refused.
        let shared = block_keys(None, &prompt, 4)[0];
        c.entries.get_mut(&shared).unwrap().parent = Some(7);
        assert!(c.lookup(None, &prompt, 9).is_empty());
    }

    #[test]
    fn a_block_must_match_its_tokens_and_its_parent() {
        let mut c = cache(None);
        insert(&mut c, &[1, 2, 3, 4, 5, 6, 7, 8], usize::MAX);
        // Plant a block under the key of another prefix's second block: its tokens differ.
        let keys = block_keys(None, &[1, 2, 3, 4, 9, 9, 9, 9], 4);
        let stray = c
            .entries
            .remove(&block_keys(None, &[1, 2, 3, 4, 5, 6, 7, 8], 4)[1]);
        let mut stray = stray.unwrap();
        stray.stamp = 0;
        c.entries.insert(keys[1], stray);
        assert_eq!(c.lookup(None, &[1, 2, 3, 4, 9, 9, 9, 9, 0], 9), [&0]);
    }

    #[test]
    fn eviction_takes_the_least_recently_used_and_the_deepest_first() {
        let mut c = cache(Some(16));
        let a: Vec<u32> = (0..8).collect();
        let b: Vec<u32> = (100..108).collect();
        insert(&mut c, &a, usize::MAX);
        insert(&mut c, &b, usize::MAX);
        assert_eq!(c.tokens_held(), 16);
        // `a` is used again, so `b` is the older one; a third prompt evicts b's blocks,
        // its second block first.
        c.lookup(None, &a, 8);
        let d: Vec<u32> = (200..204).collect();
        assert_eq!(insert(&mut c, &d, usize::MAX), 4, "the limit is 16 tokens");
        assert_eq!(c.lookup(None, &b, 8), [&0], "b's first block is left");
        assert_eq!(c.lookup(None, &a, 8).len(), 2);
        assert_eq!(c.shrink_to(8), 8);
        assert_eq!(c.tokens_held(), 8);
        assert_eq!(
            c.lookup(None, &a, 8).len(),
            2,
            "the most recently used stay"
        );
        assert_eq!(c.shrink_to(0), 8);
        assert!(c.lookup(None, &a, 8).is_empty());
    }

    #[test]
    fn insertion_stays_within_the_room_and_never_evicts_its_own_prefix() {
        let mut c = cache(None);
        let long: Vec<u32> = (0..40).collect();
        assert_eq!(insert(&mut c, &long, 12), 12, "three blocks fit the room");
        assert_eq!(c.lookup(None, &long, 40).len(), 3);
        // Another prompt in a room of 8: it evicts the older prompt's blocks, deepest first.
        let other: Vec<u32> = (500..512).collect();
        assert_eq!(insert(&mut c, &other, 8), 8);
        assert_eq!(c.tokens_held(), 8);
        assert_eq!(c.lookup(None, &other, 12).len(), 2);
        assert!(c.lookup(None, &long, 40).is_empty());
        // A room of zero adds nothing.
        assert_eq!(insert(&mut c, &long, 0), 0);
        // A copy that declines stops the insertion.
        let mut calls = 0;
        let added = c.insert(None, &long, usize::MAX, |start, _| {
            calls += 1;
            (start < 8).then_some(start)
        });
        assert_eq!((added, calls), (8, 3));
    }

    #[test]
    fn reuse_leaves_a_long_first_chunk_or_the_uncached_one() {
        const C: usize = 512;
        const B: usize = 16;
        // A second chat turn: 992 of 1033 tokens cached; the rest from 960 is a long chunk.
        assert_eq!(reuse_len(992, 1033, C, B, EXACT_CHUNK_ROWS), 960);
        // The whole prompt is cached: at least its last token is computed, in a long chunk.
        assert_eq!(reuse_len(2000, 1000, C, B, EXACT_CHUNK_ROWS), 928);
        // A hit on the chunk grid keeps the uncached chunks as they are.
        assert_eq!(reuse_len(512, 530, C, B, EXACT_CHUNK_ROWS), 512);
        assert_eq!(reuse_len(1024, 3000, C, B, EXACT_CHUNK_ROWS), 1024);
        // Inside a chunk whose uncached prefill is short (512..530): back to its start.
        assert_eq!(reuse_len(528, 530, C, B, EXACT_CHUNK_ROWS), 512);
        // Inside a full chunk: the rest of it must be long.
        assert_eq!(reuse_len(496, 3000, C, B, EXACT_CHUNK_ROWS), 448);
        assert_eq!(reuse_len(304, 3000, C, B, EXACT_CHUNK_ROWS), 304);
        // Nothing long enough before the grid: start on it.
        assert_eq!(reuse_len(48, 60, C, B, EXACT_CHUNK_ROWS), 0);
        assert_eq!(reuse_len(0, 60, C, B, EXACT_CHUNK_ROWS), 0);
        // Whole blocks only, and never past the prompt's last token.
        assert_eq!(reuse_len(100, 101, 64, B, EXACT_CHUNK_ROWS), 64);
        for len in 1..700 {
            for hit in (0..=len).step_by(16) {
                let k = reuse_len(hit, len, C, B, EXACT_CHUNK_ROWS);
                assert!(
                    k <= hit && k < len && k.is_multiple_of(B),
                    "{hit} {len} -> {k}"
                );
                let end = (k / C * C + C).min(len);
                let uncached_last = len - (len - 1) / C * C;
                assert!(
                    k.is_multiple_of(C)
                        || (end - k >= EXACT_CHUNK_ROWS
                            && (end < len || uncached_last >= EXACT_CHUNK_ROWS)),
                    "{hit} {len} -> {k}"
                );
            }
        }
    }

    #[test]
    fn options_turn_it_off() {
        let off = PrefixCacheOptions {
            enabled: false,
            ..PrefixCacheOptions::default()
        };
        assert!(PrefixCache::<()>::from_options(&off).is_none());
        let on = PrefixCache::<()>::from_options(&PrefixCacheOptions::default()).unwrap();
        assert_eq!(on.block_tokens(), DEFAULT_BLOCK_TOKENS);
    }
}
