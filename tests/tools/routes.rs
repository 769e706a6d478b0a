//! The routes of tools and answers: what `GET /v1/tools` lists, what a session may choose at
//! creation, and bad input on every new route (a 4xx problem, nothing changed).

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::{ServerOptions, TestServer};

/// The names of a `GET /v1/tools` answer, in order.
fn tool_names(tools: &Value) -> Vec<&str> {
    tools["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect()
}

#[tokio::test]
async fn the_tool_list_says_what_a_new_session_gets() {
    let server = TestServer::start(ServerOptions::new()).await;
    let tools = server.get_ok("/v1/tools").await;
    let names = tool_names(&tools);
    for name in tah::model::BUILTIN_TOOLS {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    for tool in tools["data"].as_array().unwrap() {
        assert_eq!(tool["source"], "builtin", "{tool}");
        assert!(tool["input_schema"].is_object(), "{tool}");
        assert!(tool["available"].is_boolean(), "{tool}");
    }
    let narrowed =
        TestServer::start(ServerOptions::new().args(&["--tools", "list_files,read_file"])).await;
    let tools = narrowed.get_ok("/v1/tools").await;
    let names = tool_names(&tools);
    // `task` (sub-agents) is not a tool of the workspace: --max-subagent-depth governs it.
    assert_eq!(names, ["list_files", "read_file", "task"], "{tools}");
}

#[tokio::test]
async fn a_session_may_narrow_its_tools_but_not_name_unknown_ones() {
    let server = TestServer::start(ServerOptions::new()).await;
    let session = server
        .create_session_with(&json!({"tools": ["list_files"], "title": "narrow"}))
        .await;
    assert_eq!(session["tools"], json!(["list_files"]));
    let before = server.sessions().await.len();
    for body in [
        json!({"tools": ["list_files", "no_such_tool"]}),
        json!({"tool_policy": [{"tool": "[", "action": "deny"}]}),
        json!({"client_tools": [{"name": "read_file", "input_schema": {"type": "object"}}]}),
        json!({"client_tools": [{"name": "bad name!", "input_schema": {"type": "object"}}]}),
        json!({"client_tools": [{"name": "ok", "input_schema": "not a schema"}]}),
        json!({"client_tools": [{"name": "twice", "input_schema": {}}, {"name": "twice", "input_schema": {}}]}),
    ] {
        let reply = server.post_json("/v1/sessions", &body).await;
        reply.expect_problem(StatusCode::BAD_REQUEST, &body.to_string());
    }
    let reply = server
        .post_json(
            "/v1/sessions",
            &json!({"tool_policy": [{"tool": "x", "action": "maybe"}]}),
        )
        .await;
    assert!(reply.status.is_client_error(), "{}", reply.status);
    assert_eq!(server.sessions().await.len(), before);
}

#[tokio::test]
async fn bad_answers_are_4xx_problems_and_change_nothing() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    let approvals = format!("/v1/sessions/{id}/approvals/call_1");
    let results = format!("/v1/sessions/{id}/tool-results/call_1");
    let cases: Vec<(Method, String, Option<serde_json::Value>, StatusCode)> = vec![
        (
            Method::GET,
            format!("/v1/sessions/{id}/approvals"),
            None,
            StatusCode::OK,
        ),
        (
            Method::GET,
            "/v1/sessions/not-an-id/approvals".into(),
            None,
            StatusCode::NOT_FOUND,
        ),
        (
            Method::GET,
            format!("/v1/sessions/{id}/tool-results"),
            None,
            StatusCode::OK,
        ),
        (
            Method::GET,
            "/v1/sessions/not-an-id/tool-results".into(),
            None,
            StatusCode::NOT_FOUND,
        ),
        (
            Method::GET,
            format!("/v1/sessions/{}/tool-results", uuid::Uuid::now_v7()),
            None,
            StatusCode::NOT_FOUND,
        ),
        (
            Method::DELETE,
            format!("/v1/sessions/{id}/tool-results"),
            None,
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (
            Method::POST,
            approvals.clone(),
            Some(json!({"decision": "allow"})),
            StatusCode::NOT_FOUND,
        ),
        (
            Method::POST,
            approvals.clone(),
            Some(json!({"decision": "perhaps"})),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            Method::POST,
            approvals.clone(),
            Some(json!({})),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            Method::POST,
            approvals.clone(),
            Some(json!({"decision": "allow", "extra": 1})),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            Method::POST,
            approvals.clone(),
            Some(json!({"decision": "allow", "input": [1]})),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            Method::POST,
            results.clone(),
            Some(json!({"output": "x"})),
            StatusCode::NOT_FOUND,
        ),
        (
            Method::POST,
            results.clone(),
            Some(json!({"is_error": true})),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (
            Method::POST,
            format!("/v1/sessions/{}/approvals/c", uuid::Uuid::now_v7()),
            Some(json!({"decision": "deny"})),
            StatusCode::NOT_FOUND,
        ),
        (
            Method::DELETE,
            approvals.clone(),
            None,
            StatusCode::METHOD_NOT_ALLOWED,
        ),
    ];
    let events = server.events(&id).await.len();
    for (method, path, body, expected) in cases {
        let reply = server
            .call(method.clone(), &path, body.as_ref())
            .await
            .unwrap();
        assert_eq!(
            reply.status, expected,
            "{method} {path} {body:?}: {}",
            reply.body
        );
        if !expected.is_success() {
            crate::support::check_problem(&reply).unwrap_or_else(|e| panic!("{path}: {e}"));
        }
    }
    let reply = server
        .send(
            server
                .request(Method::POST, &approvals)
                .header("content-type", "text/plain")
                .body("allow"),
        )
        .await;
    assert_eq!(reply.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(server.events(&id).await.len(), events);
    assert_eq!(server.session(&id).await["state"], "idle");
}

#[tokio::test]
async fn a_client_tool_schema_must_be_a_json_schema_and_tools_are_kept_once() {
    let server = TestServer::start(ServerOptions::new()).await;
    let before = server.sessions().await.len();
    for (schema, problem) in [
        (json!({"type": 5}), "input_schema.type"),
        (json!({"type": "strin"}), "input_schema.type"),
        (
            json!({"type": "object", "properties": {"q": {"type": "string", "minLength": -1}}}),
            "input_schema.properties.q.minLength",
        ),
        (json!({"required": "q"}), "input_schema.required"),
        (json!({"anyOf": []}), "input_schema.anyOf"),
    ] {
        let body = json!({"client_tools": [{"name": "ask_user", "input_schema": schema}]});
        let reply = server.post_json("/v1/sessions", &body).await;
        let found = reply.expect_problem(StatusCode::BAD_REQUEST, &body.to_string());
        let detail = found["detail"].as_str().unwrap();
        assert!(detail.contains("ask_user"), "{detail}");
        assert!(detail.contains(problem), "{detail}");
    }
    assert_eq!(server.sessions().await.len(), before);
    // A tool named twice is kept once, where it came first; client tools may not repeat.
    let session = server
        .create_session_with(&json!({
            "tools": ["read_file", "list_files", "read_file", "list_files"],
            "client_tools": [{"name": "ask_user", "input_schema": {
                "type": "object", "properties": {"q": {"type": ["string", "null"]}}
            }}]
        }))
        .await;
    assert_eq!(session["tools"], json!(["read_file", "list_files"]));
    let id = session["id"].as_str().unwrap();
    assert_eq!(server.session(id).await["tools"], session["tools"]);
    let twice = json!({"client_tools": [
        {"name": "ask_user", "input_schema": {"type": "object"}},
        {"name": "ask_user", "input_schema": {"type": "object"}}
    ]});
    let problem = server
        .post_json("/v1/sessions", &twice)
        .await
        .expect_problem(StatusCode::BAD_REQUEST, "a client tool twice");
    assert!(problem["detail"].as_str().unwrap().contains("ask_user"));
}

#[tokio::test]
async fn the_tool_routes_refuse_query_parameters_they_do_not_take() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = server.create_session().await;
    let events = server.events(&id).await.len();
    for path in [
        "/v1/tools?limit=5".to_string(),
        format!("/v1/sessions/{id}/approvals?after=3"),
        format!("/v1/sessions/{id}/tool-results?cursor=x"),
    ] {
        let problem = server
            .get(&path)
            .await
            .expect_problem(StatusCode::BAD_REQUEST, &path);
        assert_eq!(problem["type"], "urn:tah:problem:bad-query", "{path}");
    }
    // `pending` is for a new run: a resume continues the run there is.
    let path = format!("/v1/sessions/{id}/resume?pending=deny");
    let problem = server
        .post_empty(&path)
        .await
        .expect_problem(StatusCode::BAD_REQUEST, &path);
    assert_eq!(problem["type"], "urn:tah:problem:bad-query");
    assert!(
        problem["detail"].as_str().unwrap().contains("pending"),
        "{problem}"
    );
    // A value `pending` does not take is refused where it is taken too.
    for path in [
        format!("/v1/sessions/{id}/resume?pending=bogus"),
        format!("/v1/sessions/{id}/resume?pending="),
        format!("/v1/sessions/{id}/runs?pending=bogus"),
        format!("/v1/sessions/{id}/runs?pending=DENY&wait=true"),
    ] {
        let reply = server.post_json(&path, &json!({"input": "hi"})).await;
        let problem = reply.expect_problem(StatusCode::BAD_REQUEST, &path);
        assert_eq!(problem["type"], "urn:tah:problem:bad-query", "{path}");
    }
    assert_eq!(server.events(&id).await.len(), events);
    // What the routes do take still works.
    let path = format!("/v1/sessions/{id}/resume?wait=true");
    let reply = server.post_empty(&path).await;
    crate::support::assert_conflict(&reply, "nothing to resume");
    assert_eq!(server.session(&id).await["state"], "idle");
}

#[tokio::test]
async fn a_client_tool_may_not_take_a_built_in_name_even_one_the_server_does_not_offer() {
    let server =
        TestServer::start(ServerOptions::new().args(&["--tools", "list_files,read_file"])).await;
    let before = server.sessions().await.len();
    for name in ["read_file", "shell", "write_file", "grep"] {
        let body = json!({"client_tools": [{"name": name, "input_schema": {"type": "object"}}]});
        let problem = server
            .post_json("/v1/sessions", &body)
            .await
            .expect_problem(StatusCode::BAD_REQUEST, name);
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.contains(name) && detail.contains("clashes"),
            "{detail}"
        );
    }
    // Nor may a session's narrowed set free one.
    let body = json!({
        "tools": ["list_files"],
        "client_tools": [{"name": "read_file", "input_schema": {"type": "object"}}]
    });
    server
        .post_json("/v1/sessions", &body)
        .await
        .expect_problem(StatusCode::BAD_REQUEST, "narrowed");
    assert_eq!(server.sessions().await.len(), before);
    let session = server
        .create_session_with(&json!({"client_tools": [
            {"name": "grep_notes", "input_schema": {"type": "object"}}
        ]}))
        .await;
    assert_eq!(
        session["client_tools"][0]["name"], "grep_notes",
        "{session}"
    );
}
