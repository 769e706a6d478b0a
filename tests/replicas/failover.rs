//! A replica that dies, freezes or stops mid-run: the other one takes the session over,
//! records the run as interrupted, resumes it, and the frozen one's late writes are refused.

use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::Row;
use uuid::Uuid;

use crate::replicas::replica::{self, Replica, RUN_LIMIT};
use crate::support::{
    assert_contiguous, assert_indexes_contiguous, assert_runs, assert_tool_calls_answered,
    describe, words, LoggedRun, Seen, TestDatabase,
};

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The session's lease as stored: owner, epoch, and whether it is unexpired.
async fn lease_of(
    pg: &mut sqlx::PgConnection,
    session_id: Uuid,
) -> (Option<Uuid>, Option<i64>, Option<bool>) {
    let row = sqlx::query(
        "SELECT lease_owner, lease_epoch, lease_expires_at > now() AS live FROM sessions WHERE id = $1",
    )
    .bind(session_id)
    .fetch_one(pg)
    .await
    .expect("read the lease");
    (
        row.get("lease_owner"),
        row.get("lease_epoch"),
        row.get("live"),
    )
}

/// The first `agent.started` of a resume run in `seen`.
fn resume_started(seen: &[Seen]) -> Option<&Seen> {
    seen.iter()
        .find(|s| s.kind() == "agent.started" && s.event["data"]["kind"] == "resume")
}

/// Whether the resume run in `seen` has finished.
fn resume_finished(seen: &[Seen]) -> bool {
    seen.iter().any(|s| {
        s.kind() == "agent.finished"
            && resume_started(seen)
                .is_some_and(|r| r.event["data"]["run_id"] == s.event["data"]["run_id"])
    })
}

/// The log of a takeover: contiguous; the interrupted run ends with exactly one
/// `agent.failed {error: "interrupted"}`, then a resume run finishes; every tool call is
/// answered once. Returns the two runs.
async fn assert_taken_over(
    what: &str,
    replica: &Replica,
    id: &str,
    run_id: &str,
) -> Vec<LoggedRun> {
    let log = replica.api.events(id).await;
    assert_contiguous(what, &log);
    let runs = assert_runs(what, &log);
    assert_eq!(
        runs.len(),
        2,
        "{what}: the interrupted run and its resume expected:\n{}",
        describe(&log)
    );
    let (first, resume) = (&runs[0], &runs[1]);
    assert_eq!(
        first.run_id, run_id,
        "{what}: the first run is the one started on A"
    );
    assert_eq!(
        (first.ended_with(), first.terminal["data"]["error"].as_str()),
        ("agent.failed", Some("interrupted")),
        "{what}: the interrupted run ends with agent.failed interrupted:\n{}",
        describe(&log)
    );
    assert_eq!(resume.kind, "resume", "{what}: the second run is a resume");
    assert_eq!(
        resume.ended_with(),
        "agent.finished",
        "{what}: the resume finishes:\n{}",
        describe(&log)
    );
    assert_eq!(
        log.last().map(|e| e["seq"].clone()),
        Some(resume.terminal["seq"].clone()),
        "{what}: nothing after the resume's agent.finished:\n{}",
        describe(&log)
    );
    let messages = replica.api.messages(id).await;
    assert_tool_calls_answered(&messages);
    assert_indexes_contiguous(&messages);
    let runs_api = replica.api.runs(id).await;
    assert_eq!(runs_api.len(), 2, "{what}: GET /runs: {runs_api:#?}");
    assert_eq!(runs_api[0]["status"], "failed", "{}", runs_api[0]);
    assert_eq!(runs_api[0]["error"], "interrupted", "{}", runs_api[0]);
    assert_eq!(runs_api[1]["kind"], "resume", "{}", runs_api[1]);
    assert_eq!(runs_api[1]["status"], "completed", "{}", runs_api[1]);
    let session = replica.api.session(id).await;
    assert_eq!(session["state"], "completed", "{what}: {session}");
    runs
}

pub async fn sigkill_takeover(db: TestDatabase) {
    let (mut a, b) = replica::pair(&db.url, /*mock_delay_ms*/ 30).await;
    let (id, run_id, mut on_b) = replica::watched_run(&a, &b, &words(60), /*deltas_seen*/ 5).await;

    a.kill9().await;
    let killed = Instant::now();
    // As a user would: poll the session on B until it is completed.
    b.api
        .poll_session(&id, "completed", Duration::from_secs(25), |s| {
            s["state"] == "completed"
        })
        .await;
    let completed = killed.elapsed();
    let seen = on_b
        .wait_for(
            "the resume's agent.finished",
            Duration::from_secs(5),
            |seen| {
                resume_started(seen).is_some() && seen.iter().any(|s| s.kind() == "agent.finished")
            },
        )
        .await;
    let resumed = resume_started(&seen).expect("a resume run").at - killed;
    eprintln!(
        "[sigkill_takeover] kill -9 A -> B's resume run started in {:.0} ms, completed in {:.0} ms (lease ttl {} s)",
        ms(resumed),
        ms(completed),
        replica::LEASE_TTL_SECS
    );
    assert!(
        resumed < Duration::from_secs(10),
        "B took over {resumed:?} after the kill (want within ~10 s)"
    );
    assert_taken_over("the log after the takeover", &b, &id, &run_id).await;
    let streamed: Vec<Value> = on_b.events();
    assert_contiguous("B's stream", &streamed);
    assert_eq!(streamed, b.api.events(&id).await, "B's stream vs the log");
}

pub async fn sigstop_fencing(db: TestDatabase) {
    let (mut a, b) = replica::pair(&db.url, /*mock_delay_ms*/ 100).await;
    let (id, run_id, mut on_b) = replica::watched_run(&a, &b, &words(10), /*deltas_seen*/ 3).await;

    a.signal("STOP");
    let stopped = Instant::now();
    // Wait until B has taken over and the resume completed.
    let waited = on_b
        .wait_for(
            "B's resume to finish while A is stopped",
            Duration::from_secs(30),
            resume_finished,
        )
        .await;
    let resumed = resume_started(&waited).expect("resume").at - stopped;
    b.api
        .poll_session(&id, "completed", Duration::from_secs(5), |s| {
            s["state"] == "completed"
        })
        .await;
    eprintln!(
        "[sigstop_fencing] SIGSTOP A -> B's resume run started in {:.0} ms, finished in {:.0} ms",
        ms(resumed),
        ms(stopped.elapsed())
    );
    let log_before = b.api.events(&id).await;

    a.signal("CONT");
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A's late writes were refused: the log is exactly what it was.
    let log = b.api.events(&id).await;
    assert_contiguous("the log after A woke up", &log);
    assert_runs("the log after A woke up", &log);
    if log != log_before {
        panic!(
            "A's late writes reached the log after it woke up (they must be fenced off)\nbefore:\n{}\nafter:\n{}",
            describe(&log_before),
            describe(&log)
        );
    }
    let runs = assert_taken_over("the log after A woke up", &b, &id, &run_id).await;
    // A noticed (its writes were refused, or its heartbeat found the lease gone) and then
    // leaves the session alone: no repeated warnings about a lease it no longer claims.
    let refused = a.log_lines("lease is held by another replica").len();
    let lost_then = a.log_lines("lost the lease").len();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let lost_now = a.log_lines("lost the lease").len();
    eprintln!(
        "[sigstop_fencing] A's log after waking: {refused} refused write(s), {lost_then} 'lost the lease' \
         warning(s) 2 s after SIGCONT, {lost_now} 1.5 s later"
    );
    let spam = (lost_now > lost_then).then(|| {
        format!(
            "A still warns \"lost the lease of a session\" every heartbeat long after it lost the \
             lease ({lost_then} warnings 2 s after SIGCONT, {lost_now} 1.5 s later): the lease \
             stays in its table of held leases. Its log:\n{}",
            a.log_tail(40)
        )
    });

    // A is alive and serving, and can run the session again (it takes the lease back).
    assert!(a.alive(), "A exited after SIGCONT");
    a.api.get_ok("/healthz").await;
    let session_on_a = a.api.session(&id).await;
    assert_eq!(session_on_a["state"], "completed", "A reads {session_on_a}");
    let result = a.api.run_wait(&id, "again on A").await;
    assert_eq!(result["status"], "completed", "a new run on A: {result}");
    let log = b.api.events(&id).await;
    assert_contiguous("the log after a new run on A", &log);
    let all = assert_runs("the log after a new run on A", &log);
    assert_eq!(all.len(), 3, "three runs:\n{}", describe(&log));
    assert_eq!(
        all[2].started_seq,
        runs[1].terminal_seq + 1,
        "the new run on A continues the seq:\n{}",
        describe(&log)
    );
    assert_eq!(all[2].ended_with(), "agent.finished");
    assert_eq!(result["run_id"].as_str(), Some(all[2].run_id.as_str()));
    let messages = b.api.messages(&id).await;
    assert_tool_calls_answered(&messages);
    assert_indexes_contiguous(&messages);
    // B's subscriber saw all of it, in order.
    on_b.wait_for("the new run's end", Duration::from_secs(5), |seen| {
        seen.len() >= log.len()
    })
    .await;
    assert_eq!(on_b.events(), log, "B's stream vs the log");
    if let Some(spam) = spam {
        panic!("{spam}");
    }
}

pub async fn graceful_shutdown_handover(db: TestDatabase) {
    let (mut a, b) = replica::pair(&db.url, /*mock_delay_ms*/ 30).await;
    let (id, run_id, mut on_b) = replica::watched_run(&a, &b, &words(60), /*deltas_seen*/ 5).await;

    // Who holds the lease while A runs the session.
    let mut pg = db.connect().await;
    let session_id: Uuid = id.parse().expect("session id is a UUID");
    let (owner_a, epoch_a, _) = lease_of(&mut pg, session_id).await;
    assert!(
        owner_a.is_some(),
        "A holds no lease while it runs the session"
    );

    let (status, took) = a.terminate(Duration::from_secs(5)).await;
    let exited = Instant::now();
    let sent = exited - took;
    eprintln!(
        "[graceful_shutdown_handover] SIGTERM -> A exited in {:.0} ms with {status}",
        ms(took)
    );
    assert!(
        status.success(),
        "A exits with status 0 after SIGTERM: {status}"
    );
    // A gave the lease back (or B already holds a new one).
    let (owner, epoch, live) = lease_of(&mut pg, session_id).await;
    assert!(
        owner != owner_a || live != Some(true),
        "A still holds a live lease after its graceful exit (owner {owner:?} epoch {epoch:?}, was {owner_a:?} epoch {epoch_a:?})"
    );

    let seen = on_b
        .wait_for("B's resume run", Duration::from_secs(10), |seen| {
            resume_started(seen).is_some()
        })
        .await;
    let resumed = resume_started(&seen).expect("resume").at;
    eprintln!(
        "[graceful_shutdown_handover] B's resume run started {:.0} ms after SIGTERM ({:.0} ms after A exited)",
        ms(resumed.saturating_duration_since(sent)),
        ms(resumed.saturating_duration_since(exited))
    );
    assert!(
        resumed.saturating_duration_since(sent) < Duration::from_secs(2) + took,
        "B's takeover after a graceful stop took {:?} from SIGTERM (want < 2 s after A exited)",
        resumed.saturating_duration_since(sent)
    );
    on_b.wait_for("the resume's agent.finished", RUN_LIMIT, resume_finished)
        .await;
    assert_taken_over("the log after the handover", &b, &id, &run_id).await;
    assert_eq!(
        on_b.events(),
        b.api.events(&id).await,
        "B's stream vs the log"
    );
    drop(pg);
}

/// What PostgreSQL shows of the test database's connections (for failure reports).
async fn activity(db: &TestDatabase, pg: &mut sqlx::PgConnection) -> String {
    let rows = sqlx::query(
        "SELECT pid, state, wait_event_type, left(query, 70) AS query FROM pg_stat_activity \
         WHERE datname = $1 AND pid <> pg_backend_pid() ORDER BY pid",
    )
    .bind(&db.name)
    .fetch_all(pg)
    .await
    .expect("read pg_stat_activity");
    rows.iter()
        .map(|r| {
            format!(
                "  pid {} state {:?} wait {:?} query {:?}",
                r.get::<i32, _>("pid"),
                r.get::<Option<String>, _>("state"),
                r.get::<Option<String>, _>("wait_event_type"),
                r.get::<Option<String>, _>("query")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Like `sigstop_fencing`, but A freezes in the middle of a commit (a GC pause or a VM stall
/// can land there too): the test holds a lock on `event_batches` until A's writer waits on it inside
/// its transaction, freezes A, then lets the insert through, so A's transaction stays open.
/// B must still take the session over within a few lease TTLs.
pub async fn sigstop_mid_commit(db: TestDatabase) {
    let (a, b) = replica::pair(&db.url, /*mock_delay_ms*/ 30).await;
    let (id, run_id, mut on_b) = replica::watched_run(&a, &b, &words(60), /*deltas_seen*/ 3).await;

    let mut pg = db.connect().await;
    let mut blocker = db.connect().await;
    sqlx::query("BEGIN")
        .execute(&mut blocker)
        .await
        .expect("BEGIN");
    // SHARE conflicts with the inserts' ROW EXCLUSIVE and lets readers through.
    sqlx::query("LOCK TABLE event_batches IN SHARE MODE")
        .execute(&mut blocker)
        .await
        .expect("LOCK TABLE event_batches");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 \
             AND wait_event_type = 'Lock' AND query ILIKE 'insert into event_batches%'",
        )
        .bind(&db.name)
        .fetch_one(&mut pg)
        .await
        .expect("read pg_stat_activity");
        if waiting > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "A's writer never waited on the events lock:\n{}",
            activity(&db, &mut pg).await
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.signal("STOP");
    let stopped = Instant::now();
    sqlx::query("COMMIT")
        .execute(&mut blocker)
        .await
        .expect("COMMIT");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let frozen = activity(&db, &mut pg).await;
    eprintln!("[sigstop_mid_commit] A frozen mid-commit; connections:\n{frozen}");

    let limit = Duration::from_secs(4 * replica::LEASE_TTL_SECS + 2);
    let taken = on_b
        .try_wait_for(limit, |seen| resume_started(seen).is_some())
        .await;
    if let Err((why, seen)) = taken {
        let now = activity(&db, &mut pg).await;
        a.signal("CONT");
        panic!(
            "B did not take over the session of A, frozen in the middle of a commit, within \
             {limit:?} ({why} a resume run; {} events seen on B, the last {:?}). A's open \
             transaction keeps the session row locked (its fence check is SELECT … FOR SHARE): \
             the sweeper's FOR UPDATE SKIP LOCKED skips the session and a takeover would also \
             wait on A's uncommitted event rows; nothing ends that transaction while A is frozen \
             (no idle_in_transaction_session_timeout / lock_timeout). Connections now:\n{now}",
            seen.len(),
            seen.last().map(|s| (s.seq(), s.kind().to_string()))
        );
    }
    let seen = taken.expect("checked");
    let resumed = resume_started(&seen).expect("resume").at - stopped;
    eprintln!(
        "[sigstop_mid_commit] B's resume run started {:.0} ms after A froze",
        ms(resumed)
    );
    on_b.wait_for("the resume's agent.finished", RUN_LIMIT, resume_finished)
        .await;
    let log_before = b.api.events(&id).await;
    a.signal("CONT");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let log = b.api.events(&id).await;
    assert_eq!(
        log, log_before,
        "A's writes after it thawed reached the log"
    );
    assert_taken_over("the log after the takeover", &b, &id, &run_id).await;
    a.api.get_ok("/healthz").await;
}

/// A run that waits for an approval on A survives A's death: B takes the session over,
/// still waiting, and an answer sent to B continues the same run there.
pub async fn approval_survives_takeover(db: TestDatabase) {
    let (mut a, b) = replica::pair(&db.url, /*mock_delay_ms*/ 0).await;
    let id = a.api.create_session().await;
    a.api.start_run(&id, "write a note for the handover").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let call_id = loop {
        let page = b.api.get_ok(&format!("/v1/sessions/{id}/approvals")).await;
        if let Some(call_id) = page["data"][0]["call_id"].as_str() {
            break call_id.to_string();
        }
        assert!(Instant::now() < deadline, "no approval requested: {page}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    a.kill9().await;
    let killed = Instant::now();
    // B answers once it holds the session (until then: 409 session-leased).
    let path = format!("/v1/sessions/{id}/approvals/{call_id}");
    let resolution = loop {
        let reply = b
            .api
            .post_json(&path, &serde_json::json!({"decision": "allow"}))
            .await;
        if reply.status.is_success() {
            break reply.body;
        }
        assert_eq!(reply.status, 409, "{}", reply.body);
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "B never took the session over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(resolution["decision"], "allow", "{resolution}");
    eprintln!(
        "[approval_survives_takeover] kill -9 A -> the answer accepted on B after {:.0} ms",
        ms(killed.elapsed())
    );
    let session = b
        .api
        .poll_session(&id, "completed", Duration::from_secs(15), |s| {
            s["state"] == "completed"
        })
        .await;
    assert_eq!(session["state"], "completed", "{session}");
    assert!(
        b.workspace().join("notes.md").exists(),
        "the note was not written on B"
    );
    let runs = b.api.runs(&id).await;
    assert_eq!(
        runs.len(),
        1,
        "the waiting run was not continued: {runs:#?}"
    );
    assert_eq!(runs[0]["status"], "completed");
    let events = b.api.events(&id).await;
    assert_contiguous("the log", &events);
    assert!(
        !events.iter().any(|e| e["type"] == "agent.failed"),
        "the run was interrupted"
    );
}
