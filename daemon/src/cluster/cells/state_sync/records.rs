//! What namespace sync keeps in a kernel's raft group: one `ns/{name}` value per global
//! (a small header with the payload inline or a pointer into the large-object store) and
//! the `ns-cell` marker of the last synchronised cell.

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// Cell id prefix of the marker a namespace reset puts.
pub(super) const RESET_PREFIX: &str = "restart-";
/// Magic and version of an `ns/` value.
const NS_MAGIC: &[u8; 4] = b"NBS1";

/// Where an `ns/` value's payload is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum Payload {
    /// In the value.
    Inline(Vec<u8>),
    /// In the large-object store under its sha256.
    Object,
}

/// An `ns/{name}` value: a small header plus the payload or a pointer to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct NsValue {
    /// `pickle` or `module`.
    pub(super) kind: String,
    /// Payload size in bytes.
    pub(super) size: u64,
    /// Payload sha256 (hex).
    pub(super) sha256: String,
    /// The payload, or where it is.
    pub(super) payload: Payload,
}

impl NsValue {
    /// The stored bytes: magic, then the postcard encoding.
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = NS_MAGIC.to_vec();
        // Plain data with no maps: postcard cannot fail on it.
        out.extend(postcard::to_stdvec(self).unwrap_or_default());
        out
    }

    /// Decodes the value stored at `key`; bytes without the magic are refused.
    pub(super) fn decode(key: &[u8], value: &[u8]) -> anyhow::Result<Self> {
        let body = value
            .strip_prefix(NS_MAGIC.as_slice())
            .with_context(|| format!("{} is not a namespace value", String::from_utf8_lossy(key)))?;
        postcard::from_bytes(body)
            .with_context(|| format!("undecodable namespace value {}", String::from_utf8_lossy(key)))
    }

    /// Payload bytes this value keeps in the log.
    pub(super) fn inline_bytes(&self) -> u64 {
        match &self.payload {
            Payload::Inline(b) => b.len() as u64,
            Payload::Object => 0,
        }
    }
}

/// The `ns-cell` marker: the last synchronised cell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NsCell {
    /// The cell (its `execute_request` msg_id).
    pub cell: String,
    /// The executor's execution count after it.
    pub execution_count: u64,
    /// The replica that executed it.
    pub replica: u32,
    /// Its host.
    pub node_id: u64,
    /// Cells synchronised before this one, oldest first (at most `elect_history`): their
    /// `elect/` records are kept; the cell that falls out of this list has its record
    /// deleted in the same transaction, so a group's election records stay bounded.
    #[serde(default)]
    pub recent: Vec<String>,
}

impl NsCell {
    /// The marker after `previous` for `cell`, and the cells whose election records go.
    pub(super) fn next(previous: Option<&NsCell>, history: usize, cell: NsCell) -> (NsCell, Vec<String>) {
        let mut recent = previous.map(|p| p.recent.clone()).unwrap_or_default();
        if let Some(p) = previous {
            if !p.cell.starts_with(RESET_PREFIX) {
                recent.push(p.cell.clone());
            }
        }
        let drop = recent.len().saturating_sub(history);
        let dropped: Vec<String> = recent.drain(..drop).collect();
        (NsCell { recent, ..cell }, dropped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::cells::objects::sha256_hex;

    #[test]
    fn ns_values_round_trip_and_foreign_bytes_are_refused() {
        let v = NsValue {
            kind: "pickle".into(),
            size: 3,
            sha256: sha256_hex(b"abc"),
            payload: Payload::Inline(b"abc".to_vec()),
        };
        assert_eq!(NsValue::decode(b"ns/x", &v.encode()).expect("decode"), v);
        let err = NsValue::decode(b"ns/x", b"{\"json\":1}").expect_err("foreign");
        assert!(format!("{err:#}").contains("ns/x"));
        let mut truncated = v.encode();
        truncated.truncate(8);
        assert!(NsValue::decode(b"ns/x", &truncated).is_err());
    }

    #[test]
    fn election_history_is_bounded_and_resets_keep_it() {
        let cell = |id: &str| NsCell { cell: id.into(), execution_count: 1, replica: 1, node_id: 1, recent: vec![] };
        let (m1, gone) = NsCell::next(None, 2, cell("a"));
        assert!(m1.recent.is_empty() && gone.is_empty());
        let (m2, _) = NsCell::next(Some(&m1), 2, cell("b"));
        let (m3, gone) = NsCell::next(Some(&m2), 2, cell("c"));
        assert_eq!((m3.recent.clone(), gone), (vec!["a".to_owned(), "b".to_owned()], vec![]));
        let (m4, gone) = NsCell::next(Some(&m3), 2, cell("d"));
        assert_eq!((m4.recent.clone(), gone), (vec!["b".to_owned(), "c".to_owned()], vec!["a".to_owned()]));
        let (reset, gone) = NsCell::next(Some(&m4), usize::MAX, cell("restart-x"));
        assert_eq!((reset.recent.len(), gone.len()), (3, 0));
        let (after, _) = NsCell::next(Some(&reset), 2, cell("e"));
        assert_eq!(after.recent, vec!["c".to_owned(), "d".to_owned()], "a reset marker is no cell");
    }
}
