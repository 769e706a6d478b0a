//! MCP servers and calls over their lives: a call past `--mcp-timeout-s` and a cancelled run
//! both reach the server as a cancellation; a server that crashes mid-call is restarted and
//! works again; a server that never answers its handshake is listed unavailable while the rest
//! of tah works; shutdown ends every server process, and what they started; a variable the
//! configuration needs and that is not set stops tah from starting.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::process::Command;

use crate::fixture::{serve_http_on, FAMILY, RECORD};
use crate::support::fakes::start_openai;
use crate::support::TestServer;
use crate::{
    allow_all, asks, call, config_args, mcp_tools, model_calling, options, outcome, record, says,
    scratch, start, stdio_server, strs, wait_record, wait_tool,
};

const READY: Duration = Duration::from_secs(20);

fn recording(record: &Path) -> serde_json::Value {
    stdio_server(json!({ RECORD: record }))
}

pub async fn a_call_that_takes_too_long_is_cancelled() {
    let (dir, record_file) = scratch();
    let policy = allow_all(dir.path());
    let model = model_calling(vec![call(
        "s1",
        "mcp__local__sleep",
        json!({"seconds": 30}),
    )])
    .await;
    let mut args = config_args(dir.path(), json!({"local": recording(&record_file)}));
    args.extend(["--tool-policy".into(), policy]);
    args.extend(["--mcp-timeout-s".into(), "1".into()]);
    let server = start(&model, &strs(&args)).await;
    wait_tool(&server, "mcp__local__sleep", true, READY).await;
    let id = server.create_session().await;
    let began = Instant::now();
    let result = server.run_wait(&id, "sleep long").await;
    assert_eq!(result["status"], "completed", "the model is told: {result}");
    assert!(
        began.elapsed() < Duration::from_secs(15),
        "{:?}",
        began.elapsed()
    );
    let (output, is_error) = outcome(&server.events(&id).await, "s1");
    assert!(is_error, "{output}");
    assert!(
        output.contains("mcp__local__sleep did not answer within 1 s; the call was cancelled"),
        "{output}"
    );
    wait_record(&record_file, "cancelled", Duration::from_secs(5)).await;
    assert_eq!(record(&record_file), ["started", "cancelled"]);
}

pub async fn cancelling_the_run_cancels_the_call() {
    let (dir, record_file) = scratch();
    let policy = allow_all(dir.path());
    let model = model_calling(vec![call(
        "s1",
        "mcp__local__sleep",
        json!({"seconds": 60}),
    )])
    .await;
    let mut args = config_args(dir.path(), json!({"local": recording(&record_file)}));
    args.extend(["--tool-policy".into(), policy]);
    let server = start(&model, &strs(&args)).await;
    wait_tool(&server, "mcp__local__sleep", true, READY).await;
    let id = server.create_session().await;
    server.start_run(&id, "sleep, then be cancelled").await;
    wait_record(&record_file, "started", Duration::from_secs(10)).await;
    server.cancel(&id).await;
    wait_record(&record_file, "cancelled", Duration::from_secs(5)).await;
    let session = server
        .poll_session(&id, "cancelled", Duration::from_secs(10), |s| {
            s["state"] == "cancelled"
        })
        .await;
    assert_eq!(session["state"], "cancelled");
    assert_eq!(record(&record_file), ["started", "cancelled"]);
}

pub async fn a_server_that_crashes_mid_call_is_restarted() {
    let (dir, record_file) = scratch();
    let policy = allow_all(dir.path());
    let model = start_openai(vec![
        asks(&[call("c1", "mcp__local__crash", json!({}))]),
        says("it crashed"),
        asks(&[call(
            "e1",
            "mcp__local__echo",
            json!({"text": "back again"}),
        )]),
        says("it works"),
    ])
    .await;
    let mut args = config_args(dir.path(), json!({"local": recording(&record_file)}));
    args.extend(["--tool-policy".into(), policy]);
    let server = start(&model, &strs(&args)).await;
    wait_tool(&server, "mcp__local__echo", true, READY).await;
    let id = server.create_session().await;
    assert_eq!(
        server.run_wait(&id, "crash it").await["status"],
        "completed"
    );
    let (output, is_error) = outcome(&server.events(&id).await, "c1");
    assert!(is_error, "{output}");
    assert!(
        output.contains("MCP server local closed the connection before mcp__local__crash answered"),
        "{output}"
    );
    assert_eq!(record(&record_file), ["crashing"]);
    wait_tool(&server, "mcp__local__echo", true, READY).await;
    assert_eq!(
        server.run_wait(&id, "try again").await["status"],
        "completed"
    );
    assert_eq!(
        outcome(&server.events(&id).await, "e1"),
        ("back again".to_string(), false)
    );
}

pub async fn a_server_that_never_answers_is_listed_unavailable() {
    let (dir, _) = scratch();
    let policy = allow_all(dir.path());
    let model = model_calling(vec![
        call("e1", "mcp__local__echo", json!({"text": "still here"})),
        call("l1", "list_files", json!({})),
    ])
    .await;
    let servers = json!({
        "local": stdio_server(json!({})),
        "mute": stdio_server(json!({ crate::fixture::MODE: "mute" })),
    });
    let mut args = config_args(dir.path(), servers);
    args.extend(["--tool-policy".into(), policy]);
    args.extend(["--mcp-handshake-timeout-s".into(), "1".into()]);
    let began = Instant::now();
    let server = start(&model, &strs(&args)).await;
    assert!(
        began.elapsed() < Duration::from_secs(10),
        "start-up waits a bounded time: {:?}",
        began.elapsed()
    );
    let mute = mcp_tools(&server)
        .await
        .into_iter()
        .find(|t| t["server"] == "mute")
        .expect("the mute server is listed");
    assert_eq!(mute["name"], "mcp__mute__*", "{mute}");
    assert_eq!(mute["available"], false);
    assert!(
        mute["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("MCP server mute"),
        "{mute}"
    );
    let deadline = Instant::now() + READY;
    loop {
        let mute = mcp_tools(&server)
            .await
            .into_iter()
            .find(|t| t["server"] == "mute")
            .expect("listed");
        let reason = mute["reason"].as_str().unwrap_or_default().to_string();
        if reason.contains("no answer to the MCP handshake within 1 s") {
            assert_eq!(mute["available"], false);
            break;
        }
        assert!(Instant::now() < deadline, "{mute}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_tool(&server, "mcp__local__echo", true, READY).await;
    let id = server.create_session().await;
    assert_eq!(server.run_wait(&id, "go on").await["status"], "completed");
    let events = server.events(&id).await;
    assert_eq!(outcome(&events, "e1"), ("still here".to_string(), false));
    assert!(!outcome(&events, "l1").1, "the built-in tools work");
    let offered = model.body(0)["tools"].to_string();
    assert!(!offered.contains("mcp__mute"), "never offered: {offered}");
}

/// Waits until the tools of `server` are listed unavailable for a reason that contains
/// `because`; answers the reason.
async fn wait_unavailable(server: &TestServer, name: &str, because: &str) -> String {
    let deadline = Instant::now() + READY;
    loop {
        let tools = mcp_tools(server).await;
        let theirs: Vec<_> = tools.iter().filter(|t| t["server"] == name).collect();
        let reasons: Vec<&str> = theirs
            .iter()
            .filter(|t| t["available"] == false)
            .filter_map(|t| t["reason"].as_str())
            .collect();
        if !theirs.is_empty() && reasons.len() == theirs.len() {
            if let Some(reason) = reasons.iter().find(|r| r.contains(because)) {
                return reason.to_string();
            }
        }
        assert!(
            Instant::now() < deadline,
            "{name} not unavailable because of {because:?}: {theirs:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// An HTTP server that is not up when tah starts is connected once it is (with its header,
/// `${VAR}` expanded); when it goes away its tools become unavailable, and when it is back
/// they work again. Each failure is logged.
pub async fn an_http_server_is_connected_when_it_comes_up_and_after_it_comes_back() {
    let (dir, _) = scratch();
    let policy = allow_all(dir.path());
    let addr = {
        let reserved = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        reserved.local_addr().expect("its address")
    };
    let model = start_openai(vec![
        asks(&[call("e1", "mcp__web__echo", json!({"text": "up"}))]),
        says("done"),
        asks(&[call("e2", "mcp__web__echo", json!({"text": "back"}))]),
        says("done"),
    ])
    .await;
    let web = json!({"type": "http", "url": format!("http://{addr}/mcp"),
                     "headers": {"Authorization": "Bearer ${TAH_TEST_MCP_TOKEN}"}});
    let mut args = config_args(dir.path(), json!({ "web": web }));
    args.extend(["--tool-policy".into(), policy]);
    let launch = options(&model, &strs(&args))
        .process()
        .env("TAH_TEST_MCP_TOKEN", "s3cret-token");
    let server = TestServer::start(launch).await;
    let reason = wait_unavailable(&server, "web", "the handshake with http://").await;
    assert!(reason.starts_with("MCP server web is "), "{reason}");
    assert!(
        !server.log_lines("MCP server failed to start").is_empty(),
        "{}",
        server.log_tail(20)
    );

    let fixture = serve_http_on(addr, None).await;
    wait_tool(&server, "mcp__web__echo", true, READY).await;
    let seen = fixture.authorizations.lock().expect("headers").clone();
    assert!(
        !seen.is_empty() && seen.iter().all(|h| h == "Bearer s3cret-token"),
        "{seen:?}"
    );
    let id = server.create_session().await;
    assert_eq!(server.run_wait(&id, "echo").await["status"], "completed");
    assert_eq!(
        outcome(&server.events(&id).await, "e1"),
        ("up".to_string(), false)
    );

    drop(fixture);
    wait_unavailable(&server, "web", "MCP server web").await;
    let stopped = server.log_lines("MCP server stopped");
    assert!(
        stopped.iter().any(|l| l.contains("did not answer a ping")),
        "{stopped:?}"
    );
    let _back = serve_http_on(addr, None).await;
    wait_tool(&server, "mcp__web__echo", true, READY).await;
    assert_eq!(server.run_wait(&id, "again").await["status"], "completed");
    assert_eq!(
        outcome(&server.events(&id).await, "e2"),
        ("back".to_string(), false)
    );
}

/// The pids of the processes whose environment has `TAH_MCP_FIXTURE_MARK=mark`.
fn marked(mark: &str) -> Vec<u32> {
    let needle = format!("TAH_MCP_FIXTURE_MARK={mark}");
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|b| *b == 0).any(|var| var == needle.as_bytes()))
                .unwrap_or(false)
        })
        .collect()
}

pub async fn shutdown_leaves_no_server_process() {
    let (dir, record_file) = scratch();
    let policy = allow_all(dir.path());
    let mark = uuid::Uuid::new_v4().to_string();
    let model = model_calling(vec![call(
        "s1",
        "mcp__local__sleep",
        json!({"seconds": 60}),
    )])
    .await;
    let servers = json!({
        // It starts a process of its own, which only the end of its group ends.
        "local": stdio_server(json!({
            FAMILY: "1", RECORD: record_file, "TAH_MCP_FIXTURE_MARK": mark,
        })),
        "mute": stdio_server(json!({
            crate::fixture::MODE: "mute", "TAH_MCP_FIXTURE_MARK": mark,
        })),
    });
    let mut args = config_args(dir.path(), servers);
    args.extend(["--tool-policy".into(), policy]);
    let mut server = TestServer::start(options(&model, &strs(&args)).process()).await;
    wait_tool(&server, "mcp__local__sleep", true, READY).await;
    let id = server.create_session().await;
    server.start_run(&id, "sleep through the shutdown").await;
    wait_record(&record_file, "started", Duration::from_secs(10)).await;
    let before = marked(&mark);
    assert!(
        before.len() >= 3,
        "the two servers and the local one's own process run: {before:?}"
    );
    let (status, took) = server.terminate(Duration::from_secs(20)).await;
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(12), "{took:?}");
    let deadline = Instant::now() + Duration::from_secs(3);
    while !marked(&mark).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        marked(&mark),
        Vec::<u32>::new(),
        "left behind, of {before:?}"
    );
}

pub async fn a_missing_variable_stops_the_start() {
    let (dir, _) = scratch();
    let args = config_args(
        dir.path(),
        json!({"gh": {"type": "http", "url": "https://127.0.0.1:9/mcp",
                      "headers": {"Authorization": "Bearer ${TAH_TEST_MCP_NEVER_SET}"}}}),
    );
    let output = Command::new(env!("CARGO_BIN_EXE_tah"))
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--provider", "mock"])
        .args(&args)
        .current_dir(dir.path())
        .env_remove("TAH_TEST_MCP_NEVER_SET")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run tah");
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(output.stdout.is_empty(), "no ready line");
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains(
            "server \"gh\": headers.Authorization uses ${TAH_TEST_MCP_NEVER_SET}, which is not set"
        ),
        "{said}"
    );
}
