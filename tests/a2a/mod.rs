//! The A2A face (SPEC §19), black-box: bad input on both bindings gets A2A's error codes and
//! never a 5xx; tenants, owners and session tokens reach only their own contexts and tasks;
//! a subscription resumed from `Last-Event-ID` continues exactly. (The SDK's own client is
//! in `tests/protocols/a2a.test.mjs`.)

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::principals::{create_key, operated, session_token_of};
use crate::support::*;

/// A JSON-RPC call on the default agent (`body` as is); answers the reply, which must not be
/// a 5xx.
async fn rpc_raw(api: &Api, agent: &str, body: &str) -> Reply {
    let request = api
        .request(Method::POST, &format!("/a2a/{agent}"))
        .header("content-type", "application/json")
        .body(body.to_string());
    let reply = api.send(request).await;
    assert!(
        !reply.status.is_server_error(),
        "{body} → {} {}",
        reply.status,
        reply.body
    );
    reply
}

async fn rpc(api: &Api, method: &str, params: Value) -> Reply {
    let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
    rpc_raw(api, "default", &body.to_string()).await
}

/// The JSON-RPC error code of a reply (which must be an error).
#[track_caller]
fn code(reply: &Reply, what: &str) -> i64 {
    reply.body["error"]["code"].as_i64().unwrap_or_else(|| {
        panic!(
            "{what}: not a JSON-RPC error: {} {}",
            reply.status, reply.body
        )
    })
}

fn text_message(text: &str) -> Value {
    json!({"messageId": "m", "role": "ROLE_USER", "parts": [{"text": text}]})
}

/// Sends `text` as a new task (blocking); answers the task.
async fn send(api: &Api, text: &str) -> Value {
    let reply = rpc(api, "SendMessage", json!({"message": text_message(text)})).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let task = reply.body["result"]["task"].clone();
    assert!(task["id"].is_string(), "{}", reply.body);
    task
}

/// The SSE ids of a stream's body.
fn sse_ids(body: &str) -> Vec<i64> {
    body.lines()
        .filter_map(|line| line.strip_prefix("id:"))
        .map(|id| id.trim().parse().expect("an integer id"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_json_rpc_input_gets_a2a_codes_and_never_a_5xx() {
    let server = TestServer::start(ServerOptions::new()).await;
    let done = send(&server, "hello").await;
    let done_id = done["id"].as_str().unwrap();
    let unknown = "01a23caf-021f-76ff-9c27-08fc1c8b5738";
    let raw_cases: &[(&str, i64)] = &[
        ("{bad", -32700),
        ("[]", -32600),
        (
            "[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"GetTask\"}]",
            -32600,
        ),
        ("\"GetTask\"", -32600),
        ("{\"jsonrpc\":\"2.0\",\"method\":\"GetTask\"}", -32600),
        (
            "{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"GetTask\"}",
            -32600,
        ),
        (
            "{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"GetTask\"}",
            -32600,
        ),
        ("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":3}", -32600),
        (
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"GetTask\",\"extra\":1}",
            -32600,
        ),
        ("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"Nope\"}", -32601),
        (
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"message/send\"}",
            -32601,
        ),
        (
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"GetTask\",\"params\":[]}",
            -32602,
        ),
    ];
    for (body, expected) in raw_cases {
        let reply = rpc_raw(&server, "default", body).await;
        assert_eq!(code(&reply, body), *expected, "{body} → {}", reply.body);
    }
    let cases: Vec<(&str, Value, i64)> = vec![
        ("GetTask", json!({}), -32602),
        ("GetTask", json!({"id": 5}), -32602),
        ("GetTask", json!({"id": "nope"}), -32001),
        ("GetTask", json!({"id": unknown}), -32001),
        (
            "GetTask",
            json!({"id": done_id, "historyLength": -1}),
            -32602,
        ),
        ("GetTask", json!({"id": done_id, "tenant": "other"}), -32602),
        ("GetTask", json!({"id": done_id, "surprise": true}), -32602),
        ("SendMessage", json!({}), -32602),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "parts": []}}),
            -32602,
        ),
        (
            "SendMessage",
            json!({"message": {"parts": [{"text": "x"}]}}),
            -32602,
        ),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "role": "ROLE_AGENT", "parts": [{"text": "x"}]}}),
            -32602,
        ),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "parts": [{"url": "http://x/y.png"}]}}),
            -32005,
        ),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "parts": [{"raw": "AAAA"}]}}),
            -32005,
        ),
        (
            "SendMessage",
            json!({"message": text_message("x"), "configuration": {"acceptedOutputModes": ["image/png"]}}),
            -32005,
        ),
        (
            "SendMessage",
            json!({"message": text_message("x"), "foo": 1}),
            -32602,
        ),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "parts": [{"text": "x"}], "referenceTaskIds": [done_id]}}),
            -32602,
        ),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "contextId": unknown, "parts": [{"text": "x"}]}}),
            -32001,
        ),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "parts": [{"data": {"call_id": "c", "decision": "allow"}}]}}),
            -32602,
        ),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "taskId": done_id, "parts": [{"data": {"call_id": "c", "decision": "allow"}}]}}),
            -32004,
        ),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "parts": [{"data": {"call_id": "c", "decision": "maybe"}}]}}),
            -32602,
        ),
        ("CancelTask", json!({"id": unknown}), -32001),
        ("CancelTask", json!({"id": done_id}), -32002),
        ("ListTasks", json!({"pageSize": 1000}), -32602),
        ("ListTasks", json!({"status": "bogus"}), -32602),
        ("ListTasks", json!({"pageToken": "nope"}), -32602),
        ("ListTasks", json!({"contextId": unknown}), -32001),
        (
            "ListTasks",
            json!({"statusTimestampAfter": "yesterday"}),
            -32602,
        ),
        ("SubscribeToTask", json!({"id": unknown}), -32001),
        ("GetExtendedAgentCard", json!({}), -32007),
        (
            "CreateTaskPushNotificationConfig",
            json!({"taskId": unknown, "url": "https://example.com/h"}),
            -32001,
        ),
        (
            "CreateTaskPushNotificationConfig",
            json!({"taskId": done_id, "url": "http://127.0.0.1:9/h"}),
            -32602,
        ),
        (
            "CreateTaskPushNotificationConfig",
            json!({"taskId": done_id, "url": "ftp://example.com/h"}),
            -32602,
        ),
        (
            "GetTaskPushNotificationConfig",
            json!({"taskId": done_id, "id": "none"}),
            -32001,
        ),
        (
            "DeleteTaskPushNotificationConfig",
            json!({"taskId": done_id, "id": "none"}),
            -32001,
        ),
    ];
    for (method, params, expected) in cases {
        let reply = rpc(&server, method, params.clone()).await;
        let what = format!("{method} {params}");
        assert_eq!(code(&reply, &what), expected, "{what} → {}", reply.body);
        assert_eq!(reply.body["id"], 7, "{what}: the request's id is echoed");
        assert!(
            reply.body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{what}: {}",
            reply.body
        );
    }
    // A version this server does not speak.
    let request = server
        .request(Method::POST, "/a2a/default")
        .header("a2a-version", "0.3")
        .body(
            json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": done_id}})
                .to_string(),
        );
    let reply = server.send(request).await;
    assert_eq!(code(&reply, "A2A-Version 0.3"), -32009, "{}", reply.body);
    // The field a request must not carry is named.
    let reply = rpc(
        &server,
        "SendMessage",
        json!({"message": text_message("x"), "foo": 1}),
    )
    .await;
    assert!(
        reply.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("foo"),
        "{}",
        reply.body
    );

    // The HTTP+JSON binding: statuses, and the google.rpc reason A2A's clients read.
    let rest: Vec<(Method, String, Option<&str>, StatusCode, &str)> = vec![
        (
            Method::GET,
            format!("/a2a/default/tasks/{unknown}"),
            None,
            StatusCode::NOT_FOUND,
            "TASK_NOT_FOUND",
        ),
        (
            Method::GET,
            "/a2a/default/tasks/nope".into(),
            None,
            StatusCode::NOT_FOUND,
            "TASK_NOT_FOUND",
        ),
        (
            Method::POST,
            "/a2a/default/message:send".into(),
            Some("{bad"),
            StatusCode::BAD_REQUEST,
            "PARSE_ERROR",
        ),
        (
            Method::POST,
            "/a2a/default/message:send".into(),
            Some("[]"),
            StatusCode::BAD_REQUEST,
            "INVALID_PARAMS",
        ),
        (
            Method::POST,
            "/a2a/default/message:stream".into(),
            Some("{}"),
            StatusCode::BAD_REQUEST,
            "INVALID_PARAMS",
        ),
        (
            Method::POST,
            format!("/a2a/default/tasks/{done_id}:cancel"),
            None,
            StatusCode::BAD_REQUEST,
            "TASK_NOT_CANCELABLE",
        ),
        (
            Method::POST,
            format!("/a2a/default/tasks/{done_id}:frobnicate"),
            None,
            StatusCode::NOT_FOUND,
            "METHOD_NOT_FOUND",
        ),
        (
            Method::GET,
            "/a2a/default/tasks?pageSize=abc".into(),
            None,
            StatusCode::BAD_REQUEST,
            "INVALID_PARAMS",
        ),
        (
            Method::GET,
            "/a2a/default/extendedAgentCard".into(),
            None,
            StatusCode::BAD_REQUEST,
            "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
        ),
        (
            Method::GET,
            format!("/a2a/{unknown}/tasks"),
            None,
            StatusCode::NOT_FOUND,
            "TASK_NOT_FOUND",
        ),
    ];
    for (method, path, body, status, reason) in rest {
        let mut request = server.request(method.clone(), &path);
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let reply = server.send(request).await;
        let what = format!("{method} {path} {body:?}");
        assert_eq!(reply.status, status, "{what}: {}", reply.body);
        assert_eq!(
            reply.body["error"]["details"][0]["reason"], reason,
            "{what}: {}",
            reply.body
        );
    }
    for path in [
        format!("/a2a/{unknown}/.well-known/agent-card.json"),
        "/a2a/nope/.well-known/agent-card.json".to_string(),
    ] {
        let reply = server.get(&path).await;
        assert_eq!(
            reply.status,
            StatusCode::NOT_FOUND,
            "{path}: {}",
            reply.body
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_contexts_and_tasks_are_not_found_and_session_tokens_keep_to_theirs() {
    let server = TestServer::start(operated()).await;
    let a = create_key(&server, "a", "member").await.client(&server);
    let b = create_key(&server, "b", "member").await.client(&server);
    let task = send(&a, "hello").await;
    let (task_id, context_id) = (
        task["id"].as_str().unwrap(),
        task["contextId"].as_str().unwrap(),
    );
    let session = a.session(context_id).await;
    assert_eq!(
        session["tenant"], "a",
        "a context is an ordinary session: {session}"
    );

    for (method, params) in [
        ("GetTask", json!({"id": task_id})),
        ("CancelTask", json!({"id": task_id})),
        ("SubscribeToTask", json!({"id": task_id})),
        ("ListTasks", json!({"contextId": context_id})),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "contextId": context_id, "parts": [{"text": "x"}]}}),
        ),
        (
            "SendMessage",
            json!({"message": {"messageId": "m", "taskId": task_id, "parts": [{"data": {"call_id": "c", "output": "x"}}]}}),
        ),
        (
            "CreateTaskPushNotificationConfig",
            json!({"taskId": task_id, "url": "https://example.com/h"}),
        ),
        (
            "ListTaskPushNotificationConfigs",
            json!({"taskId": task_id}),
        ),
    ] {
        let reply = rpc(&b, method, params.clone()).await;
        assert_eq!(
            code(&reply, method),
            -32001,
            "{method} {params} by another tenant: {}",
            reply.body
        );
    }
    let listed = rpc(&b, "ListTasks", json!({})).await;
    assert_eq!(listed.body["result"]["tasks"], json!([]), "{}", listed.body);
    let listed = rpc(&a, "ListTasks", json!({})).await;
    assert_eq!(
        listed.body["result"]["tasks"][0]["id"], task_id,
        "{}",
        listed.body
    );
    let reply = b.get(&format!("/a2a/default/tasks/{task_id}")).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.body);

    // Another tenant's agent has no card and takes no message.
    let a_admin = create_key(&server, "a", "admin").await.client(&server);
    let agent = a_admin
        .post_json("/v1/agents", &json!({"name": "a-agent", "model": "mock"}))
        .await;
    let agent_id = agent.body["id"].as_str().unwrap_or_default().to_string();
    assert_eq!(agent.status, StatusCode::CREATED, "{}", agent.body);
    let card = b
        .get(&format!("/a2a/{agent_id}/.well-known/agent-card.json"))
        .await;
    assert_eq!(card.status, StatusCode::NOT_FOUND, "{}", card.body);
    let own_card = a
        .get(&format!("/a2a/{agent_id}/.well-known/agent-card.json"))
        .await;
    assert_eq!(own_card.status, StatusCode::OK, "{}", own_card.body);
    assert!(
        own_card.body["securitySchemes"]["bearer"].is_object(),
        "{}",
        own_card.body
    );
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": text_message("x")}});
    let reply = rpc_raw(&b, &agent_id, &body.to_string()).await;
    assert_eq!(
        code(&reply, "another tenant's agent"),
        -32001,
        "{}",
        reply.body
    );
    // Without a credential, nothing.
    let reply = rpc_raw(&server.anonymous(), "default", &body.to_string()).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{}", reply.body);

    // A session token reaches its own session's tasks, and nothing else.
    let token = session_token_of(&a, context_id, "interact", None).await;
    let scoped = server.with_bearer(token["token"].as_str().unwrap());
    let got = rpc(&scoped, "GetTask", json!({"id": task_id})).await;
    assert_eq!(got.body["result"]["id"], task_id, "{}", got.body);
    let next = rpc(
        &scoped,
        "SendMessage",
        json!({"message": {"messageId": "m", "contextId": context_id, "parts": [{"text": "again"}]}}),
    )
    .await;
    assert_eq!(
        next.body["result"]["task"]["contextId"], context_id,
        "{}",
        next.body
    );
    let listed = rpc(&scoped, "ListTasks", json!({})).await;
    assert_eq!(
        listed.body["result"]["tasks"].as_array().map(Vec::len),
        Some(2),
        "{}",
        listed.body
    );
    let other = send(&a, "another context").await;
    let reply = rpc(&scoped, "GetTask", json!({"id": other["id"]})).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
    let reply = rpc(
        &scoped,
        "SendMessage",
        json!({"message": text_message("a new context")}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
    let card = scoped.get("/.well-known/agent-card.json").await;
    assert_eq!(card.status, StatusCode::FORBIDDEN, "{}", card.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_resumed_from_any_frame_continues_exactly() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(2)).await;
    let stream = |path: &str, params: Value, last: Option<i64>| {
        let body =
            json!({"jsonrpc": "2.0", "id": 1, "method": "SubscribeToTask", "params": params});
        let mut request = server
            .request(Method::POST, path)
            .header("accept", "text/event-stream")
            .body(body.to_string());
        if let Some(last) = last {
            request = request.header("last-event-id", last.to_string());
        }
        request
    };
    let task = send(&server, "think: look around, then answer").await;
    let id = task["id"].as_str().unwrap();
    let whole = server
        .send(stream("/a2a/default", json!({"id": id}), None))
        .await;
    assert_eq!(whole.status, StatusCode::OK, "{}", whole.body);
    let ids = sse_ids(&whole.text());
    assert!(ids.len() >= 3, "{}", whole.text());
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    for (k, last) in ids.iter().enumerate() {
        let rest = server
            .send(stream("/a2a/default", json!({"id": id}), Some(*last)))
            .await;
        assert_eq!(sse_ids(&rest.text()), ids[k + 1..].to_vec(), "after {last}");
        // The HTTP+JSON binding resumes the same way.
        let rest = server
            .send(
                server
                    .request(Method::POST, &format!("/a2a/default/tasks/{id}:subscribe"))
                    .header("last-event-id", last.to_string()),
            )
            .await;
        assert_eq!(
            sse_ids(&rest.text()),
            ids[k + 1..].to_vec(),
            "REST after {last}"
        );
    }
    // Each frame's metadata carries the same seq as its id.
    for line in whole.text().lines().filter_map(|l| l.strip_prefix("data:")) {
        let frame: Value = serde_json::from_str(line.trim()).unwrap();
        let result = &frame["result"];
        let inner = result.as_object().unwrap().values().next().unwrap();
        assert!(
            ids.contains(&inner["metadata"]["tah_seq"].as_i64().unwrap()),
            "{frame}"
        );
    }
    let bad = server
        .send(stream("/a2a/default", json!({"id": id}), None).header("last-event-id", "x"))
        .await;
    assert_eq!(code(&bad, "a bad Last-Event-ID"), -32602, "{}", bad.body);
}
