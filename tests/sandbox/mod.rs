//! The `shell` sandbox's backends and limits, against real server processes: `--sandbox
//! auto` falling back to Landlock where bubblewrap cannot make namespaces (as under a default
//! `docker run`), what the Landlock backend confines, tried the way an attacker would, and
//! bombs (processes, memory, disk) under both backends, each ended as a tool error naming the
//! limit while another session keeps completing runs.
//!
//! Tests of a backend this machine lacks are reported ignored: bubblewrap's need `bwrap`
//! able to make namespaces (`cfg(sandbox_tests)`), Landlock's a kernel with Landlock
//! (`cfg(landlock_tests)`; `TAH_TEST_LANDLOCK=on|off` overrides the guess), both decided by
//! `build.rs`.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::{is_postgres, ServerOptions, TestServer};
use crate::tools::{allow_all, call, ended, model_calling, options, output_of};

/// A "bwrap" that fails the way bubblewrap does where user namespaces are refused (Docker's
/// default seccomp profile, `kernel.unprivileged_userns_clone=0`).
fn refusing_bwrap(dir: &std::path::Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join("bwrap");
    std::fs::write(
        &path,
        "#!/bin/sh\necho 'bwrap: No permissions to create new namespace, likely because the \
         kernel does not allow non-privileged user namespaces.' >&2\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// A server process on a model whose first reply asks for `calls`, every tool allowed, with
/// `args` and `env`.
pub(crate) async fn server(
    calls: Vec<crate::support::fakes::FakeToolCall>,
    args: &[&str],
    env: &[(&str, &str)],
) -> (
    TestServer,
    crate::support::fakes::FakeServer,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let policy = allow_all(dir.path());
    let model = model_calling(calls).await;
    let mut options: ServerOptions = options(
        &model,
        &[&["--tool-policy", policy.as_str()], args].concat(),
    )
    .process();
    for (name, value) in env {
        options = options.env(name, value);
    }
    (TestServer::start(options).await, model, dir)
}

/// The `shell` entry of `GET /v1/tools`.
async fn shell_entry(server: &TestServer) -> Value {
    let tools = server.get_ok("/v1/tools").await;
    tools["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "shell")
        .cloned()
        .expect("shell is listed")
}

/// Whether a call's `tool.finished` says it failed.
fn failed(events: &[Value], call_id: &str) -> bool {
    let data = &crate::tools::finished(events, call_id)["data"];
    data["is_error"] == true
}

#[cfg_attr(
    not(landlock_tests),
    ignore = "needs a kernel with Landlock (Linux 5.13+); TAH_TEST_LANDLOCK=on to force"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_picks_landlock_where_user_namespaces_are_refused() {
    if is_postgres() {
        return;
    }
    let fake = tempfile::tempdir().unwrap();
    let bwrap = refusing_bwrap(fake.path());
    let (server, _model, _dir) = server(
        vec![call(
            "s",
            "shell",
            json!({ "command": "echo made > made.txt; cat made.txt; echo $TMPDIR" }),
        )],
        &["--sandbox", "auto"],
        &[("TAH_BWRAP", &bwrap)],
    )
    .await;
    let shell = shell_entry(&server).await;
    assert_eq!(shell["available"], true, "{shell}");
    assert_eq!(shell["sandbox"], "landlock", "{shell}");
    let said = server.log_lines("shell sandbox: landlock");
    assert_eq!(said.len(), 1, "{}", server.log_tail(20));
    assert!(
        said[0].contains("No permissions to create new namespace"),
        "{}",
        said[0]
    );
    let id = server.create_session().await;
    server.start_run(&id, "make a file").await;
    ended(&server, &id).await;
    let out = output_of(&server.events(&id).await, "s");
    assert!(out.starts_with("made\n/tmp/tah-sandbox-"), "{out}");
    assert!(out.ends_with("exit code 0"), "{out}");
    assert_eq!(
        std::fs::read_to_string(server.workspace().join("made.txt")).unwrap(),
        "made\n"
    );
    // The private temporary directory is gone with the call.
    let tmp = out.lines().nth(1).unwrap();
    assert!(
        !std::path::Path::new(tmp).exists(),
        "{tmp} outlived the call"
    );
}

/// Under Landlock an egress allow-list could not hold (a rule limits the port a command
/// connects to, not the host), so `--shell-network allow=…` there leaves `shell` unoffered;
/// `all` and `none` still work.
#[cfg_attr(
    not(landlock_tests),
    ignore = "needs a kernel with Landlock (Linux 5.13+); TAH_TEST_LANDLOCK=on to force"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_landlock_an_allow_list_fails_closed() {
    if is_postgres() {
        return;
    }
    let fake = tempfile::tempdir().unwrap();
    let bwrap = refusing_bwrap(fake.path());
    let model = model_calling(vec![]).await;
    for (network, available) in [("allow=example.com", false), ("all", true)] {
        let server = TestServer::start(
            options(&model, &["--shell-network", network])
                .operator_token("landlock-egress-operator-token")
                .env("TAH_BWRAP", &bwrap)
                .process(),
        )
        .await;
        let shell = shell_entry(&server).await;
        assert_eq!(shell["available"], available, "{network}: {shell}");
        if available {
            assert_eq!(shell["sandbox"], "landlock", "{shell}");
        } else {
            let reason = shell["reason"].as_str().unwrap();
            assert!(
                reason.contains("needs the bwrap sandbox") && reason.contains("Landlock"),
                "{reason}"
            );
        }
    }
}

#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_picks_bwrap_where_it_works_and_a_forced_backend_that_fails_is_not_offered() {
    if is_postgres() {
        return;
    }
    let (server, _model, _dir) = server(vec![], &[], &[]).await;
    let shell = shell_entry(&server).await;
    assert_eq!(shell["sandbox"], "bwrap", "{shell}");
    drop(server);
    let fake = tempfile::tempdir().unwrap();
    let bwrap = refusing_bwrap(fake.path());
    let (server, _model, _dir) = server_with_bwrap(&["--sandbox", "bwrap"], &bwrap).await;
    let shell = shell_entry(&server).await;
    assert_eq!(shell["available"], false, "{shell}");
    assert!(shell.get("sandbox").is_none(), "{shell}");
    assert!(
        shell["reason"]
            .as_str()
            .unwrap()
            .starts_with("bwrap cannot create its sandbox here"),
        "{shell}"
    );
}

async fn server_with_bwrap(
    args: &[&str],
    bwrap: &str,
) -> (
    TestServer,
    crate::support::fakes::FakeServer,
    tempfile::TempDir,
) {
    server(vec![], args, &[("TAH_BWRAP", bwrap)]).await
}

#[cfg_attr(
    not(landlock_tests),
    ignore = "needs a kernel with Landlock (Linux 5.13+); TAH_TEST_LANDLOCK=on to force"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn landlock_confines_a_hostile_command() {
    if is_postgres() {
        return;
    }
    // A secret outside the workspace, where a symlink the command makes points.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "top-secret").unwrap();
    let secret_dir = outside.path().display().to_string();
    // The server's pid and database directory are known once it runs: the command reads them
    // from the workspace.
    let script = format!(
        r#"
SERVER=$(cat server.pid); DB=$(cat db.dir)
cat in.txt; echo " read $?"
echo w > w.txt && echo "write-ws $?"
echo t > "$TMPDIR/t" && echo "write-tmp $?"
echo x > /etc/x 2>/dev/null; echo "write-etc $?"
echo x > /usr/x 2>/dev/null; echo "write-usr $?"
ls /root >/dev/null 2>&1; echo "root $?"
ls "$DB" >/dev/null 2>&1; echo "db $?"
cat /proc/1/environ >/dev/null 2>&1; echo "environ-1 $?"
cat /proc/$SERVER/environ >/dev/null 2>&1; echo "environ-server $?"
cat /etc/shadow >/dev/null 2>&1; echo "shadow $?"
python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_STREAM)' 2>/dev/null; echo "inet $?"
python3 -c 'import socket; socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)' 2>/dev/null; echo "inet6 $?"
python3 -c 'import socket; socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)' 2>/dev/null; echo "netlink $?"
ln -s {secret_dir} link; cat link/secret 2>/dev/null; echo "symlink $?"
mkdir swap; i=0; found=0
( j=0; while [ $j -lt 300 ]; do rm -rf swap; ln -s {secret_dir} swap; rm swap; mkdir swap; j=$((j+1)); done ) &
while [ $i -lt 300 ]; do cat swap/secret 2>/dev/null && found=1; i=$((i+1)); done
wait; rm -rf swap; echo "swapped $found"
python3 -c "import ctypes; print('ptrace', ctypes.CDLL(None).ptrace(16, $SERVER, 0, 0))"
kill -0 $SERVER 2>/dev/null; echo "signal $?"
unshare -U true 2>/dev/null; echo "unshare $?"
env | sort | tr '\n' ' '; echo
"#
    );
    let (server, _model, _dir) = server(
        vec![call("h", "shell", json!({ "command": script }))],
        &["--sandbox", "landlock"],
        &[],
    )
    .await;
    let db_dir = server
        .database_path()
        .parent()
        .unwrap()
        .display()
        .to_string();
    std::fs::write(server.workspace().join("in.txt"), "inside").unwrap();
    std::fs::write(
        server.workspace().join("server.pid"),
        server.pid().to_string(),
    )
    .unwrap();
    std::fs::write(server.workspace().join("db.dir"), db_dir).unwrap();
    let id = server.create_session().await;
    server.start_run(&id, "attack").await;
    ended(&server, &id).await;
    let out = output_of(&server.events(&id).await, "h");
    eprintln!("{out}");
    for line in [
        "inside read 0",
        "write-ws 0",
        "write-tmp 0",
        "write-etc 2",
        "write-usr 2",
        "root 2",
        "db 2",
        "environ-1 1",
        "environ-server 1",
        "shadow 1",
        "inet 1",
        "inet6 1",
        "netlink 1",
        "symlink 1",
        "swapped 0",
        "ptrace -1",
        "signal 1",
        "unshare 1",
    ] {
        assert!(out.lines().any(|l| l == line), "no `{line}` in:\n{out}");
    }
    assert!(!out.contains("top-secret"), "{out}");
    assert!(
        !out.contains("sk-tools-test-key"),
        "the server's environment leaked: {out}"
    );
}

/// What a bomb test measured.
struct Measured {
    took: Duration,
    probe_runs: usize,
    p50: Duration,
    max: Duration,
}

/// Starts `command` as a `shell` call on a server with `args`, and while it runs completes
/// runs of a probe session, timing them; returns the call's output, whether it failed, and the
/// figures.
async fn bomb(
    name: &str,
    command: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (String, bool, Measured) {
    let (server, _model, _dir) = server(
        vec![call(
            "b",
            "shell",
            json!({ "command": command, "timeout_s": 60 }),
        )],
        args,
        env,
    )
    .await;
    let id = server.create_session().await;
    let probe = server.create_session().await;
    let started = Instant::now();
    server.start_run(&id, "bomb").await;
    // The bomb's call is under way once the model's first reply (its call) was taken.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let events = server.events(&id).await;
        if events
            .iter()
            .any(|e| e["type"] == "tool.started" || e["type"] == "tool.finished")
        {
            break;
        }
        assert!(Instant::now() < deadline, "the call never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut latencies = Vec::new();
    let mut took = None;
    let deadline = Instant::now() + Duration::from_secs(50);
    while took.is_none() || latencies.len() < 3 {
        let t = Instant::now();
        let result = server.run_wait(&probe, "ping").await;
        assert_eq!(result["status"], "completed", "{result}");
        latencies.push(t.elapsed());
        if took.is_none() {
            let session = server.get_ok(&format!("/v1/sessions/{id}")).await;
            if !matches!(session["state"].as_str(), Some("running" | "waiting_tool")) {
                took = Some(started.elapsed());
            }
        }
        assert!(
            Instant::now() < deadline,
            "{name}: the bomb was never stopped"
        );
    }
    let events = server.events(&id).await;
    let out = output_of(&events, "b");
    let failed = failed(&events, "b");
    latencies.sort();
    let measured = Measured {
        took: took.unwrap(),
        probe_runs: latencies.len(),
        p50: latencies[latencies.len() / 2],
        max: *latencies.last().unwrap(),
    };
    eprintln!(
        "{name}: the call ended after {:?}; probe runs during it: {} completed, p50 {:?}, max {:?}",
        measured.took, measured.probe_runs, measured.p50, measured.max
    );
    assert!(server.get_ok("/v1/tools").await["data"].is_array());
    (out, failed, measured)
}

/// The bombs, on the backend `args` and `env` choose.
async fn bombs(backend: &str, args: &[&str], env: &[(&str, &str)]) {
    let limits = [
        &["--shell-memory-mb", "256", "--shell-pids", "64"][..],
        &["--shell-tmp-mb", "32", "--shell-file-mb", "48"][..],
    ]
    .concat();
    let args = [args, &limits].concat();
    let cases = [
        // The shell stays, as an interactive one would: the bomb is not cut short by its end.
        (
            "fork bomb",
            "bash -c ':(){ :|:& };:; sleep 30'",
            "process limit (64)",
        ),
        (
            "memory bomb",
            "head -c 3G /dev/zero | tail | wc -c",
            "memory limit (256 MB)",
        ),
        (
            "/tmp filler",
            "dd if=/dev/zero of=\"${TMPDIR:-/tmp}/fill\" bs=1M count=200",
            "/tmp size limit (32 MB)",
        ),
        (
            "workspace filler",
            "dd if=/dev/zero of=fill bs=1M count=200",
            "file size limit (48 MB)",
        ),
    ];
    // CPU time: a busy loop in a child of the shell, with a limit of 1 s.
    let cpu_args = [&args[..], &["--shell-cpu-s", "1"]].concat();
    let (out, failed, _measured) = bomb(
        &format!("{backend}: busy loop"),
        "sh -c 'while :; do :; done'",
        &cpu_args,
        env,
    )
    .await;
    assert!(failed, "{backend}: busy loop: not an error: {out}");
    assert!(
        out.contains("the command exceeded the CPU time limit (1 s)"),
        "{backend}: busy loop: {out}"
    );
    for (name, command, limit) in cases {
        let (out, failed, _measured) =
            bomb(&format!("{backend}: {name}"), command, &args, env).await;
        assert!(failed, "{backend}: {name}: not an error: {out}");
        assert!(
            out.contains(&format!("the command exceeded the {limit}")),
            "{backend}: {name}: {}",
            &out[..out.len().min(600)]
        );
    }
}

#[cfg_attr(
    not(landlock_tests),
    ignore = "needs a kernel with Landlock (Linux 5.13+); TAH_TEST_LANDLOCK=on to force"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bombs_end_as_limit_errors_under_landlock() {
    if is_postgres() {
        return;
    }
    bombs("landlock", &["--sandbox", "landlock"], &[]).await;
}

#[cfg_attr(
    not(sandbox_tests),
    ignore = "needs bubblewrap: install it (apt-get install bubblewrap), then touch build.rs"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bombs_end_as_limit_errors_under_bwrap() {
    if is_postgres() {
        return;
    }
    bombs("bwrap", &["--sandbox", "bwrap"], &[]).await;
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
            text.contains(marker) && !text.contains("cargo") && !text.contains("sandbox-exec")
        })
        .collect()
}

#[cfg_attr(
    not(landlock_tests),
    ignore = "needs a kernel with Landlock (Linux 5.13+); TAH_TEST_LANDLOCK=on to force"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_landlock_nothing_a_call_starts_outlives_it() {
    if is_postgres() {
        return;
    }
    let marker = format!("tah-escape-{}", uuid::Uuid::now_v7().simple());
    // One call exits at once, leaving a process that left its group; one times out with one.
    let (server, _model, _dir) = server(
        vec![
            call(
                "e",
                "shell",
                json!({ "command": format!("(setsid sh -c 'sleep 1000; : {marker}-e' &); echo left") }),
            ),
            call(
                "t",
                "shell",
                json!({
                    "command": format!("setsid sh -c 'sleep 1000; : {marker}-t' & sleep 1000"),
                    "timeout_s": 2
                }),
            ),
        ],
        &["--sandbox", "landlock"],
        &[],
    )
    .await;
    let id = server.create_session().await;
    server.start_run(&id, "escape").await;
    ended(&server, &id).await;
    let events = server.events(&id).await;
    assert!(output_of(&events, "e").contains("left"));
    assert!(output_of(&events, "t").contains("timed out after 2 s"));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !pids_with(&marker).is_empty() {
        assert!(
            Instant::now() < deadline,
            "processes outlived their call: {:?}",
            pids_with(&marker)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg_attr(
    not(landlock_tests),
    ignore = "needs a kernel with Landlock (Linux 5.13+); TAH_TEST_LANDLOCK=on to force"
)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_landlock_a_cancelled_call_leaves_nothing_behind() {
    if is_postgres() {
        return;
    }
    let marker = format!("tah-cancel-{}", uuid::Uuid::now_v7().simple());
    let command =
        format!("setsid sh -c 'sleep 1000; : {marker}-a' & sh -c 'sleep 1000; : {marker}-b'");
    let (server, _model, _dir) = server(
        vec![call("c", "shell", json!({ "command": command }))],
        &["--sandbox", "landlock"],
        &[],
    )
    .await;
    let id = server.create_session().await;
    server.start_run(&id, "cancel me").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids_with(&marker).len() < 2 {
        assert!(Instant::now() < deadline, "the command never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.cancel(&id).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !pids_with(&marker).is_empty() {
        assert!(
            Instant::now() < deadline,
            "processes outlived their cancelled call: {:?}",
            pids_with(&marker)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
