//! Schedules and their fires as stored (`migrations/*/*_schedules.sql`). Ids are UUID v7 text
//! and times Unix milliseconds on both backends, so one set of statements serves both.
//!
//! A fire is claimed by [`ScheduleStore::claim_fire`]: one update that moves a schedule's
//! `next_fire_at` from the value the scheduler read to the next one, guarded by that old value
//! (and by the schedule not being paused). Of several replicas that read the same due time,
//! exactly one such update changes a row; the others see none changed and leave it.
//!
//! A fire queued behind its schedule's previous run waits in the log (`queued`) and is
//! claimed the same way by [`ScheduleStore::claim_queued`]: one update of its `claimed_until`,
//! guarded by the fire still being queued and not claimed by anyone whose claim still holds.

use async_trait::async_trait;
use uuid::Uuid;

use super::{StoreError, StoreResult};

/// A schedule's row.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleRow {
    pub id: Uuid,
    pub tenant: String,
    /// The principal that made it: the owner of the sessions its fires make.
    pub owner: String,
    /// The agent id as the schedule names it.
    pub agent: String,
    pub cron: String,
    pub timezone: String,
    pub input: String,
    /// The session each fire runs on; `None`: a new session per fire.
    pub session_id: Option<Uuid>,
    pub misfire: String,
    pub overlap: String,
    pub max_cost_usd: Option<f64>,
    pub paused: bool,
    /// The next fire time not yet claimed (Unix ms); `None` when the cron has no later time.
    pub next_fire_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A fire's row: one line of a schedule's fires log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FireRow {
    pub id: Uuid,
    pub schedule_id: Uuid,
    /// The fire time it stands for (Unix ms): the cron's time, or the moment of a manual fire.
    pub fire_at: i64,
    /// `scheduled`, `manual` or `catch_up`.
    pub trigger: String,
    pub session_id: Option<Uuid>,
    pub run_id: Option<Uuid>,
    /// `queued`, `started`, `completed`, `failed` or `skipped`.
    pub outcome: String,
    pub error: Option<String>,
    /// How many fire times this line accounts for beyond itself (a misfire).
    pub missed: i64,
    pub created_at: i64,
}

/// Which schedules a list holds (newest first; the cursor is the last id seen).
#[derive(Debug, Clone, Default)]
pub struct ScheduleQuery {
    pub limit: i64,
    pub before: Option<Uuid>,
    /// Only this tenant's (`None`: every tenant's).
    pub tenant: Option<String>,
    /// Only this principal's.
    pub owner: Option<String>,
}

#[async_trait]
pub trait ScheduleStore: Send + Sync {
    async fn insert_schedule(&self, schedule: &ScheduleRow) -> StoreResult<()>;
    async fn schedule(&self, id: Uuid) -> StoreResult<Option<ScheduleRow>>;
    async fn schedules(&self, query: &ScheduleQuery) -> StoreResult<Vec<ScheduleRow>>;
    /// Writes every column but the id, the tenant, the owner and the creation time; whether
    /// the schedule exists.
    async fn update_schedule(&self, schedule: &ScheduleRow) -> StoreResult<bool>;
    /// Deletes a schedule and its fires log; whether there was one.
    async fn delete_schedule(&self, id: Uuid) -> StoreResult<bool>;
    /// Schedules not paused whose next fire time is at or before `now`, earliest first.
    async fn due_schedules(&self, now: i64, limit: i64) -> StoreResult<Vec<ScheduleRow>>;
    /// The earliest next fire time of the schedules not paused.
    async fn next_due(&self) -> StoreResult<Option<i64>>;
    /// Moves `next_fire_at` of a schedule not paused from `due` to `next`; whether this call
    /// did (exactly one of several concurrent calls with the same `due` does).
    async fn claim_fire(&self, id: Uuid, due: i64, next: Option<i64>) -> StoreResult<bool>;
    async fn insert_fire(&self, fire: &FireRow) -> StoreResult<()>;
    /// Writes a fire's session, run, outcome and error.
    async fn update_fire(&self, fire: &FireRow) -> StoreResult<()>;
    async fn fire(&self, id: Uuid) -> StoreResult<Option<FireRow>>;
    /// A schedule's fires in order, with `id > after` when given.
    async fn fires(
        &self,
        schedule_id: Uuid,
        after: Option<Uuid>,
        limit: i64,
    ) -> StoreResult<Vec<FireRow>>;
    /// The schedule's newest fire that started a run or waits to (`started` or `queued`).
    async fn last_run_fire(&self, schedule_id: Uuid) -> StoreResult<Option<FireRow>>;
    /// Fires of any schedule still `queued` and not claimed by a claim that holds at `now`,
    /// oldest first.
    async fn queued_fires(&self, now: i64, limit: i64) -> StoreResult<Vec<FireRow>>;
    /// Claims a queued fire until `until` if it is still queued and no claim on it holds at
    /// `now`; whether this call did (exactly one of several concurrent calls does).
    async fn claim_queued(&self, id: Uuid, now: i64, until: i64) -> StoreResult<bool>;
    /// Gives a claim on a queued fire back: any process may claim it at once.
    async fn release_queued(&self, id: Uuid) -> StoreResult<()> {
        // A claim until 0, made whatever claim holds (every claim ends before `i64::MAX`).
        self.claim_queued(id, i64::MAX, 0).await.map(|_| ())
    }
}

/// The statements, written for PostgreSQL (`$n`); SQLite takes the same as `?n`.
pub(super) mod sql {
    const COLUMNS: &str = "id, tenant, owner, agent, cron, timezone, input, session_id, \
                           misfire, overlap, max_cost_usd, paused, next_fire_at, created_at, \
                           updated_at";
    const FIRE_COLUMNS: &str = "id, schedule_id, fire_at, trigger_kind, session_id, run_id, \
                                outcome, error, missed, created_at";

    pub fn insert() -> String {
        format!(
            "INSERT INTO schedules ({COLUMNS}) VALUES \
             ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"
        )
    }
    pub fn one() -> String {
        format!("SELECT {COLUMNS} FROM schedules WHERE id = $1")
    }
    /// `$1`: the tenant or NULL, `$2`: the owner or NULL, `$3`: the cursor or NULL.
    pub fn list() -> String {
        format!(
            "SELECT {COLUMNS} FROM schedules \
             WHERE ($1 IS NULL OR tenant = $1) AND ($2 IS NULL OR owner = $2) \
               AND ($3 IS NULL OR id < $3) \
             ORDER BY id DESC LIMIT $4"
        )
    }
    pub const UPDATE: &str = "UPDATE schedules SET agent = $2, cron = $3, timezone = $4, \
         input = $5, session_id = $6, misfire = $7, overlap = $8, max_cost_usd = $9, \
         paused = $10, next_fire_at = $11, updated_at = $12 WHERE id = $1";
    pub const DELETE: &str = "DELETE FROM schedules WHERE id = $1";
    pub const DELETE_FIRES: &str = "DELETE FROM schedule_fires WHERE schedule_id = $1";
    pub fn due() -> String {
        format!(
            "SELECT {COLUMNS} FROM schedules \
             WHERE NOT paused AND next_fire_at IS NOT NULL AND next_fire_at <= $1 \
             ORDER BY next_fire_at LIMIT $2"
        )
    }
    pub const NEXT_DUE: &str =
        "SELECT MIN(next_fire_at) FROM schedules WHERE NOT paused AND next_fire_at IS NOT NULL";
    pub const CLAIM: &str = "UPDATE schedules SET next_fire_at = $3 \
         WHERE id = $1 AND next_fire_at = $2 AND NOT paused";
    pub fn insert_fire() -> String {
        format!(
            "INSERT INTO schedule_fires ({FIRE_COLUMNS}) VALUES \
             ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"
        )
    }
    pub const UPDATE_FIRE: &str = "UPDATE schedule_fires SET session_id = $2, run_id = $3, \
         outcome = $4, error = $5 WHERE id = $1";
    pub fn one_fire() -> String {
        format!("SELECT {FIRE_COLUMNS} FROM schedule_fires WHERE id = $1")
    }
    pub fn fires() -> String {
        format!(
            "SELECT {FIRE_COLUMNS} FROM schedule_fires \
             WHERE schedule_id = $1 AND ($2 IS NULL OR id > $2) ORDER BY id LIMIT $3"
        )
    }
    pub fn queued_fires() -> String {
        format!(
            "SELECT {FIRE_COLUMNS} FROM schedule_fires \
             WHERE outcome = 'queued' AND (claimed_until IS NULL OR claimed_until < $1) \
             ORDER BY id LIMIT $2"
        )
    }
    pub const CLAIM_QUEUED: &str = "UPDATE schedule_fires SET claimed_until = $3 \
         WHERE id = $1 AND outcome = 'queued' AND (claimed_until IS NULL OR claimed_until < $2)";
    pub fn last_run_fire() -> String {
        format!(
            "SELECT {FIRE_COLUMNS} FROM schedule_fires \
             WHERE schedule_id = $1 AND (outcome = 'started' OR outcome = 'queued') \
             ORDER BY id DESC LIMIT 1"
        )
    }
}

/// A schedule's columns as the statements read them.
pub(super) type ScheduleTuple = (
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    Option<String>,
    String,
    String,
    Option<f64>,
    bool,
    Option<i64>,
    i64,
    i64,
);

/// A fire's columns as the statements read them.
pub(super) type FireTuple = (
    String,
    String,
    i64,
    String,
    Option<String>,
    Option<String>,
    String,
    Option<String>,
    i64,
    i64,
);

fn uuid_of(text: &str, what: &str) -> StoreResult<Uuid> {
    text.parse()
        .map_err(|_| StoreError::Corrupt(format!("{what} {text:?}")))
}

fn uuid_opt(text: Option<String>, what: &str) -> StoreResult<Option<Uuid>> {
    text.map(|t| uuid_of(&t, what)).transpose()
}

pub(super) fn schedule_from(t: ScheduleTuple) -> StoreResult<ScheduleRow> {
    Ok(ScheduleRow {
        id: uuid_of(&t.0, "schedule id")?,
        tenant: t.1,
        owner: t.2,
        agent: t.3,
        cron: t.4,
        timezone: t.5,
        input: t.6,
        session_id: uuid_opt(t.7, "schedule session")?,
        misfire: t.8,
        overlap: t.9,
        max_cost_usd: t.10,
        paused: t.11,
        next_fire_at: t.12,
        created_at: t.13,
        updated_at: t.14,
    })
}

pub(super) fn fire_from(t: FireTuple) -> StoreResult<FireRow> {
    Ok(FireRow {
        id: uuid_of(&t.0, "fire id")?,
        schedule_id: uuid_of(&t.1, "fire schedule")?,
        fire_at: t.2,
        trigger: t.3,
        session_id: uuid_opt(t.4, "fire session")?,
        run_id: uuid_opt(t.5, "fire run")?,
        outcome: t.6,
        error: t.7,
        missed: t.8,
        created_at: t.9,
    })
}

/// Implements [`ScheduleStore`] over a sqlx pool; `$sql` maps a statement to the backend's
/// spelling.
macro_rules! schedules_over_pool {
    ($store:ty, $sql:expr) => {
        #[async_trait::async_trait]
        impl $crate::store::schedules::ScheduleStore for $store {
            async fn insert_schedule(
                &self,
                s: &$crate::store::schedules::ScheduleRow,
            ) -> $crate::store::StoreResult<()> {
                let q = $sql;
                sqlx::query(&q(&$crate::store::schedules::sql::insert()))
                    .bind(s.id.to_string())
                    .bind(&s.tenant)
                    .bind(&s.owner)
                    .bind(&s.agent)
                    .bind(&s.cron)
                    .bind(&s.timezone)
                    .bind(&s.input)
                    .bind(s.session_id.map(|id| id.to_string()))
                    .bind(&s.misfire)
                    .bind(&s.overlap)
                    .bind(s.max_cost_usd)
                    .bind(s.paused)
                    .bind(s.next_fire_at)
                    .bind(s.created_at)
                    .bind(s.updated_at)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn schedule(
                &self,
                id: uuid::Uuid,
            ) -> $crate::store::StoreResult<Option<$crate::store::schedules::ScheduleRow>> {
                let q = $sql;
                let row: Option<$crate::store::schedules::ScheduleTuple> =
                    sqlx::query_as(&q(&$crate::store::schedules::sql::one()))
                        .bind(id.to_string())
                        .fetch_optional(&self.pool)
                        .await?;
                row.map($crate::store::schedules::schedule_from).transpose()
            }

            async fn schedules(
                &self,
                query: &$crate::store::schedules::ScheduleQuery,
            ) -> $crate::store::StoreResult<Vec<$crate::store::schedules::ScheduleRow>> {
                let q = $sql;
                let rows: Vec<$crate::store::schedules::ScheduleTuple> =
                    sqlx::query_as(&q(&$crate::store::schedules::sql::list()))
                        .bind(query.tenant.clone())
                        .bind(query.owner.clone())
                        .bind(query.before.map(|id| id.to_string()))
                        .bind(query.limit)
                        .fetch_all(&self.pool)
                        .await?;
                rows.into_iter()
                    .map($crate::store::schedules::schedule_from)
                    .collect()
            }

            async fn update_schedule(
                &self,
                s: &$crate::store::schedules::ScheduleRow,
            ) -> $crate::store::StoreResult<bool> {
                let q = $sql;
                let done = sqlx::query(&q($crate::store::schedules::sql::UPDATE))
                    .bind(s.id.to_string())
                    .bind(&s.agent)
                    .bind(&s.cron)
                    .bind(&s.timezone)
                    .bind(&s.input)
                    .bind(s.session_id.map(|id| id.to_string()))
                    .bind(&s.misfire)
                    .bind(&s.overlap)
                    .bind(s.max_cost_usd)
                    .bind(s.paused)
                    .bind(s.next_fire_at)
                    .bind(s.updated_at)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn delete_schedule(&self, id: uuid::Uuid) -> $crate::store::StoreResult<bool> {
                let q = $sql;
                let mut tx = self.pool.begin().await?;
                sqlx::query(&q($crate::store::schedules::sql::DELETE_FIRES))
                    .bind(id.to_string())
                    .execute(&mut *tx)
                    .await?;
                let done = sqlx::query(&q($crate::store::schedules::sql::DELETE))
                    .bind(id.to_string())
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(done.rows_affected() > 0)
            }

            async fn due_schedules(
                &self,
                now: i64,
                limit: i64,
            ) -> $crate::store::StoreResult<Vec<$crate::store::schedules::ScheduleRow>> {
                let q = $sql;
                let rows: Vec<$crate::store::schedules::ScheduleTuple> =
                    sqlx::query_as(&q(&$crate::store::schedules::sql::due()))
                        .bind(now)
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?;
                rows.into_iter()
                    .map($crate::store::schedules::schedule_from)
                    .collect()
            }

            async fn next_due(&self) -> $crate::store::StoreResult<Option<i64>> {
                let q = $sql;
                let next: Option<i64> =
                    sqlx::query_scalar(&q($crate::store::schedules::sql::NEXT_DUE))
                        .fetch_one(&self.pool)
                        .await?;
                Ok(next)
            }

            async fn claim_fire(
                &self,
                id: uuid::Uuid,
                due: i64,
                next: Option<i64>,
            ) -> $crate::store::StoreResult<bool> {
                let q = $sql;
                let done = sqlx::query(&q($crate::store::schedules::sql::CLAIM))
                    .bind(id.to_string())
                    .bind(due)
                    .bind(next)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected() == 1)
            }

            async fn insert_fire(
                &self,
                f: &$crate::store::schedules::FireRow,
            ) -> $crate::store::StoreResult<()> {
                let q = $sql;
                sqlx::query(&q(&$crate::store::schedules::sql::insert_fire()))
                    .bind(f.id.to_string())
                    .bind(f.schedule_id.to_string())
                    .bind(f.fire_at)
                    .bind(&f.trigger)
                    .bind(f.session_id.map(|id| id.to_string()))
                    .bind(f.run_id.map(|id| id.to_string()))
                    .bind(&f.outcome)
                    .bind(&f.error)
                    .bind(f.missed)
                    .bind(f.created_at)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn update_fire(
                &self,
                f: &$crate::store::schedules::FireRow,
            ) -> $crate::store::StoreResult<()> {
                let q = $sql;
                sqlx::query(&q($crate::store::schedules::sql::UPDATE_FIRE))
                    .bind(f.id.to_string())
                    .bind(f.session_id.map(|id| id.to_string()))
                    .bind(f.run_id.map(|id| id.to_string()))
                    .bind(&f.outcome)
                    .bind(&f.error)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn fire(
                &self,
                id: uuid::Uuid,
            ) -> $crate::store::StoreResult<Option<$crate::store::schedules::FireRow>> {
                let q = $sql;
                let row: Option<$crate::store::schedules::FireTuple> =
                    sqlx::query_as(&q(&$crate::store::schedules::sql::one_fire()))
                        .bind(id.to_string())
                        .fetch_optional(&self.pool)
                        .await?;
                row.map($crate::store::schedules::fire_from).transpose()
            }

            async fn fires(
                &self,
                schedule_id: uuid::Uuid,
                after: Option<uuid::Uuid>,
                limit: i64,
            ) -> $crate::store::StoreResult<Vec<$crate::store::schedules::FireRow>> {
                let q = $sql;
                let rows: Vec<$crate::store::schedules::FireTuple> =
                    sqlx::query_as(&q(&$crate::store::schedules::sql::fires()))
                        .bind(schedule_id.to_string())
                        .bind(after.map(|id| id.to_string()))
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?;
                rows.into_iter()
                    .map($crate::store::schedules::fire_from)
                    .collect()
            }

            async fn last_run_fire(
                &self,
                schedule_id: uuid::Uuid,
            ) -> $crate::store::StoreResult<Option<$crate::store::schedules::FireRow>> {
                let q = $sql;
                let row: Option<$crate::store::schedules::FireTuple> =
                    sqlx::query_as(&q(&$crate::store::schedules::sql::last_run_fire()))
                        .bind(schedule_id.to_string())
                        .fetch_optional(&self.pool)
                        .await?;
                row.map($crate::store::schedules::fire_from).transpose()
            }

            async fn queued_fires(
                &self,
                now: i64,
                limit: i64,
            ) -> $crate::store::StoreResult<Vec<$crate::store::schedules::FireRow>> {
                let q = $sql;
                let rows: Vec<$crate::store::schedules::FireTuple> =
                    sqlx::query_as(&q(&$crate::store::schedules::sql::queued_fires()))
                        .bind(now)
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?;
                rows.into_iter()
                    .map($crate::store::schedules::fire_from)
                    .collect()
            }

            async fn claim_queued(
                &self,
                id: uuid::Uuid,
                now: i64,
                until: i64,
            ) -> $crate::store::StoreResult<bool> {
                let q = $sql;
                let done = sqlx::query(&q($crate::store::schedules::sql::CLAIM_QUEUED))
                    .bind(id.to_string())
                    .bind(now)
                    .bind(until)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected() == 1)
            }
        }
    };
}
pub(super) use schedules_over_pool;
