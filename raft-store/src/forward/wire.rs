//! What a forwarded request and its answer look like on the wire (postcard inside a transport
//! frame). Decoded only on an authenticated connection, from a frame already capped by
//! `max_frame_bytes`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::engine::request::{Query, ReadOutput};
use crate::error::Error;
use crate::state_machine::{Command, CommandOutput};

/// The operations a follower forwards to its group's leader.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum ForwardOp {
    /// A write (put, delete, CAS, txn, lease grant/revoke).
    Propose(Command),
    /// A linearizable read.
    Read(Query),
    /// A lease renewal (leader-local state, not a log entry).
    LeaseKeepAlive(u64),
}

impl ForwardOp {
    /// True when running it twice is harmless (reads, keepalives): such requests are retried at
    /// a new leader even after an answer was lost.
    pub(crate) fn idempotent(&self) -> bool {
        !matches!(self, ForwardOp::Propose(_))
    }

    /// Metric label.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            ForwardOp::Propose(_) => "write",
            ForwardOp::Read(_) => "read",
            ForwardOp::LeaseKeepAlive(_) => "keepalive",
        }
    }
}

/// A forwarded request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ForwardRequest {
    /// The group.
    pub group: u64,
    /// How long the caller still waits (the leader gives up after that).
    pub timeout_ms: u64,
    /// What to do.
    pub op: ForwardOp,
}

/// A successful answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum ForwardReply {
    /// A write's output.
    Command(CommandOutput),
    /// A read's output.
    Read(ReadOutput),
    /// A keepalive's TTL in milliseconds.
    LeaseTtl(u64),
}

/// A typed error carried back to the forwarding node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum WireError {
    NotLeader { hint: Option<u64> },
    Timeout { after_ms: u64 },
    LeadershipLost,
    GroupNotFound,
    LeaseNotFound(u64),
    InvalidArgument(String),
    Overloaded,
    Stopped,
    Other { kind: String, message: String },
}

/// The answer to a forwarded request.
pub(crate) type ForwardResponse = std::result::Result<ForwardReply, WireError>;

impl WireError {
    /// The leader's error as it travels.
    pub(crate) fn from_error(e: &Error) -> Self {
        match e {
            Error::NotLeader { hint, .. } => WireError::NotLeader { hint: *hint },
            Error::Timeout { after, .. } => {
                WireError::Timeout { after_ms: u64::try_from(after.as_millis()).unwrap_or(u64::MAX) }
            }
            Error::LeadershipLost { .. } => WireError::LeadershipLost,
            Error::GroupNotFound(_) => WireError::GroupNotFound,
            Error::LeaseNotFound(id) => WireError::LeaseNotFound(*id),
            Error::InvalidArgument(m) => WireError::InvalidArgument(m.clone()),
            Error::Overloaded => WireError::Overloaded,
            Error::Stopped => WireError::Stopped,
            other => WireError::Other { kind: other.kind().to_owned(), message: other.to_string() },
        }
    }

    /// Back into this node's error type. `leader` is the node that answered.
    pub(crate) fn into_error(self, group: u64, leader: u64) -> Error {
        match self {
            WireError::NotLeader { hint } => Error::NotLeader { group, hint },
            WireError::Timeout { after_ms } => Error::Timeout { group, after: Duration::from_millis(after_ms) },
            WireError::LeadershipLost => Error::LeadershipLost { group },
            WireError::GroupNotFound => Error::Remote {
                node: leader,
                kind: "group_not_found".into(),
                message: format!("group {group} not found on node {leader}"),
            },
            WireError::LeaseNotFound(id) => Error::LeaseNotFound(id),
            WireError::InvalidArgument(m) => Error::InvalidArgument(m),
            WireError::Overloaded => Error::Overloaded,
            WireError::Stopped => Error::ForwardLost { group, leader, reason: "the leader's store is shutting down" },
            WireError::Other { kind, message } => Error::Remote { node: leader, kind, message },
        }
    }
}

/// Decodes a FORWARD body (`answer == false`: a [`ForwardRequest`]) or an ANSWER body (a
/// [`ForwardResponse`]) as the receiving node does, and checks that what decodes encodes to bytes
/// that decode to the same encoding again. Public only for the fuzz targets (`fuzz/`), which
/// cannot name these crate-private types. `Ok(true)`: decoded; `Ok(false)`: refused, as the node
/// refuses it (it closes the connection); `Err`: an encoding that does not round-trip.
#[doc(hidden)]
pub fn fuzz_forward_payload(payload: &[u8], answer: bool) -> std::result::Result<bool, String> {
    fn check<T: Serialize + for<'de> Deserialize<'de>>(payload: &[u8]) -> std::result::Result<bool, String> {
        let Ok(decoded) = postcard::from_bytes::<T>(payload) else { return Ok(false) };
        let once = postcard::to_stdvec(&decoded).map_err(|e| format!("re-encoding: {e}"))?;
        let again = postcard::from_bytes::<T>(&once).map_err(|e| format!("re-encoded bytes do not decode: {e}"))?;
        let twice = postcard::to_stdvec(&again).map_err(|e| format!("re-encoding again: {e}"))?;
        if once != twice {
            return Err(format!("encoding is not stable: {once:?} then {twice:?}"));
        }
        Ok(true)
    }
    if answer {
        check::<ForwardResponse>(payload)
    } else {
        check::<ForwardRequest>(payload)
    }
}

/// FORWARD bodies (`false`) and ANSWER bodies (`true`) as nodes send them, one of each kind of
/// operation and answer: the seed corpus of the fuzz target (`fuzz/`).
#[doc(hidden)]
pub fn fuzz_forward_seeds() -> Vec<(bool, Vec<u8>)> {
    use crate::state_machine::{Compare, KeyValue, Txn, TxnOp};
    let request = |op| ForwardRequest { group: 7, timeout_ms: 5000, op };
    let requests = [
        request(ForwardOp::Propose(Command::Put {
            key: b"kernels/k1".to_vec(),
            value: b"{}".to_vec(),
            lease: Some(3),
        })),
        request(ForwardOp::Propose(Command::Cas { key: b"k".to_vec(), expected: None, value: b"v".to_vec() })),
        request(ForwardOp::Propose(Command::Txn(
            Txn::new().when(Compare::absent("a")).and_then(TxnOp::put("a", "1")).or_else(TxnOp::delete_prefix("b/")),
        ))),
        request(ForwardOp::Read(Query::Range { prefix: b"hosts/".to_vec(), limit: 100 })),
        request(ForwardOp::LeaseKeepAlive(42)),
    ];
    let answers: [ForwardResponse; 4] = [
        Ok(ForwardReply::Command(CommandOutput::Put)),
        Ok(ForwardReply::Read(ReadOutput {
            kvs: vec![KeyValue {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                create_revision: 4,
                mod_revision: 5,
                lease: None,
            }],
            applied_index: 5,
            stale: false,
        })),
        Ok(ForwardReply::LeaseTtl(9000)),
        Err(WireError::NotLeader { hint: Some(2) }),
    ];
    let mut out = Vec::new();
    out.extend(requests.iter().filter_map(|r| postcard::to_stdvec(r).ok()).map(|b| (false, b)));
    out.extend(answers.iter().filter_map(|a| postcard::to_stdvec(a).ok()).map(|b| (true, b)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fuzz_seeds_are_payloads_a_node_decodes_and_garbage_is_refused() {
        let seeds = fuzz_forward_seeds();
        assert!(seeds.iter().any(|(answer, _)| *answer) && seeds.iter().any(|(answer, _)| !*answer));
        for (answer, payload) in seeds {
            assert_eq!(fuzz_forward_payload(&payload, answer), Ok(true), "{payload:?}");
        }
        // An operation tag no request has, and an empty answer.
        assert_eq!(fuzz_forward_payload(&[7, 0x88, 0x27, 9], false), Ok(false));
        assert_eq!(fuzz_forward_payload(&[], true), Ok(false));
    }

    #[test]
    fn typed_errors_survive_the_trip() {
        let cases = [
            Error::NotLeader { group: 3, hint: Some(2) },
            Error::Timeout { group: 3, after: Duration::from_millis(1500) },
            Error::LeadershipLost { group: 3 },
            Error::LeaseNotFound(9),
            Error::InvalidArgument("x".into()),
            Error::Overloaded,
        ];
        for e in cases {
            let bytes = postcard::to_stdvec(&WireError::from_error(&e)).expect("encode");
            let back = postcard::from_bytes::<WireError>(&bytes).expect("decode").into_error(3, 2);
            assert_eq!(back.to_string(), e.to_string());
            assert_eq!(back.outcome_unknown(), e.outcome_unknown(), "{e}");
        }
        let stopped = WireError::from_error(&Error::Stopped).into_error(3, 2);
        assert!(stopped.outcome_unknown(), "a leader that stopped mid-request may have applied it");
        let other = WireError::from_error(&Error::Corrupt("bad".into())).into_error(3, 2);
        assert_eq!(other.kind(), "remote");
        assert!(other.to_string().contains("corrupt"), "{other}");
    }
}
