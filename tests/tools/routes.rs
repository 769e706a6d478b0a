//! The routes of tools and answers: what `GET /v1/tools` lists, what a session may choose at
//! creation, and bad input on every new route (a 4xx problem, nothing changed).

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::support::{ServerOptions, TestServer};

#[tokio::test]
async fn the_tool_list_says_what_a_new_session_gets() {
    let server = TestServer::start(ServerOptions::new()).await;
    let tools = server.get_ok("/v1/tools").await;
    let names: Vec<&str> = tools["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
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
    assert_eq!(tools["data"].as_array().unwrap().len(), 2, "{tools}");
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
