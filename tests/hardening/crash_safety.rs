//! Crash safety: 20 clients create sessions and run turns (202 + polling, and `?wait=true`)
//! while the server is killed with SIGKILL at a random moment, five times, and restarted on
//! the same database. Afterwards, for every session: the event log is contiguous, every run has
//! exactly one terminal event (interrupted runs an `agent.failed {error: "interrupted"}`),
//! messages agree with the events; everything a client was told exists; every interrupted
//! session resumes to `completed`; and SQLite's `PRAGMA integrity_check` says `ok`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use sqlx::Connection;

use crate::hardening::checks::{check_session, Problems};
use crate::support::{is_terminal, Api, Next, ServerOptions, SseFrom, TestServer};

const CLIENTS: usize = 20;
const KILLS: usize = 5;

/// What clients were told, across all cycles.
#[derive(Default)]
struct Acked {
    /// Sessions answered 201.
    sessions: HashSet<String>,
    /// Runs answered 202: (session, run).
    runs: Vec<(String, String)>,
    /// `?wait=true` results answered 200: (session, result).
    results: Vec<(String, Value)>,
    /// Events received over SSE: (session, event).
    seen: Vec<(String, Value)>,
    /// Answers no client should ever get, and transport errors while the server was up.
    unexpected: Vec<String>,
}

struct Shared {
    acked: Mutex<Acked>,
    /// Each client's sessions, kept across restarts so later cycles run turns on sessions an
    /// earlier crash interrupted.
    owned: Vec<Mutex<Vec<String>>>,
    /// Set just before the kill: transport errors after it are expected.
    killed: AtomicBool,
    turns_answered: AtomicUsize,
}

impl Shared {
    fn failure(&self, what: String) {
        if !self.killed.load(Ordering::SeqCst) {
            self.acked.lock().unwrap().unexpected.push(what);
        }
    }

    fn unexpected(&self, what: String) {
        self.acked.lock().unwrap().unexpected.push(what);
    }
}

async fn client(n: usize, api: Api, shared: Arc<Shared>, mut rng: StdRng) {
    for round in 0.. {
        let owned: Vec<String> = shared.owned[n].lock().unwrap().clone();
        let id = if !owned.is_empty() && rng.gen_bool(0.35) {
            owned[rng.gen_range(0..owned.len())].clone()
        } else {
            match api.try_create_session().await {
                Ok(reply) if reply.status == StatusCode::CREATED => {
                    let id = reply.body["id"].as_str().unwrap_or_default().to_string();
                    shared.acked.lock().unwrap().sessions.insert(id.clone());
                    shared.owned[n].lock().unwrap().push(id.clone());
                    id
                }
                Ok(reply) => {
                    return shared.unexpected(format!(
                        "POST /v1/sessions: {} {}",
                        reply.status, reply.body
                    ))
                }
                Err(e) => return shared.failure(e),
            }
        };
        for turn in 0..rng.gen_range(1..=3) {
            let input =
                json!({ "input": format!("client {n} round {round} turn {turn}: what is here?") });
            if rng.gen_bool(0.5) {
                let path = format!("/v1/sessions/{id}/runs?wait=true");
                match api.call(Method::POST, &path, Some(&input)).await {
                    Ok(reply) if reply.status == StatusCode::OK => {
                        if reply.body["status"] != "completed" {
                            shared.unexpected(format!("POST {path}: {}", reply.body));
                        }
                        shared.turns_answered.fetch_add(1, Ordering::Relaxed);
                        shared
                            .acked
                            .lock()
                            .unwrap()
                            .results
                            .push((id.clone(), reply.body));
                    }
                    Ok(reply) => {
                        return shared
                            .unexpected(format!("POST {path}: {} {}", reply.status, reply.body))
                    }
                    Err(e) => return shared.failure(e),
                }
            } else {
                let path = format!("/v1/sessions/{id}/runs");
                let (run_id, start_seq) = match api.call(Method::POST, &path, Some(&input)).await {
                    Ok(reply) if reply.status == StatusCode::ACCEPTED => {
                        let run_id = reply.body["id"].as_str().unwrap_or_default().to_string();
                        shared
                            .acked
                            .lock()
                            .unwrap()
                            .runs
                            .push((id.clone(), run_id.clone()));
                        (run_id, reply.body["start_seq"].as_i64().unwrap_or(1))
                    }
                    Ok(reply) => {
                        return shared
                            .unexpected(format!("POST {path}: {} {}", reply.status, reply.body))
                    }
                    Err(e) => return shared.failure(e),
                };
                if rng.gen_bool(0.5) {
                    // Watch the run over SSE: every frame seen must exist after the crash.
                    if let Err(e) = watch(&api, &id, &run_id, start_seq, &shared).await {
                        return shared.failure(e);
                    }
                    shared.turns_answered.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                // Poll the run until it ends (the server is killed long before 30 s).
                let run_path = format!("/v1/sessions/{id}/runs/{run_id}");
                for _ in 0..3_000 {
                    match api.call(Method::GET, &run_path, None).await {
                        Ok(reply) if reply.status == StatusCode::OK => {
                            if reply.body["status"] != "running" {
                                if reply.body["status"] != "completed" {
                                    shared.unexpected(format!("GET {run_path}: {}", reply.body));
                                }
                                shared.turns_answered.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                        }
                        Ok(reply) => {
                            return shared.unexpected(format!(
                                "GET {run_path}: {} {}",
                                reply.status, reply.body
                            ))
                        }
                        Err(e) => return shared.failure(e),
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
}

/// Follows a run's events over SSE until its terminal event, recording every frame.
async fn watch(
    api: &Api,
    id: &str,
    run_id: &str,
    start_seq: i64,
    shared: &Shared,
) -> Result<(), String> {
    let mut frames = api.open_events(id, SseFrom::After(start_seq - 1)).await?;
    loop {
        let event: Value = match frames.next_within(Duration::from_secs(10)).await {
            Next::Timeout => return Err(format!("session {id}: no SSE frame for 10 s")),
            Next::End => {
                return Err(format!(
                    "session {id}: the SSE stream ended before run {run_id} did"
                ))
            }
            Next::Error(e) | Next::Bad(e) => return Err(format!("session {id}: SSE: {e}")),
            Next::Frame(frame) => frame.data,
        };
        let end = is_terminal(&event) && event["data"]["run_id"] == run_id;
        shared
            .acked
            .lock()
            .unwrap()
            .seen
            .push((id.to_string(), event));
        if end {
            return Ok(());
        }
    }
}

pub async fn run() {
    let seed = crate::hardening::seed("crash_safety");
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();
    let mut server = TestServer::start(
        ServerOptions::new()
            .args(&["--mock-delay-ms", "1"])
            .process()
            .paged_by(500),
    )
    .await;
    let shared = Arc::new(Shared {
        acked: Mutex::default(),
        owned: (0..CLIENTS).map(|_| Mutex::default()).collect(),
        killed: AtomicBool::new(false),
        turns_answered: AtomicUsize::new(0),
    });

    let mut kills = 0;
    for cycle in 0..KILLS {
        shared.killed.store(false, Ordering::SeqCst);
        let api = server.api.clone();
        let clients: Vec<_> = (0..CLIENTS)
            .map(|n| {
                let rng = StdRng::seed_from_u64(rng.gen());
                tokio::spawn(client(n, api.clone(), shared.clone(), rng))
            })
            .collect();
        let after = Duration::from_millis(rng.gen_range(200..=800));
        tokio::time::sleep(after).await;
        shared.killed.store(true, Ordering::SeqCst);
        server.kill9().await;
        kills += 1;
        for client in clients {
            client.abort();
            let _ = client.await;
        }
        eprintln!(
            "[crash_safety] cycle {}: kill -9 after {} ms ({} turns answered so far)",
            cycle + 1,
            after.as_millis(),
            shared.turns_answered.load(Ordering::Relaxed)
        );
        server.spawn().await;
    }

    // Settle: the restart recorded the interrupted runs; nothing else is going on.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let api = server.api.clone();
    let mut problems = Problems::default();
    let acked = std::mem::take(&mut *shared.acked.lock().unwrap());
    for what in &acked.unexpected {
        problems.push(format!("a client got {what}"));
    }

    let sessions = api.sessions().await;
    let listed: HashSet<String> = sessions
        .iter()
        .filter_map(|s| s["id"].as_str().map(str::to_string))
        .collect();
    for id in &acked.sessions {
        if !listed.contains(id) {
            problems.push(format!(
                "session {id} was answered 201 but is gone after the crashes"
            ));
        }
    }

    let mut facts = HashMap::new();
    let (mut runs, mut events, mut interrupted_runs) = (0, 0, 0);
    for id in &listed {
        let f = check_session(&api, id, false, &mut problems).await;
        runs += f.runs.len();
        events += f.events.len();
        interrupted_runs += f
            .runs
            .iter()
            .filter(|r| r["error"] == "interrupted")
            .count();
        facts.insert(id.clone(), f);
    }

    // Everything a client was told survived the kills.
    for (sid, rid) in &acked.runs {
        let known = facts
            .get(sid)
            .is_some_and(|f| f.runs.iter().any(|r| r["id"] == rid.as_str()));
        if !known {
            problems.push(format!(
                "run {rid} of session {sid} was answered 202 but is gone"
            ));
        }
    }
    for (sid, result) in &acked.results {
        let stored = facts
            .get(sid)
            .and_then(|f| f.runs.iter().find(|r| r["id"] == result["run_id"]));
        match stored {
            Some(run) if run["status"] == result["status"] && run["text"] == result["text"] => {}
            other => problems.push(format!(
                "session {sid}: ?wait=true answered {result}, but the stored run is {other:?}"
            )),
        }
    }
    for (sid, event) in &acked.seen {
        let stored = event["seq"]
            .as_u64()
            .and_then(|seq| facts.get(sid)?.events.get(seq as usize - 1));
        if stored != Some(event) {
            problems.push(format!(
                "session {sid}: SSE delivered {event} before the crash, the log now has {stored:?}"
            ));
        }
    }
    for f in facts.values() {
        let fine = matches!(f.state.as_str(), "idle" | "completed") || f.interrupted();
        if !fine {
            problems.push(format!(
                "session {}: unexpected final state {} (error {:?})",
                f.id, f.state, f.error
            ));
        }
    }

    // Every interrupted session resumes to completion, and its log goes on without a gap.
    let mut resumed = 0;
    let interrupted: Vec<&String> = facts
        .iter()
        .filter(|(_, f)| f.interrupted())
        .map(|(id, _)| id)
        .collect();
    for id in interrupted {
        let before = &facts[id];
        let path = format!("/v1/sessions/{id}/resume?wait=true");
        match api.call(Method::POST, &path, None).await {
            Ok(reply) if reply.status == StatusCode::OK && reply.body["status"] == "completed" => {
                resumed += 1;
            }
            Ok(reply) => {
                problems.push(format!("POST {path}: {} {}", reply.status, reply.body));
                continue;
            }
            Err(e) => {
                problems.push(e);
                continue;
            }
        }
        let after = check_session(&api, id, true, &mut problems).await;
        if after.state != "completed" {
            problems.push(format!("session {id}: {} after resume", after.state));
        }
        if after.events.len() <= before.events.len()
            || after.events[..before.events.len()] != before.events[..]
        {
            problems.push(format!(
                "session {id}: the log before the resume ({} events) is not a prefix of the log after it ({} events)",
                before.events.len(),
                after.events.len()
            ));
        }
        events += after.events.len() - before.events.len().min(after.events.len());
        runs += after.runs.len() - before.runs.len().min(after.runs.len());
    }

    let (status, took) = server.terminate(Duration::from_secs(15)).await;
    if !status.success() {
        problems.push(format!("SIGTERM after the checks: exit status {status}"));
    }
    let integrity = integrity_check(&server).await;
    if integrity != ["ok"] {
        problems.push(format!("PRAGMA integrity_check: {integrity:?}"));
    }

    eprintln!(
        "[crash_safety] kills {kills}; sessions {} ({} acknowledged); runs {runs} ({} answered 202, {} SSE events seen by clients, {} answered by ?wait=true, {} turns answered); events {events}; interrupted runs {interrupted_runs}; interrupted sessions resumed {resumed}; clean stop in {} ms; integrity_check {integrity:?}; {:.1} s",
        listed.len(),
        acked.sessions.len(),
        acked.runs.len(),
        acked.seen.len(),
        acked.results.len(),
        shared.turns_answered.load(Ordering::Relaxed),
        took.as_millis(),
        started.elapsed().as_secs_f64()
    );
    if problems.total > 0 {
        eprintln!("[crash_safety] server log tail:\n{}", server.log_tail(60));
    }
    assert!(kills == KILLS);
    assert!(
        runs > 0 && interrupted_runs > 0,
        "the kills interrupted no run: the test proved little"
    );
    problems.assert_none("crash_safety");
}

/// `PRAGMA integrity_check` on the database file, with the server stopped.
pub async fn integrity_check(server: &TestServer) -> Vec<String> {
    let url = format!("sqlite://{}", server.database_path().display());
    let mut conn = sqlx::sqlite::SqliteConnection::connect(&url)
        .await
        .expect("open the SQLite file");
    let rows: Vec<String> = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_all(&mut conn)
        .await
        .expect("PRAGMA integrity_check");
    let _ = conn.close().await;
    rows
}
