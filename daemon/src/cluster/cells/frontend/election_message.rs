//! The election's part of a Jupyter message: `metadata.nbos_election` on the
//! `execute_request` a front-end sends each replica in a round, and on the outcome a
//! replica answers with.

use crate::cluster::control::records::{ElectionRecord, RunningRecord};
use crate::jupyter::Message;

/// The msg_id of `msg`'s parent request.
pub(super) fn parent_msg_id(msg: &Message) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(&msg.parent_header).ok()?;
    v.get("msg_id")?.as_str().map(str::to_owned)
}

/// `metadata.nbos_election` of a replica's reply, when it is an election outcome.
pub(super) fn election_meta(msg: &Message) -> Option<serde_json::Value> {
    if !msg.metadata.windows(13).any(|w| w == b"nbos_election") {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&msg.metadata).ok()?;
    let el = v.get("nbos_election")?;
    el.get("outcome").is_some().then(|| el.clone())
}

/// `request` with `metadata.nbos_election` set for one replica in one round.
pub(super) fn with_election(
    request: &Message,
    cell: &str,
    round: u32,
    lead: bool,
    expected: Option<&ElectionRecord>,
    steal: Option<&RunningRecord>,
) -> Message {
    let mut meta: serde_json::Value =
        serde_json::from_slice(&request.metadata).unwrap_or_else(|_| serde_json::json!({}));
    if !meta.is_object() {
        meta = serde_json::json!({});
    }
    meta["nbos_election"] = serde_json::json!({
        "cell": cell,
        "round": round,
        "role": if lead { "lead" } else { "yield" },
        "expected": expected,
        "steal": steal,
    });
    Message { metadata: bytes::Bytes::from(meta.to_string()), ..request.clone() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn request() -> Message {
        let mut m = Message::new(
            "execute_request",
            "s",
            "cell-1",
            SystemTime::UNIX_EPOCH,
            None,
            &serde_json::json!({ "code": "1" }),
        );
        m.metadata = bytes::Bytes::from_static(br#"{"cellId":"abc"}"#);
        m
    }

    #[test]
    fn election_metadata_is_added_without_losing_the_clients() {
        let rec = ElectionRecord { round: 0, winner: None, node_id: 2, reason: "busy".into() };
        let held = RunningRecord { cell: "cell-0".into(), replica: 2, node_id: 5 };
        let m = with_election(&request(), "cell-1", 1, true, Some(&rec), Some(&held));
        let meta: serde_json::Value = serde_json::from_slice(&m.metadata).expect("json");
        assert_eq!(meta["cellId"], "abc");
        assert_eq!(meta["nbos_election"]["cell"], "cell-1");
        assert_eq!(meta["nbos_election"]["round"], 1);
        assert_eq!(meta["nbos_election"]["role"], "lead");
        assert_eq!(meta["nbos_election"]["expected"]["node_id"], 2);
        assert_eq!(meta["nbos_election"]["steal"]["cell"], "cell-0");
        let y = with_election(&request(), "cell-1", 0, false, None, None);
        let meta: serde_json::Value = serde_json::from_slice(&y.metadata).expect("json");
        assert_eq!(meta["nbos_election"]["role"], "yield");
        assert!(meta["nbos_election"]["expected"].is_null());
        // A request is not an outcome.
        assert!(election_meta(&m).is_none());
    }

    #[test]
    fn outcomes_are_recognised_and_plain_replies_are_not() {
        let mut reply = request();
        reply.metadata = bytes::Bytes::from_static(
            br#"{"nbos_election":{"outcome":"taken","record":{"round":0,"winner":3,"node_id":7}}}"#,
        );
        let el = election_meta(&reply).expect("outcome");
        assert_eq!(el["outcome"], "taken");
        reply.metadata = bytes::Bytes::from_static(br#"{"started":"x"}"#);
        assert!(election_meta(&reply).is_none());
        reply.metadata = bytes::Bytes::from_static(b"not json nbos_election");
        assert!(election_meta(&reply).is_none());
    }
}
