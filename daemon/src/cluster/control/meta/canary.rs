//! Canary registers in the meta group (`canary/{name}`): an operator reads, writes or
//! compares-and-swaps a small value through any host, with the same guarantees as every
//! meta record (linearizable reads through the leader, one raft entry per write). A health
//! probe that really goes through the meta store, and what the fault campaign checks for
//! linearizability under faults (`tests/chaos/`, `nbos chaos check-history`).

use serde::{Deserialize, Serialize};

use super::error::{ClusterError, Result};
use super::handle::Cluster;

/// Prefix of canary registers.
pub const CANARY: &str = "canary/";
/// Longest canary name.
pub const MAX_NAME: usize = 64;
/// Largest canary value (bytes): a probe, not a store.
pub const MAX_VALUE: usize = 256;

/// One operation on a canary register (`POST /api/v1/cluster/canary`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum CanaryOp {
    /// Linearizable read.
    Read {
        /// Register name.
        name: String,
    },
    /// Write `value`.
    Write {
        /// Register name.
        name: String,
        /// The value.
        value: String,
    },
    /// Write `new` only if the register holds `expected` (`null`: absent).
    Cas {
        /// Register name.
        name: String,
        /// The value it must hold.
        expected: Option<String>,
        /// The value written when it does.
        new: String,
    },
}

/// What a canary operation found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CanaryAnswer {
    /// For a read: the value (`null`: absent). For a failed CAS: the value that did not match.
    pub value: Option<String>,
    /// For a CAS: whether it swapped; `true` for a write; absent for a read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ok: Option<bool>,
}

impl CanaryOp {
    fn name(&self) -> &str {
        match self {
            CanaryOp::Read { name } | CanaryOp::Write { name, .. } | CanaryOp::Cas { name, .. } => name,
        }
    }

    /// Refuses names outside `[A-Za-z0-9_-]{1,64}` and values over [`MAX_VALUE`] bytes.
    pub fn validate(&self) -> Result<()> {
        let name = self.name();
        let name_ok = !name.is_empty()
            && name.len() <= MAX_NAME
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !name_ok {
            return Err(ClusterError::BadRequest(format!(
                "a canary name is 1 to {MAX_NAME} characters of A-Z, a-z, 0-9, '-' and '_'"
            )));
        }
        let values: Vec<&String> = match self {
            CanaryOp::Read { .. } => vec![],
            CanaryOp::Write { value, .. } => vec![value],
            CanaryOp::Cas { expected, new, .. } => expected.iter().chain([new]).collect(),
        };
        if values.iter().any(|v| v.len() > MAX_VALUE) {
            return Err(ClusterError::BadRequest(format!("a canary value is at most {MAX_VALUE} bytes")));
        }
        Ok(())
    }
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8_lossy(&bytes).into_owned()
}

impl Cluster {
    /// Runs `op` on its register in the meta group (from any host: the store forwards
    /// proposals and reads to the group's leader).
    pub async fn canary(&self, op: CanaryOp) -> Result<CanaryAnswer> {
        op.validate()?;
        let key = format!("{CANARY}{}", op.name());
        let kv = self.meta();
        Ok(match op {
            CanaryOp::Read { .. } => CanaryAnswer { value: kv.get(key).await?.map(|kv| text(kv.value)), ok: None },
            CanaryOp::Write { value, .. } => {
                kv.put(key, value.clone()).await?;
                CanaryAnswer { value: Some(value), ok: Some(true) }
            }
            CanaryOp::Cas { expected, new, .. } => {
                let out = kv.cas(key, expected.map(String::into_bytes), new.clone()).await?;
                let value = if out.succeeded { Some(new) } else { out.previous.map(text) };
                CanaryAnswer { value, ok: Some(out.succeeded) }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values_are_bounded_and_the_json_is_tagged_by_op() {
        let op: CanaryOp =
            serde_json::from_str(r#"{"op": "cas", "name": "r-1", "expected": null, "new": "a"}"#).expect("parse");
        assert_eq!(op, CanaryOp::Cas { name: "r-1".into(), expected: None, new: "a".into() });
        assert!(op.validate().is_ok());
        assert!(serde_json::from_str::<CanaryOp>(r#"{"op": "delete", "name": "r"}"#).is_err());
        assert!(serde_json::from_str::<CanaryOp>(r#"{"op": "read", "name": "r", "extra": 1}"#).is_err());
        for bad in ["", "../kernels/x", "a/b", &"n".repeat(MAX_NAME + 1)] {
            let e = CanaryOp::Read { name: bad.into() }.validate().expect_err(bad);
            assert!(matches!(e, ClusterError::BadRequest(_)), "{bad}: {e}");
        }
        let big = "v".repeat(MAX_VALUE + 1);
        assert!(CanaryOp::Write { name: "r".into(), value: big.clone() }.validate().is_err());
        assert!(CanaryOp::Cas { name: "r".into(), expected: Some(big), new: "a".into() }.validate().is_err());
        assert!(CanaryOp::Write { name: "r".into(), value: "v".repeat(MAX_VALUE) }.validate().is_ok());
    }
}
