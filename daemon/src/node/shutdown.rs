//! What stops the node: SIGTERM or SIGINT, or a raft store that can no longer write its log.

use std::future::Future;
use std::sync::{Arc, Mutex};

use raft_store::RaftStore;

/// Why the node stopped when it was not a signal: a failed raft store's reason.
pub(super) type StoreFailure = Arc<Mutex<Option<String>>>;

/// A future that ends on a signal, or when `store` fails (whose reason is then put in the
/// returned [`StoreFailure`]).
pub(super) fn stop_signal(store: Option<RaftStore>) -> (impl Future<Output = ()>, StoreFailure) {
    // A raft store whose log can no longer be written (a full disk) stops this host as a
    // signal does, and the daemon then exits with the reason (fail-stop, as etcd on a failed
    // WAL write): a host that looked alive with a dead store would never answer.
    let store_failure = Arc::new(std::sync::Mutex::new(None::<String>));
    let stop = {
        let store_failure = store_failure.clone();
        async move {
            let failed = async {
                match &store {
                    Some(s) => s.failed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown_signal() => {}
                reason = failed => {
                    tracing::error!(reason = %reason, "the raft store stopped: stopping this host");
                    if let Ok(mut f) = store_failure.lock() {
                        *f = Some(reason);
                    }
                }
            }
        }
    };
    (stop, store_failure)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot install the SIGTERM handler");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
