//! Cluster failures as answers to a client: a store that is unavailable for now is 503
//! with what to do, other failures keep the status that says what went wrong.

use axum::http::StatusCode;

use crate::cluster::ClusterError;
use crate::gateway::error::ApiError;

/// Why a store failure is the cluster being unavailable for now (503) rather than a fault,
/// in words for the client: whether anything may have changed, and what to do.
fn store_unavailable(e: &raft_store::Error) -> Option<&'static str> {
    use raft_store::Error as E;
    match e {
        E::NotLeader { .. } => Some("no leader of the meta group is known right now; nothing was changed, retry"),
        E::LeaderUnreachable { .. } => Some("the meta group's leader cannot be reached; nothing was changed, retry"),
        E::Overloaded => Some("the raft store is overloaded; nothing was changed, retry later"),
        E::Stopped => Some("this host's raft store is shutting down; use another host"),
        e if e.outcome_unknown() => Some(
            "the outcome is unknown (timeout or leader change): the change may or may not have been applied; \
             check before retrying",
        ),
        _ => None,
    }
}

/// The client's answer to a failed cluster call.
pub fn cluster_error(e: ClusterError) -> ApiError {
    if let ClusterError::Store(store) = &e {
        if let Some(reason) = store_unavailable(store) {
            return ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: format!("{reason} ({e})") };
        }
    }
    let status = match &e {
        ClusterError::NotReady(_) | ClusterError::NotLeader { .. } => StatusCode::SERVICE_UNAVAILABLE,
        ClusterError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        // No room for the replicas within the subscription ratio (the meta leader's
        // answer when forwarded is the same 409).
        ClusterError::Placement(_) | ClusterError::Conflict(_) => StatusCode::CONFLICT,
        ClusterError::NoSuchKernel(_) => StatusCode::NOT_FOUND,
        ClusterError::BadRequest(_) => StatusCode::BAD_REQUEST,
        ClusterError::Remote { status, .. } => StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY),
    };
    ApiError { status, message: e.to_string() }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn store(e: raft_store::Error) -> ApiError {
        cluster_error(ClusterError::Store(e))
    }

    #[test]
    fn store_unavailability_is_503_with_the_reason() {
        let not_proposed = [
            raft_store::Error::NotLeader { group: 1, hint: None },
            raft_store::Error::LeaderUnreachable { group: 1, leader: 2, after: Duration::from_secs(5) },
            raft_store::Error::Overloaded,
        ];
        for e in not_proposed {
            let shown = e.to_string();
            let got = store(e);
            assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE, "{shown}");
            assert!(got.message.contains("nothing was changed"), "{}", got.message);
            assert!(got.message.contains(&shown), "the store's own words are kept: {}", got.message);
        }
        let unknown = [
            raft_store::Error::Timeout { group: 1, after: Duration::from_secs(5) },
            raft_store::Error::LeadershipLost { group: 1 },
            raft_store::Error::ForwardLost { group: 1, leader: 2, reason: "connection closed" },
        ];
        for e in unknown {
            assert!(e.outcome_unknown());
            let got = store(e);
            assert_eq!(got.status, StatusCode::SERVICE_UNAVAILABLE);
            assert!(got.message.contains("may or may not have been applied"), "{}", got.message);
        }
        assert_eq!(store(raft_store::Error::Stopped).status, StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn other_failures_keep_their_status() {
        assert_eq!(store(raft_store::Error::Corrupt("bad".into())).status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(cluster_error(ClusterError::NoSuchKernel("k".into())).status, StatusCode::NOT_FOUND);
        assert_eq!(cluster_error(ClusterError::BadRequest("b".into())).status, StatusCode::BAD_REQUEST);
        let not_ready = cluster_error(ClusterError::NotReady("no quorum".into()));
        assert_eq!(not_ready.status, StatusCode::SERVICE_UNAVAILABLE);
    }
}
