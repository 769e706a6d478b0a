//! The embedded SQLite store: WAL, `synchronous=NORMAL`, a busy timeout, and `BEGIN IMMEDIATE`
//! for every write transaction. Ids are stored as text, JSON as text, times as RFC 3339. This
//! file opens the database; `read.rs` answers the [`Store`](super::Store) reads, `write.rs`
//! applies the writer's batches, `wal_vfs.rs` hands its WAL frames to the file system, `lock.rs`
//! keeps a second process off the same file.
//!
//! Two drivers, on purpose. Reads and migrations use an sqlx pool: async, and WAL lets them run
//! beside the writer. Writes use one `rusqlite` connection that applies a whole batch in one hop
//! to a blocking thread, with cached prepared statements. sqlx runs SQLite on a worker thread
//! and every statement is a round trip to it: when writes went through sqlx, 45% of all server
//! samples at mock C=64 were in that worker thread, a turn at C=1 cost about 405 context
//! switches and 450 futex calls, and the round trips capped the mock C=64 run at about 16,000
//! events/s (~300 turns/s). Through one `rusqlite` connection a turn costs about 45 context
//! switches and 43 futex calls, a hop 20–40 µs, and sqlx's worker threads are 2% of the samples
//! or less (`BENCHMARKS.md`, "Where the time goes"). That connection opens its WAL through a
//! shim (`wal_vfs.rs`) that writes a transaction's frames with one call rather than two per
//! frame.

mod lock;
mod read;
mod wal_vfs;
mod write;

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::SqliteSynchronous;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

use super::{StoreError, StoreResult};
use write::SqliteWriter;

pub struct SqliteStore {
    /// Reads (and migrations) go through the sqlx pool.
    pool: SqlitePool,
    /// Writes go through one dedicated connection, a batch per hop.
    writer: SqliteWriter,
    /// Held for the store's life: no second process opens the same database.
    _lock: lock::DatabaseLock,
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `url` and applies the migrations.
    pub async fn open(url: &str) -> StoreResult<SqliteStore> {
        let path = url
            .trim_start_matches("sqlite://")
            .trim_start_matches("sqlite:");
        let path = path.split('?').next().unwrap_or("");
        if path.is_empty() || path.starts_with(":memory:") || url.contains("mode=memory") {
            // Every connection would see its own empty database.
            return Err(StoreError::Unsupported(format!(
                "{url}: an in-memory SQLite database cannot be shared by the server's connections; \
                 give a file path"
            )));
        }
        let unusable = |what: String| StoreError::Unusable(format!("the database {path}: {what}"));
        if let Some(parent) = Path::new(path).parent() {
            if !parent.as_os_str().is_empty() {
                std::fs::create_dir_all(parent).map_err(|e| {
                    unusable(format!(
                        "cannot create its directory {}: {e}",
                        parent.display()
                    ))
                })?;
            }
        }
        let lock = lock::DatabaseLock::take(Path::new(path))?;
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .pragma("temp_store", "memory")
            .pragma("cache_size", "-16000");
        // Created if missing by the first connection only: a file deleted later is never made
        // again, empty, by a new connection of the pool.
        let first = <sqlx::sqlite::SqliteConnection as sqlx::Connection>::connect_with(&options)
            .await
            .map_err(|e| unusable(format!("cannot open it: {e}")))?;
        drop(first);
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .min_connections(1)
            .connect_with(options.create_if_missing(false))
            .await
            .map_err(|e| unusable(format!("cannot open it: {e}")))?;
        // Before migrating: a read-only database is refused with a message that says so.
        let writer = SqliteWriter::open(Path::new(path))?;
        sqlx::migrate!("./migrations/sqlite")
            .run(&pool)
            .await
            .map_err(|e| unusable(format!("cannot apply its migrations: {e}")))?;
        Ok(SqliteStore {
            pool,
            writer,
            _lock: lock,
        })
    }
}

// The idempotency keys, in the pool (they are not part of a session's batches).
crate::store::keys::idempotency_keys_over_pool!(SqliteStore, |s: &str| {
    crate::store::keys::sql::sqlite(s)
});

// The sign-ins, in the pool (they are not part of a session's batches).
crate::store::sign_ins::sign_ins_over_pool!(SqliteStore, |s: &str| {
    crate::store::keys::sql::sqlite(s)
});

// The webhook queue, in the pool (the trigger that fills it runs in the writer's commits).
crate::store::webhooks::webhook_queue_over_pool!(SqliteStore, |s: &str| {
    crate::store::webhooks::sql::sqlite(s)
});
