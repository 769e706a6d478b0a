//! `tah healthcheck`, the container's probe: exit 0 only when `/readyz` answers 200, and one
//! line on stdout saying what it asked and what came back.

use std::process::Output;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{ServerOptions, TestServer};
use crate::usage::tah;

async fn healthcheck(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let Output { status, stdout, .. } = tah()
        .arg("healthcheck")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .await
        .expect("run tah healthcheck");
    (
        status.code(),
        String::from_utf8_lossy(&stdout).trim().to_string(),
    )
}

#[tokio::test]
async fn a_ready_server_is_healthy() {
    let server = TestServer::start(ServerOptions::new()).await;
    let url = format!("{}/readyz", server.base);
    let (code, line) = healthcheck(&["--url", &url], &[]).await;
    assert_eq!(code, Some(0), "{line}");
    assert_eq!(line, format!("ready: GET {url} answered 200 OK"));

    // Without --url it probes /readyz on TAH_LISTEN, as `tah serve` reads it.
    let listen = server.base.trim_start_matches("http://").to_string();
    let (code, line) = healthcheck(&[], &[("TAH_LISTEN", &listen)]).await;
    assert_eq!(code, Some(0), "{line}");
    assert_eq!(line, format!("ready: GET {url} answered 200 OK"));
}

#[tokio::test]
async fn a_closed_port_is_unhealthy() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("an address").port();
    drop(listener);
    let url = format!("http://127.0.0.1:{port}/readyz");
    let (code, line) = healthcheck(&["--url", &url], &[]).await;
    assert_eq!(code, Some(1), "{line}");
    assert!(
        line.starts_with(&format!("not ready: cannot reach {url}: ")),
        "{line}"
    );
    assert!(line.to_lowercase().contains("connection refused"), "{line}");

    let (code, line) = healthcheck(&[], &[("TAH_LISTEN", &format!("0.0.0.0:{port}"))]).await;
    assert_eq!(code, Some(1), "{line}");
    assert!(
        line.contains(&format!("http://127.0.0.1:{port}/readyz")),
        "{line}"
    );

    let (code, line) = healthcheck(&["--url", "not a url"], &[]).await;
    assert_eq!(code, Some(1), "{line}");
    assert!(
        line.starts_with("not ready: not a url is not a URL"),
        "{line}"
    );
}

#[tokio::test]
async fn a_server_that_is_not_ready_is_unhealthy_and_says_why() {
    // What /readyz answers while the database refuses writes.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.expect("accept");
        let mut request = vec![0u8; 4096];
        let _ = socket.read(&mut request).await;
        let body = r#"{"type":"urn:tah:problem:unavailable","title":"Service Unavailable","status":503,"detail":"the database refuses writes: disk full"}"#;
        let response = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = socket.write_all(response.as_bytes()).await;
    });
    let url = format!("http://{addr}/readyz");
    let (code, line) = healthcheck(&["--url", &url], &[]).await;
    assert_eq!(code, Some(1), "{line}");
    assert_eq!(
        line,
        format!(
            "not ready: GET {url} answered 503 Service Unavailable: the database refuses writes: disk full"
        )
    );
}
