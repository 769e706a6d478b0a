//! Agents as stored (`migrations/*/*_agents.sql`): a row per agent (its latest version and
//! whether it is archived) and a row per version (what the version captures, as JSON). Ids
//! are UUID text and times Unix microseconds on both backends, so one set of statements serves
//! both. The session layer decides what a version may hold; this is only the tables.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{StoreError, StoreResult};
use crate::model::{AgentId, AgentRecord, AgentSpec};

/// Which agents a page lists: newest first, before `before`.
#[derive(Debug, Clone)]
pub struct AgentQuery {
    pub limit: i64,
    pub before: Option<Uuid>,
    pub include_archived: bool,
    /// Only this tenant's agents (`None`: every tenant's).
    pub tenant: Option<String>,
}

/// What an update found.
#[derive(Debug, Clone, PartialEq)]
pub enum Bumped {
    /// The new version is the latest.
    Done,
    /// The latest version is no longer the one the update was made from.
    Stale,
    /// The agent is archived (or gone).
    Archived,
}

#[async_trait]
pub trait AgentStore: Send + Sync {
    /// Records a new agent at its first version.
    async fn insert_agent(&self, agent: &AgentRecord) -> StoreResult<()>;
    /// Records `agent` as the next version of an agent whose latest version is `from`.
    async fn add_agent_version(&self, agent: &AgentRecord, from: u32) -> StoreResult<Bumped>;
    /// The agent at `version`, or at its latest version.
    async fn agent(&self, id: Uuid, version: Option<u32>) -> StoreResult<Option<AgentRecord>>;
    /// Agents at their latest versions, newest first.
    async fn agents(&self, query: &AgentQuery) -> StoreResult<Vec<AgentRecord>>;
    /// An agent's versions below `before`, newest first.
    async fn agent_versions(
        &self,
        id: Uuid,
        before: Option<u32>,
        limit: i64,
    ) -> StoreResult<Vec<AgentRecord>>;
    /// Archives an agent; whether it was not archived before.
    async fn archive_agent(&self, id: Uuid, at: DateTime<Utc>) -> StoreResult<bool>;
    /// The agents (not archived) of `tenant` whose latest version has this name.
    async fn agents_named(&self, tenant: &str, name: &str) -> StoreResult<Vec<Uuid>>;
}

/// The statements, written for PostgreSQL (`$n`); SQLite takes the same as `?n`.
pub(super) mod sql {
    const COLUMNS: &str =
        "a.id, v.version, v.spec, a.created_at, v.created_at, a.archived_at, a.tenant";

    pub const INSERT_AGENT: &str = "INSERT INTO agents (id, version, name, created_at, tenant) \
                                    VALUES ($1, $2, $3, $4, $5)";
    pub const INSERT_VERSION: &str = "INSERT INTO agent_versions (agent_id, version, spec, \
                                      created_at) VALUES ($1, $2, $3, $4)";
    pub const BUMP: &str = "UPDATE agents SET version = $2, name = $3 \
                            WHERE id = $1 AND version = $4 AND archived_at IS NULL";
    pub const ARCHIVED: &str = "SELECT archived_at FROM agents WHERE id = $1";
    pub const ARCHIVE: &str =
        "UPDATE agents SET archived_at = $2 WHERE id = $1 AND archived_at IS NULL";
    pub const NAMED: &str = "SELECT id FROM agents WHERE name = $1 AND tenant = $2 \
                             AND archived_at IS NULL ORDER BY id";

    pub fn latest() -> String {
        format!(
            "SELECT {COLUMNS} FROM agents a JOIN agent_versions v \
             ON v.agent_id = a.id AND v.version = a.version WHERE a.id = $1"
        )
    }

    pub fn at_version() -> String {
        format!(
            "SELECT {COLUMNS} FROM agents a JOIN agent_versions v ON v.agent_id = a.id \
             WHERE a.id = $1 AND v.version = $2"
        )
    }

    /// `$1`: the cursor (every id sorts below `~`), `$2`: 1 to include archived agents, `$4`:
    /// the tenant, or NULL for all.
    pub fn page() -> String {
        format!(
            "SELECT {COLUMNS} FROM agents a JOIN agent_versions v \
             ON v.agent_id = a.id AND v.version = a.version \
             WHERE a.id < $1 AND (a.archived_at IS NULL OR $2 = 1) \
             AND ($4 IS NULL OR a.tenant = $4) ORDER BY a.id DESC LIMIT $3"
        )
    }

    pub fn versions() -> String {
        format!(
            "SELECT {COLUMNS} FROM agents a JOIN agent_versions v ON v.agent_id = a.id \
             WHERE a.id = $1 AND v.version < $2 ORDER BY v.version DESC LIMIT $3"
        )
    }
}

/// The cursor that sorts above every id.
pub(super) const TOP: &str = "~";

/// Times as the tables keep them.
pub(super) fn micros(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

/// A version's row, in [`sql`]'s column order: id, version, spec, the agent's creation, the
/// version's, the archiving, the tenant.
pub(super) type AgentRow = (String, i64, String, i64, i64, Option<i64>, String);

/// Agent versions from their rows.
pub(super) fn records_of(rows: Vec<AgentRow>) -> StoreResult<Vec<AgentRecord>> {
    rows.into_iter().map(record_of).collect()
}

/// An agent version from its row.
pub(super) fn record_of(row: AgentRow) -> StoreResult<AgentRecord> {
    let (id, version, spec, created_at, updated_at, archived_at, tenant) = row;
    let corrupt = |what: &str| StoreError::Corrupt(format!("agent {id}: {what}"));
    let time = |t: i64| DateTime::from_timestamp_micros(t).ok_or_else(|| corrupt("a time"));
    let spec: AgentSpec =
        serde_json::from_str(&spec).map_err(|e| corrupt(&format!("version {version}: {e}")))?;
    Ok(AgentRecord {
        id: AgentId::Stored(Uuid::parse_str(&id).map_err(|_| corrupt("its id"))?),
        version: u32::try_from(version).map_err(|_| corrupt("its version"))?,
        spec,
        created_at: time(created_at)?,
        updated_at: time(updated_at)?,
        archived_at: archived_at.map(time).transpose()?,
        tenant,
    })
}

/// The stored form of a version.
pub(super) fn spec_json(agent: &AgentRecord) -> String {
    // Plain data: serialising it cannot fail.
    serde_json::to_string(&agent.spec).unwrap_or_default()
}

/// Implements [`AgentStore`] over a sqlx pool; `$sql` maps a statement to the backend's
/// spelling.
macro_rules! agents_over_pool {
    ($store:ty, $sql:expr) => {
        #[async_trait::async_trait]
        impl $crate::store::agents::AgentStore for $store {
            async fn insert_agent(
                &self,
                agent: &$crate::model::AgentRecord,
            ) -> $crate::store::StoreResult<()> {
                use $crate::store::agents::{micros, spec_json, sql};
                let q = $sql;
                let id = agent.id.to_string();
                let mut tx = self.pool.begin().await?;
                sqlx::query(&q(sql::INSERT_AGENT))
                    .bind(&id)
                    .bind(i64::from(agent.version))
                    .bind(&agent.spec.name)
                    .bind(micros(agent.created_at))
                    .bind(&agent.tenant)
                    .execute(&mut *tx)
                    .await?;
                sqlx::query(&q(sql::INSERT_VERSION))
                    .bind(&id)
                    .bind(i64::from(agent.version))
                    .bind(spec_json(agent))
                    .bind(micros(agent.updated_at))
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(())
            }

            async fn add_agent_version(
                &self,
                agent: &$crate::model::AgentRecord,
                from: u32,
            ) -> $crate::store::StoreResult<$crate::store::agents::Bumped> {
                use $crate::store::agents::{micros, spec_json, sql, Bumped};
                let q = $sql;
                let id = agent.id.to_string();
                let mut tx = self.pool.begin().await?;
                let bumped = sqlx::query(&q(sql::BUMP))
                    .bind(&id)
                    .bind(i64::from(agent.version))
                    .bind(&agent.spec.name)
                    .bind(i64::from(from))
                    .execute(&mut *tx)
                    .await?;
                if bumped.rows_affected() == 0 {
                    let archived: Option<Option<i64>> = sqlx::query_scalar(&q(sql::ARCHIVED))
                        .bind(&id)
                        .fetch_optional(&mut *tx)
                        .await?;
                    return Ok(match archived {
                        Some(None) => Bumped::Stale,
                        _ => Bumped::Archived,
                    });
                }
                sqlx::query(&q(sql::INSERT_VERSION))
                    .bind(&id)
                    .bind(i64::from(agent.version))
                    .bind(spec_json(agent))
                    .bind(micros(agent.updated_at))
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(Bumped::Done)
            }

            async fn agent(
                &self,
                id: uuid::Uuid,
                version: Option<u32>,
            ) -> $crate::store::StoreResult<Option<$crate::model::AgentRecord>> {
                use $crate::store::agents::sql;
                let q = $sql;
                let row: Option<$crate::store::agents::AgentRow> = match version {
                    None => {
                        sqlx::query_as(&q(&sql::latest()))
                            .bind(id.to_string())
                            .fetch_optional(&self.pool)
                            .await?
                    }
                    Some(version) => {
                        sqlx::query_as(&q(&sql::at_version()))
                            .bind(id.to_string())
                            .bind(i64::from(version))
                            .fetch_optional(&self.pool)
                            .await?
                    }
                };
                row.map($crate::store::agents::record_of).transpose()
            }

            async fn agents(
                &self,
                query: &$crate::store::agents::AgentQuery,
            ) -> $crate::store::StoreResult<Vec<$crate::model::AgentRecord>> {
                use $crate::store::agents::{sql, TOP};
                let q = $sql;
                let before = query
                    .before
                    .map(|id| id.to_string())
                    .unwrap_or_else(|| TOP.to_string());
                let rows: Vec<$crate::store::agents::AgentRow> = sqlx::query_as(&q(&sql::page()))
                    .bind(before)
                    .bind(i64::from(query.include_archived))
                    .bind(query.limit)
                    .bind(query.tenant.as_deref())
                    .fetch_all(&self.pool)
                    .await?;
                $crate::store::agents::records_of(rows)
            }

            async fn agent_versions(
                &self,
                id: uuid::Uuid,
                before: Option<u32>,
                limit: i64,
            ) -> $crate::store::StoreResult<Vec<$crate::model::AgentRecord>> {
                use $crate::store::agents::sql;
                let q = $sql;
                let before = before.map(i64::from).unwrap_or(i64::MAX);
                let rows: Vec<$crate::store::agents::AgentRow> =
                    sqlx::query_as(&q(&sql::versions()))
                        .bind(id.to_string())
                        .bind(before)
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?;
                $crate::store::agents::records_of(rows)
            }

            async fn archive_agent(
                &self,
                id: uuid::Uuid,
                at: chrono::DateTime<chrono::Utc>,
            ) -> $crate::store::StoreResult<bool> {
                use $crate::store::agents::{micros, sql};
                let q = $sql;
                let done = sqlx::query(&q(sql::ARCHIVE))
                    .bind(id.to_string())
                    .bind(micros(at))
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn agents_named(
                &self,
                tenant: &str,
                name: &str,
            ) -> $crate::store::StoreResult<Vec<uuid::Uuid>> {
                use $crate::store::agents::sql;
                let q = $sql;
                let ids: Vec<String> = sqlx::query_scalar(&q(sql::NAMED))
                    .bind(name)
                    .bind(tenant)
                    .fetch_all(&self.pool)
                    .await?;
                Ok(ids
                    .iter()
                    .filter_map(|id| uuid::Uuid::parse_str(id).ok())
                    .collect())
            }
        }
    };
}
pub(super) use agents_over_pool;
