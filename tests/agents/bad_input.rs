//! Refused agents and agent choices: each is a problem+json naming the field or the thing at
//! fault (400 for a bad agent, 422 for a session body whose `agent` is none of its three forms,
//! as for every session body that does not parse, 404 for an agent or version that does not
//! exist), and none of them creates or changes anything.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::*;

/// A valid agent body with `field` set to `value`.
fn with(field: &str, value: Value) -> Value {
    let mut body = json!({"name": "fine", "model": "mock"});
    body[field] = value;
    body
}

#[tokio::test]
async fn refused_agents_are_400_problems_naming_the_fault_and_create_nothing() {
    let server = TestServer::start(ServerOptions::new()).await;
    let existing = mock_agent(&server, "existing", "Existing.", &["list_files"]).await;
    let existing_id = id_of(&existing);
    // (what, body, names the detail may use for the fault)
    let cases: Vec<(&str, Value, Vec<&str>)> = vec![
        (
            "an unknown provider in model",
            with("model", json!("nowhere-provider/some-model")),
            vec!["nowhere-provider"],
        ),
        (
            "an unknown tool",
            with("tools", json!(["list_files", "teleport_tool"])),
            vec!["teleport_tool"],
        ),
        (
            "an unknown MCP server",
            with("mcp_servers", json!(["no-such-mcp-server"])),
            vec!["no-such-mcp-server"],
        ),
        (
            "an inline MCP server without a command or url",
            with("mcp_servers", json!([{"name": "broken"}])),
            vec!["mcp_servers", "broken"],
        ),
        (
            "an unknown subagents entry",
            with("subagents", json!(["nobody-by-that-name"])),
            vec!["nobody-by-that-name"],
        ),
        (
            "a tool_policy whose glob does not compile",
            with(
                "tool_policy",
                json!([{"tool": "read_[file", "action": "allow"}]),
            ),
            vec!["tool_policy", "read_[file"],
        ),
        (
            "a tool_policy with an unknown action",
            with(
                "tool_policy",
                json!([{"tool": "read_file", "action": "perhaps"}]),
            ),
            vec!["tool_policy", "perhaps"],
        ),
        (
            "an unknown field",
            with("favourite_colour", json!("blue")),
            vec!["favourite_colour"],
        ),
        ("an empty name", with("name", json!("")), vec!["name"]),
        ("no name", json!({"model": "mock"}), vec!["name"]),
        ("no model", json!({"name": "modelless"}), vec!["model"]),
        (
            "max_steps 0",
            with("max_steps", json!(0)),
            vec!["max_steps"],
        ),
        (
            "max_tokens 0",
            with("max_tokens", json!(0)),
            vec!["max_tokens"],
        ),
        (
            "a client tool without a name",
            with(
                "client_tools",
                json!([{"description": "x", "input_schema": {"type": "object"}}]),
            ),
            vec!["client_tools", "name"],
        ),
    ];
    let mut faults = Vec::new();
    for (what, body, names) in &cases {
        let reply = server.post_json("/v1/agents", body).await;
        faults.extend(refusal_fault(&reply, StatusCode::BAD_REQUEST, names, what));
        // The same body refused as an update changes nothing either.
        let mut change = body.clone();
        if let Some(fields) = change.as_object_mut() {
            fields.remove("name");
            fields.remove("model");
        }
        if change.as_object().is_some_and(|f| !f.is_empty()) {
            let reply = update_agent(&server, &existing_id, &change, None).await;
            let what = format!("update: {what}");
            faults.extend(refusal_fault(&reply, StatusCode::BAD_REQUEST, names, &what));
        }
    }
    let listed = server.get_ok("/v1/agents?include_archived=true").await;
    assert_eq!(
        listed["data"],
        json!([existing]),
        "a refused request created or changed an agent"
    );
    let versions = server
        .get_ok(&format!("/v1/agents/{existing_id}/versions"))
        .await;
    assert_eq!(versions["data"].as_array().map(Vec::len), Some(1));
    assert_no_faults(&faults);
}

#[tokio::test]
async fn unknown_and_malformed_agent_ids_are_404() {
    let server = TestServer::start(ServerOptions::new()).await;
    let agent = mock_agent(&server, "known", "Known.", &["list_files"]).await;
    let id = id_of(&agent);
    let unknown = uuid::Uuid::now_v7().to_string();
    for path in [
        format!("/v1/agents/{unknown}"),
        "/v1/agents/not-an-id".to_string(),
        "/v1/agents/0".to_string(),
        format!("/v1/agents/{unknown}/versions"),
        format!("/v1/agents/{unknown}/versions/1"),
        format!("/v1/agents/{id}/versions/2"),
        format!("/v1/agents/{id}/versions/0"),
    ] {
        server
            .get(&path)
            .await
            .expect_problem(StatusCode::NOT_FOUND, &format!("GET {path}"));
    }
    for path in [
        format!("/v1/agents/{unknown}"),
        "/v1/agents/nope".to_string(),
    ] {
        let reply = update_agent(
            &server,
            path.trim_start_matches("/v1/agents/"),
            &json!({"description": "x"}),
            None,
        )
        .await;
        reply.expect_problem(StatusCode::NOT_FOUND, &format!("POST {path}"));
        let reply = server.send(server.request(Method::DELETE, &path)).await;
        reply.expect_problem(StatusCode::NOT_FOUND, &format!("DELETE {path}"));
    }
    assert_eq!(server.get_ok("/v1/agents").await["data"], json!([agent]));
}

#[tokio::test]
async fn a_session_on_an_unknown_or_malformed_agent_is_refused_and_not_created() {
    let server = TestServer::start(ServerOptions::new()).await;
    let agent = mock_agent(&server, "real", "Real.", &["list_files"]).await;
    let id = id_of(&agent);
    let unknown = uuid::Uuid::now_v7().to_string();
    let cases: Vec<(Value, StatusCode, Vec<&str>)> = vec![
        (
            json!({"agent": unknown}),
            StatusCode::NOT_FOUND,
            vec![&unknown],
        ),
        (
            json!({"agent": {"id": unknown, "version": 1}}),
            StatusCode::NOT_FOUND,
            vec![&unknown],
        ),
        (
            json!({"agent": {"id": id, "version": 2}}),
            StatusCode::NOT_FOUND,
            vec!["version", "2"],
        ),
        (
            json!({"agent": {"id": id, "version": 0}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            vec!["version"],
        ),
        (
            json!({"agent": {"id": id, "version": "newest"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            vec!["version", "newest"],
        ),
        (
            json!({"agent": 7}),
            StatusCode::UNPROCESSABLE_ENTITY,
            vec!["agent"],
        ),
        (
            json!({"agent": {"version": 1}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            vec!["agent", "id"],
        ),
        (
            json!({"agent": {"id": id, "version": 1, "extra": true}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            vec!["extra", "agent"],
        ),
    ];
    let mut faults = Vec::new();
    for (body, status, names) in &cases {
        let what = format!("POST /v1/sessions {body}");
        let reply = server.post_json("/v1/sessions", body).await;
        faults.extend(refusal_fault(&reply, *status, names, &what));
    }
    // The session body may narrow the agent's tools, not widen them.
    let widened = json!({"agent": id, "tools": ["list_files", "shell"]});
    let reply = server.post_json("/v1/sessions", &widened).await;
    faults.extend(refusal_fault(
        &reply,
        StatusCode::BAD_REQUEST,
        &["shell", "tools"],
        "tools beyond the agent's",
    ));

    assert!(
        server.sessions().await.is_empty(),
        "a refused session was created"
    );
    assert_eq!(server.get_ok(&format!("/v1/agents/{id}")).await, agent);
    assert_no_faults(&faults);
}
