//! The embedded SQLite store: WAL, `synchronous=NORMAL`, a busy timeout, and `BEGIN IMMEDIATE`
//! for every write transaction. Ids are stored as text, JSON as text, times as RFC 3339.

use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::Row;
use uuid::Uuid;

use super::rows::{
    checkpoint_from, corrupt, corrupt_event, message_from, run_from, session_from, step_from,
    Plain, StoredRow, CHECKPOINT_COLUMNS, EVENT_COLUMNS, MESSAGE_COLUMNS, RUN_COLUMNS,
    SESSION_COLUMNS, STEP_COLUMNS,
};
use super::sqlite_write::SqliteWriter;
use super::{SessionQuery, Store, StoreError, StoreResult, WriteOp};
use crate::model::{
    Checkpoint, Event, Message, RunRecord, SessionRecord, SessionState, StepRecord,
};

pub struct SqliteStore {
    /// Reads (and migrations) go through the sqlx pool.
    pool: SqlitePool,
    /// Writes go through one dedicated connection, a batch per hop.
    writer: SqliteWriter,
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
        if let Some(parent) = std::path::Path::new(path).parent() {
            if !parent.as_os_str().is_empty() {
                std::fs::create_dir_all(parent)?;
            }
        }
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(10))
            .pragma("temp_store", "memory")
            .pragma("cache_size", "-16000");
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .min_connections(1)
            .connect_with(options)
            .await?;
        sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
        let writer = SqliteWriter::open(std::path::Path::new(path))?;
        Ok(SqliteStore { pool, writer })
    }
}

/// Ids, times and JSON are stored as text.
impl StoredRow for SqliteRow {
    fn get<T: Plain>(&self, col: &str) -> StoreResult<T> {
        Ok(self.try_get(col)?)
    }

    fn uuid(&self, col: &str) -> StoreResult<Uuid> {
        let s: String = self.try_get(col)?;
        parse_uuid(col, &s)
    }

    fn opt_uuid(&self, col: &str) -> StoreResult<Option<Uuid>> {
        let s: Option<String> = self.try_get(col)?;
        s.map(|s| parse_uuid(col, &s)).transpose()
    }

    fn time(&self, col: &str) -> StoreResult<DateTime<Utc>> {
        let s: String = self.try_get(col)?;
        parse_time(col, &s)
    }

    fn opt_time(&self, col: &str) -> StoreResult<Option<DateTime<Utc>>> {
        let s: Option<String> = self.try_get(col)?;
        s.map(|s| parse_time(col, &s)).transpose()
    }

    fn json(&self, col: &str) -> StoreResult<Value> {
        let s: String = self.try_get(col)?;
        parse_json(col, &s)
    }

    fn opt_json(&self, col: &str) -> StoreResult<Option<Value>> {
        let s: Option<String> = self.try_get(col)?;
        s.map(|s| parse_json(col, &s)).transpose()
    }
}

fn parse_uuid(col: &str, s: &str) -> StoreResult<Uuid> {
    Uuid::parse_str(s).map_err(|_| corrupt(col, s))
}

fn parse_time(col: &str, s: &str) -> StoreResult<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| corrupt(col, s))
}

fn parse_json(col: &str, s: &str) -> StoreResult<Value> {
    serde_json::from_str(s).map_err(|_| corrupt(col, s))
}

fn event_from(row: &SqliteRow) -> StoreResult<Event> {
    let type_name: String = row.try_get("type")?;
    let data: &str = row.try_get("data")?;
    Event::from_stored(
        row.uuid("session_id")?,
        row.try_get("seq")?,
        &type_name,
        data,
        row.time("created_at")?,
    )
    .map_err(|e| corrupt_event(&type_name, e))
}

#[async_trait]
impl Store for SqliteStore {
    async fn commit(&self, batch: &[&[WriteOp]]) -> StoreResult<()> {
        let ops: Vec<WriteOp> = batch.iter().flat_map(|ops| ops.iter().cloned()).collect();
        self.writer.commit(ops).await
    }

    async fn session(&self, id: Uuid) -> StoreResult<Option<SessionRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions s WHERE s.id = ?"
        ))
        .bind(id.to_string())
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(session_from).transpose()
    }

    async fn sessions(&self, query: &SessionQuery) -> StoreResult<Vec<SessionRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions s \
             WHERE (?1 IS NULL OR s.id < ?1) AND (?2 IS NULL OR s.state = ?2) \
             ORDER BY s.id DESC LIMIT ?3"
        ))
        .bind(query.before.map(|id| id.to_string()))
        .bind(query.state.map(SessionState::as_str))
        .bind(query.limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(session_from).collect()
    }

    async fn active_sessions(&self) -> StoreResult<Vec<Uuid>> {
        let rows =
            sqlx::query("SELECT id FROM sessions WHERE state IN ('running', 'waiting_tool')")
                .fetch_all(&self.pool)
                .await?;
        rows.iter().map(|r| r.uuid("id")).collect()
    }

    async fn messages(
        &self,
        session_id: Uuid,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<Message>> {
        let rows = sqlx::query(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages \
             WHERE session_id = ? AND idx > ? ORDER BY idx LIMIT ?"
        ))
        .bind(session_id.to_string())
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(message_from).collect()
    }

    async fn nth_user_message(&self, session_id: Uuid, n: u64) -> StoreResult<Option<i64>> {
        let row = sqlx::query(
            "SELECT idx FROM messages WHERE session_id = ? AND role = 'user' \
             ORDER BY idx LIMIT 1 OFFSET ?",
        )
        .bind(session_id.to_string())
        .bind(i64::try_from(n).unwrap_or(i64::MAX))
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| r.try_get(0)).transpose()?)
    }

    async fn message_count(&self, session_id: Uuid) -> StoreResult<i64> {
        let row =
            sqlx::query("SELECT COALESCE(MAX(idx) + 1, 0) FROM messages WHERE session_id = ?")
                .bind(session_id.to_string())
                .fetch_one(&self.pool)
                .await?;
        Ok(row.try_get(0)?)
    }

    async fn events(&self, session_id: Uuid, after: i64, limit: i64) -> StoreResult<Vec<Event>> {
        let rows = sqlx::query(&format!(
            "SELECT {EVENT_COLUMNS} FROM events \
             WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?"
        ))
        .bind(session_id.to_string())
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(event_from).collect()
    }

    async fn last_seq(&self, session_id: Uuid) -> StoreResult<i64> {
        let row = sqlx::query("SELECT COALESCE(MAX(seq), 0) FROM events WHERE session_id = ?")
            .bind(session_id.to_string())
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get(0)?)
    }

    async fn steps(
        &self,
        session_id: Uuid,
        after: Option<Uuid>,
        limit: i64,
    ) -> StoreResult<Vec<StepRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {STEP_COLUMNS} FROM steps \
             WHERE session_id = ?1 AND (?2 IS NULL OR id > ?2) ORDER BY id LIMIT ?3"
        ))
        .bind(session_id.to_string())
        .bind(after.map(|id| id.to_string()))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(step_from).collect()
    }

    async fn step(&self, session_id: Uuid, step_id: Uuid) -> StoreResult<Option<StepRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {STEP_COLUMNS} FROM steps WHERE session_id = ? AND id = ?"
        ))
        .bind(session_id.to_string())
        .bind(step_id.to_string())
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(step_from).transpose()
    }

    async fn runs(
        &self,
        session_id: Uuid,
        after: Option<Uuid>,
        limit: i64,
    ) -> StoreResult<Vec<RunRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM runs \
             WHERE session_id = ?1 AND (?2 IS NULL OR id > ?2) ORDER BY id LIMIT ?3"
        ))
        .bind(session_id.to_string())
        .bind(after.map(|id| id.to_string()))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(run_from).collect()
    }

    async fn run(&self, session_id: Uuid, run_id: Uuid) -> StoreResult<Option<RunRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE session_id = ? AND id = ?"
        ))
        .bind(session_id.to_string())
        .bind(run_id.to_string())
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(run_from).transpose()
    }

    async fn latest_checkpoint(&self, session_id: Uuid) -> StoreResult<Option<Checkpoint>> {
        let row = sqlx::query(&format!(
            "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE session_id = ? \
             ORDER BY id DESC LIMIT 1"
        ))
        .bind(session_id.to_string())
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(checkpoint_from).transpose()
    }
}
