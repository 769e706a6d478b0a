//! The README's worked example against the real server from npm:
//! `@modelcontextprotocol/server-filesystem`, pinned in `tests/mcp/npm/package.json` and
//! installed beside it with `npm ci --prefix tests/mcp/npm` (CI does; this test installs
//! nothing). Started with `npx --no-install` from that directory, on a project directory given
//! as `${PROJECT}`; no policy file, so every call waits for a human's answer first.
//!
//! Without the package the test is reported ignored, except under CI, where it fails saying
//! how to install it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::support::TestServer;
use crate::{call, config_args, model_calling, options, outcome, scratch, strs, wait_tool};

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
        "the README's example server is not installed: run `npm ci --prefix tests/mcp/npm`"
    );
    let (dir, _) = scratch();
    let project: PathBuf = dir.path().join("project");
    std::fs::create_dir_all(&project).expect("the project directory");
    let project = project.canonicalize().expect("its real path");
    std::fs::write(project.join("notes.txt"), "ship on Friday\n").expect("notes");
    std::fs::write(project.join("pixel.png"), crate::fixture::PNG).expect("an image");
    let path = |name: &str| project.join(name).display().to_string();
    let model = model_calling(vec![
        call(
            "notes",
            "mcp__files__read_text_file",
            json!({"path": path("notes.txt")}),
        ),
        call(
            "pixel",
            "mcp__files__read_media_file",
            json!({"path": path("pixel.png")}),
        ),
        call(
            "outside",
            "mcp__files__read_text_file",
            json!({"path": "/etc/hostname"}),
        ),
    ])
    .await;
    let args = config_args(
        dir.path(),
        json!({"files": {
            "command": "npx",
            "args": ["--no-install", "mcp-server-filesystem", "${PROJECT}"],
            "cwd": DIR,
        }}),
    );
    let launch = options(&model, &strs(&args))
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
    server.start_run(&id, "what do my notes say?").await;
    let pending = pending(&server, &id, 3).await;
    let mut asked: Vec<(&str, &str)> = pending
        .iter()
        .filter_map(|p| Some((p["call_id"].as_str()?, p["tool"].as_str()?)))
        .collect();
    asked.sort_unstable();
    assert_eq!(
        asked,
        [
            ("notes", "mcp__files__read_text_file"),
            ("outside", "mcp__files__read_text_file"),
            ("pixel", "mcp__files__read_media_file"),
        ],
        "no policy file: every MCP call asks first"
    );
    for call_id in ["notes", "pixel", "outside"] {
        let answer = server
            .post_json(
                &format!("/v1/sessions/{id}/approvals/{call_id}"),
                &json!({"decision": "allow"}),
            )
            .await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    }
    let ended = server
        .poll_session(&id, "completed", Duration::from_secs(30), |s| {
            s["state"] == "completed"
        })
        .await;
    assert_eq!(ended["state"], "completed", "{ended}");

    let events = server.events(&id).await;
    assert_eq!(
        outcome(&events, "notes"),
        ("ship on Friday\n".to_string(), false)
    );
    assert_eq!(
        outcome(&events, "pixel"),
        (
            format!("[image (image/png, {} bytes)]", crate::fixture::PNG.len()),
            false
        )
    );
    let (refused, is_error) = outcome(&events, "outside");
    assert!(is_error, "outside its directory: {refused}");
    assert!(refused.contains("/etc/hostname"), "{refused}");
}

/// Waits for `n` pending approvals of a session.
async fn pending(server: &TestServer, id: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let page = server.get_ok(&format!("/v1/sessions/{id}/approvals")).await;
        let data = page["data"].as_array().cloned().unwrap_or_default();
        if data.len() >= n {
            return data;
        }
        assert!(
            Instant::now() < deadline,
            "{n} approvals not requested: {page}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
