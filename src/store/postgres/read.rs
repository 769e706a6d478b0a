//! The reads of the PostgreSQL store, over the pool; `commit` is in `write.rs`. Rows decode
//! through [`StoredRow`]: ids, times and JSON have native types here.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::Row;
use uuid::Uuid;

use super::{write, PostgresStore};
use crate::model::INTERRUPTED;
use crate::model::{
    ArtifactRecord, Checkpoint, Event, EventKind, Message, RunRecord, SessionRecord, SessionState,
    StepRecord,
};
use crate::store::rows::{
    artifact_from, checkpoint_from, corrupt_event, listed_sessions, message_from, run_from,
    session_from, step_from, Plain, StoredRow, ARTIFACT_COLUMNS, CHECKPOINT_COLUMNS, EVENT_COLUMNS,
    INTERRUPTED_SESSIONS, MESSAGE_COLUMNS, NEWEST_ARTIFACT, RUN_COLUMNS, SESSION_COLUMNS,
    STEP_COLUMNS,
};
use crate::store::{ArtifactQuery, ArtifactVersions, SessionQuery, Store, StoreResult, WriteOp};

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

/// Runs and steps: rows of a session with time-ordered ids, read a page or one at a time.
impl PostgresStore {
    async fn page<T>(
        &self,
        table: &str,
        columns: &str,
        session_id: Uuid,
        after: Option<Uuid>,
        limit: i64,
        decode: fn(&PgRow) -> StoreResult<T>,
    ) -> StoreResult<Vec<T>> {
        let rows = sqlx::query(&format!(
            "SELECT {columns} FROM {table} \
             WHERE session_id = $1 AND ($2::uuid IS NULL OR id > $2) ORDER BY id LIMIT $3"
        ))
        .bind(session_id)
        .bind(after)
        .bind(sql_limit(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(decode).collect()
    }

    async fn one<T>(
        &self,
        table: &str,
        columns: &str,
        session_id: Uuid,
        id: Uuid,
        decode: fn(&PgRow) -> StoreResult<T>,
    ) -> StoreResult<Option<T>> {
        let row = sqlx::query(&format!(
            "SELECT {columns} FROM {table} WHERE session_id = $1 AND id = $2"
        ))
        .bind(session_id)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(decode).transpose()
    }
}

#[async_trait]
impl Store for PostgresStore {
    fn idempotency(&self) -> Option<&dyn crate::store::keys::IdempotencyKeys> {
        Some(self)
    }

    fn webhooks(&self) -> Option<&dyn crate::store::webhooks::WebhookQueue> {
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

    async fn sessions(&self, query: &SessionQuery) -> StoreResult<Vec<SessionRecord>> {
        let rows = sqlx::query(&format!(
            "SELECT {SESSION_COLUMNS} FROM sessions s \
             WHERE ($1::uuid IS NULL OR s.id < $1) AND ($2::text IS NULL OR s.state = $2) \
             AND ($4::uuid IS NULL OR s.parent_id = $4) \
             ORDER BY s.id DESC LIMIT $3"
        ))
        .bind(query.before)
        .bind(query.state.map(SessionState::as_str))
        .bind(sql_limit(query.limit))
        .bind(query.parent_id)
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
        self.page("steps", STEP_COLUMNS, session_id, after, limit, step_from)
            .await
    }

    async fn step(&self, session_id: Uuid, step_id: Uuid) -> StoreResult<Option<StepRecord>> {
        self.one("steps", STEP_COLUMNS, session_id, step_id, step_from)
            .await
    }

    async fn runs(
        &self,
        session_id: Uuid,
        after: Option<Uuid>,
        limit: i64,
    ) -> StoreResult<Vec<RunRecord>> {
        self.page("runs", RUN_COLUMNS, session_id, after, limit, run_from)
            .await
    }

    async fn run(&self, session_id: Uuid, run_id: Uuid) -> StoreResult<Option<RunRecord>> {
        self.one("runs", RUN_COLUMNS, session_id, run_id, run_from)
            .await
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

    async fn artifacts(
        &self,
        session_id: Uuid,
        query: ArtifactQuery,
    ) -> StoreResult<Vec<ArtifactRecord>> {
        let newest = match query.versions {
            ArtifactVersions::Newest => NEWEST_ARTIFACT,
            ArtifactVersions::All => "TRUE",
        };
        let rows = sqlx::query(&format!(
            "SELECT {ARTIFACT_COLUMNS} FROM artifacts a \
             WHERE a.session_id = $1 AND ($2::uuid IS NULL OR a.id > $2) AND {newest} \
             ORDER BY a.id LIMIT $3"
        ))
        .bind(session_id)
        .bind(query.after)
        .bind(sql_limit(query.limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(artifact_from).collect()
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
}
