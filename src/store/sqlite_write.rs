//! The write side of the SQLite store: one `rusqlite` connection applies a whole batch of ops
//! in one `BEGIN IMMEDIATE` transaction on a blocking thread, with cached prepared statements.
//!
//! sqlx runs SQLite on a worker thread and every statement is a round trip to it; a streaming
//! batch is mostly small inserts, so the hops, not SQLite, would bound throughput. Reads stay
//! on the sqlx pool (WAL lets them run beside this writer).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{params, Connection, TransactionBehavior};
use serde_json::Value;

use super::{StoreError, StoreResult, WriteOp};
use crate::model::{FinishReason, ToolCall};

#[derive(Clone)]
pub struct SqliteWriter {
    conn: Arc<Mutex<Connection>>,
}

impl SqliteWriter {
    pub fn open(path: &Path) -> StoreResult<SqliteWriter> {
        let conn = Connection::open(path).map_err(write_error)?;
        conn.busy_timeout(Duration::from_secs(10))
            .map_err(write_error)?;
        // WAL was set when the database was created; these are per connection.
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(write_error)?;
        conn.pragma_update(None, "temp_store", "MEMORY")
            .map_err(write_error)?;
        conn.set_prepared_statement_cache_capacity(64);
        Ok(SqliteWriter {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Applies every op in one transaction: all or nothing.
    pub async fn commit(&self, ops: Vec<WriteOp>) -> StoreResult<()> {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = conn.lock().unwrap_or_else(|e| e.into_inner());
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(write_error)?;
            for op in &ops {
                apply(&tx, op).map_err(write_error)?;
            }
            tx.commit().map_err(write_error)
        })
        .await
        .map_err(|e| StoreError::Write(format!("the writer thread failed: {e}")))?
    }
}

fn write_error(error: rusqlite::Error) -> StoreError {
    StoreError::Write(error.to_string())
}

fn tool_calls_json(calls: &[ToolCall]) -> Option<String> {
    if calls.is_empty() {
        None
    } else {
        serde_json::to_string(calls).ok()
    }
}

fn tokens(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn apply(tx: &rusqlite::Transaction<'_>, op: &WriteOp) -> rusqlite::Result<()> {
    match op {
        WriteOp::InsertSession(s) => {
            tx.prepare_cached(
                "INSERT INTO sessions (id, parent_id, title, metadata, system_prompt, state, error, \
                 input_tokens, output_tokens, last_run_id, created_at, updated_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )?
            .execute(params![
                s.id.to_string(),
                s.parent_id.map(|id| id.to_string()),
                s.title,
                s.metadata.to_string(),
                s.system_prompt,
                s.state.as_str(),
                s.error,
                tokens(s.usage.input_tokens),
                tokens(s.usage.output_tokens),
                s.last_run_id.map(|id| id.to_string()),
                s.created_at.to_rfc3339(),
                s.updated_at.to_rfc3339(),
            ])?;
        }
        WriteOp::UpdateSession(s) => {
            tx.prepare_cached(
                "UPDATE sessions SET title = ?, metadata = ?, state = ?, error = ?, \
                 input_tokens = ?, output_tokens = ?, last_run_id = ?, updated_at = ? WHERE id = ?",
            )?
            .execute(params![
                s.title,
                s.metadata.to_string(),
                s.state.as_str(),
                s.error,
                tokens(s.usage.input_tokens),
                tokens(s.usage.output_tokens),
                s.last_run_id.map(|id| id.to_string()),
                s.updated_at.to_rfc3339(),
                s.id.to_string(),
            ])?;
        }
        WriteOp::DeleteSession(id) => {
            let id = id.to_string();
            for table in ["events", "messages", "steps", "runs", "checkpoints"] {
                tx.prepare_cached(&format!("DELETE FROM {table} WHERE session_id = ?"))?
                    .execute([&id])?;
            }
            tx.prepare_cached("DELETE FROM sessions WHERE id = ?")?
                .execute([&id])?;
        }
        WriteOp::InsertMessage {
            session_id,
            message: m,
        } => {
            tx.prepare_cached(
                "INSERT INTO messages (session_id, idx, role, content, tool_calls, tool_call_id, created_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?)",
            )?
            .execute(params![
                session_id.to_string(),
                m.index,
                m.role.as_str(),
                m.content,
                tool_calls_json(&m.tool_calls),
                m.tool_call_id,
                m.created_at.to_rfc3339(),
            ])?;
        }
        WriteOp::CopyMessages { from, to, upto } => {
            tx.prepare_cached(
                "INSERT INTO messages (session_id, idx, role, content, tool_calls, tool_call_id, created_at) \
                 SELECT ?, idx, role, content, tool_calls, tool_call_id, created_at FROM messages \
                 WHERE session_id = ? AND idx < ?",
            )?
            .execute(params![
                to.to_string(),
                from.to_string(),
                upto.unwrap_or(i64::MAX)
            ])?;
        }
        WriteOp::UpsertRun(r) => {
            tx.prepare_cached(
                "INSERT INTO runs (id, session_id, kind, status, input, text, finish_reason, \
                 input_tokens, output_tokens, steps, error, start_seq, created_at, finished_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
                 ON CONFLICT (id) DO UPDATE SET status = excluded.status, text = excluded.text, \
                 finish_reason = excluded.finish_reason, input_tokens = excluded.input_tokens, \
                 output_tokens = excluded.output_tokens, steps = excluded.steps, \
                 error = excluded.error, finished_at = excluded.finished_at",
            )?
            .execute(params![
                r.id.to_string(),
                r.session_id.to_string(),
                r.kind.as_str(),
                r.status.as_str(),
                r.input,
                r.text,
                r.finish_reason.as_ref().map(FinishReason::as_str),
                tokens(r.usage.input_tokens),
                tokens(r.usage.output_tokens),
                r.steps,
                r.error,
                r.start_seq,
                r.created_at.to_rfc3339(),
                r.finished_at.map(|t| t.to_rfc3339()),
            ])?;
        }
        WriteOp::UpsertStep(s) => {
            tx.prepare_cached(
                "INSERT INTO steps (id, session_id, run_id, kind, status, request, response, \
                 input_tokens, output_tokens, error, created_at, finished_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
                 ON CONFLICT (id) DO UPDATE SET status = excluded.status, \
                 response = excluded.response, input_tokens = excluded.input_tokens, \
                 output_tokens = excluded.output_tokens, error = excluded.error, \
                 finished_at = excluded.finished_at",
            )?
            .execute(params![
                s.id.to_string(),
                s.session_id.to_string(),
                s.run_id.to_string(),
                s.kind.as_str(),
                s.status.as_str(),
                s.request.to_string(),
                s.response.as_ref().map(Value::to_string),
                s.usage.map(|u| tokens(u.input_tokens)),
                s.usage.map(|u| tokens(u.output_tokens)),
                s.error,
                s.created_at.to_rfc3339(),
                s.finished_at.map(|t| t.to_rfc3339()),
            ])?;
        }
        WriteOp::InsertEvent(e) => {
            tx.prepare_cached(
                "INSERT INTO events (session_id, seq, type, data, created_at) VALUES (?, ?, ?, ?, ?)",
            )?
            .execute(params![
                e.session_id.to_string(),
                e.seq,
                e.type_name(),
                e.kind.data_json(),
                e.created_at.to_rfc3339(),
            ])?;
        }
        // One process owns a SQLite database: there is nothing to fence.
        WriteOp::Fence { .. } => {}
        WriteOp::FailOpenSteps {
            session_id,
            run_id,
            error,
            at,
        } => {
            tx.prepare_cached(
                "UPDATE steps SET status = 'failed', error = ?, finished_at = ? \
                 WHERE session_id = ? AND run_id = ? AND status IN ('pending', 'streaming', 'running')",
            )?
            .execute(params![
                error,
                at.to_rfc3339(),
                session_id.to_string(),
                run_id.to_string()
            ])?;
        }
        WriteOp::InsertCheckpoint(c) => {
            tx.prepare_cached(
                "INSERT INTO checkpoints (id, session_id, run_id, step_id, message_count, seq, created_at) \
                 VALUES (?, ?, ?, ?, ?, ?, ?)",
            )?
            .execute(params![
                c.id.to_string(),
                c.session_id.to_string(),
                c.run_id.to_string(),
                c.step_id.map(|id| id.to_string()),
                c.message_count,
                c.seq,
                c.created_at.to_rfc3339(),
            ])?;
        }
    }
    Ok(())
}
