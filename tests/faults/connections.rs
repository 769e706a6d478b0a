//! Slow and idle clients: a connection holding partial headers, an idle keep-alive connection,
//! and more connections than the server allows.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{ServerOptions, TestServer};

async fn connect(server: &TestServer) -> TcpStream {
    let addr = server.api.base.trim_start_matches("http://");
    TcpStream::connect(addr).await.expect("connect")
}

/// Reads until the server closes the connection (or `limit` passes); returns what was read and
/// whether it closed.
async fn read_to_close(stream: &mut TcpStream, limit: Duration) -> (String, bool) {
    let mut text = Vec::new();
    let deadline = Instant::now() + limit;
    loop {
        let mut buf = [0u8; 4096];
        match tokio::time::timeout_at(deadline.into(), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&text).into_owned(), true),
            Ok(Ok(n)) => text.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&text).into_owned(), false),
        }
    }
}

#[tokio::test]
async fn partial_headers_and_idle_connections_are_closed() {
    let server =
        TestServer::start(ServerOptions::new().args(&["--header-read-timeout-secs", "1"])).await;
    let mut partial = connect(&server).await;
    partial
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let (_, closed) = read_to_close(&mut partial, Duration::from_secs(5)).await;
    assert!(closed, "a connection with partial headers stayed open");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );

    let mut idle = connect(&server).await;
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let (answer, closed) = read_to_close(&mut idle, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(closed, "an idle keep-alive connection stayed open");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn sse_streams_outlive_the_header_timeout() {
    let server =
        TestServer::start(ServerOptions::new().args(&["--header-read-timeout-secs", "1"])).await;
    let id = server.create_session().await;
    let mut stream = server.sse(&id, crate::support::SseFrom::Start).await;
    let first = stream.next_frame().await;
    assert_eq!(first.event, "session.created");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    server.run_wait(&id, "still there?").await;
    let frames = stream.until_type("agent.finished").await;
    assert!(!frames.is_empty());
}

#[tokio::test]
async fn connections_over_the_cap_get_503_and_the_server_stays_usable() {
    let server = TestServer::start(ServerOptions::new().args(&[
        "--max-connections",
        "3",
        "--header-read-timeout-secs",
        "30",
    ]))
    .await;
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(connect(&server).await);
    }
    // Let the server accept them.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut extra = connect(&server).await;
    let (answer, closed) = read_to_close(&mut extra, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 1"), "{answer}");
    assert!(answer.contains("too-many-connections"), "{answer}");
    assert!(closed);
    drop(held.pop());
    let mut served = false;
    for _ in 0..50 {
        let reply = server.api.http.get(server.api.url("/healthz")).send().await;
        if reply.is_ok_and(|r| r.status() == 200) {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served, "a freed connection slot was not used again");
}
