//! Idempotency keys as stored: who holds a key (a request in flight, by its claim) and the
//! response it got. The HTTP layer decides what a key means (`http::idempotency`); this is
//! only the table, with the same semantics on both backends.

use async_trait::async_trait;

use super::StoreResult;

/// A response kept for the retries of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub content_type: Option<String>,
    pub location: Option<String>,
    pub body: Vec<u8>,
}

/// A key that is taken: by a request in flight (`response` is `None`) or answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    /// What the first request was (its route and body, hashed).
    pub fingerprint: String,
    pub response: Option<StoredResponse>,
}

/// A request's claim on a key. Times are Unix milliseconds.
#[derive(Debug, Clone)]
pub struct KeyClaim<'a> {
    pub key: &'a str,
    pub fingerprint: &'a str,
    /// Names the claimant, so that only it renews, answers or releases the key.
    pub claim: &'a str,
    pub now: i64,
    /// The claim lapses then unless renewed.
    pub claimed_until: i64,
    /// The key (and its response) is forgotten then.
    pub expires_at: i64,
}

#[async_trait]
pub trait IdempotencyKeys: Send + Sync {
    /// Takes the key for this claim, unless someone holds it: `None` when it is now this
    /// claim's, else what holds it. An expired key, or a claim that lapsed without a
    /// response, is taken over.
    async fn claim_key(&self, claim: &KeyClaim<'_>) -> StoreResult<Option<KeyRecord>>;
    /// Extends a claim that is still in flight.
    async fn renew_key(&self, key: &str, claim: &str, until: i64) -> StoreResult<()>;
    /// Records the response of the claim's request.
    async fn answer_key(
        &self,
        key: &str,
        claim: &str,
        response: &StoredResponse,
    ) -> StoreResult<()>;
    /// Gives the key up (its request got an answer worth retrying, such as a 409 or a 5xx).
    async fn release_key(&self, key: &str, claim: &str) -> StoreResult<()>;
    /// Forgets the keys that expired by `now`.
    async fn purge_keys(&self, now: i64) -> StoreResult<u64>;
}

/// Reads what holds a key from its row's columns.
pub(super) fn record_of(
    fingerprint: String,
    status: Option<i64>,
    content_type: Option<String>,
    location: Option<String>,
    body: Option<Vec<u8>>,
) -> KeyRecord {
    KeyRecord {
        fingerprint,
        response: status.map(|status| StoredResponse {
            status: u16::try_from(status).unwrap_or(500),
            content_type,
            location,
            body: body.unwrap_or_default(),
        }),
    }
}

/// The statements, written for PostgreSQL (`$n`); SQLite takes the same as `?n`.
pub(super) mod sql {
    pub const CLEAR: &str = "DELETE FROM idempotency_keys WHERE key = $1 \
         AND (expires_at <= $2 OR (status IS NULL AND claimed_until <= $2))";
    pub const INSERT: &str = "INSERT INTO idempotency_keys \
         (key, fingerprint, claim, claimed_until, created_at, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (key) DO NOTHING";
    pub const SELECT: &str = "SELECT fingerprint, status, content_type, location, body \
         FROM idempotency_keys WHERE key = $1";
    pub const RENEW: &str = "UPDATE idempotency_keys SET claimed_until = $3 \
         WHERE key = $1 AND claim = $2 AND status IS NULL";
    pub const ANSWER: &str = "UPDATE idempotency_keys \
         SET status = $3, content_type = $4, location = $5, body = $6 \
         WHERE key = $1 AND claim = $2";
    pub const RELEASE: &str =
        "DELETE FROM idempotency_keys WHERE key = $1 AND claim = $2 AND status IS NULL";
    pub const PURGE: &str = "DELETE FROM idempotency_keys WHERE expires_at <= $1";

    /// The statement in SQLite's spelling of numbered parameters.
    pub fn sqlite(statement: &str) -> String {
        statement.replace('$', "?")
    }
}

/// Implements [`IdempotencyKeys`] over a sqlx pool; `$sql` maps a statement to the backend's
/// spelling.
macro_rules! idempotency_keys_over_pool {
    ($store:ty, $sql:expr) => {
        #[async_trait::async_trait]
        impl $crate::store::keys::IdempotencyKeys for $store {
            async fn claim_key(
                &self,
                claim: &$crate::store::keys::KeyClaim<'_>,
            ) -> $crate::store::StoreResult<Option<$crate::store::keys::KeyRecord>> {
                use sqlx::Row;
                use $crate::store::keys::sql;
                let q = $sql;
                // A key freed between the insert and the read is tried again.
                for _ in 0..3 {
                    sqlx::query(&q(sql::CLEAR))
                        .bind(claim.key)
                        .bind(claim.now)
                        .execute(&self.pool)
                        .await?;
                    let inserted = sqlx::query(&q(sql::INSERT))
                        .bind(claim.key)
                        .bind(claim.fingerprint)
                        .bind(claim.claim)
                        .bind(claim.claimed_until)
                        .bind(claim.now)
                        .bind(claim.expires_at)
                        .execute(&self.pool)
                        .await?;
                    if inserted.rows_affected() == 1 {
                        return Ok(None);
                    }
                    let row = sqlx::query(&q(sql::SELECT))
                        .bind(claim.key)
                        .fetch_optional(&self.pool)
                        .await?;
                    if let Some(row) = row {
                        return Ok(Some($crate::store::keys::record_of(
                            row.try_get("fingerprint")?,
                            row.try_get::<Option<i32>, _>("status")?.map(i64::from),
                            row.try_get("content_type")?,
                            row.try_get("location")?,
                            row.try_get("body")?,
                        )));
                    }
                }
                Err($crate::store::StoreError::Corrupt(format!(
                    "idempotency key {:?} keeps changing hands",
                    claim.key
                )))
            }

            async fn renew_key(
                &self,
                key: &str,
                claim: &str,
                until: i64,
            ) -> $crate::store::StoreResult<()> {
                let q = $sql;
                sqlx::query(&q($crate::store::keys::sql::RENEW))
                    .bind(key)
                    .bind(claim)
                    .bind(until)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn answer_key(
                &self,
                key: &str,
                claim: &str,
                response: &$crate::store::keys::StoredResponse,
            ) -> $crate::store::StoreResult<()> {
                let q = $sql;
                sqlx::query(&q($crate::store::keys::sql::ANSWER))
                    .bind(key)
                    .bind(claim)
                    .bind(i32::from(response.status))
                    .bind(response.content_type.as_deref())
                    .bind(response.location.as_deref())
                    .bind(response.body.as_slice())
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn release_key(&self, key: &str, claim: &str) -> $crate::store::StoreResult<()> {
                let q = $sql;
                sqlx::query(&q($crate::store::keys::sql::RELEASE))
                    .bind(key)
                    .bind(claim)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn purge_keys(&self, now: i64) -> $crate::store::StoreResult<u64> {
                let q = $sql;
                let done = sqlx::query(&q($crate::store::keys::sql::PURGE))
                    .bind(now)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected())
            }
        }
    };
}
pub(super) use idempotency_keys_over_pool;
