//! Environments and the tool calls queued for their workers, as stored
//! (`migrations/*/*_environments.sql`). A queued call is claimed by a conditional update that
//! compares its `attempts` (every claim bumps it), so two workers, or two replicas serving
//! them, can never both take the same offer. Times are Unix microseconds on both backends, so
//! one set of statements serves both.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{StoreError, StoreResult};

/// An environment's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvironmentRow {
    pub id: String,
    pub tenant: String,
    pub name: String,
    pub kind: String,
    pub created_at: DateTime<Utc>,
}

/// A tool call queued for an environment's workers.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerCallRow {
    pub session_id: String,
    pub call_id: String,
    pub tenant: String,
    pub environment: String,
    pub tool: String,
    /// The call's arguments, as JSON text.
    pub input: String,
    /// `queued`, `claimed`, `answered` (its result is here, the session has not recorded it
    /// yet) or `done`.
    pub state: String,
    /// The claim that holds it (a fresh id per claim).
    pub worker: Option<String>,
    pub attempts: i64,
    pub lease_until: Option<DateTime<Utc>>,
    pub expires_at: Option<DateTime<Utc>>,
    pub queued_at: DateTime<Utc>,
}

#[async_trait]
pub trait EnvironmentStore: Send + Sync {
    /// Adds an environment; false when its tenant has one of that name already.
    async fn insert_environment(&self, row: &EnvironmentRow) -> StoreResult<bool>;
    /// The environment of `tenant` with this id or name.
    async fn environment(
        &self,
        tenant: &str,
        id_or_name: &str,
    ) -> StoreResult<Option<EnvironmentRow>>;
    /// A tenant's environments, newest first, older than the id `before` when given.
    async fn environments(
        &self,
        tenant: &str,
        before: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<EnvironmentRow>>;
    /// Deletes an environment; whether there was one.
    async fn delete_environment(&self, tenant: &str, id: &str) -> StoreResult<bool>;

    /// Queues a call for its environment's workers (again is a no-op).
    async fn queue_worker_call(&self, row: &WorkerCallRow) -> StoreResult<()>;
    /// The calls of an environment a worker may claim at `now`, oldest first: queued ones,
    /// and claimed ones whose lease ran out, neither past its expiry.
    async fn claimable_calls(
        &self,
        tenant: &str,
        environment: &str,
        now: DateTime<Utc>,
        limit: i64,
    ) -> StoreResult<Vec<WorkerCallRow>>;
    /// Claims a call offered with `attempts` for `worker` until `lease_until`; false when
    /// another claim came first.
    async fn claim_worker_call(
        &self,
        call: &WorkerCallRow,
        worker: &str,
        lease_until: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> StoreResult<bool>;
    /// Answers a claimed call whose lease ran out with `output` (an error); false when
    /// someone else did something with it first.
    async fn interrupt_worker_call(&self, call: &WorkerCallRow, output: &str) -> StoreResult<bool>;
    /// Keeps `worker`'s claim until `lease_until`; false when it no longer holds it.
    async fn renew_worker_call(
        &self,
        session_id: &str,
        call_id: &str,
        worker: &str,
        lease_until: DateTime<Utc>,
    ) -> StoreResult<bool>;
    /// Keeps the result of `worker`'s claim (the call is `answered`); false when it no longer
    /// holds it.
    async fn finish_worker_call(
        &self,
        session_id: &str,
        call_id: &str,
        worker: &str,
        result: (&str, bool),
    ) -> StoreResult<bool>;
    /// The calls whose result the session has not recorded yet (any tenant), oldest first:
    /// `(session_id, call_id, output, is_error)`.
    async fn answered_worker_calls(
        &self,
        limit: i64,
    ) -> StoreResult<Vec<(String, String, String, bool)>>;
    /// Marks a call done: its result is recorded by its session, or the session no longer
    /// waits for it (it is never offered again).
    async fn delivered_worker_call(&self, session_id: &str, call_id: &str) -> StoreResult<()>;
    /// A claimed call of any tenant, by `worker`'s claim id.
    async fn worker_call(&self, worker: &str) -> StoreResult<Option<WorkerCallRow>>;
    /// Claimed calls of tools in `tools` whose lease ran out at `now` (any tenant).
    async fn lapsed_worker_calls(
        &self,
        tools: &[&str],
        now: DateTime<Utc>,
        limit: i64,
    ) -> StoreResult<Vec<WorkerCallRow>>;
}

/// The statements, written for PostgreSQL (`$n`); SQLite takes the same as `?n`.
pub(super) mod sql {
    pub const INSERT: &str = "INSERT INTO environments (id, tenant, name, kind, created_at) \
                              VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant, name) DO NOTHING";
    pub const ONE: &str = "SELECT id, tenant, name, kind, created_at FROM environments \
                           WHERE tenant = $1 AND (id = $2 OR name = $2)";
    pub const LIST: &str = "SELECT id, tenant, name, kind, created_at FROM environments \
                            WHERE tenant = $1 AND ($2 = '' OR id < $2) ORDER BY id DESC LIMIT $3";
    pub const DELETE: &str = "DELETE FROM environments WHERE tenant = $1 AND id = $2";

    pub const CALL_COLUMNS: &str = "session_id, call_id, tenant, environment, tool, input, \
                                    state, worker, attempts, lease_until, expires_at, queued_at";
    pub const QUEUE: &str = "INSERT INTO worker_calls (session_id, call_id, tenant, \
                             environment, tool, input, state, attempts, expires_at, queued_at) \
                             VALUES ($1, $2, $3, $4, $5, $6, 'queued', 0, $7, $8) \
                             ON CONFLICT (session_id, call_id) DO NOTHING";
    pub const CLAIMABLE: &str = "WHERE tenant = $1 AND environment = $2 \
                                 AND (state = 'queued' OR (state = 'claimed' AND lease_until < $3)) \
                                 AND (expires_at IS NULL OR expires_at > $3) \
                                 ORDER BY queued_at LIMIT $4";
    pub const CLAIM: &str = "UPDATE worker_calls SET state = 'claimed', worker = $1, \
                             lease_until = $2, attempts = attempts + 1 \
                             WHERE session_id = $3 AND call_id = $4 AND attempts = $5 \
                             AND (state = 'queued' OR (state = 'claimed' AND lease_until < $6))";
    pub const INTERRUPT: &str = "UPDATE worker_calls SET state = 'answered', output = $4, \
                                 is_error = 1 \
                                 WHERE session_id = $1 AND call_id = $2 AND attempts = $3 \
                                 AND state = 'claimed'";
    pub const RENEW: &str = "UPDATE worker_calls SET lease_until = $1 \
                             WHERE session_id = $2 AND call_id = $3 AND worker = $4 \
                             AND state = 'claimed'";
    pub const FINISH: &str = "UPDATE worker_calls SET state = 'answered', output = $4, \
                              is_error = $5 \
                              WHERE session_id = $1 AND call_id = $2 AND worker = $3 \
                              AND state = 'claimed'";
    pub const ANSWERED: &str = "SELECT session_id, call_id, output, is_error FROM worker_calls \
                                WHERE state = 'answered' ORDER BY queued_at LIMIT $1";
    pub const DELIVERED: &str = "UPDATE worker_calls SET state = 'done' \
                                 WHERE session_id = $1 AND call_id = $2 AND state <> 'done'";
    pub const BY_WORKER: &str = "WHERE worker = $1 AND state = 'claimed'";
    pub const LAPSED: &str = "WHERE state = 'claimed' AND lease_until < $1 ORDER BY queued_at \
                              LIMIT $2";
}

/// A time as the tables keep it, back.
pub(super) fn time_of(micros: i64, what: &str) -> StoreResult<DateTime<Utc>> {
    DateTime::from_timestamp_micros(micros)
        .ok_or_else(|| StoreError::Corrupt(format!("{what}: its time")))
}

/// An environment's columns, decoded.
pub(super) type EnvironmentColumns = (String, String, String, String, i64);

pub(super) fn environment_of(row: EnvironmentColumns) -> StoreResult<EnvironmentRow> {
    let (id, tenant, name, kind, created_at) = row;
    Ok(EnvironmentRow {
        created_at: time_of(created_at, "environment")?,
        id,
        tenant,
        name,
        kind,
    })
}

/// A queued call's columns, decoded.
pub(super) type CallColumns = (
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    Option<String>,
    i64,
    Option<i64>,
    Option<i64>,
    i64,
);

pub(super) fn call_of(row: CallColumns) -> StoreResult<WorkerCallRow> {
    let (session_id, call_id, tenant, environment, tool, input, state, worker, attempts) = (
        row.0, row.1, row.2, row.3, row.4, row.5, row.6, row.7, row.8,
    );
    let time = |t: Option<i64>| t.map(|t| time_of(t, "worker call")).transpose();
    Ok(WorkerCallRow {
        lease_until: time(row.9)?,
        expires_at: time(row.10)?,
        queued_at: time_of(row.11, "worker call")?,
        session_id,
        call_id,
        tenant,
        environment,
        tool,
        input,
        state,
        worker,
        attempts,
    })
}

/// Implements [`EnvironmentStore`] over a sqlx pool; `$sql` maps a statement to the backend's
/// spelling.
macro_rules! environments_over_pool {
    ($store:ty, $sql:expr) => {
        #[async_trait::async_trait]
        impl $crate::store::environments::EnvironmentStore for $store {
            async fn insert_environment(
                &self,
                row: &$crate::store::environments::EnvironmentRow,
            ) -> $crate::store::StoreResult<bool> {
                let q = $sql;
                let done = sqlx::query(&q($crate::store::environments::sql::INSERT))
                    .bind(&row.id)
                    .bind(&row.tenant)
                    .bind(&row.name)
                    .bind(&row.kind)
                    .bind(row.created_at.timestamp_micros())
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn environment(
                &self,
                tenant: &str,
                id_or_name: &str,
            ) -> $crate::store::StoreResult<Option<$crate::store::environments::EnvironmentRow>>
            {
                let q = $sql;
                let row: Option<$crate::store::environments::EnvironmentColumns> =
                    sqlx::query_as(&q($crate::store::environments::sql::ONE))
                        .bind(tenant)
                        .bind(id_or_name)
                        .fetch_optional(&self.pool)
                        .await?;
                row.map($crate::store::environments::environment_of)
                    .transpose()
            }

            async fn environments(
                &self,
                tenant: &str,
                before: Option<&str>,
                limit: i64,
            ) -> $crate::store::StoreResult<Vec<$crate::store::environments::EnvironmentRow>> {
                let q = $sql;
                let rows: Vec<$crate::store::environments::EnvironmentColumns> =
                    sqlx::query_as(&q($crate::store::environments::sql::LIST))
                        .bind(tenant)
                        .bind(before.unwrap_or(""))
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?;
                rows.into_iter()
                    .map($crate::store::environments::environment_of)
                    .collect()
            }

            async fn delete_environment(
                &self,
                tenant: &str,
                id: &str,
            ) -> $crate::store::StoreResult<bool> {
                let q = $sql;
                let done = sqlx::query(&q($crate::store::environments::sql::DELETE))
                    .bind(tenant)
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn queue_worker_call(
                &self,
                row: &$crate::store::environments::WorkerCallRow,
            ) -> $crate::store::StoreResult<()> {
                let q = $sql;
                sqlx::query(&q($crate::store::environments::sql::QUEUE))
                    .bind(&row.session_id)
                    .bind(&row.call_id)
                    .bind(&row.tenant)
                    .bind(&row.environment)
                    .bind(&row.tool)
                    .bind(&row.input)
                    .bind(row.expires_at.map(|t| t.timestamp_micros()))
                    .bind(row.queued_at.timestamp_micros())
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn claimable_calls(
                &self,
                tenant: &str,
                environment: &str,
                now: chrono::DateTime<chrono::Utc>,
                limit: i64,
            ) -> $crate::store::StoreResult<Vec<$crate::store::environments::WorkerCallRow>> {
                use $crate::store::environments::sql;
                let q = $sql;
                let statement = format!(
                    "SELECT {} FROM worker_calls {}",
                    sql::CALL_COLUMNS,
                    sql::CLAIMABLE
                );
                let rows: Vec<$crate::store::environments::CallColumns> =
                    sqlx::query_as(&q(&statement))
                        .bind(tenant)
                        .bind(environment)
                        .bind(now.timestamp_micros())
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?;
                rows.into_iter()
                    .map($crate::store::environments::call_of)
                    .collect()
            }

            async fn claim_worker_call(
                &self,
                call: &$crate::store::environments::WorkerCallRow,
                worker: &str,
                lease_until: chrono::DateTime<chrono::Utc>,
                now: chrono::DateTime<chrono::Utc>,
            ) -> $crate::store::StoreResult<bool> {
                let q = $sql;
                let done = sqlx::query(&q($crate::store::environments::sql::CLAIM))
                    .bind(worker)
                    .bind(lease_until.timestamp_micros())
                    .bind(&call.session_id)
                    .bind(&call.call_id)
                    .bind(call.attempts)
                    .bind(now.timestamp_micros())
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn interrupt_worker_call(
                &self,
                call: &$crate::store::environments::WorkerCallRow,
                output: &str,
            ) -> $crate::store::StoreResult<bool> {
                let q = $sql;
                let done = sqlx::query(&q($crate::store::environments::sql::INTERRUPT))
                    .bind(&call.session_id)
                    .bind(&call.call_id)
                    .bind(call.attempts)
                    .bind(output)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn renew_worker_call(
                &self,
                session_id: &str,
                call_id: &str,
                worker: &str,
                lease_until: chrono::DateTime<chrono::Utc>,
            ) -> $crate::store::StoreResult<bool> {
                let q = $sql;
                let done = sqlx::query(&q($crate::store::environments::sql::RENEW))
                    .bind(lease_until.timestamp_micros())
                    .bind(session_id)
                    .bind(call_id)
                    .bind(worker)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn finish_worker_call(
                &self,
                session_id: &str,
                call_id: &str,
                worker: &str,
                (output, is_error): (&str, bool),
            ) -> $crate::store::StoreResult<bool> {
                let q = $sql;
                let done = sqlx::query(&q($crate::store::environments::sql::FINISH))
                    .bind(session_id)
                    .bind(call_id)
                    .bind(worker)
                    .bind(output)
                    .bind(i64::from(is_error))
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn answered_worker_calls(
                &self,
                limit: i64,
            ) -> $crate::store::StoreResult<Vec<(String, String, String, bool)>> {
                let q = $sql;
                let rows: Vec<(String, String, Option<String>, Option<i64>)> =
                    sqlx::query_as(&q($crate::store::environments::sql::ANSWERED))
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?;
                Ok(rows
                    .into_iter()
                    .map(|(session, call, output, is_error)| {
                        (
                            session,
                            call,
                            output.unwrap_or_default(),
                            is_error == Some(1),
                        )
                    })
                    .collect())
            }

            async fn delivered_worker_call(
                &self,
                session_id: &str,
                call_id: &str,
            ) -> $crate::store::StoreResult<()> {
                let q = $sql;
                sqlx::query(&q($crate::store::environments::sql::DELIVERED))
                    .bind(session_id)
                    .bind(call_id)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn worker_call(
                &self,
                worker: &str,
            ) -> $crate::store::StoreResult<Option<$crate::store::environments::WorkerCallRow>>
            {
                use $crate::store::environments::sql;
                let q = $sql;
                let statement = format!(
                    "SELECT {} FROM worker_calls {}",
                    sql::CALL_COLUMNS,
                    sql::BY_WORKER
                );
                let row: Option<$crate::store::environments::CallColumns> =
                    sqlx::query_as(&q(&statement))
                        .bind(worker)
                        .fetch_optional(&self.pool)
                        .await?;
                row.map($crate::store::environments::call_of).transpose()
            }

            async fn lapsed_worker_calls(
                &self,
                tools: &[&str],
                now: chrono::DateTime<chrono::Utc>,
                limit: i64,
            ) -> $crate::store::StoreResult<Vec<$crate::store::environments::WorkerCallRow>> {
                use $crate::store::environments::sql;
                let q = $sql;
                let statement = format!(
                    "SELECT {} FROM worker_calls {}",
                    sql::CALL_COLUMNS,
                    sql::LAPSED
                );
                let rows: Vec<$crate::store::environments::CallColumns> =
                    sqlx::query_as(&q(&statement))
                        .bind(now.timestamp_micros())
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?;
                rows.into_iter()
                    .map($crate::store::environments::call_of)
                    .filter(|row| {
                        row.as_ref()
                            .map_or(true, |row| tools.contains(&row.tool.as_str()))
                    })
                    .collect()
            }
        }
    };
}
pub(super) use environments_over_pool;
