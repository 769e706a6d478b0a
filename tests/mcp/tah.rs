//! One tah server as another's MCP server: the outer server's `--mcp-config` names the inner
//! one's `/mcp`, and the outer agent's `tah_run` call runs a turn of an agent on the inner
//! server; its answer comes back as the call's output.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::server::ServerOptions;
use crate::support::TestServer;
use crate::{allow_all, config_args, scratch, strs, wait_tool};

const READY: Duration = Duration::from_secs(20);

pub async fn another_tah_serves_its_agents_as_mcp_tools() {
    let inner = TestServer::start(ServerOptions::new().named("inner")).await;
    let (dir, _) = scratch();
    let mut args = config_args(
        dir.path(),
        json!({"inner": {"type": "http", "url": inner.url("/mcp")}}),
    );
    args.extend(["--tool-policy".into(), allow_all(dir.path())]);
    let outer = TestServer::start(ServerOptions::new().named("outer").args(&strs(&args))).await;
    for tool in ["tah_run", "tah_answer", "tah_sessions", "tah_session"] {
        wait_tool(&outer, &format!("mcp__inner__{tool}"), true, READY).await;
    }

    let id = outer.create_session().await;
    let input = r#"call `mcp__inner__tah_run` with {"input": "greetings from the outer tah"}"#;
    let result = outer.run_wait(&id, input).await;
    assert_eq!(result["status"], "completed", "{result}");

    // The inner server made one session for the call, ran the turn, and finished it.
    let listed = inner.get_ok("/v1/sessions").await;
    let sessions = listed["data"].as_array().expect("a list");
    assert_eq!(sessions.len(), 1, "{listed}");
    let inner_id = sessions[0]["id"].as_str().expect("an id").to_string();
    let inner_events = inner.events(&inner_id).await;
    let user = inner_events
        .iter()
        .find(|e| e["type"] == "user.message")
        .expect("the inner turn's input");
    assert_eq!(
        user["data"]["message"]["content"],
        "greetings from the outer tah"
    );
    let answer = inner_events
        .iter()
        .find(|e| e["type"] == "agent.finished")
        .expect("the inner run finished");
    let answer = answer["data"]["text"].as_str().expect("its text");

    // The outer call's output is the inner run's answer.
    let outer_events = outer.events(&id).await;
    let finished: Vec<&Value> = outer_events
        .iter()
        .filter(|e| e["type"] == "tool.finished")
        .collect();
    assert_eq!(finished.len(), 1, "{outer_events:?}");
    let output = finished[0]["data"]["output"].as_str().expect("text output");
    assert_eq!(finished[0]["data"]["is_error"], false, "{output}");
    assert!(output.contains(answer), "{output} does not carry {answer}");
}

/// A client that declares the tasks extension (SEP-2663, rmcp's own client here) gets
/// `tah_run` as a task: polled with `tasks/get`, its approval asked as an input request and
/// answered with `tasks/update`, its result in the completed task; `tasks/cancel` cancels a run.
pub async fn a_client_that_declares_tasks_gets_runs_as_tasks() {
    use rmcp::model::{
        CallToolRequestParams, CallToolResponse, CancelTaskParams, ClientCapabilities,
        ClientConfig, GetTaskParams, Implementation, ProtocolVersion, TaskPayload, TaskStatus,
        UpdateTaskParams,
    };
    use rmcp::service::{ClientLifecycleMode, ClientServiceExt};
    use rmcp::transport::StreamableHttpClientTransport;

    let inner = TestServer::start(ServerOptions::new().named("inner").mock_delay_ms(30)).await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let transport = StreamableHttpClientTransport::from_uri(inner.url("/mcp"));
    let info = ClientConfig::new(
        ClientCapabilities::builder().enable_tasks().build(),
        Implementation::new("tasks-test", "1.0.0"),
    );
    // The tasks extension belongs to the stateless protocol (`server/discover`, then requests
    // that carry the client's capabilities).
    let lifecycle = ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    };
    let client = info
        .serve_with_lifecycle(transport, lifecycle)
        .await
        .expect("the discovery");
    let caps = client
        .peer_info()
        .expect("the server's info")
        .capabilities
        .clone();
    assert!(caps.supports_tasks(), "{caps:?}");

    let start = |input: &str| {
        let arguments = json!({"input": input}).as_object().cloned();
        let mut params = CallToolRequestParams::new("tah_run");
        params.arguments = arguments;
        params
    };
    let poll = |task_id: String| {
        let client = &client;
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                let got = client
                    .get_task(GetTaskParams::new(task_id.clone()))
                    .await
                    .expect("tasks/get");
                if got.task.status() != TaskStatus::Working {
                    return got.task;
                }
                assert!(std::time::Instant::now() < deadline, "still working");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };

    // A run that asks for an approval: input_required, answered by tasks/update.
    let response = client
        .call_tool_once(start("write a note about tasks"))
        .await
        .expect("tools/call");
    let CallToolResponse::Task(created) = response else {
        panic!("not a task: {response:?}");
    };
    let task_id = created.task.task_id.clone();
    let (session_id, run_id) = task_id.split_once('.').expect("<session>.<run>");
    let waiting = poll(task_id.clone()).await;
    let TaskPayload::InputRequired { input_requests } = &waiting.payload else {
        panic!("not waiting for input: {waiting:?}");
    };
    let call_id = input_requests.keys().next().expect("one request").clone();
    let pending = inner
        .get_ok(&format!("/v1/sessions/{session_id}/approvals"))
        .await;
    assert_eq!(pending["data"][0]["call_id"], call_id.as_str(), "{pending}");
    let mut answers = rmcp::model::InputResponses::new();
    answers.insert(
        call_id.clone(),
        json!({"action": "accept", "content": {"decision": "allow"}}),
    );
    client
        .update_task(UpdateTaskParams::new(task_id.clone(), answers))
        .await
        .expect("tasks/update");
    let done = poll(task_id.clone()).await;
    let TaskPayload::Completed { result } = &done.payload else {
        panic!("not completed: {done:?}");
    };
    assert_eq!(
        result["structuredContent"]["status"], "completed",
        "{result:?}"
    );
    assert_eq!(result["structuredContent"]["run_id"], run_id);
    assert!(inner.workspace().join("notes.md").exists());

    // Another tenant's, or an unknown, task is not found.
    let unknown = client
        .get_task(GetTaskParams::new(format!("{session_id}.{session_id}")))
        .await;
    assert!(unknown.is_err(), "{unknown:?}");

    // tasks/cancel cancels the run.
    let response = client
        .call_tool_once(start("take a while, then answer"))
        .await
        .expect("tools/call");
    let CallToolResponse::Task(created) = response else {
        panic!("not a task: {response:?}");
    };
    client
        .cancel_task(CancelTaskParams::new(created.task.task_id.clone()))
        .await
        .expect("tasks/cancel");
    let cancelled = poll(created.task.task_id.clone()).await;
    assert_eq!(cancelled.status(), TaskStatus::Cancelled, "{cancelled:?}");
    let _ = client.cancel().await;
}
