//! Remote environments and workers (`/v1/environments`, `tah worker`), through HTTP and the
//! real binary only: environments as a tenant's resources; a session in a `workers`
//! environment whose file tools and `shell` run on a worker process, in the worker's own
//! workspace; two workers sharing an environment, each call run once; a worker killed with
//! `kill -9` mid `shell` call (the model is told it was interrupted, nothing runs twice, and
//! the timeline is printed) and a claim that lapses mid idempotent call (run again by another
//! worker); no worker at all (the session shows what it waits for, then the timeout's
//! error); a cancelled run's queued call never run by a later worker; a worker with another
//! tenant's key; a server restarted under a connected worker; and, on PostgreSQL, two
//! replicas with a worker each sharing one environment.

mod resource;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::support::fakes::{start_openai, FakeServer};
use crate::support::scripted::{allow_all, asks, call, options, output_of, says};
use crate::support::*;

/// The deployment token of the suite's servers.
const OPERATOR: &str = "workers-operator-token";
/// The lease of the suite's servers (`--worker-lease-s`): short, so a dead worker's call is
/// seen to lapse quickly.
const LEASE_S: u64 = 2;

/// A key of `tenant` in `role`, made by the operator; its bearer value.
async fn key(server: &TestServer, tenant: &str, role: &str) -> String {
    let made = server
        .post_json("/v1/keys", &json!({"tenant": tenant, "role": role}))
        .await
        .expect_json(StatusCode::CREATED, "a key");
    made["key"].as_str().expect("a key").to_string()
}

/// A server on the scripted model `model`, with an operator token, every tool allowed and the
/// suite's lease; `more` flags beside.
async fn server_on(model: &FakeServer, dir: &Path, more: &[&str]) -> TestServer {
    let policy = allow_all(dir);
    let lease = LEASE_S.to_string();
    let options = options(
        model,
        &["--tool-policy", &policy, "--worker-lease-s", &lease],
    )
    .args(more)
    .operator_token(OPERATOR);
    TestServer::start(options).await
}

/// A client with tenant `a`'s admin key, a `workers` environment named `name` of it, and a
/// session in it.
async fn environment_and_session(server: &TestServer, name: &str) -> (Api, String) {
    let admin = server
        .anonymous()
        .with_bearer(&key(server, "a", "admin").await);
    admin
        .post_json(
            "/v1/environments",
            &json!({"name": name, "type": "workers"}),
        )
        .await
        .expect_json(StatusCode::CREATED, "an environment");
    let session = admin
        .post_json("/v1/sessions", &json!({"environment": name}))
        .await
        .expect_json(StatusCode::CREATED, "a session in the environment");
    assert_eq!(session["environment"], name, "{session}");
    (admin, id_of(&session))
}

/// A `tah worker` process.
struct Worker {
    child: Child,
    workspace: tempfile::TempDir,
    log: Arc<Mutex<Vec<String>>>,
}

impl Worker {
    /// Starts `tah worker` for `environment` of `server` with `token`, in a fresh workspace.
    fn start(server: &TestServer, token: &str, environment: &str) -> Worker {
        let workspace = tempfile::Builder::new()
            .prefix("tah-worker-")
            .tempdir()
            .expect("a worker workspace");
        let mut command = Command::new(env!("CARGO_BIN_EXE_tah"));
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("TAH_") {
                command.env_remove(name);
            }
        }
        command
            .args(["worker", "--server", &server.url("")])
            .args(["--token", token, "--environment", environment])
            .arg("--workspace")
            .arg(workspace.path())
            .args(["--poll-s", "2"])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("spawn tah worker");
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let lines = log.clone();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                lines.lock().unwrap().push(line);
            }
        });
        Worker {
            child,
            workspace,
            log,
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.workspace.path().join(rel)
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// `kill -9`.
    async fn kill9(&mut self) {
        self.child.start_kill().expect("kill the worker");
        self.child.wait().await.expect("reap the worker");
    }

    /// Waits for the process to exit by itself; its status.
    async fn exited(&mut self, within: Duration) -> std::process::ExitStatus {
        tokio::time::timeout(within, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the worker did not exit; its log:\n{}", self.log()))
            .expect("wait for the worker")
    }
}

/// Waits until `done` holds, polling; false if it never did within `limit`.
async fn eventually(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done()
}

/// Waits until the session's run has ended; its events.
async fn ended_events(api: &Api, id: &str, limit: Duration) -> Vec<Value> {
    api.poll_session(id, "the run's end", limit, |s| {
        !matches!(s["state"].as_str(), Some("running" | "waiting_tool"))
    })
    .await;
    api.events(id).await
}

/// The fake model: one reply asking for `calls`, then "done".
async fn model_asking(calls: &[crate::support::fakes::FakeToolCall]) -> FakeServer {
    start_openai(vec![asks(calls), says("done")]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_tools_and_shell_run_on_the_worker() {
    let model = model_asking(&[
        call(
            "w1",
            "write_file",
            json!({"path": "made.txt", "content": "from the worker\n"}),
        ),
        call("s1", "shell", json!({"command": "cat made.txt; pwd"})),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let server = server_on(&model, dir.path(), &[]).await;
    let (admin, id) = environment_and_session(&server, "box").await;
    let member = key(&server, "a", "member").await;
    let worker = Worker::start(&server, &member, "box");
    admin.start_run(&id, "make a file").await;
    let events = ended_events(&admin, &id, Duration::from_secs(30)).await;
    let shell = output_of(&events, "s1");
    assert!(shell.contains("from the worker"), "{shell}");
    assert_eq!(
        std::fs::read_to_string(worker.path("made.txt")).unwrap(),
        "from the worker\n"
    );
    assert!(
        !server.workspace().join("made.txt").exists(),
        "the file was written in the server's workspace"
    );
    let requested: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "tool.client-requested")
        .collect();
    assert_eq!(requested.len(), 2, "{events:?}");
    assert!(requested.iter().all(|e| e["data"]["environment"] == "box"));
    let session = admin.session(&id).await;
    assert_eq!(session["state"], "completed", "{session}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_share_an_environment_and_each_call_runs_once() {
    const CALLS: usize = 12;
    let calls: Vec<_> = (0..CALLS)
        .map(|n| {
            call(
                &format!("c{n}"),
                "shell",
                json!({"command": format!("echo c{n} >> ran.log; sleep 0.2")}),
            )
        })
        .collect();
    let model = model_asking(&calls).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server_on(&model, dir.path(), &[]).await;
    let (admin, id) = environment_and_session(&server, "pool").await;
    let member = key(&server, "a", "member").await;
    let workers = [
        Worker::start(&server, &member, "pool"),
        Worker::start(&server, &member, "pool"),
    ];
    admin.start_run(&id, "many calls").await;
    let events = ended_events(&admin, &id, Duration::from_secs(60)).await;
    let mut ran: Vec<String> = workers
        .iter()
        .flat_map(|w| {
            std::fs::read_to_string(w.path("ran.log"))
                .unwrap_or_default()
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    let per_worker: Vec<usize> = workers
        .iter()
        .map(|w| {
            std::fs::read_to_string(w.path("ran.log"))
                .unwrap_or_default()
                .lines()
                .count()
        })
        .collect();
    ran.sort();
    let mut expected: Vec<String> = (0..CALLS).map(|n| format!("c{n}")).collect();
    expected.sort();
    assert_eq!(ran, expected, "each call ran exactly once");
    for n in 0..CALLS {
        let finished = crate::support::scripted::finished(&events, &format!("c{n}"));
        assert_eq!(finished["data"]["is_error"], false, "{finished}");
    }
    println!("calls run by each worker: {per_worker:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_shell_call_is_reported_interrupted_never_rerun() {
    let model = model_asking(&[call(
        "long",
        "shell",
        json!({"command": "echo started >> started.log; sleep 30; echo done >> started.log"}),
    )])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let server = server_on(&model, dir.path(), &[]).await;
    let (admin, id) = environment_and_session(&server, "fragile").await;
    let member = key(&server, "a", "member").await;
    let clock = Instant::now();
    let at = |t: Instant| format!("{:>6} ms", t.duration_since(clock).as_millis());
    let mut first = Worker::start(&server, &member, "fragile");
    admin.start_run(&id, "run something long").await;
    let queued = Instant::now();
    assert!(
        eventually(Duration::from_secs(20), || first
            .path("started.log")
            .exists())
        .await,
        "the first worker never ran the call; its log:\n{}",
        first.log()
    );
    let claimed = Instant::now();
    first.kill9().await;
    let killed = Instant::now();
    let second = Worker::start(&server, &member, "fragile");
    let events = ended_events(&admin, &id, Duration::from_secs(30)).await;
    let answered = Instant::now();
    let output = output_of(&events, "long");
    assert!(
        output.contains("interrupted") && output.contains("may or may not have run"),
        "{output}"
    );
    assert_eq!(
        crate::support::scripted::finished(&events, "long")["data"]["is_error"],
        true
    );
    assert!(
        !second.path("started.log").exists(),
        "the second worker ran the shell call again"
    );
    assert_eq!(
        std::fs::read_to_string(first.path("started.log")).unwrap(),
        "started\n",
        "the killed worker's command did not go on"
    );
    println!("worker kill timeline (since the test began; lease {LEASE_S} s):");
    println!("  call queued (run started)       {}", at(queued));
    println!("  claimed and running on worker 1 {}", at(claimed));
    println!("  worker 1 killed (-9)            {}", at(killed));
    println!(
        "  lease expired (at the latest)   {}",
        at(claimed + Duration::from_secs(LEASE_S))
    );
    println!("  answered as interrupted, seen   {}", at(answered));
    println!("  re-offered: never (shell); worker 2 ran nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_claim_of_an_idempotent_call_is_run_again_by_another_worker() {
    let model = model_asking(&[call("r1", "read_file", json!({"path": "notes.md"}))]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server_on(&model, dir.path(), &[]).await;
    let (admin, id) = environment_and_session(&server, "files").await;
    let member = key(&server, "a", "member").await;
    let worker_api = server.anonymous().with_bearer(&member);
    admin.start_run(&id, "read the notes").await;
    // A worker that claims the call and dies before it answers (it never sends a heartbeat).
    let clock = Instant::now();
    let claim = loop {
        let reply = worker_api
            .post_empty("/v1/environments/files/claims?wait_s=5")
            .await;
        if reply.status == StatusCode::OK {
            break reply.json();
        }
        assert!(
            clock.elapsed() < Duration::from_secs(20),
            "nothing to claim"
        );
    };
    let claimed = clock.elapsed();
    assert_eq!(claim["tool"], "read_file", "{claim}");
    assert_eq!(claim["attempt"], 1, "{claim}");
    let worker = Worker::start(&server, &member, "files");
    std::fs::write(worker.path("notes.md"), "the notes\n").unwrap();
    let events = ended_events(&admin, &id, Duration::from_secs(30)).await;
    let answered = clock.elapsed();
    assert!(output_of(&events, "r1").contains("the notes"), "{events:?}");
    // The dead claim's late result is refused: the call has its answer.
    let late = worker_api
        .post_json(
            &format!(
                "/v1/environments/files/claims/{}/result",
                claim["claim_id"].as_str().unwrap()
            ),
            &json!({"output": "stale"}),
        )
        .await;
    assert_eq!(late.status, StatusCode::NOT_FOUND, "{}", late.text());
    assert!(worker.log().contains("attempt=2"), "{}", worker.log());
    println!(
        "idempotent call: claimed at {} ms, lease {LEASE_S} s, re-run and answered at {} ms",
        claimed.as_millis(),
        answered.as_millis()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_worker_the_call_waits_visibly_then_times_out() {
    let model = model_asking(&[call("s1", "shell", json!({"command": "true"}))]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server_on(&model, dir.path(), &["--approval-timeout-s", "3"]).await;
    let (admin, id) = environment_and_session(&server, "nobody").await;
    admin.start_run(&id, "run it").await;
    let waiting = admin
        .poll_session(&id, "waiting", Duration::from_secs(10), |s| {
            s["state"] == "waiting_tool"
        })
        .await;
    assert_eq!(waiting["environment"], "nobody", "{waiting}");
    let pending = admin
        .get_ok(&format!("/v1/sessions/{id}/tool-results"))
        .await;
    assert_eq!(pending["data"][0]["call_id"], "s1", "{pending}");
    assert_eq!(pending["data"][0]["environment"], "nobody", "{pending}");
    let events = ended_events(&admin, &id, Duration::from_secs(20)).await;
    let output = output_of(&events, "s1");
    assert!(
        output.contains("no worker of environment \\\"nobody\\\" took the call")
            || output.contains("no worker of environment \"nobody\" took the call"),
        "{output}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_of_another_tenant_or_a_viewer_is_refused() {
    let model = model_asking(&[]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server_on(&model, dir.path(), &[]).await;
    let (_admin, _id) = environment_and_session(&server, "mine").await;
    let stranger = key(&server, "b", "admin").await;
    let mut worker = Worker::start(&server, &stranger, "mine");
    let status = worker.exited(Duration::from_secs(20)).await;
    assert!(!status.success(), "{}", worker.log());
    assert!(worker.log().contains("404"), "{}", worker.log());
    let viewer = key(&server, "a", "viewer").await;
    let reply = server
        .anonymous()
        .with_bearer(&viewer)
        .post_empty("/v1/environments/mine/claims?wait_s=0")
        .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.text());
    // Another tenant cannot answer a claim either.
    let reply = server
        .anonymous()
        .with_bearer(&stranger)
        .post_json(
            "/v1/environments/mine/claims/0/result",
            &json!({"output": "x"}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_reconnects_after_the_server_restarts() {
    let model = start_openai(vec![
        asks(&[call(
            "a1",
            "shell",
            json!({"command": "echo one >> ran.log"}),
        )]),
        says("one"),
        asks(&[call(
            "a2",
            "shell",
            json!({"command": "echo two >> ran.log"}),
        )]),
        says("two"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut server = server_on(&model, dir.path(), &["--listen", &listen]).await;
    let admin_key = key(&server, "a", "admin").await;
    let admin = server.anonymous().with_bearer(&admin_key);
    admin
        .post_json(
            "/v1/environments",
            &json!({"name": "steady", "type": "workers"}),
        )
        .await
        .expect_json(StatusCode::CREATED, "an environment");
    let id = id_of(
        &admin
            .post_json("/v1/sessions", &json!({"environment": "steady"}))
            .await
            .expect_json(StatusCode::CREATED, "a session"),
    );
    let member = key(&server, "a", "member").await;
    let worker = Worker::start(&server, &member, "steady");
    admin.start_run(&id, "first").await;
    ended_events(&admin, &id, Duration::from_secs(30)).await;
    server.restart().await;
    let admin = server.anonymous().with_bearer(&admin_key);
    admin.start_run(&id, "second").await;
    let events = ended_events(&admin, &id, Duration::from_secs(60)).await;
    assert_eq!(
        crate::support::scripted::finished(&events, "a2")["data"]["is_error"],
        false
    );
    assert_eq!(
        std::fs::read_to_string(worker.path("ran.log")).unwrap(),
        "one\ntwo\n",
        "{}",
        worker.log()
    );
    assert!(
        worker.log().contains("server unreachable"),
        "the worker never lost the server: {}",
        worker.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_an_environment_and_each_call_runs_once() {
    if !is_postgres() {
        eprintln!("two replicas need PostgreSQL (TAH_TEST_BACKEND=postgres): skipped");
        return;
    }
    const CALLS: usize = 8;
    let calls: Vec<_> = (0..CALLS)
        .map(|n| {
            call(
                &format!("c{n}"),
                "shell",
                json!({"command": format!("echo c{n} >> ran.log; sleep 0.3")}),
            )
        })
        .collect();
    let model = model_asking(&calls).await;
    let dir = tempfile::tempdir().unwrap();
    let a = server_on(&model, dir.path(), &[]).await;
    let policy = allow_all(dir.path());
    let lease = LEASE_S.to_string();
    let b = TestServer::start(
        options(
            &model,
            &["--tool-policy", &policy, "--worker-lease-s", &lease],
        )
        .operator_token(OPERATOR)
        .named("B")
        .database_url(a.database_url()),
    )
    .await;
    let (admin, id) = environment_and_session(&a, "shared").await;
    let member = key(&a, "a", "member").await;
    // One worker dials each replica: the session runs on A, half its results arrive at B.
    let workers = [
        Worker::start(&a, &member, "shared"),
        Worker::start(&b, &member, "shared"),
    ];
    admin.start_run(&id, "many calls").await;
    let events = ended_events(&admin, &id, Duration::from_secs(90)).await;
    let logs: Vec<String> = workers
        .iter()
        .map(|w| std::fs::read_to_string(w.path("ran.log")).unwrap_or_default())
        .collect();
    let mut ran: Vec<&str> = logs.iter().flat_map(|l| l.lines()).collect();
    ran.sort();
    let mut expected: Vec<String> = (0..CALLS).map(|n| format!("c{n}")).collect();
    expected.sort();
    assert_eq!(ran, expected, "each call ran exactly once");
    for n in 0..CALLS {
        let finished = crate::support::scripted::finished(&events, &format!("c{n}"));
        assert_eq!(finished["data"]["is_error"], false, "{finished}");
    }
    let per_replica: Vec<usize> = logs.iter().map(|l| l.lines().count()).collect();
    println!("calls run by the worker of replica A, of B: {per_replica:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_of_a_cancelled_run_is_never_run_by_a_later_worker() {
    let model = model_asking(&[call(
        "s1",
        "shell",
        json!({"command": "echo ran > ran.log"}),
    )])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let server = server_on(&model, dir.path(), &[]).await;
    let (admin, id) = environment_and_session(&server, "late").await;
    admin.start_run(&id, "run it").await;
    admin
        .poll_session(&id, "waiting", Duration::from_secs(10), |s| {
            s["state"] == "waiting_tool"
        })
        .await;
    admin
        .post_empty(&format!("/v1/sessions/{id}/cancel"))
        .await
        .expect_json(StatusCode::OK, "cancel");
    let member = key(&server, "a", "member").await;
    let worker = Worker::start(&server, &member, "late");
    // The worker polls every 200 ms on the server: a few seconds is many chances to run it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !worker.path("ran.log").exists(),
        "a cancelled run's call ran: {}",
        worker.log()
    );
    assert!(!worker.log().contains("running a call"), "{}", worker.log());
}
