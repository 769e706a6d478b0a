//! The write side of the SQLite store: one `rusqlite` connection applies a whole batch of ops
//! in one `BEGIN IMMEDIATE` transaction on a blocking thread, with cached prepared statements
//! and one function per op. Why writes do not go through sqlx like the reads: see the module
//! doc of [`super`].

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use rusqlite::types::Value as SqlValue;
use rusqlite::{params, params_from_iter, Connection, Transaction, TransactionBehavior};
use uuid::Uuid;

use crate::model::{
    Checkpoint, FinishReason, Message, Published, RunRecord, SessionRecord, ThinkingBlock, ToolCall,
};
use crate::store::event_log;
use crate::store::rows::{tokens, CopiedRows, COPIED_ARTIFACTS, COPIED_MESSAGES, SESSION_TABLES};
use crate::store::{
    Durability, NewArtifact, SessionLabels, SessionProgress, StepRow, StoreError, StoreResult,
    WriteOp,
};

#[derive(Clone)]
pub struct SqliteWriter {
    conn: Arc<Mutex<Connection>>,
    /// The database file, and the identity (device, inode) it had when it was opened.
    file: Arc<(PathBuf, FileId)>,
    /// Commit on the calling thread (`--durability process`: a commit does not sync).
    inline: bool,
}

/// A file's device and inode: a file deleted or replaced under the server gets another one
/// (or none), while its open connection would go on writing to the old one, unseen.
type FileId = (u64, u64);

fn file_id(path: &Path) -> std::io::Result<FileId> {
    let meta = std::fs::metadata(path)?;
    Ok((meta.dev(), meta.ino()))
}

impl SqliteWriter {
    /// Opens the write connection and checks that the database can be written.
    pub fn open(path: &Path, durability: Durability) -> StoreResult<SqliteWriter> {
        let unusable =
            |what: String| StoreError::Unusable(format!("the database {}: {what}", path.display()));
        // rusqlite runs the very SQLite library sqlx does (its version is pinned to sqlx's in
        // `Cargo.toml`), so this connection and the pool's share one table of the file's
        // POSIX locks: none of them drops another's locks by closing its descriptor.
        // Through the shim that writes a transaction's WAL frames in one call (`vfs.rs`).
        let vfs = super::vfs::register()
            .map_err(|rc| unusable(format!("cannot register its VFS (SQLite error {rc})")))?;
        let conn = Connection::open_with_flags_and_vfs(
            path,
            rusqlite::OpenFlags::default(),
            vfs.to_str().unwrap_or_default(),
        )
        .map_err(|e| unusable(format!("cannot open it: {e}")))?;
        // A write transaction that changes nothing: refused at once on a read-only file or
        // file system, rather than at the first real write.
        conn.execute_batch("BEGIN IMMEDIATE; ROLLBACK;")
            .map_err(|e| match e.sqlite_error_code() {
                Some(rusqlite::ErrorCode::ReadOnly) => unusable(
                    "it is read-only (file permissions or a read-only file system); tah must \
                     be able to write it"
                        .to_string(),
                ),
                _ => unusable(format!("cannot write it: {e}")),
            })?;
        let id = file_id(path).map_err(|e| unusable(format!("cannot read its metadata: {e}")))?;
        conn.busy_timeout(super::BUSY_TIMEOUT)
            .map_err(write_error)?;
        // The same statements as sqlx makes on the pool's connections.
        for (name, value) in super::pragmas(super::Connections::Batch) {
            conn.execute_batch(&format!("PRAGMA {name} = {value}"))
                .map_err(write_error)?;
        }
        conn.execute_batch(&format!(
            "PRAGMA synchronous = {}",
            durability.sqlite_synchronous()
        ))
        .map_err(write_error)?;
        conn.set_prepared_statement_cache_capacity(64);
        Ok(SqliteWriter {
            conn: Arc::new(Mutex::new(conn)),
            file: Arc::new((path.to_path_buf(), id)),
            inline: durability == Durability::Process,
        })
    }

    /// A setting of the write connection, as SQLite reports it.
    #[cfg(test)]
    pub fn pragma(&self, name: &str) -> i64 {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        conn.pragma_query_value(None, name, |row| row.get(0))
            .expect("a setting")
    }

    /// Fails when the database file is no longer the one that was opened (deleted, replaced).
    /// The message does not name the file: it is the answer of the open `/readyz`.
    pub fn check_file(&self) -> StoreResult<()> {
        let (path, opened) = &*self.file;
        match file_id(path) {
            Ok(id) if id == *opened => Ok(()),
            Ok(_) => Err(StoreError::Unusable(
                "the database file was replaced while tah was running; writes are refused: \
                 restart tah"
                    .to_string(),
            )),
            Err(e) => Err(StoreError::Unusable(format!(
                "the database file is gone ({e}) while tah was running; writes are refused: \
                 restart tah"
            ))),
        }
    }

    /// Whether [`SqliteWriter::commit`] commits on the caller's thread.
    pub fn inline(&self) -> bool {
        self.inline
    }

    /// Applies every op of every group in one transaction (all or nothing), and hands the
    /// groups back. Under `--durability process` a commit writes the WAL without syncing it
    /// (only the checkpoint every 10,000 pages syncs), so it runs on the calling task's
    /// thread: handing it to a blocking thread and back cost two thread wake-ups per commit,
    /// about a third of a C=1 turn's context switches (`BENCHMARKS.md`). Under `power` each
    /// commit syncs, and runs on a blocking thread. Either way a panic inside is the batch's
    /// error, and its ops are lost with it (the transaction rolled back).
    pub async fn commit(&self, groups: Vec<Vec<WriteOp>>) -> (Vec<Vec<WriteOp>>, StoreResult<()>) {
        if self.inline {
            let applied =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.apply_all(&groups)));
            return match applied {
                Ok(result) => (groups, result),
                Err(_) => (Vec::new(), Err(thread_failed("a panic"))),
            };
        }
        let writer = self.clone();
        let applied = tokio::task::spawn_blocking(move || {
            let result = writer.apply_all(&groups);
            (groups, result)
        })
        .await;
        match applied {
            Ok(done) => done,
            Err(e) => (Vec::new(), Err(thread_failed(e))),
        }
    }

    fn apply_all(&self, groups: &[Vec<WriteOp>]) -> StoreResult<()> {
        // One `stat` per batch: what a deleted database would lose is never acknowledged.
        self.check_file()?;
        let mut conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(write_error)?;
        // The events go in last, a row per session (`event_log`); before a session's deletion,
        // those gathered so far, so that none outlives its session.
        let mut events: Vec<&Published> = Vec::new();
        for op in groups.iter().flatten() {
            match op {
                WriteOp::InsertEvent(e) => events.push(e),
                WriteOp::DeleteSession(_) => {
                    insert_events(&tx, &std::mem::take(&mut events)).map_err(write_error)?;
                    apply(&tx, op).map_err(write_error)?;
                }
                _ => apply(&tx, op).map_err(write_error)?,
            }
        }
        insert_events(&tx, &events).map_err(write_error)?;
        tx.commit().map_err(write_error)
    }
}

fn thread_failed(cause: impl std::fmt::Display) -> StoreError {
    StoreError::Write(format!("the writer thread failed: {cause}"))
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

fn thinking_json(blocks: &[ThinkingBlock]) -> Option<String> {
    if blocks.is_empty() {
        None
    } else {
        serde_json::to_string(blocks).ok()
    }
}

/// Applies one op inside the batch's transaction.
fn apply(tx: &Transaction<'_>, op: &WriteOp) -> rusqlite::Result<()> {
    match op {
        WriteOp::InsertSession(s) => insert_session(tx, s),
        WriteOp::UpdateSession(s) => update_session(tx, s),
        WriteOp::UpdateLabels(l) => update_labels(tx, l),
        WriteOp::UpdateProgress(p) => update_progress(tx, p),
        WriteOp::DeleteSession(id) => delete_session(tx, *id),
        WriteOp::InsertMessage {
            session_id,
            message,
        } => insert_message(tx, *session_id, message),
        WriteOp::CopyMessages { from, to, upto } => {
            copy_rows(tx, &COPIED_MESSAGES, *from, *to, *upto)
        }
        WriteOp::InsertArtifact(a) => insert_artifact(tx, a),
        WriteOp::CopyArtifacts { from, to, upto } => {
            copy_rows(tx, &COPIED_ARTIFACTS, *from, *to, *upto)
        }
        WriteOp::UpsertRun(r) => upsert_run(tx, r),
        WriteOp::UpsertStep(s) => upsert_step(tx, s),
        // Gathered by `apply_all` into one row per session.
        WriteOp::InsertEvent(e) => insert_events(tx, &[e]),
        // One process owns a SQLite database: there is nothing to fence.
        WriteOp::Fence { .. } | WriteOp::ReleaseLease { .. } => Ok(()),
        WriteOp::FailOpenSteps {
            session_id,
            run_id,
            error,
            at,
        } => fail_open_steps(tx, *session_id, *run_id, error, *at),
        WriteOp::InsertCheckpoint(c) => insert_checkpoint(tx, c),
    }
}

fn insert_session(tx: &Transaction<'_>, s: &SessionRecord) -> rusqlite::Result<()> {
    let identity = [
        SqlValue::from(s.id.to_string()),
        s.parent_id.map(|id| id.to_string()).into(),
        s.system_prompt.clone().into(),
        s.created_at.to_rfc3339().into(),
        s.tenant.clone().into(),
        s.owner.clone().into(),
    ];
    tx.prepare_cached(
        "INSERT INTO sessions (title, metadata, options, state, error, input_tokens, \
         output_tokens, last_run_id, updated_at, id, parent_id, system_prompt, created_at, \
         tenant, owner) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )?
    .execute(params_from_iter(
        mutable_columns(s).into_iter().chain(identity),
    ))?;
    Ok(())
}

fn update_session(tx: &Transaction<'_>, s: &SessionRecord) -> rusqlite::Result<()> {
    let id = SqlValue::from(s.id.to_string());
    tx.prepare_cached(
        "UPDATE sessions SET options = ?, state = ?, error = ?, input_tokens = ?, \
         output_tokens = ?, last_run_id = ?, updated_at = ? WHERE id = ?",
    )?
    .execute(params_from_iter(
        mutable_columns(s).into_iter().skip(2).chain([id]),
    ))?;
    Ok(())
}

fn update_labels(tx: &Transaction<'_>, l: &SessionLabels) -> rusqlite::Result<()> {
    tx.prepare_cached("UPDATE sessions SET title = ?, metadata = ?, updated_at = ? WHERE id = ?")?
        .execute(params![
            l.title,
            l.metadata.to_string(),
            l.updated_at.to_rfc3339(),
            l.id.to_string(),
        ])?;
    Ok(())
}

fn update_progress(tx: &Transaction<'_>, p: &SessionProgress) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "UPDATE sessions SET state = ?, error = ?, input_tokens = ?, output_tokens = ?, \
         last_run_id = ?, updated_at = ? WHERE id = ?",
    )?
    .execute(params![
        p.state.as_str(),
        p.error,
        tokens(p.usage.input_tokens),
        tokens(p.usage.output_tokens),
        p.last_run_id.map(|id| id.to_string()),
        p.updated_at.to_rfc3339(),
        p.id.to_string(),
    ])?;
    Ok(())
}

/// The first nine parameters of both session statements: the columns an update rewrites.
fn mutable_columns(s: &SessionRecord) -> [SqlValue; 9] {
    [
        s.title.clone().into(),
        s.metadata.to_string().into(),
        options_json(s).into(),
        s.state.as_str().to_string().into(),
        s.error.clone().into(),
        tokens(s.usage.input_tokens).into(),
        tokens(s.usage.output_tokens).into(),
        s.last_run_id.map(|id| id.to_string()).into(),
        s.updated_at.to_rfc3339().into(),
    ]
}

fn options_json(s: &SessionRecord) -> String {
    // Plain data with string keys: serialising it cannot fail.
    serde_json::to_string(&s.options).unwrap_or_else(|_| "{}".to_string())
}

fn delete_session(tx: &Transaction<'_>, id: Uuid) -> rusqlite::Result<()> {
    let id = id.to_string();
    // The bytes that only this session's artifacts name go with them. One writer connection
    // applies every write of artifacts, so no other session can start naming them meanwhile.
    tx.prepare_cached(
        "DELETE FROM blobs WHERE sha256 IN (SELECT sha256 FROM artifacts WHERE session_id = ?1) \
         AND NOT EXISTS (SELECT 1 FROM artifacts o \
                         WHERE o.sha256 = blobs.sha256 AND o.session_id <> ?1)",
    )?
    .execute([&id])?;
    // The checkpoints are columns of the session's row here (`insert_checkpoint`).
    for table in SESSION_TABLES.iter().filter(|t| **t != "checkpoints") {
        tx.prepare_cached(&format!("DELETE FROM {table} WHERE session_id = ?"))?
            .execute([&id])?;
    }
    tx.prepare_cached("DELETE FROM sessions WHERE id = ?")?
        .execute([&id])?;
    Ok(())
}

fn insert_message(tx: &Transaction<'_>, session_id: Uuid, m: &Message) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO messages (session_id, idx, role, content, thinking, tool_calls, \
         tool_call_id, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )?
    .execute(params![
        session_id.to_string(),
        m.index,
        m.role.as_str(),
        m.content,
        thinking_json(&m.thinking),
        tool_calls_json(&m.tool_calls),
        m.tool_call_id,
        m.created_at.to_rfc3339(),
    ])?;
    Ok(())
}

/// Copies rows of `from` into `to` (a fork), all of them when `upto` is `None`.
fn copy_rows(
    tx: &Transaction<'_>,
    rows: &CopiedRows,
    from: Uuid,
    to: Uuid,
    upto: Option<i64>,
) -> rusqlite::Result<()> {
    tx.prepare_cached(&rows.sql())?.execute(params![
        to.to_string(),
        from.to_string(),
        upto.unwrap_or(i64::MAX)
    ])?;
    Ok(())
}

fn insert_artifact(tx: &Transaction<'_>, new: &NewArtifact) -> rusqlite::Result<()> {
    let a = &new.artifact;
    tx.prepare_cached(
        "INSERT INTO blobs (sha256, size, content, created_at) VALUES (?, ?, ?, ?) \
         ON CONFLICT (sha256) DO NOTHING",
    )?
    .execute(params![
        a.sha256,
        size(a.size),
        new.content.as_ref(),
        a.created_at.to_rfc3339()
    ])?;
    tx.prepare_cached(
        "INSERT INTO artifacts (session_id, id, path, version, size, sha256, media_type, \
         step_id, run_id, message_count, seq, created_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )?
    .execute(params![
        new.session_id.to_string(),
        a.id.to_string(),
        a.path,
        a.version,
        size(a.size),
        a.sha256,
        a.media_type,
        a.step_id.to_string(),
        a.run_id.to_string(),
        new.message_count,
        new.seq,
        a.created_at.to_rfc3339(),
    ])?;
    Ok(())
}

/// A byte count as stored (`INTEGER`).
fn size(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn upsert_run(tx: &Transaction<'_>, r: &RunRecord) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "INSERT INTO runs (id, session_id, kind, status, input, text, finish_reason, \
         input_tokens, output_tokens, steps, error, start_seq, created_at, finished_at, \
         client_tools) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
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
        run_client_tools(r).map(|v| v.to_string()),
    ])?;
    Ok(())
}

/// A run's own client tools as stored: `NULL` when it has none.
fn run_client_tools(r: &RunRecord) -> Option<serde_json::Value> {
    match r.client_tools.is_empty() {
        true => None,
        false => serde_json::to_value(&r.client_tools).ok(),
    }
}

fn upsert_step(tx: &Transaction<'_>, s: &StepRow) -> rusqlite::Result<()> {
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
        s.request,
        s.response,
        s.usage.map(|u| tokens(u.input_tokens)),
        s.usage.map(|u| tokens(u.output_tokens)),
        s.error,
        s.created_at.to_rfc3339(),
        s.finished_at.map(|t| t.to_rfc3339()),
    ])?;
    Ok(())
}

/// Writes the events of a commit, one row per session holding its events of the commit. A
/// row's first event must come after every event the session has stored: an event stored
/// twice fails the commit, as the former table's key on `(session_id, seq)` made it.
fn insert_events(tx: &Transaction<'_>, events: &[&Published]) -> rusqlite::Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let batches = event_log::batches(events.iter().copied())
        .map_err(|uncut| rusqlite::Error::ToSqlConversionFailure(Box::new(uncut)))?;
    let mut insert = tx.prepare_cached(
        "INSERT INTO event_batches (session_id, first_seq, last_seq, events) \
         SELECT ?1, ?2, ?3, ?4 WHERE ?2 > \
           (SELECT COALESCE(MAX(last_seq), 0) FROM event_batches WHERE session_id = ?1)",
    )?;
    for b in batches {
        let session_id = b.session_id.to_string();
        if insert.execute(params![session_id, b.first_seq, b.last_seq, b.events])? != 1 {
            return Err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY),
                Some(format!(
                    "events {}..={} of session {session_id}: the session has stored events \
                     from {} on already",
                    b.first_seq, b.last_seq, b.first_seq
                )),
            ));
        }
    }
    Ok(())
}

fn fail_open_steps(
    tx: &Transaction<'_>,
    session_id: Uuid,
    run_id: Uuid,
    error: &str,
    at: DateTime<Utc>,
) -> rusqlite::Result<()> {
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
    Ok(())
}

/// A session's latest checkpoint is the one ever read, so it is kept in the session's row
/// (migration `0020`), which the commits of a turn update anyway: recording it dirties no page
/// of a table of its own. An older checkpoint (a smaller time-ordered id) never replaces a
/// newer one, as a table of them read by its largest id would have it.
fn insert_checkpoint(tx: &Transaction<'_>, c: &Checkpoint) -> rusqlite::Result<()> {
    tx.prepare_cached(
        "UPDATE sessions SET checkpoint_id = ?1, checkpoint_run_id = ?2, \
         checkpoint_step_id = ?3, checkpoint_message_count = ?4, checkpoint_seq = ?5, \
         checkpoint_created_at = ?6 \
         WHERE id = ?7 AND (checkpoint_id IS NULL OR checkpoint_id < ?1)",
    )?
    .execute(params![
        c.id.to_string(),
        c.run_id.to_string(),
        c.step_id.map(|id| id.to_string()),
        c.message_count,
        c.seq,
        c.created_at.to_rfc3339(),
        c.session_id.to_string(),
    ])?;
    Ok(())
}
