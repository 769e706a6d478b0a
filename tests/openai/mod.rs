//! OpenAI's face (`/openai/v1`) through HTTP only: every bad input is a 4xx in OpenAI's error
//! shape naming what is wrong, tenants and session tokens reach only what they may, and both
//! streams (a response's `starting_after`, an agent session's `Last-Event-ID`) resume exactly
//! after any event they sent.

use std::time::Duration;

use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::principals::{create_key, operated, session_token, OPERATOR};
use crate::support::*;

/// One SSE frame of the face: `id:`, `event:` and the JSON of `data:`.
#[derive(Debug, Clone, PartialEq)]
struct Frame {
    id: i64,
    event: String,
    data: Value,
}

/// The frames of a stream, until the response body ends or `stop` is true of a frame.
async fn frames(api: &Api, path: &str, last_event_id: Option<i64>, stop: &str) -> Vec<Frame> {
    let mut request = api.request(Method::GET, path);
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id.to_string());
    }
    let response = request.send().await.expect("send");
    assert_eq!(response.status(), StatusCode::OK, "GET {path}");
    let mut body = response.bytes_stream();
    let mut text = String::new();
    let mut out = Vec::new();
    loop {
        while let Some(at) = text.find("\n\n") {
            let block: String = text.drain(..at + 2).collect();
            let (mut id, mut event, mut data) = (None, String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id: ") {
                    id = v.parse::<i64>().ok();
                } else if let Some(v) = line.strip_prefix("event: ") {
                    event = v.to_string();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            let Some(id) = id else { continue }; // a heartbeat
            let data: Value = serde_json::from_str(&data).expect("a frame's data is JSON");
            let done = event == stop;
            out.push(Frame { id, event, data });
            if done {
                return out;
            }
        }
        match tokio::time::timeout(Duration::from_secs(10), body.next()).await {
            Ok(Some(Ok(chunk))) => text.push_str(&String::from_utf8_lossy(&chunk)),
            Ok(Some(Err(error))) => panic!("GET {path}: {error}"),
            Ok(None) => return out,
            Err(_) => panic!("GET {path}: no frame within 10 s after {out:?}"),
        }
    }
}

/// Asserts an answer is `status` with OpenAI's error object whose message mentions `names`.
#[track_caller]
fn assert_openai_error(reply: &Reply, status: StatusCode, names: &str, what: &str) {
    assert_eq!(reply.status, status, "{what}: {}", reply.text());
    let body = reply.json();
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        body["error"]["type"].is_string(),
        "{what}: not OpenAI's error shape: {body}"
    );
    assert!(
        message.contains(names),
        "{what}: the message does not name {names:?}: {message}"
    );
}

async fn send(api: &Api, method: Method, path: &str, body: Option<&Value>) -> Reply {
    let mut request = api.request(method, path);
    if let Some(body) = body {
        request = request.json(body);
    }
    api.send(request).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_4xx_in_openais_shape_that_names_it() {
    let server = TestServer::start(operated()).await;
    let api = server.with_bearer(OPERATOR);
    let ok = api
        .post_json("/openai/v1/responses", &json!({"input": "hello"}))
        .await
        .expect_json(StatusCode::OK, "a response");
    let id = ok["id"].as_str().unwrap().to_string();
    let responses = "/openai/v1/responses";
    let cases: Vec<(Method, String, Option<Value>, StatusCode, &str)> = vec![
        (
            Method::POST,
            responses.into(),
            Some(json!({"input": 5})),
            StatusCode::BAD_REQUEST,
            "input",
        ),
        (
            Method::POST,
            responses.into(),
            Some(json!({"input": "x", "frequency_penalty": 1})),
            StatusCode::BAD_REQUEST,
            "frequency_penalty",
        ),
        (
            Method::POST,
            responses.into(),
            Some(json!({"input": "x", "store": false})),
            StatusCode::BAD_REQUEST,
            "store",
        ),
        (
            Method::POST,
            responses.into(),
            Some(json!({"input": "x", "tool_choice": "required"})),
            StatusCode::BAD_REQUEST,
            "tool_choice",
        ),
        (
            Method::POST,
            responses.into(),
            Some(json!({"input": "x", "tools": [{"type": "file_search"}]})),
            StatusCode::BAD_REQUEST,
            "file_search",
        ),
        (
            Method::POST,
            responses.into(),
            Some(json!({"input": "x", "tools": [{"type": "function"}]})),
            StatusCode::BAD_REQUEST,
            "name",
        ),
        (
            Method::POST,
            responses.into(),
            Some(json!({"input": [{"role": "system", "content": "x"}]})),
            StatusCode::BAD_REQUEST,
            "instructions",
        ),
        (
            Method::POST,
            responses.into(),
            Some(json!({"input": [{"type": "input_image"}]})),
            StatusCode::BAD_REQUEST,
            "input_image",
        ),
        (
            Method::POST,
            responses.into(),
            Some(json!({"input": [{"role": "user", "content": [{"type": "input_file"}]}]})),
            StatusCode::BAD_REQUEST,
            "input_file",
        ),
        (
            Method::POST,
            responses.into(),
            Some(json!({"input": ""})),
            StatusCode::BAD_REQUEST,
            "empty",
        ),
        (
            Method::POST,
            responses.into(),
            Some(json!({})),
            StatusCode::BAD_REQUEST,
            "input",
        ),
        (
            Method::POST,
            responses.into(),
            Some(json!({"input": "x", "model": "nope/nope"})),
            StatusCode::BAD_REQUEST,
            "nope/nope",
        ),
        (
            Method::POST,
            responses.into(),
            Some(json!({"input": "x", "previous_response_id": id, "conversation": "conv_x"})),
            StatusCode::BAD_REQUEST,
            "not both",
        ),
        (
            Method::POST,
            responses.into(),
            Some(json!({"input": "x", "previous_response_id": "resp_garbage"})),
            StatusCode::NOT_FOUND,
            "resp_garbage",
        ),
        (
            Method::POST,
            responses.into(),
            Some(json!({"input": "x", "conversation": "conv_garbage"})),
            StatusCode::NOT_FOUND,
            "conv_garbage",
        ),
        (
            Method::POST,
            responses.into(),
            Some(json!({"input": "x", "previous_response_id": id, "instructions": "other"})),
            StatusCode::BAD_REQUEST,
            "instructions",
        ),
        (
            Method::POST,
            responses.into(),
            Some(
                json!({"previous_response_id": id, "input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]}),
            ),
            StatusCode::BAD_REQUEST,
            "nothing waits",
        ),
        (
            Method::POST,
            responses.into(),
            Some(
                json!({"previous_response_id": id, "input": [{"type": "mcp_approval_response", "approval_request_id": "nope", "approve": true}]}),
            ),
            StatusCode::BAD_REQUEST,
            "approval_request_id",
        ),
        (
            Method::GET,
            format!("{responses}/resp_x"),
            None,
            StatusCode::NOT_FOUND,
            "resp_x",
        ),
        (
            Method::GET,
            format!("{responses}/resp_{}{}1", "0".repeat(32), "f".repeat(32)),
            None,
            StatusCode::NOT_FOUND,
            "not found",
        ),
        (
            Method::GET,
            format!("{responses}/{id}?starting_after=3"),
            None,
            StatusCode::BAD_REQUEST,
            "stream",
        ),
        (
            Method::GET,
            format!("{responses}/{id}?colour=blue"),
            None,
            StatusCode::BAD_REQUEST,
            "colour",
        ),
        (
            Method::GET,
            format!("{responses}/{id}/input_items?limit=0"),
            None,
            StatusCode::BAD_REQUEST,
            "limit",
        ),
        (
            Method::GET,
            format!("{responses}/{id}/input_items?order=up"),
            None,
            StatusCode::BAD_REQUEST,
            "order",
        ),
        (
            Method::POST,
            format!("{responses}/resp_x/cancel"),
            None,
            StatusCode::NOT_FOUND,
            "resp_x",
        ),
        (
            Method::DELETE,
            format!("{responses}/resp_x"),
            None,
            StatusCode::NOT_FOUND,
            "resp_x",
        ),
        (
            Method::POST,
            "/openai/v1/agents/sessions".into(),
            Some(json!({})),
            StatusCode::BAD_REQUEST,
            "environment",
        ),
        (
            Method::POST,
            "/openai/v1/agents/sessions".into(),
            Some(json!({"environment": {"type": "self_hosted"}})),
            StatusCode::BAD_REQUEST,
            "remote workers",
        ),
        (
            Method::POST,
            "/openai/v1/agents/sessions".into(),
            Some(json!({"environment": {"type": "none"}, "agent_id": "nope"})),
            StatusCode::NOT_FOUND,
            "nope",
        ),
        (
            Method::POST,
            "/openai/v1/agents/sessions".into(),
            Some(json!({"environment": {"type": "none"}, "spend_control": {"limit": 1}})),
            StatusCode::BAD_REQUEST,
            "spend_control",
        ),
        (
            Method::GET,
            "/openai/v1/agents/sessions?order=asc".into(),
            None,
            StatusCode::BAD_REQUEST,
            "order",
        ),
        (
            Method::GET,
            "/openai/v1/agents/sessions/not-a-uuid".into(),
            None,
            StatusCode::NOT_FOUND,
            "not-a-uuid",
        ),
        (
            Method::GET,
            "/openai/v1/agents/not-an-agent".into(),
            None,
            StatusCode::NOT_FOUND,
            "not-an-agent",
        ),
        (
            Method::POST,
            "/openai/v1/agents".into(),
            Some(json!({"name": "x"})),
            StatusCode::BAD_REQUEST,
            "model",
        ),
        (
            Method::POST,
            "/openai/v1/agents".into(),
            Some(json!({"model": "mock", "reasoning": {"effort": "high"}})),
            StatusCode::BAD_REQUEST,
            "reasoning",
        ),
    ];
    for (method, path, body, status, names) in cases {
        let what = format!("{method} {path} {body:?}");
        let reply = send(&api, method, &path, body.as_ref()).await;
        assert_openai_error(&reply, status, names, &what);
    }
    // Malformed JSON and a session's bad events.
    let reply = api
        .send(
            api.request(Method::POST, responses)
                .header("content-type", "application/json")
                .body("{not json"),
        )
        .await;
    assert!(reply.status.is_client_error(), "{}", reply.text());
    assert!(
        reply.json()["error"]["message"].is_string(),
        "{}",
        reply.text()
    );
    let session = api
        .post_json(
            "/openai/v1/agents/sessions",
            &json!({"environment": {"type": "none"}}),
        )
        .await
        .expect_json(StatusCode::OK, "a session");
    let events = format!(
        "/openai/v1/agents/sessions/{}/events",
        session["id"].as_str().unwrap()
    );
    for (body, names) in [
        (json!({"events": []}), "empty"),
        (
            json!({"events": [{"type": "agent.session.input.nope"}]}),
            "agent.session.input.nope",
        ),
        (
            json!({"events": [{"type": "agent.session.input.tool_result", "call_id": "c1"}]}),
            "success",
        ),
        (
            json!({"events": [{"type": "agent.session.input.tool_result", "call_id": "c1", "success": true}]}),
            "c1",
        ),
        (
            json!({"events": [{"type": "agent.session.input.message", "input": [{"role": "assistant", "content": "x"}]}]}),
            "user",
        ),
    ] {
        let reply = api.post_json(&events, &body).await;
        assert_openai_error(&reply, StatusCode::BAD_REQUEST, names, &format!("{body}"));
    }
    let reply = api
        .send(
            api.request(Method::GET, &events)
                .header("last-event-id", "soon"),
        )
        .await;
    assert_openai_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "Last-Event-ID",
        "a bad Last-Event-ID",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_and_session_tokens_reach_only_their_own() {
    let server = TestServer::start(operated()).await;
    let operator = server.with_bearer(OPERATOR);
    let a = create_key(&operator, "a", "member").await.client(&server);
    let a2 = create_key(&operator, "a", "member").await.client(&server);
    let b = create_key(&operator, "b", "admin").await.client(&server);
    let response = a
        .post_json("/openai/v1/responses", &json!({"input": "mine"}))
        .await
        .expect_json(StatusCode::OK, "a's response");
    let id = response["id"].as_str().unwrap();
    let session = a
        .post_json(
            "/openai/v1/agents/sessions",
            &json!({"environment": {"type": "none"}}),
        )
        .await
        .expect_json(StatusCode::OK, "a's agent session");
    let sid = session["id"].as_str().unwrap();
    for other in [&b, &a2] {
        for (method, path, body) in [
            (Method::GET, format!("/openai/v1/responses/{id}"), None),
            (
                Method::GET,
                format!("/openai/v1/responses/{id}?stream=true"),
                None,
            ),
            (
                Method::GET,
                format!("/openai/v1/responses/{id}/input_items"),
                None,
            ),
            (
                Method::POST,
                format!("/openai/v1/responses/{id}/cancel"),
                None,
            ),
            (Method::DELETE, format!("/openai/v1/responses/{id}"), None),
            (
                Method::POST,
                "/openai/v1/responses".to_string(),
                Some(json!({"input": "x", "previous_response_id": id})),
            ),
            (
                Method::GET,
                format!("/openai/v1/agents/sessions/{sid}"),
                None,
            ),
            (
                Method::GET,
                format!("/openai/v1/agents/sessions/{sid}/events"),
                None,
            ),
            (
                Method::GET,
                format!("/openai/v1/agents/sessions/{sid}/items"),
                None,
            ),
            (
                Method::GET,
                format!("/openai/v1/agents/sessions/{sid}/turns"),
                None,
            ),
            (
                Method::POST,
                format!("/openai/v1/agents/sessions/{sid}/events"),
                Some(json!({"events": [{"type": "agent.session.input.cancel"}]})),
            ),
            (
                Method::DELETE,
                format!("/openai/v1/agents/sessions/{sid}"),
                None,
            ),
        ] {
            let reply = send(other, method.clone(), &path, body.as_ref()).await;
            assert_openai_error(
                &reply,
                StatusCode::NOT_FOUND,
                "not found",
                &format!("{method} {path}"),
            );
        }
        let listed = other.get_ok("/openai/v1/agents/sessions").await;
        assert!(
            !listed["data"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["id"] == sid),
            "another principal lists a's session: {listed}"
        );
    }
    // A session token reaches its own session's responses, and nothing else.
    let uuid = session_of(&response);
    let token = session_token(&a, &uuid, "read", None).await;
    let scoped = server.with_bearer(&token);
    scoped
        .get(&format!("/openai/v1/responses/{id}"))
        .await
        .expect_json(StatusCode::OK, "its own response");
    let reply = scoped
        .post_json(
            "/openai/v1/responses",
            &json!({"input": "x", "previous_response_id": id}),
        )
        .await;
    assert_openai_error(
        &reply,
        StatusCode::FORBIDDEN,
        "",
        "a read token runs nothing",
    );
    let other = a
        .post_json("/openai/v1/responses", &json!({"input": "other"}))
        .await
        .expect_json(StatusCode::OK, "another response");
    let reply = scoped
        .get(&format!(
            "/openai/v1/responses/{}",
            other["id"].as_str().unwrap()
        ))
        .await;
    assert_openai_error(
        &reply,
        StatusCode::FORBIDDEN,
        "own session",
        "another session's response",
    );
    let reply = scoped
        .post_json("/openai/v1/responses", &json!({"input": "new"}))
        .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.text());
    let reply = scoped.get("/openai/v1/agents/sessions").await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.text());
}

/// The tah session of a response's conversation (`conv_<hex>`).
fn session_of(response: &Value) -> String {
    let hex = response["conversation"]["id"]
        .as_str()
        .unwrap()
        .trim_start_matches("conv_");
    uuid::Uuid::try_parse(hex).unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_streams_resume_exactly_after_any_event() {
    let server = TestServer::start(operated().mock_delay_ms(5)).await;
    let api = server.with_bearer(OPERATOR);
    // A response with a tool call, reasoning and text.
    let started = api
        .post_json(
            "/openai/v1/responses",
            &json!({"input": "think: what is here?", "background": true}),
        )
        .await
        .expect_json(StatusCode::OK, "a background response");
    assert!(
        matches!(started["status"].as_str(), Some("queued" | "in_progress")),
        "{started}"
    );
    let path = format!(
        "/openai/v1/responses/{}?stream=true",
        started["id"].as_str().unwrap()
    );
    let whole = frames(&api, &path, None, "response.completed").await;
    assert!(whole.len() > 10, "{whole:?}");
    for (i, frame) in whole.iter().enumerate() {
        assert_eq!(frame.data["sequence_number"], json!(frame.id), "{frame:?}");
        assert_eq!(frame.data["type"], json!(frame.event), "{frame:?}");
        if i > 0 {
            assert!(whole[i - 1].id < frame.id, "ids increase: {whole:?}");
        }
        let rest = frames(
            &api,
            &format!("{path}&starting_after={}", frame.id),
            None,
            "response.completed",
        )
        .await;
        assert_eq!(rest, whole[i + 1..].to_vec(), "after {}", frame.id);
        let reconnected = frames(&api, &path, Some(frame.id), "response.completed").await;
        assert_eq!(reconnected, rest, "Last-Event-ID {}", frame.id);
    }
    // An agent session's turn.
    let session = api
        .post_json(
            "/openai/v1/agents/sessions",
            &json!({"environment": {"type": "none"}, "input": "think: and here?"}),
        )
        .await
        .expect_json(StatusCode::OK, "a session");
    let events = format!(
        "/openai/v1/agents/sessions/{}/events",
        session["id"].as_str().unwrap()
    );
    let whole = frames(&api, &events, Some(0), "agent.session.idle").await;
    assert!(whole.len() > 10, "{whole:?}");
    for (i, frame) in whole.iter().enumerate() {
        assert_eq!(
            frame.data["event_id"],
            json!(format!("evt_{}", frame.id)),
            "{frame:?}"
        );
        if i + 1 == whole.len() {
            break;
        }
        let rest = frames(&api, &events, Some(frame.id), "agent.session.idle").await;
        assert_eq!(rest, whole[i + 1..].to_vec(), "after {}", frame.id);
    }
}
