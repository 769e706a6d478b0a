//! The reads of the SQLite store, over the sqlx pool; `commit` hands its ops to the single
//! writer connection (`write.rs`). Rows decode through [`StoredRow`]: ids, times and JSON are
//! text here.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::sqlite::SqliteRow;
use sqlx::Row;
use uuid::Uuid;

use super::SqliteStore;
use crate::model::INTERRUPTED;
use crate::model::{ArtifactRecord, Checkpoint, SessionRecord, SessionState};
use crate::store::rows::{
    artifact_from, checkpoint_from, corrupt, first_id_at, listed_sessions, session_from,
    tenant_cost_since, versions_kept, ArtifactPage, BatchPage, KeyedTable, LogPage, LogTable,
    Plain, RowKey, RowPage, SessionRows, StoredRow, ARTIFACT_COLUMNS, INTERRUPTED_SESSIONS,
    SESSION_COLUMNS, TENANT_TOKENS_SINCE,
};
use crate::store::{SessionQuery, Store, StoreError, StoreResult, WriteOp};

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

#[async_trait]
impl SessionRows for SqliteStore {
    type Row = SqliteRow;

    async fn event_batch_rows(&self, page: BatchPage) -> StoreResult<Vec<(i64, String)>> {
        let rows = sqlx::query(
            "SELECT last_seq, events FROM event_batches \
             WHERE session_id = ? AND last_seq > ? AND first_seq <= ? ORDER BY last_seq LIMIT ?",
        )
        .bind(page.session_id.to_string())
        .bind(page.after)
        .bind(page.upto)
        .bind(page.limit)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.read_failed(e))?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect()
    }

    async fn log_rows(&self, log: &LogTable, page: LogPage) -> StoreResult<Vec<SqliteRow>> {
        sqlx::query(&log.select())
            .bind(page.session_id.to_string())
            .bind(page.after)
            .bind(page.limit)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.read_failed(e))
    }

    async fn artifact_rows(&self, page: ArtifactPage) -> StoreResult<Vec<SqliteRow>> {
        let ArtifactPage { session_id, query } = page;
        let newest = versions_kept(query.versions);
        sqlx::query(&format!(
            "SELECT {ARTIFACT_COLUMNS} FROM artifacts a \
             WHERE a.session_id = ?1 AND (?2 IS NULL OR a.id > ?2) AND {newest} \
             ORDER BY a.id LIMIT ?3"
        ))
        .bind(session_id.to_string())
        .bind(query.after.map(|id| id.to_string()))
        .bind(query.limit)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.read_failed(e))
    }

    async fn page_rows(&self, page: RowPage) -> StoreResult<Vec<SqliteRow>> {
        let KeyedTable { name, columns } = page.table;
        sqlx::query(&format!(
            "SELECT {columns} FROM {name} \
             WHERE session_id = ?1 AND (?2 IS NULL OR id > ?2) ORDER BY id LIMIT ?3"
        ))
        .bind(page.session_id.to_string())
        .bind(page.after.map(|id| id.to_string()))
        .bind(page.limit)
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.read_failed(e))
    }

    async fn one_row(&self, table: &KeyedTable, key: RowKey) -> StoreResult<Option<SqliteRow>> {
        let KeyedTable { name, columns } = table;
        sqlx::query(&format!(
            "SELECT {columns} FROM {name} WHERE session_id = ? AND id = ?"
        ))
        .bind(key.session_id.to_string())
        .bind(key.id.to_string())
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.read_failed(e))
    }
}

impl SqliteStore {
    /// A failed read, explained by the database file when it is gone or was replaced (its
    /// connections may then find an empty file, or none).
    fn read_failed(&self, error: sqlx::Error) -> StoreError {
        match self.writer.check_file() {
            Err(gone) => gone,
            Ok(()) => StoreError::Database(error),
        }
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn server_tables(&self) -> Option<&dyn crate::store::ServerTables> {
        Some(self)
    }

    async fn health(&self) -> StoreResult<()> {
        self.writer.check_file()?;
        self.last_seq(Uuid::nil()).await.map(|_| ())
    }

    async fn commit(&self, batch: &[&[WriteOp]]) -> StoreResult<()> {
        let ops: Vec<WriteOp> = batch.iter().flat_map(|ops| ops.iter().cloned()).collect();
        self.writer.commit(vec![ops]).await.1
    }

    fn commits_on_caller(&self) -> bool {
        self.writer.inline()
    }

    async fn commit_owned(&self, batch: Vec<Vec<WriteOp>>) -> (Vec<Vec<WriteOp>>, StoreResult<()>) {
        self.writer.commit(batch).await
    }

    async fn session(&self, id: Uuid) -> StoreResult<Option<SessionRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions s WHERE s.id = ?"
        ))
        .bind(id.to_string())
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.read_failed(e))?;
        row.as_ref().map(session_from).transpose()
    }

    async fn run_session(&self, run_id: Uuid) -> StoreResult<Option<Uuid>> {
        let found: Option<String> = sqlx::query_scalar("SELECT session_id FROM runs WHERE id = ?")
            .bind(run_id.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.read_failed(e))?;
        Ok(found.and_then(|id| Uuid::parse_str(&id).ok()))
    }

    async fn sessions(&self, query: &SessionQuery) -> StoreResult<Vec<SessionRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions s \
             WHERE (?1 IS NULL OR s.id < ?1) AND (?2 IS NULL OR s.state = ?2) \
             AND (?4 IS NULL OR s.parent_id = ?4) \
             AND (?5 IS NULL OR s.tenant = ?5) AND (?6 IS NULL OR s.owner = ?6) \
             ORDER BY s.id DESC LIMIT ?3"
        ))
        .bind(query.before.map(|id| id.to_string()))
        .bind(query.state.map(SessionState::as_str))
        .bind(query.limit)
        .bind(query.parent_id.map(|id| id.to_string()))
        .bind(query.tenant.as_deref())
        .bind(query.owner.as_deref())
        .fetch_all(&self.pool)
        .await
        .map_err(|e| self.read_failed(e))?;
        Ok(listed_sessions(&rows))
    }

    async fn active_sessions(&self) -> StoreResult<Vec<Uuid>> {
        let rows =
            sqlx::query("SELECT id FROM sessions WHERE state IN ('running', 'waiting_tool')")
                .fetch_all(&self.pool)
                .await
                .map_err(|e| self.read_failed(e))?;
        rows.iter().map(|r| r.uuid("id")).collect()
    }

    async fn interrupted_sessions(&self) -> StoreResult<Vec<Uuid>> {
        let rows = sqlx::query(INTERRUPTED_SESSIONS)
            .bind(INTERRUPTED)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.read_failed(e))?;
        rows.iter().map(|r| r.uuid("id")).collect()
    }

    async fn nth_user_message(&self, session_id: Uuid, n: u64) -> StoreResult<Option<i64>> {
        let row = sqlx::query(
            "SELECT idx FROM messages WHERE session_id = ? AND role = 'user' \
             ORDER BY idx LIMIT 1 OFFSET ?",
        )
        .bind(session_id.to_string())
        .bind(i64::try_from(n).unwrap_or(i64::MAX))
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.read_failed(e))?;
        Ok(row.map(|r| r.try_get(0)).transpose()?)
    }

    async fn message_count(&self, session_id: Uuid) -> StoreResult<i64> {
        let row =
            sqlx::query("SELECT COALESCE(MAX(idx) + 1, 0) FROM messages WHERE session_id = ?")
                .bind(session_id.to_string())
                .fetch_one(&self.pool)
                .await
                .map_err(|e| self.read_failed(e))?;
        Ok(row.try_get(0)?)
    }

    async fn last_seq(&self, session_id: Uuid) -> StoreResult<i64> {
        let row = sqlx::query(
            "SELECT COALESCE(MAX(last_seq), 0) FROM event_batches WHERE session_id = ?",
        )
        .bind(session_id.to_string())
        .fetch_one(&self.pool)
        .await
        .map_err(|e| self.read_failed(e))?;
        Ok(row.try_get(0)?)
    }

    async fn latest_checkpoint(&self, session_id: Uuid) -> StoreResult<Option<Checkpoint>> {
        // Kept in the session's row (`write.rs`, `insert_checkpoint`).
        let row = sqlx::query(
            "SELECT checkpoint_id AS id, id AS session_id, checkpoint_run_id AS run_id, \
             checkpoint_step_id AS step_id, checkpoint_message_count AS message_count, \
             checkpoint_seq AS seq, checkpoint_created_at AS created_at \
             FROM sessions WHERE id = ? AND checkpoint_id IS NOT NULL",
        )
        .bind(session_id.to_string())
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.read_failed(e))?;
        row.as_ref().map(checkpoint_from).transpose()
    }

    async fn artifact(&self, session_id: Uuid, id: Uuid) -> StoreResult<Option<ArtifactRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {ARTIFACT_COLUMNS} FROM artifacts a WHERE a.session_id = ? AND a.id = ?"
        ))
        .bind(session_id.to_string())
        .bind(id.to_string())
        .fetch_optional(&self.pool)
        .await
        .map_err(|e| self.read_failed(e))?;
        row.as_ref().map(artifact_from).transpose()
    }

    async fn artifact_version(&self, session_id: Uuid, path: &str) -> StoreResult<i64> {
        let row = sqlx::query(
            "SELECT COALESCE(MAX(version), 0) FROM artifacts WHERE session_id = ? AND path = ?",
        )
        .bind(session_id.to_string())
        .bind(path)
        .fetch_one(&self.pool)
        .await
        .map_err(|e| self.read_failed(e))?;
        Ok(row.try_get(0)?)
    }

    async fn blob(&self, sha256: &str) -> StoreResult<Option<Vec<u8>>> {
        let row = sqlx::query("SELECT content FROM blobs WHERE sha256 = ?")
            .bind(sha256)
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| self.read_failed(e))?;
        Ok(row.map(|r| r.try_get(0)).transpose()?)
    }

    async fn tenant_tokens_since(&self, tenant: &str, since: DateTime<Utc>) -> StoreResult<u64> {
        let row = sqlx::query(TENANT_TOKENS_SINCE)
            .bind(tenant)
            .bind(first_id_at(since).to_string())
            .bind(since.to_rfc3339())
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.read_failed(e))?;
        let used: i64 = row.try_get("used")?;
        Ok(u64::try_from(used).unwrap_or(0))
    }

    async fn tenant_cost_since(&self, tenant: &str, since: DateTime<Utc>) -> StoreResult<f64> {
        let sql = tenant_cost_since("CAST(json_extract(st.response, '$.cost_usd') AS REAL)");
        let row = sqlx::query(&sql)
            .bind(tenant)
            .bind(first_id_at(since).to_string())
            .bind(since.to_rfc3339())
            .fetch_one(&self.pool)
            .await
            .map_err(|e| self.read_failed(e))?;
        let spent: f64 = row.try_get("spent")?;
        Ok(crate::llm::providers::round_usd(spent))
    }
}
