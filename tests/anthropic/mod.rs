//! The Claude Managed Agents face (`/anthropic`), black-box, beyond what the SDK tests cover:
//!
//! - bad input: every field tah cannot honour, and every wrong type, is a `400` in Anthropic's
//!   error object whose message names the field; never a `5xx`;
//! - tenants: another tenant's agent or session is `404 not_found_error` on every route;
//! - session tokens: `read` reads (the session, its events, its stream), `interact` also sends
//!   events, neither updates, archives or deletes, nor lists sessions;
//! - resume: the stream after `Last-Event-ID: n` is exactly the list's events after frame `n`.

use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::*;

const OPERATOR: &str = "anthropic-operator-token";

async fn key(server: &Api, tenant: &str, role: &str) -> Api {
    let made = server
        .with_bearer(OPERATOR)
        .post_json("/v1/keys", &json!({"tenant": tenant, "role": role}))
        .await
        .expect_json(StatusCode::CREATED, "POST /v1/keys");
    server.with_bearer(made["key"].as_str().expect("a key"))
}

async fn operated() -> TestServer {
    TestServer::start(ServerOptions::new().operator_token(OPERATOR)).await
}

/// Asserts Anthropic's error object with `status` and `kind`; returns its message.
#[track_caller]
fn assert_error(reply: &Reply, status: StatusCode, kind: &str, what: &str) -> String {
    assert_eq!(reply.status, status, "{what}: {}", reply.text());
    let body = reply.json();
    assert_eq!(body["type"], "error", "{what}: {body}");
    assert_eq!(body["error"]["type"], kind, "{what}: {body}");
    body["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: no message in {body}"))
        .to_string()
}

async fn new_session(api: &Api, agent: &str) -> String {
    let made = api
        .post_json(
            "/anthropic/v1/sessions",
            &json!({"agent": agent, "environment_id": "env_local"}),
        )
        .await
        .expect_json(StatusCode::OK, "create a session");
    made["id"].as_str().expect("an id").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_400_naming_the_field_never_a_5xx() {
    let server = operated().await;
    let api = key(&server, "acme", "admin").await;
    let session = new_session(&api, "default").await;
    let s = format!("/anthropic/v1/sessions/{session}");
    let cases: Vec<(Method, String, Option<Value>, &str)> = vec![
        (
            Method::POST,
            "/anthropic/v1/agents".into(),
            Some(json!({"model": "mock"})),
            "name",
        ),
        (
            Method::POST,
            "/anthropic/v1/agents".into(),
            Some(json!({"name": "a"})),
            "model",
        ),
        (
            Method::POST,
            "/anthropic/v1/agents".into(),
            Some(json!({"name": 1, "model": "mock"})),
            "name",
        ),
        (
            Method::POST,
            "/anthropic/v1/agents".into(),
            Some(json!({"name": "a", "model": "mock", "colour": "red"})),
            "colour",
        ),
        (
            Method::POST,
            "/anthropic/v1/agents".into(),
            Some(
                json!({"name": "a", "model": "mock", "skills": [{"type": "anthropic", "skill_id": "xlsx"}]}),
            ),
            "skills",
        ),
        (
            Method::POST,
            "/anthropic/v1/agents".into(),
            Some(
                json!({"name": "a", "model": "mock", "multiagent": {"type": "coordinator", "agents": []}}),
            ),
            "multiagent",
        ),
        (
            Method::POST,
            "/anthropic/v1/agents".into(),
            Some(
                json!({"name": "a", "model": "mock", "execution_identity": {"type": "aws_role", "role_arn": "x"}}),
            ),
            "execution_identity",
        ),
        (
            Method::POST,
            "/anthropic/v1/agents".into(),
            Some(json!({"name": "a", "model": {"id": "mock", "effort": "high"}})),
            "model.effort",
        ),
        (
            Method::POST,
            "/anthropic/v1/agents".into(),
            Some(json!({"name": "a", "model": 7})),
            "model",
        ),
        (
            Method::POST,
            "/anthropic/v1/agents".into(),
            Some(
                json!({"name": "a", "model": "mock", "tools": [{"type": "agent_toolset_20260401",
             "configs": [{"name": "web_search"}]}]}),
            ),
            "tools[0].configs[0].name",
        ),
        (
            Method::POST,
            "/anthropic/v1/agents".into(),
            Some(
                json!({"name": "a", "model": "mock", "tools": [{"type": "agent_toolset_20260401",
             "configs": [{"name": "bash", "permission_policy": {"type": "sometimes"}}]}]}),
            ),
            "tools[0].configs[0].permission_policy",
        ),
        (
            Method::POST,
            "/anthropic/v1/agents".into(),
            Some(json!({"name": "a", "model": "mock", "tools": [{"type": "computer"}]})),
            "tools[0].type",
        ),
        (
            Method::POST,
            "/anthropic/v1/agents".into(),
            Some(json!({"name": "a", "model": "mock", "tools": [{"type": "custom", "name": "x"}]})),
            "tools[0].input_schema",
        ),
        (
            Method::POST,
            "/anthropic/v1/agents".into(),
            Some(
                json!({"name": "a", "model": "mock", "mcp_servers": [{"name": "d", "type": "url"}]}),
            ),
            "mcp_servers[0].url",
        ),
        (
            Method::POST,
            "/anthropic/v1/agents".into(),
            Some(json!({"name": "a", "model": "mock", "metadata": {"k": 1}})),
            "metadata.k",
        ),
        (
            Method::POST,
            "/anthropic/v1/agents/default".into(),
            Some(json!({"version": "one"})),
            "version",
        ),
        (
            Method::POST,
            "/anthropic/v1/environments".into(),
            Some(json!({"name": "w", "config": {"type": "self_hosted"}})),
            "self_hosted",
        ),
        (
            Method::POST,
            "/anthropic/v1/environments".into(),
            Some(json!({"config": {"type": "cloud"}})),
            "name",
        ),
        (
            Method::POST,
            "/anthropic/v1/sessions".into(),
            Some(json!({"agent": "default"})),
            "environment_id",
        ),
        (
            Method::POST,
            "/anthropic/v1/sessions".into(),
            Some(json!({"environment_id": "env_local"})),
            "agent",
        ),
        (
            Method::POST,
            "/anthropic/v1/sessions".into(),
            Some(json!({"agent": "default", "environment_id": "env_local",
                     "budget": {"type": "limit", "max_list_cost": {"amount": "100", "currency": "USD"}}})),
            "budget",
        ),
        (
            Method::POST,
            "/anthropic/v1/sessions".into(),
            Some(json!({"agent": "default", "environment_id": "env_local",
                     "resources": [{"type": "github_repository", "url": "https://github.com/a/b"}]})),
            "resources",
        ),
        (
            Method::POST,
            "/anthropic/v1/sessions".into(),
            Some(json!({"agent": "default", "environment_id": "env_local", "vault_ids": ["v"]})),
            "vault_ids",
        ),
        (
            Method::POST,
            "/anthropic/v1/sessions".into(),
            Some(json!({"agent": "default", "environment_id": "env_local",
                     "initial_events": [{"type": "user.define_outcome", "description": "d",
                                         "rubric": {"type": "text", "content": "c"}}]})),
            "initial_events[0].type",
        ),
        (
            Method::POST,
            "/anthropic/v1/sessions".into(),
            Some(
                json!({"agent": {"type": "agent_with_overrides", "id": "default"}, "environment_id": "env_local"}),
            ),
            "agent.type",
        ),
        (
            Method::POST,
            "/anthropic/v1/sessions".into(),
            Some(
                json!({"agent": {"type": "agent", "id": "default", "version": 0}, "environment_id": "env_local"}),
            ),
            "agent.version",
        ),
        (
            Method::POST,
            "/anthropic/v1/sessions".into(),
            Some(json!({"agent": "default", "environment_id": "env_local", "title": 5})),
            "title",
        ),
        (
            Method::POST,
            "/anthropic/v1/sessions".into(),
            Some(
                json!({"agent": "default", "environment_id": "env_local", "metadata": {"k": true}}),
            ),
            "metadata.k",
        ),
        (
            Method::POST,
            s.clone(),
            Some(json!({"agent": {"tools": []}})),
            "agent",
        ),
        (
            Method::POST,
            s.clone(),
            Some(json!({"metadata": ["x"]})),
            "metadata",
        ),
        (
            Method::POST,
            format!("{s}/events"),
            Some(json!({})),
            "events",
        ),
        (
            Method::POST,
            format!("{s}/events"),
            Some(json!({"events": []})),
            "events",
        ),
        (
            Method::POST,
            format!("{s}/events"),
            Some(json!({"events": [{"type": "user.message", "content": "hi"}]})),
            "events[0].content",
        ),
        (
            Method::POST,
            format!("{s}/events"),
            Some(
                json!({"events": [{"type": "user.message", "content": [{"type": "document", "source": {"type": "text", "data": "x", "media_type": "text/plain"}}]}]}),
            ),
            "events[0].content[0].type",
        ),
        (
            Method::POST,
            format!("{s}/events"),
            Some(
                json!({"events": [{"type": "user.tool_confirmation", "tool_use_id": "c", "result": "maybe"}]}),
            ),
            "events[0].result",
        ),
        (
            Method::POST,
            format!("{s}/events"),
            Some(json!({"events": [{"type": "user.tool_confirmation", "result": "allow"}]})),
            "events[0].tool_use_id",
        ),
        (
            Method::POST,
            format!("{s}/events"),
            Some(
                json!({"events": [{"type": "user.custom_tool_result", "custom_tool_use_id": "c", "is_error": "no"}]}),
            ),
            "events[0].is_error",
        ),
        (
            Method::POST,
            format!("{s}/events"),
            Some(json!({"events": [{"type": "user.interrupt", "session_thread_id": "t"}]})),
            "events[0].session_thread_id",
        ),
        (
            Method::POST,
            format!("{s}/events"),
            Some(json!({"events": [{"type": "user.tool_result", "tool_use_id": "c"}]})),
            "events[0].type",
        ),
        (
            Method::POST,
            format!("{s}/events"),
            Some(json!({"events": [{"type": "agent.message"}]})),
            "events[0].type",
        ),
        (
            Method::GET,
            "/anthropic/v1/sessions?order=asc".into(),
            None,
            "order",
        ),
        (
            Method::GET,
            "/anthropic/v1/sessions?colour=red".into(),
            None,
            "colour",
        ),
        (
            Method::GET,
            "/anthropic/v1/sessions?limit=0".into(),
            None,
            "limit",
        ),
        (
            Method::GET,
            "/anthropic/v1/sessions?statuses[]=asleep".into(),
            None,
            "statuses",
        ),
        (
            Method::GET,
            "/anthropic/v1/agents?include_archived=maybe".into(),
            None,
            "include_archived",
        ),
        (
            Method::GET,
            "/anthropic/v1/agents/default?version=x".into(),
            None,
            "version",
        ),
        (Method::GET, format!("{s}/events?page=abc"), None, "page"),
        (
            Method::GET,
            format!("{s}/events?order=sideways"),
            None,
            "order",
        ),
        (
            Method::GET,
            format!("{s}/events?created_at[gte]=yesterday"),
            None,
            "created_at[gte]",
        ),
        (
            Method::GET,
            format!("{s}/events/stream?event_deltas[]=agent.tool_use"),
            None,
            "event_deltas",
        ),
    ];
    for (method, path, body, field) in cases {
        let what = format!("{method} {path} {}", body.clone().unwrap_or(Value::Null));
        let reply = api
            .call(method, &path, body.as_ref())
            .await
            .expect("an answer");
        assert!(reply.status.as_u16() < 500, "{what}: {}", reply.text());
        let message = assert_error(
            &reply,
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            &what,
        );
        assert!(
            message.contains(field),
            "{what}: the message names {field:?}: {message}"
        );
    }
    // A Last-Event-ID that is no frame id.
    let request = api
        .request(Method::GET, &format!("{s}/events/stream"))
        .header("last-event-id", "yesterday");
    let reply = api.send(request).await;
    let message = assert_error(
        &reply,
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        "Last-Event-ID",
    );
    assert!(message.contains("Last-Event-ID"), "{message}");
    // Bodies that are not JSON objects are 4xx too.
    let request = api
        .request(Method::POST, "/anthropic/v1/agents")
        .header("content-type", "application/json")
        .body("[1, 2]");
    let reply = api.send(request).await;
    assert!(reply.status.is_client_error(), "{}", reply.text());
    // Unknown things are 404s in their shape.
    for path in [
        "/anthropic/v1/environments/env_cloud".to_string(),
        "/anthropic/v1/agents/0190c0de-0000-7000-8000-000000000000".to_string(),
        "/anthropic/v1/sessions/0190c0de-0000-7000-8000-000000000000".to_string(),
    ] {
        let reply = api.get(&path).await;
        assert_error(&reply, StatusCode::NOT_FOUND, "not_found_error", &path);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_agents_and_sessions_are_not_found() {
    let server = operated().await;
    let mine = key(&server, "acme", "admin").await;
    let theirs = key(&server, "globex", "admin").await;
    let agent = mine
        .post_json(
            "/anthropic/v1/agents",
            &json!({"name": "private", "model": "mock"}),
        )
        .await
        .expect_json(StatusCode::OK, "create an agent");
    let agent = agent["id"].as_str().expect("an id").to_string();
    let session = new_session(&mine, &agent).await;
    let a = format!("/anthropic/v1/agents/{agent}");
    let s = format!("/anthropic/v1/sessions/{session}");
    let message =
        json!({"events": [{"type": "user.message", "content": [{"type": "text", "text": "hi"}]}]});
    let cases: Vec<(Method, String, Option<Value>)> = vec![
        (Method::GET, a.clone(), None),
        (Method::POST, a.clone(), Some(json!({"name": "mine now"}))),
        (Method::POST, format!("{a}/archive"), None),
        (Method::GET, format!("{a}/versions"), None),
        (
            Method::POST,
            "/anthropic/v1/sessions".into(),
            Some(json!({"agent": agent, "environment_id": "env_local"})),
        ),
        (Method::GET, s.clone(), None),
        (Method::POST, s.clone(), Some(json!({"title": "mine now"}))),
        (Method::DELETE, s.clone(), None),
        (Method::POST, format!("{s}/archive"), None),
        (Method::GET, format!("{s}/events"), None),
        (Method::POST, format!("{s}/events"), Some(message.clone())),
        (Method::GET, format!("{s}/events/stream"), None),
    ];
    for (method, path, body) in cases {
        let what = format!("{method} {path}");
        let reply = theirs
            .call(method, &path, body.as_ref())
            .await
            .expect("an answer");
        assert_error(&reply, StatusCode::NOT_FOUND, "not_found_error", &what);
    }
    let listed = theirs.get_ok("/anthropic/v1/sessions").await;
    assert!(
        !listed["data"]
            .as_array()
            .expect("data")
            .iter()
            .any(|s| s["id"] == session.as_str()),
        "{listed}"
    );
    let agents = theirs.get_ok("/anthropic/v1/agents").await;
    assert!(
        !agents["data"]
            .as_array()
            .expect("data")
            .iter()
            .any(|a| a["id"] == agent.as_str()),
        "{agents}"
    );
    // The owner still has both, unchanged.
    let kept = mine.get_ok(&s).await;
    assert_eq!(kept["title"], Value::Null, "{kept}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_tokens_read_or_interact_on_their_session_only() {
    let server = operated().await;
    let owner = key(&server, "acme", "member").await;
    let session = new_session(&owner, "default").await;
    let other = new_session(&owner, "default").await;
    let token = |scope: &'static str| scoped_token(&owner, &session, scope);
    let read = token("read").await;
    let interact = token("interact").await;
    let s = format!("/anthropic/v1/sessions/{session}");
    let message =
        json!({"events": [{"type": "user.message", "content": [{"type": "text", "text": "hi"}]}]});
    for api in [&read, &interact] {
        api.get_ok(&s).await;
        api.get_ok(&format!("{s}/events")).await;
        let request = api.request(Method::GET, &format!("{s}/events/stream"));
        let response = request.send().await.expect("a stream");
        assert_eq!(response.status(), StatusCode::OK);
        drop(response);
        for (method, path, body) in [
            (Method::POST, s.clone(), Some(json!({"title": "t"}))),
            (Method::POST, format!("{s}/archive"), None),
            (Method::DELETE, s.clone(), None),
            (Method::GET, "/anthropic/v1/sessions".to_string(), None),
            (Method::GET, format!("/anthropic/v1/sessions/{other}"), None),
            (Method::GET, "/anthropic/v1/agents".to_string(), None),
        ] {
            let what = format!("{method} {path}");
            let reply = api
                .call(method, &path, body.as_ref())
                .await
                .expect("an answer");
            assert_error(&reply, StatusCode::FORBIDDEN, "permission_error", &what);
        }
    }
    let reply = read.post_json(&format!("{s}/events"), &message).await;
    assert_error(
        &reply,
        StatusCode::FORBIDDEN,
        "permission_error",
        "read token sends",
    );
    interact
        .post_json(&format!("{s}/events"), &message)
        .await
        .expect_json(StatusCode::OK, "interact token sends a message");
    owner
        .poll_session(&session, "completed", Duration::from_secs(20), |s| {
            s["state"] == "completed"
        })
        .await;
}

/// A client that sends a new session token of `scope` for `session`, made by `owner`.
async fn scoped_token(owner: &Api, session: &str, scope: &str) -> Api {
    let made = owner
        .post_json(
            &format!("/v1/sessions/{session}/tokens"),
            &json!({"scope": scope}),
        )
        .await
        .expect_json(StatusCode::CREATED, "a session token");
    owner.with_bearer(made["token"].as_str().expect("a token"))
}

/// Reads a stream's frames (`id`, event) until one of type `last`.
async fn frames_until(
    api: &Api,
    path: &str,
    last_event_id: Option<i64>,
    last: &str,
) -> Vec<(i64, Value)> {
    let mut request = api
        .request(Method::GET, path)
        .timeout(Duration::from_secs(30));
    if let Some(id) = last_event_id {
        request = request.header("last-event-id", id.to_string());
    }
    let response = request.send().await.expect("a stream");
    assert_eq!(response.status(), StatusCode::OK);
    let mut events = response.bytes_stream().eventsource();
    let mut frames = Vec::new();
    while let Some(event) = tokio::time::timeout(Duration::from_secs(20), events.next())
        .await
        .expect("a frame in time")
    {
        let event = event.expect("a well-formed frame");
        let data: Value = serde_json::from_str(&event.data).expect("JSON data");
        assert_eq!(data["type"], event.event.as_str(), "event: is the type");
        let id: i64 = event.id.parse().expect("an integer id");
        let done = data["type"] == last;
        frames.push((id, data));
        if done {
            break;
        }
    }
    frames
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_resumes_exactly_after_its_last_event_id() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(2)).await;
    let api: &Api = &server;
    // A session made with a first message (`initial_events`) runs it at once.
    let made = api
        .post_json(
            "/anthropic/v1/sessions",
            &json!({"agent": "default", "environment_id": "env_local", "initial_events": [
                {"type": "user.message", "content": [{"type": "text", "text": "Please think about the README"}]},
            ]}),
        )
        .await
        .expect_json(StatusCode::OK, "create with initial_events");
    let session = made["id"].as_str().expect("an id").to_string();
    let s = format!("/anthropic/v1/sessions/{session}");
    api.poll_session(&session, "completed", Duration::from_secs(20), |s| {
        s["state"] == "completed"
    })
    .await;
    let listed = api.get_ok(&format!("{s}/events?limit=500")).await;
    let listed: Vec<Value> = listed["data"].as_array().expect("data").clone();
    let all = frames_until(
        api,
        &format!("{s}/events/stream"),
        Some(0),
        "session.status_idle",
    )
    .await;
    assert!(
        all.windows(2).all(|w| w[0].0 < w[1].0),
        "frame ids increase"
    );
    let streamed: Vec<&Value> = all.iter().map(|(_, e)| e).collect();
    assert_eq!(
        streamed,
        listed.iter().collect::<Vec<_>>(),
        "the stream from 0 is the list"
    );
    for cut in [1, all.len() / 2, all.len() - 2] {
        let after = all[cut].0;
        let rest = frames_until(
            api,
            &format!("{s}/events/stream"),
            Some(after),
            "session.status_idle",
        )
        .await;
        assert_eq!(rest, all[cut + 1..].to_vec(), "resumed after frame {after}");
    }
    // With deltas, the previews come between the same events, numbered among them.
    let with = frames_until(
        api,
        &format!("{s}/events/stream?event_deltas[]=agent.message&event_deltas[]=agent.thinking"),
        Some(0),
        "session.status_idle",
    )
    .await;
    assert!(
        with.windows(2).all(|w| w[0].0 < w[1].0),
        "frame ids increase"
    );
    let kinds: Vec<&str> = with
        .iter()
        .filter_map(|(_, e)| e["type"].as_str())
        .collect();
    assert!(
        kinds.contains(&"event_delta") && kinds.contains(&"event_start"),
        "{kinds:?}"
    );
    let events: Vec<(i64, Value)> = with
        .into_iter()
        .filter(|(_, e)| e["type"] != "event_start" && e["type"] != "event_delta")
        .collect();
    assert_eq!(events, all);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_updated_during_a_run_neither_undo_nor_are_undone_by_it() {
    let server = TestServer::start(ServerOptions::new().mock_delay_ms(20)).await;
    let id = server.create_session().await;
    server.start_run(&id, "look around").await;
    // Updates while the run records its progress: each writes the labels only, so the run's
    // state and usage are never set back to what they were when the update read them.
    let mut n = 0;
    loop {
        n += 1;
        let reply = server
            .post_json(
                &format!("/anthropic/v1/sessions/{id}"),
                &json!({"title": format!("title {n}"), "metadata": {"round": n.to_string()}}),
            )
            .await
            .expect_json(StatusCode::OK, "update the title");
        assert_eq!(reply["title"], format!("title {n}"));
        if server.session(&id).await["state"] == "completed" {
            break;
        }
        assert!(n < 1000, "the run did not complete");
    }
    assert!(n > 1, "the updates overlapped the run");
    let session = server
        .poll_session(&id, "completed", Duration::from_secs(10), |s| {
            s["state"] == "completed"
        })
        .await;
    assert_eq!(session["title"], format!("title {n}"), "{session}");
    assert_eq!(session["metadata"]["round"], n.to_string(), "{session}");
    assert!(
        session["usage"]["output_tokens"].as_u64() > Some(0),
        "{session}"
    );
    // A later run keeps them too.
    let done = server.run_wait(&id, "and again").await;
    assert_eq!(done["status"], "completed", "{done}");
    let session = server.session(&id).await;
    assert_eq!(session["title"], format!("title {n}"), "{session}");
}
