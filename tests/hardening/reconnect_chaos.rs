//! Reconnect chaos: while sessions run long turns, one SSE client per session drops its
//! connection at random moments (after 0–15 frames or 0–200 ms) and reconnects from the last
//! seq it saw, by `Last-Event-ID` or `?after=`. What it rebuilds must be the stored log, event
//! for event: no gap, no duplicate, nothing altered.

use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio::sync::watch;

use crate::hardening::checks::{check_session, Problems};
use crate::hardening::sse::{compare, follow};
use crate::support::{Api, ServerOptions, TestServer};

const SESSIONS: usize = 4;
const TURNS: usize = 3;

/// Runs the turns of one session in sequence; returns its final seq (or a problem).
async fn drive(api: Api, id: String) -> Result<i64, String> {
    // A long input: the mock quotes it, one streamed piece per word.
    let words: Vec<String> = (0..80).map(|w| format!("word{w}")).collect();
    for turn in 0..TURNS {
        let input = json!({ "input": format!("turn {turn}: {}", words.join(" ")) });
        let path = format!("/v1/sessions/{id}/runs?wait=true");
        let reply = api.call(Method::POST, &path, Some(&input)).await?;
        if reply.status != StatusCode::OK || reply.body["status"] != "completed" {
            return Err(format!("POST {path}: {} {}", reply.status, reply.body));
        }
    }
    let session = api.session(&id).await;
    if session["state"] != "completed" {
        return Err(format!("session {id} after its turns: {session}"));
    }
    session["last_seq"]
        .as_i64()
        .ok_or_else(|| format!("session {id}: no last_seq: {session}"))
}

pub async fn run() {
    let seed = crate::hardening::seed("reconnect_chaos");
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();
    let mut server = TestServer::start(
        ServerOptions::new()
            .args(&["--mock-delay-ms", "3"])
            .paged_by(500),
    )
    .await;
    let api = server.api.clone();

    let mut tasks = Vec::new();
    for _ in 0..SESSIONS {
        let reply = api.try_create_session().await.expect("POST /v1/sessions");
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
        let id = reply.body["id"].as_str().expect("id").to_string();
        let (target_tx, target_rx) = watch::channel(None);
        let follower = tokio::spawn(follow(
            api.clone(),
            id.clone(),
            target_rx,
            Some(StdRng::seed_from_u64(rng.gen())),
            Duration::from_secs(60),
        ));
        let driver = {
            let (api, id) = (api.clone(), id.clone());
            tokio::spawn(async move {
                let result = drive(api, id).await;
                if let Ok(last) = &result {
                    let _ = target_tx.send(Some(*last));
                }
                // Keep the sender until the follower is done (a dropped sender is no target).
                (result, target_tx)
            })
        };
        tasks.push((id, driver, follower));
    }

    let mut problems = Problems::default();
    let (mut reconnects, mut server_ends, mut events, mut out_of_order) = (0, 0, 0, 0);
    for (id, driver, follower) in tasks {
        let (result, target_tx) = driver.await.expect("the driver task");
        if let Err(e) = result {
            problems.push(e);
            drop(target_tx);
            follower.abort();
            continue;
        }
        let followed = follower.await.expect("the follower task");
        drop(target_tx);
        reconnects += followed.reconnects;
        server_ends += followed.server_ends;
        out_of_order += followed.out_of_order;
        problems.extend(followed.problems);
        let facts = check_session(&api, &id, true, &mut problems).await;
        compare(&id, &followed.events, &facts.events, &mut problems);
        let finished = facts
            .events
            .iter()
            .filter(|e| e["type"] == "agent.finished")
            .count();
        if finished != TURNS {
            problems.push(format!(
                "session {id}: {finished} agent.finished events, not {TURNS}"
            ));
        }
        events += facts.events.len();
    }
    let (status, _) = server.terminate(Duration::from_secs(15)).await;
    eprintln!(
        "[reconnect_chaos] sessions {SESSIONS} x {TURNS} turns; events {events}; reconnects {reconnects} (of which {server_ends} ended by the server); out-of-order frames {out_of_order}; {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if problems.total > 0 {
        eprintln!(
            "[reconnect_chaos] server log tail:\n{}",
            server.log_tail(40)
        );
    }
    problems.assert_none("reconnect_chaos");
    assert!(status.success(), "SIGTERM: exit status {status}");
    assert!(
        reconnects > 20,
        "only {reconnects} reconnects: the chaos was too mild to prove much"
    );
}
