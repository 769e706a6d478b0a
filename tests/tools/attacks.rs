//! The workspace under attack through HTTP, as a model (or another session) would try it: a
//! workspace swapped for a symlink while its calls wait, a directory swapped for a symlink
//! between the policy's decision and the write, a directory exchanged with a symlink while
//! `glob` walks, and a file whose one line is too long to hold. Nothing may leave the
//! workspace, no denied path may be written, and the server's memory stays bounded.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::fakes::start_openai;
use crate::support::{is_postgres, TestServer};
use crate::tools::{
    answer, asks, call, ended, model_calling, options, output_of, pending_within, policed, says,
    start,
};

/// Waits until session `id` has `n` pending approvals; returns them.
async fn pending(server: &TestServer, id: &str, n: usize) -> Vec<Value> {
    pending_within(server, id, n, Duration::from_secs(15)).await
}

async fn approve(server: &TestServer, id: &str, call_id: &str) {
    let reply = answer(server, id, call_id, json!({"decision": "allow"})).await;
    assert!(reply.status.is_success(), "{} {}", reply.status, reply.body);
}

/// Replaces the directory `dir` with a symlink to `target`, keeping the directory as
/// `<dir>.bak`, as `mv dir dir.bak && ln -s target dir` does.
fn swap_for_link(dir: &Path, target: &Path) {
    let kept = dir.with_extension("bak");
    std::fs::rename(dir, &kept).unwrap();
    std::os::unix::fs::symlink(target, dir).unwrap();
}

/// The names in `dir`.
fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_swapped_for_a_link_while_calls_wait_keeps_them_in_its_directory() {
    if is_postgres() {
        return;
    }
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "HOST SECRET\n").unwrap();
    let model = model_calling(vec![
        call(
            "sh",
            "shell",
            json!({"command": "pwd; cat secret.txt; echo made > made-by-shell.txt; ls"}),
        ),
        call(
            "wr",
            "write_file",
            json!({"path": "written.txt", "content": "approved\n"}),
        ),
    ])
    .await;
    // The default policy asks about both calls.
    let server = start(&model, &[]).await;
    let root = server.workspace().to_path_buf();
    let created = server
        .create_session_with(&json!({"workspace": "sub"}))
        .await;
    let id = created["id"].as_str().unwrap().to_string();
    server.start_run(&id, "work in sub").await;
    pending(&server, &id, 2).await;

    // Another session (here, the test) swaps the waiting session's workspace for a symlink.
    swap_for_link(&root.join("sub"), outside.path());
    approve(&server, &id, "sh").await;
    approve(&server, &id, "wr").await;
    ended(&server, &id).await;

    let events = server.events(&id).await;
    let shell = output_of(&events, "sh");
    eprintln!("the approved shell call after the swap said: {shell:?}");
    assert!(!shell.contains("HOST SECRET"), "{shell}");
    assert!(
        shell.starts_with(&format!("{}\n", root.join("sub").display())),
        "it runs at the workspace's path: {shell}"
    );
    assert_eq!(
        names_in(outside.path()),
        ["secret.txt"],
        "nothing was made outside"
    );
    assert_eq!(
        names_in(&root.join("sub.bak")),
        ["made-by-shell.txt", "written.txt"],
        "both calls worked in the session's own directory"
    );
}

/// A policy that allows everything but the file tools under `protected/`.
fn protecting() -> Value {
    json!([
        {"tool": "*", "action": "allow"},
        {"tool": "*_file", "match": "protected/**", "action": "deny"},
    ])
}

#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_rule_holds_when_a_directory_becomes_a_link_after_the_decision() {
    if is_postgres() {
        return;
    }
    // One reply: the shell call swaps `notes` for a link to `protected`, then the write that
    // was decided on `notes/evil.md` runs.
    let (_dir, _model, server_options) = policed(
        protecting(),
        vec![
            call(
                "swap",
                "shell",
                json!({"command": "mv notes notes.real && ln -s protected notes && echo swapped"}),
            ),
            call(
                "evil",
                "write_file",
                json!({"path": "notes/evil.md", "content": "should never land\n"}),
            ),
            call("read", "read_file", json!({"path": "notes/kept.md"})),
        ],
        &["--tool-concurrency", "1"],
    )
    .await;
    let server = TestServer::start(server_options).await;
    let root = server.workspace().to_path_buf();
    std::fs::create_dir_all(root.join("protected")).unwrap();
    std::fs::write(root.join("protected/kept.md"), "PROTECTED\n").unwrap();
    std::fs::create_dir_all(root.join("notes")).unwrap();
    std::fs::write(root.join("notes/kept.md"), "notes\n").unwrap();
    let id = server.create_session().await;
    let result = server.run_wait(&id, "write a note").await;
    assert_eq!(result["status"], "completed", "{result}");
    let events = server.events(&id).await;
    assert!(output_of(&events, "swap").contains("swapped"));
    for call_id in ["evil", "read"] {
        let said = output_of(&events, call_id);
        eprintln!("{call_id} after the swap: {said}");
        assert!(
            said.contains("now leads to protected/") && !said.contains("PROTECTED"),
            "{said}"
        );
    }
    assert_eq!(names_in(&root.join("protected")), ["kept.md"]);
    assert_eq!(names_in(&root.join("notes.real")), ["kept.md"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_write_is_refused_when_its_path_now_leads_elsewhere() {
    let (_dir, _model, server_options) = policed(
        json!([{"tool": "*_file", "match": "protected/**", "action": "deny"}]),
        vec![call(
            "wr",
            "write_file",
            json!({"path": "notes/todo.md", "content": "approved for notes\n"}),
        )],
        &[],
    )
    .await;
    let server = TestServer::start(server_options).await;
    let root = server.workspace().to_path_buf();
    std::fs::create_dir_all(root.join("protected")).unwrap();
    std::fs::create_dir_all(root.join("notes")).unwrap();
    let id = server.create_session().await;
    server.start_run(&id, "write the todo").await;
    let asked = pending(&server, &id, 1).await;
    assert_eq!(asked[0]["subject"], "notes/todo.md", "{}", asked[0]);
    swap_for_link(&root.join("notes"), Path::new("protected"));
    approve(&server, &id, "wr").await;
    ended(&server, &id).await;
    let said = output_of(&server.events(&id).await, "wr");
    assert!(said.contains("now leads to protected/todo.md"), "{said}");
    assert!(names_in(&root.join("protected")).is_empty());
    assert!(names_in(&root.join("notes.bak")).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn glob_never_lists_host_files_while_a_directory_is_exchanged_with_a_link() {
    const CALLS: usize = 300;
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(outside.path().join("etc")).unwrap();
    std::fs::write(outside.path().join("etc/host-secret"), "x").unwrap();
    let calls: Vec<_> = (0..CALLS)
        .map(|i| call(&format!("g{i}"), "glob", json!({"pattern": "**"})))
        .collect();
    let model = start_openai(vec![asks(&calls), says("done")]).await;
    let server = start(&model, &["--max-tool-calls", &CALLS.to_string()]).await;
    let root = server.workspace().to_path_buf();
    std::fs::create_dir_all(root.join("d")).unwrap();
    std::fs::write(root.join("d/inside.txt"), "inside").unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("l")).unwrap();

    // `d` and `l` trade places (renameat2 RENAME_EXCHANGE) as fast as they can.
    let stop = Arc::new(AtomicBool::new(false));
    let exchanges = {
        let (stop, root) = (stop.clone(), root.clone());
        std::thread::spawn(move || {
            let dir = rustix::fs::open(
                &root,
                rustix::fs::OFlags::DIRECTORY,
                rustix::fs::Mode::empty(),
            )
            .unwrap();
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                rustix::fs::renameat_with(&dir, "d", &dir, "l", rustix::fs::RenameFlags::EXCHANGE)
                    .unwrap();
                swaps += 1;
            }
            swaps
        })
    };
    let id = server.create_session().await;
    let result = server.run_wait(&id, "glob a lot").await;
    stop.store(true, Ordering::Relaxed);
    let swaps = exchanges.join().unwrap();
    assert_eq!(result["status"], "completed", "{result}");
    let events = server.events(&id).await;
    let outputs: Vec<String> = (0..CALLS)
        .map(|i| output_of(&events, &format!("g{i}")))
        .collect();
    let leaks = outputs.iter().filter(|o| o.contains("host-secret")).count();
    let saw_inside = outputs.iter().filter(|o| o.contains("inside.txt")).count();
    eprintln!(
        "{CALLS} glob calls during {swaps} exchanges: {leaks} listed the host's file, \
         {saw_inside} listed inside.txt"
    );
    assert_eq!(
        leaks,
        0,
        "{:?}",
        outputs.iter().find(|o| o.contains("host-secret"))
    );
}

/// The server's peak resident memory (`VmHWM`), in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grep_skips_a_file_whose_one_line_is_too_long_to_hold() {
    const LINE_MIB: usize = 300;
    let model = model_calling(vec![
        call("long", "grep", json!({"pattern": "needle", "path": "big"})),
        call("small", "grep", json!({"pattern": "needle"})),
    ])
    .await;
    // A process of its own, so that its peak memory is the server's alone.
    let server = TestServer::start(options(&model, &[]).process()).await;
    let root = server.workspace().to_path_buf();
    std::fs::create_dir_all(root.join("big")).unwrap();
    {
        use std::io::Write;
        let mut file = std::fs::File::create(root.join("big/one-line.txt")).unwrap();
        let chunk = vec![b'a'; 1024 * 1024];
        for _ in 0..LINE_MIB {
            file.write_all(&chunk).unwrap();
        }
        file.write_all(b"needle\n").unwrap();
    }
    std::fs::write(root.join("small.txt"), "a needle here\n").unwrap();
    let before = peak_rss_mib(server.pid());
    let id = server.create_session().await;
    let result = server.run_wait(&id, "find the needle").await;
    let after = peak_rss_mib(server.pid());
    std::fs::remove_file(root.join("big/one-line.txt")).unwrap();
    assert_eq!(result["status"], "completed", "{result}");
    let events = server.events(&id).await;
    let long = output_of(&events, "long");
    let small = output_of(&events, "small");
    eprintln!(
        "grep over one {LINE_MIB} MiB line: the server's peak RSS went from {before} MiB to \
         {after} MiB; it said {long:?}"
    );
    assert!(
        long.contains("skipped 1 file(s)") && long.contains("big/one-line.txt"),
        "{long}"
    );
    assert!(small.contains("small.txt:1:a needle here"), "{small}");
    assert!(after < before + 100, "peak RSS {before} MiB -> {after} MiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_names_are_shown_escaped_and_addressed_by_what_was_shown() {
    let dir = tempfile::tempdir().unwrap();
    let policy = crate::tools::allow_all(dir.path());
    let model = model_calling(vec![
        call("ls", "list_files", json!({})),
        call("read", "read_file", json!({"path": "caf\\xe9.txt"})),
        call(
            "edit",
            "edit_file",
            json!({"path": "invoice\\u{202e}fdp.exe", "old_string": "old", "new_string": "new"}),
        ),
    ])
    .await;
    let server = start(&model, &["--tool-policy", &policy]).await;
    let root = server.workspace().to_path_buf();
    let latin1 = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(b"caf\xe9.txt");
    std::fs::write(root.join(latin1), "bonjour\n").unwrap();
    std::fs::write(root.join("invoice\u{202e}fdp.exe"), "old\n").unwrap();
    let id = server.create_session().await;
    let result = server.run_wait(&id, "look at the odd names").await;
    assert_eq!(result["status"], "completed", "{result}");
    let events = server.events(&id).await;
    let listed = output_of(&events, "ls");
    eprintln!("list_files showed {listed:?}");
    assert!(
        listed.contains("caf\\xe9.txt") && listed.contains("invoice\\u{202e}fdp.exe"),
        "{listed}"
    );
    assert!(
        !listed.contains('\u{202e}'),
        "no raw bidi control: {listed}"
    );
    assert_eq!(output_of(&events, "read"), "     1\tbonjour\n");
    let kept: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "artifact.created")
        .filter_map(|e| e["data"]["artifact"]["path"].as_str())
        .collect();
    assert_eq!(
        kept,
        ["invoice\\u{202e}fdp.exe"],
        "the artifact's name is escaped"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("invoice\u{202e}fdp.exe")).unwrap(),
        "new\n"
    );
}
