//! What both backends know alike of the tables: the column list of every `SELECT`, the tables
//! that belong to a session, how token counts are stored, and the decoding of a row into a
//! record. A backend only says how it stores the values that have no common SQL form (ids,
//! times and JSON are text in SQLite; `uuid`, `timestamptz` and `jsonb` in PostgreSQL) by
//! implementing [`StoredRow`]; state, role, kind and status are text in both and are parsed
//! here. A value that cannot be decoded is a [`StoreError::Corrupt`] that names its column.
//! Events are stored and read alike by both, a row per commit per session ([`event_log`]), with
//! [`corrupt_event`] for the error.

use std::fmt::Display;

use async_trait::async_trait;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{Decode, Postgres, Sqlite, Type};
use uuid::Uuid;

use super::{event_log, ArtifactQuery, ArtifactVersions, SessionHistory, StoreError, StoreResult};
use crate::model::{
    ArtifactRecord, Checkpoint, Event, FinishReason, Message, Role, RunKind, RunRecord, RunStatus,
    SessionRecord, SessionState, SizeCache, StepKind, StepRecord, StepStatus, ThinkingBlock,
    ToolCall, Usage,
};

/// A session with its derived counters; the table is aliased `s`.
pub const SESSION_COLUMNS: &str =
    "s.id, s.parent_id, s.title, s.metadata, s.options, s.system_prompt, \
     s.state, s.error, s.input_tokens, s.output_tokens, s.last_run_id, s.created_at, \
     s.updated_at, s.tenant, s.owner, \
     COALESCE((SELECT MAX(idx) FROM messages m WHERE m.session_id = s.id) + 1, 0) \
       AS message_count, \
     COALESCE((SELECT MAX(last_seq) FROM event_batches e WHERE e.session_id = s.id), 0) \
       AS last_seq";

/// Sessions whose last run was interrupted (`$1`/`?1` = the error recorded for that); the
/// placeholder is written `$1` and SQLite reads it as a numbered parameter too.
pub const INTERRUPTED_SESSIONS: &str =
    "SELECT id FROM sessions WHERE state = 'failed' AND error = $1";

/// The tokens (input + output) of a tenant's LLM steps created since `$3`; `$2` is the
/// smallest id a step created since then can have (ids are time-ordered UUID v7), so the read
/// walks `steps_by_session` from there for each of the tenant's sessions.
pub const TENANT_TOKENS_SINCE: &str = "SELECT COALESCE(SUM(COALESCE(st.input_tokens, 0) \
     + COALESCE(st.output_tokens, 0)), 0) AS used FROM sessions s \
     JOIN steps st ON st.session_id = s.id \
     WHERE s.tenant = $1 AND st.kind = 'llm' AND st.id >= $2 AND st.created_at >= $3";

/// What the LLM steps of a tenant's sessions cost since a time (`$3`; `$2`: the first step
/// id of that time), in US dollars: `{COST}` is the backend's reading of a step response's
/// `cost_usd`.
pub fn tenant_cost_since(cost: &str) -> String {
    format!(
        "SELECT COALESCE(SUM({cost}), 0.0) AS spent FROM sessions s \
         JOIN steps st ON st.session_id = s.id \
         WHERE s.tenant = $1 AND st.kind = 'llm' AND st.id >= $2 AND st.created_at >= $3 \
         AND st.response IS NOT NULL"
    )
}

/// The smallest UUID v7 made at or after `at`: its 48-bit millisecond time, then zeros.
pub fn first_id_at(at: DateTime<Utc>) -> Uuid {
    let millis = u64::try_from(at.timestamp_millis()).unwrap_or(0);
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&millis.to_be_bytes()[2..]);
    Uuid::from_bytes(bytes)
}

pub const MESSAGE_COLUMNS: &str =
    "idx, role, content, thinking, tool_calls, tool_call_id, created_at";

pub const RUN_COLUMNS: &str = "id, session_id, kind, status, input, text, finish_reason, \
     input_tokens, output_tokens, steps, error, start_seq, created_at, finished_at, client_tools";

pub const STEP_COLUMNS: &str = "id, session_id, run_id, kind, status, request, response, \
     input_tokens, output_tokens, error, created_at, finished_at";

pub const CHECKPOINT_COLUMNS: &str =
    "id, session_id, run_id, step_id, message_count, seq, created_at";

/// An artifact record; the table is aliased `a`.
pub const ARTIFACT_COLUMNS: &str =
    "a.id, a.path, a.version, a.size, a.sha256, a.media_type, a.step_id, a.run_id, a.created_at";

/// The condition that keeps only the newest version of each path (`a` = the artifacts table).
const NEWEST_ARTIFACT: &str = "NOT EXISTS (SELECT 1 FROM artifacts n \
     WHERE n.session_id = a.session_id AND n.path = a.path AND n.version > a.version)";

/// The condition on the artifacts table (`a`) that keeps the versions a list holds.
pub fn versions_kept(versions: ArtifactVersions) -> &'static str {
    match versions {
        ArtifactVersions::Newest => NEWEST_ARTIFACT,
        ArtifactVersions::All => "TRUE",
    }
}

/// What a fork copies of one table from a session into another, inside the database: every
/// row of the source (`$2`) that `within` keeps (`$3` = its bound), with `session_id` = the
/// copy (`$1`) and the other columns as they are. SQLite numbers `$N` in order of appearance,
/// so the same text binds alike on both backends.
pub struct CopiedRows {
    table: &'static str,
    columns: &'static str,
    within: &'static str,
}

/// Messages before index `$3`.
pub const COPIED_MESSAGES: CopiedRows = CopiedRows {
    table: "messages",
    columns: MESSAGE_COLUMNS,
    within: "idx < $3",
};

/// Artifacts made while the history had at most `$3` messages (ids kept; the bytes are shared).
pub const COPIED_ARTIFACTS: CopiedRows = CopiedRows {
    table: "artifacts",
    columns: "id, path, version, size, sha256, media_type, step_id, run_id, message_count, seq, \
              created_at",
    within: "message_count <= $3",
};

impl CopiedRows {
    pub fn sql(&self) -> String {
        let CopiedRows {
            table,
            columns,
            within,
        } = self;
        format!(
            "INSERT INTO {table} (session_id, {columns}) SELECT $1, {columns} FROM {table} \
             WHERE session_id = $2 AND {within}"
        )
    }
}

/// The tables whose rows belong to one session (`session_id`), deleted with it.
/// (Deleting a session's artifacts also deletes the bytes no other session's artifact names.)
pub const SESSION_TABLES: [&str; 6] = [
    "event_batches",
    "messages",
    "steps",
    "runs",
    "checkpoints",
    "artifacts",
];

/// A value both backends store alike (integers, text, and NULL of either), read as it is.
pub trait Plain:
    for<'r> Decode<'r, Sqlite> + Type<Sqlite> + for<'r> Decode<'r, Postgres> + Type<Postgres>
{
}

impl<T> Plain for T where
    T: for<'r> Decode<'r, Sqlite> + Type<Sqlite> + for<'r> Decode<'r, Postgres> + Type<Postgres>
{
}

/// A row of either backend, read column by column in the backend's storage form.
pub trait StoredRow {
    fn get<T: Plain>(&self, col: &str) -> StoreResult<T>;
    fn uuid(&self, col: &str) -> StoreResult<Uuid>;
    fn opt_uuid(&self, col: &str) -> StoreResult<Option<Uuid>>;
    fn time(&self, col: &str) -> StoreResult<DateTime<Utc>>;
    fn opt_time(&self, col: &str) -> StoreResult<Option<DateTime<Utc>>>;
    fn json(&self, col: &str) -> StoreResult<Value>;
    fn opt_json(&self, col: &str) -> StoreResult<Option<Value>>;
}

/// How a backend reads the rows of a session's table with time-ordered ids (`runs`, `steps`):
/// a page after a cursor, or one by id. [`SessionHistory`] follows from it.
#[async_trait]
pub trait SessionRows: Send + Sync {
    type Row: StoredRow + Send + Sync;

    async fn page_rows(&self, page: RowPage) -> StoreResult<Vec<Self::Row>>;

    /// The artifact records (`a.*`) a list holds.
    async fn artifact_rows(&self, page: ArtifactPage) -> StoreResult<Vec<Self::Row>>;

    /// Rows of `log` of a session with its order column `> after`, in order, at most `limit`.
    async fn log_rows(&self, log: &LogTable, page: LogPage) -> StoreResult<Vec<Self::Row>>;

    /// The stored event batches of a session (see [`event_log`](super::event_log)) that hold
    /// events after `after` and begin at or before `upto`, in order, at most `limit` of them:
    /// each its `last_seq` and its `events` text.
    async fn event_batch_rows(&self, page: BatchPage) -> StoreResult<Vec<(i64, String)>>;

    async fn one_row(&self, table: &KeyedTable, key: RowKey) -> StoreResult<Option<Self::Row>>;
}

/// A table of rows of a session with time-ordered ids, and the columns a record is read from.
pub struct KeyedTable {
    pub name: &'static str,
    pub columns: &'static str,
}

const STEPS: KeyedTable = KeyedTable {
    name: "steps",
    columns: STEP_COLUMNS,
};

const RUNS: KeyedTable = KeyedTable {
    name: "runs",
    columns: RUN_COLUMNS,
};

/// Rows of `table` of a session: with `id > after` when given, in id order, at most `limit`.
pub struct RowPage {
    pub table: &'static KeyedTable,
    pub session_id: Uuid,
    pub after: Option<Uuid>,
    pub limit: i64,
}

/// A table of a session in the order of an integer column (messages by index).
pub struct LogTable {
    pub name: &'static str,
    pub columns: &'static str,
    pub order: &'static str,
}

impl LogTable {
    /// The page: `$1` the session, `$2` the order column's bound, `$3` the limit.
    pub fn select(&self) -> String {
        let LogTable {
            name,
            columns,
            order,
        } = self;
        format!(
            "SELECT {columns} FROM {name} \
             WHERE session_id = $1 AND {order} > $2 ORDER BY {order} LIMIT $3"
        )
    }
}

const MESSAGES: LogTable = LogTable {
    name: "messages",
    columns: MESSAGE_COLUMNS,
    order: "idx",
};

/// The event batches of a session that hold events after `after` and begin at or before
/// `upto`, at most `limit` of them.
#[derive(Clone, Copy)]
pub struct BatchPage {
    pub session_id: Uuid,
    pub after: i64,
    pub upto: i64,
    pub limit: i64,
}

/// Rows of a session after `after` in the table's order, at most `limit`.
#[derive(Clone, Copy)]
pub struct LogPage {
    pub session_id: Uuid,
    pub after: i64,
    pub limit: i64,
}

/// The artifacts of a session that `query` asks for.
#[derive(Clone, Copy)]
pub struct ArtifactPage {
    pub session_id: Uuid,
    pub query: ArtifactQuery,
}

/// One row of a session, by id.
#[derive(Clone, Copy)]
pub struct RowKey {
    pub session_id: Uuid,
    pub id: Uuid,
}

#[async_trait]
impl<S: SessionRows> SessionHistory for S {
    async fn messages(
        &self,
        session_id: Uuid,
        after: i64,
        limit: i64,
    ) -> StoreResult<Vec<Message>> {
        let page = LogPage {
            session_id,
            after,
            limit,
        };
        let rows = self.log_rows(&MESSAGES, page).await?;
        rows.iter().map(message_from).collect()
    }

    async fn events(&self, session_id: Uuid, after: i64, limit: i64) -> StoreResult<Vec<Event>> {
        // A negative limit is no limit, as SQL's `LIMIT` reads it.
        let want = usize::try_from(limit).unwrap_or(usize::MAX);
        let mut events = Vec::with_capacity(want.min(1024));
        let mut cursor = after;
        while events.len() < want {
            // A session's seqs are contiguous, so the rows that begin by `cursor + left` hold
            // the page; should there be a gap, the next row after it is asked for alone.
            let left = i64::try_from(want - events.len()).unwrap_or(i64::MAX);
            let page = BatchPage {
                session_id,
                after: cursor,
                upto: cursor.saturating_add(left),
                limit: i64::MAX,
            };
            let mut rows = self.event_batch_rows(page).await?;
            if rows.is_empty() {
                let next = BatchPage {
                    upto: i64::MAX,
                    limit: 1,
                    ..page
                };
                rows = self.event_batch_rows(next).await?;
            }
            let Some((last_seq, _)) = rows.last() else {
                break;
            };
            cursor = *last_seq;
            for (_, stored) in &rows {
                event_log::read_into(session_id, stored, after, want, &mut events)?;
                if events.len() >= want {
                    break;
                }
            }
        }
        Ok(events)
    }

    async fn steps(
        &self,
        session_id: Uuid,
        after: Option<Uuid>,
        limit: i64,
    ) -> StoreResult<Vec<StepRecord>> {
        let page = RowPage {
            table: &STEPS,
            session_id,
            after,
            limit,
        };
        let rows = self.page_rows(page).await?;
        rows.iter().map(step_from).collect()
    }

    async fn step(&self, session_id: Uuid, step_id: Uuid) -> StoreResult<Option<StepRecord>> {
        let key = RowKey {
            session_id,
            id: step_id,
        };
        let row = self.one_row(&STEPS, key).await?;
        row.as_ref().map(step_from).transpose()
    }

    async fn runs(
        &self,
        session_id: Uuid,
        after: Option<Uuid>,
        limit: i64,
    ) -> StoreResult<Vec<RunRecord>> {
        let page = RowPage {
            table: &RUNS,
            session_id,
            after,
            limit,
        };
        let rows = self.page_rows(page).await?;
        rows.iter().map(run_from).collect()
    }

    async fn run(&self, session_id: Uuid, run_id: Uuid) -> StoreResult<Option<RunRecord>> {
        let key = RowKey {
            session_id,
            id: run_id,
        };
        let row = self.one_row(&RUNS, key).await?;
        row.as_ref().map(run_from).transpose()
    }

    async fn artifacts(
        &self,
        session_id: Uuid,
        query: ArtifactQuery,
    ) -> StoreResult<Vec<ArtifactRecord>> {
        let rows = self
            .artifact_rows(ArtifactPage { session_id, query })
            .await?;
        rows.iter().map(artifact_from).collect()
    }
}

/// A stored value that cannot be decoded: its column and the value as stored.
pub fn corrupt(col: &str, value: &str) -> StoreError {
    StoreError::Corrupt(format!("{col}: {value:?}"))
}

/// A stored event whose `data` does not fit its `type`.
pub fn corrupt_event(type_name: &str, error: impl Display) -> StoreError {
    StoreError::Corrupt(format!("event of type {type_name:?}: {error}"))
}

/// A text column that holds one of an enum's names.
fn named<R: StoredRow, T>(row: &R, col: &str, parse: fn(&str) -> Option<T>) -> StoreResult<T> {
    let name: String = row.get(col)?;
    parse(&name).ok_or_else(|| corrupt(col, &name))
}

fn run_kind(name: &str) -> Option<RunKind> {
    match name {
        "run" => Some(RunKind::Run),
        "resume" => Some(RunKind::Resume),
        _ => None,
    }
}

/// A token count as stored (`bigint`/`INTEGER`).
pub fn tokens(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A stored token count; a negative one (never written) reads as 0.
fn token_count(n: i64) -> u64 {
    n.max(0) as u64
}

fn usage<R: StoredRow>(row: &R) -> StoreResult<Usage> {
    Ok(Usage {
        input_tokens: token_count(row.get("input_tokens")?),
        output_tokens: token_count(row.get("output_tokens")?),
    })
}

/// A step's usage, recorded only once the model reported it.
fn opt_usage<R: StoredRow>(row: &R) -> StoreResult<Option<Usage>> {
    let input: Option<i64> = row.get("input_tokens")?;
    let output: Option<i64> = row.get("output_tokens")?;
    Ok(match (input, output) {
        (Some(input), Some(output)) => Some(Usage {
            input_tokens: token_count(input),
            output_tokens: token_count(output),
        }),
        _ => None,
    })
}

/// A row of [`SESSION_COLUMNS`].
/// The sessions of a list; a row that cannot be decoded (a state written by a newer version,
/// a hand-edited value) is left out and logged, so that it does not hide every other session.
pub fn listed_sessions<R: StoredRow>(rows: &[R]) -> Vec<SessionRecord> {
    rows.iter()
        .filter_map(|row| match session_from(row) {
            Ok(session) => Some(session),
            Err(error) => {
                tracing::warn!(%error, "a stored session cannot be read; it is left out of the list");
                None
            }
        })
        .collect()
}

pub fn session_from<R: StoredRow>(row: &R) -> StoreResult<SessionRecord> {
    Ok(SessionRecord {
        id: row.uuid("id")?,
        parent_id: row.opt_uuid("parent_id")?,
        title: row.get("title")?,
        metadata: row.json("metadata")?,
        options: serde_json::from_value(row.json("options")?)
            .map_err(|e| StoreError::Corrupt(format!("options: {e}")))?,
        system_prompt: row.get("system_prompt")?,
        state: named(row, "state", SessionState::parse)?,
        error: row.get("error")?,
        message_count: row.get("message_count")?,
        last_seq: row.get("last_seq")?,
        usage: usage(row)?,
        last_run_id: row.opt_uuid("last_run_id")?,
        created_at: row.time("created_at")?,
        updated_at: row.time("updated_at")?,
        tenant: row.get("tenant")?,
        owner: row.get("owner")?,
    })
}

/// A row of [`MESSAGE_COLUMNS`].
pub fn message_from<R: StoredRow>(row: &R) -> StoreResult<Message> {
    let tool_calls: Vec<ToolCall> = match row.opt_json("tool_calls")? {
        Some(calls) => serde_json::from_value(calls)
            .map_err(|e| StoreError::Corrupt(format!("tool_calls: {e}")))?,
        None => Vec::new(),
    };
    let thinking: Vec<ThinkingBlock> = match row.opt_json("thinking")? {
        Some(blocks) => serde_json::from_value(blocks)
            .map_err(|e| StoreError::Corrupt(format!("thinking: {e}")))?,
        None => Vec::new(),
    };
    Ok(Message {
        index: row.get("idx")?,
        role: named(row, "role", Role::parse)?,
        content: row.get("content")?,
        thinking,
        tool_calls,
        tool_call_id: row.get("tool_call_id")?,
        created_at: row.time("created_at")?,
        size: SizeCache::default(),
    })
}

/// A row of [`RUN_COLUMNS`].
pub fn run_from<R: StoredRow>(row: &R) -> StoreResult<RunRecord> {
    Ok(RunRecord {
        id: row.uuid("id")?,
        session_id: row.uuid("session_id")?,
        kind: named(row, "kind", run_kind)?,
        status: named(row, "status", RunStatus::parse)?,
        input: row.get("input")?,
        text: row.get("text")?,
        finish_reason: row
            .get::<Option<String>>("finish_reason")?
            .map(|r| FinishReason::parse(&r)),
        usage: usage(row)?,
        steps: row.get("steps")?,
        error: row.get("error")?,
        start_seq: row.get("start_seq")?,
        created_at: row.time("created_at")?,
        finished_at: row.opt_time("finished_at")?,
        client_tools: match row.opt_json("client_tools")? {
            None => Vec::new(),
            Some(json) => serde_json::from_value(json)
                .map_err(|e| StoreError::Corrupt(format!("runs.client_tools: {e}")))?,
        },
    })
}

/// A row of [`STEP_COLUMNS`].
pub fn step_from<R: StoredRow>(row: &R) -> StoreResult<StepRecord> {
    Ok(StepRecord {
        id: row.uuid("id")?,
        session_id: row.uuid("session_id")?,
        run_id: row.uuid("run_id")?,
        kind: named(row, "kind", StepKind::parse)?,
        status: named(row, "status", StepStatus::parse)?,
        request: row.json("request")?,
        response: row.opt_json("response")?,
        usage: opt_usage(row)?,
        error: row.get("error")?,
        created_at: row.time("created_at")?,
        finished_at: row.opt_time("finished_at")?,
    })
}

/// A row of [`ARTIFACT_COLUMNS`].
pub fn artifact_from<R: StoredRow>(row: &R) -> StoreResult<ArtifactRecord> {
    let size: i64 = row.get("size")?;
    Ok(ArtifactRecord {
        id: row.uuid("id")?,
        path: row.get("path")?,
        version: row.get("version")?,
        size: u64::try_from(size).map_err(|_| corrupt("size", &size.to_string()))?,
        sha256: row.get("sha256")?,
        media_type: row.get("media_type")?,
        step_id: row.uuid("step_id")?,
        run_id: row.uuid("run_id")?,
        created_at: row.time("created_at")?,
    })
}

/// A row of [`CHECKPOINT_COLUMNS`].
pub fn checkpoint_from<R: StoredRow>(row: &R) -> StoreResult<Checkpoint> {
    Ok(Checkpoint {
        id: row.uuid("id")?,
        session_id: row.uuid("session_id")?,
        run_id: row.uuid("run_id")?,
        step_id: row.opt_uuid("step_id")?,
        message_count: row.get("message_count")?,
        seq: row.get("seq")?,
        created_at: row.time("created_at")?,
    })
}
