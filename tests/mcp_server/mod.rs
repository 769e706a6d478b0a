//! The MCP server face (`/mcp`) through raw HTTP: authentication like `/v1` (no credential is
//! `401`, a session token `403`), malformed JSON-RPC and bad tool arguments answered as errors
//! and never a `5xx`, and roles and owners inside a tenant (a viewer reads but does not run, a
//! member does not see another member's session). The SDK's own client is in
//! `tests/protocols/mcp-server.test.mjs`; another tah using this one is in the `mcp` suite.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::principals::{create_key, operated, session_token};
use crate::support::*;

/// A JSON-RPC request to `/mcp`: the status and the last JSON-RPC message answered (as JSON
/// or on the response's event stream).
async fn rpc(api: &Api, body: &str) -> (StatusCode, Value) {
    let response = api
        .request(Method::POST, "/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_string())
        .send()
        .await
        .expect("POST /mcp");
    let status = response.status();
    let text = response.text().await.expect("a body");
    let message = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .rfind(|d| !d.trim().is_empty())
        .and_then(|d| serde_json::from_str(d.trim()).ok())
        .or_else(|| serde_json::from_str(&text).ok())
        .unwrap_or(Value::Null);
    (status, message)
}

/// `tools/call` of `name` with `arguments`: its result (a tool result or a JSON-RPC error).
async fn call(api: &Api, name: &str, arguments: Value) -> Value {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": name, "arguments": arguments}});
    let (status, message) = rpc(api, &body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{name} {arguments}: {message}");
    message
}

fn tool_text(message: &Value) -> &str {
    message["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
}

#[tokio::test]
async fn no_credential_is_401_and_a_session_token_403() {
    let server = TestServer::start(operated()).await;
    let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    let (status, _) = rpc(&server.anonymous(), list).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = rpc(&server.with_bearer("tah_not_a_key"), list).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let id = server.create_session().await;
    let token = session_token(&server, &id, "interact", None).await;
    let (status, _) = rpc(&server.with_bearer(&token), list).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, listed) = rpc(&server, list).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["result"]["tools"].as_array().map(Vec::len), Some(4));
}

#[tokio::test]
async fn malformed_requests_are_errors_never_5xx() {
    let server = TestServer::start(operated()).await;
    for body in [
        "not json",
        "[]",
        "{}",
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"tah_run","arguments":"text"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":42}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"no/such/method"}"#,
    ] {
        let (status, message) = rpc(&server, body).await;
        assert!(
            status.is_client_error() || (status == StatusCode::OK && message["error"].is_object()),
            "{body}: {status} {message}"
        );
    }
    for (name, arguments, says) in [
        ("tah_run", json!({"input": 5}), "invalid type"),
        (
            "tah_run",
            json!({"input": "x".repeat(200_001)}),
            "longer than",
        ),
        (
            "tah_run",
            json!({"input": "hi", "agent": "a", "session_id": "b"}),
            "not both",
        ),
        (
            "tah_answer",
            json!({"session_id": "nope", "call_id": "c"}),
            "session_id must be",
        ),
        ("tah_sessions", json!({"limit": "ten"}), "invalid type"),
        ("tah_session", json!({}), "missing field `session_id`"),
    ] {
        let message = call(&server, name, arguments.clone()).await;
        assert_eq!(message["result"]["isError"], true, "{name} {message}");
        assert!(tool_text(&message).contains(says), "{name}: {message}");
    }
    // A body over the server's limit (1 MiB by default) is a 413, with or without a length.
    let big = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list",
                     "params": {"pad": "x".repeat(2 * 1024 * 1024)}})
    .to_string();
    let (status, _) = rpc(&server, &big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    let chunks = futures::stream::iter(
        big.into_bytes()
            .chunks(64 * 1024)
            .map(|c| Ok::<_, std::io::Error>(c.to_vec()))
            .collect::<Vec<_>>(),
    );
    let response = server
        .request(Method::POST, "/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .expect("POST /mcp, chunked");
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let id = server.create_session().await;
    let message = call(
        &server,
        "tah_answer",
        json!({"session_id": id, "call_id": "c", "decision": "allow", "output": "both"}),
    )
    .await;
    assert_eq!(message["result"]["isError"], true, "{message}");
}

#[tokio::test]
async fn roles_and_owners_hold_inside_a_tenant() {
    let server = TestServer::start(operated()).await;
    let admin = create_key(&server, "acme", "admin").await.client(&server);
    let member = create_key(&server, "acme", "member").await.client(&server);
    let viewer = create_key(&server, "acme", "viewer").await.client(&server);

    let made = call(&admin, "tah_run", json!({"input": "the admin's turn"})).await;
    assert_eq!(made["result"]["isError"], false, "{made}");
    let id = made["result"]["structuredContent"]["session_id"]
        .as_str()
        .expect("a session id")
        .to_string();

    // A member sees only its own sessions: the admin's is not found.
    for (name, arguments) in [
        ("tah_session", json!({"session_id": id})),
        ("tah_run", json!({"session_id": id, "input": "mine now"})),
    ] {
        let message = call(&member, name, arguments).await;
        assert_eq!(
            tool_text(&message),
            "session not found",
            "{name}: {message}"
        );
    }
    let listed = call(&member, "tah_sessions", json!({})).await;
    assert_eq!(listed["result"]["structuredContent"]["sessions"], json!([]));

    // A viewer reads the tenant's sessions but neither runs one nor makes one.
    let shown = call(&viewer, "tah_session", json!({"session_id": id})).await;
    assert_eq!(shown["result"]["isError"], false, "{shown}");
    for arguments in [
        json!({"session_id": id, "input": "let me"}),
        json!({"input": "a new one"}),
    ] {
        let refused = call(&viewer, "tah_run", arguments.clone()).await;
        assert_eq!(refused["result"]["isError"], true, "{arguments}: {refused}");
    }
    let runs = server.get_ok(&format!("/v1/sessions/{id}/runs")).await;
    assert_eq!(runs["data"].as_array().map(Vec::len), Some(1), "{runs}");
}
