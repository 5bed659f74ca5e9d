//! [`TokenCache`]: what an identity source answered about a token, for a while, keyed by the
//! token's SHA-256 so that the cache (a core dump, a debugger) never holds a token in clear.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// The SHA-256 of a token: the only form in which a token is kept.
pub type TokenDigest = [u8; 32];

/// The digest a token is cached under.
pub fn token_digest(token: &str) -> TokenDigest {
    Sha256::digest(token.as_bytes()).into()
}

/// Answers (a user, or a refusal) per token digest, each until its own deadline, at most
/// `capacity` of them: when full, the expired go first, then the oldest.
#[derive(Debug)]
pub struct TokenCache<V> {
    entries: HashMap<TokenDigest, Entry<V>>,
    capacity: usize,
    /// Insertion order (a counter, not a clock: two insertions never tie).
    next_seq: u64,
}

#[derive(Debug)]
struct Entry<V> {
    value: V,
    seq: u64,
    until: Instant,
}

impl<V: Clone> TokenCache<V> {
    /// An empty cache of at most `capacity` answers (at least one).
    pub fn new(capacity: usize) -> Self {
        Self { entries: HashMap::new(), capacity: capacity.max(1), next_seq: 0 }
    }

    /// The answer cached for `token`, unless it has expired.
    pub fn get(&mut self, token: &str) -> Option<V> {
        let key = token_digest(token);
        let now = Instant::now();
        match self.entries.get(&key) {
            Some(entry) if entry.until > now => Some(entry.value.clone()),
            Some(_) => {
                self.entries.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Caches `value` for `token` for `ttl`.
    pub fn insert(&mut self, token: &str, value: V, ttl: Duration) {
        let key = token_digest(token);
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            self.make_room();
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.insert(key, Entry { value, seq, until: Instant::now() + ttl });
    }

    /// The number of answers held (expired ones included until they are dropped).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no answer is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether any key held is `token` itself rather than its digest (for tests of the promise).
    #[cfg(test)]
    pub fn holds_in_clear(&self, token: &str) -> bool {
        self.entries.keys().any(|k| k.as_slice() == token.as_bytes())
    }

    /// Drops the expired answers, or else the oldest one. A linear scan: it runs only when the
    /// cache is full, and a few thousand entries are scanned in microseconds.
    fn make_room(&mut self) {
        let now = Instant::now();
        self.entries.retain(|_, e| e.until > now);
        if self.entries.len() < self.capacity {
            return;
        }
        let oldest = self.entries.iter().min_by_key(|(_, e)| e.seq).map(|(k, _)| *k);
        if let Some(oldest) = oldest {
            self.entries.remove(&oldest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(3600);

    #[test]
    fn an_answer_is_returned_until_it_expires() {
        let mut cache = TokenCache::new(8);
        cache.insert("tok-a", "alice", LONG);
        cache.insert("tok-b", "bob", Duration::ZERO);
        assert_eq!(cache.get("tok-a"), Some("alice"));
        assert_eq!(cache.get("tok-b"), None, "a zero lifetime is already over");
        assert_eq!(cache.get("tok-c"), None);
    }

    #[test]
    fn the_token_is_kept_only_as_its_digest() {
        let mut cache = TokenCache::new(8);
        let token = "0123456789abcdef0123456789abcdef"; // 32 bytes, the length of a digest
        cache.insert(token, "alice", LONG);
        assert!(!cache.holds_in_clear(token));
        assert_eq!(cache.get(token), Some("alice"));
        assert_eq!(
            hex::encode(token_digest("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_full_cache_drops_the_oldest_answer() {
        let mut cache = TokenCache::new(2);
        cache.insert("first", 1, LONG);
        cache.insert("second", 2, LONG);
        cache.insert("third", 3, LONG);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get("first"), None);
        assert_eq!(cache.get("second"), Some(2));
        assert_eq!(cache.get("third"), Some(3));
    }

    #[test]
    fn a_full_cache_drops_expired_answers_before_live_ones() {
        let mut cache = TokenCache::new(2);
        cache.insert("live", 1, LONG);
        cache.insert("expired", 2, Duration::ZERO);
        cache.insert("new", 3, LONG);
        assert_eq!(cache.get("live"), Some(1));
        assert_eq!(cache.get("new"), Some(3));
    }
}
