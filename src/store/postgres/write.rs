//! The write side of the PostgreSQL store: a commit is one transaction. The ops of the kinds a
//! turn writes (events, messages, steps, runs, checkpoints, session progress) go in as two
//! statements per stretch of them, each table written by one multi-row `INSERT … SELECT FROM
//! UNNEST(…)` (or `UPDATE … FROM UNNEST(…)`) ([`Stretch`]); any other op is a statement of its
//! own, where it stands. Fences are checked before the ops, and the newest events are
//! announced to the other replicas (`cluster.rs`) inside the transaction, by the stretch's
//! second statement, so the announcement is delivered only if it commits. Text and JSON are cleared
//! of U+0000 on the way in (see the module doc of [`super`]).

use std::borrow::Cow;
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::{PgArguments, PgConnection};
use sqlx::query::Query;
use sqlx::types::Json;
use sqlx::Postgres;
use uuid::Uuid;

use super::{cluster, PostgresStore};
use crate::model::{
    Checkpoint, FinishReason, Message, Published, RunRecord, SessionRecord, ThinkingBlock, ToolCall,
};
use crate::store::event_log;
use crate::store::rows::{tokens, CopiedRows, COPIED_ARTIFACTS, COPIED_MESSAGES, SESSION_TABLES};
use crate::store::{NewArtifact, SessionLabels, SessionProgress, StepRow, StoreResult, WriteOp};

/// Applies every group of ops in one transaction: all or nothing.
pub(super) async fn commit(store: &PostgresStore, batch: &[&[WriteOp]]) -> StoreResult<()> {
    let ops: Vec<&WriteOp> = batch.iter().flat_map(|ops| ops.iter()).collect();
    let mut tx = store.pool.begin().await?;
    let locked = lock_sessions(&mut tx, &ops).await?;
    // All fences in one statement (or none, the rows just locked); without them between the
    // groups, the event inserts of consecutive groups (a streaming session's deltas) become
    // one statement.
    cluster::check_fences(&mut tx, &ops, locked.as_deref()).await?;
    let unfenced: Vec<&WriteOp> = ops
        .iter()
        .copied()
        .filter(|op| !matches!(op, WriteOp::Fence { .. } | WriteOp::ReleaseLease { .. }))
        .collect();
    // The ops go in order, except that a stretch of ops of the kinds a turn writes (events,
    // messages, steps, runs, checkpoints, session progress) becomes two statements, each
    // table written by one multi-row statement (see [`Stretch`]). Any other op ends the
    // stretch before it and is applied on its own.
    let mut notices = cluster::events_notices(store.replica, &ops);
    let mut stretch = Stretch::default();
    for op in unfenced {
        if !stretch.add(op) {
            stretch.write(&mut tx, &mut notices).await?;
            apply(&mut tx, op).await?;
        }
    }
    stretch.write(&mut tx, &mut notices).await?;
    release_leases(&mut tx, &ops).await?;
    cluster::announce(&mut tx, &notices).await?;
    tx.commit().await?;
    Ok(())
}

/// Gives back the leases the ops release, in one statement after every other write of the
/// transaction (a lease is released after the commits of its run, which the fences before
/// them were checked against). A lease another replica has taken since is left alone.
async fn release_leases(conn: &mut PgConnection, ops: &[&WriteOp]) -> Result<(), sqlx::Error> {
    let (ids, owners): (Vec<Uuid>, Vec<Uuid>) = ops
        .iter()
        .filter_map(|op| match op {
            WriteOp::ReleaseLease { session_id, owner } => Some((*session_id, *owner)),
            _ => None,
        })
        .unzip();
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL \
         FROM UNNEST($1::uuid[], $2::uuid[]) AS r(id, owner) \
         WHERE sessions.id = r.id AND sessions.lease_owner = r.owner",
    )
    .bind(ids)
    .bind(owners)
    .execute(conn)
    .await?;
    Ok(())
}

/// A stretch of consecutive ops of the kinds a turn writes, to be written with two statements:
/// the events' multi-row insert over `UNNEST` of their columns as arrays, then one with a
/// data-modifying `WITH` part per other table, each one such multi-row statement, and the
/// commit's notifications as its `SELECT`. The tables are distinct
/// and none refers to another, so the parts' order does not matter; within one table:
/// - events, messages and checkpoints are inserts of distinct rows (a duplicate fails the
///   statement, as it failed its own);
/// - a step or run upserted several times becomes one upsert: the first op's columns that the
///   conflict leaves alone, the last op's that it updates (what the upserts in order leave);
/// - a session's progress written several times is written once, the last (it sets the same
///   columns each time).
#[derive(Default)]
struct Stretch<'a> {
    events: Vec<&'a Published>,
    messages: Vec<(Uuid, &'a Message)>,
    /// Each step's first and last upsert.
    steps: Vec<(&'a StepRow, &'a StepRow)>,
    /// Each run's first and last upsert.
    runs: Vec<(&'a RunRecord, &'a RunRecord)>,
    checkpoints: Vec<&'a Checkpoint>,
    /// Each session's last progress.
    progress: Vec<&'a SessionProgress>,
    /// Where each id is in `steps`, `runs` and `progress`.
    at: [HashMap<Uuid, usize>; 3],
}

impl<'a> Stretch<'a> {
    /// Takes `op` into the stretch; false when it is of another kind (it ends the stretch).
    fn add(&mut self, op: &'a WriteOp) -> bool {
        match op {
            WriteOp::InsertEvent(e) => self.events.push(e),
            WriteOp::InsertMessage {
                session_id,
                message,
            } => self.messages.push((*session_id, message)),
            WriteOp::UpsertStep(s) => match self.at[0].get(&s.id) {
                Some(&at) => self.steps[at].1 = s,
                None => {
                    self.at[0].insert(s.id, self.steps.len());
                    self.steps.push((s, s));
                }
            },
            WriteOp::UpsertRun(r) => match self.at[1].get(&r.id) {
                Some(&at) => self.runs[at].1 = r,
                None => {
                    self.at[1].insert(r.id, self.runs.len());
                    self.runs.push((r, r));
                }
            },
            WriteOp::InsertCheckpoint(c) => self.checkpoints.push(c),
            WriteOp::UpdateProgress(p) => match self.at[2].get(&p.id) {
                Some(&at) => self.progress[at] = p,
                None => {
                    self.at[2].insert(p.id, self.progress.len());
                    self.progress.push(p);
                }
            },
            _ => return false,
        }
        true
    }

    /// Writes the stretch (nothing when it is empty) and leaves it empty; its second statement
    /// also sends `notices`, which are then empty.
    async fn write(
        &mut self,
        conn: &mut PgConnection,
        notices: &mut Vec<String>,
    ) -> Result<(), sqlx::Error> {
        let s = std::mem::take(self);
        if s.events.is_empty()
            && s.messages.is_empty()
            && s.steps.is_empty()
            && s.runs.is_empty()
            && s.checkpoints.is_empty()
            && s.progress.is_empty()
        {
            return Ok(());
        }
        // The events first, in a statement of their own (what waits on the table's lock is an
        // `INSERT INTO event_batches`).
        insert_events(conn, &s.events).await?;
        let mut sql = Statement::default();
        if !s.messages.is_empty() {
            sql.part(
                "INSERT INTO messages (session_id, idx, role, content, thinking, tool_calls, \
                 tool_call_id, created_at) \
                 SELECT * FROM UNNEST($::uuid[], $::bigint[], $::text[], $::text[], $::jsonb[], \
                 $::jsonb[], $::text[], $::timestamptz[])",
            );
        }
        if !s.steps.is_empty() {
            sql.part(
                "INSERT INTO steps (id, session_id, run_id, kind, status, request, response, \
                 input_tokens, output_tokens, error, created_at, finished_at) \
                 SELECT * FROM UNNEST($::uuid[], $::uuid[], $::uuid[], $::text[], $::text[], \
                 $::text[]::jsonb[], $::text[]::jsonb[], $::bigint[], $::bigint[], $::text[], \
                 $::timestamptz[], $::timestamptz[]) \
                 ON CONFLICT (id) DO UPDATE SET status = excluded.status, \
                 response = excluded.response, input_tokens = excluded.input_tokens, \
                 output_tokens = excluded.output_tokens, error = excluded.error, \
                 finished_at = excluded.finished_at",
            );
        }
        if !s.runs.is_empty() {
            sql.part(
                "INSERT INTO runs (id, session_id, kind, status, input, text, finish_reason, \
                 input_tokens, output_tokens, steps, error, start_seq, created_at, finished_at, \
                 client_tools) \
                 SELECT * FROM UNNEST($::uuid[], $::uuid[], $::text[], $::text[], $::text[], \
                 $::text[], $::text[], $::bigint[], $::bigint[], $::bigint[], $::text[], \
                 $::bigint[], $::timestamptz[], $::timestamptz[], $::jsonb[]) \
                 ON CONFLICT (id) DO UPDATE SET status = excluded.status, text = excluded.text, \
                 finish_reason = excluded.finish_reason, input_tokens = excluded.input_tokens, \
                 output_tokens = excluded.output_tokens, steps = excluded.steps, \
                 error = excluded.error, finished_at = excluded.finished_at",
            );
        }
        if !s.checkpoints.is_empty() {
            sql.part(
                "INSERT INTO checkpoints (id, session_id, run_id, step_id, message_count, seq, \
                 created_at) \
                 SELECT * FROM UNNEST($::uuid[], $::uuid[], $::uuid[], $::uuid[], $::bigint[], \
                 $::bigint[], $::timestamptz[])",
            );
        }
        if !s.progress.is_empty() {
            sql.part(
                "UPDATE sessions SET state = u.state, error = u.error, \
                 input_tokens = u.input_tokens, output_tokens = u.output_tokens, \
                 last_run_id = u.last_run_id, updated_at = u.updated_at \
                 FROM UNNEST($::uuid[], $::text[], $::text[], $::bigint[], $::bigint[], \
                 $::uuid[], $::timestamptz[]) \
                 AS u(id, state, error, input_tokens, output_tokens, last_run_id, updated_at) \
                 WHERE sessions.id = u.id",
            );
        }
        let notices = std::mem::take(notices);
        if sql.parameters == 0 && notices.is_empty() {
            return Ok(());
        }
        let sql = sql.finish(!notices.is_empty());
        let mut query = sqlx::query(&sql);
        if !s.messages.is_empty() {
            let (mut thinking, mut tool_calls) = (Vec::new(), Vec::new());
            for (_, m) in &s.messages {
                thinking.push(thinking_json(&m.thinking)?);
                tool_calls.push(tool_calls_json(&m.tool_calls)?);
            }
            let ms = &s.messages;
            query = query
                .bind(ms.iter().map(|(id, _)| *id).collect::<Vec<_>>())
                .bind(ms.iter().map(|(_, m)| m.index).collect::<Vec<_>>())
                .bind(ms.iter().map(|(_, m)| m.role.as_str()).collect::<Vec<_>>())
                .bind(ms.iter().map(|(_, m)| text(&m.content)).collect::<Vec<_>>())
                .bind(thinking)
                .bind(tool_calls)
                .bind(
                    ms.iter()
                        .map(|(_, m)| opt_text(&m.tool_call_id))
                        .collect::<Vec<_>>(),
                )
                .bind(ms.iter().map(|(_, m)| m.created_at).collect::<Vec<_>>());
        }
        if !s.steps.is_empty() {
            // What the conflict leaves alone from the first upsert, what it updates from the last.
            let st = &s.steps;
            query = query
                .bind(st.iter().map(|(f, _)| f.id).collect::<Vec<_>>())
                .bind(st.iter().map(|(f, _)| f.session_id).collect::<Vec<_>>())
                .bind(st.iter().map(|(f, _)| f.run_id).collect::<Vec<_>>())
                .bind(st.iter().map(|(f, _)| f.kind.as_str()).collect::<Vec<_>>())
                .bind(
                    st.iter()
                        .map(|(_, l)| l.status.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    st.iter()
                        .map(|(f, _)| json_text(&f.request))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    st.iter()
                        .map(|(_, l)| l.response.as_deref().map(json_text))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    st.iter()
                        .map(|(_, l)| l.usage.map(|u| tokens(u.input_tokens)))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    st.iter()
                        .map(|(_, l)| l.usage.map(|u| tokens(u.output_tokens)))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    st.iter()
                        .map(|(_, l)| opt_text(&l.error))
                        .collect::<Vec<_>>(),
                )
                .bind(st.iter().map(|(f, _)| f.created_at).collect::<Vec<_>>())
                .bind(st.iter().map(|(_, l)| l.finished_at).collect::<Vec<_>>());
        }
        if !s.runs.is_empty() {
            let rs = &s.runs;
            query = query
                .bind(rs.iter().map(|(f, _)| f.id).collect::<Vec<_>>())
                .bind(rs.iter().map(|(f, _)| f.session_id).collect::<Vec<_>>())
                .bind(rs.iter().map(|(f, _)| f.kind.as_str()).collect::<Vec<_>>())
                .bind(
                    rs.iter()
                        .map(|(_, l)| l.status.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rs.iter()
                        .map(|(f, _)| opt_text(&f.input))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rs.iter()
                        .map(|(_, l)| opt_text(&l.text))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rs.iter()
                        .map(|(_, l)| l.finish_reason.as_ref().map(FinishReason::as_str))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rs.iter()
                        .map(|(_, l)| tokens(l.usage.input_tokens))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    rs.iter()
                        .map(|(_, l)| tokens(l.usage.output_tokens))
                        .collect::<Vec<_>>(),
                )
                .bind(rs.iter().map(|(_, l)| l.steps).collect::<Vec<_>>())
                .bind(
                    rs.iter()
                        .map(|(_, l)| opt_text(&l.error))
                        .collect::<Vec<_>>(),
                )
                .bind(rs.iter().map(|(f, _)| f.start_seq).collect::<Vec<_>>())
                .bind(rs.iter().map(|(f, _)| f.created_at).collect::<Vec<_>>())
                .bind(rs.iter().map(|(_, l)| l.finished_at).collect::<Vec<_>>())
                .bind(
                    rs.iter()
                        .map(|(f, _)| client_tools_json(f))
                        .collect::<Vec<_>>(),
                );
        }
        if !s.checkpoints.is_empty() {
            let cs = &s.checkpoints;
            query = query
                .bind(cs.iter().map(|c| c.id).collect::<Vec<_>>())
                .bind(cs.iter().map(|c| c.session_id).collect::<Vec<_>>())
                .bind(cs.iter().map(|c| c.run_id).collect::<Vec<_>>())
                .bind(cs.iter().map(|c| c.step_id).collect::<Vec<_>>())
                .bind(cs.iter().map(|c| c.message_count).collect::<Vec<_>>())
                .bind(cs.iter().map(|c| c.seq).collect::<Vec<_>>())
                .bind(cs.iter().map(|c| c.created_at).collect::<Vec<_>>());
        }
        if !s.progress.is_empty() {
            let ps = &s.progress;
            query = query
                .bind(ps.iter().map(|p| p.id).collect::<Vec<_>>())
                .bind(ps.iter().map(|p| p.state.as_str()).collect::<Vec<_>>())
                .bind(ps.iter().map(|p| opt_text(&p.error)).collect::<Vec<_>>())
                .bind(
                    ps.iter()
                        .map(|p| tokens(p.usage.input_tokens))
                        .collect::<Vec<_>>(),
                )
                .bind(
                    ps.iter()
                        .map(|p| tokens(p.usage.output_tokens))
                        .collect::<Vec<_>>(),
                )
                .bind(ps.iter().map(|p| p.last_run_id).collect::<Vec<_>>())
                .bind(ps.iter().map(|p| p.updated_at).collect::<Vec<_>>());
        }
        if !notices.is_empty() {
            query = query.bind(notices);
        }
        query.execute(conn).await?;
        Ok(())
    }
}

/// The text of a [`Stretch`]'s second statement: its parts, each with its parameters written `$`
/// and numbered here in order.
#[derive(Default)]
struct Statement {
    text: String,
    parameters: usize,
}

impl Statement {
    fn part(&mut self, part: &str) {
        self.text
            .push_str(if self.text.is_empty() { "WITH " } else { ", " });
        self.text.push_str(&format!("w{} AS (", self.parameters));
        for (i, piece) in part.split('$').enumerate() {
            if i > 0 {
                self.parameters += 1;
                self.text.push_str(&format!("${}", self.parameters));
            }
            self.text.push_str(piece);
        }
        self.text.push(')');
    }

    /// The statement, with the notifications in one more parameter when `notify`.
    fn finish(mut self, notify: bool) -> String {
        self.text.push(' ');
        if notify {
            self.text
                .push_str(&cluster::announce_select(self.parameters + 1));
        } else {
            self.text.push_str("SELECT 1");
        }
        self.text
    }
}

/// Locks the rows of the sessions the batch updates or checks the fence of, in id order,
/// before anything else: a batch of several sessions (a parent and its sub-agents, or group
/// commit across sessions) and the lease heartbeat, which locks in the same order, never
/// deadlock. (A fence check takes a share lock on its session's row, which conflicts with
/// the heartbeat's: taken in the middle of the batch, it could wait in a cycle with it.)
/// Returns the locked rows' leases, which the fence checks read; `None` when one row or none
/// needed locking.
async fn lock_sessions(
    conn: &mut PgConnection,
    ops: &[&WriteOp],
) -> StoreResult<Option<Vec<cluster::Lease>>> {
    let mut ids: Vec<Uuid> = ops
        .iter()
        .filter_map(|op| match op {
            WriteOp::UpdateSession(s) => Some(s.id),
            WriteOp::UpdateProgress(p) => Some(p.id),
            WriteOp::Fence { session_id, .. }
            | WriteOp::DeleteSession(session_id)
            | WriteOp::ReleaseLease { session_id, .. } => Some(*session_id),
            _ => None,
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.len() < 2 {
        return Ok(None);
    }
    let locked = sqlx::query_as(
        "SELECT id, lease_owner, lease_epoch FROM sessions WHERE id = ANY($1) ORDER BY id \
         FOR NO KEY UPDATE",
    )
    .bind(&ids)
    .fetch_all(&mut *conn)
    .await?;
    Ok(Some(locked))
}

/// Applies one op inside the caller's transaction.
async fn apply(conn: &mut PgConnection, op: &WriteOp) -> StoreResult<()> {
    match op {
        WriteOp::InsertSession(s) => insert_session(conn, s).await?,
        WriteOp::UpdateSession(s) => update_session(conn, s).await?,
        WriteOp::UpdateLabels(l) => update_labels(conn, l).await?,
        WriteOp::UpdateProgress(p) => update_progress(conn, p).await?,
        WriteOp::DeleteSession(id) => delete_session(conn, *id).await?,
        WriteOp::InsertMessage {
            session_id,
            message,
        } => insert_message(conn, *session_id, message).await?,
        WriteOp::CopyMessages { from, to, upto } => {
            copy_rows(conn, &COPIED_MESSAGES, *from, *to, *upto).await?
        }
        WriteOp::InsertArtifact(a) => insert_artifact(conn, a).await?,
        WriteOp::CopyArtifacts { from, to, upto } => {
            copy_rows(conn, &COPIED_ARTIFACTS, *from, *to, *upto).await?
        }
        WriteOp::UpsertRun(r) => upsert_run(conn, r).await?,
        WriteOp::UpsertStep(s) => upsert_step(conn, s).await?,
        WriteOp::InsertEvent(e) => insert_events(conn, &[e]).await?,
        WriteOp::Fence {
            session_id,
            owner,
            epoch,
        } => cluster::check_fence(conn, *session_id, *owner, *epoch).await?,
        WriteOp::FailOpenSteps {
            session_id,
            run_id,
            error,
            at,
        } => fail_open_steps(conn, *session_id, *run_id, error, *at).await?,
        WriteOp::InsertCheckpoint(c) => insert_checkpoint(conn, c).await?,
        WriteOp::ReleaseLease { .. } => release_leases(conn, &[op]).await?,
    }
    Ok(())
}

async fn insert_session(conn: &mut PgConnection, s: &SessionRecord) -> Result<(), sqlx::Error> {
    let options = options_value(s);
    let insert = sqlx::query(
        "INSERT INTO sessions (title, metadata, options, state, error, input_tokens, \
         output_tokens, last_run_id, updated_at, id, parent_id, system_prompt, created_at, \
         tenant, owner) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
    );
    bind_mutable(insert, s, &options)
        .bind(s.id)
        .bind(s.parent_id)
        .bind(opt_text(&s.system_prompt))
        .bind(s.created_at)
        .bind(&s.tenant)
        .bind(&s.owner)
        .execute(conn)
        .await?;
    Ok(())
}

async fn update_session(conn: &mut PgConnection, s: &SessionRecord) -> Result<(), sqlx::Error> {
    let options = options_value(s);
    sqlx::query(
        "UPDATE sessions SET options = $1, state = $2, error = $3, input_tokens = $4, \
         output_tokens = $5, last_run_id = $6, updated_at = $7 WHERE id = $8",
    )
    .bind(json(&options))
    .bind(s.state.as_str())
    .bind(opt_text(&s.error))
    .bind(tokens(s.usage.input_tokens))
    .bind(tokens(s.usage.output_tokens))
    .bind(s.last_run_id)
    .bind(s.updated_at)
    .bind(s.id)
    .execute(conn)
    .await?;
    Ok(())
}

async fn update_labels(conn: &mut PgConnection, l: &SessionLabels) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE sessions SET title = $1, metadata = $2, updated_at = $3 WHERE id = $4")
        .bind(opt_text(&l.title))
        .bind(json(&l.metadata))
        .bind(l.updated_at)
        .bind(l.id)
        .execute(conn)
        .await?;
    Ok(())
}

async fn update_progress(conn: &mut PgConnection, p: &SessionProgress) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE sessions SET state = $1, error = $2, input_tokens = $3, output_tokens = $4, \
         last_run_id = $5, updated_at = $6 WHERE id = $7",
    )
    .bind(p.state.as_str())
    .bind(opt_text(&p.error))
    .bind(tokens(p.usage.input_tokens))
    .bind(tokens(p.usage.output_tokens))
    .bind(p.last_run_id)
    .bind(p.updated_at)
    .bind(p.id)
    .execute(conn)
    .await?;
    Ok(())
}

/// Binds `$1` to `$9` of both session statements: the columns an update rewrites.
fn bind_mutable<'q>(
    query: Query<'q, Postgres, PgArguments>,
    s: &'q SessionRecord,
    options: &'q Value,
) -> Query<'q, Postgres, PgArguments> {
    query
        .bind(opt_text(&s.title))
        .bind(json(&s.metadata))
        .bind(json(options))
        .bind(s.state.as_str())
        .bind(opt_text(&s.error))
        .bind(tokens(s.usage.input_tokens))
        .bind(tokens(s.usage.output_tokens))
        .bind(s.last_run_id)
        .bind(s.updated_at)
}

fn options_value(s: &SessionRecord) -> serde_json::Value {
    serde_json::to_value(&s.options).unwrap_or_else(|_| serde_json::json!({}))
}

async fn delete_session(conn: &mut PgConnection, id: Uuid) -> Result<(), sqlx::Error> {
    // The bytes that only this session's artifacts name go with them. Other replicas may be
    // recording artifacts of the same bytes, or deleting other sessions that name them, at
    // the same time: the rows of those bytes are locked first (as an artifact's insert locks
    // them, see `insert_artifact`), and whether anything else still names them is asked after
    // that, in a statement of its own, so that it sees what those others committed.
    let shared: Vec<String> = sqlx::query_scalar(
        "SELECT sha256 FROM blobs \
         WHERE sha256 IN (SELECT sha256 FROM artifacts WHERE session_id = $1) \
         ORDER BY sha256 FOR UPDATE",
    )
    .bind(id)
    .fetch_all(&mut *conn)
    .await?;
    for table in SESSION_TABLES {
        sqlx::query(&format!("DELETE FROM {table} WHERE session_id = $1"))
            .bind(id)
            .execute(&mut *conn)
            .await?;
    }
    sqlx::query("DELETE FROM sessions WHERE id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    if !shared.is_empty() {
        sqlx::query(
            "DELETE FROM blobs WHERE sha256 = ANY($1) \
             AND NOT EXISTS (SELECT 1 FROM artifacts a WHERE a.sha256 = blobs.sha256)",
        )
        .bind(&shared)
        .execute(conn)
        .await?;
    }
    Ok(())
}

async fn insert_message(
    conn: &mut PgConnection,
    session_id: Uuid,
    m: &Message,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO messages (session_id, idx, role, content, thinking, tool_calls, \
         tool_call_id, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(session_id)
    .bind(m.index)
    .bind(m.role.as_str())
    .bind(text(&m.content))
    .bind(thinking_json(&m.thinking)?)
    .bind(tool_calls_json(&m.tool_calls)?)
    .bind(opt_text(&m.tool_call_id))
    .bind(m.created_at)
    .execute(conn)
    .await?;
    Ok(())
}

/// Copies rows of `from` into `to` (a fork), all of them when `upto` is `None`.
async fn copy_rows(
    conn: &mut PgConnection,
    rows: &CopiedRows,
    from: Uuid,
    to: Uuid,
    upto: Option<i64>,
) -> Result<(), sqlx::Error> {
    sqlx::query(&rows.sql())
        .bind(to)
        .bind(from)
        .bind(upto.unwrap_or(i64::MAX))
        .execute(conn)
        .await?;
    Ok(())
}

async fn insert_artifact(conn: &mut PgConnection, new: &NewArtifact) -> Result<(), sqlx::Error> {
    let a = &new.artifact;
    // Bytes stored already are not written again, but their row is locked (an update that
    // changes nothing) until the commit, so that a concurrent delete of the last session that
    // named them waits and then sees this artifact.
    sqlx::query(
        "INSERT INTO blobs (sha256, size, content, created_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (sha256) DO UPDATE SET size = blobs.size",
    )
    .bind(&a.sha256)
    .bind(size(a.size))
    .bind(new.content.as_ref())
    .bind(a.created_at)
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO artifacts (session_id, id, path, version, size, sha256, media_type, \
         step_id, run_id, message_count, seq, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
    )
    .bind(new.session_id)
    .bind(a.id)
    .bind(text(&a.path))
    .bind(a.version)
    .bind(size(a.size))
    .bind(&a.sha256)
    .bind(text(&a.media_type))
    .bind(a.step_id)
    .bind(a.run_id)
    .bind(new.message_count)
    .bind(new.seq)
    .bind(a.created_at)
    .execute(conn)
    .await?;
    Ok(())
}

/// A byte count as stored (`bigint`).
fn size(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

async fn upsert_run(conn: &mut PgConnection, r: &RunRecord) -> Result<(), sqlx::Error> {
    let client_tools = client_tools_json(r);
    sqlx::query(
        "INSERT INTO runs (id, session_id, kind, status, input, text, finish_reason, \
         input_tokens, output_tokens, steps, error, start_seq, created_at, finished_at, \
         client_tools) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) \
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
    .bind(client_tools)
    .execute(conn)
    .await?;
    Ok(())
}

/// A run's client tools as stored: `NULL` when it declared none of its own.
fn client_tools_json(r: &RunRecord) -> Option<Json<Value>> {
    (!r.client_tools.is_empty())
        .then(|| serde_json::to_value(&r.client_tools).ok())
        .flatten()
        .map(|v| Json(if has_nul(&v) { strip_nul(&v) } else { v }))
}

async fn upsert_step(conn: &mut PgConnection, s: &StepRow) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO steps (id, session_id, run_id, kind, status, request, response, \
         input_tokens, output_tokens, error, created_at, finished_at) \
         VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb, $8, $9, $10, $11, $12) \
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
    .bind(json_text(&s.request))
    .bind(s.response.as_deref().map(json_text))
    .bind(s.usage.map(|u| tokens(u.input_tokens)))
    .bind(s.usage.map(|u| tokens(u.output_tokens)))
    .bind(opt_text(&s.error))
    .bind(s.created_at)
    .bind(s.finished_at)
    .execute(conn)
    .await?;
    Ok(())
}

/// Writes events, one row per session holding its events among them (`event_log`), in one
/// multi-row statement. A row's first event must come after every event the session has
/// stored: an event stored twice fails the commit, as the former table's key on
/// `(session_id, seq)` made it. The rows are JSON text, not `jsonb`: nothing reads into them,
/// and text keeps U+0000 (as `\u0000`), which `jsonb` refuses.
async fn insert_events(conn: &mut PgConnection, events: &[&Published]) -> Result<(), sqlx::Error> {
    if events.is_empty() {
        return Ok(());
    }
    let batches =
        event_log::batches(events.iter().copied()).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    let done = sqlx::query(
        "INSERT INTO event_batches (session_id, first_seq, last_seq, events) \
         SELECT b.session_id, b.first_seq, b.last_seq, b.events \
         FROM UNNEST($1::uuid[], $2::bigint[], $3::bigint[], $4::text[]) \
           AS b(session_id, first_seq, last_seq, events) \
         WHERE b.first_seq > COALESCE((SELECT max(e.last_seq) FROM event_batches e \
                                       WHERE e.session_id = b.session_id), 0)",
    )
    .bind(batches.iter().map(|b| b.session_id).collect::<Vec<_>>())
    .bind(batches.iter().map(|b| b.first_seq).collect::<Vec<_>>())
    .bind(batches.iter().map(|b| b.last_seq).collect::<Vec<_>>())
    .bind(
        batches
            .iter()
            .map(|b| b.events.as_str())
            .collect::<Vec<_>>(),
    )
    .execute(conn)
    .await?;
    if done.rows_affected() != batches.len() as u64 {
        return Err(sqlx::Error::Protocol(
            "an event of the commit was stored already (a session's events are written once, \
             in order); the commit is refused"
                .to_string(),
        ));
    }
    Ok(())
}

async fn fail_open_steps(
    conn: &mut PgConnection,
    session_id: Uuid,
    run_id: Uuid,
    error: &str,
    at: DateTime<Utc>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE steps SET status = 'failed', error = $1, finished_at = $2 \
         WHERE session_id = $3 AND run_id = $4 AND status IN ('pending', 'streaming', 'running')",
    )
    .bind(text(error).as_ref())
    .bind(at)
    .bind(session_id)
    .bind(run_id)
    .execute(conn)
    .await?;
    Ok(())
}

async fn insert_checkpoint(conn: &mut PgConnection, c: &Checkpoint) -> Result<(), sqlx::Error> {
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
    .execute(conn)
    .await?;
    Ok(())
}

/// Text without U+0000 (which PostgreSQL cannot store); borrowed when there is none.
pub(super) fn text(s: &str) -> Cow<'_, str> {
    if s.contains('\0') {
        Cow::Owned(s.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(s)
    }
}

fn opt_text(s: &Option<String>) -> Option<Cow<'_, str>> {
    s.as_deref().map(text)
}

/// JSON text with U+0000 in its strings and keys replaced as [`text`] replaces it (`jsonb`
/// rejects `\u0000`, which is how JSON writes it); borrowed when clean. Escapes are read left
/// to right, so an escaped backslash followed by `u0000` stays as it is.
fn json_text(json: &str) -> Cow<'_, str> {
    const NUL: &str = "\\u0000";
    if !json.contains(NUL) {
        return Cow::Borrowed(json);
    }
    let bytes = json.as_bytes();
    let mut out = String::with_capacity(json.len());
    let (mut at, mut copied) = (0, 0);
    while at < bytes.len() {
        if bytes[at] != b'\\' {
            at += 1;
        } else if json[at..].starts_with(NUL) {
            out.push_str(&json[copied..at]);
            out.push_str("\\ufffd");
            at += NUL.len();
            copied = at;
        } else {
            // `\\`, `\"`, `\n`, the `u` of another `\uXXXX`: the escaped character is ASCII.
            at += 2;
        }
    }
    out.push_str(&json[copied..]);
    Cow::Owned(out)
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
    list_json(calls)
}

fn thinking_json(blocks: &[ThinkingBlock]) -> Result<Option<Json<Value>>, sqlx::Error> {
    list_json(blocks)
}

/// A list as `jsonb` (U+0000, which `jsonb` cannot hold, removed); an empty list as NULL.
fn list_json<T: serde::Serialize>(items: &[T]) -> Result<Option<Json<Value>>, sqlx::Error> {
    if items.is_empty() {
        return Ok(None);
    }
    let value = serde_json::to_value(items).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    Ok(Some(Json(if has_nul(&value) {
        strip_nul(&value)
    } else {
        value
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statements_parameters_are_numbered_across_its_parts() {
        let mut sql = Statement::default();
        sql.part("INSERT INTO a SELECT * FROM UNNEST($::uuid[], $::text[])");
        sql.part("UPDATE b SET x = u.x FROM UNNEST($::bigint[]) AS u(x)");
        assert_eq!(
            sql.finish(true),
            "WITH w0 AS (INSERT INTO a SELECT * FROM UNNEST($1::uuid[], $2::text[])), \
             w2 AS (UPDATE b SET x = u.x FROM UNNEST($3::bigint[]) AS u(x)) \
             SELECT pg_notify('tah_events', p) FROM unnest($4::text[]) AS p"
        );
    }

    #[test]
    fn json_text_replaces_nul_escapes_as_text_replaces_nul() {
        let value = serde_json::json!({"a\u{0}": ["x\u{0}y", "\\u0000", "\u{0}\\\u{0}"], "n": 1});
        let written = value.to_string();
        let cleared: Value = serde_json::from_str(&json_text(&written)).unwrap();
        assert_eq!(cleared, strip_nul(&value));
        // An escaped backslash before `u0000` is text, not an escape of U+0000.
        let literal = r#"{"a":"\\u0000"}"#;
        assert_eq!(json_text(literal), literal);
        let clean = r#"{"a":"b\n\u00e9"}"#;
        assert!(matches!(json_text(clean), Cow::Borrowed(s) if s == clean));
    }
}
