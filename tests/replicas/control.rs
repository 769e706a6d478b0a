//! Control across replicas: cancel on B reaches a run on A; B refuses what would race with
//! A's run and takes the session once A is done.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::replicas::replica::{self, RUN_LIMIT};
use crate::support::{
    assert_conflict, assert_contiguous, assert_indexes_contiguous, assert_runs,
    assert_tool_calls_answered, describe, has_terminal, is_terminal, words, Subscriber,
    TestDatabase,
};

pub async fn cancel_via_b(db: TestDatabase) {
    let (a, b) = replica::pair(&db.url, /*mock_delay_ms*/ 50).await;
    let (id, run_id, mut on_a) = replica::watched_run(&a, &a, &words(60), /*deltas_seen*/ 3).await;

    let asked = Instant::now();
    let reply = b.api.cancel(&id).await;
    assert_eq!(
        reply["cancelled"],
        json!(true),
        "POST /cancel on B while the run is active on A: {reply}"
    );
    let seen = on_a
        .wait_for(
            "the run's terminal event after the cancel",
            Duration::from_secs(5),
            |seen| has_terminal(seen, Some(&run_id)),
        )
        .await;
    let terminal = seen
        .iter()
        .find(|s| is_terminal(&s.event))
        .expect("a terminal event");
    let took = terminal.at.saturating_duration_since(asked);
    eprintln!(
        "[cancel_via_b] cancel on B -> {} on A's stream in {:.0} ms",
        terminal.kind(),
        took.as_secs_f64() * 1e3
    );
    assert_eq!(
        terminal.kind(),
        "agent.cancelled",
        "the run must end cancelled, not {}",
        terminal.event
    );
    assert!(
        took < Duration::from_secs(2),
        "the run ended {took:?} after the cancel on B (want < 2 s)"
    );

    // Nothing follows; the log (read on B) has exactly one agent.cancelled.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = b.api.events(&id).await;
    assert_contiguous("the log", &log);
    let runs = assert_runs("the log", &log);
    assert_eq!(runs.len(), 1);
    let cancelled = log
        .iter()
        .filter(|e| e["type"] == "agent.cancelled")
        .count();
    assert_eq!(
        cancelled,
        1,
        "exactly one agent.cancelled:\n{}",
        describe(&log)
    );
    assert_eq!(
        log.last().and_then(|e| e["type"].as_str()),
        Some("agent.cancelled"),
        "the log must end with agent.cancelled:\n{}",
        describe(&log)
    );
    for api in [&a.api, &b.api] {
        let session = api.session(&id).await;
        assert_eq!(session["state"], "cancelled", "{}: {session}", api.name);
    }
    let runs = b.api.runs(&id).await;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["status"], "cancelled", "{}", runs[0]);
    // Cancel again (idempotent): nothing to cancel now.
    let again = b.api.cancel(&id).await;
    assert_eq!(again["cancelled"], json!(false), "a second cancel: {again}");
}

pub async fn conflicts_across_replicas(db: TestDatabase) {
    let (a, b) = replica::pair(&db.url, /*mock_delay_ms*/ 30).await;
    let (id, run_id, mut on_b) = replica::watched_run(&a, &b, &words(50), /*deltas_seen*/ 2).await;

    let conflict = b.api.post_run(&id, "a second run").await;
    assert_conflict(&conflict, "POST /runs on B while A runs the session");
    let compact = b
        .api
        .post_empty(&format!("/v1/sessions/{id}/compact"))
        .await;
    assert_conflict(&compact, "POST /compact on B while A runs the session");
    // A refuses too (the run is its own).
    let on_a = a.api.post_run(&id, "a second run").await;
    assert_conflict(&on_a, "POST /runs on A while A runs the session");
    eprintln!(
        "[conflicts_across_replicas] B answered {} / {} (run / compact)",
        conflict.body["type"], compact.body["type"]
    );
    // Refusals write nothing: the run still streams.
    assert_eq!(b.api.session(&id).await["state"], "running");

    // As a user would: once the run's end is seen (on B's stream), run on B at once.
    let seen = on_b
        .wait_for("the end of A's run", RUN_LIMIT, |seen| {
            has_terminal(seen, Some(&run_id))
        })
        .await;
    let first_last_seq = seen.last().map(|s| s.seq()).unwrap_or(0);
    let result = b.api.post_run_wait(&id, "now on B").await;
    assert_eq!(
        result.status,
        StatusCode::OK,
        "a run on B right after A's run ended (terminal event seen at seq {first_last_seq}) must start: got {} {}",
        result.status,
        result.body
    );
    assert_eq!(result.body["status"], "completed", "{}", result.body);

    let log = b.api.events(&id).await;
    assert_contiguous("the log after two runs", &log);
    let runs = assert_runs("the log after two runs", &log);
    assert_eq!(runs.len(), 2, "two runs:\n{}", describe(&log));
    assert_eq!(runs[0].run_id, run_id);
    assert!(runs.iter().all(|r| r.ended_with() == "agent.finished"));
    assert_eq!(
        runs[1].started_seq,
        first_last_seq + 1,
        "B's run continues the seq right after A's run:\n{}",
        describe(&log)
    );
    assert_eq!(
        result.body["run_id"].as_str(),
        Some(runs[1].run_id.as_str())
    );
    // Both replicas agree.
    let log_a: Vec<Value> = a.api.events(&id).await;
    assert_eq!(log_a, log, "A and B read different logs");
    assert_eq!(a.api.session(&id).await["state"], "completed");
    let messages = b.api.messages(&id).await;
    assert_tool_calls_answered(&messages);
    assert_indexes_contiguous(&messages);
    assert_eq!(
        messages.iter().filter(|m| m["role"] == "user").count(),
        2,
        "two user messages"
    );

    // Turn after turn behind a load balancer, as a web client does it: it sees the run end on
    // its stream (from one replica) and sends the next turn at once (to the other one). Each
    // must start: the session is not running any more.
    let mut on_a = Subscriber::open(&a.api, &id, "subscriber on A").await;
    let mut outcomes = Vec::new();
    let mut refused = 0;
    for round in 0..6 {
        let (api, watcher) = if round % 2 == 0 {
            (&a.api, &mut on_b)
        } else {
            (&b.api, &mut on_a)
        };
        let input = format!("turn {round}");
        let mut reply = api.post_run(&id, &input).await;
        outcomes.push(format!(
            "round {round} on {} (right after the previous run's end was streamed): {} {}",
            api.name,
            reply.status,
            if reply.status == StatusCode::ACCEPTED {
                String::new()
            } else {
                reply.body.to_string()
            }
        ));
        if reply.status != StatusCode::ACCEPTED {
            refused += 1;
            // Once the previous holder has released the lease the run starts.
            tokio::time::sleep(Duration::from_millis(300)).await;
            reply = api.post_run(&id, &input).await;
            assert_eq!(
                reply.status,
                StatusCode::ACCEPTED,
                "round {round} on {}: still refused 300 ms later: {}",
                api.name,
                reply.body
            );
        }
        let run_id = reply.body["id"].as_str().expect("run id").to_string();
        watcher
            .wait_for(&format!("the end of round {round}"), RUN_LIMIT, |seen| {
                has_terminal(seen, Some(&run_id))
            })
            .await;
    }
    eprintln!(
        "[conflicts_across_replicas] alternating turns:\n  {}",
        outcomes.join("\n  ")
    );
    let log = b.api.events(&id).await;
    assert_contiguous("the log after alternating turns", &log);
    assert_runs("the log after alternating turns", &log);
    assert_eq!(
        refused,
        0,
        "a run on one replica right after the previous run's end was streamed by the other was \
         refused {refused} time(s) of 6 (the session was completed, not running):\n  {}",
        outcomes.join("\n  ")
    );

    // The same with A's lease release slowed down (300 ms, as on a loaded replica or a slow
    // link): its end is streamed, yet a run on B is refused as long as A still holds the lease.
    // A trigger on the test's database delays only the UPDATE that clears a lease.
    let mut pg = db.connect().await;
    for sql in [
        "CREATE FUNCTION replicas_test_slow_release() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_sleep(0.3); RETURN NEW; END $$",
        "CREATE TRIGGER replicas_test_slow_release BEFORE UPDATE ON sessions FOR EACH ROW \
         WHEN (OLD.lease_owner IS NOT NULL AND NEW.lease_owner IS NULL) \
         EXECUTE FUNCTION replicas_test_slow_release()",
    ] {
        sqlx::query(sql)
            .execute(&mut pg)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    let run = a.api.start_run(&id, "slow release").await;
    let run_id = run["id"].as_str().expect("run id").to_string();
    let seen = on_b
        .wait_for("the end of the run on A", RUN_LIMIT, |seen| {
            has_terminal(seen, Some(&run_id))
        })
        .await;
    let ended = seen.last().map(|s| s.at).expect("events");
    let reply = b.api.post_run_wait(&id, "right after").await;
    let asked_after = ended.elapsed();
    let session = b.api.session(&id).await;
    sqlx::query("DROP TRIGGER replicas_test_slow_release ON sessions")
        .execute(&mut pg)
        .await
        .expect("DROP TRIGGER");
    eprintln!(
        "[conflicts_across_replicas] with a 300 ms lease release on A: run on B answered {:.0} ms \
         after the end was streamed -> {} {}",
        asked_after.as_secs_f64() * 1e3,
        reply.status,
        reply.body["type"]
    );
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "the run on A had ended (its terminal event was streamed by B, the session reads {}), \
         yet POST /runs on B was refused: {} {} — A releases the session's lease only after the \
         run's final commit, so for as long as that takes the session is 'completed' but leased",
        session["state"],
        reply.status,
        reply.body
    );
}

/// Agents live in the shared database: an agent created on A and updated on B is one agent;
/// a session pinned to its first version runs that version on either replica, and a session
/// that follows it runs the version B made.
pub async fn agents_are_shared_by_replicas(db: TestDatabase) {
    let (a, b) = replica::pair(&db.url, /*mock_delay_ms*/ 0).await;
    let created = a
        .api
        .post_json(
            "/v1/agents",
            &json!({"name": "shared", "model": "mock", "system_prompt": "first"}),
        )
        .await
        .expect_json(StatusCode::CREATED, "an agent on A");
    let agent = created["id"].as_str().expect("an id").to_string();
    let pinned = a.api.create_session_with(&json!({"agent": agent})).await;
    let pinned = pinned["id"].as_str().expect("an id").to_string();
    let following = a
        .api
        .create_session_with(&json!({"agent": {"id": agent, "version": "latest"}}))
        .await;
    let following = following["id"].as_str().expect("an id").to_string();
    let updated = b
        .api
        .post_json(
            &format!("/v1/agents/{agent}"),
            &json!({"system_prompt": "second"}),
        )
        .await
        .expect_json(StatusCode::OK, "the agent updated on B");
    assert_eq!(updated["version"], 2);
    assert_eq!(
        a.api.get_ok(&format!("/v1/agents/{agent}")).await["version"],
        2
    );

    // The prompt and version each LLM step of a session's last run was made with.
    let last_prompts = |steps: Vec<Value>| -> Vec<(String, u64)> {
        steps
            .iter()
            .filter(|s| s["type"] == "llm")
            .map(|s| {
                (
                    s["request"]["system_prompt"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    s["request"]["agent"]["version"]
                        .as_u64()
                        .unwrap_or_default(),
                )
            })
            .collect()
    };
    for (replica, name) in [(&a, "A"), (&b, "B")] {
        let run = replica.api.run_wait(&pinned, "hello").await;
        assert_eq!(
            run["status"], "completed",
            "the pinned session on {name}: {run}"
        );
        let run = replica.api.run_wait(&following, "hello").await;
        assert_eq!(
            run["status"], "completed",
            "the following session on {name}: {run}"
        );
    }
    let pinned_steps = last_prompts(a.api.steps(&pinned).await);
    assert!(!pinned_steps.is_empty());
    assert!(
        pinned_steps.iter().all(|s| s == &("first".to_string(), 1)),
        "{pinned_steps:?}"
    );
    let following_steps = last_prompts(b.api.steps(&following).await);
    assert!(!following_steps.is_empty());
    assert!(
        following_steps
            .iter()
            .all(|s| s == &("second".to_string(), 2)),
        "{following_steps:?}"
    );
    let shown = a.api.session(&following).await;
    assert_eq!(shown["agent"]["version"], 2, "{shown}");
    assert_eq!(shown["agent"]["follows_latest"], true, "{shown}");
}
