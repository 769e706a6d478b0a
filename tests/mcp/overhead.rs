//! What an MCP call costs through tah, printed, not asserted (`cargo test --test mcp --
//! --ignored --nocapture overhead`): the stdio fixture's handshake, one `echo` called straight
//! with rmcp, the same through tah's `McpTool`, and a call inside a run (from `tool.started`
//! to `tool.finished`: the call, its result and the events' commits).

use std::process::Stdio;
use std::time::{Duration, Instant};

use rmcp::model::CallToolRequestParams;
use rmcp::ServiceExt;
use serde_json::json;
use tah::mcp::{McpConfig, McpServers, McpSettings};
use tah::tools::{ToolContext, Workspace};

use crate::support::fakes::start_openai;
use crate::support::percentile;
use crate::{
    allow_all, asks, call, config_args, finished, says, scratch, start, stdio_server, strs,
    wait_tool,
};

const CALLS: usize = 300;
const RUNS: usize = 50;

fn summary(what: &str, samples: &mut [f64]) {
    samples.sort_by(f64::total_cmp);
    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
    println!(
        "{what:<44} n={:<4} mean {mean:>8.1} µs  p50 {:>8.1} µs  p99 {:>8.1} µs",
        samples.len(),
        percentile(samples, 50.0),
        percentile(samples, 99.0)
    );
}

fn micros(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e6
}

pub async fn call_overhead_through_tah() {
    let exe = std::env::current_exe().expect("this binary");

    // Straight: rmcp's client on the fixture's pipes.
    let mut child = tokio::process::Command::new(&exe)
        .env(crate::fixture::MODE, "stdio")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the fixture");
    let pipes = (
        child.stdout.take().expect("stdout"),
        child.stdin.take().expect("stdin"),
    );
    let began = Instant::now();
    let client = ().serve(pipes).await.expect("handshake");
    println!(
        "{:<44} {:>8.1} ms (process start included)",
        "handshake, straight",
        began.elapsed().as_secs_f64() * 1e3
    );
    let mut straight = Vec::new();
    for i in 0..CALLS {
        let mut params = CallToolRequestParams::new("echo");
        params.arguments = json!({"text": format!("n{i}")}).as_object().cloned();
        let began = Instant::now();
        client.call_tool(params).await.expect("echo");
        straight.push(micros(began));
    }
    summary("echo, straight with rmcp", &mut straight);
    drop(client);

    // Through tah's McpTool, as a run calls it (without the run).
    let config = McpConfig::parse(
        &json!({"mcpServers": {"local": stdio_server(json!({}))}}).to_string(),
        |_| None,
    )
    .expect("config");
    let began = Instant::now();
    let servers = McpServers::start(&config, McpSettings::default());
    servers.settle(Duration::from_secs(10)).await;
    println!(
        "{:<44} {:>8.1} ms (process start and tools/list included)",
        "handshake, through tah",
        began.elapsed().as_secs_f64() * 1e3
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let ctx = ToolContext::new(Workspace::open(dir.path()).expect("workspace"));
    let tools = servers.tools(None);
    let echo = tools
        .iter()
        .find(|t| t.name() == "mcp__local__echo")
        .expect("echo");
    let mut through = Vec::new();
    for i in 0..CALLS {
        let began = Instant::now();
        echo.call(&ctx, &json!({"text": format!("n{i}")}))
            .await
            .expect("echo");
        through.push(micros(began));
    }
    summary("echo, through tah's McpTool", &mut through);
    servers.shutdown().await;

    // Inside runs: from `tool.started` to `tool.finished` (the policy, the call, the result).
    let (dir, _) = scratch();
    let policy = allow_all(dir.path());
    let mut script = Vec::new();
    for i in 0..RUNS {
        let echo = call(&format!("e{i}"), "mcp__local__echo", json!({"text": "x"}));
        script.push(asks(&[echo]));
        script.push(says("done"));
    }
    let model = start_openai(script).await;
    let mut args = config_args(dir.path(), json!({"local": stdio_server(json!({}))}));
    args.extend(["--tool-policy".into(), policy]);
    let server = start(&model, &strs(&args)).await;
    wait_tool(&server, "mcp__local__echo", true, Duration::from_secs(20)).await;
    let at = |event: &serde_json::Value| {
        let text = event["created_at"].as_str().expect("a time");
        chrono::DateTime::parse_from_rfc3339(text).expect("RFC 3339")
    };
    let mut in_runs = Vec::new();
    for i in 0..RUNS {
        let id = server.create_session().await;
        server.run_wait(&id, "echo").await;
        let events = server.events(&id).await;
        let started = events
            .iter()
            .find(|e| e["type"] == "tool.started")
            .expect("started");
        let finished = finished(&events, &format!("e{i}"));
        let took = at(finished) - at(started);
        in_runs.push(took.num_microseconds().unwrap_or_default() as f64);
    }
    summary("echo in a run, tool.started to tool.finished", &mut in_runs);
}
