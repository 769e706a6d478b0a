//! One replica under test: the real `tah serve` on 127.0.0.1:0 with the mock model, its own
//! workspace, and the shared PostgreSQL database (see `tests/support`). Replicas are always
//! processes: the tests signal them, look at their sockets, and print their logs when they
//! fail (`TAH_TEST_LOGS=1` prints them always).

use std::time::Duration;

use crate::support::{deltas, ServerOptions, Subscriber, TestServer};

/// The lease TTL of every replica in these tests (the heartbeat renews every ttl/3).
pub const LEASE_TTL_SECS: u64 = 2;

/// How long a whole run of the mock may take.
pub const RUN_LIMIT: Duration = Duration::from_secs(20);

pub type Replica = TestServer;

/// Starts `tah serve` named `name` on `database_url` with `--mock-delay-ms mock_delay_ms`.
pub async fn start(name: &'static str, database_url: &str, mock_delay_ms: u64) -> Replica {
    TestServer::start(
        ServerOptions::new()
            .process()
            .named(name)
            .database_url(database_url)
            .mock_delay_ms(mock_delay_ms)
            .arg("--lease-ttl-secs")
            .arg(&LEASE_TTL_SECS.to_string())
            .paged_by(500),
    )
    .await
}

/// Replicas A and B on `database_url`, both with `--mock-delay-ms mock_delay_ms`.
pub async fn pair(database_url: &str, mock_delay_ms: u64) -> (Replica, Replica) {
    let a = start("A", database_url, mock_delay_ms).await;
    let b = start("B", database_url, mock_delay_ms).await;
    (a, b)
}

/// A new session on `run_on` with a run of `input` under way, and a subscriber on
/// `watched_from` (opened before the run) that has seen `deltas_seen` of its deltas:
/// `(session id, run id, subscriber)`.
pub async fn watched_run(
    run_on: &Replica,
    watched_from: &Replica,
    input: &str,
    deltas_seen: usize,
) -> (String, String, Subscriber) {
    let id = run_on.api.create_session().await;
    let label = format!("subscriber on {}", watched_from.api.name);
    let mut subscriber = Subscriber::open(&watched_from.api, &id, &label).await;
    let run = run_on.api.start_run(&id, input).await;
    let run_id = run["id"].as_str().expect("run id").to_string();
    subscriber
        .wait_for(&format!("{deltas_seen} deltas"), RUN_LIMIT, |seen| {
            deltas(seen) >= deltas_seen
        })
        .await;
    (id, run_id, subscriber)
}
