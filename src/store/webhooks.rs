//! The webhook queue as stored (`migrations/*/0007_webhooks.sql`): the endpoints the server
//! was started with, and one delivery row per event and endpoint, queued by a trigger in the
//! transaction that commits the event (made here, at start, only when there are endpoints). `crate::webhooks` delivers them; this is only the
//! table, with the same semantics on both backends. Times are Unix milliseconds.

use async_trait::async_trait;
use uuid::Uuid;

use super::rows::StoredRow;
use super::StoreResult;

/// A delivery a process has claimed and now attempts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub id: i64,
    pub session_id: Uuid,
    pub seq: i64,
    pub url: String,
    /// Attempts made before this one.
    pub attempts: i64,
    /// When the event was queued.
    pub created_at: i64,
}

/// A delivery row as the delivery log shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryStatus {
    pub session_id: Uuid,
    pub seq: i64,
    pub url: String,
    pub status: String,
    pub attempts: i64,
    pub last_error: Option<String>,
    pub delivered_at: Option<i64>,
}

/// A claim on deliveries: who holds it, from `now` until `until`.
#[derive(Debug, Clone, Copy)]
pub struct Claim<'a> {
    pub owner: &'a str,
    pub now: i64,
    pub until: i64,
}

/// A failed attempt: its error, and when the delivery is tried again (`None`: given up).
#[derive(Debug, Clone, Copy)]
pub struct FailedAttempt<'a> {
    pub error: &'a str,
    pub next: Option<i64>,
}

#[async_trait]
pub trait WebhookQueue: Send + Sync {
    /// Makes `urls` the endpoints later events are queued for; pending deliveries to any other
    /// URL are marked failed.
    async fn set_endpoints(&self, urls: &[String], now: i64) -> StoreResult<()>;
    /// Frees every claim (only a store used by one process at a time may: its claims can only
    /// be those of a process that died).
    async fn release_claims(&self) -> StoreResult<()>;
    /// Claims at most `limit` deliveries that are due at `claim.now` and not claimed.
    async fn claim_deliveries(&self, claim: Claim<'_>, limit: i64) -> StoreResult<Vec<Delivery>>;
    /// Records a delivery the endpoint accepted.
    async fn delivered(&self, id: i64, claim: &str, at: i64) -> StoreResult<()>;
    /// Records a failed attempt of a delivery `claim` holds.
    async fn attempt_failed(
        &self,
        id: i64,
        claim: &str,
        failed: FailedAttempt<'_>,
    ) -> StoreResult<()>;
    /// Forgets the deliveries made or given up that were queued before `before`.
    async fn purge_deliveries(&self, before: i64) -> StoreResult<u64>;
    /// The delivery log, oldest first.
    async fn deliveries(&self, limit: i64) -> StoreResult<Vec<DeliveryStatus>>;
}

/// The statements, written for PostgreSQL (`$n`); SQLite takes them through `sqlite()`.
pub(super) mod sql {
    pub const CLEAR_ENDPOINTS: &str = "DELETE FROM webhook_endpoints";
    pub const DROP_TRIGGER: &str = "DROP TRIGGER IF EXISTS webhook_deliveries_enqueue {on_events}";
    /// Made by `sqlite()` or `postgres()`: the trigger of the backend.
    pub const CREATE_TRIGGER: &str = "{create_trigger}";
    /// The condition on an event's type (`{type}`): comparisons, not `IN (…)`, which costs
    /// SQLite a temporary table per row.
    pub const DELIVERED_TYPE: &str = "{type} = 'agent.finished' OR {type} = 'agent.failed' \
         OR {type} = 'tool.approval-requested' OR {type} = 'tool.client-requested' \
         OR {type} = 'agent.cancelled'";
    /// Whether the trigger exists (a count, 0 or 1).
    pub const HAS_TRIGGER: &str = "{has_trigger}";
    const SQLITE_HAS_TRIGGER: &str = "SELECT COUNT(*) FROM sqlite_master \
         WHERE type = 'trigger' AND name = 'webhook_deliveries_enqueue'";
    const POSTGRES_HAS_TRIGGER: &str = "SELECT COUNT(*) FROM pg_trigger \
         WHERE tgname = 'webhook_deliveries_enqueue' AND tgrelid = 'event_batches'::regclass";
    /// The trigger that queues the deliveries of a commit's events, in its transaction: a row of
    /// `event_batches` holds a session's events of the commit (`store/event_log.rs`), each
    /// `[seq, type, created_at, data]`.
    pub const SQLITE_TRIGGER: &str = "CREATE TRIGGER IF NOT EXISTS webhook_deliveries_enqueue \
         AFTER INSERT ON event_batches \
         BEGIN \
             INSERT OR IGNORE INTO webhook_deliveries \
                 (session_id, seq, event_type, url, next_attempt_at, created_at) \
             SELECT NEW.session_id, e.seq, e.type, url, \
                    CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER), \
                    CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER) \
             FROM (SELECT json_extract(value, '$[0]') AS seq, \
                          json_extract(value, '$[1]') AS type \
                   FROM json_each(NEW.events)) AS e, webhook_endpoints \
             WHERE {delivered}; \
         END";
    /// The function it runs is made by the migrations (`0019`: it reads the types the same
    /// way). `OR REPLACE` (PostgreSQL 14 and later) lets two replicas that start at once both
    /// make it.
    pub const POSTGRES_TRIGGER: &str = "CREATE OR REPLACE TRIGGER webhook_deliveries_enqueue \
         AFTER INSERT ON event_batches FOR EACH ROW \
         EXECUTE FUNCTION webhook_deliveries_enqueue()";
    pub const ADD_ENDPOINT: &str =
        "INSERT INTO webhook_endpoints (url) VALUES ($1) ON CONFLICT (url) DO NOTHING";
    pub const DROP_STALE: &str = "UPDATE webhook_deliveries \
         SET status = 'failed', last_error = 'the URL is no longer configured', \
             claim = NULL, claimed_until = 0, next_attempt_at = $1 \
         WHERE status = 'pending' AND url NOT IN (SELECT url FROM webhook_endpoints)";
    pub const RELEASE: &str = "UPDATE webhook_deliveries SET claim = NULL, claimed_until = 0 \
         WHERE status = 'pending' AND claimed_until > 0";
    pub const ANY_DUE: &str = "SELECT id FROM webhook_deliveries \
         WHERE status = 'pending' AND next_attempt_at <= $1 AND claimed_until <= $1 LIMIT 1";
    /// `{lock}` is `FOR UPDATE SKIP LOCKED` on PostgreSQL, so replicas claim different rows
    /// without waiting for each other; the outer condition is checked again after any wait.
    pub const CLAIM: &str = "UPDATE webhook_deliveries SET claim = $1, claimed_until = $2 \
         WHERE id IN (SELECT id FROM webhook_deliveries \
                      WHERE status = 'pending' AND next_attempt_at <= $3 AND claimed_until <= $3 \
                      ORDER BY next_attempt_at, id LIMIT $4 {lock}) \
           AND status = 'pending' AND claimed_until <= $3 \
         RETURNING id, {session_id} AS session_id, seq, url, attempts, created_at";
    pub const DELIVERED: &str = "UPDATE webhook_deliveries \
         SET status = 'delivered', attempts = attempts + 1, delivered_at = $3, last_error = NULL, \
             claim = NULL, claimed_until = 0 \
         WHERE id = $1 AND claim = $2";
    pub const RETRY: &str = "UPDATE webhook_deliveries \
         SET attempts = attempts + 1, next_attempt_at = $3, last_error = $4, \
             claim = NULL, claimed_until = 0 \
         WHERE id = $1 AND claim = $2";
    pub const GIVE_UP: &str = "UPDATE webhook_deliveries \
         SET status = 'failed', attempts = attempts + 1, last_error = $3, \
             claim = NULL, claimed_until = 0 \
         WHERE id = $1 AND claim = $2";
    pub const PURGE: &str =
        "DELETE FROM webhook_deliveries WHERE status <> 'pending' AND created_at < $1";
    pub const LOG: &str = "SELECT {session_id} AS session_id, seq, url, status, attempts, \
         last_error, delivered_at FROM webhook_deliveries ORDER BY id LIMIT $1";

    /// How a backend spells what the statements leave open.
    struct Dialect {
        trigger: &'static str,
        has_trigger: &'static str,
        /// Replaces ` {on_events}`, ` {lock}` and `{session_id}`.
        on_events: &'static str,
        lock: &'static str,
        session_id: &'static str,
        /// The parameter sign (`$n` or `?n`).
        parameter: &'static str,
    }

    /// Numbered `?n` parameters, ids as they are stored (text).
    const SQLITE: Dialect = Dialect {
        trigger: SQLITE_TRIGGER,
        has_trigger: SQLITE_HAS_TRIGGER,
        on_events: "",
        lock: "",
        session_id: "session_id",
        parameter: "?",
    };

    /// Ids read as text.
    const POSTGRES: Dialect = Dialect {
        trigger: POSTGRES_TRIGGER,
        has_trigger: POSTGRES_HAS_TRIGGER,
        on_events: " ON event_batches",
        lock: " FOR UPDATE SKIP LOCKED",
        session_id: "session_id::text",
        parameter: "$",
    };

    /// The statement for SQLite.
    pub fn sqlite(statement: &str) -> String {
        spell(statement, &SQLITE)
    }

    /// The statement for PostgreSQL.
    pub fn postgres(statement: &str) -> String {
        spell(statement, &POSTGRES)
    }

    fn spell(statement: &str, dialect: &Dialect) -> String {
        if statement == CREATE_TRIGGER {
            return dialect
                .trigger
                .replace("{delivered}", &DELIVERED_TYPE.replace("{type}", "e.type"));
        }
        if statement == HAS_TRIGGER {
            return dialect.has_trigger.to_string();
        }
        statement
            .replace(" {on_events}", dialect.on_events)
            .replace('$', dialect.parameter)
            .replace(" {lock}", dialect.lock)
            .replace("{session_id}", dialect.session_id)
    }
}

/// A claimed delivery as the claim returns it.
pub(super) fn delivery_from<R: StoredRow>(row: &R) -> StoreResult<Delivery> {
    Ok(Delivery {
        id: row.get("id")?,
        session_id: session_id(&row.get::<String>("session_id")?)?,
        seq: row.get("seq")?,
        url: row.get("url")?,
        attempts: i64::from(row.get::<i32>("attempts")?),
        created_at: row.get("created_at")?,
    })
}

/// A row of the delivery log.
pub(super) fn delivery_status_from<R: StoredRow>(row: &R) -> StoreResult<DeliveryStatus> {
    Ok(DeliveryStatus {
        session_id: session_id(&row.get::<String>("session_id")?)?,
        seq: row.get("seq")?,
        url: row.get("url")?,
        status: row.get("status")?,
        attempts: i64::from(row.get::<i32>("attempts")?),
        last_error: row.get("last_error")?,
        delivered_at: row.get("delivered_at")?,
    })
}

/// Reads a stored session id (text on both backends as the statements read it).
fn session_id(text: &str) -> StoreResult<Uuid> {
    text.parse()
        .map_err(|_| super::StoreError::Corrupt(format!("webhook delivery of session {text:?}")))
}

/// Implements [`WebhookQueue`] over a sqlx pool; `$sql` maps a statement to the backend's
/// spelling.
macro_rules! webhook_queue_over_pool {
    ($store:ty, $sql:expr) => {
        #[async_trait::async_trait]
        impl $crate::store::webhooks::WebhookQueue for $store {
            async fn set_endpoints(
                &self,
                urls: &[String],
                now: i64,
            ) -> $crate::store::StoreResult<()> {
                use $crate::store::webhooks::sql;
                let q = $sql;
                let mut tx = self.pool.begin().await?;
                sqlx::query(&q(sql::CLEAR_ENDPOINTS))
                    .execute(&mut *tx)
                    .await?;
                for url in urls {
                    sqlx::query(&q(sql::ADD_ENDPOINT))
                        .bind(url)
                        .execute(&mut *tx)
                        .await?;
                }
                // Events are queued only while URLs are configured: without any, no trigger
                // costs anything per event. The trigger is made or dropped only when that
                // changes (dropping one locks the events table on PostgreSQL).
                let exists: i64 = sqlx::query_scalar(&q(sql::HAS_TRIGGER))
                    .fetch_one(&mut *tx)
                    .await?;
                if !urls.is_empty() && exists == 0 {
                    sqlx::query(&q(sql::CREATE_TRIGGER))
                        .execute(&mut *tx)
                        .await?;
                } else if urls.is_empty() && exists > 0 {
                    sqlx::query(&q(sql::DROP_TRIGGER)).execute(&mut *tx).await?;
                }
                sqlx::query(&q(sql::DROP_STALE))
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(())
            }

            async fn release_claims(&self) -> $crate::store::StoreResult<()> {
                let q = $sql;
                sqlx::query(&q($crate::store::webhooks::sql::RELEASE))
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn claim_deliveries(
                &self,
                claim: $crate::store::webhooks::Claim<'_>,
                limit: i64,
            ) -> $crate::store::StoreResult<Vec<$crate::store::webhooks::Delivery>> {
                use $crate::store::webhooks::sql;
                let q = $sql;
                // A read first: the claim is a write, and most polls find nothing due.
                let due = sqlx::query(&q(sql::ANY_DUE))
                    .bind(claim.now)
                    .fetch_optional(&self.pool)
                    .await?;
                if due.is_none() {
                    return Ok(Vec::new());
                }
                let rows = sqlx::query(&q(sql::CLAIM))
                    .bind(claim.owner)
                    .bind(claim.until)
                    .bind(claim.now)
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?;
                rows.iter()
                    .map($crate::store::webhooks::delivery_from)
                    .collect()
            }

            async fn delivered(
                &self,
                id: i64,
                claim: &str,
                at: i64,
            ) -> $crate::store::StoreResult<()> {
                let q = $sql;
                sqlx::query(&q($crate::store::webhooks::sql::DELIVERED))
                    .bind(id)
                    .bind(claim)
                    .bind(at)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn attempt_failed(
                &self,
                id: i64,
                claim: &str,
                failed: $crate::store::webhooks::FailedAttempt<'_>,
            ) -> $crate::store::StoreResult<()> {
                use $crate::store::webhooks::sql;
                let q = $sql;
                let statement = q(match failed.next {
                    Some(_) => sql::RETRY,
                    None => sql::GIVE_UP,
                });
                let query = sqlx::query(&statement).bind(id).bind(claim);
                // A retry binds when it is due (`$3`) before the error; giving up only the error.
                let query = match failed.next {
                    Some(next) => query.bind(next),
                    None => query,
                };
                query.bind(failed.error).execute(&self.pool).await?;
                Ok(())
            }

            async fn purge_deliveries(&self, before: i64) -> $crate::store::StoreResult<u64> {
                let q = $sql;
                let done = sqlx::query(&q($crate::store::webhooks::sql::PURGE))
                    .bind(before)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected())
            }

            async fn deliveries(
                &self,
                limit: i64,
            ) -> $crate::store::StoreResult<Vec<$crate::store::webhooks::DeliveryStatus>> {
                let q = $sql;
                let rows = sqlx::query(&q($crate::store::webhooks::sql::LOG))
                    .bind(limit)
                    .fetch_all(&self.pool)
                    .await?;
                rows.iter()
                    .map($crate::store::webhooks::delivery_status_from)
                    .collect()
            }
        }
    };
}
pub(super) use webhook_queue_over_pool;
