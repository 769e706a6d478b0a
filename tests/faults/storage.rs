//! Storage faults: a disk that fills up during a run (and is freed again), a second process on
//! the same SQLite file, a database made read-only, or deleted, under a running server.
//!
//! The disk and the read-only file system are a small tmpfs this test mounts, so those tests
//! need root (`cfg(mount_tests)`); elsewhere they are reported as ignored.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::faults::hostile::{Behaviour, Hostile};
use crate::support::{
    has_terminal, is_postgres, Next, Reply, ServerOptions, SseFrom, Subscriber, TestServer,
};

/// A tmpfs of `size` mounted on a fresh directory, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("tah-tmpfs-")
            .tempdir()
            .expect("a mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "mount a tmpfs: {status}");
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn remount_read_only(&self) {
        let status = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(self.path())
            .status()
            .expect("run mount");
        assert!(status.success(), "remount read-only: {status}");
    }

    /// Writes a file until the file system is full; returns its path.
    fn fill(&self) -> PathBuf {
        use std::io::Write;
        let path = self.path().join("filler");
        let mut file = std::fs::File::create(&path).expect("create the filler");
        let block = vec![0u8; 64 * 1024];
        while file.write_all(&block).is_ok() {}
        let _ = file.flush();
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.path()).status();
    }
}

/// Asserts that `reply` (to `what`) is a 503 problem whose type ends with `kind`.
fn refused_as(reply: &Reply, kind: &str, what: &str) {
    let problem = reply.expect_problem(StatusCode::SERVICE_UNAVAILABLE, what);
    assert!(
        problem["type"].as_str().unwrap_or("").ends_with(kind),
        "{problem}"
    );
}

async fn ready_status(server: &TestServer) -> StatusCode {
    server.get("/readyz").await.status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mount_tests), ignore = "needs root to mount a tmpfs")]
async fn a_full_disk_stops_the_run_and_the_session_recovers_once_space_is_freed() {
    if is_postgres() {
        return;
    }
    let disk = Tmpfs::mount("4m");
    let url = format!("sqlite://{}", disk.path().join("data.db").display());
    let server = TestServer::start(
        ServerOptions::new()
            .process()
            .database_url(&url)
            .mock_delay_ms(30),
    )
    .await;
    let id = server.create_session().await;
    let mut follower = Subscriber::open(&server.api, &id, "follower").await;
    let waiting = {
        let api = server.api.clone();
        let path = format!("/v1/sessions/{id}/runs?wait=true");
        tokio::spawn(async move { api.post_json(&path, &json!({"input": "fill it up"})).await })
    };
    follower
        .wait_for("a delta", Duration::from_secs(10), |seen| {
            seen.iter().any(|s| s.kind() == "agent.assistant-stream")
        })
        .await;

    let filler = disk.fill();
    let filled_at = Instant::now();
    // The run stops at its first failed write; ?wait=true says why.
    let reply = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("?wait=true answered")
        .expect("the request task");
    refused_as(&reply, "storage-failed", "?wait=true on a full disk");
    assert!(
        filled_at.elapsed() < Duration::from_secs(5),
        "the run went on for {:?} after the disk filled",
        filled_at.elapsed()
    );
    assert_eq!(ready_status(&server).await, StatusCode::SERVICE_UNAVAILABLE);
    let readyz = server.get("/readyz").await.body;
    assert!(
        readyz["detail"].as_str().unwrap_or("").contains("full"),
        "{readyz}"
    );
    // Writes are refused with what happened, not a 500; nothing half-written.
    let reply = server.post_json("/v1/sessions", &json!({})).await;
    refused_as(&reply, "storage-unavailable", "create on a full disk");
    assert!(reply.headers.contains_key("retry-after"));

    std::fs::remove_file(&filler).expect("free the disk");
    let freed_at = Instant::now();
    let session = server
        .poll_session(&id, "failed (storage)", Duration::from_secs(15), |s| {
            s["state"] == "failed"
        })
        .await;
    let recovered_after = freed_at.elapsed();
    assert_eq!(session["error"], "storage", "{session}");
    eprintln!("full disk: the session was recovered {recovered_after:?} after space was freed");
    // The follower got the run's terminal event, or its stream ended while the disk was full
    // and it gets the event when it connects again.
    let terminal = |seen: &[crate::support::Seen]| seen.iter().any(|s| s.kind() == "agent.failed");
    if follower
        .try_wait_for(Duration::from_secs(1), terminal)
        .await
        .is_err()
    {
        follower = Subscriber::open(&server.api, &id, "reconnected").await;
    }
    let seen = follower
        .wait_for("agent.failed", Duration::from_secs(10), terminal)
        .await;
    let failed = seen.iter().find(|s| s.kind() == "agent.failed").unwrap();
    assert_eq!(failed.event["data"]["error"], "storage");
    assert_eq!(ready_status(&server).await, StatusCode::OK);
    // And the run is resumable: the session works again.
    let result = server
        .post_json(&format!("/v1/sessions/{id}/resume?wait=true"), &json!({}))
        .await
        .expect_json(StatusCode::OK, "resume after the disk was freed");
    assert_eq!(result["status"], "completed", "{result}");
    let again = server.run_wait(&id, "and once more").await;
    assert_eq!(again["status"], "completed", "{again}");
}

/// How a follower of a session learnt that its run stopped on a full disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Told {
    /// The run's terminal event (`agent.failed`, `storage`).
    Terminal,
    /// A clean end of its stream.
    Ended,
    /// Neither, in time.
    Nothing,
}

/// What one round of the full-disk scenario showed.
struct Round {
    told: Told,
    /// From the run's failure to what the follower was told.
    after: Duration,
    /// `/readyz` answered 200 while the session was not recorded as failed.
    ready_too_soon: bool,
    /// A follower that reconnected got neither the terminal event nor a reason.
    reconnect_unanswered: Option<String>,
}

/// How long a follower may wait to learn that the run stopped.
const TOLD_WITHIN: Duration = Duration::from_millis(2500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mount_tests), ignore = "needs root to mount a tmpfs")]
async fn followers_always_learn_that_a_run_stopped_on_a_full_disk() {
    if is_postgres() {
        return;
    }
    const ROUNDS: usize = 20;
    let provider = Hostile::start(Behaviour::Flood { piece: 1024 }).await;
    let disk = Tmpfs::mount("2m");
    let started = Instant::now();
    let mut told: BTreeMap<Told, usize> = BTreeMap::new();
    let mut problems = Vec::new();
    let mut slowest = Duration::ZERO;
    for n in 0..ROUNDS {
        let round = full_disk_round(&provider, &disk, n).await;
        *told.entry(round.told).or_default() += 1;
        if round.told != Told::Nothing {
            slowest = slowest.max(round.after);
        }
        if round.told == Told::Nothing {
            problems.push(format!("round {n}: the follower was told nothing"));
        }
        if round.ready_too_soon {
            problems.push(format!(
                "round {n}: /readyz said 200 before the session was recorded"
            ));
        }
        if let Some(why) = round.reconnect_unanswered {
            problems.push(format!("round {n}: a reconnecting follower: {why}"));
        }
        assert!(
            started.elapsed() < Duration::from_secs(240),
            "{n} rounds took {:?}",
            started.elapsed()
        );
    }
    eprintln!(
        "full disk, {ROUNDS} rounds in {:?}: followers told {told:?}; slowest {slowest:?}; \
         {} problems",
        started.elapsed(),
        problems.len()
    );
    assert!(problems.is_empty(), "{problems:#?}");
}

/// Fills a fresh database on `disk` with a run that streams without end, with one follower,
/// and sees what the follower, `/readyz` and a reconnecting follower are told.
async fn full_disk_round(provider: &Hostile, disk: &Tmpfs, n: usize) -> Round {
    let dir = disk.path().join(format!("round-{n}"));
    std::fs::create_dir(&dir).expect("a directory for the round");
    let url = format!("sqlite://{}", dir.join("data.db").display());
    let mut server = TestServer::start(
        ServerOptions::new()
            .process()
            .database_url(&url)
            .args(&["--provider", "openai", "--base-url", &provider.base_url])
            .args(&["--model", "flood", "--max-reply-bytes", "100000000"])
            .env("OPENAI_API_KEY", "sk-flood"),
    )
    .await;
    let id = server.create_session().await;
    let mut follower = Subscriber::open(&server.api, &id, "follower").await;
    let path = format!("/v1/sessions/{id}/runs?wait=true");
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        server.post_json(&path, &json!({"input": "flood"})),
    )
    .await
    .expect("the run stopped within 10 s");
    let failed_at = Instant::now();
    refused_as(&reply, "storage-failed", "?wait=true");
    // Another write, small enough to fit now and then, must not make the server ready.
    let _ = server.post_json("/v1/sessions", &json!({})).await;
    let mut ready_too_soon = ready_before_recorded(&server, &id).await;
    let told = match follower
        .try_wait_for(TOLD_WITHIN, |seen| has_terminal(seen, None))
        .await
    {
        Ok(seen) => {
            let terminal = seen.iter().find(|s| s.kind() == "agent.failed");
            let error = terminal.map(|s| s.event["data"]["error"].clone());
            assert_eq!(error, Some(json!("storage")), "round {n}");
            Told::Terminal
        }
        Err((why, _)) if why.starts_with("the server ended the stream") => Told::Ended,
        Err(_) => Told::Nothing,
    };
    let after = failed_at.elapsed();
    ready_too_soon |= ready_before_recorded(&server, &id).await;
    let reconnect_unanswered = reconnect(&server, &id).await.err();
    ready_too_soon |= ready_before_recorded(&server, &id).await;
    server.kill9().await;
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
    Round {
        told,
        after,
        ready_too_soon,
        reconnect_unanswered,
    }
}

/// Whether `/readyz` answers 200 while the session is not yet recorded as failed (`storage`).
async fn ready_before_recorded(server: &TestServer, id: &str) -> bool {
    if ready_status(server).await != StatusCode::OK {
        return false;
    }
    let session = server.get(&format!("/v1/sessions/{id}")).await.body;
    session["state"] != "failed" || session["error"] != "storage"
}

/// A follower that connects again gets the run's terminal event (the session was recorded as
/// failed), or an answer that says why its stream cannot be served.
async fn reconnect(server: &TestServer, id: &str) -> Result<(), String> {
    let mut stream = match server.api.open_events(id, SseFrom::Start).await {
        Ok(stream) => stream,
        Err(refused) if refused.contains("503") && refused.contains("storage") => return Ok(()),
        Err(refused) => return Err(refused),
    };
    let deadline = Instant::now() + TOLD_WITHIN;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match stream.next_within(left).await {
            Next::Frame(frame) if frame.event == "agent.failed" => return Ok(()),
            Next::Frame(_) => {}
            other => return Err(format!("no terminal event, and then {other:?}")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(mount_tests), ignore = "needs root to mount a tmpfs")]
async fn a_read_only_database_is_refused_at_start_with_a_message_that_says_so() {
    let disk = Tmpfs::mount("4m");
    let db = disk.path().join("data.db");
    let url = format!("sqlite://{}", db.display());
    let mut server = TestServer::start(ServerOptions::new().process().database_url(&url)).await;
    server.create_session().await;
    server.stop().await;
    disk.remount_read_only();
    let output = Command::new(env!("CARGO_BIN_EXE_tah"))
        .args(["serve", "--listen", "127.0.0.1:0", "--database-url", &url])
        .output()
        .expect("run tah");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("read-only"), "{stderr}");
    assert!(stderr.contains(&db.display().to_string()), "{stderr}");
    assert!(!stderr.contains("corrupt"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_on_the_same_database_is_refused_naming_the_first() {
    if is_postgres() {
        return;
    }
    let server = TestServer::start(ServerOptions::new().process()).await;
    let output = Command::new(env!("CARGO_BIN_EXE_tah"))
        .args(["serve", "--listen", "127.0.0.1:0", "--database-url"])
        .arg(server.database_url())
        .output()
        .expect("run a second tah");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("in use"), "{stderr}");
    assert!(
        stderr.contains(&format!("pid {}", server.pid())),
        "{stderr}"
    );
    // Said once, naming the file.
    let path = server.database_path().display().to_string();
    assert_eq!(stderr.matches(&path).count(), 1, "{stderr}");
    // The first server is untouched.
    let id = server.create_session().await;
    assert_eq!(
        server.run_wait(&id, "still mine").await["status"],
        "completed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_deleted_under_the_server_is_noticed() {
    if is_postgres() {
        return;
    }
    let server = TestServer::start(ServerOptions::new().process()).await;
    let id = server.create_session().await;
    assert_eq!(ready_status(&server).await, StatusCode::OK);
    std::fs::remove_file(server.database_path()).expect("delete the database");
    let readyz = server.get("/readyz").await;
    let problem = readyz.expect_problem(StatusCode::SERVICE_UNAVAILABLE, "readyz");
    let detail = problem["detail"].as_str().unwrap_or("");
    eprintln!("/readyz with the database deleted: {detail}");
    assert!(detail.contains("the database file is gone"), "{problem}");
    // The open route does not tell who asks where the database is.
    let file = server.database_path();
    let dir = file.parent().expect("a data directory");
    for shown in [&file, dir] {
        assert!(
            !readyz.text().contains(&*shown.to_string_lossy()),
            "{problem}"
        );
    }
    assert!(!detail.contains('/'), "no path in {problem}");
    let reply = server.post_json("/v1/sessions", &json!({})).await;
    let problem = reply.expect_problem(StatusCode::SERVICE_UNAVAILABLE, "create");
    assert!(
        problem["detail"].as_str().unwrap_or("").contains("restart"),
        "{problem}"
    );
    let reply = server
        .post_json(&format!("/v1/sessions/{id}/runs"), &json!({"input": "hi"}))
        .await;
    reply.expect_problem(StatusCode::SERVICE_UNAVAILABLE, "run");
}
