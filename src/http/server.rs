//! Accepting connections: the listener loop that serves the router on each connection, with
//! the limits a public server needs and `axum::serve` does not set.
//!
//! - At most `max_connections` at once; one more is answered `503` with `Retry-After` and
//!   closed, rather than left waiting in the kernel's backlog (or failing to be accepted when
//!   the process runs out of file descriptors).
//! - A client must send a request's headers within `header_read_timeout`: a connection that
//!   holds partial headers is closed, and so is a keep-alive connection that sends no next
//!   request for that long. It does not apply to a response in progress, so SSE streams and
//!   long `?wait=true` runs are unaffected.
//! - Shutdown stops accepting, lets every connection finish its current request, then ends.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::ops::DerefMut;
use std::pin::{pin, Pin};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::response::Response;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

/// Limits on connections.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    /// For a request's headers, and for the next request on a keep-alive connection.
    pub header_read_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            max_connections: default_max_connections(),
            header_read_timeout: Duration::from_secs(10),
        }
    }
}

/// File descriptors kept for everything but client connections (the database, files the
/// tools open, connections to providers).
const RESERVED_FDS: u64 = 256;

/// As many connections as the process may open files, less a reserve: beyond that, accepting
/// would fail and new clients would wait in the kernel's backlog instead of getting a 503.
pub fn default_max_connections() -> usize {
    let soft = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| {
            let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
            line.split_whitespace().nth(3)?.parse::<u64>().ok()
        });
    match soft {
        Some(soft) => soft.saturating_sub(RESERVED_FDS).clamp(64, 100_000) as usize,
        // "unlimited", or not Linux.
        None => 10_000,
    }
}

/// The answer to a connection over the limit.
const BUSY_RESPONSE: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/problem+json\r\n\
retry-after: 1\r\n\
connection: close\r\n\
content-length: 146\r\n\
\r\n\
{\"type\":\"urn:tah:problem:too-many-connections\",\"title\":\"Service Unavailable\",\"status\":503,\"detail\":\"the server has as many connections as it may\"}";

/// Serves `router` on `listener` until `shutdown` resolves, then lets open requests finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: ConnectionLimits,
) -> io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let protocols = Arc::new(Protocols::new(&limits));
    let connections = TaskTracker::new();
    // Dropped at shutdown: every connection then finishes its request and closes.
    let (stop, stopped) = watch::channel(());
    let mut shutdown = pin!(shutdown);
    loop {
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, or a connection reset before it was accepted:
                    // wait a moment rather than spin.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        match permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let router = router.clone();
                let stopped = stopped.clone();
                let protocols = protocols.clone();
                connections.spawn(async move {
                    serve_connection(stream, router, stopped, protocols).await;
                    drop(permit);
                });
            }
            Err(_) => {
                connections.spawn(refuse(stream));
            }
        }
    }
    drop(stop);
    drop(listener);
    connections.close();
    connections.wait().await;
    Ok(())
}

/// How connections are served: configured once and shared by every connection.
struct Protocols {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
    header_read_timeout: Duration,
}

impl Protocols {
    fn new(limits: &ConnectionLimits) -> Protocols {
        let mut http1 = http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_read_timeout);
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        http2
            .timer(TokioTimer::new())
            .keep_alive_interval(Some(HTTP2_PING_INTERVAL))
            .keep_alive_timeout(limits.header_read_timeout);
        Protocols {
            http1,
            http2,
            header_read_timeout: limits.header_read_timeout,
        }
    }
}

const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(30);

/// What an HTTP/2 client with prior knowledge sends first.
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Http1,
    Http2,
}

/// Which protocol a connection speaks, from its first bytes; `None` while they begin the
/// HTTP/2 preface but are not all of it.
fn sniff(first: &[u8]) -> Option<Protocol> {
    let n = first.len().min(HTTP2_PREFACE.len());
    if first[..n] != HTTP2_PREFACE[..n] {
        Some(Protocol::Http1)
    } else if n == HTTP2_PREFACE.len() {
        Some(Protocol::Http2)
    } else {
        None
    }
}

/// How often the first bytes of a connection are looked at again while they are a part of the
/// HTTP/2 preface (a client that sends it in pieces; rare).
const PREFACE_RECHECK: Duration = Duration::from_millis(10);

/// The protocol the connection speaks, from its first bytes, left unread for hyper; `None` if
/// it closes before it tells.
async fn sniff_stream(stream: &TcpStream) -> io::Result<Option<Protocol>> {
    let mut first = [0u8; HTTP2_PREFACE.len()];
    loop {
        let n = stream.peek(&mut first).await?;
        match sniff(&first[..n]) {
            _ if n == 0 => return Ok(None),
            Some(protocol) => return Ok(Some(protocol)),
            // A peek returns at once while any byte is waiting: look again in a moment.
            None => tokio::time::sleep(PREFACE_RECHECK).await,
        }
    }
}

/// Serves one connection. Its protocol is told from its first bytes, peeked without reading
/// them, so that each connection holds only the state of the protocol it speaks: an HTTP/1
/// connection (an SSE stream, most often) carries no HTTP/2 state and no re-read prefix, and
/// its read buffer stays at hyper's initial size. A connection that does not tell its protocol
/// within the header timeout is closed.
async fn serve_connection(
    stream: TcpStream,
    router: Router,
    mut stopped: watch::Receiver<()>,
    protocols: Arc<Protocols>,
) {
    let sniffed = tokio::select! {
        sniffed = tokio::time::timeout(protocols.header_read_timeout, sniff_stream(&stream)) => sniffed,
        _ = stopped.changed() => return,
    };
    let Ok(Ok(Some(sniffed))) = sniffed else {
        // Closed, failed, or silent for too long.
        return;
    };
    let service = BoxedRouter(router);
    let io = TokioIo::new(stream);
    let result: Result<(), Box<dyn std::error::Error + Send + Sync>> = match sniffed {
        Protocol::Http1 => {
            let connection = protocols
                .http1
                .serve_connection(io, service)
                .with_upgrades();
            drive(pin!(connection), stopped, |c| c.graceful_shutdown())
                .await
                .map_err(Into::into)
        }
        // Boxed, so that an HTTP/1 connection's task is not the size of these.
        Protocol::Http2 => {
            let connection = protocols.http2.serve_connection(io, service);
            Box::pin(drive(Box::pin(connection), stopped, |c| {
                c.graceful_shutdown()
            }))
            .await
            .map_err(Into::into)
        }
    };
    if let Err(error) = result {
        tracing::trace!(%error, "connection ended with an error");
    }
}

/// The router as a hyper service whose futures are boxed. hyper keeps an HTTP/1 connection's
/// request future in a box the size of that future for as long as the connection lives (an
/// SSE stream: hours); boxed, it is the size of a pointer.
#[derive(Clone)]
struct BoxedRouter(Router);

type ResponseFuture = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl hyper::service::Service<Request<Incoming>> for BoxedRouter {
    type Response = Response;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn call(&self, request: Request<Incoming>) -> ResponseFuture {
        // A router is always ready.
        Box::pin(self.0.clone().oneshot(request))
    }
}

/// Polls `connection` to its end; once `stopped` fires, asks it to finish its current request
/// and close.
async fn drive<C, E>(
    mut connection: Pin<C>,
    mut stopped: watch::Receiver<()>,
    graceful_shutdown: impl Fn(Pin<&mut C::Target>),
) -> Result<(), E>
where
    C: DerefMut,
    C::Target: Future<Output = Result<(), E>>,
{
    let mut stopping = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => return result,
            _ = stopped.changed(), if !stopping => {
                stopping = true;
                graceful_shutdown(connection.as_mut());
            }
        }
    }
}

/// Answers a connection over the limit, then closes it.
async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = stream.write_all(BUSY_RESPONSE).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_response_has_the_length_it_says() {
        let text = std::str::from_utf8(BUSY_RESPONSE).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{}",
            body.len()
        );
        let problem: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(problem["status"], 503);
    }

    #[test]
    fn the_first_bytes_tell_the_protocol() {
        assert_eq!(sniff(b"GET / HTTP/1.1\r\n"), Some(Protocol::Http1));
        // Methods that begin like the preface part from it within three bytes.
        for method in ["POST", "PUT", "PATCH"] {
            assert_eq!(sniff(method.as_bytes()), Some(Protocol::Http1), "{method}");
        }
        assert_eq!(sniff(b"P"), None);
        assert_eq!(sniff(b"PRI * HTTP/2.0\r\n"), None);
        assert_eq!(sniff(HTTP2_PREFACE), Some(Protocol::Http2));
    }

    #[test]
    fn the_default_cap_stays_below_the_file_limit() {
        let cap = default_max_connections();
        assert!((64..=100_000).contains(&cap), "{cap}");
    }
}
