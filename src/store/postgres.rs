//! The PostgreSQL store, for scale-out: several replicas share one database. It owns the
//! PostgreSQL side of the [`Store`] trait with exactly the semantics of the SQLite store
//! (`sqlite.rs` is the reference): ids are `uuid`, JSON is `jsonb`, times `timestamptz`,
//! counters `bigint` (see `migrations/postgres`). Every `commit` is one transaction; runs of
//! consecutive `InsertEvent` ops go in as one multi-row `INSERT … SELECT FROM UNNEST(…)`.
//!
//! Two differences PostgreSQL forces, both invisible to well-formed data:
//! - `jsonb` does not keep key order or formatting; a round trip gives an equal `Value`.
//! - `text` and `jsonb` cannot hold U+0000. Rather than fail the commit (which would poison the
//!   session), NUL characters in free text and in JSON strings/keys are stored as U+FFFD.
//!
//! The lease columns of `sessions` (`lease_owner`, `lease_epoch`, `lease_expires_at`) exist for
//! scale-out ownership and are not touched here yet.

use std::borrow::Cow;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::migrate::MigrateDatabase;
use sqlx::postgres::{PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::types::Json;
use sqlx::{Postgres, Row};
use uuid::Uuid;

use std::time::Duration;

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgListener};

use super::rows::{
    checkpoint_from, corrupt_event, message_from, run_from, session_from, step_from, Plain,
    StoredRow, CHECKPOINT_COLUMNS, EVENT_COLUMNS, MESSAGE_COLUMNS, RUN_COLUMNS, SESSION_COLUMNS,
    STEP_COLUMNS,
};
use super::{
    Cluster, ClusterListener, ClusterNotice, SessionQuery, Store, StoreError, StoreResult, WriteOp,
};
use crate::model::{
    Checkpoint, Event, EventKind, FinishReason, Message, RunRecord, SessionRecord, SessionState,
    StepRecord, ToolCall,
};

/// Connections per replica; PostgreSQL's default `max_connections` (100) leaves room for a few.
const MAX_CONNECTIONS: u32 = 16;

pub struct PostgresStore {
    pool: PgPool,
    /// This replica, named in the notifications of its commits so it can skip its own.
    replica: Uuid,
}

/// The channel on which commits announce `replica:session:seq`.
const EVENTS_CHANNEL: &str = "tah_events";
/// The channel on which replicas ask each other to act on a session (`cancel:session`).
const COMMANDS_CHANNEL: &str = "tah_commands";

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
        let pool = match connect(url).await {
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
                connect(url).await?
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

async fn connect(url: &str) -> Result<PgPool, sqlx::Error> {
    // A replica frozen in the middle of a commit (SIGSTOP, a VM pause) must not hold the
    // session rows it locked for longer than a lease lasts, or no other replica could take its
    // sessions over: PostgreSQL ends such a transaction, and its writes are void.
    let options = PgConnectOptions::from_str(url)?.options([(
        "idle_in_transaction_session_timeout",
        IDLE_IN_TRANSACTION_MS,
    )]);
    PgPoolOptions::new()
        .max_connections(MAX_CONNECTIONS)
        .min_connections(1)
        .connect_with(options)
        .await
}

/// A writer's transaction never waits on anything but the database between its statements.
const IDLE_IN_TRANSACTION_MS: &str = "2000";

/// SQLite treats a negative `LIMIT` as "no limit"; PostgreSQL rejects it but reads a NULL
/// limit as `LIMIT ALL`.
fn sql_limit(n: i64) -> Option<i64> {
    (n >= 0).then_some(n)
}

/// Text without U+0000 (which PostgreSQL cannot store); borrowed when there is none.
fn text(s: &str) -> Cow<'_, str> {
    if s.contains('\0') {
        Cow::Owned(s.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(s)
    }
}

fn opt_text(s: &Option<String>) -> Option<Cow<'_, str>> {
    s.as_deref().map(text)
}

/// JSON without U+0000 in any string or key (`jsonb` rejects `\u0000`); borrowed when clean.
fn json(v: &Value) -> Json<Cow<'_, Value>> {
    if has_nul(v) {
        Json(Cow::Owned(strip_nul(v)))
    } else {
        Json(Cow::Borrowed(v))
    }
}

fn has_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

fn strip_nul(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(text(s).into_owned()),
        Value::Array(items) => Value::Array(items.iter().map(strip_nul).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (text(k).into_owned(), strip_nul(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn tool_calls_json(calls: &[ToolCall]) -> Result<Option<Json<Value>>, sqlx::Error> {
    if calls.is_empty() {
        return Ok(None);
    }
    let value = serde_json::to_value(calls).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    Ok(Some(Json(if has_nul(&value) {
        strip_nul(&value)
    } else {
        value
    })))
}

fn tokens(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Applies one op inside the caller's transaction.
async fn apply(conn: &mut PgConnection, op: &WriteOp) -> Result<(), sqlx::Error> {
    match op {
        WriteOp::InsertSession(s) => {
            sqlx::query(
                "INSERT INTO sessions (id, parent_id, title, metadata, system_prompt, state, error, \
                 input_tokens, output_tokens, last_run_id, created_at, updated_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            )
            .bind(s.id)
            .bind(s.parent_id)
            .bind(opt_text(&s.title))
            .bind(json(&s.metadata))
            .bind(opt_text(&s.system_prompt))
            .bind(s.state.as_str())
            .bind(opt_text(&s.error))
            .bind(tokens(s.usage.input_tokens))
            .bind(tokens(s.usage.output_tokens))
            .bind(s.last_run_id)
            .bind(s.created_at)
            .bind(s.updated_at)
            .execute(&mut *conn)
            .await?;
        }
        WriteOp::UpdateSession(s) => {
            sqlx::query(
                "UPDATE sessions SET title = $1, metadata = $2, state = $3, error = $4, \
                 input_tokens = $5, output_tokens = $6, last_run_id = $7, updated_at = $8 \
                 WHERE id = $9",
            )
            .bind(opt_text(&s.title))
            .bind(json(&s.metadata))
            .bind(s.state.as_str())
            .bind(opt_text(&s.error))
            .bind(tokens(s.usage.input_tokens))
            .bind(tokens(s.usage.output_tokens))
            .bind(s.last_run_id)
            .bind(s.updated_at)
            .bind(s.id)
            .execute(&mut *conn)
            .await?;
        }
        WriteOp::DeleteSession(id) => {
            for table in ["events", "messages", "steps", "runs", "checkpoints"] {
                sqlx::query(&format!("DELETE FROM {table} WHERE session_id = $1"))
                    .bind(id)
                    .execute(&mut *conn)
                    .await?;
            }
            sqlx::query("DELETE FROM sessions WHERE id = $1")
                .bind(id)
                .execute(&mut *conn)
                .await?;
        }
        WriteOp::InsertMessage {
            session_id,
            message: m,
        } => {
            sqlx::query(
                "INSERT INTO messages (session_id, idx, role, content, tool_calls, tool_call_id, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(session_id)
            .bind(m.index)
            .bind(m.role.as_str())
            .bind(text(&m.content))
            .bind(tool_calls_json(&m.tool_calls)?)
            .bind(opt_text(&m.tool_call_id))
            .bind(m.created_at)
            .execute(&mut *conn)
            .await?;
        }
        WriteOp::CopyMessages { from, to, upto } => {
            sqlx::query(
                "INSERT INTO messages (session_id, idx, role, content, tool_calls, tool_call_id, created_at) \
                 SELECT $1, idx, role, content, tool_calls, tool_call_id, created_at FROM messages \
                 WHERE session_id = $2 AND idx < $3",
            )
            .bind(to)
            .bind(from)
            .bind(upto.unwrap_or(i64::MAX))
            .execute(&mut *conn)
            .await?;
        }
        WriteOp::UpsertRun(r) => {
            sqlx::query(
                "INSERT INTO runs (id, session_id, kind, status, input, text, finish_reason, \
                 input_tokens, output_tokens, steps, error, start_seq, created_at, finished_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
                 ON CONFLICT (id) DO UPDATE SET status = excluded.status, text = excluded.text, \
                 finish_reason = excluded.finish_reason, input_tokens = excluded.input_tokens, \
                 output_tokens = excluded.output_tokens, steps = excluded.steps, \
                 error = excluded.error, finished_at = excluded.finished_at",
            )
            .bind(r.id)
            .bind(r.session_id)
            .bind(r.kind.as_str())
            .bind(r.status.as_str())
            .bind(opt_text(&r.input))
            .bind(opt_text(&r.text))
            .bind(r.finish_reason.as_ref().map(FinishReason::as_str))
            .bind(tokens(r.usage.input_tokens))
            .bind(tokens(r.usage.output_tokens))
            .bind(r.steps)
            .bind(opt_text(&r.error))
            .bind(r.start_seq)
            .bind(r.created_at)
            .bind(r.finished_at)
            .execute(&mut *conn)
            .await?;
        }
        WriteOp::UpsertStep(s) => {
            sqlx::query(
                "INSERT INTO steps (id, session_id, run_id, kind, status, request, response, \
                 input_tokens, output_tokens, error, created_at, finished_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
                 ON CONFLICT (id) DO UPDATE SET status = excluded.status, \
                 response = excluded.response, input_tokens = excluded.input_tokens, \
                 output_tokens = excluded.output_tokens, error = excluded.error, \
                 finished_at = excluded.finished_at",
            )
            .bind(s.id)
            .bind(s.session_id)
            .bind(s.run_id)
            .bind(s.kind.as_str())
            .bind(s.status.as_str())
            .bind(json(&s.request))
            .bind(s.response.as_ref().map(json))
            .bind(s.usage.map(|u| tokens(u.input_tokens)))
            .bind(s.usage.map(|u| tokens(u.output_tokens)))
            .bind(opt_text(&s.error))
            .bind(s.created_at)
            .bind(s.finished_at)
            .execute(&mut *conn)
            .await?;
        }
        WriteOp::InsertEvent(e) => {
            sqlx::query(
                "INSERT INTO events (session_id, seq, type, data, created_at) \
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(e.session_id)
            .bind(e.seq)
            .bind(e.type_name())
            .bind(json(&e.kind.data_value()))
            .bind(e.created_at)
            .execute(&mut *conn)
            .await?;
        }
        // Checked by `commit` before any op is applied.
        WriteOp::Fence { .. } => {}
        WriteOp::FailOpenSteps {
            session_id,
            run_id,
            error,
            at,
        } => {
            sqlx::query(
                "UPDATE steps SET status = 'failed', error = $1, finished_at = $2 \
                 WHERE session_id = $3 AND run_id = $4 AND status IN ('pending', 'streaming', 'running')",
            )
            .bind(text(error).as_ref())
            .bind(at)
            .bind(session_id)
            .bind(run_id)
            .execute(&mut *conn)
            .await?;
        }
        WriteOp::InsertCheckpoint(c) => {
            sqlx::query(
                "INSERT INTO checkpoints (id, session_id, run_id, step_id, message_count, seq, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(c.id)
            .bind(c.session_id)
            .bind(c.run_id)
            .bind(c.step_id)
            .bind(c.message_count)
            .bind(c.seq)
            .bind(c.created_at)
            .execute(&mut *conn)
            .await?;
        }
    }
    Ok(())
}

/// Inserts several events with one statement (one round trip): the columns go as five arrays
/// and `UNNEST` zips them back into rows. A duplicate `(session_id, seq)` fails the statement.
async fn insert_events(conn: &mut PgConnection, events: &[&Event]) -> Result<(), sqlx::Error> {
    let mut session_ids = Vec::with_capacity(events.len());
    let mut seqs = Vec::with_capacity(events.len());
    let mut kinds = Vec::with_capacity(events.len());
    let mut data = Vec::with_capacity(events.len());
    let mut created = Vec::with_capacity(events.len());
    for e in events {
        session_ids.push(e.session_id);
        seqs.push(e.seq);
        kinds.push(e.type_name());
        data.push(Json(strip_nul(&e.kind.data_value())));
        created.push(e.created_at);
    }
    sqlx::query(
        "INSERT INTO events (session_id, seq, type, data, created_at) \
         SELECT * FROM UNNEST($1::uuid[], $2::bigint[], $3::text[], $4::jsonb[], $5::timestamptz[])",
    )
    .bind(session_ids)
    .bind(seqs)
    .bind(kinds)
    .bind(data)
    .bind(created)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Ids, times and JSON have native types.
impl StoredRow for PgRow {
    fn get<T: Plain>(&self, col: &str) -> StoreResult<T> {
        Ok(self.try_get(col)?)
    }

    fn uuid(&self, col: &str) -> StoreResult<Uuid> {
        Ok(self.try_get(col)?)
    }

    fn opt_uuid(&self, col: &str) -> StoreResult<Option<Uuid>> {
        Ok(self.try_get(col)?)
    }

    fn time(&self, col: &str) -> StoreResult<DateTime<Utc>> {
        Ok(self.try_get(col)?)
    }

    fn opt_time(&self, col: &str) -> StoreResult<Option<DateTime<Utc>>> {
        Ok(self.try_get(col)?)
    }

    fn json(&self, col: &str) -> StoreResult<Value> {
        Ok(self.try_get(col)?)
    }

    fn opt_json(&self, col: &str) -> StoreResult<Option<Value>> {
        Ok(self.try_get(col)?)
    }
}

fn event_from(row: &PgRow) -> StoreResult<Event> {
    let type_name: String = row.try_get("type")?;
    let data: Value = row.try_get("data")?;
    let kind =
        EventKind::from_value_parts(&type_name, data).map_err(|e| corrupt_event(&type_name, e))?;
    Ok(Event::new(
        row.try_get("session_id")?,
        row.try_get("seq")?,
        kind,
        row.try_get("created_at")?,
    ))
}

#[async_trait]
impl Store for PostgresStore {
    async fn commit(&self, batch: &[&[WriteOp]]) -> StoreResult<()> {
        let ops: Vec<&WriteOp> = batch.iter().flat_map(|ops| ops.iter()).collect();
        let mut tx = self.pool.begin().await?;
        let mut rest = ops.as_slice();
        while let Some((first, tail)) = rest.split_first() {
            if let WriteOp::Fence {
                session_id,
                owner,
                epoch,
            } = first
            {
                // FOR SHARE orders this check against a takeover's UPDATE of the lease.
                let held: Option<bool> = sqlx::query_scalar(
                    "SELECT lease_owner = $2 AND lease_epoch = $3 FROM sessions WHERE id = $1 FOR SHARE",
                )
                .bind(session_id)
                .bind(owner)
                .bind(epoch)
                .fetch_optional(&mut *tx)
                .await?
                .flatten();
                // A session deleted in the meantime has nothing left to protect.
                if held == Some(false) {
                    return Err(StoreError::Fenced);
                }
                rest = tail;
                continue;
            }
            // A run of consecutive event inserts (across groups) becomes one statement; order
            // relative to the other ops is kept, so a later op still sees these rows.
            let run = rest
                .iter()
                .take_while(|op| matches!(op, WriteOp::InsertEvent(_)))
                .count();
            if run > 1 {
                let events: Vec<&Event> = rest[..run]
                    .iter()
                    .filter_map(|op| match op {
                        WriteOp::InsertEvent(e) => Some(e.as_ref()),
                        _ => None,
                    })
                    .collect();
                insert_events(&mut tx, &events).await?;
                rest = &rest[run..];
            } else {
                apply(&mut tx, first).await?;
                rest = tail;
            }
        }
        // Announce the newest seq of each session; delivered only if the transaction commits.
        let mut newest: Vec<(Uuid, i64)> = Vec::new();
        for op in &ops {
            if let WriteOp::InsertEvent(e) = op {
                match newest.iter_mut().find(|(id, _)| *id == e.session_id) {
                    Some(entry) => entry.1 = entry.1.max(e.seq),
                    None => newest.push((e.session_id, e.seq)),
                }
            }
        }
        if !newest.is_empty() {
            let payloads: Vec<String> = newest
                .iter()
                .map(|(id, seq)| format!("{}:{id}:{seq}", self.replica))
                .collect();
            sqlx::query("SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p")
                .bind(EVENTS_CHANNEL)
                .bind(&payloads)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn session(&self, id: Uuid) -> StoreResult<Option<SessionRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions s WHERE s.id = $1"
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(session_from).transpose()
    }

    async fn sessions(&self, query: &SessionQuery) -> StoreResult<Vec<SessionRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions s \
             WHERE ($1::uuid IS NULL OR s.id < $1) AND ($2::text IS NULL OR s.state = $2) \
             ORDER BY s.id DESC LIMIT $3"
        ))
        .bind(query.before)
        .bind(query.state.map(SessionState::as_str))
        .bind(sql_limit(query.limit))
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
             WHERE session_id = $1 AND idx > $2 ORDER BY idx LIMIT $3"
        ))
        .bind(session_id)
        .bind(after)
        .bind(sql_limit(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(message_from).collect()
    }

    async fn nth_user_message(&self, session_id: Uuid, n: u64) -> StoreResult<Option<i64>> {
        let row = sqlx::query(
            "SELECT idx FROM messages WHERE session_id = $1 AND role = 'user' \
             ORDER BY idx LIMIT 1 OFFSET $2",
        )
        .bind(session_id)
        .bind(i64::try_from(n).unwrap_or(i64::MAX))
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| r.try_get(0)).transpose()?)
    }

    async fn message_count(&self, session_id: Uuid) -> StoreResult<i64> {
        let row =
            sqlx::query("SELECT COALESCE(MAX(idx) + 1, 0) FROM messages WHERE session_id = $1")
                .bind(session_id)
                .fetch_one(&self.pool)
                .await?;
        Ok(row.try_get(0)?)
    }

    async fn events(&self, session_id: Uuid, after: i64, limit: i64) -> StoreResult<Vec<Event>> {
        let rows = sqlx::query(&format!(
            "SELECT {EVENT_COLUMNS} FROM events \
             WHERE session_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"
        ))
        .bind(session_id)
        .bind(after)
        .bind(sql_limit(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(event_from).collect()
    }

    async fn last_seq(&self, session_id: Uuid) -> StoreResult<i64> {
        let row = sqlx::query("SELECT COALESCE(MAX(seq), 0) FROM events WHERE session_id = $1")
            .bind(session_id)
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
             WHERE session_id = $1 AND ($2::uuid IS NULL OR id > $2) ORDER BY id LIMIT $3"
        ))
        .bind(session_id)
        .bind(after)
        .bind(sql_limit(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(step_from).collect()
    }

    async fn step(&self, session_id: Uuid, step_id: Uuid) -> StoreResult<Option<StepRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {STEP_COLUMNS} FROM steps WHERE session_id = $1 AND id = $2"
        ))
        .bind(session_id)
        .bind(step_id)
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
             WHERE session_id = $1 AND ($2::uuid IS NULL OR id > $2) ORDER BY id LIMIT $3"
        ))
        .bind(session_id)
        .bind(after)
        .bind(sql_limit(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(run_from).collect()
    }

    async fn run(&self, session_id: Uuid, run_id: Uuid) -> StoreResult<Option<RunRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE session_id = $1 AND id = $2"
        ))
        .bind(session_id)
        .bind(run_id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(run_from).transpose()
    }

    async fn latest_checkpoint(&self, session_id: Uuid) -> StoreResult<Option<Checkpoint>> {
        let row = sqlx::query(&format!(
            "SELECT {CHECKPOINT_COLUMNS} FROM checkpoints WHERE session_id = $1 \
             ORDER BY id DESC LIMIT 1"
        ))
        .bind(session_id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(checkpoint_from).transpose()
    }
}

fn millis(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

#[async_trait]
impl Cluster for PostgresStore {
    async fn acquire(
        &self,
        session_id: Uuid,
        owner: Uuid,
        ttl: Duration,
    ) -> StoreResult<Option<i64>> {
        let epoch: Option<i64> = sqlx::query_scalar(
            "UPDATE sessions SET \
               lease_epoch = CASE WHEN lease_owner = $2 AND lease_expires_at > now() \
                             THEN lease_epoch ELSE lease_epoch + 1 END, \
               lease_owner = $2, \
               lease_expires_at = now() + make_interval(secs => $3::double precision / 1000) \
             WHERE id = $1 AND (lease_owner IS NULL OR lease_owner = $2 OR lease_expires_at <= now()) \
             RETURNING lease_epoch",
        )
        .bind(session_id)
        .bind(owner)
        .bind(millis(ttl))
        .fetch_optional(&self.pool)
        .await?;
        Ok(epoch)
    }

    async fn renew(&self, owner: Uuid, ttl: Duration) -> StoreResult<Vec<(Uuid, i64)>> {
        let rows = sqlx::query(
            "UPDATE sessions SET lease_expires_at = now() + make_interval(secs => $2::double precision / 1000) \
             WHERE lease_owner = $1 AND lease_expires_at > now() RETURNING id, lease_epoch",
        )
        .bind(owner)
        .bind(millis(ttl))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("id")?, r.try_get("lease_epoch")?)))
            .collect()
    }

    async fn release(&self, session_id: Uuid, owner: Uuid) -> StoreResult<()> {
        sqlx::query(
            "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL \
             WHERE id = $1 AND lease_owner = $2",
        )
        .bind(session_id)
        .bind(owner)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn release_all(&self, owner: Uuid) -> StoreResult<()> {
        sqlx::query("UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL WHERE lease_owner = $1")
            .bind(owner)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn orphaned(&self, limit: i64) -> StoreResult<Vec<Uuid>> {
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "SELECT id FROM sessions WHERE state IN ('running', 'waiting_tool') \
             AND (lease_owner IS NULL OR lease_expires_at <= now()) \
             LIMIT $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(ids)
    }

    async fn send_cancel(&self, session_id: Uuid) -> StoreResult<()> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(COMMANDS_CHANNEL)
            .bind(format!("cancel:{session_id}"))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn listen(&self) -> StoreResult<Box<dyn ClusterListener>> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener
            .listen_all([EVENTS_CHANNEL, COMMANDS_CHANNEL])
            .await?;
        Ok(Box::new(PgNotices { listener }))
    }
}

/// Notifications from a dedicated connection; sqlx reconnects it after a loss, which is
/// reported as [`ClusterNotice::Reconnected`] so subscribers catch up from the table.
struct PgNotices {
    listener: PgListener,
}

#[async_trait]
impl ClusterListener for PgNotices {
    async fn next(&mut self) -> StoreResult<ClusterNotice> {
        loop {
            let Some(notification) = self.listener.try_recv().await? else {
                return Ok(ClusterNotice::Reconnected);
            };
            let payload = notification.payload();
            let notice = match notification.channel() {
                EVENTS_CHANNEL => {
                    let mut parts = payload.splitn(3, ':');
                    match (
                        parts.next().and_then(|s| Uuid::parse_str(s).ok()),
                        parts.next().and_then(|s| Uuid::parse_str(s).ok()),
                        parts.next().and_then(|s| s.parse().ok()),
                    ) {
                        (Some(origin), Some(session_id), Some(seq)) => {
                            Some(ClusterNotice::Events {
                                origin,
                                session_id,
                                seq,
                            })
                        }
                        _ => None,
                    }
                }
                COMMANDS_CHANNEL => payload
                    .strip_prefix("cancel:")
                    .and_then(|s| Uuid::parse_str(s).ok())
                    .map(|session_id| ClusterNotice::Cancel { session_id }),
                _ => None,
            };
            match notice {
                Some(notice) => return Ok(notice),
                None => tracing::warn!(payload, "ignored a malformed notification"),
            }
        }
    }
}
