//! Each built-in tool called by the model through a real run: what the model gets back, and
//! its errors (a path out of the workspace is a tool error, never a server failure).

use serde_json::json;

use crate::support::fakes::start_openai;
use crate::support::is_postgres;
use crate::tools::{allow_all, asks, call, finished, model_calling, output_of, says, start, write};

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
    let [listed, read, globbed, grepped] =
        ["c1", "c2", "c3", "c4"].map(|id| output_of(&events, id));
    assert!(listed.contains("src/lib.rs"), "{listed}");
    assert_eq!(read.lines().next(), Some("     2\tfn two() {}"), "{read}");
    assert!(read.contains("more"), "says more lines follow: {read}");
    assert!(
        globbed.contains("src/lib.rs") && !globbed.contains("skip.rs"),
        "{globbed}"
    );
    assert!(grepped.contains("src/lib.rs:1:fn one() {}"), "{grepped}");
    assert!(!grepped.contains("hidden"), "{grepped}");
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
    let refused = output_of(&events, "c7");
    assert!(refused.contains("error"), "{refused}");
    // Nothing outside the workspace was touched.
    assert!(!server
        .workspace()
        .parent()
        .unwrap()
        .join("outside.txt")
        .exists());
}

#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
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
        call(
            "s4",
            "shell",
            json!({"command": "echo hi > /tah-escape-probe.txt; echo hi > ../tah-escape-probe.txt; echo hi > /usr/tah-escape-probe.txt; echo status $?"}),
        ),
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
    let out = |id: &str| output_of(&events, id);
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

/// Processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains(marker) && !text.contains("cargo") {
            found.push(format!("{}: {text}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_cannot_read_the_host_reach_the_network_or_outlive_a_cancel() {
    if is_postgres() {
        return;
    }
    let outside = tempfile::Builder::new()
        .prefix("tah-host-secret-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let secret = outside.path().join("secret.txt");
    std::fs::write(&secret, "host-secret-7731").unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let marker = format!("tah-outlive-{}", uuid::Uuid::now_v7().simple());
    let dir = tempfile::tempdir().unwrap();
    let policy = allow_all(dir.path());
    let model = start_openai(vec![
        asks(&[
            call("h1", "shell", json!({"command": format!("cat {}; echo read $?", secret.display())})),
            call(
                "h2",
                "shell",
                json!({"command": format!("bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected' ; echo net $?")}),
            ),
        ]),
        asks(&[call(
            "h3",
            "shell",
            json!({"command": format!("echo 'sleep 100' > {marker}.sh; sh {marker}.sh & sh {marker}.sh")}),
        )]),
        says("done"),
    ])
    .await;
    let server = start(&model, &["--tool-policy", &policy]).await;
    let id = server.create_session().await;
    server.start_run(&id, "probe").await;
    // Wait until the sleeping call runs, then cancel the run.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while processes_with(&marker).len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the sleeps never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let cancelled_at = std::time::Instant::now();
    server.cancel(&id).await;
    let session = server
        .poll_session(&id, "cancelled", std::time::Duration::from_secs(5), |s| {
            s["state"] == "cancelled"
        })
        .await;
    assert_eq!(session["state"], "cancelled");
    assert!(cancelled_at.elapsed() < std::time::Duration::from_secs(2));
    let mut left = processes_with(&marker);
    for _ in 0..50 {
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        left = processes_with(&marker);
    }
    assert!(left.is_empty(), "processes outlived the cancel: {left:?}");
    let events = server.events(&id).await;
    let out = |id: &str| output_of(&events, id);
    assert!(!out("h1").contains("host-secret-7731"), "{}", out("h1"));
    assert!(out("h1").contains("read 1"), "{}", out("h1"));
    assert!(!out("h2").contains("connected"), "{}", out("h2"));
    assert!(
        listener.accept().is_err(),
        "a connection reached the host's port"
    );
}
