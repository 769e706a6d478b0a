//! Tools that do real work, through HTTP: the built-in tools called by a scripted model, the
//! policy, human approvals (every outcome, across a restart), the tools a client runs, the
//! routes that list tools and take answers, the artifacts the file tools leave, and the
//! workspace a session chooses.
//!
//! The model is the fake OpenAI-compatible server of `support::fakes`, which replies with the
//! tool calls a test scripts (and checks on every request that each call has its result);
//! `artifacts`, `artifact_storage` and `workspaces` drive the mock model, which writes and
//! edits on request.

mod approvals;
mod artifact_storage;
mod artifacts;
mod attacks;
mod builtin;
mod client;
mod egress;
mod routes;
mod sandbox_limits;
mod workspaces;

// The helpers of the tools suites, shared with the MCP suite.
pub use crate::support::scripted::*;

use serde_json::{json, Value};

use crate::support::fakes::{FakeServer, FakeToolCall};
use crate::support::{ServerOptions, TestServer};

/// A `--tool-policy` file in `dir` with `rules`; returns its path.
pub fn policy_file(dir: &std::path::Path, rules: Value) -> String {
    let path = dir.join("policy.json");
    std::fs::write(&path, rules.to_string()).unwrap();
    path.display().to_string()
}

/// A fake model that asks for `calls`, and the options of a server on it whose
/// `--tool-policy` file holds `rules`, with `args` besides. The policy file is in the
/// returned directory: keep it while the server runs.
pub async fn policed(
    rules: Value,
    calls: Vec<FakeToolCall>,
    args: &[&str],
) -> (tempfile::TempDir, FakeServer, ServerOptions) {
    let dir = tempfile::tempdir().unwrap();
    let policy = policy_file(dir.path(), rules);
    let model = model_calling(calls).await;
    let options = options(
        &model,
        &[&["--tool-policy", policy.as_str()], args].concat(),
    );
    (dir, model, options)
}

/// Waits up to `within` until session `id` has `n` pending approvals; returns them.
pub async fn pending_within(
    server: &TestServer,
    id: &str,
    n: usize,
    within: std::time::Duration,
) -> Vec<Value> {
    let deadline = std::time::Instant::now() + within;
    loop {
        let page = server.get_ok(&format!("/v1/sessions/{id}/approvals")).await;
        let data = page["data"].as_array().cloned().unwrap_or_default();
        if data.len() >= n {
            return data;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {n} pending approvals: {page}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    }
}

/// Answers the approval of call `call_id` of session `id` with `body`.
pub async fn answer(
    server: &TestServer,
    id: &str,
    call_id: &str,
    body: Value,
) -> crate::support::Reply {
    server
        .post_json(&format!("/v1/sessions/{id}/approvals/{call_id}"), &body)
        .await
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
