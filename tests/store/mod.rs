//! The store conformance suite: every case is a function of an `Arc<dyn Store>` and runs twice,
//! as `<module>::sqlite::<case>` on a fresh SQLite file in a tempdir and as
//! `<module>::postgres::<case>` on a fresh PostgreSQL database (created per test, dropped after)
//! on the test PostgreSQL server: the one `TAH_TEST_PG_URL` names, or a throwaway cluster this
//! test binary starts (see `tests/support`). Where PostgreSQL's server binaries are not
//! installed, the PostgreSQL half is reported as ignored.
//!
//! - `sessions`: records, updates, the list, active sessions, delete.
//! - `messages`: round trips, paging by index, copies for a fork, the start of turn n.
//! - `events`: the log, `last_seq`, large commits.
//! - `runs`: runs, steps and checkpoints.
//! - `commits`: all-or-nothing batches, op order, limits.
//! - `hostile`: JSON of every shape and U+0000 in every text column.
//! - `cluster`: replicas opening one fresh PostgreSQL database together.
//! - `sign_ins`: the page's sign-ins: found until expired or deleted, purged.
//! - `vaults`: sealed secrets per tenant and vault: replaced, listed, deleted.
//! - `writers`: idempotency keys, sign-ins and the webhook queue written while batches commit.
//! - `builders`: the records and ops the cases are made of.

use std::future::Future;
use std::sync::Arc;

use crate::support::postgres::TestDatabase;
use tah::store::{self, Store};
use uuid::Uuid;

/// Declares each case of a module once per backend: `<module>::sqlite::<case>` and
/// `<module>::postgres::<case>`. A module invokes it for its own cases, before they are defined.
macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    crate::store::on_sqlite(super::$case).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[cfg_attr(
                    not(pg_tests),
                    ignore = "needs PostgreSQL: install its server binaries, or set TAH_TEST_PG=on and TAH_TEST_PG_URL"
                )]
                async fn $case() {
                    crate::store::on_postgres(super::$case).await;
                }
            )*
        }
    };
}

async fn on_sqlite<F, Fut>(case: F)
where
    F: FnOnce(Arc<dyn Store>) -> Fut,
    Fut: Future<Output = ()>,
{
    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("tah.db").display());
    let store = store::open(&url, Uuid::nil())
        .await
        .expect("open sqlite store")
        .store;
    case(store).await;
}

async fn on_postgres<F, Fut>(case: F)
where
    F: FnOnce(Arc<dyn Store>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let db = TestDatabase::new("tah_t");
    db.create().await;
    let store = store::open(&db.url, Uuid::nil())
        .await
        .expect("open postgres store")
        .store;
    // Run the case as a task so a failing assertion still lets us drop the database.
    let outcome = tokio::spawn(case(store)).await;
    drop(db);
    if let Err(error) = outcome {
        std::panic::resume_unwind(error.into_panic());
    }
}

mod agents;
mod builders;
mod cluster;
mod commits;
mod events;
mod hostile;
mod messages;
mod runs;
mod sessions;
mod sign_ins;
mod vaults;
mod writers;
