//! A server on the fake OpenAI-compatible model that scripts tool calls, and what the tools
//! suites (built-in tools, approvals, MCP) check of it.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::fakes::openai::{text_reply, tool_calls_reply};
use crate::support::fakes::{start_openai, FakeServer, FakeToolCall, Reply};
use crate::support::{ServerOptions, TestServer};

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
    let path = dir.join("allow-all.json");
    std::fs::write(&path, json!([{"tool": "*", "action": "allow"}]).to_string()).unwrap();
    path.display().to_string()
}
