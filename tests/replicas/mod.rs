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
//! - `approval_survives_takeover`: a run waiting for an approval on A is taken over by B when
//!   A dies, still waiting; the answer sent to B continues it.
//! - `agents_are_shared_by_replicas`: an agent made on A and updated on B is one agent;
//!   pinned and following sessions run the right version on either replica.
//!
//! They need PostgreSQL (see `tests/support`): `TAH_TEST_PG_URL`, or a throwaway cluster this
//! test binary starts itself where PostgreSQL's server binaries are installed; where they are
//! not, the tests are reported as ignored. Each test uses its own database. The tests run one
//! at a time, and not beside a hardening test (`support::alone`: timings are measured). A
//! failing test prints both replicas' logs; `TAH_TEST_LOGS=1` prints them always.

mod control;
mod failover;
mod replica;
mod streaming;

use std::future::Future;

use crate::support::{alone, TestDatabase};

/// Runs one test body alone (`support::alone`), with a database of its own (dropped after a
/// test that passed).
fn run_alone<F, Fut>(name: &str, body: F)
where
    F: FnOnce(TestDatabase) -> Fut,
    Fut: Future<Output = ()>,
{
    let db = TestDatabase::new("tah_r");
    eprintln!("[{name}] database {}", db.name);
    alone::run(name, body(db));
}

/// One test per body, run alone; ignored where this build found no PostgreSQL.
macro_rules! replica_tests {
    ($($name:ident => $body:path),* $(,)?) => {
        $(
            #[test]
            #[cfg_attr(
                not(pg_tests),
                ignore = "needs PostgreSQL: install its server binaries, or set TAH_TEST_PG=on and TAH_TEST_PG_URL"
            )]
            fn $name() {
                run_alone(stringify!($name), $body);
            }
        )*
    };
}

replica_tests!(
    run_on_a_watch_on_b => streaming::run_on_a_watch_on_b,
    cancel_via_b => control::cancel_via_b,
    conflicts_across_replicas => control::conflicts_across_replicas,
    sigkill_takeover => failover::sigkill_takeover,
    sigstop_fencing => failover::sigstop_fencing,
    sigstop_mid_commit => failover::sigstop_mid_commit,
    listener_reconnect => streaming::listener_reconnect,
    graceful_shutdown_handover => failover::graceful_shutdown_handover,
    approval_survives_takeover => failover::approval_survives_takeover,
    agents_are_shared_by_replicas => control::agents_are_shared_by_replicas,
);
