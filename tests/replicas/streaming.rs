//! Events cross replicas: a run on A is watched live on B, also while B's notification
//! connection is cut.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::Row;

use crate::replicas::replica::{self, Replica, RUN_LIMIT};
use crate::support::{
    assert_contiguous, assert_runs, deltas, describe, first_difference, has_terminal, percentile,
    words, Seen, Subscriber, TestDatabase,
};

/// B's stream equals the stored log exactly.
fn assert_same_as_log(what: &str, seen: &[Value], log: &[Value]) {
    let Some(at) = first_difference(seen, log) else {
        return;
    };
    panic!(
        "{what}: the streamed events differ from the log at #{at} ({} streamed, {} stored)\n\
         streamed: {:?}\nstored:   {:?}\nstreamed events:\n{}\nstored events:\n{}",
        seen.len(),
        log.len(),
        seen.get(at),
        log.get(at),
        describe(seen),
        describe(log)
    );
}

pub async fn run_on_a_watch_on_b(db: TestDatabase) {
    let (a, b) = replica::pair(&db.url, /*mock_delay_ms*/ 5).await;
    let id = a.api.create_session().await;

    // Both subscribed before the run starts.
    let mut on_a = Subscriber::open(&a.api, &id, "subscriber on A").await;
    let mut on_b = Subscriber::open(&b.api, &id, "subscriber on B").await;
    let run = a.api.start_run(&id, &words(120)).await;
    let run_id = run["id"].as_str().expect("run id").to_string();

    let finished = |seen: &[Seen]| {
        seen.iter()
            .any(|s| s.kind() == "agent.finished" && s.event["data"]["run_id"] == run_id.as_str())
    };
    let seen_b = on_b
        .wait_for("agent.finished of the run on A", RUN_LIMIT, finished)
        .await;
    let seen_a = on_a
        .wait_for("agent.finished of the run", RUN_LIMIT, finished)
        .await;
    // Give a stray duplicate or late frame the chance to show up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen_b = {
        let all = on_b.seen();
        assert!(all.len() >= seen_b.len());
        all
    };

    let log = a.api.events(&id).await;
    let streamed_b: Vec<Value> = seen_b.iter().map(|s| s.event.clone()).collect();
    assert_contiguous("B's stream", &streamed_b);
    assert_eq!(
        streamed_b.last().and_then(|e| e["type"].as_str()),
        Some("agent.finished"),
        "B's stream must end with agent.finished:\n{}",
        describe(&streamed_b)
    );
    assert_same_as_log("B's stream vs A's JSON log", &streamed_b, &log);
    assert!(
        on_b.bad_frames().is_empty(),
        "B sent malformed frames: {:?}",
        on_b.bad_frames()
    );
    let runs = assert_runs("the log", &log);
    assert_eq!(runs.len(), 1, "one run expected");
    assert_eq!(runs[0].ended_with(), "agent.finished");
    // The log as read on B is the same as on A.
    assert_same_as_log(
        "B's JSON log vs A's JSON log",
        &b.api.events(&id).await,
        &log,
    );
    let streamed_a: Vec<Value> = on_a.events();
    assert_contiguous("A's stream", &streamed_a);
    assert_same_as_log("A's stream vs A's JSON log", &streamed_a, &log);

    // Cross-replica delay of each token delta: arrival on B minus arrival on A.
    let arrivals_a: HashMap<i64, Instant> = seen_a
        .iter()
        .filter(|s| s.kind() == "agent.assistant-stream")
        .map(|s| (s.seq(), s.at))
        .collect();
    let mut delays: Vec<f64> = seen_b
        .iter()
        .filter(|s| s.kind() == "agent.assistant-stream")
        .filter_map(|s| {
            let at_a = arrivals_a.get(&s.seq())?;
            let ms = if s.at >= *at_a {
                (s.at - *at_a).as_secs_f64() * 1e3
            } else {
                -((*at_a - s.at).as_secs_f64() * 1e3)
            };
            Some(ms)
        })
        .collect();
    assert!(
        delays.len() >= 100,
        "expected 100+ deltas seen on both replicas, got {}",
        delays.len()
    );
    delays.sort_by(|x, y| x.partial_cmp(y).expect("no NaN"));
    let (p50, p99) = (percentile(&delays, 50.0), percentile(&delays, 99.0));
    eprintln!(
        "[run_on_a_watch_on_b] cross-replica delta delay (B arrival - A arrival) over {} deltas: \
         p50 {p50:.2} ms, p99 {p99:.2} ms, min {:.2} ms, max {:.2} ms",
        delays.len(),
        delays[0],
        delays[delays.len() - 1]
    );
    assert!(
        p50 < 1000.0 && p99 < 5000.0,
        "cross-replica delivery is implausibly slow: p50 {p50:.1} ms, p99 {p99:.1} ms"
    );
}

/// The PostgreSQL backend pids of `replica`'s LISTEN connection(s): its sockets (from /proc)
/// matched with `pg_stat_activity.client_port`.
async fn listen_backends(
    db: &TestDatabase,
    replica: &Replica,
    conn: &mut sqlx::PgConnection,
) -> Vec<i32> {
    let ports = local_ports_of(replica.pid());
    let rows = sqlx::query(
        "SELECT pid, client_port, query FROM pg_stat_activity \
         WHERE datname = $1 AND pid <> pg_backend_pid() AND query ILIKE 'listen%'",
    )
    .bind(&db.name)
    .fetch_all(&mut *conn)
    .await
    .expect("read pg_stat_activity");
    let mut pids = Vec::new();
    for row in rows {
        let pid: i32 = row.get("pid");
        let port: Option<i32> = row.get("client_port");
        if port.is_some_and(|p| ports.contains(&(p as u16))) {
            pids.push(pid);
        }
    }
    pids
}

/// Local TCP ports of the sockets process `pid` holds (Linux /proc).
fn local_ports_of(pid: u32) -> Vec<u16> {
    let mut inodes = Vec::new();
    if let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for entry in entries.flatten() {
            if let Ok(target) = std::fs::read_link(entry.path()) {
                let target = target.to_string_lossy().to_string();
                if let Some(inode) = target
                    .strip_prefix("socket:[")
                    .and_then(|s| s.strip_suffix(']'))
                {
                    inodes.push(inode.to_string());
                }
            }
        }
    }
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 10 || !inodes.iter().any(|i| i == fields[9]) {
                continue;
            }
            if let Some(port) = fields[1]
                .rsplit(':')
                .next()
                .and_then(|hex| u16::from_str_radix(hex, 16).ok())
            {
                ports.push(port);
            }
        }
    }
    ports
}

pub async fn listener_reconnect(db: TestDatabase) {
    let (a, b) = replica::pair(&db.url, /*mock_delay_ms*/ 30).await;
    let id = a.api.create_session().await;
    let mut pg = db.connect().await;

    let mut on_b = Subscriber::open(&b.api, &id, "subscriber on B").await;
    // B's listener is up once it has LISTENed (it starts with the replica).
    let deadline = Instant::now() + Duration::from_secs(10);
    let before = loop {
        let pids = listen_backends(&db, &b, &mut pg).await;
        if !pids.is_empty() {
            break pids;
        }
        assert!(
            Instant::now() < deadline,
            "no LISTEN connection of B (pid {}) found in pg_stat_activity",
            b.pid()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    let run = a.api.start_run(&id, &words(40)).await;
    let run_id = run["id"].as_str().expect("run id").to_string();
    let seen = on_b
        .wait_for("5 deltas on B", RUN_LIMIT, |seen| deltas(seen) >= 5)
        .await;
    let seen_at_kill = seen.len();
    let killed: Vec<bool> =
        sqlx::query_scalar("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid")
            .bind(&before)
            .fetch_all(&mut pg)
            .await
            .expect("pg_terminate_backend");
    assert!(
        killed.iter().all(|k| *k),
        "could not terminate B's LISTEN backend(s) {before:?}: {killed:?}"
    );
    let killed_at = Instant::now();
    eprintln!(
        "[listener_reconnect] terminated B's LISTEN backend(s) {before:?} after {seen_at_kill} events on B"
    );

    let seen = on_b
        .wait_for(
            "agent.finished after the LISTEN connection was killed",
            RUN_LIMIT,
            |seen| has_terminal(seen, Some(&run_id)),
        )
        .await;
    let log = a.api.events(&id).await;
    let streamed: Vec<Value> = seen.iter().map(|s| s.event.clone()).collect();
    assert_contiguous("B's stream", &streamed);
    assert_eq!(
        streamed.last().and_then(|e| e["type"].as_str()),
        Some("agent.finished"),
        "B's stream must end with agent.finished:\n{}",
        describe(&streamed)
    );
    assert_same_as_log("B's stream vs the log", &streamed, &log);
    let after_kill = seen.iter().filter(|s| s.at > killed_at).count();
    eprintln!(
        "[listener_reconnect] B's subscriber received {after_kill} events after the kill, the last {:.0} ms after it",
        seen.last().map(|s| (s.at - killed_at).as_secs_f64() * 1e3).unwrap_or(0.0)
    );

    // The listener is back: a new LISTEN backend of B, and a second run reaches B live.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = listen_backends(&db, &b, &mut pg).await;
        if now.iter().any(|p| !before.contains(p)) {
            eprintln!("[listener_reconnect] B listens again on backend(s) {now:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "B did not re-establish its LISTEN connection within 10 s (backends now {now:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let second = a.api.start_run(&id, &words(5)).await;
    let second_id = second["id"].as_str().expect("run id").to_string();
    let seen = on_b
        .wait_for("agent.finished of a second run", RUN_LIMIT, |seen| {
            has_terminal(seen, Some(&second_id))
        })
        .await;
    let log = a.api.events(&id).await;
    let streamed: Vec<Value> = seen.iter().map(|s| s.event.clone()).collect();
    assert_contiguous("B's stream (two runs)", &streamed);
    assert_same_as_log("B's stream vs the log (two runs)", &streamed, &log);
    let runs = assert_runs("the log", &log);
    assert_eq!(runs.len(), 2);
    assert!(runs.iter().all(|r| r.ended_with() == "agent.finished"));
    drop(pg);
}
