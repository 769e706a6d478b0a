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
use sqlx::{Connection, Row};
use uuid::Uuid;

use super::{SessionQuery, Store, StoreError, StoreResult, WriteOp};
use crate::model::{
    Checkpoint, Event, Message, Role, RunKind, RunRecord, RunStatus, SessionRecord, SessionState,
    StepKind, StepRecord, StepStatus, ToolCall, Usage,
};

pub struct SqliteStore {
    pool: SqlitePool,
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
        if !path.is_empty() && !path.starts_with(":memory:") {
            if let Some(parent) = std::path::Path::new(path).parent() {
                if !parent.as_os_str().is_empty() {
                    std::fs::create_dir_all(parent)?;
                }
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
        Ok(SqliteStore { pool })
    }

    /// The integrity check result (`ok` when the database is sound).
    pub async fn integrity_check(&self) -> StoreResult<String> {
        let row = sqlx::query("PRAGMA integrity_check")
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get::<String, _>(0)?)
    }
}

async fn apply(conn: &mut sqlx::SqliteConnection, op: &WriteOp) -> Result<(), sqlx::Error> {
    match op {
        WriteOp::InsertSession(s) => {
            sqlx::query(
                "INSERT INTO sessions (id, parent_id, title, metadata, system_prompt, state, error, \
                 input_tokens, output_tokens, last_run_id, created_at, updated_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(s.id.to_string())
            .bind(s.parent_id.map(|id| id.to_string()))
            .bind(&s.title)
            .bind(s.metadata.to_string())
            .bind(&s.system_prompt)
            .bind(s.state.as_str())
            .bind(&s.error)
            .bind(s.usage.input_tokens as i64)
            .bind(s.usage.output_tokens as i64)
            .bind(s.last_run_id.map(|id| id.to_string()))
            .bind(s.created_at.to_rfc3339())
            .bind(s.updated_at.to_rfc3339())
            .execute(&mut *conn)
            .await?;
        }
        WriteOp::UpdateSession(s) => {
            sqlx::query(
                "UPDATE sessions SET title = ?, metadata = ?, state = ?, error = ?, \
                 input_tokens = ?, output_tokens = ?, last_run_id = ?, updated_at = ? WHERE id = ?",
            )
            .bind(&s.title)
            .bind(s.metadata.to_string())
            .bind(s.state.as_str())
            .bind(&s.error)
            .bind(s.usage.input_tokens as i64)
            .bind(s.usage.output_tokens as i64)
            .bind(s.last_run_id.map(|id| id.to_string()))
            .bind(s.updated_at.to_rfc3339())
            .bind(s.id.to_string())
            .execute(&mut *conn)
            .await?;
        }
        WriteOp::DeleteSession(id) => {
            let id = id.to_string();
            for table in ["events", "messages", "steps", "runs", "checkpoints"] {
                sqlx::query(&format!("DELETE FROM {table} WHERE session_id = ?"))
                    .bind(&id)
                    .execute(&mut *conn)
                    .await?;
            }
            sqlx::query("DELETE FROM sessions WHERE id = ?")
                .bind(&id)
                .execute(&mut *conn)
                .await?;
        }
        WriteOp::InsertMessage {
            session_id,
            message: m,
        } => {
            sqlx::query(
                "INSERT INTO messages (session_id, idx, role, content, tool_calls, tool_call_id, created_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(session_id.to_string())
            .bind(m.index)
            .bind(m.role.as_str())
            .bind(&m.content)
            .bind(tool_calls_json(&m.tool_calls))
            .bind(&m.tool_call_id)
            .bind(m.created_at.to_rfc3339())
            .execute(&mut *conn)
            .await?;
        }
        WriteOp::CopyMessages { from, to, upto } => {
            sqlx::query(
                "INSERT INTO messages (session_id, idx, role, content, tool_calls, tool_call_id, created_at) \
                 SELECT ?, idx, role, content, tool_calls, tool_call_id, created_at FROM messages \
                 WHERE session_id = ? AND idx < ?",
            )
            .bind(to.to_string())
            .bind(from.to_string())
            .bind(upto.unwrap_or(i64::MAX))
            .execute(&mut *conn)
            .await?;
        }
        WriteOp::UpsertRun(r) => {
            sqlx::query(
                "INSERT INTO runs (id, session_id, kind, status, input, text, finish_reason, \
                 input_tokens, output_tokens, steps, error, start_seq, created_at, finished_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
                 ON CONFLICT (id) DO UPDATE SET status = excluded.status, text = excluded.text, \
                 finish_reason = excluded.finish_reason, input_tokens = excluded.input_tokens, \
                 output_tokens = excluded.output_tokens, steps = excluded.steps, \
                 error = excluded.error, finished_at = excluded.finished_at",
            )
            .bind(r.id.to_string())
            .bind(r.session_id.to_string())
            .bind(r.kind.as_str())
            .bind(r.status.as_str())
            .bind(&r.input)
            .bind(&r.text)
            .bind(&r.finish_reason)
            .bind(r.usage.input_tokens as i64)
            .bind(r.usage.output_tokens as i64)
            .bind(r.steps)
            .bind(&r.error)
            .bind(r.start_seq)
            .bind(r.created_at.to_rfc3339())
            .bind(r.finished_at.map(|t| t.to_rfc3339()))
            .execute(&mut *conn)
            .await?;
        }
        WriteOp::UpsertStep(s) => {
            sqlx::query(
                "INSERT INTO steps (id, session_id, run_id, kind, status, request, response, \
                 input_tokens, output_tokens, error, created_at, finished_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
                 ON CONFLICT (id) DO UPDATE SET status = excluded.status, \
                 response = excluded.response, input_tokens = excluded.input_tokens, \
                 output_tokens = excluded.output_tokens, error = excluded.error, \
                 finished_at = excluded.finished_at",
            )
            .bind(s.id.to_string())
            .bind(s.session_id.to_string())
            .bind(s.run_id.to_string())
            .bind(s.kind.as_str())
            .bind(s.status.as_str())
            .bind(s.request.to_string())
            .bind(s.response.as_ref().map(Value::to_string))
            .bind(s.usage.map(|u| u.input_tokens as i64))
            .bind(s.usage.map(|u| u.output_tokens as i64))
            .bind(&s.error)
            .bind(s.created_at.to_rfc3339())
            .bind(s.finished_at.map(|t| t.to_rfc3339()))
            .execute(&mut *conn)
            .await?;
        }
        WriteOp::InsertEvent(e) => {
            sqlx::query(
                "INSERT INTO events (session_id, seq, type, data, created_at) VALUES (?, ?, ?, ?, ?)",
            )
            .bind(e.session_id.to_string())
            .bind(e.seq)
            .bind(&e.kind)
            .bind(e.data.to_string())
            .bind(e.created_at.to_rfc3339())
            .execute(&mut *conn)
            .await?;
        }
        // One process owns a SQLite database: there is nothing to fence.
        WriteOp::Fence { .. } => {}
        WriteOp::FailOpenSteps {
            session_id,
            run_id,
            error,
            at,
        } => {
            sqlx::query(
                "UPDATE steps SET status = 'failed', error = ?, finished_at = ? \
                 WHERE session_id = ? AND run_id = ? AND status IN ('pending', 'streaming', 'running')",
            )
            .bind(error)
            .bind(at.to_rfc3339())
            .bind(session_id.to_string())
            .bind(run_id.to_string())
            .execute(&mut *conn)
            .await?;
        }
        WriteOp::InsertCheckpoint(c) => {
            sqlx::query(
                "INSERT INTO checkpoints (id, session_id, run_id, step_id, message_count, seq, created_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(c.id.to_string())
            .bind(c.session_id.to_string())
            .bind(c.run_id.to_string())
            .bind(c.step_id.map(|id| id.to_string()))
            .bind(c.message_count)
            .bind(c.seq)
            .bind(c.created_at.to_rfc3339())
            .execute(&mut *conn)
            .await?;
        }
    }
    Ok(())
}

/// Rows per multi-row event insert: a few fixed sizes, so the statement cache holds few
/// statements.
const EVENT_ROWS: [usize; 4] = [64, 16, 4, 1];

async fn insert_events(
    conn: &mut sqlx::SqliteConnection,
    mut events: &[&Event],
) -> Result<(), sqlx::Error> {
    while !events.is_empty() {
        let rows = EVENT_ROWS
            .iter()
            .copied()
            .find(|&n| n <= events.len())
            .unwrap_or(1);
        let (chunk, tail) = events.split_at(rows);
        let mut sql =
            String::from("INSERT INTO events (session_id, seq, type, data, created_at) VALUES ");
        for i in 0..rows {
            sql.push_str(if i == 0 { "(?, ?, ?, ?, ?)" } else { ", (?, ?, ?, ?, ?)" });
        }
        let mut query = sqlx::query(&sql);
        for e in chunk {
            query = query
                .bind(e.session_id.to_string())
                .bind(e.seq)
                .bind(&e.kind)
                .bind(e.data.to_string())
                .bind(e.created_at.to_rfc3339());
        }
        query.execute(&mut *conn).await?;
        events = tail;
    }
    Ok(())
}

fn tool_calls_json(calls: &[ToolCall]) -> Option<String> {
    if calls.is_empty() {
        None
    } else {
        serde_json::to_string(calls).ok()
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
    Ok(Event {
        session_id: uuid_col(row, "session_id")?,
        seq: row.try_get("seq")?,
        kind: row.try_get("type")?,
        data: json_col(row, "data")?,
        created_at: time_col(row, "created_at")?,
        rendered: Default::default(),
    })
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
        finish_reason: row.try_get("finish_reason")?,
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
        let ops: Vec<&WriteOp> = batch.iter().flat_map(|ops| ops.iter()).collect();
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        let mut rest = ops.as_slice();
        while !rest.is_empty() {
            // Every statement is a round trip to sqlx's SQLite thread: consecutive event
            // inserts (most of a streaming batch) go in as multi-row statements. Order relative
            // to the other ops is kept.
            let events: Vec<&Event> = rest
                .iter()
                .map_while(|op| match op {
                    WriteOp::InsertEvent(e) => Some(e.as_ref()),
                    _ => None,
                })
                .take(EVENT_ROWS[0])
                .collect();
            if events.len() > 1 {
                insert_events(&mut tx, &events).await?;
                rest = &rest[events.len()..];
            } else {
                apply(&mut tx, rest[0]).await?;
                rest = &rest[1..];
            }
        }
        tx.commit().await?;
        Ok(())
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
