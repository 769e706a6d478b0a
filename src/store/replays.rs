//! Replays as stored (`migrations/*/*_replays.sql`): a row per session that replays another
//! one. Ids are UUID v7 text and times Unix milliseconds on both backends, so one set of
//! statements serves both.

use async_trait::async_trait;
use uuid::Uuid;

use super::{StoreError, StoreResult};

/// A replay's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayRow {
    /// The session that replays.
    pub session_id: Uuid,
    /// The session it replays.
    pub source_id: Uuid,
    /// `recorded` or `live`.
    pub mode: String,
    /// The agent version it runs, as the JSON of its tag.
    pub agent: String,
    /// How many of the source's turns it replays.
    pub turns: i64,
    pub created_at: i64,
    /// When its last turn ended, or when it was found cut short (Unix ms); `None` while it
    /// runs.
    pub finished_at: Option<i64>,
    /// Why it ended before its last turn did (a restart cut it short).
    pub error: Option<String>,
}

#[async_trait]
pub trait ReplayStore: Send + Sync {
    async fn insert_replay(&self, replay: &ReplayRow) -> StoreResult<()>;
    /// The replay of the session `session_id`, when it is one.
    async fn replay(&self, session_id: Uuid) -> StoreResult<Option<ReplayRow>>;
    /// Records that the replay of `session_id` ended at `at`.
    async fn finish_replay(&self, session_id: Uuid, at: i64) -> StoreResult<()>;
    /// Records that the replay of `session_id`, not ended yet, was cut short at `at` for
    /// `error`; whether it was not ended (and now is).
    async fn cut_replay_short(&self, session_id: Uuid, at: i64, error: &str) -> StoreResult<bool>;
    /// The replays not ended, oldest first.
    async fn unfinished_replays(&self) -> StoreResult<Vec<ReplayRow>>;
}

/// The statements, written for PostgreSQL (`$n`); SQLite takes the same as `?n`.
pub(super) mod sql {
    pub const INSERT: &str = "INSERT INTO replays \
         (session_id, source_id, mode, agent, turns, created_at, finished_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)";
    pub const ONE: &str = "SELECT session_id, source_id, mode, agent, turns, created_at, \
         finished_at, error FROM replays WHERE session_id = $1";
    pub const FINISH: &str =
        "UPDATE replays SET finished_at = $2 WHERE session_id = $1 AND finished_at IS NULL";
    pub const CUT_SHORT: &str = "UPDATE replays SET finished_at = $2, error = $3 \
         WHERE session_id = $1 AND finished_at IS NULL";
    pub const UNFINISHED: &str = "SELECT session_id, source_id, mode, agent, turns, \
         created_at, finished_at, error FROM replays WHERE finished_at IS NULL \
         ORDER BY created_at";
}

/// A replay's columns as the statements read them.
pub(super) type ReplayTuple = (
    String,
    String,
    String,
    String,
    i64,
    i64,
    Option<i64>,
    Option<String>,
);

pub(super) fn replay_from(t: ReplayTuple) -> StoreResult<ReplayRow> {
    let uuid = |text: &str, what: &str| -> StoreResult<Uuid> {
        text.parse()
            .map_err(|_| StoreError::Corrupt(format!("{what} {text:?}")))
    };
    Ok(ReplayRow {
        session_id: uuid(&t.0, "replay session")?,
        source_id: uuid(&t.1, "replay source")?,
        mode: t.2,
        agent: t.3,
        turns: t.4,
        created_at: t.5,
        finished_at: t.6,
        error: t.7,
    })
}

/// Implements [`ReplayStore`] over a sqlx pool; `$sql` maps a statement to the backend's
/// spelling.
macro_rules! replays_over_pool {
    ($store:ty, $sql:expr) => {
        #[async_trait::async_trait]
        impl $crate::store::replays::ReplayStore for $store {
            async fn insert_replay(
                &self,
                r: &$crate::store::replays::ReplayRow,
            ) -> $crate::store::StoreResult<()> {
                let q = $sql;
                sqlx::query(&q($crate::store::replays::sql::INSERT))
                    .bind(r.session_id.to_string())
                    .bind(r.source_id.to_string())
                    .bind(&r.mode)
                    .bind(&r.agent)
                    .bind(r.turns)
                    .bind(r.created_at)
                    .bind(r.finished_at)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn replay(
                &self,
                session_id: uuid::Uuid,
            ) -> $crate::store::StoreResult<Option<$crate::store::replays::ReplayRow>> {
                let q = $sql;
                let row: Option<$crate::store::replays::ReplayTuple> =
                    sqlx::query_as(&q($crate::store::replays::sql::ONE))
                        .bind(session_id.to_string())
                        .fetch_optional(&self.pool)
                        .await?;
                row.map($crate::store::replays::replay_from).transpose()
            }

            async fn finish_replay(
                &self,
                session_id: uuid::Uuid,
                at: i64,
            ) -> $crate::store::StoreResult<()> {
                let q = $sql;
                sqlx::query(&q($crate::store::replays::sql::FINISH))
                    .bind(session_id.to_string())
                    .bind(at)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn cut_replay_short(
                &self,
                session_id: uuid::Uuid,
                at: i64,
                error: &str,
            ) -> $crate::store::StoreResult<bool> {
                let q = $sql;
                let done = sqlx::query(&q($crate::store::replays::sql::CUT_SHORT))
                    .bind(session_id.to_string())
                    .bind(at)
                    .bind(error)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn unfinished_replays(
                &self,
            ) -> $crate::store::StoreResult<Vec<$crate::store::replays::ReplayRow>> {
                let q = $sql;
                let rows: Vec<$crate::store::replays::ReplayTuple> =
                    sqlx::query_as(&q($crate::store::replays::sql::UNFINISHED))
                        .fetch_all(&self.pool)
                        .await?;
                rows.into_iter()
                    .map($crate::store::replays::replay_from)
                    .collect()
            }
        }
    };
}
pub(super) use replays_over_pool;
