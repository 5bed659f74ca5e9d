//! The key-value state: an ordered map plus leases. Deterministic: no clock, no I/O.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::command::{
    CasOutcome, Command, CommandOutput, CompareTarget, KeyValue, Txn, TxnOp, TxnOpResult, TxnResponse, WatchEvent,
    WatchEventKind,
};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    value: Vec<u8>,
    create_revision: u64,
    mod_revision: u64,
    lease: Option<u64>,
}

/// A lease as the state machine knows it (expiry is tracked by the leader, not here).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// Time to live in milliseconds.
    pub ttl_ms: u64,
    keys: BTreeSet<Vec<u8>>,
}

/// The replicated key-value state of one group.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvState {
    map: BTreeMap<Vec<u8>, Entry>,
    leases: BTreeMap<u64, Lease>,
    /// Revision of the last change.
    revision: u64,
}

impl KvState {
    /// Revision (log index) of the last change.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no key is stored.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The key's current record.
    pub fn get(&self, key: &[u8]) -> Option<KeyValue> {
        self.map.get(key).map(|e| to_kv(key, e))
    }

    /// Keys starting with `prefix`, in order, at most `limit` of them (0 = no limit).
    pub fn range(&self, prefix: &[u8], limit: usize) -> Vec<KeyValue> {
        let it = self.map.range(prefix.to_vec()..).take_while(|(k, _)| k.starts_with(prefix));
        let limit = if limit == 0 { usize::MAX } else { limit };
        it.take(limit).map(|(k, e)| to_kv(k, e)).collect()
    }

    /// Lease ids and their TTLs.
    pub fn leases(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.leases.iter().map(|(id, l)| (*id, l.ttl_ms))
    }

    /// Whether a lease exists.
    pub fn has_lease(&self, id: u64) -> bool {
        self.leases.contains_key(&id)
    }

    /// Applies one command at `revision` (its log index); pushes the resulting changes to `events`.
    pub fn apply(&mut self, revision: u64, cmd: Command, events: &mut Vec<WatchEvent>) -> CommandOutput {
        match cmd {
            Command::Put { key, value, lease } => {
                if let Some(id) = lease {
                    if !self.leases.contains_key(&id) {
                        return CommandOutput::LeaseNotFound(id);
                    }
                }
                self.put(revision, key, value, lease, events);
                CommandOutput::Put
            }
            Command::Delete { key } => CommandOutput::Delete { existed: self.delete(revision, &key, events) },
            Command::Cas { key, expected, value } => {
                let previous = self.map.get(&key).map(|e| e.value.clone());
                let succeeded = previous == expected;
                if succeeded {
                    let lease = self.map.get(&key).and_then(|e| e.lease);
                    self.put(revision, key, value, lease, events);
                }
                CommandOutput::Cas(CasOutcome { succeeded, previous })
            }
            Command::LeaseGrant { id, ttl_ms } => {
                self.leases.entry(id).or_default().ttl_ms = ttl_ms;
                CommandOutput::LeaseGranted
            }
            Command::LeaseRevoke { id } => match self.leases.remove(&id) {
                Some(lease) => {
                    for key in lease.keys {
                        self.delete(revision, &key, events);
                    }
                    CommandOutput::LeaseRevoked { existed: true }
                }
                None => CommandOutput::LeaseRevoked { existed: false },
            },
            Command::Txn(txn) => self.apply_txn(revision, txn, events),
        }
    }

    /// Evaluates the compares, then applies one branch in order. All or nothing: a put naming a
    /// lease that does not exist refuses the whole transaction before anything changes.
    fn apply_txn(&mut self, revision: u64, txn: Txn, events: &mut Vec<WatchEvent>) -> CommandOutput {
        let succeeded = txn.compares.iter().all(|c| {
            let current = self.map.get(&c.key);
            match &c.target {
                CompareTarget::ValueEquals(v) => current.is_some_and(|e| &e.value == v),
                CompareTarget::Absent => current.is_none(),
                CompareTarget::Present => current.is_some(),
            }
        });
        let ops = if succeeded { txn.success } else { txn.failure };
        for op in &ops {
            if let TxnOp::Put { lease: Some(id), .. } = op {
                if !self.leases.contains_key(id) {
                    return CommandOutput::LeaseNotFound(*id);
                }
            }
        }
        let mut results = Vec::with_capacity(ops.len());
        for op in ops {
            results.push(match op {
                TxnOp::Put { key, value, lease } => {
                    self.put(revision, key, value, lease, events);
                    TxnOpResult::Put
                }
                TxnOp::Delete { key } => TxnOpResult::Delete { existed: self.delete(revision, &key, events) },
                TxnOp::DeletePrefix { prefix } => {
                    let keys: Vec<Vec<u8>> = self
                        .map
                        .range(prefix.clone()..)
                        .take_while(|(k, _)| k.starts_with(&prefix))
                        .map(|(k, _)| k.clone())
                        .collect();
                    for key in &keys {
                        self.delete(revision, key, events);
                    }
                    TxnOpResult::DeletePrefix { deleted: keys.len() as u64 }
                }
            });
        }
        CommandOutput::Txn(TxnResponse { succeeded, results, revision })
    }

    fn put(&mut self, revision: u64, key: Vec<u8>, value: Vec<u8>, lease: Option<u64>, events: &mut Vec<WatchEvent>) {
        let old_lease = self.map.get(&key).and_then(|e| e.lease);
        if old_lease != lease {
            if let Some(old) = old_lease.and_then(|id| self.leases.get_mut(&id)) {
                old.keys.remove(&key);
            }
            if let Some(new) = lease.and_then(|id| self.leases.get_mut(&id)) {
                new.keys.insert(key.clone());
            }
        }
        let create_revision = self.map.get(&key).map_or(revision, |e| e.create_revision);
        events.push(WatchEvent { revision, kind: WatchEventKind::Put, key: key.clone(), value: Some(value.clone()) });
        self.map.insert(key, Entry { value, create_revision, mod_revision: revision, lease });
        self.revision = revision;
    }

    fn delete(&mut self, revision: u64, key: &[u8], events: &mut Vec<WatchEvent>) -> bool {
        let Some(old) = self.map.remove(key) else { return false };
        if let Some(lease) = old.lease.and_then(|id| self.leases.get_mut(&id)) {
            lease.keys.remove(key);
        }
        events.push(WatchEvent { revision, kind: WatchEventKind::Delete, key: key.to_vec(), value: None });
        self.revision = revision;
        true
    }

    /// Serialises the state (snapshot payload).
    pub fn to_bytes(&self) -> Result<Vec<u8>, postcard::Error> {
        postcard::to_stdvec(self)
    }

    /// Restores a state from [`KvState::to_bytes`] output; empty input is the empty state.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, postcard::Error> {
        if bytes.is_empty() {
            return Ok(KvState::default());
        }
        postcard::from_bytes(bytes)
    }
}

fn to_kv(key: &[u8], e: &Entry) -> KeyValue {
    KeyValue {
        key: key.to_vec(),
        value: e.value.clone(),
        create_revision: e.create_revision,
        mod_revision: e.mod_revision,
        lease: e.lease,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(k: &str, v: &str, lease: Option<u64>) -> Command {
        Command::Put { key: k.into(), value: v.into(), lease }
    }

    #[test]
    fn cas_compares_current_value() {
        let mut s = KvState::default();
        let mut ev = Vec::new();
        let out = s.apply(1, Command::Cas { key: "a".into(), expected: None, value: "1".into() }, &mut ev);
        assert_eq!(out, CommandOutput::Cas(CasOutcome { succeeded: true, previous: None }));
        let out = s.apply(2, Command::Cas { key: "a".into(), expected: Some("0".into()), value: "2".into() }, &mut ev);
        assert_eq!(out, CommandOutput::Cas(CasOutcome { succeeded: false, previous: Some("1".into()) }));
        assert_eq!(s.get(b"a").map(|kv| kv.value), Some(b"1".to_vec()));
        assert_eq!(ev.len(), 1, "a failed CAS changes nothing");
    }

    #[test]
    fn lease_revoke_deletes_attached_keys_only() {
        let mut s = KvState::default();
        let mut ev = Vec::new();
        assert_eq!(s.apply(1, put("x", "1", Some(7)), &mut ev), CommandOutput::LeaseNotFound(7));
        s.apply(2, Command::LeaseGrant { id: 7, ttl_ms: 1000 }, &mut ev);
        s.apply(3, put("x", "1", Some(7)), &mut ev);
        s.apply(4, put("y", "1", None), &mut ev);
        s.apply(5, Command::LeaseRevoke { id: 7 }, &mut ev);
        assert!(s.get(b"x").is_none());
        assert!(s.get(b"y").is_some());
        assert_eq!(ev.last().map(|e| (e.revision, e.kind)), Some((5, WatchEventKind::Delete)));
    }

    #[test]
    fn txn_applies_one_branch_atomically_at_one_revision() {
        let mut s = KvState::default();
        let mut ev = Vec::new();
        s.apply(1, put("ns/a", "1", None), &mut ev);
        s.apply(2, put("ns/b", "2", None), &mut ev);
        ev.clear();
        let txn = Txn::new()
            .when(super::super::Compare::value_equals("ns/a", "1"))
            .when(super::super::Compare::absent("cell"))
            .and_then(TxnOp::delete_prefix("ns/"))
            .and_then(TxnOp::put("ns/c", "3"))
            .and_then(TxnOp::put("cell", "7"))
            .and_then(TxnOp::delete("missing"))
            .or_else(TxnOp::put("failed", "1"));
        let out = s.apply(3, Command::Txn(txn.clone()), &mut ev);
        let expected = vec![
            TxnOpResult::DeletePrefix { deleted: 2 },
            TxnOpResult::Put,
            TxnOpResult::Put,
            TxnOpResult::Delete { existed: false },
        ];
        assert_eq!(out, CommandOutput::Txn(TxnResponse { succeeded: true, results: expected, revision: 3 }));
        assert_eq!(ev.len(), 4);
        assert!(ev.iter().all(|e| e.revision == 3), "one transaction, one revision: {ev:?}");
        assert_eq!(s.range(b"ns/", 0).len(), 1);
        // Same transaction again: "cell" exists now, so the failure branch runs.
        let out = s.apply(4, Command::Txn(txn), &mut ev);
        assert_eq!(
            out,
            CommandOutput::Txn(TxnResponse { succeeded: false, results: vec![TxnOpResult::Put], revision: 4 })
        );
        assert!(s.get(b"failed").is_some() && s.get(b"ns/c").is_some());
        // A put naming a missing lease refuses the whole transaction.
        ev.clear();
        let bad = Txn::new().and_then(TxnOp::delete("cell")).and_then(TxnOp::put_with_lease("x", "1", 9));
        assert_eq!(s.apply(5, Command::Txn(bad), &mut ev), CommandOutput::LeaseNotFound(9));
        assert!(ev.is_empty() && s.get(b"cell").is_some(), "nothing changed");
        let present = Txn::new().when(super::super::Compare::present("cell")).and_then(TxnOp::put("p", "1"));
        assert!(matches!(
            s.apply(6, Command::Txn(present), &mut ev),
            CommandOutput::Txn(TxnResponse { succeeded: true, .. })
        ));
    }

    #[test]
    fn range_is_prefix_bounded_and_snapshot_round_trips() {
        let mut s = KvState::default();
        let mut ev = Vec::new();
        for (i, k) in ["a/1", "a/2", "b/1", "a"].iter().enumerate() {
            s.apply(i as u64 + 1, put(k, "v", None), &mut ev);
        }
        let keys: Vec<_> = s.range(b"a/", 0).into_iter().map(|kv| kv.key).collect();
        assert_eq!(keys, vec![b"a/1".to_vec(), b"a/2".to_vec()]);
        assert_eq!(s.range(b"a", 1).len(), 1);
        let restored = KvState::from_bytes(&s.to_bytes().expect("encode")).expect("decode");
        assert_eq!(restored, s);
        assert!(KvState::from_bytes(b"\xff\xff\xff").is_err(), "garbage must not decode");
    }
}
