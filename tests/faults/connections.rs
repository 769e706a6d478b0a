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

/// What an HTTP/2 client with prior knowledge sends first.
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// An HTTP/2 frame's header and payload.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut frame = len.to_be_bytes()[1..].to_vec();
    frame.extend([kind, flags]);
    frame.extend(stream.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// Sends `GET /healthz` over HTTP/2 (the preface in `pieces`, split where they say) and returns
/// the first byte of the response's header block on stream 1 (0x88 is `:status: 200`).
async fn h2_healthz(server: &TestServer, pieces: &[usize]) -> u8 {
    let mut stream = connect(server).await;
    let mut from = 0;
    for &to in pieces {
        stream.write_all(&HTTP2_PREFACE[from..to]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        from = to;
    }
    stream.write_all(&HTTP2_PREFACE[from..]).await.unwrap();
    // Static-table header fields: :method GET, :scheme http, :path "/healthz".
    let mut block = vec![0x82, 0x86, 0x44, 8];
    block.extend_from_slice(b"/healthz");
    let mut frames = h2_frame(0x4, 0, 0, &[]); // SETTINGS
    frames.extend(h2_frame(0x1, 0x5, 1, &block)); // HEADERS, END_STREAM | END_HEADERS
    stream.write_all(&frames).await.unwrap();
    loop {
        let mut head = [0u8; 9];
        tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut head))
            .await
            .expect("an HTTP/2 frame in time")
            .expect("an HTTP/2 frame");
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; len];
        stream.read_exact(&mut payload).await.unwrap();
        let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        if head[3] == 0x4 && head[4] & 0x1 == 0 {
            // Acknowledge the server's settings.
            stream.write_all(&h2_frame(0x4, 0x1, 0, &[])).await.unwrap();
        }
        if head[3] == 0x1 && id == 1 {
            return payload[0];
        }
    }
}

#[tokio::test]
async fn http2_with_prior_knowledge_is_served_also_when_the_preface_comes_in_pieces() {
    let server = TestServer::start(ServerOptions::new()).await;
    assert_eq!(h2_healthz(&server, &[]).await, 0x88, "whole preface");
    assert_eq!(
        h2_healthz(&server, &[1]).await,
        0x88,
        "preface split after P"
    );
    assert_eq!(
        h2_healthz(&server, &[5, 16]).await,
        0x88,
        "preface in three"
    );
    // An HTTP/1 request that begins like the preface.
    let mut post = connect(&server).await;
    post.write_all(b"P").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    post.write_all(b"OST /v1/sessions HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
        .await
        .unwrap();
    let (answer, closed) = read_to_close(&mut post, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    assert!(closed);
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_the_header_timeout() {
    let server =
        TestServer::start(ServerOptions::new().args(&["--header-read-timeout-secs", "1"])).await;
    let mut silent = connect(&server).await;
    let started = Instant::now();
    let (answer, closed) = read_to_close(&mut silent, Duration::from_secs(5)).await;
    assert!(closed, "a silent connection stayed open");
    assert_eq!(answer, "");
    assert!(
        started.elapsed() >= Duration::from_millis(900)
            && started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}
