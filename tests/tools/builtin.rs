//! Each built-in tool called by the model through a real run: what the model gets back, and
//! its errors (a path out of the workspace is a tool error, never a server failure).

use serde_json::json;

use crate::support::is_postgres;
use crate::{allow_all, call, finished, model_calling, start, write};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_tools_read_search_write_and_edit_in_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    let policy = allow_all(dir.path());
    let model = model_calling(vec![
        call("c1", "list_files", json!({"path": ".", "depth": 2})),
        call(
            "c2",
            "read_file",
            json!({"path": "src/lib.rs", "offset": 2, "limit": 1}),
        ),
        call("c3", "glob", json!({"pattern": "**/*.rs"})),
        call("c4", "grep", json!({"pattern": "fn \\w+", "path": "src"})),
        call(
            "c5",
            "write_file",
            json!({"path": "notes/today.md", "content": "hello\n"}),
        ),
        call(
            "c6",
            "edit_file",
            json!({"path": "src/lib.rs", "old_string": "two", "new_string": "2"}),
        ),
        call("c7", "read_file", json!({"path": "../outside.txt"})),
        call(
            "c8",
            "edit_file",
            json!({"path": "src/lib.rs", "old_string": "absent", "new_string": "x"}),
        ),
    ])
    .await;
    let server = start(&model, &["--tool-policy", &policy]).await;
    write(
        &server,
        "src/lib.rs",
        "fn one() {}\nfn two() {}\nfn three() {}\n",
    );
    write(&server, "ignored/skip.rs", "fn hidden() {}\n");
    write(&server, ".gitignore", "ignored/\n");
    let id = server.create_session().await;
    let result = server.run_wait(&id, "do file things").await;
    assert_eq!(result["status"], "completed", "{result}");
    let events = server.events(&id).await;
    let out = |id: &str| {
        finished(&events, id)["data"]["output"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(out("c1").contains("src/lib.rs"), "{}", out("c1"));
    assert_eq!(
        out("c2").lines().next(),
        Some("     2\tfn two() {}"),
        "{}",
        out("c2")
    );
    assert!(
        out("c2").contains("more"),
        "says more lines follow: {}",
        out("c2")
    );
    assert!(
        out("c3").contains("src/lib.rs") && !out("c3").contains("skip.rs"),
        "{}",
        out("c3")
    );
    assert!(
        out("c4").contains("src/lib.rs:1:fn one() {}"),
        "{}",
        out("c4")
    );
    assert!(!out("c4").contains("hidden"), "{}", out("c4"));
    assert_eq!(
        std::fs::read_to_string(server.workspace().join("notes/today.md")).unwrap(),
        "hello\n"
    );
    assert!(
        std::fs::read_to_string(server.workspace().join("src/lib.rs"))
            .unwrap()
            .contains("fn 2() {}")
    );
    for id in ["c7", "c8"] {
        let event = finished(&events, id);
        assert_eq!(event["data"]["is_error"], true, "{event}");
    }
    assert!(out("c7").contains("error"), "{}", out("c7"));
    // Nothing outside the workspace was touched.
    assert!(!server
        .workspace()
        .parent()
        .unwrap()
        .join("outside.txt")
        .exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_runs_sandboxed_and_parallel_calls_overlap() {
    if is_postgres() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let policy = allow_all(dir.path());
    let model = model_calling(vec![
        call("s1", "shell", json!({"command": "sleep 1; echo one"})),
        call("s2", "shell", json!({"command": "sleep 1; echo two"})),
        call("s3", "shell", json!({"command": "sleep 1; echo three > made.txt; cat /etc/hostname >/dev/null; echo three"})),
        call("s4", "shell", json!({"command": "echo hi > /outside-$$.txt; echo status $?"})),
    ])
    .await;
    let server = start(&model, &["--tool-policy", &policy]).await;
    let tools = server.get_ok("/v1/tools").await;
    let shell = tools["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "shell")
        .cloned()
        .unwrap();
    assert_eq!(
        shell["available"], true,
        "bubblewrap must be installed: {shell}"
    );
    let id = server.create_session().await;
    let started = std::time::Instant::now();
    let result = server.run_wait(&id, "run things").await;
    let took = started.elapsed();
    assert_eq!(result["status"], "completed", "{result}");
    let events = server.events(&id).await;
    let out = |id: &str| {
        finished(&events, id)["data"]["output"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(
        out("s1").contains("one") && out("s1").contains("exit code 0"),
        "{}",
        out("s1")
    );
    assert!(out("s3").contains("three"));
    assert!(server.workspace().join("made.txt").exists());
    // The system is read-only inside the sandbox.
    assert!(
        out("s4").contains("status 1") || out("s4").contains("Read-only"),
        "{}",
        out("s4")
    );
    eprintln!("three parallel `sleep 1` shell calls (and one quick one): the run took {took:?}");
    assert!(
        took < std::time::Duration::from_millis(2500),
        "calls did not overlap: {took:?}"
    );
}
