//! The `execute_reply` a replica host answers a front-end with when it does not hand on
//! ipykernel's own: the election's outcome in `metadata.nbos_election`.

use std::time::SystemTime;

use crate::jupyter::Message;

/// An `execute_reply` to `request` with `metadata.nbos_election = election`.
pub(super) fn outcome_reply(request: &Message, election: serde_json::Value, content: serde_json::Value) -> Message {
    let session = request.header().map(|h| h.session).unwrap_or_default();
    let mut reply = Message::new(
        "execute_reply",
        &session,
        &uuid::Uuid::new_v4().to_string(),
        SystemTime::now(),
        Some(&request.header),
        &content,
    );
    reply.metadata = bytes::Bytes::from(serde_json::json!({ "nbos_election": election }).to_string());
    reply
}

/// The content of a reply to a cell that did not run here.
pub(super) fn not_run_content() -> serde_json::Value {
    serde_json::json!({ "status": "aborted", "execution_count": 0, "user_expressions": {}, "payload": [] })
}
