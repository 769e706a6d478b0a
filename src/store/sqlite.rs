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

use super::sqlite_write::SqliteWriter;
use super::{SessionQuery, Store, StoreError, StoreResult, WriteOp};
use crate::model::{
    Checkpoint, Event, FinishReason, Message, Role, RunKind, RunRecord, RunStatus, SessionRecord,
    SessionState, StepKind, StepRecord, StepStatus, Usage,
};

pub struct SqliteStore {
    /// Reads (and migrations) go through the sqlx pool.
    pool: SqlitePool,
    /// Writes go through one dedicated connection, a batch per hop.
    writer: SqliteWriter,
}

const SESSION_COLUMNS: &str = "s.id, s.parent_id, s.title, s.metadata, s.system_prompt, s.state, \
     s.error, s.input_tokens, s.output_tokens, s.last_run_id, s.created_at, s.updated_at, \
     (SELECT COALESCE(MAX(idx) + 1, 0) FROM messages m WHERE m.session_id = s.id) AS message_count, \
     (SELECT COALESCE(MAX(seq), 0) FROM events e WHERE e.session_id = s.id) AS last_seq";

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

fn corrupt(what: &str, value: &str) -> StoreError {
    StoreError::Corrupt(format!("{what}: {value:?}"))
}

fn uuid_col(row: &SqliteRow, col: &str) -> StoreResult<Uuid> {
    let s: String = row.try_get(col)?;
    Uuid::parse_str(&s).map_err(|_| corrupt(col, &s))
}

fn opt_uuid_col(row: &SqliteRow, col: &str) -> StoreResult<Option<Uuid>> {
    let s: Option<String> = row.try_get(col)?;
    s.map(|s| Uuid::parse_str(&s).map_err(|_| corrupt(col, &s)))
        .transpose()
}

fn time_col(row: &SqliteRow, col: &str) -> StoreResult<DateTime<Utc>> {
    let s: String = row.try_get(col)?;
    parse_time(&s).ok_or_else(|| corrupt(col, &s))
}

fn opt_time_col(row: &SqliteRow, col: &str) -> StoreResult<Option<DateTime<Utc>>> {
    let s: Option<String> = row.try_get(col)?;
    s.map(|s| parse_time(&s).ok_or_else(|| corrupt(col, &s)))
        .transpose()
}

fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

fn json_col(row: &SqliteRow, col: &str) -> StoreResult<Value> {
    let s: String = row.try_get(col)?;
    serde_json::from_str(&s).map_err(|_| corrupt(col, &s))
}

fn usage_cols(row: &SqliteRow) -> StoreResult<Usage> {
    let input: i64 = row.try_get("input_tokens")?;
    let output: i64 = row.try_get("output_tokens")?;
    Ok(Usage {
        input_tokens: input.max(0) as u64,
        output_tokens: output.max(0) as u64,
    })
}

fn session_from(row: &SqliteRow) -> StoreResult<SessionRecord> {
    let state: String = row.try_get("state")?;
    Ok(SessionRecord {
        id: uuid_col(row, "id")?,
        parent_id: opt_uuid_col(row, "parent_id")?,
        title: row.try_get("title")?,
        metadata: json_col(row, "metadata")?,
        system_prompt: row.try_get("system_prompt")?,
        state: SessionState::parse(&state).ok_or_else(|| corrupt("state", &state))?,
        error: row.try_get("error")?,
        message_count: row.try_get("message_count")?,
        last_seq: row.try_get("last_seq")?,
        usage: usage_cols(row)?,
        last_run_id: opt_uuid_col(row, "last_run_id")?,
        created_at: time_col(row, "created_at")?,
        updated_at: time_col(row, "updated_at")?,
    })
}

fn message_from(row: &SqliteRow) -> StoreResult<Message> {
    let role: String = row.try_get("role")?;
    let calls: Option<String> = row.try_get("tool_calls")?;
    let tool_calls = match calls {
        Some(s) => serde_json::from_str(&s).map_err(|_| corrupt("tool_calls", &s))?,
        None => Vec::new(),
    };
    Ok(Message {
        index: row.try_get("idx")?,
        role: Role::parse(&role).ok_or_else(|| corrupt("role", &role))?,
        content: row.try_get("content")?,
        tool_calls,
        tool_call_id: row.try_get("tool_call_id")?,
        created_at: time_col(row, "created_at")?,
    })
}

fn event_from(row: &SqliteRow) -> StoreResult<Event> {
    let type_name: String = row.try_get("type")?;
    let data: &str = row.try_get("data")?;
    Event::from_stored(
        uuid_col(row, "session_id")?,
        row.try_get("seq")?,
        &type_name,
        data,
        time_col(row, "created_at")?,
    )
    .map_err(|e| StoreError::Corrupt(format!("event of type {type_name:?}: {e}")))
}

fn run_from(row: &SqliteRow) -> StoreResult<RunRecord> {
    let kind: String = row.try_get("kind")?;
    let status: String = row.try_get("status")?;
    Ok(RunRecord {
        id: uuid_col(row, "id")?,
        session_id: uuid_col(row, "session_id")?,
        kind: match kind.as_str() {
            "run" => RunKind::Run,
            "resume" => RunKind::Resume,
            _ => return Err(corrupt("kind", &kind)),
        },
        status: RunStatus::parse(&status).ok_or_else(|| corrupt("status", &status))?,
        input: row.try_get("input")?,
        text: row.try_get("text")?,
        finish_reason: row
            .try_get::<Option<String>, _>("finish_reason")?
            .map(|r| FinishReason::parse(&r)),
        usage: usage_cols(row)?,
        steps: row.try_get("steps")?,
        error: row.try_get("error")?,
        start_seq: row.try_get("start_seq")?,
        created_at: time_col(row, "created_at")?,
        finished_at: opt_time_col(row, "finished_at")?,
    })
}

fn step_from(row: &SqliteRow) -> StoreResult<StepRecord> {
    let kind: String = row.try_get("kind")?;
    let status: String = row.try_get("status")?;
    let response: Option<String> = row.try_get("response")?;
    let input: Option<i64> = row.try_get("input_tokens")?;
    let output: Option<i64> = row.try_get("output_tokens")?;
    Ok(StepRecord {
        id: uuid_col(row, "id")?,
        session_id: uuid_col(row, "session_id")?,
        run_id: uuid_col(row, "run_id")?,
        kind: StepKind::parse(&kind).ok_or_else(|| corrupt("kind", &kind))?,
        status: StepStatus::parse(&status).ok_or_else(|| corrupt("status", &status))?,
        request: json_col(row, "request")?,
        response: response
            .map(|s| serde_json::from_str(&s).map_err(|_| corrupt("response", &s)))
            .transpose()?,
        usage: match (input, output) {
            (Some(i), Some(o)) => Some(Usage {
                input_tokens: i.max(0) as u64,
                output_tokens: o.max(0) as u64,
            }),
            _ => None,
        },
        error: row.try_get("error")?,
        created_at: time_col(row, "created_at")?,
        finished_at: opt_time_col(row, "finished_at")?,
    })
}

fn checkpoint_from(row: &SqliteRow) -> StoreResult<Checkpoint> {
    Ok(Checkpoint {
        id: uuid_col(row, "id")?,
        session_id: uuid_col(row, "session_id")?,
        run_id: uuid_col(row, "run_id")?,
        step_id: opt_uuid_col(row, "step_id")?,
        message_count: row.try_get("message_count")?,
        seq: row.try_get("seq")?,
        created_at: time_col(row, "created_at")?,
    })
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
        rows.iter().map(|r| uuid_col(r, "id")).collect()
    }

    async fn messages(
        &self,
        session_id: Uuid,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<Message>> {
        let rows = sqlx::query(
            "SELECT idx, role, content, tool_calls, tool_call_id, created_at FROM messages \
             WHERE session_id = ? AND idx > ? ORDER BY idx LIMIT ?",
        )
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
        let rows = sqlx::query(
            "SELECT session_id, seq, type, data, created_at FROM events \
             WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?",
        )
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
        let rows = sqlx::query(
            "SELECT * FROM steps WHERE session_id = ?1 AND (?2 IS NULL OR id > ?2) ORDER BY id LIMIT ?3",
        )
        .bind(session_id.to_string())
        .bind(after.map(|id| id.to_string()))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(step_from).collect()
    }

    async fn step(&self, session_id: Uuid, step_id: Uuid) -> StoreResult<Option<StepRecord>> {
        let row = sqlx::query("SELECT * FROM steps WHERE session_id = ? AND id = ?")
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
        let rows = sqlx::query(
            "SELECT * FROM runs WHERE session_id = ?1 AND (?2 IS NULL OR id > ?2) ORDER BY id LIMIT ?3",
        )
        .bind(session_id.to_string())
        .bind(after.map(|id| id.to_string()))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(run_from).collect()
    }

    async fn run(&self, session_id: Uuid, run_id: Uuid) -> StoreResult<Option<RunRecord>> {
        let row = sqlx::query("SELECT * FROM runs WHERE session_id = ? AND id = ?")
            .bind(session_id.to_string())
            .bind(run_id.to_string())
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(run_from).transpose()
    }

    async fn latest_checkpoint(&self, session_id: Uuid) -> StoreResult<Option<Checkpoint>> {
        let row =
            sqlx::query("SELECT * FROM checkpoints WHERE session_id = ? ORDER BY id DESC LIMIT 1")
                .bind(session_id.to_string())
                .fetch_optional(&self.pool)
                .await?;
        row.as_ref().map(checkpoint_from).transpose()
    }
}
