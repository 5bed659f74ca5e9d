//! Serves the router on the [`HttpListener`]'s connections with hyper (HTTP/1.1, with
//! upgrades for the WebSockets), within the listener's budgets:
//!
//! - `http.header_read_timeout`: a request's head (line and headers) must arrive within it,
//!   and a kept-alive connection waits that long for its next request;
//! - `http.idle_timeout`: a connection that moves no byte that long while the daemon waits
//!   on the client (no request being handled, or a handler waiting for the request's body)
//!   is closed: a client that stopped sending its body or reading its response;
//! - a request head holds at most [`MAX_HEAD_BYTES`] of buffer.
//!
//! `axum::serve` takes none of these (its hyper builder has no timer), and a client that
//! opened connections and never finished a request held each one forever (issue 29).
//! ALPN offers only `http/1.1`, so HTTP/2 is not served.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;

use super::listener::{Accepted, HttpListener, Io};

/// The most a request head may take (hyper's read buffer); a larger one is answered 431.
/// Jupyter's heads are a few KiB (cookies included).
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// `notebookos_refused_total` reason of a connection closed at `http.header_read_timeout`
/// with part of a request head received.
pub const HEADER_TIMEOUT: &str = "http_header_timeout";
/// `notebookos_refused_total` reason of a connection closed at `http.idle_timeout`.
pub const IDLE_TIMEOUT: &str = "http_idle_timeout";

/// The timeouts of each connection.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// `http.header_read_timeout`.
    pub header_read: Duration,
    /// `http.idle_timeout`.
    pub idle: Duration,
}

/// Serves `router` on `listener` until `stop` completes, then lets the open connections
/// finish their requests (as `axum::serve`'s graceful shutdown does).
pub async fn serve(mut listener: HttpListener, router: Router, timeouts: Timeouts, stop: impl Future<Output = ()>) {
    let (stop_tx, stop_rx) = watch::channel(false);
    // Every connection task holds a receiver of this; all gone = all finished.
    let (done_tx, done_rx) = watch::channel(());
    let mut stop = std::pin::pin!(stop);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut stop => break,
        };
        let (router, stop_rx, done_rx) = (router.clone(), stop_rx.clone(), done_rx.clone());
        tokio::spawn(async move {
            connection(accepted, router, timeouts, stop_rx).await;
            drop(done_rx);
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(done_rx);
    done_tx.closed().await;
}

/// One connection, until it closes or becomes a WebSocket (its slot in the caps goes then).
async fn connection(accepted: Accepted, router: Router, timeouts: Timeouts, mut stop: watch::Receiver<bool>) {
    let Accepted { io, peer, slot } = accepted;
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched { inner: io, activity: activity.clone() });
    let addr = peer.addr;
    let service_activity = activity.clone();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(ConnectInfo(peer.clone()));
        let handling = service_activity.handling();
        let req =
            req.map(|body| axum::body::Body::new(WatchedBody { inner: body, activity: service_activity.clone() }));
        // The router is always ready (axum documents it), so no poll_ready first.
        let call = tower_service::Service::call(&mut router.clone(), req);
        async move {
            let response = call.await;
            drop(handling);
            response
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(timeouts.header_read).max_buf_size(MAX_HEAD_BYTES);
    let conn = builder.serve_connection(io, service).with_upgrades();
    let mut conn = std::pin::pin!(conn);
    let idle = idle_for(&activity, timeouts.idle);
    let mut idle = std::pin::pin!(idle);
    let mut stopping = false;
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    if e.is_timeout() && activity.head_pending() {
                        crate::metrics::count_refusal(HEADER_TIMEOUT);
                        tracing::debug!(peer = %addr, "closed a connection: no complete request head within http.header_read_timeout");
                    } else {
                        tracing::debug!(peer = %addr, error = %e, "HTTP connection ended");
                    }
                }
                break;
            }
            () = &mut idle => {
                crate::metrics::count_refusal(IDLE_TIMEOUT);
                tracing::debug!(peer = %addr, "closed a connection idle for http.idle_timeout");
                break;
            }
            changed = stop.changed(), if !stopping => {
                stopping = true;
                if changed.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
    drop(slot);
}

/// Completes once the connection moved no byte for `timeout` while the daemon waited on
/// the client (no request being handled, or a handler waiting for its request's body).
async fn idle_for(activity: &Activity, timeout: Duration) {
    loop {
        let quiet = activity.quiet_for();
        let waits_on_client = !activity.is_handling() || activity.awaiting_body.load(Ordering::Relaxed);
        if waits_on_client && quiet >= timeout {
            return;
        }
        // A handler may run for long (a kernel start): look again a timeout later.
        tokio::time::sleep(timeout.saturating_sub(quiet).max(timeout / 4)).await;
    }
}

/// What a connection did lately.
#[derive(Debug)]
struct Activity {
    start: Instant,
    /// Milliseconds from `start` to the last byte read or written.
    last_ms: AtomicU64,
    /// Requests of the connection being handled.
    handling: AtomicUsize,
    /// Bytes were read since the last request reached the router (part of a head).
    head_pending: AtomicBool,
    /// A handler waits for more of its request's body.
    awaiting_body: AtomicBool,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
            handling: AtomicUsize::new(0),
            head_pending: AtomicBool::new(false),
            awaiting_body: AtomicBool::new(false),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn quiet_for(&self) -> Duration {
        self.start.elapsed().saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }

    fn handling(self: &Arc<Self>) -> Handling {
        self.head_pending.store(false, Ordering::Relaxed);
        self.handling.fetch_add(1, Ordering::Relaxed);
        Handling(self.clone())
    }

    fn is_handling(&self) -> bool {
        self.handling.load(Ordering::Relaxed) > 0
    }

    fn head_pending(&self) -> bool {
        self.head_pending.load(Ordering::Relaxed)
    }
}

/// A request being handled; the connection is not idle meanwhile.
struct Handling(Arc<Activity>);

impl Drop for Handling {
    fn drop(&mut self) {
        self.0.touch();
        // What was read meanwhile was this request's body.
        self.0.head_pending.store(false, Ordering::Relaxed);
        self.0.awaiting_body.store(false, Ordering::Relaxed);
        self.0.handling.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request's body, noting when its handler waits for it.
struct WatchedBody {
    inner: Incoming,
    activity: Arc<Activity>,
}

impl http_body::Body for WatchedBody {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        self.activity.awaiting_body.store(polled.is_pending(), Ordering::Relaxed);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A connection's bytes, noting when they move.
struct Watched {
    inner: Box<dyn Io>,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.touch();
            self.activity.head_pending.store(true, Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
