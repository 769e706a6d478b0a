//! The reads of the PostgreSQL store, over the pool; `commit` is in `write.rs`. Rows decode
//! through [`StoredRow`]: ids, times and JSON have native types here.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::Postgres;
use sqlx::Row;
use uuid::Uuid;

use super::{write, PostgresStore};
use crate::model::INTERRUPTED;
use crate::model::{ArtifactRecord, Checkpoint, SessionRecord, SessionState};
use crate::store::rows::{
    artifact_from, checkpoint_from, first_id_at, listed_sessions, session_from, tenant_cost_since,
    versions_kept, ArtifactPage, BatchPage, KeyedTable, LogPage, LogTable, Plain, RowKey, RowPage,
    SessionRows, StoredRow, ARTIFACT_COLUMNS, CHECKPOINT_COLUMNS, INTERRUPTED_SESSIONS,
    SESSION_COLUMNS, TENANT_TOKENS_SINCE,
};
use crate::store::{SessionQuery, Store, StoreResult, WriteOp};

/// SQLite treats a negative `LIMIT` as "no limit"; PostgreSQL rejects it but reads a NULL
/// limit as `LIMIT ALL`.
fn sql_limit(n: i64) -> Option<i64> {
    (n >= 0).then_some(n)
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

impl PostgresStore {
    /// The rows of a page query: `$1` the session, `$2` the cursor, `$3` the limit.
    async fn fetch_page<'q, A>(
        &self,
        sql: &'q str,
        session_id: Uuid,
        after: A,
        limit: i64,
    ) -> StoreResult<Vec<PgRow>>
    where
        A: 'q + Send + sqlx::Encode<'q, Postgres> + sqlx::Type<Postgres>,
    {
        let rows = sqlx::query(sql)
            .bind(session_id)
            .bind(after)
            .bind(sql_limit(limit))
            .fetch_all(&self.pool)
            .await?;
        Ok(rows)
    }
}

#[async_trait]
impl SessionRows for PostgresStore {
    type Row = PgRow;

    async fn event_batch_rows(&self, page: BatchPage) -> StoreResult<Vec<(i64, String)>> {
        let rows = sqlx::query(
            "SELECT last_seq, events FROM event_batches \
             WHERE session_id = $1 AND last_seq > $2 AND first_seq <= $3 \
             ORDER BY last_seq LIMIT $4",
        )
        .bind(page.session_id)
        .bind(page.after)
        .bind(page.upto)
        .bind(page.limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect()
    }

    async fn log_rows(&self, log: &LogTable, page: LogPage) -> StoreResult<Vec<PgRow>> {
        self.fetch_page(&log.select(), page.session_id, page.after, page.limit)
            .await
    }

    async fn artifact_rows(&self, page: ArtifactPage) -> StoreResult<Vec<PgRow>> {
        let ArtifactPage { session_id, query } = page;
        let newest = versions_kept(query.versions);
        let sql = format!(
            "SELECT {ARTIFACT_COLUMNS} FROM artifacts a \
             WHERE a.session_id = $1 AND ($2::uuid IS NULL OR a.id > $2) AND {newest} \
             ORDER BY a.id LIMIT $3"
        );
        self.fetch_page(&sql, session_id, query.after, query.limit)
            .await
    }

    async fn page_rows(&self, page: RowPage) -> StoreResult<Vec<PgRow>> {
        let KeyedTable { name, columns } = page.table;
        let sql = format!(
            "SELECT {columns} FROM {name} \
             WHERE session_id = $1 AND ($2::uuid IS NULL OR id > $2) ORDER BY id LIMIT $3"
        );
        self.fetch_page(&sql, page.session_id, page.after, page.limit)
            .await
    }

    async fn one_row(&self, table: &KeyedTable, key: RowKey) -> StoreResult<Option<PgRow>> {
        let KeyedTable { name, columns } = table;
        let row = sqlx::query(&format!(
            "SELECT {columns} FROM {name} WHERE session_id = $1 AND id = $2"
        ))
        .bind(key.session_id)
        .bind(key.id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row)
    }
}

#[async_trait]
impl Store for PostgresStore {
    fn server_tables(&self) -> Option<&dyn crate::store::ServerTables> {
        Some(self)
    }

    async fn commit(&self, batch: &[&[WriteOp]]) -> StoreResult<()> {
        write::commit(self, batch).await
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

    async fn run_session(&self, run_id: Uuid) -> StoreResult<Option<Uuid>> {
        Ok(
            sqlx::query_scalar("SELECT session_id FROM runs WHERE id = $1")
                .bind(run_id)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    async fn sessions(&self, query: &SessionQuery) -> StoreResult<Vec<SessionRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions s \
             WHERE ($1::uuid IS NULL OR s.id < $1) AND ($2::text IS NULL OR s.state = $2) \
             AND ($4::uuid IS NULL OR s.parent_id = $4) \
             AND ($5::text IS NULL OR s.tenant = $5) AND ($6::text IS NULL OR s.owner = $6) \
             ORDER BY s.id DESC LIMIT $3"
        ))
        .bind(query.before)
        .bind(query.state.map(SessionState::as_str))
        .bind(sql_limit(query.limit))
        .bind(query.parent_id)
        .bind(query.tenant.as_deref())
        .bind(query.owner.as_deref())
        .fetch_all(&self.pool)
        .await?;
        Ok(listed_sessions(&rows))
    }

    async fn active_sessions(&self) -> StoreResult<Vec<Uuid>> {
        let rows =
            sqlx::query("SELECT id FROM sessions WHERE state IN ('running', 'waiting_tool')")
                .fetch_all(&self.pool)
                .await?;
        rows.iter().map(|r| r.uuid("id")).collect()
    }

    async fn interrupted_sessions(&self) -> StoreResult<Vec<Uuid>> {
        let rows = sqlx::query(INTERRUPTED_SESSIONS)
            .bind(INTERRUPTED)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| r.uuid("id")).collect()
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

    async fn last_seq(&self, session_id: Uuid) -> StoreResult<i64> {
        let row = sqlx::query(
            "SELECT COALESCE(MAX(last_seq), 0) FROM event_batches WHERE session_id = $1",
        )
        .bind(session_id)
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get(0)?)
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

    async fn artifact(&self, session_id: Uuid, id: Uuid) -> StoreResult<Option<ArtifactRecord>> {
        let row = sqlx::query(&format!(
            "SELECT {ARTIFACT_COLUMNS} FROM artifacts a WHERE a.session_id = $1 AND a.id = $2"
        ))
        .bind(session_id)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(artifact_from).transpose()
    }

    async fn artifact_version(&self, session_id: Uuid, path: &str) -> StoreResult<i64> {
        let row = sqlx::query(
            "SELECT COALESCE(MAX(version), 0)::bigint FROM artifacts \
             WHERE session_id = $1 AND path = $2",
        )
        .bind(session_id)
        .bind(write::text(path).as_ref())
        .fetch_one(&self.pool)
        .await?;
        Ok(row.try_get(0)?)
    }

    async fn blob(&self, sha256: &str) -> StoreResult<Option<Vec<u8>>> {
        let row = sqlx::query("SELECT content FROM blobs WHERE sha256 = $1")
            .bind(sha256)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.try_get(0)).transpose()?)
    }

    async fn tenant_tokens_since(&self, tenant: &str, since: DateTime<Utc>) -> StoreResult<u64> {
        let row = sqlx::query(&format!(
            "SELECT used::bigint AS used FROM ({TENANT_TOKENS_SINCE}) t"
        ))
        .bind(tenant)
        .bind(first_id_at(since))
        .bind(since)
        .fetch_one(&self.pool)
        .await?;
        let used: i64 = row.try_get("used")?;
        Ok(u64::try_from(used).unwrap_or(0))
    }

    async fn tenant_cost_since(&self, tenant: &str, since: DateTime<Utc>) -> StoreResult<f64> {
        let sql = tenant_cost_since("(st.response->>'cost_usd')::float8");
        let row = sqlx::query(&format!("SELECT spent::float8 AS spent FROM ({sql}) t"))
            .bind(tenant)
            .bind(first_id_at(since))
            .bind(since)
            .fetch_one(&self.pool)
            .await?;
        let spent: f64 = row.try_get("spent")?;
        Ok(crate::llm::providers::round_usd(spent))
    }
}
