//! The embedded SQLite store: WAL, `synchronous=NORMAL` (`FULL` with `--durability power`), a busy timeout, and `BEGIN IMMEDIATE`
//! for every write transaction. Ids are stored as text, JSON as text, times as RFC 3339. This
//! file opens the database and holds the connection settings of both drivers (`PRAGMAS`);
//! `read.rs` answers the [`Store`](super::Store) reads, `write.rs` applies the writer's batches,
//! `vfs.rs` hands its WAL frames to the file system, `lock.rs` keeps a second process off the
//! same file.
//!
//! Two drivers, on purpose. Reads and migrations use an sqlx pool: async, and WAL lets them run
//! beside the writer. Writes use one `rusqlite` connection that applies a whole batch at once,
//! with cached prepared statements: on the writer task's own thread under `--durability
//! process` (a commit writes the WAL without syncing it; only a checkpoint, every 10,000
//! pages, syncs), on a blocking thread under `power` (each commit syncs). sqlx runs SQLite on
//! a worker thread and every statement is a round trip to it: when writes went through sqlx,
//! 45% of all server samples at mock C=64 were in that worker thread, a turn at C=1 cost about
//! 405 context switches and 450 futex calls, and the round trips capped the mock C=64 run at
//! about 16,000 events/s (~300 turns/s). Through one `rusqlite` connection a turn costs about
//! 45 context switches and 43 futex calls, a hop 20–40 µs, and sqlx's worker threads are 2% of
//! the samples or less (`BENCHMARKS.md`, "Where the time goes"). That connection opens its WAL
//! through a shim (`vfs.rs`) that writes a transaction's frames with one call rather than two
//! per frame.
//! Both drivers run the one SQLite library the build links (see `rusqlite` in `Cargo.toml`).
//!
//! The batch connection is the single writer of the sessions' data: sessions, messages, events,
//! runs, steps, checkpoints, artifacts and blobs. The pool writes too, but only these, which
//! are not part of any session's batch and need an answer at once (a row count, the rows
//! claimed):
//! - the migrations, when the store opens (before any batch);
//! - the idempotency keys (`keys.rs`): claimed, renewed, answered, released, purged;
//! - the sign-ins (`sign_ins.rs`): recorded, deleted, purged;
//! - the agents (`agents.rs`): created and updated (a transaction whose first statement
//!   writes), archived;
//! - the webhook queue (`webhooks.rs`): the endpoints and the trigger (`set_endpoints`, at
//!   start, one short transaction), and the deliveries: claims freed at start, claimed,
//!   recorded as delivered or failed, purged.
//!
//! Why that is safe beside the batches: SQLite lets one connection at a time write a database
//! (WAL's write lock), so these writes and the batches are serialised, never interleaved. Each
//! of them is one statement in its own transaction (`set_endpoints`: a transaction whose first
//! statement writes), so it takes the write lock as it starts, on a fresh snapshot; it never
//! reads first and then asks for the lock, the one case where SQLite fails at once
//! (`SQLITE_BUSY_SNAPSHOT`) instead of waiting. While the lock is taken, both sides wait for it
//! up to `BUSY_TIMEOUT` (a batch in its `BEGIN IMMEDIATE`), and each holds it for one short
//! statement or one batch. Their tables are not the sessions' ones: the only row both sides
//! write is a webhook delivery, inserted by the trigger in the batch that commits its event
//! and later updated by the pool, each a whole transaction under the lock. Routing them
//! through the batch connection instead would queue a request's key behind the group commit and
//! make the writer return rows; it would not change what is written.

mod lock;
mod read;
mod vfs;
mod write;

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};

use super::{Durability, StoreError, StoreResult};
use write::SqliteWriter;

/// How long a statement waits for another connection's write lock before it fails with
/// `SQLITE_BUSY`, on every connection of both drivers (each sets it through its own call).
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Which connections a setting is made on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Connections {
    /// The sqlx pool's and the batch connection.
    Both,
    /// The sqlx pool's only.
    Pool,
    /// The `rusqlite` batch connection only (`write.rs`).
    Batch,
}

/// The connection settings of both drivers: `PRAGMA name = value`, made in this order on each
/// connection as it opens. A setting made on one driver's connections only says why.
const PRAGMAS: [(&str, &str, Connections); 6] = [
    // Kept in the file: the pool's first connection, which creates the database, makes it WAL
    // before the batch connection opens it.
    ("journal_mode", "WAL", Connections::Pool),
    // sqlx's own default, named here so that the list is whole. The schema declares no foreign
    // keys, so it checks nothing, and the batch connection leaves it off (SQLite's default).
    ("foreign_keys", "ON", Connections::Pool),
    // The WAL is not synced at each commit, only at checkpoints: a crash of the machine may
    // lose the last commits, never leave a torn one. `--durability power` makes it `FULL`
    // (synced at each commit) on both drivers: see [`Durability`].
    ("synchronous", "NORMAL", Connections::Both),
    ("temp_store", "MEMORY", Connections::Both),
    // 16 MB of page cache per reader. The batch connection keeps SQLite's 2 MB: 16 MB there
    // raised the peak RSS at C=32 past its target and gained nothing measurable
    // (`BENCHMARKS.md`).
    ("cache_size", "-16000", Connections::Pool),
    // WAL pages after which a commit checkpoints (SQLite's default: 1,000). A page rewritten
    // by many commits is copied into the database once per checkpoint, so fewer checkpoints
    // write less (the WAL grows to ~40 MB). The pool's connections keep 1,000: a pool write
    // (above) that commits while the WAL holds more pages checkpoints it.
    ("wal_autocheckpoint", "10000", Connections::Batch),
];

/// The settings made on `connections`, in order.
fn pragmas(connections: Connections) -> impl Iterator<Item = (&'static str, &'static str)> {
    PRAGMAS
        .into_iter()
        .filter(move |(_, _, on)| *on == connections || *on == Connections::Both)
        .map(|(name, value, _)| (name, value))
}

pub struct SqliteStore {
    /// Reads, migrations and the writes named in the module's doc go through the sqlx pool.
    pool: SqlitePool,
    /// The sessions' writes go through one dedicated connection, a batch per hop.
    writer: SqliteWriter,
    /// Held for the store's life: no second process opens the same database.
    _lock: lock::DatabaseLock,
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `url` and applies the migrations.
    pub async fn open(url: &str) -> StoreResult<SqliteStore> {
        SqliteStore::open_with(url, Durability::default()).await
    }

    /// [`SqliteStore::open`], with `synchronous` set as `durability` needs on both drivers.
    pub async fn open_with(url: &str, durability: Durability) -> StoreResult<SqliteStore> {
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
        let options = pragmas(Connections::Pool)
            .fold(
                SqliteConnectOptions::from_str(url)?
                    .create_if_missing(true)
                    .busy_timeout(BUSY_TIMEOUT),
                |options, (name, value)| options.pragma(name, value),
            )
            // In place of the list's `NORMAL` (the same key keeps its position).
            .pragma("synchronous", durability.sqlite_synchronous());
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
        let writer = SqliteWriter::open(Path::new(path), durability)?;
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

// The agents, in the pool (they are not part of a session's batches).
crate::store::agents::agents_over_pool!(SqliteStore, |s: &str| {
    crate::store::keys::sql::sqlite(s)
});

// The keys and session tokens, in the pool (they are not part of a session's batches).
crate::store::principals::principals_over_pool!(SqliteStore, |s: &str| {
    crate::store::keys::sql::sqlite(s)
});

// The vaults' sealed secrets, in the pool (they are not part of a session's batches).
crate::store::vaults::vaults_over_pool!(SqliteStore, |s: &str| {
    crate::store::keys::sql::sqlite(s)
});

// The schedules and their fires, in the pool (they are not part of a session's batches).
crate::store::schedules::schedules_over_pool!(SqliteStore, |s: &str| {
    crate::store::keys::sql::sqlite(s)
});

// The environments and their workers' calls, in the pool (they are not part of a session's
// batches).
crate::store::environments::environments_over_pool!(SqliteStore, |s: &str| {
    crate::store::keys::sql::sqlite(s)
});

// The replays, in the pool (they are not part of a session's batches).
crate::store::replays::replays_over_pool!(SqliteStore, |s: &str| {
    crate::store::keys::sql::sqlite(s)
});

// The webhook queue, in the pool (the trigger that fills it runs in the writer's commits).
crate::store::webhooks::webhook_queue_over_pool!(SqliteStore, |s: &str| {
    crate::store::webhooks::sql::sqlite(s)
});

#[cfg(test)]
mod tests {
    use std::ops::RangeInclusive;

    use uuid::Uuid;

    use super::*;
    use crate::model::{new_id, now, Event, EventKind, SessionRecord};
    use crate::store::{SessionHistory, Store, WriteOp};

    fn new_session() -> SessionRecord {
        SessionRecord::new(new_id(), None, now())
    }

    fn events(session_id: Uuid, seqs: RangeInclusive<i64>) -> Vec<WriteOp> {
        seqs.map(|seq| {
            let kind = EventKind::AssistantStream {
                step_id: Uuid::nil(),
                text: format!("piece {seq}"),
            };
            WriteOp::insert_event(Event::new(session_id, seq, kind, now()))
        })
        .collect()
    }

    #[tokio::test]
    async fn a_failed_wal_write_fails_its_commit_and_the_store_reads_the_last_good_state() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("tah.db");
        let store = SqliteStore::open(&format!("sqlite://{}", path.display()))
            .await
            .expect("opens");
        let kept = new_session();
        let first = [
            vec![WriteOp::InsertSession(kept.clone())],
            events(kept.id, 1..=3),
        ]
        .concat();
        store.commit(&[&first]).await.expect("the first commit");

        // The frames of the next commit never reach the WAL, as on a full disk.
        super::vfs::faults::fail_write(&path, 0);
        let lost = new_session();
        let failed = [
            vec![WriteOp::InsertSession(lost.clone())],
            events(kept.id, 4..=6),
        ]
        .concat();
        let error = store
            .commit(&[&failed])
            .await
            .expect_err("the commit fails");
        assert!(
            matches!(&error, StoreError::Write(why) if why.contains("I/O")),
            "{error:?}"
        );
        assert!(store.session(lost.id).await.expect("reads").is_none());
        assert_eq!(store.last_seq(kept.id).await.expect("reads"), 3);
        assert_eq!(store.events(kept.id, 0, 100).await.expect("reads").len(), 3);

        // The next commit works, with the seqs the failed one did not take.
        store
            .commit(&[&events(kept.id, 4..=6)])
            .await
            .expect("the next commit");
        assert_eq!(store.last_seq(kept.id).await.expect("reads"), 6);
        assert!(store.session(kept.id).await.expect("reads").is_some());
    }

    #[tokio::test]
    async fn durability_sets_synchronous_on_both_drivers() {
        // SQLite's numbers: NORMAL is 1, FULL is 2.
        for (durability, expected) in [(Durability::Process, 1), (Durability::Power, 2)] {
            let dir = tempfile::tempdir().expect("a directory");
            let url = format!("sqlite://{}", dir.path().join("tah.db").display());
            let store = SqliteStore::open_with(&url, durability)
                .await
                .expect("opens");
            assert_eq!(
                store.writer.pragma("synchronous"),
                expected,
                "{durability:?}"
            );
            let mut pooled = store.pool.acquire().await.expect("a connection");
            let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
                .fetch_one(&mut *pooled)
                .await
                .expect("reads");
            assert_eq!(synchronous, expected, "{durability:?}");
        }
    }
}

#[cfg(test)]
mod migrations {
    use std::borrow::Cow;

    use super::*;
    use crate::model::{new_id, now};
    use crate::store::{SessionHistory, Store, WriteOp};

    /// A new database at `url` with the migrations before `version` applied.
    async fn database_before(url: &str, version: i64) -> SqlitePool {
        let options = SqliteConnectOptions::from_str(url)
            .expect("a URL")
            .create_if_missing(true);
        let pool = SqlitePool::connect_with(options).await.expect("opens");
        let mut before = sqlx::migrate!("./migrations/sqlite");
        before.migrations = Cow::Owned(
            before
                .migrations
                .iter()
                .filter(|m| m.version < version)
                .cloned()
                .collect(),
        );
        before.run(&pool).await.expect("migrates");
        pool
    }

    /// Migration `0020` moves each session's latest checkpoint into its row, in place.
    #[tokio::test]
    async fn a_database_before_0020_keeps_each_sessions_latest_checkpoint() {
        let dir = tempfile::tempdir().expect("a directory");
        let url = format!("sqlite://{}", dir.path().join("tah.db").display());
        let (with, without) = (new_id(), new_id());
        let (run, older, newer) = (new_id(), new_id(), new_id());
        {
            let pool = database_before(&url, 20).await;
            let at = now().to_rfc3339();
            for id in [with, without] {
                sqlx::query(
                    "INSERT INTO sessions (id, state, created_at, updated_at) \
                     VALUES (?, 'idle', ?, ?)",
                )
                .bind(id.to_string())
                .bind(&at)
                .bind(&at)
                .execute(&pool)
                .await
                .expect("a session");
            }
            // The newer one first: the latest is the largest id, not the last row written.
            for (id, step, count) in [(newer, Some(new_id()), 5_i64), (older, None, 3)] {
                sqlx::query(
                    "INSERT INTO checkpoints \
                     (id, session_id, run_id, step_id, message_count, seq, created_at) \
                     VALUES (?, ?, ?, ?, ?, ?, ?)",
                )
                .bind(id.to_string())
                .bind(with.to_string())
                .bind(run.to_string())
                .bind(step.map(|s| s.to_string()))
                .bind(count)
                .bind(count * 10)
                .bind(&at)
                .execute(&pool)
                .await
                .expect("a checkpoint");
            }
            pool.close().await;
        }
        let store = SqliteStore::open(&url).await.expect("opens and migrates");
        let latest = store
            .latest_checkpoint(with)
            .await
            .expect("reads")
            .expect("kept");
        assert_eq!(
            (
                latest.id,
                latest.session_id,
                latest.run_id,
                latest.message_count
            ),
            (newer, with, run, 5)
        );
        assert_eq!(latest.seq, 50);
        assert!(latest.step_id.is_some());
        assert!(store
            .latest_checkpoint(without)
            .await
            .expect("reads")
            .is_none());
    }

    /// Migration `0021` moves each stored event into a row of `event_batches` of its own, in
    /// place: the log reads back the same, from any id, and goes on from where it was.
    #[tokio::test]
    async fn a_database_before_0021_keeps_its_event_log() {
        use crate::model::{Event, EventKind, Published, SessionState};
        let dir = tempfile::tempdir().expect("a directory");
        let url = format!("sqlite://{}", dir.path().join("tah.db").display());
        let (session_id, step_id) = (new_id(), new_id());
        let texts = [
            "plain",
            "naïve 日本語 🦀 \"quoted\" \\ \n\t",
            "nul \u{0} inside",
        ];
        let mut events: Vec<Event> = texts
            .iter()
            .map(|text| EventKind::AssistantStream {
                step_id,
                text: text.to_string(),
            })
            .chain([EventKind::StateChanged {
                from: SessionState::Running,
                to: SessionState::Idle,
            }])
            .enumerate()
            .map(|(i, kind)| Event::new(session_id, i as i64 + 1, kind, now()))
            .collect();
        {
            let pool = database_before(&url, 21).await;
            let at = now().to_rfc3339();
            sqlx::query(
                "INSERT INTO sessions (id, state, created_at, updated_at) \
                 VALUES (?, 'idle', ?, ?)",
            )
            .bind(session_id.to_string())
            .bind(&at)
            .bind(&at)
            .execute(&pool)
            .await
            .expect("a session");
            // In reverse order: the log is read by seq, not by the order rows were written.
            for e in events.iter().rev() {
                let published = Published::new(e.clone());
                sqlx::query(
                    "INSERT INTO events (session_id, seq, type, data, created_at) \
                     VALUES (?, ?, ?, ?, ?)",
                )
                .bind(session_id.to_string())
                .bind(e.seq)
                .bind(e.type_name())
                .bind(published.stored_data().expect("cut"))
                .bind(e.created_at.to_rfc3339())
                .execute(&pool)
                .await
                .expect("an event");
            }
            pool.close().await;
        }
        let store = SqliteStore::open(&url).await.expect("opens and migrates");
        assert_eq!(
            store.events(session_id, 0, 100).await.expect("reads"),
            events
        );
        assert_eq!(
            store.events(session_id, 2, 1).await.expect("reads"),
            events[2..3]
        );
        assert_eq!(store.last_seq(session_id).await.expect("reads"), 4);
        let listed = store
            .session(session_id)
            .await
            .expect("reads")
            .expect("kept");
        assert_eq!(listed.last_seq, 4);

        // The log goes on after the migrated rows; an event stored already is still refused.
        let next = Event::new(
            session_id,
            5,
            EventKind::StateChanged {
                from: SessionState::Idle,
                to: SessionState::Running,
            },
            now(),
        );
        let ops = [WriteOp::insert_event(next.clone())];
        store.commit(&[ops.as_slice()]).await.expect("commits");
        events.push(next);
        assert_eq!(
            store.events(session_id, 0, 100).await.expect("reads"),
            events
        );
        let again = [WriteOp::insert_event(events[1].clone())];
        assert!(store.commit(&[again.as_slice()]).await.is_err());
    }
}
