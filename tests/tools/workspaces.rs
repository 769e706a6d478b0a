//! Workspaces through HTTP: a session created with `workspace` works in that directory under
//! the server's `--workspace` and sees nothing else; names that leave the root are refused; a
//! fork works where its parent does unless it names another directory. The model is the mock
//! (see `artifacts.rs` for the inputs that make it write).

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::*;
use crate::tools::artifacts::{artifacts, file_session, note_content, turn, write_note};
use crate::tools::{output_of, write};

/// The call ids of the session's tool calls, in order.
fn calls(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["type"] == "tool.finished")
        .map(|e| e["data"]["call_id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_session_works_only_in_the_directory_it_names() {
    let mut server = TestServer::start(ServerOptions::new()).await;
    let root = server.workspace().to_path_buf();
    let plain = server.create_session_with(&json!({})).await;
    assert!(
        plain.get("workspace").is_none(),
        "the root by default, not shown as the other options are not: {plain}"
    );

    let created = server
        .create_session_with(&json!({
            "workspace": "teams/a",
            "tool_policy": [{"tool": "*_file", "action": "allow"}],
        }))
        .await;
    assert_eq!(created["workspace"], "teams/a", "{created}");
    let id = id_of(&created);
    assert!(root.join("teams/a").is_dir(), "created when missing");
    assert_eq!(server.session(&id).await["workspace"], "teams/a");
    let listed = server.sessions().await;
    let row = listed.iter().find(|s| s["id"] == id.as_str()).unwrap();
    assert_eq!(row["workspace"], "teams/a");

    // The mock's ordinary turn lists the workspace: it sees this directory, not the root's
    // README.
    write(&server, "teams/a/inside.txt", "inside\n");
    turn(&server, &id, "what is in here?").await;
    let events = server.events(&id).await;
    let listing = output_of(&events, &calls(&events)[0]);
    assert!(
        listing.contains("inside.txt") && !listing.contains("README"),
        "{listing}"
    );

    turn(&server, &id, &write_note("x.md", "hi")).await;
    assert_eq!(
        std::fs::read_to_string(root.join("teams/a/x.md")).unwrap(),
        note_content("x.md", "hi")
    );
    assert!(!root.join("x.md").exists());
    let kept = artifacts(&server, &id, "").await;
    assert_eq!(kept[0]["path"], "x.md", "paths are the session's own");

    // Above its directory is outside, even though it is inside the server's root.
    let result = server
        .run_wait(&id, &write_note("../escape.md", "no"))
        .await;
    assert_eq!(result["status"], "completed", "{result}");
    let events = server.events(&id).await;
    let last = calls(&events).pop().unwrap();
    let finished = events
        .iter()
        .find(|e| e["type"] == "tool.finished" && e["data"]["call_id"] == last.as_str())
        .unwrap();
    assert_eq!(finished["data"]["is_error"], true, "{finished}");
    assert!(!root.join("teams/escape.md").exists());

    // Kept across a restart; a directory removed since is made again.
    server.restart().await;
    assert_eq!(server.session(&id).await["workspace"], "teams/a");
    std::fs::remove_dir_all(root.join("teams/a")).unwrap();
    turn(&server, &id, &write_note("y.md", "again")).await;
    assert!(root.join("teams/a/y.md").is_file());
}

#[tokio::test]
async fn a_workspace_that_leaves_the_root_is_refused() {
    let server = TestServer::start(ServerOptions::new()).await;
    let root = server.workspace().to_path_buf();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("out")).unwrap();
    std::os::unix::fs::symlink("../..", root.join("up")).unwrap();
    std::fs::create_dir_all(root.join("real/dir")).unwrap();
    std::os::unix::fs::symlink("real/dir", root.join("alias")).unwrap();
    write(&server, "file.txt", "a file\n");
    let before = server.sessions().await.len();

    for workspace in [
        json!("/etc"),
        json!(outside.path().display().to_string()),
        json!(".."),
        json!("../x"),
        json!("a/../../x"),
        // A directory only passed through must exist, as for `cd`.
        json!("a/../b"),
        json!("out"),
        json!("out/sub"),
        json!("up"),
        json!("up/x"),
        json!("file.txt"),
        json!("file.txt/x"),
        json!("a\u{0}b"),
        json!("x/".repeat(3000)),
    ] {
        let what = format!("workspace {workspace}");
        let reply = server
            .post_json("/v1/sessions", &json!({ "workspace": workspace }))
            .await;
        reply.expect_problem(StatusCode::BAD_REQUEST, &what);
    }
    for workspace in [json!(5), json!(["a"]), json!({"path": "a"})] {
        let reply = server
            .post_json("/v1/sessions", &json!({ "workspace": workspace }))
            .await;
        assert!(
            reply.status.is_client_error(),
            "workspace {workspace}: {}",
            reply.status
        );
        check_problem(&reply).unwrap();
    }
    assert_eq!(server.sessions().await.len(), before, "no session was made");
    assert!(
        std::fs::read_dir(outside.path()).unwrap().next().is_none(),
        "nothing was made outside"
    );
    assert!(!root.join("a").exists() && !root.join("b").exists() && !root.join("x").exists());

    // Names that stay inside are kept in their canonical form.
    for (workspace, canonical) in [
        ("", "."),
        (".", "."),
        ("./c/", "c"),
        ("real/../b", "b"),
        ("alias", "real/dir"),
        ("alias/deeper", "real/dir/deeper"),
        ("日本/ü", "日本/ü"),
    ] {
        let created = server
            .create_session_with(&json!({ "workspace": workspace }))
            .await;
        // The root is not shown, as the other options at their defaults are not.
        let shown = created.get("workspace").cloned().unwrap_or(json!("."));
        assert_eq!(shown, canonical, "{workspace:?}: {created}");
        assert!(root.join(canonical).is_dir(), "{canonical}");
    }
}

#[tokio::test]
async fn a_workspace_swapped_for_a_link_outside_fails_the_run() {
    let server = TestServer::start(ServerOptions::new()).await;
    let root = server.workspace().to_path_buf();
    let id = file_session(&server, json!({"workspace": "mine"})).await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::remove_dir(root.join("mine")).unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("mine")).unwrap();

    let result = server.run_wait(&id, &write_note("x.md", "no")).await;
    assert_eq!(result["status"], "failed", "{result}");
    let error = result["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("workspace") && error.contains("mine"),
        "{error}"
    );
    assert!(
        !error.contains(&outside.path().display().to_string()),
        "says nothing of the host's paths: {error}"
    );
    assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
    // The session is not broken: with its directory back, the next run works.
    std::fs::remove_file(root.join("mine")).unwrap();
    turn(&server, &id, &write_note("x.md", "yes")).await;
    assert!(root.join("mine/x.md").is_file());
}

#[tokio::test]
async fn a_fork_works_in_its_parents_workspace_unless_it_names_another() {
    let server = TestServer::start(ServerOptions::new()).await;
    let root = server.workspace().to_path_buf();
    let parent = file_session(&server, json!({"workspace": "teams/a"})).await;
    turn(&server, &parent, &write_note("x.md", "parent")).await;
    let fork = |body: Value| {
        let server = &server;
        let path = format!("/v1/sessions/{parent}/fork");
        async move { server.post_json(&path, &body).await }
    };

    let same = fork(json!({}))
        .await
        .expect_json(StatusCode::CREATED, "fork");
    assert_eq!(same["workspace"], "teams/a", "{same}");
    let other = fork(json!({"workspace": "teams/b"}))
        .await
        .expect_json(StatusCode::CREATED, "fork elsewhere");
    assert_eq!(other["workspace"], "teams/b", "{other}");
    assert!(root.join("teams/b").is_dir());
    let at_root = fork(json!({"workspace": ".", "turns": 0}))
        .await
        .expect_json(StatusCode::CREATED, "fork at the root");
    assert!(at_root.get("workspace").is_none(), "{at_root}");

    // The fork of another directory writes there, and keeps its parent's artifacts.
    turn(&server, &id_of(&other), &write_note("x.md", "fork")).await;
    assert_eq!(
        std::fs::read_to_string(root.join("teams/b/x.md")).unwrap(),
        note_content("x.md", "fork")
    );
    assert_eq!(
        std::fs::read_to_string(root.join("teams/a/x.md")).unwrap(),
        note_content("x.md", "parent")
    );
    let kept = artifacts(&server, &id_of(&other), "?all=true").await;
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert_eq!(kept[1]["version"], 2);

    let before = server.sessions().await.len();
    for workspace in [json!("../out"), json!("/tmp"), json!(7)] {
        let reply = fork(json!({ "workspace": workspace })).await;
        assert!(
            reply.status.is_client_error(),
            "{workspace}: {}",
            reply.status
        );
        check_problem(&reply).unwrap();
    }
    fork(json!({"workspace": "../out"}))
        .await
        .expect_problem(StatusCode::BAD_REQUEST, "a fork outside");
    assert_eq!(server.sessions().await.len(), before);
    let reply = server
        .send(
            server
                .request(
                    Method::POST,
                    "/v1/sessions/01900000-0000-7000-8000-000000000000/fork",
                )
                .json(&json!({"workspace": "teams/c"})),
        )
        .await;
    reply.expect_problem(StatusCode::NOT_FOUND, "a fork of no session");
    assert!(!root.join("teams/c").exists());
}
