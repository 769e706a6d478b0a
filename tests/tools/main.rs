//! Tools that do real work, through HTTP: the built-in tools called by a scripted model, the
//! policy, human approvals (every outcome, across a restart), the tools a client runs, the
//! routes that list tools and take answers, the artifacts the file tools leave, and the
//! workspace a session chooses.
//!
//! The model is the fake OpenAI-compatible server of `support::fakes`, which replies with the
//! tool calls a test scripts (and checks on every request that each call has its result);
//! `artifacts`, `artifact_storage` and `workspaces` drive the mock model, which writes and
//! edits on request.

#[path = "../support/mod.rs"]
mod support;

mod approvals;
mod artifact_storage;
mod artifacts;
mod builtin;
mod client;
mod routes;
mod workspaces;

use std::time::Duration;

use serde_json::{json, Value};

use support::fakes::openai::{text_reply, tool_calls_reply};
use support::fakes::{start_openai, FakeServer, FakeToolCall, Reply};
use support::{ServerOptions, TestServer};

/// A tool call of the scripted model.
pub fn call(id: &str, name: &str, arguments: Value) -> FakeToolCall {
    FakeToolCall::new(id, name, &[&arguments.to_string()])
}

/// A reply of the scripted model that asks for `calls`.
pub fn asks(calls: &[FakeToolCall]) -> Reply {
    Reply::sse(tool_calls_reply("", calls))
}

/// A reply of the scripted model that says `text` and ends its turn.
pub fn says(text: &str) -> Reply {
    Reply::sse(text_reply(&[text]))
}

/// A fake model that asks for `calls` in its first reply, then answers "done" to every
/// later request.
pub async fn model_calling(calls: Vec<FakeToolCall>) -> FakeServer {
    start_openai(vec![asks(&calls), says("done")]).await
}

/// A server on the fake model with `args`.
pub fn options(model: &FakeServer, args: &[&str]) -> ServerOptions {
    ServerOptions::new()
        .args(&["--provider", "openai", "--base-url", &model.base_url])
        .args(&["--model", "fake", "--max-steps", "5"])
        .args(args)
        .env("OPENAI_API_KEY", "sk-tools-test-key")
        .paged_by(200)
}

pub async fn start(model: &FakeServer, args: &[&str]) -> TestServer {
    TestServer::start(options(model, args)).await
}

/// The `tool.finished` event of a call.
pub fn finished<'a>(events: &'a [Value], call_id: &str) -> &'a Value {
    events
        .iter()
        .find(|e| e["type"] == "tool.finished" && e["data"]["call_id"] == call_id)
        .unwrap_or_else(|| panic!("no tool.finished for {call_id}"))
}

/// The output of a call, from its `tool.finished` event.
pub fn output_of(events: &[Value], call_id: &str) -> String {
    finished(events, call_id)["data"]["output"]
        .as_str()
        .unwrap_or_else(|| panic!("the output of {call_id} is not text"))
        .to_string()
}

/// Waits until the session's run has ended (it neither runs nor waits for a tool); returns
/// the session.
pub async fn ended(server: &TestServer, id: &str) -> Value {
    server
        .poll_session(id, "ended", Duration::from_secs(15), |s| {
            !matches!(s["state"].as_str(), Some("running" | "waiting_tool"))
        })
        .await
}

/// A file under the server's workspace.
pub fn write(server: &TestServer, path: &str, content: &str) {
    let full = server.workspace().join(path);
    if let Some(parent) = full.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(full, content).unwrap();
}

/// Allows every tool (for tests of the tools themselves).
pub fn allow_all(dir: &std::path::Path) -> String {
    policy_file(dir, json!([{"tool": "*", "action": "allow"}]))
}

/// A `--tool-policy` file in `dir` with `rules`; returns its path.
pub fn policy_file(dir: &std::path::Path, rules: Value) -> String {
    let path = dir.join("policy.json");
    std::fs::write(&path, rules.to_string()).unwrap();
    path.display().to_string()
}

/// Kills the server with SIGKILL and starts it again on the same database, then waits until
/// the new process can take session `id` on: with PostgreSQL the dead process's lease holds
/// it until it lapses (`--lease-ttl-secs 1` in the tests), and until then every answer is a
/// `409 session-leased`. The probe, an answer to a call the session never made, changes
/// nothing.
pub async fn kill9_and_restart(server: &mut TestServer, id: &str) {
    server.kill9().await;
    server.restart().await;
    let probe = format!("/v1/sessions/{id}/approvals/no-such-call-probe");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let reply = server.post_json(&probe, &json!({"decision": "deny"})).await;
        if reply.status == reqwest::StatusCode::NOT_FOUND {
            return;
        }
        assert!(
            reply.status == reqwest::StatusCode::CONFLICT
                && reply.body["type"] == "urn:tah:problem:session-leased",
            "the probe after a restart: {} {}",
            reply.status,
            reply.body
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the dead process's lease never lapsed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
