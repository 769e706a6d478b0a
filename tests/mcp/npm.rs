//! The manual's worked example against the real server from npm:
//! `@modelcontextprotocol/server-filesystem`, pinned in `tests/mcp/npm/package.json` and
//! installed beside it with `npm ci --prefix tests/mcp/npm` (CI does; this test installs
//! nothing). Started with `npx --no-install` from that directory, on a project directory given
//! as `${PROJECT}`; no policy file, so every call waits for a human's answer first; the mock
//! model, as in the manual, calls the tools its input names.
//!
//! Without the package the test is reported ignored, except under CI, where it fails saying
//! how to install it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::{ServerOptions, TestServer};
use crate::{config_args, outcome, scratch, strs, wait_tool};

/// Where the package is installed.
pub const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mcp/npm");

/// Whether `npm ci --prefix tests/mcp/npm` was run.
pub fn installed() -> bool {
    Path::new(DIR)
        .join("node_modules/.bin/mcp-server-filesystem")
        .exists()
}

pub async fn the_filesystem_server_from_npm() {
    assert!(
        installed(),
        "the manual's example server is not installed: run `npm ci --prefix tests/mcp/npm`"
    );
    let (dir, _) = scratch();
    let project: PathBuf = dir.path().join("project");
    std::fs::create_dir_all(&project).expect("the project directory");
    let project = project.canonicalize().expect("its real path");
    std::fs::write(project.join("notes.txt"), "ship on Friday\n").expect("notes");
    std::fs::write(project.join("pixel.png"), crate::fixture::PNG).expect("an image");
    let args = config_args(
        dir.path(),
        json!({"files": {
            "command": "npx",
            "args": ["--no-install", "mcp-server-filesystem", "${PROJECT}"],
            "cwd": DIR,
        }}),
    );
    // The mock model calls what an input names: "call `TOOL` with {…}".
    let launch = ServerOptions::new()
        .args(&["--provider", "mock"])
        .args(&strs(&args))
        .process()
        .env("PROJECT", &project.display().to_string());
    let server = TestServer::start(launch).await;
    let listed = wait_tool(
        &server,
        "mcp__files__read_text_file",
        true,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(listed["server"], "files");
    assert!(
        listed["input_schema"]["properties"]["path"].is_object(),
        "{listed}"
    );
    for line in server.log_lines("MCP server ready") {
        println!("{line}");
    }

    let id = server.create_session().await;
    let notes = json!({"path": project.join("notes.txt")});
    let (asked, text) = approved(&server, &id, "mcp__files__read_text_file", &notes).await;
    assert_eq!(asked["subject"], notes.to_string(), "{asked}");
    assert_eq!(text, "mcp__files__read_text_file answered: ship on Friday");

    let pixel = json!({"path": project.join("pixel.png")});
    let (_, text) = approved(&server, &id, "mcp__files__read_media_file", &pixel).await;
    let described = format!(
        "mcp__files__read_media_file answered: [image (image/png, {} bytes), artifact \
         mcp/files/read_media_file/",
        crate::fixture::PNG.len()
    );
    assert!(
        text.starts_with(&described) && text.ends_with("-1.png]"),
        "{text}"
    );

    let outside = json!({"path": "/etc/hostname"});
    let (asked, _) = approved(&server, &id, "mcp__files__read_text_file", &outside).await;
    let events = server.events(&id).await;
    let call_id = asked["call_id"].as_str().expect("a call id");
    let (refused, is_error) = outcome(&events, call_id);
    assert!(is_error, "outside its directory: {refused}");
    assert!(refused.contains("/etc/hostname"), "{refused}");
}

/// Runs "call `tool` with {input}", which waits for an approval as no rule says otherwise;
/// allows it and waits for the run's end. Answers the approval asked for and the run's text.
async fn approved(server: &TestServer, id: &str, tool: &str, input: &Value) -> (Value, String) {
    let run = server
        .start_run(id, &format!("Please call `{tool}` with {input}"))
        .await;
    let run_id = run["id"].as_str().expect("a run id").to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    let asked = loop {
        let page = server.get_ok(&format!("/v1/sessions/{id}/approvals")).await;
        if let Some(first) = page["data"].as_array().and_then(|d| d.first()) {
            break first.clone();
        }
        assert!(Instant::now() < deadline, "no approval asked for: {page}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        asked["tool"], tool,
        "no policy file: an MCP call asks first"
    );
    assert_eq!(&asked["input"], input);
    let call_id = asked["call_id"].as_str().expect("a call id");
    let answer = server
        .post_json(
            &format!("/v1/sessions/{id}/approvals/{call_id}"),
            &json!({"decision": "allow"}),
        )
        .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let session = server
        .poll_session(id, "completed", Duration::from_secs(30), |s| {
            s["last_run"]["id"] == run_id.as_str() && s["last_run"]["status"] == "completed"
        })
        .await;
    let text = session["last_run"]["text"].as_str().unwrap_or_default();
    (asked, text.to_string())
}
