//! The PostgreSQL store, for scale-out: several replicas share one database. It owns the
//! PostgreSQL side of the [`Store`](super::Store) trait with exactly the semantics of the
//! SQLite store (the reference): ids are `uuid`, JSON is `jsonb`, times `timestamptz`, counters
//! `bigint` (see `migrations/postgres`). This file connects and migrates; `read.rs` answers the
//! reads, `write.rs` applies a commit in one transaction, `cluster.rs` coordinates the replicas
//! (leases, fencing, `NOTIFY`/`LISTEN`).
//!
//! Two differences PostgreSQL forces, both invisible to well-formed data:
//! - `jsonb` does not keep key order or formatting; a round trip gives an equal `Value`.
//! - `text` and `jsonb` cannot hold U+0000. Rather than fail the commit (which would poison the
//!   session), NUL characters in free text and in JSON strings/keys are stored as U+FFFD.

mod cluster;
mod read;
mod write;

use std::str::FromStr;

use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::Postgres;
use uuid::Uuid;

use super::{Durability, StoreResult};

/// Connections per replica; PostgreSQL's default `max_connections` (100) leaves room for a few.
const MAX_CONNECTIONS: u32 = 16;

pub struct PostgresStore {
    pool: PgPool,
    /// This replica, named in the notifications of its commits so it can skip its own.
    replica: Uuid,
}

/// The SQLSTATE of "database does not exist".
const INVALID_CATALOG_NAME: &str = "3D000";
/// The SQLSTATE of "database already exists".
const DUPLICATE_DATABASE: &str = "42P04";
/// What PostgreSQL may report instead when two `CREATE DATABASE` of one name race.
const UNIQUE_VIOLATION: &str = "23505";

impl PostgresStore {
    /// Connects to the database at `url` (`postgres://…` or `postgresql://…`), creating the
    /// database if it does not exist yet, and applies the migrations. Concurrent replicas may
    /// call this at once: sqlx serialises migrations with an advisory lock.
    pub async fn open(url: &str) -> StoreResult<PostgresStore> {
        PostgresStore::open_with(url, Durability::default()).await
    }

    /// [`PostgresStore::open`], each connection's commits as durable as `durability` says.
    pub async fn open_with(url: &str, durability: Durability) -> StoreResult<PostgresStore> {
        let pool = match connect(url, durability).await {
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(INVALID_CATALOG_NAME) => {
                match Postgres::create_database(url).await {
                    Ok(()) => {}
                    // Another replica created it first.
                    Err(sqlx::Error::Database(e))
                        if matches!(
                            e.code().as_deref(),
                            Some(DUPLICATE_DATABASE | UNIQUE_VIOLATION)
                        ) => {}
                    Err(e) => return Err(e.into()),
                }
                connect(url, durability).await?
            }
            other => other?,
        };
        sqlx::migrate!("./migrations/postgres").run(&pool).await?;
        Ok(PostgresStore {
            pool,
            replica: Uuid::nil(),
        })
    }

    /// Names the replica in the notifications of its commits.
    pub fn with_replica(mut self, replica: Uuid) -> PostgresStore {
        self.replica = replica;
        self
    }
}

async fn connect(url: &str, durability: Durability) -> Result<PgPool, sqlx::Error> {
    // A replica frozen in the middle of a commit (SIGSTOP, a VM pause) must not hold the
    // session rows it locked for longer than a lease lasts, or no other replica could take its
    // sessions over: PostgreSQL ends such a transaction, and its writes are void.
    let options = PgConnectOptions::from_str(url)?.options([(
        "idle_in_transaction_session_timeout",
        IDLE_IN_TRANSACTION_MS,
    )]);
    // `process` keeps the server's own setting (PostgreSQL's default syncs at each commit).
    let options = match durability {
        Durability::Process => options,
        Durability::Power => options.options([("synchronous_commit", "on")]),
    };
    PgPoolOptions::new()
        .max_connections(MAX_CONNECTIONS)
        .min_connections(1)
        .connect_with(options)
        .await
}

/// A writer's transaction never waits on anything but the database between its statements.
const IDLE_IN_TRANSACTION_MS: &str = "2000";

// The idempotency keys, in the pool (they are not part of a session's batches).
crate::store::keys::idempotency_keys_over_pool!(PostgresStore, |s: &str| s.to_string());

// The sign-ins, in the pool (they are not part of a session's batches).
crate::store::sign_ins::sign_ins_over_pool!(PostgresStore, |s: &str| s.to_string());

// The agents, in the pool (they are not part of a session's batches).
crate::store::agents::agents_over_pool!(PostgresStore, |s: &str| s.to_string());
crate::store::principals::principals_over_pool!(PostgresStore, |s: &str| s.to_string());

// The vaults' sealed secrets, in the pool (they are not part of a session's batches).
crate::store::vaults::vaults_over_pool!(PostgresStore, |s: &str| s.to_string());
// The environments and their workers' calls, in the pool.
crate::store::environments::environments_over_pool!(PostgresStore, |s: &str| s.to_string());

// The schedules and their fires, in the pool (they are not part of a session's batches).
crate::store::schedules::schedules_over_pool!(PostgresStore, |s: &str| s.to_string());

// The replays, in the pool (they are not part of a session's batches).
crate::store::replays::replays_over_pool!(PostgresStore, |s: &str| s.to_string());

// The webhook queue, in the pool (the trigger that fills it runs in the writer's commits).
crate::store::webhooks::webhook_queue_over_pool!(PostgresStore, |s: &str| {
    crate::store::webhooks::sql::postgres(s)
});
