//! Scale-out tests of `tah serve`, black-box: two real replicas (A and B) on one PostgreSQL
//! database, driven over HTTP and SSE only (plus signals to the processes, and one
//! `pg_terminate_backend` to cut a replica's notification connection).
//!
//! - `run_on_a_watch_on_b`: a run on A streams live, whole and in order, to a subscriber on B;
//!   prints the cross-replica delivery delay of the token deltas (p50/p99).
//! - `cancel_via_b`: `POST /cancel` on B stops a run on A promptly.
//! - `conflicts_across_replicas`: B refuses a run or a compaction while A runs the session, and
//!   runs it once A is done.
//! - `sigkill_takeover`: A dies (SIGKILL) mid-run; B records the run as interrupted and resumes
//!   it to completion; prints the takeover time.
//! - `sigstop_fencing`: A freezes (SIGSTOP) mid-run; B takes over; once A thaws its late
//!   writes are refused, it keeps serving and can run the session again.
//! - `sigstop_mid_commit`: the same with A frozen inside a commit transaction; B must still
//!   take over.
//! - `listener_reconnect`: B's LISTEN connection is killed mid-run; B's subscribers miss nothing.
//! - `graceful_shutdown_handover`: SIGTERM on A hands its run over to B at once.
//!
//! They need a PostgreSQL server: `TAH_TEST_PG_URL` (see `scripts/pg-test-cluster.sh`); each
//! test uses its own database. Without it every test prints "skipped" and passes, unless
//! `TAH_REQUIRE_PG=1`. The tests run one at a time (timings are measured). A failing test
//! prints both replicas' logs; `REPLICAS_LOGS=1` prints them always.

mod checks;
mod client;
mod control;
mod failover;
mod replica;
mod streaming;

use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rand::Rng;
use sqlx::{Connection, Executor, PgConnection};

static SERIAL: Mutex<()> = Mutex::new(());

/// A database of its own for one test, on the server `TAH_TEST_PG_URL` names.
pub struct TestDb {
    /// The test's database (created by the first replica that opens it).
    pub url: String,
    /// The database named in `TAH_TEST_PG_URL`, for administration.
    admin_url: String,
    pub name: String,
}

impl TestDb {
    /// `None` (after printing why) when no PostgreSQL is configured and none is required.
    fn from_env() -> Option<TestDb> {
        let base = match std::env::var("TAH_TEST_PG_URL") {
            Ok(url) if !url.trim().is_empty() => url.trim().to_string(),
            _ => {
                if std::env::var("TAH_REQUIRE_PG").is_ok_and(|v| v == "1") {
                    panic!("TAH_REQUIRE_PG=1 but TAH_TEST_PG_URL is not set");
                }
                eprintln!("skipped: TAH_TEST_PG_URL not set");
                return None;
            }
        };
        let name = format!("tah_r_{:016x}", rand::thread_rng().gen::<u64>());
        let (path, query) = match base.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (base.as_str(), None),
        };
        let slash = path
            .rfind('/')
            .filter(|&i| i > "postgres://".len())
            .unwrap_or_else(|| panic!("TAH_TEST_PG_URL has no database segment: {base}"));
        let mut url = format!("{}/{name}", &path[..slash]);
        if let Some(query) = query {
            url.push('?');
            url.push_str(query);
        }
        Some(TestDb {
            url,
            admin_url: base,
            name,
        })
    }

    /// A connection to the test's database (it must exist: start a replica first).
    pub async fn connect(&self) -> PgConnection {
        PgConnection::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url))
    }

    /// Drops the database (best effort; the replicas must be gone).
    async fn drop_database(&self) {
        let Ok(mut conn) = PgConnection::connect(&self.admin_url).await else {
            return;
        };
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        if let Err(e) = conn.execute(sql.as_str()).await {
            eprintln!("(could not drop {}: {e})", self.name);
        }
        let _ = conn.close().await;
    }
}

/// Runs one test body alone on its own runtime, with a database of its own.
fn run_alone<F, Fut>(name: &str, body: F)
where
    F: FnOnce(TestDb) -> Fut,
    Fut: Future<Output = ()>,
{
    let Some(db) = TestDb::from_env() else {
        return;
    };
    let _guard: MutexGuard<'_, ()> = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("build the test runtime");
    let started = Instant::now();
    let db_name = db.name.clone();
    let admin = TestDb {
        url: db.url.clone(),
        admin_url: db.admin_url.clone(),
        name: db.name.clone(),
    };
    runtime.block_on(body(db));
    eprintln!(
        "[{name}] done in {:.1} s (database {db_name})",
        started.elapsed().as_secs_f64()
    );
    runtime.block_on(admin.drop_database());
    runtime.shutdown_timeout(Duration::from_secs(2));
}

#[test]
fn run_on_a_watch_on_b() {
    run_alone("run_on_a_watch_on_b", streaming::run_on_a_watch_on_b);
}

#[test]
fn cancel_via_b() {
    run_alone("cancel_via_b", control::cancel_via_b);
}

#[test]
fn conflicts_across_replicas() {
    run_alone(
        "conflicts_across_replicas",
        control::conflicts_across_replicas,
    );
}

#[test]
fn sigkill_takeover() {
    run_alone("sigkill_takeover", failover::sigkill_takeover);
}

#[test]
fn sigstop_fencing() {
    run_alone("sigstop_fencing", failover::sigstop_fencing);
}

#[test]
fn sigstop_mid_commit() {
    run_alone("sigstop_mid_commit", failover::sigstop_mid_commit);
}

#[test]
fn listener_reconnect() {
    run_alone("listener_reconnect", streaming::listener_reconnect);
}

#[test]
fn graceful_shutdown_handover() {
    run_alone(
        "graceful_shutdown_handover",
        failover::graceful_shutdown_handover,
    );
}
