//! Load: 300 sessions run 3 turns each at once (mock model without delay), while one SSE
//! subscriber follows each of 50 of them. No request may fail, and every session's log must be
//! whole: as many events as its `last_seq`, seq contiguous, and each subscriber's frames equal
//! to the log.
//!
//! Concurrency policy: turns use `?wait=true`, so a run in progress is a request in flight; a
//! semaphore keeps at most 200 of them in flight, below the server's default cap of 256
//! concurrent runs. A 429 is therefore never expected: any is retried (after a short pause)
//! and counted separately, and the test requires the count to be zero.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::join_all;
use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio::sync::{watch, Semaphore};

use crate::hardening::checks::{seq_breaks, Problems};
use crate::hardening::sse::{compare, follow};
use crate::support::{Api, ServerOptions, TestServer};

const SESSIONS: usize = 300;
const TURNS: usize = 3;
const SUBSCRIBED: usize = 50;
const IN_FLIGHT: usize = 200;

#[derive(Default)]
struct Counters {
    turns: AtomicUsize,
    too_many: AtomicUsize,
    errors: Mutex<Vec<String>>,
}

impl Counters {
    fn error(&self, what: String) {
        self.errors.lock().unwrap().push(what);
    }
}

/// Three turns on one session, each holding one of the in-flight permits.
async fn drive(
    api: Api,
    id: String,
    permits: Arc<Semaphore>,
    counters: Arc<Counters>,
) -> Option<i64> {
    for turn in 0..TURNS {
        let path = format!("/v1/sessions/{id}/runs?wait=true");
        let input = json!({ "input": format!("load turn {turn}") });
        let mut attempts = 0;
        loop {
            attempts += 1;
            let permit = permits.acquire().await.expect("the semaphore");
            let reply = api.call(Method::POST, &path, Some(&input)).await;
            drop(permit);
            match reply {
                Ok(r) if r.status == StatusCode::OK && r.body["status"] == "completed" => {
                    counters.turns.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                Ok(r) if r.status == StatusCode::TOO_MANY_REQUESTS && attempts < 50 => {
                    counters.too_many.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(r) => {
                    counters.error(format!("POST {path}: {} {}", r.status, r.body));
                    return None;
                }
                Err(e) => {
                    counters.error(e);
                    return None;
                }
            }
        }
    }
    match api
        .call(Method::GET, &format!("/v1/sessions/{id}"), None)
        .await
    {
        Ok(r) if r.status == StatusCode::OK && r.body["state"] == "completed" => {
            r.body["last_seq"].as_i64()
        }
        Ok(r) => {
            counters.error(format!(
                "GET /v1/sessions/{id} after its turns: {} {}",
                r.status, r.body
            ));
            None
        }
        Err(e) => {
            counters.error(e);
            None
        }
    }
}

pub async fn run() {
    let mut server = TestServer::start(
        ServerOptions::new()
            .args(&["--mock-delay-ms", "0"])
            .paged_by(500),
    )
    .await;
    let api = server.api.clone();
    let counters = Arc::new(Counters::default());

    // Sessions, 32 creations at a time.
    let creations = Arc::new(Semaphore::new(32));
    let ids: Vec<String> = join_all((0..SESSIONS).map(|_| {
        let (api, creations) = (api.clone(), creations.clone());
        async move {
            let _permit = creations.acquire().await.expect("the semaphore");
            let reply = api.try_create_session().await.expect("POST /v1/sessions");
            assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
            reply.body["id"].as_str().expect("id").to_string()
        }
    }))
    .await;

    // Subscribers first (from the start of the log), then all the turns at once.
    let mut targets = Vec::new();
    let mut followers = Vec::new();
    for id in ids.iter().take(SUBSCRIBED) {
        let (tx, rx) = watch::channel(None);
        targets.push(tx);
        followers.push(tokio::spawn(follow(
            api.clone(),
            id.clone(),
            rx,
            None,
            Duration::from_secs(80),
        )));
    }
    let started = Instant::now();
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    let drivers: Vec<_> = ids
        .iter()
        .map(|id| {
            tokio::spawn(drive(
                api.clone(),
                id.clone(),
                permits.clone(),
                counters.clone(),
            ))
        })
        .collect();
    let mut finals = Vec::new();
    for (n, driver) in drivers.into_iter().enumerate() {
        let last = driver.await.expect("a driver task");
        if let (Some(last), Some(tx)) = (last, targets.get(n)) {
            let _ = tx.send(Some(last));
        }
        finals.push(last);
    }
    let elapsed = started.elapsed();
    let turns = counters.turns.load(Ordering::Relaxed);

    let mut problems = Problems::default();
    for e in counters.errors.lock().unwrap().iter() {
        problems.push(format!("request failed: {e}"));
    }
    // Every log: as long as last_seq, contiguous, three completed runs.
    let (mut events, mut lost_or_duplicated) = (0usize, 0usize);
    let mut logs = Vec::new();
    for (id, last) in ids.iter().zip(&finals) {
        let log = api.events(id).await;
        lost_or_duplicated += seq_breaks(&log, id, &mut problems);
        if let Some(last) = last {
            if log.len() as i64 != *last {
                lost_or_duplicated += 1;
                problems.push(format!(
                    "session {id}: {} events for last_seq {last}",
                    log.len()
                ));
            }
        }
        let finished = log.iter().filter(|e| e["type"] == "agent.finished").count();
        if finished != TURNS {
            problems.push(format!(
                "session {id}: {finished} agent.finished events, not {TURNS}"
            ));
        }
        events += log.len();
        logs.push(log);
    }
    // Every subscriber saw exactly the log.
    let (mut streamed, mut reconnects, mut mismatched) = (0usize, 0usize, 0usize);
    for (n, follower) in followers.into_iter().enumerate() {
        if finals[n].is_none() {
            follower.abort();
            continue;
        }
        let followed = follower.await.expect("a follower task");
        streamed += followed.events.len();
        reconnects += followed.reconnects;
        problems.extend(followed.problems);
        if !compare(&ids[n], &followed.events, &logs[n], &mut problems) {
            mismatched += 1;
        }
    }
    drop(targets);
    let too_many = counters.too_many.load(Ordering::Relaxed);
    if too_many > 0 {
        problems.push(format!(
            "{too_many} answers 429 although at most {IN_FLIGHT} runs were in flight (cap 256)"
        ));
    }
    let (status, _) = server.terminate(Duration::from_secs(15)).await;
    eprintln!(
        "[load] sessions {SESSIONS}; turns {turns} in {:.2} s = {:.0} turns/s (at most {IN_FLIGHT} in flight); events {events}; lost or duplicated {lost_or_duplicated}; request errors {}; 429s {too_many}; SSE subscribers {SUBSCRIBED}: {streamed} events streamed, {reconnects} reconnects, {mismatched} differing from the log",
        elapsed.as_secs_f64(),
        turns as f64 / elapsed.as_secs_f64(),
        counters.errors.lock().unwrap().len()
    );
    if problems.total > 0 {
        eprintln!("[load] server log tail:\n{}", server.log_tail(40));
    }
    problems.assert_none("load");
    assert_eq!(turns, SESSIONS * TURNS);
    assert!(status.success(), "SIGTERM: exit status {status}");
}
