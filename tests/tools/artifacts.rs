//! Artifacts through HTTP: what `write_file` and `edit_file` leave is kept with the session as
//! numbered versions of a path, listed, described and downloaded under its own name;
//! `--max-artifact-bytes`. How they are stored is in `artifact_storage`.
//!
//! The model is the mock (`src/llm/mock.rs`): "write a note to `PATH`: …" makes it call
//! `write_file` with the whole input as content, and "edit the note: replace `OLD` with `NEW`
//! in `PATH`" makes it call `edit_file`. Session rules let the file tools run unasked.

use reqwest::header::{
    CACHE_CONTROL, CONTENT_DISPOSITION, CONTENT_TYPE, ETAG, IF_NONE_MATCH, X_CONTENT_TYPE_OPTIONS,
};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::support::*;
use crate::tools::output_of;

/// The input that makes the mock write `text` to `path`.
pub fn write_note(path: &str, text: &str) -> String {
    format!("write a note to `{path}`: {text}")
}

/// What the file holds after [`write_note`] (the mock writes its whole input, and a newline).
pub fn note_content(path: &str, text: &str) -> String {
    format!("{}\n", write_note(path, text))
}

/// The input that makes the mock replace `old` with `new` in `path`.
pub fn edit_note(path: &str, old: &str, new: &str) -> String {
    format!("edit the note: replace `{old}` with `{new}` in `{path}`")
}

/// A session whose rules let the file tools run without asking, created with `body`.
pub async fn file_session(server: &TestServer, mut body: Value) -> String {
    body["tool_policy"] = json!([{"tool": "*_file", "action": "allow"}]);
    id_of(&server.create_session_with(&body).await)
}

/// A run that must complete.
pub async fn turn(server: &TestServer, id: &str, input: &str) -> Value {
    let result = server.run_wait(id, input).await;
    assert_eq!(result["status"], "completed", "{input}: {result}");
    result
}

/// Every artifact of a session the list gives with `query` (`""`, `"?all=true"`), read page
/// by page.
pub async fn artifacts(server: &TestServer, id: &str, query: &str) -> Vec<Value> {
    server
        .all_pages(&format!("/v1/sessions/{id}/artifacts{query}"), "cursor", 2)
        .await
}

pub fn versions(list: &[Value]) -> Vec<(String, i64)> {
    list.iter()
        .map(|a| {
            (
                a["path"].as_str().unwrap_or_default().to_string(),
                a["version"].as_i64().unwrap_or_default(),
            )
        })
        .collect()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn header(reply: &Reply, name: reqwest::header::HeaderName) -> String {
    reply
        .headers
        .get(&name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no {name} header: {:?}", reply.headers))
        .to_string()
}

pub async fn content(server: &TestServer, id: &str, artifact: &Value) -> Reply {
    server
        .get(&format!(
            "/v1/sessions/{id}/artifacts/{}/content",
            id_of(artifact)
        ))
        .await
}

/// How many distinct contents the database holds.
pub async fn blobs(server: &TestServer) -> i64 {
    server.query_i64("SELECT COUNT(*) FROM blobs").await
}

#[tokio::test]
async fn write_file_and_edit_file_results_are_versioned_artifacts() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = file_session(&server, json!({})).await;
    let runs = [
        turn(&server, &id, &write_note("docs/plan.md", "first draft")).await,
        turn(&server, &id, &edit_note("docs/plan.md", "first", "second")).await,
        turn(&server, &id, &write_note("other.txt", "x")).await,
    ];
    let v1 = note_content("docs/plan.md", "first draft");
    let v2 = v1.replace("first", "second");
    let other = note_content("other.txt", "x");
    assert_eq!(
        std::fs::read_to_string(server.workspace().join("docs/plan.md")).unwrap(),
        v2
    );

    let all = artifacts(&server, &id, "?all=true").await;
    assert_eq!(
        versions(&all),
        [
            ("docs/plan.md".to_string(), 1),
            ("docs/plan.md".to_string(), 2),
            ("other.txt".to_string(), 1)
        ],
        "{all:?}"
    );
    let newest = artifacts(&server, &id, "").await;
    assert_eq!(newest, [all[1].clone(), all[2].clone()], "newest per path");
    assert_eq!(artifacts(&server, &id, "?all=false").await, newest);

    let events = server.events(&id).await;
    let created: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "artifact.created")
        .collect();
    assert_eq!(created.len(), 3, "{}", describe(&events));
    for (artifact, (bytes, run, media_type)) in all.iter().zip([
        (&v1, &runs[0], "text/markdown; charset=utf-8"),
        (&v2, &runs[1], "text/markdown; charset=utf-8"),
        (&other, &runs[2], "text/plain; charset=utf-8"),
    ]) {
        let what = artifact.to_string();
        assert_eq!(artifact["size"], bytes.len(), "{what}");
        assert_eq!(artifact["sha256"], sha256_hex(bytes.as_bytes()), "{what}");
        assert_eq!(artifact["media_type"], media_type, "{what}");
        assert_eq!(artifact["run_id"], run["run_id"], "{what}");
        assert!(artifact["created_at"].is_string(), "{what}");
        // Announced with the very record the list serves, right after its call's outcome.
        let event = created
            .iter()
            .find(|e| e["data"]["artifact"]["id"] == artifact["id"])
            .unwrap_or_else(|| panic!("no artifact.created for {what}"));
        assert_eq!(&event["data"]["artifact"], artifact);
        let before = events
            .iter()
            .find(|e| e["seq"] == event["seq"].as_i64().unwrap() - 1)
            .expect("the event before artifact.created");
        assert_eq!(before["type"], "tool.finished", "{}", describe(&events));
        assert_eq!(before["data"]["step_id"], artifact["step_id"], "{what}");
        assert_eq!(before["data"]["is_error"], false);

        let path = format!("/v1/sessions/{id}/artifacts/{}", id_of(artifact));
        assert_eq!(&server.get_ok(&path).await, artifact, "its metadata");
        let reply = content(&server, &id, artifact).await;
        assert_eq!(reply.status, StatusCode::OK, "{what}: {}", reply.text());
        assert_eq!(reply.text(), *bytes, "{what}: the bytes of that version");
        assert_eq!(header(&reply, CONTENT_TYPE), media_type);
        let etag = format!("\"{}\"", artifact["sha256"].as_str().unwrap());
        assert_eq!(header(&reply, ETAG), etag);
        assert_eq!(header(&reply, X_CONTENT_TYPE_OPTIONS), "nosniff");
        assert_eq!(header(&reply, CACHE_CONTROL), "private, no-cache");
        let name = artifact["path"]
            .as_str()
            .unwrap()
            .rsplit('/')
            .next()
            .unwrap();
        assert_eq!(
            header(&reply, CONTENT_DISPOSITION),
            format!("attachment; filename=\"{name}\"")
        );

        // Asked again with its tag: not modified, and nothing sent.
        let content_path = format!("{path}/content");
        let again = server
            .send(
                server
                    .request(Method::GET, &content_path)
                    .header(IF_NONE_MATCH, &etag),
            )
            .await;
        assert_eq!(again.status, StatusCode::NOT_MODIFIED, "{}", again.text());
        assert!(again.bytes.is_empty());
        assert_eq!(header(&again, ETAG), etag);
        let stale = server
            .send(
                server
                    .request(Method::GET, &content_path)
                    .header(IF_NONE_MATCH, "\"0000\", W/\"1111\""),
            )
            .await;
        assert_eq!(stale.status, StatusCode::OK);
        assert_eq!(stale.text(), *bytes);
    }
    // The tool step that recorded each artifact is the one that ran its call.
    let steps = server.steps(&id).await;
    for artifact in &all {
        let step = steps
            .iter()
            .find(|s| s["id"] == artifact["step_id"])
            .unwrap_or_else(|| panic!("no step {}", artifact["step_id"]));
        assert_eq!(step["type"], "tool");
        let tool = if artifact["version"] == 2 {
            "edit_file"
        } else {
            "write_file"
        };
        assert_eq!(step["tool"], tool, "{step}");
    }
}

#[tokio::test]
async fn bad_artifact_requests_are_problems() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = file_session(&server, json!({})).await;
    turn(&server, &id, &write_note("a.md", "a")).await;
    let other = file_session(&server, json!({})).await;
    let artifact = id_of(&artifacts(&server, &id, "").await[0]);
    let unknown = "01900000-0000-7000-8000-000000000000";

    for query in [
        "?bogus=1",
        "?all=maybe",
        "?limit=0",
        "?limit=x",
        "?cursor=nope",
    ] {
        let path = format!("/v1/sessions/{id}/artifacts{query}");
        server
            .get(&path)
            .await
            .expect_problem(StatusCode::BAD_REQUEST, &path);
    }
    for path in [
        format!("/v1/sessions/{unknown}/artifacts"),
        "/v1/sessions/not-an-id/artifacts".to_string(),
        format!("/v1/sessions/{id}/artifacts/{unknown}"),
        format!("/v1/sessions/{id}/artifacts/not-an-id"),
        format!("/v1/sessions/{id}/artifacts/{unknown}/content"),
        // An artifact is found only through its own session.
        format!("/v1/sessions/{other}/artifacts/{artifact}"),
        format!("/v1/sessions/{other}/artifacts/{artifact}/content"),
        format!("/v1/sessions/{unknown}/artifacts/{artifact}/content"),
    ] {
        server
            .get(&path)
            .await
            .expect_problem(StatusCode::NOT_FOUND, &path);
    }
    let path = format!("/v1/sessions/{id}/artifacts/{artifact}/content");
    server
        .post_empty(&path)
        .await
        .expect_problem(StatusCode::METHOD_NOT_ALLOWED, &path);
    server
        .send(server.request(Method::DELETE, &format!("/v1/sessions/{id}/artifacts")))
        .await
        .expect_problem(StatusCode::METHOD_NOT_ALLOWED, "DELETE the list");
}

/// The exact name of `Content-Disposition`'s `filename*=UTF-8''…`, decoded.
fn ext_filename(disposition: &str) -> Option<String> {
    let encoded = disposition.split("filename*=UTF-8''").nth(1)?;
    let mut bytes = Vec::new();
    let mut rest = encoded.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = std::str::from_utf8(tail.get(..2)?).ok()?;
            bytes.push(u8::from_str_radix(hex, 16).ok()?);
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    String::from_utf8(bytes).ok()
}

#[tokio::test]
async fn every_file_name_downloads_under_its_own_name() {
    let server = TestServer::start(ServerOptions::new()).await;
    let id = file_session(&server, json!({})).await;
    let names = [
        "plain-name_1.txt",
        "with space.md",
        "résumé.md",
        "日本語のノート.txt",
        "say \"hi\"; now.txt",
        "back\\slash.txt",
        "100% done.txt",
        "emoji 🦀.rs",
    ];
    for name in names {
        turn(&server, &id, &write_note(&format!("names/{name}"), "n")).await;
    }
    let list = artifacts(&server, &id, "").await;
    assert_eq!(list.len(), names.len(), "{list:?}");
    for artifact in &list {
        let name = artifact["path"]
            .as_str()
            .unwrap()
            .trim_start_matches("names/");
        let reply = content(&server, &id, artifact).await;
        assert_eq!(reply.status, StatusCode::OK, "{name}");
        let disposition = header(&reply, CONTENT_DISPOSITION);
        let quoted = disposition
            .strip_prefix("attachment; filename=\"")
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("{name}: {disposition}"));
        // A plain name any client reads, in the quoted form, with nothing it would unescape.
        assert!(
            quoted
                .chars()
                .all(|c| c.is_ascii() && !c.is_ascii_control() && !"\"\\%".contains(c)),
            "{name}: {disposition}"
        );
        if quoted == name {
            assert_eq!(disposition, format!("attachment; filename=\"{name}\""));
        } else {
            assert_eq!(
                ext_filename(&disposition).as_deref(),
                Some(name),
                "{disposition}"
            );
        }
    }
}

#[tokio::test]
async fn a_file_over_max_artifact_bytes_is_written_but_not_kept() {
    let server =
        TestServer::start(ServerOptions::new().args(&["--max-artifact-bytes", "100"])).await;
    let id = file_session(&server, json!({})).await;
    turn(&server, &id, &write_note("small.md", "ok")).await;
    let long = "y".repeat(200);
    let result = turn(&server, &id, &write_note("big.md", &long)).await;
    assert_eq!(
        std::fs::read_to_string(server.workspace().join("big.md")).unwrap(),
        note_content("big.md", &long),
        "the file itself is written whole"
    );
    // Growing a kept file past the limit keeps no new version either.
    turn(&server, &id, &edit_note("small.md", "ok", &long)).await;

    let all = artifacts(&server, &id, "?all=true").await;
    assert_eq!(versions(&all), [("small.md".to_string(), 1)], "{all:?}");
    let events = server.events(&id).await;
    assert_eq!(
        events
            .iter()
            .filter(|e| e["type"] == "artifact.created")
            .count(),
        1
    );
    let calls: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "tool.finished")
        .map(|e| e["data"]["call_id"].as_str().unwrap())
        .collect();
    assert_eq!(calls.len(), 3);
    for (call, path) in [(calls[1], "big.md"), (calls[2], "small.md")] {
        let output = output_of(&events, call);
        assert!(
            output.contains("not kept as an artifact")
                && output.contains(path)
                && output.contains("at most 100 bytes"),
            "the result says so: {output}"
        );
        let finished = events
            .iter()
            .find(|e| e["type"] == "tool.finished" && e["data"]["call_id"] == call)
            .unwrap();
        assert_eq!(finished["data"]["is_error"], false, "the write succeeded");
    }
    assert!(output_of(&events, calls[0]).starts_with("created small.md"));
    // The model is told too: the call's result in the history says it.
    let messages = server.messages(&id).await;
    let told = messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .filter(|m| {
            m["content"]
                .as_str()
                .is_some_and(|c| c.contains("not kept as an artifact"))
        })
        .count();
    assert_eq!(told, 2, "{messages:?}");
    assert!(
        result["text"]
            .as_str()
            .unwrap()
            .contains("not kept as an artifact"),
        "{result}"
    );
}
