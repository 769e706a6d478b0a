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

use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio_util::task::TaskTracker;

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
                let limits = limits.clone();
                connections.spawn(async move {
                    serve_connection(stream, router, stopped, &limits).await;
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

async fn serve_connection(
    stream: TcpStream,
    router: Router,
    mut stopped: watch::Receiver<()>,
    limits: &ConnectionLimits,
) {
    let service = TowerToHyperService::new(router.into_service::<Incoming>());
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(limits.header_read_timeout);
    let io = TokioIo::new(stream);
    let mut connection = pin!(builder.serve_connection_with_upgrades(io, service));
    let mut stopping = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::trace!(%error, "connection ended with an error");
                }
                return;
            }
            _ = stopped.changed(), if !stopping => {
                stopping = true;
                connection.as_mut().graceful_shutdown();
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
    fn the_default_cap_stays_below_the_file_limit() {
        let cap = default_max_connections();
        assert!((64..=100_000).contains(&cap), "{cap}");
    }
}
