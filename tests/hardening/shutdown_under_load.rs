//! Shutdown under load: with 50 runs in flight (40 started with 202, 10 held open by
//! `?wait=true`) and a few SSE subscribers connected, SIGTERM must end the process within 5 s
//! with exit status 0. After a restart every session is `completed` or `failed` with error
//! `interrupted`, its log is whole, and every interrupted session resumes to `completed`.

use std::time::{Duration, Instant};

use futures::future::join_all;
use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::hardening::checks::{check_session, Problems};
use crate::support::{ServerOptions, SseFrom, TestServer};

const RUNS: usize = 50;
const WAITING: usize = 10;
const EXIT_LIMIT: Duration = Duration::from_secs(5);

pub async fn run() {
    let mut server = TestServer::start(
        ServerOptions::new()
            .args(&["--mock-delay-ms", "20"])
            .process()
            .paged_by(500),
    )
    .await;
    let api = server.api.clone();
    let mut problems = Problems::default();

    let ids: Vec<String> = join_all((0..RUNS).map(|_| {
        let api = api.clone();
        async move {
            let reply = api.try_create_session().await.expect("POST /v1/sessions");
            assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
            reply.body["id"].as_str().expect("id").to_string()
        }
    }))
    .await;

    // 40 runs in the background, 10 with a client waiting for their result.
    // A long input: the mock quotes it word by word, 20 ms a word, so a turn lasts seconds.
    let words: Vec<String> = (0..100).map(|w| format!("w{w}")).collect();
    let text = format!("shutdown under load: {}", words.join(" "));
    let input = json!({ "input": text });
    for id in &ids[WAITING..] {
        api.start_run(id, &text).await;
    }
    let waiting: Vec<_> = ids[..WAITING]
        .iter()
        .map(|id| {
            let (api, input) = (api.clone(), input.clone());
            let path = format!("/v1/sessions/{id}/runs?wait=true");
            tokio::spawn(async move { api.call(Method::POST, &path, Some(&input)).await })
        })
        .collect();
    let mut subscribers = Vec::new();
    for id in ids.iter().take(5) {
        subscribers.push(api.open_events(id, SseFrom::Start).await.expect("SSE"));
    }
    // Let every run get going: all 50 sessions active, then SIGTERM at once.
    let deadline = Instant::now() + Duration::from_secs(10);
    let in_flight = loop {
        let active = api
            .sessions()
            .await
            .iter()
            .filter(|s| s["state"] == "running" || s["state"] == "waiting_tool")
            .count();
        if active == RUNS || Instant::now() > deadline {
            break active;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        in_flight, RUNS,
        "only {in_flight} of {RUNS} runs were in flight"
    );
    let (status, took) = server.terminate(Duration::from_secs(20)).await;
    if !status.success() {
        problems.push(format!("exit status after SIGTERM: {status}"));
    }
    if took > EXIT_LIMIT {
        problems.push(format!(
            "the process took {took:?} to exit after SIGTERM (limit {EXIT_LIMIT:?})"
        ));
    }
    // What the waiting clients got: a result, or the connection closed under them.
    let mut answers = Vec::new();
    for task in waiting {
        answers.push(match task.await.expect("a waiting client") {
            Ok(reply) if reply.status.is_server_error() => {
                problems.push(format!(
                    "a ?wait=true client got {} {}",
                    reply.status, reply.body
                ));
                format!("{}", reply.status)
            }
            Ok(reply) => format!(
                "{} {}/{}",
                reply.status.as_u16(),
                reply.body["status"].as_str().unwrap_or("?"),
                reply.body["error"].as_str().unwrap_or("-")
            ),
            Err(_) => "connection closed".to_string(),
        });
    }
    drop(subscribers);

    server.spawn().await;
    let api = server.api.clone();
    let (mut completed, mut events) = (0, 0);
    let mut interrupted = Vec::new();
    for id in &ids {
        let facts = check_session(&api, id, false, &mut problems).await;
        events += facts.events.len();
        if facts.state == "completed" {
            completed += 1;
        } else if facts.interrupted() {
            interrupted.push(facts);
        } else {
            problems.push(format!(
                "session {id}: {} (error {:?}) after the restart, neither completed nor interrupted",
                facts.state, facts.error
            ));
        }
    }
    // Resume every interrupted session at once.
    let resumes = join_all(interrupted.iter().map(|facts| {
        let api = api.clone();
        let path = format!("/v1/sessions/{}/resume?wait=true", facts.id);
        async move { (api.call(Method::POST, &path, None).await, path) }
    }))
    .await;
    let mut resumed = 0;
    for (facts, (reply, path)) in interrupted.iter().zip(resumes) {
        match reply {
            Ok(reply) if reply.status == StatusCode::OK && reply.body["status"] == "completed" => {
                resumed += 1;
                let after = check_session(&api, &facts.id, true, &mut problems).await;
                if after.events.get(..facts.events.len()) != Some(&facts.events[..]) {
                    problems.push(format!("session {}: the resume rewrote the log", facts.id));
                }
            }
            Ok(reply) => problems.push(format!("POST {path}: {} {}", reply.status, reply.body)),
            Err(e) => problems.push(e),
        }
    }
    let interrupted = interrupted.len();
    let (status2, _) = server.terminate(Duration::from_secs(15)).await;
    let integrity = crate::hardening::crash_safety::integrity_check(&server).await;
    if integrity != ["ok"] {
        problems.push(format!("PRAGMA integrity_check: {integrity:?}"));
    }
    answers.sort();
    eprintln!(
        "[shutdown_under_load] {RUNS} runs in flight; SIGTERM → exit {status} in {} ms; ?wait=true clients got {answers:?}; after restart: {completed} completed, {interrupted} interrupted, {resumed} resumed to completed; events {events}",
        took.as_millis()
    );
    if problems.total > 0 {
        eprintln!(
            "[shutdown_under_load] server log tail:\n{}",
            server.log_tail(60)
        );
    }
    problems.assert_none("shutdown_under_load");
    assert!(status2.success(), "second SIGTERM: exit status {status2}");
}
