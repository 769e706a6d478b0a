//! MCP tools called by the model: text answers, `isError` results, images and embedded
//! resources, over stdio and streamable HTTP; the default policy, which asks a human first;
//! and the environment a server runs with.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::fixture::serve_http;
use crate::support::TestServer;
use crate::{
    allow_all, call, config_args, model_calling, options, outcome, scratch, start, stdio_server,
    strs, wait_tool,
};

const READY: Duration = Duration::from_secs(20);

/// The calls every transport is checked with, as `(call id, tool, input)`.
fn calls_of(server: &str) -> Vec<crate::support::fakes::FakeToolCall> {
    let tool = |name: &str| format!("mcp__{server}__{name}");
    vec![
        call("echo", &tool("echo"), json!({"text": "hello over MCP"})),
        call(
            "fail",
            &tool("fail"),
            json!({"message": "the disk is on fire"}),
        ),
        call("image", &tool("image"), json!({})),
        call("resource", &tool("resource"), json!({})),
    ]
}

/// Checks what the calls of [`calls_of`] answered, as events and as the model saw them.
fn check_outcomes(events: &[Value], model_saw: &Value, server: &str) -> String {
    assert_eq!(
        outcome(events, "echo"),
        ("hello over MCP".to_string(), false)
    );
    let (failed, is_error) = outcome(events, "fail");
    assert!(is_error, "isError is a tool error: {failed}");
    assert!(failed.contains("the disk is on fire"), "{failed}");
    let (image, is_error) = outcome(events, "image");
    assert!(!is_error, "{image}");
    let (described, kept_at) = artifact_line(&image, "a transparent pixel\n");
    assert_eq!(
        described,
        format!("[image (image/png, {} bytes", crate::fixture::PNG.len()),
        "the image is described after the text: {image}"
    );
    assert!(
        kept_at.starts_with(&format!("mcp/{server}/image/")) && kept_at.ends_with("-1.png]"),
        "the line names the path the image is kept at: {image}"
    );
    let (resource, is_error) = outcome(events, "resource");
    assert!(!is_error, "{resource}");
    let (described, kept_at) = artifact_line(&resource, "");
    assert_eq!(
        described, "[resource memo://fixture/notes (text/plain, 24 bytes",
        "{resource}"
    );
    assert!(
        kept_at.starts_with(&format!("mcp/{server}/resource/"))
            && kept_at.ends_with("-1.txt]\nthe notes of the fixture"),
        "a text resource is described, named, and its text given: {resource}"
    );
    // The model is given what the events recorded.
    let results: Vec<&Value> = model_saw["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(results.len(), 4, "{model_saw}");
    let echoed = results
        .iter()
        .find(|m| m["tool_call_id"] == "echo")
        .expect("the echo result");
    assert_eq!(echoed["content"], "hello over MCP");
    let pictured = results
        .iter()
        .find(|m| m["tool_call_id"] == "image")
        .expect("the image result");
    assert_eq!(pictured["content"], image);
    image
}

/// An output `PREFIX[WHAT (TYPE, N bytes), artifact PATH]REST` split in two: `[WHAT (TYPE, N
/// bytes` and `PATH]REST`.
fn artifact_line<'a>(output: &'a str, prefix: &str) -> (&'a str, &'a str) {
    output
        .strip_prefix(prefix)
        .and_then(|line| line.split_once("), artifact "))
        .unwrap_or_else(|| panic!("no `, artifact PATH]` line after {prefix:?}: {output}"))
}

pub async fn text_errors_images_and_resources_over_stdio() {
    let (dir, _) = scratch();
    let policy = allow_all(dir.path());
    let model = model_calling(calls_of("local")).await;
    let mut args = config_args(dir.path(), json!({"local": stdio_server(json!({}))}));
    args.extend(["--tool-policy".into(), policy]);
    let server = start(&model, &strs(&args)).await;
    wait_tool(&server, "mcp__local__echo", true, READY).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "use the tools").await;
    assert_eq!(result["status"], "completed", "{result}");
    let image_output = check_outcomes(&server.events(&id).await, &model.body(1), "local");

    // The image and the resource are kept as the session's artifacts, the bytes as sent.
    let listed = server.get_ok(&format!("/v1/sessions/{id}/artifacts")).await;
    let artifacts = listed["data"].as_array().expect("artifacts");
    assert_eq!(artifacts.len(), 2, "{listed}");
    let image = artifacts
        .iter()
        .find(|a| a["media_type"] == "image/png")
        .unwrap_or_else(|| panic!("no image artifact: {listed}"));
    assert_eq!(image["size"], crate::fixture::PNG.len(), "{image}");
    let named = image_output
        .split_once(", artifact ")
        .and_then(|(_, rest)| rest.strip_suffix(']'))
        .expect("the output names the artifact");
    assert_eq!(image["path"], named, "the path the output named: {image}");
    let content = server
        .get(&format!(
            "/v1/sessions/{id}/artifacts/{}/content",
            image["id"].as_str().expect("id")
        ))
        .await;
    assert_eq!(content.status, reqwest::StatusCode::OK);
    assert_eq!(content.bytes.as_ref(), crate::fixture::PNG);
    assert!(
        artifacts
            .iter()
            .any(|a| a["media_type"] == "text/plain" && a["size"] == 24),
        "{listed}"
    );
}

/// An image larger than `--max-artifact-bytes` is not kept, and the call's output says so, with
/// its size and the limit; the model reads the same.
pub async fn an_image_over_the_artifact_limit_is_noted_in_the_output() {
    let (dir, _) = scratch();
    let policy = allow_all(dir.path());
    let model = model_calling(vec![
        call("big", "mcp__local__image", json!({"bytes": 5000})),
        call("small", "mcp__local__image", json!({})),
    ])
    .await;
    let mut args = config_args(dir.path(), json!({"local": stdio_server(json!({}))}));
    args.extend(["--tool-policy".into(), policy]);
    args.extend(["--max-artifact-bytes".into(), "1000".into()]);
    let server = start(&model, &strs(&args)).await;
    wait_tool(&server, "mcp__local__image", true, READY).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "draw").await;
    assert_eq!(result["status"], "completed", "{result}");
    let events = server.events(&id).await;
    let (output, is_error) = outcome(&events, "big");
    eprintln!("an image over the limit: {output:?}");
    assert!(!is_error, "{output}");
    assert!(output.starts_with("a transparent pixel\n"), "{output}");
    let note = output.lines().last().unwrap_or_default();
    assert!(note.contains("not kept"), "{output}");
    assert!(note.contains("5000 bytes"), "the size: {output}");
    assert!(note.contains("at most 1000 bytes"), "the limit: {output}");
    assert!(
        !note.contains("written"),
        "nothing was written anywhere: {output}"
    );
    let saw = model.body(1);
    let result = saw["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .find(|m| m["tool_call_id"] == "big")
        .cloned()
        .expect("the model got the result");
    assert_eq!(result["content"], output.as_str());
    // The small one is kept; the large one is not.
    let listed = server.get_ok(&format!("/v1/sessions/{id}/artifacts")).await;
    let artifacts = listed["data"].as_array().expect("artifacts");
    assert_eq!(artifacts.len(), 1, "{listed}");
    assert_eq!(artifacts[0]["size"], crate::fixture::PNG.len(), "{listed}");
}

/// An answer longer than one MCP message may be (16 MiB) fails its call at once, rather than
/// when the call's time is up. Over stdio the call's error says why, and the server goes on
/// answering other calls; over streamable HTTP, rmcp's client ends the stream that carried it.
pub async fn an_answer_over_16_mib_fails_the_call_at_once() {
    let web = serve_http(None).await;
    for (name, entry) in [
        ("local", stdio_server(json!({}))),
        ("web", json!({"type": "http", "url": web.url})),
    ] {
        let (dir, _) = scratch();
        let policy = allow_all(dir.path());
        let tool = |t: &str| format!("mcp__{name}__{t}");
        let model = model_calling(vec![
            call("huge", &tool("image"), json!({"bytes": 13 << 20})),
            call("after", &tool("echo"), json!({"text": "still here"})),
        ])
        .await;
        let mut args = config_args(dir.path(), json!({ name: entry }));
        args.extend(["--tool-policy".into(), policy]);
        args.extend(["--mcp-timeout-s".into(), "60".into()]);
        let server = start(&model, &strs(&args)).await;
        wait_tool(&server, &tool("image"), true, READY).await;
        let id = server.create_session().await;
        let began = Instant::now();
        let result = server.run_wait(&id, "draw big").await;
        let took = began.elapsed();
        assert_eq!(result["status"], "completed", "{name}: {result}");
        let events = server.events(&id).await;
        let (output, is_error) = outcome(&events, "huge");
        let after = outcome(&events, "after");
        eprintln!(
            "an answer over 16 MiB from {name}: the run took {took:?}; the call answered \
             {output:?}; the next call {after:?}"
        );
        assert!(is_error, "{name}: {output}");
        assert!(
            took < Duration::from_secs(15),
            "{name}: the call waited for its timeout: {took:?}"
        );
        if name == "local" {
            assert!(output.contains("16 MiB"), "{name}: {output}");
            assert_eq!(after, ("still here".to_string(), false), "{name}");
        }
    }
}

pub async fn calls_over_streamable_http() {
    let (dir, _) = scratch();
    let web = serve_http(None).await;
    let policy = allow_all(dir.path());
    let model = model_calling(calls_of("web")).await;
    let mut args = config_args(dir.path(), json!({"web": {"type": "http", "url": web.url}}));
    args.extend(["--tool-policy".into(), policy]);
    let server = start(&model, &strs(&args)).await;
    wait_tool(&server, "mcp__web__echo", true, READY).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "use the tools").await;
    assert_eq!(result["status"], "completed", "{result}");
    check_outcomes(&server.events(&id).await, &model.body(1), "web");
}

pub async fn an_mcp_tool_asks_for_approval_by_default() {
    let (dir, _) = scratch();
    let input = json!({"text": "may I?"});
    let model = model_calling(vec![call("e1", "mcp__local__echo", input.clone())]).await;
    let args = config_args(dir.path(), json!({"local": stdio_server(json!({}))}));
    let server = start(&model, &strs(&args)).await;
    wait_tool(&server, "mcp__local__echo", true, READY).await;
    let id = server.create_session().await;
    server.start_run(&id, "echo, if allowed").await;
    let pending = pending_approval(&server, &id).await;
    assert_eq!(pending["tool"], "mcp__local__echo", "{pending}");
    assert_eq!(pending["input"], input);
    assert_eq!(
        pending["subject"],
        input.to_string(),
        "the subject is the input's JSON"
    );
    let events = server.events(&id).await;
    assert!(
        events
            .iter()
            .all(|e| e["type"] != "tool.started" && e["type"] != "tool.finished"),
        "nothing ran before the answer"
    );
    let answer = server
        .post_json(
            &format!("/v1/sessions/{id}/approvals/e1"),
            &json!({"decision": "allow"}),
        )
        .await;
    assert_eq!(answer.status, reqwest::StatusCode::OK, "{}", answer.text());
    let ended = server
        .poll_session(&id, "completed", Duration::from_secs(15), |s| {
            s["state"] == "completed"
        })
        .await;
    assert_eq!(ended["state"], "completed");
    assert_eq!(
        outcome(&server.events(&id).await, "e1"),
        ("may I?".to_string(), false)
    );
}

async fn pending_approval(server: &TestServer, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let page = server.get_ok(&format!("/v1/sessions/{id}/approvals")).await;
        if let Some(first) = page["data"].as_array().and_then(|d| d.first()) {
            return first.clone();
        }
        assert!(Instant::now() < deadline, "no approval requested: {page}");
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// A server gets its configured `env` (with `${VAR}` from tah's environment) and the few
/// variables every server gets, never tah's own secrets.
pub async fn a_server_gets_its_env_and_not_tah_s() {
    let (dir, _) = scratch();
    let policy = allow_all(dir.path());
    let env = |id: &str, name: &str| call(id, "mcp__local__env", json!({"name": name}));
    let model = model_calling(vec![
        env("greeting", "GREETING"),
        env("key", "OPENAI_API_KEY"),
        env("path", "PATH"),
    ])
    .await;
    let mut args = config_args(
        dir.path(),
        json!({"local": stdio_server(json!({"GREETING": "hello ${TAH_TEST_MCP_NAME}"}))}),
    );
    args.extend(["--tool-policy".into(), policy]);
    // The binary: ${VAR} is read from the environment of tah's own process.
    let launch = options(&model, &strs(&args))
        .process()
        .env("TAH_TEST_MCP_NAME", "world");
    let server = TestServer::start(launch).await;
    wait_tool(&server, "mcp__local__env", true, READY).await;
    let id = server.create_session().await;
    assert_eq!(
        server.run_wait(&id, "read the env").await["status"],
        "completed"
    );
    let events = server.events(&id).await;
    assert_eq!(outcome(&events, "greeting").0, "hello world");
    assert_eq!(
        outcome(&events, "key").0,
        "<unset>",
        "tah's provider key stays in tah"
    );
    assert_ne!(outcome(&events, "path").0, "<unset>", "PATH is passed on");
}
