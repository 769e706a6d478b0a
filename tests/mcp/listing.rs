//! What `GET /v1/tools` lists of MCP servers, and the servers a session chooses with
//! `mcp_servers` (what the model is offered, what it can call, what is refused at creation).

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::fixture::serve_http;
use crate::support::fakes::start_openai;
use crate::support::{check_problem, ServerOptions, TestServer};
use crate::{
    allow_all, asks, call, config_args, mcp_tools, model_calling, offered, outcome, says, scratch,
    start, stdio_server, strs, wait_tool,
};

const READY: Duration = Duration::from_secs(20);

pub async fn each_server_s_tools_are_listed_with_their_server() {
    let (dir, _) = scratch();
    let web = serve_http(None).await;
    let mut args = config_args(
        dir.path(),
        json!({"local": stdio_server(json!({})), "web": {"type": "http", "url": web.url}}),
    );
    args.extend(["--tools".into(), "read_file".into()]);
    let server = TestServer::start(ServerOptions::new().args(&strs(&args))).await;
    for name in ["mcp__local__echo", "mcp__web__echo"] {
        wait_tool(&server, name, true, READY).await;
    }
    let listed = server.get_ok("/v1/tools").await;
    let tools = listed["data"].as_array().expect("a list");
    let builtin: Vec<&Value> = tools
        .iter()
        .filter(|t| t["source"] == "builtin" && t["name"] != "task")
        .collect();
    assert_eq!(builtin.len(), 1, "--tools still chooses the built-in tools");
    let echo = tools
        .iter()
        .find(|t| t["name"] == "mcp__local__echo")
        .expect("listed");
    assert_eq!(echo["source"], "mcp");
    assert_eq!(echo["server"], "local");
    assert_eq!(echo["available"], true);
    assert!(echo.get("reason").is_none(), "{echo}");
    assert_eq!(echo["description"], "Answers its text.");
    assert_eq!(
        echo["input_schema"],
        json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
    );
    let names = |server: &str| {
        let mut names: Vec<String> = tools
            .iter()
            .filter(|t| t["server"] == server)
            .map(|t| t["name"].as_str().unwrap_or_default().to_string())
            .collect();
        names.sort();
        names
    };
    let expected = |server: &str| {
        let mut names: Vec<String> = [
            "crash", "echo", "env", "fail", "grow", "image", "resource", "sleep",
        ]
        .iter()
        .map(|t| format!("mcp__{server}__{t}"))
        .collect();
        names.sort();
        names
    };
    assert_eq!(names("local"), expected("local"));
    assert_eq!(names("web"), expected("web"));
    assert_eq!(mcp_tools(&server).await.len(), 16);
}

pub async fn a_session_gets_the_servers_it_chose() {
    let (dir, _) = scratch();
    let web = serve_http(None).await;
    let policy = allow_all(dir.path());
    let calls = vec![
        call("l1", "mcp__local__echo", json!({"text": "from local"})),
        call("w1", "mcp__web__echo", json!({"text": "from web"})),
    ];
    let model = start_openai(vec![asks(&calls), says("done"), says("no tools")]).await;
    let mut args = config_args(
        dir.path(),
        json!({"local": stdio_server(json!({})), "web": {"type": "http", "url": web.url}}),
    );
    args.extend(["--tool-policy".into(), policy]);
    let server = start(&model, &strs(&args)).await;
    wait_tool(&server, "mcp__local__echo", true, READY).await;
    wait_tool(&server, "mcp__web__echo", true, READY).await;

    let session = server
        .create_session_with(&json!({"mcp_servers": ["web"]}))
        .await;
    assert_eq!(session["mcp_servers"], json!(["web"]), "{session}");
    let id = session["id"].as_str().expect("an id").to_string();
    assert_eq!(
        server.run_wait(&id, "echo twice").await["status"],
        "completed"
    );
    let events = server.events(&id).await;
    let (web_out, web_error) = outcome(&events, "w1");
    assert_eq!((web_out.as_str(), web_error), ("from web", false));
    let (local_out, local_error) = outcome(&events, "l1");
    assert!(local_error, "{local_out}");
    assert!(
        local_out.contains("unknown tool: mcp__local__echo"),
        "{local_out}"
    );
    let first = offered(&model.body(0));
    assert!(first.contains(&"mcp__web__echo".to_string()), "{first:?}");
    assert!(
        first.iter().all(|t| !t.starts_with("mcp__local")),
        "{first:?}"
    );
    assert!(first.contains(&"read_file".to_string()), "{first:?}");

    // A fork keeps the choice, and so does the session as stored.
    let fork = server
        .post_json(&format!("/v1/sessions/{id}/fork"), &json!({}))
        .await
        .expect_json(StatusCode::CREATED, "fork");
    assert_eq!(fork["mcp_servers"], json!(["web"]), "{fork}");
    let stored = server.get_ok(&format!("/v1/sessions/{id}")).await;
    assert_eq!(stored["mcp_servers"], json!(["web"]), "{stored}");

    // No servers at all: the built-in tools only.
    let none = server
        .create_session_with(&json!({"mcp_servers": []}))
        .await;
    let id = none["id"].as_str().expect("an id").to_string();
    server.run_wait(&id, "anything").await;
    let later = offered(&model.body(2));
    assert!(later.iter().all(|t| !t.starts_with("mcp__")), "{later:?}");
    assert!(later.contains(&"read_file".to_string()), "{later:?}");
}

pub async fn unknown_servers_and_mcp_tool_names_are_refused() {
    let (dir, _) = scratch();
    let model = model_calling(vec![]).await;
    let args = config_args(dir.path(), json!({"local": stdio_server(json!({}))}));
    let server = start(&model, &strs(&args)).await;
    let refused = |body: Value| {
        let server = &server;
        async move {
            let reply = server.post_json("/v1/sessions", &body).await;
            assert_eq!(
                reply.status,
                StatusCode::BAD_REQUEST,
                "{body}: {}",
                reply.text()
            );
            let problem = check_problem(&reply).expect("a problem");
            problem["detail"].as_str().unwrap_or_default().to_string()
        }
    };
    let detail = refused(json!({"mcp_servers": ["local", "nope"]})).await;
    assert!(
        detail.contains("nope") && detail.contains("it has local"),
        "{detail}"
    );
    let detail = refused(json!({"tools": ["read_file", "mcp__local__echo"]})).await;
    assert!(detail.contains("with mcp_servers"), "{detail}");
    let client = json!({"name": "mcp__local__mine", "description": "x",
                        "input_schema": {"type": "object"}});
    let detail = refused(json!({"client_tools": [client]})).await;
    assert!(detail.contains("clashes"), "{detail}");
    let reply = server
        .post_json("/v1/sessions", &json!({"mcp_servers": "local"}))
        .await;
    assert_eq!(
        reply.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        reply.text()
    );
}

/// A server that says its tools changed (`notifications/tools/list_changed`) has them listed
/// again: the new tool is listed, and a later run can call it.
pub async fn a_server_s_changed_tools_are_listed_again() {
    let (dir, _) = scratch();
    let policy = allow_all(dir.path());
    let model = start_openai(vec![
        asks(&[call("g1", "mcp__local__grow", json!({}))]),
        says("grown"),
        asks(&[call("x1", "mcp__local__extra", json!({}))]),
        says("done"),
    ])
    .await;
    let mut args = config_args(dir.path(), json!({"local": stdio_server(json!({}))}));
    args.extend(["--tool-policy".into(), policy]);
    let server = start(&model, &strs(&args)).await;
    wait_tool(&server, "mcp__local__grow", true, READY).await;
    let before = mcp_tools(&server).await;
    assert!(
        before.iter().all(|t| t["name"] != "mcp__local__extra"),
        "{before:?}"
    );
    let id = server.create_session().await;
    assert_eq!(server.run_wait(&id, "grow").await["status"], "completed");
    assert_eq!(
        outcome(&server.events(&id).await, "g1"),
        ("grown".to_string(), false)
    );
    let extra = wait_tool(&server, "mcp__local__extra", true, READY).await;
    assert_eq!(extra["description"], "Added by grow.");
    assert_eq!(mcp_tools(&server).await.len(), before.len() + 1);
    assert_eq!(server.run_wait(&id, "use it").await["status"], "completed");
    assert_eq!(
        outcome(&server.events(&id).await, "x1"),
        ("the extra tool".to_string(), false)
    );
}
