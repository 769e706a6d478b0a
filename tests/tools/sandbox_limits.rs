//! What a hostile command can cost the server through `shell`, tried the way an attacker would,
//! against a real server process: memory no process is charged for, output at full speed,
//! output that grows when JSON-encoded, and setuid files left in the workspace.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::is_postgres;
use crate::support::TestServer;
use crate::tools::{call, ended, output_of};

/// A server process on a model that asks for `calls`, with every tool allowed.
async fn server_calling(
    calls: Vec<crate::support::fakes::FakeToolCall>,
) -> (
    TestServer,
    crate::support::fakes::FakeServer,
    tempfile::TempDir,
) {
    crate::sandbox::server(calls, &[], &[]).await
}

/// The pids whose command line contains `marker`.
fn pids_with(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            text.contains(marker) && !text.contains("cargo")
        })
        .collect()
}

fn oom_score_adj(pid: u32) -> Option<i32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).ok()?;
    text.trim().parse().ok()
}

/// The CPU time a process used so far (user and system).
fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<u64> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|f| f.parse().unwrap())
        .collect();
    // Clock ticks of 1/100 s, as on every Linux this runs on.
    Duration::from_millis((fields[0] + fields[1]) * 10)
}

#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filling_tmp_fails_inside_and_the_sandbox_is_the_oom_killers_pick() {
    if is_postgres() {
        return;
    }
    let marker = format!("tah-oom-{}", uuid::Uuid::now_v7().simple());
    let command = format!(
        "head -c 700M /dev/zero > /tmp/big; echo tmp $?; head -c 100M /dev/zero > /dev/shm/big; \
         echo shm $?; echo x > /big; echo root $?; echo 'sleep 3' > {marker}.sh; sh {marker}.sh"
    );
    let (mut server, _model, _dir) =
        server_calling(vec![call("m1", "shell", json!({ "command": command }))]).await;
    let id = server.create_session().await;
    server.start_run(&id, "fill memory").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut pids = pids_with(&marker);
    // bwrap, the sandbox's `sh -c` and `sh <marker>.sh`.
    while pids.len() < 3 {
        assert!(Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
        pids = pids_with(&marker);
    }
    let scores: Vec<Option<i32>> = pids.iter().map(|&pid| oom_score_adj(pid)).collect();
    let server_score = oom_score_adj(server.pid());
    eprintln!("oom_score_adj: sandbox processes {scores:?}, server {server_score:?}");
    assert!(scores.iter().all(|s| *s == Some(1000)), "{scores:?}");
    let lowered = server_score == Some(-999);
    let said = server
        .log_lines("could not lower the server's OOM score")
        .len();
    assert!(
        lowered || said == 1,
        "lowered, or said once that it could not"
    );
    ended(&server, &id).await;
    let events = server.events(&id).await;
    let out = output_of(&events, "m1");
    assert!(out.contains("tmp 1\n"), "{out}");
    assert!(out.contains("shm 1\n"), "{out}");
    assert!(out.contains("root 2\n"), "{out}");
    assert!(out.contains("No space left on device"), "{out}");
    assert!(server.alive());
    server.get_ok("/v1/tools").await;
}

#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_output_costs_the_server_next_to_no_cpu() {
    if is_postgres() {
        return;
    }
    let (server, _model, _dir) = server_calling(vec![
        call(
            "z",
            "shell",
            json!({ "command": "cat /dev/zero", "timeout_s": 5 }),
        ),
        call(
            "y",
            "shell",
            json!({ "command": "yes & yes & yes & yes; wait", "timeout_s": 5 }),
        ),
    ])
    .await;
    let id = server.create_session().await;
    let before = cpu_time(server.pid());
    let started = Instant::now();
    server.start_run(&id, "flood").await;
    ended(&server, &id).await;
    let took = started.elapsed();
    let cpu = cpu_time(server.pid()) - before;
    eprintln!("`cat /dev/zero` and four `yes` (timeout_s 5): the run took {took:?}, the server used {cpu:?} of CPU");
    let events = server.events(&id).await;
    for call in ["z", "y"] {
        let out = output_of(&events, call);
        assert!(
            out.contains("of over 4194304 bytes; the rest was refused (broken pipe)"),
            "{call}: {}",
            &out[out.len().saturating_sub(300)..]
        );
    }
    assert!(took < Duration::from_secs(4), "{took:?}");
    assert!(cpu < Duration::from_millis(1500), "{cpu:?}");
}

#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_full_of_control_characters_reaches_the_model_within_the_cap() {
    if is_postgres() {
        return;
    }
    let (server, model, _dir) = server_calling(vec![call(
        "c",
        "shell",
        json!({ "command": "head -c 70000 /dev/zero | tr '\\0' '\\1'; sleep 10", "timeout_s": 1 }),
    )])
    .await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "garble").await;
    assert_eq!(result["status"], "completed", "{result}");
    let body = model.body(1);
    let result = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("the tool result");
    let content = result["content"].as_str().expect("text");
    let in_request = serde_json::to_string(content).unwrap().len() - 2;
    eprintln!(
        "a timed-out call's 70000 control characters: {} characters of tool result, {in_request} \
         bytes in the model request",
        content.chars().count()
    );
    assert!(in_request <= 64 * 1024, "{in_request}");
    let error: Value = serde_json::from_str(content).expect("the error is JSON");
    let message = error["error"].as_str().unwrap();
    assert!(message.starts_with("timed out after 1 s"), "{message:.100}");
    assert!(
        message.ends_with("of 70000 bytes]\n"),
        "{}",
        &message[message.len() - 100..]
    );
}

#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setuid_file_planted_in_the_workspace_loses_its_bit() {
    use std::os::unix::fs::PermissionsExt;
    if is_postgres() {
        return;
    }
    let (server, _model, _dir) = server_calling(vec![call(
        "s",
        "shell",
        json!({ "command": "cp /bin/sh rootshell; chmod u+s,g+s rootshell; stat -c '%U %A' rootshell" }),
    )])
    .await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "plant").await;
    assert_eq!(result["status"], "completed", "{result}");
    let out = output_of(&server.events(&id).await, "s");
    let host = std::fs::metadata(server.workspace().join("rootshell")).unwrap();
    let mode = host.permissions().mode() & 0o7777;
    eprintln!("inside: {out:?}; on the host afterwards: {mode:o}");
    assert!(out.starts_with("root -rwsr-sr-x\n"), "{out}");
    assert_eq!(mode, 0o755);
}
