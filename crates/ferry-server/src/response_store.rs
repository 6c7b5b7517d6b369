//! [`ResponseStore`]: the Responses API's stored responses (`store: true`, the default), kept in
//! memory for `previous_response_id` and `GET /v1/responses/{id}`, bounded by count and by bytes
//! ([`StoreLimits`], [`ServerOptions::response_store`](crate::ServerOptions::response_store)).
//!
//! Each entry holds the response object as sent (its JSON text) and the conversation a
//! continuation starts from (every message before the response plus the response's own, without
//! `instructions`, which OpenAI does not carry over). A continuation's entry repeats its
//! ancestors' messages, so no entry depends on another still being stored. When an insert would
//! pass either bound, the least recently used entries go first (a lookup counts as a use); an
//! entry larger than the byte bound on its own is not stored. Nothing is written to disk: a
//! restart forgets every response.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use ferry_engine::ChatMessage;

/// Default [`StoreLimits::max_entries`].
pub const DEFAULT_STORED_RESPONSES: usize = 1024;

/// Default [`StoreLimits::max_bytes`]: 64 MiB.
pub const DEFAULT_STORED_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// Bytes counted for an entry besides its texts (its id twice, the maps' slots).
const ENTRY_OVERHEAD: usize = 128;

/// How much the store may keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLimits {
    /// Most responses kept. Default [`DEFAULT_STORED_RESPONSES`]; 0 stores nothing.
    pub max_entries: usize,
    /// Most bytes kept: the responses' JSON and their conversations' text. Default
    /// [`DEFAULT_STORED_RESPONSE_BYTES`].
    pub max_bytes: usize,
}

impl Default for StoreLimits {
    fn default() -> Self {
        Self {
            max_entries: DEFAULT_STORED_RESPONSES,
            max_bytes: DEFAULT_STORED_RESPONSE_BYTES,
        }
    }
}

/// One stored response.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredResponse {
    /// The response object's JSON, as `GET /v1/responses/{id}` answers it.
    pub json: String,
    /// The conversation up to and including this response (no `instructions`).
    pub conversation: Vec<ChatMessage>,
}

impl StoredResponse {
    /// The bytes this entry is counted as.
    fn bytes(&self, id: &str) -> usize {
        let messages: usize = self.conversation.iter().map(message_bytes).sum();
        ENTRY_OVERHEAD + 2 * id.len() + self.json.len() + messages
    }
}

fn message_bytes(m: &ChatMessage) -> usize {
    let calls: usize = m
        .tool_calls
        .iter()
        .flatten()
        .map(|c| c.to_string().len())
        .sum();
    64 + m.role.len()
        + m.content.len()
        + m.name.as_ref().map_or(0, String::len)
        + m.tool_call_id.as_ref().map_or(0, String::len)
        + m.reasoning_content.as_ref().map_or(0, String::len)
        + calls
}

#[derive(Debug, Default)]
struct Inner {
    /// id -> (last use, bytes, entry).
    entries: HashMap<String, (u64, usize, Arc<StoredResponse>)>,
    /// last use -> id, oldest first.
    order: BTreeMap<u64, String>,
    bytes: usize,
    clock: u64,
}

impl Inner {
    fn touch(&mut self, id: &str) -> Option<Arc<StoredResponse>> {
        self.clock += 1;
        let clock = self.clock;
        let (used, _, entry) = self.entries.get_mut(id)?;
        self.order.remove(used);
        *used = clock;
        self.order.insert(clock, id.to_owned());
        Some(Arc::clone(entry))
    }

    fn remove(&mut self, id: &str) -> bool {
        let Some((used, bytes, _)) = self.entries.remove(id) else {
            return false;
        };
        self.order.remove(&used);
        self.bytes -= bytes;
        true
    }
}

/// The bounded in-memory store; cheap to clone (one shared map behind a mutex, held only for
/// map operations, never across an await).
#[derive(Debug, Clone)]
pub struct ResponseStore {
    limits: StoreLimits,
    inner: Arc<Mutex<Inner>>,
}

impl ResponseStore {
    /// An empty store within `limits`.
    pub fn new(limits: StoreLimits) -> Self {
        Self {
            limits,
            inner: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the maps consistent (every update is a few
        // infallible map operations), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores `entry` under `id`, evicting the least recently used entries to stay within the
    /// limits; returns whether it was stored (not when it alone is over the byte bound).
    pub fn insert(&self, id: &str, entry: StoredResponse) -> bool {
        let bytes = entry.bytes(id);
        if bytes > self.limits.max_bytes || self.limits.max_entries == 0 {
            return false;
        }
        let mut inner = self.lock();
        inner.remove(id);
        while inner.entries.len() >= self.limits.max_entries
            || inner.bytes + bytes > self.limits.max_bytes
        {
            let Some((_, oldest)) = inner.order.pop_first() else {
                break;
            };
            if let Some((_, freed, _)) = inner.entries.remove(&oldest) {
                inner.bytes -= freed;
            }
        }
        inner.clock += 1;
        let clock = inner.clock;
        inner.order.insert(clock, id.to_owned());
        inner
            .entries
            .insert(id.to_owned(), (clock, bytes, Arc::new(entry)));
        inner.bytes += bytes;
        true
    }

    /// The entry stored under `id` (marked as just used), if any.
    pub fn get(&self, id: &str) -> Option<Arc<StoredResponse>> {
        self.lock().touch(id)
    }

    /// Forgets `id`; whether it was stored.
    pub fn remove(&self, id: &str) -> bool {
        self.lock().remove(id)
    }

    /// How many entries and bytes are stored now.
    pub fn usage(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.entries.len(), inner.bytes)
    }

    /// The limits it keeps to.
    pub fn limits(&self) -> StoreLimits {
        self.limits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(fill: char, len: usize) -> StoredResponse {
        StoredResponse {
            json: fill.to_string().repeat(len),
            conversation: vec![ChatMessage {
                role: "user".into(),
                content: fill.to_string().repeat(len),
                ..ChatMessage::default()
            }],
        }
    }

    #[test]
    fn many_large_responses_stay_within_the_bounds() {
        let limits = StoreLimits {
            max_entries: 50,
            max_bytes: 1024 * 1024,
        };
        let store = ResponseStore::new(limits);
        // 2,000 distinct responses of ~200 KB each: 400 MB offered, 1 MiB kept.
        for i in 0..2000 {
            let len = 90_000 + (i % 7) * 3_000;
            assert!(store.insert(&format!("resp_{i}"), entry('x', len)));
            let (entries, bytes) = store.usage();
            assert!(entries <= limits.max_entries, "{entries} entries");
            assert!(bytes <= limits.max_bytes, "{bytes} bytes");
        }
        let (entries, bytes) = store.usage();
        assert!(entries >= 4, "the bound keeps what fits: {entries}");
        // The counted bytes are the entries' own: recomputed, they agree.
        let inner = store.lock();
        let recount: usize = inner.entries.iter().map(|(id, e)| e.2.bytes(id)).sum();
        assert_eq!(recount, bytes);
        assert_eq!(inner.order.len(), entries);
        assert!(inner.entries.contains_key("resp_1999"));
        assert!(!inner.entries.contains_key("resp_0"));
    }

    #[test]
    fn entries_bound_and_least_recently_used_go_first() {
        let store = ResponseStore::new(StoreLimits {
            max_entries: 3,
            max_bytes: usize::MAX,
        });
        for id in ["a", "b", "c"] {
            store.insert(id, entry('y', 10));
        }
        // `a` is used, so `b` is the oldest when `d` comes.
        assert!(store.get("a").is_some());
        store.insert("d", entry('y', 10));
        assert!(store.get("b").is_none());
        for id in ["a", "c", "d"] {
            assert!(store.get(id).is_some(), "{id}");
        }
        assert_eq!(store.usage().0, 3);
        assert!(store.remove("c"));
        assert!(!store.remove("c"));
        assert_eq!(store.usage().0, 2);
    }

    #[test]
    fn an_entry_over_the_byte_bound_is_not_stored() {
        let store = ResponseStore::new(StoreLimits {
            max_entries: 10,
            max_bytes: 1000,
        });
        assert!(store.insert("small", entry('z', 100)));
        assert!(!store.insert("huge", entry('z', 5000)));
        assert!(store.get("huge").is_none());
        assert!(
            store.get("small").is_some(),
            "a refused entry evicts nothing"
        );
        // Replacing an id counts its bytes once.
        assert!(store.insert("small", entry('z', 100)));
        let once = store.usage().1;
        assert!(store.insert("small", entry('z', 100)));
        assert_eq!(store.usage(), (1, once));
        let none = ResponseStore::new(StoreLimits {
            max_entries: 0,
            max_bytes: 1000,
        });
        assert!(!none.insert("a", entry('z', 1)));
        assert_eq!(none.usage(), (0, 0));
    }
}
