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
mod routes;
mod sandbox_limits;
mod workspaces;

// The helpers of the tools suites, shared with the MCP suite.
pub use crate::support::scripted::*;

use serde_json::{json, Value};

use crate::support::TestServer;

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
