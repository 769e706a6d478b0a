//! MCP tool servers through HTTP: tools listed from real servers (stdio and streamable HTTP),
//! called by a scripted model, under the default policy (`ask`), narrowed per session; calls
//! that time out, are cancelled, or meet a server that crashes; a server that never answers its
//! handshake; a shutdown that leaves no process behind; and an agent's server given a vault
//! secret, which never shows in what is recorded; and another tah server as an MCP server
//! (its `/mcp`), whose `tah_run` runs a turn there.
//!
//! The servers are `fixture`, written with rmcp's server side. So that a stdio server needs no
//! other build, this suite has its own `main` (`harness = false`): started with
//! `TAH_MCP_FIXTURE` set, the binary is that server; otherwise it runs the tests listed below
//! with libtest-mimic, which takes the usual test flags (a name filter, `--ignored`,
//! `--nocapture`, …).

#[path = "../support/mod.rs"]
mod support;

mod agents;
mod calls;
mod fixture;
mod lifecycle;
mod listing;
mod npm;
mod overhead;
mod tah;
mod vaults;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Trial};
use serde_json::{json, Value};

pub use support::scripted::*;
use support::TestServer;

/// The tests named, as trials named `module::function`.
macro_rules! tests {
    ($($module:ident::$name:ident),* $(,)?) => {
        [$(test(concat!(stringify!($module), "::", stringify!($name)), $module::$name)),*]
    };
}

fn main() -> ExitCode {
    if let Some(served) = fixture::serve_if_asked() {
        return served;
    }
    let mut trials: Vec<Trial> = Vec::from(tests![
        listing::each_server_s_tools_are_listed_with_their_server,
        listing::a_session_gets_the_servers_it_chose,
        listing::unknown_servers_and_mcp_tool_names_are_refused,
        listing::a_server_s_changed_tools_are_listed_again,
        calls::text_errors_images_and_resources_over_stdio,
        calls::an_image_over_the_artifact_limit_is_noted_in_the_output,
        calls::an_answer_over_16_mib_fails_the_call_at_once,
        calls::calls_over_streamable_http,
        calls::an_mcp_tool_asks_for_approval_by_default,
        calls::a_server_gets_its_env_and_not_tah_s,
        lifecycle::a_call_that_takes_too_long_is_cancelled,
        lifecycle::cancelling_the_run_cancels_the_call,
        lifecycle::a_server_that_crashes_mid_call_is_restarted,
        lifecycle::a_server_that_never_answers_is_listed_unavailable,
        lifecycle::an_http_server_is_connected_when_it_comes_up_and_after_it_comes_back,
        lifecycle::shutdown_leaves_no_server_process,
        lifecycle::a_missing_variable_stops_the_start,
        agents::an_agent_s_own_server_serves_its_sessions_only,
        vaults::a_vault_secret_reaches_the_server_and_never_the_record,
        tah::another_tah_serves_its_agents_as_mcp_tools,
        tah::a_client_that_declares_tasks_gets_runs_as_tasks,
    ]);
    // The manual's example on the real server from npm, where it is installed (always in CI).
    let npm_missing = !npm::installed() && std::env::var_os("CI").is_none();
    trials.extend(
        tests![npm::the_filesystem_server_from_npm].map(|t| t.with_ignored_flag(npm_missing)),
    );
    // A measurement, not a check: `cargo test --test mcp -- --ignored --nocapture overhead`.
    trials.extend(tests![overhead::call_overhead_through_tah].map(|t| t.with_ignored_flag(true)));
    libtest_mimic::run(&Arguments::from_args(), trials).exit_code()
}

/// A test: an async function run to its end on a runtime of its own (a panic fails it).
fn test<F: Future<Output = ()> + 'static>(name: &str, body: fn() -> F) -> Trial {
    Trial::test(name, move || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| format!("a runtime: {e}"))?
            .block_on(body());
        Ok(())
    })
}

/// A stdio server entry for the fixture: this binary, with the fixture's variables and `env`.
pub fn stdio_server(env: Value) -> Value {
    let exe = std::env::current_exe().expect("this test binary");
    let mut vars = json!({ fixture::MODE: "stdio" });
    if let (Some(vars), Some(more)) = (vars.as_object_mut(), env.as_object()) {
        vars.extend(more.clone());
    }
    json!({"command": exe, "env": vars})
}

/// Writes `{"mcpServers": servers}` in `dir` and answers the flags that configure it.
pub fn config_args(dir: &Path, servers: Value) -> Vec<String> {
    let path = dir.join("mcp.json");
    std::fs::write(&path, json!({ "mcpServers": servers }).to_string()).expect("write mcp.json");
    vec!["--mcp-config".into(), path.display().to_string()]
}

/// The flags as the `&[&str]` the launcher takes.
pub fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// The names of the tools a model request offered.
pub fn offered(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// `GET /v1/tools`, the MCP tools only.
pub async fn mcp_tools(server: &TestServer) -> Vec<Value> {
    let listed = server.get_ok("/v1/tools").await;
    listed["data"]
        .as_array()
        .expect("a list")
        .iter()
        .filter(|t| t["source"] == "mcp")
        .cloned()
        .collect()
}

/// Waits until `name` is listed with `available` as given; answers its entry.
pub async fn wait_tool(
    server: &TestServer,
    name: &str,
    available: bool,
    within: Duration,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let tools = mcp_tools(server).await;
        if let Some(tool) = tools.iter().find(|t| t["name"] == name) {
            if tool["available"] == available {
                return tool.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{name} not listed with available={available} within {within:?}: {tools:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The lines of a fixture's record file (none if it was never written).
pub fn record(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Waits until the record file has `line`.
pub async fn wait_record(path: &Path, line: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while !record(path).iter().any(|l| l == line) {
        assert!(
            Instant::now() < deadline,
            "{} has no {line:?} within {within:?}: {:?}",
            path.display(),
            record(path)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The output of a call as recorded by `tool.finished`, and whether it was an error.
pub fn outcome(events: &[Value], call_id: &str) -> (String, bool) {
    let data = &finished(events, call_id)["data"];
    (
        data["output"].as_str().unwrap_or_default().to_string(),
        data["is_error"] == true,
    )
}

/// A temporary directory for configs and records, kept until the test ends.
pub fn scratch() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let record = dir.path().join("record.txt");
    (dir, record)
}
