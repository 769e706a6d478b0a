//! Sign-ins of the built-in page as stored (`migrations/*/*_sign_ins.sql`): a row per sign-in
//! cookie, found by a hash of the cookie's value, tied to the API token it was traded for, until
//! it expires or is deleted. The HTTP layer (`http::auth`) decides what the values are and
//! what they mean; this is only the table, with the same semantics on both backends.

use async_trait::async_trait;

use super::StoreResult;

/// A sign-in to record. Times are Unix milliseconds.
#[derive(Debug, Clone)]
pub struct NewSignIn<'a> {
    /// Names the sign-in: a hash of its cookie's value.
    pub id: &'a str,
    /// Which API token it was traded for, as the HTTP layer can check it again.
    pub token_binding: &'a str,
    pub created_at: i64,
    pub expires_at: i64,
}

#[async_trait]
pub trait SignIns: Send + Sync {
    async fn insert_sign_in(&self, sign_in: &NewSignIn<'_>) -> StoreResult<()>;
    /// The token binding of the sign-in `id`, unless there is none or it expired by `now`.
    async fn sign_in(&self, id: &str, now: i64) -> StoreResult<Option<String>>;
    /// Deletes the sign-in `id`; whether there was one.
    async fn delete_sign_in(&self, id: &str) -> StoreResult<bool>;
    /// Forgets the sign-ins that expired by `now`.
    async fn purge_sign_ins(&self, now: i64) -> StoreResult<u64>;
}

/// The statements, written for PostgreSQL (`$n`); SQLite takes the same as `?n`.
pub(super) mod sql {
    pub const INSERT: &str =
        "INSERT INTO sign_ins (id, token_binding, created_at, expires_at) VALUES ($1, $2, $3, $4)";
    pub const SELECT: &str = "SELECT token_binding FROM sign_ins WHERE id = $1 AND expires_at > $2";
    pub const DELETE: &str = "DELETE FROM sign_ins WHERE id = $1";
    pub const PURGE: &str = "DELETE FROM sign_ins WHERE expires_at <= $1";
}

/// Implements [`SignIns`] over a sqlx pool; `$sql` maps a statement to the backend's spelling.
macro_rules! sign_ins_over_pool {
    ($store:ty, $sql:expr) => {
        #[async_trait::async_trait]
        impl $crate::store::sign_ins::SignIns for $store {
            async fn insert_sign_in(
                &self,
                sign_in: &$crate::store::sign_ins::NewSignIn<'_>,
            ) -> $crate::store::StoreResult<()> {
                let q = $sql;
                sqlx::query(&q($crate::store::sign_ins::sql::INSERT))
                    .bind(sign_in.id)
                    .bind(sign_in.token_binding)
                    .bind(sign_in.created_at)
                    .bind(sign_in.expires_at)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn sign_in(
                &self,
                id: &str,
                now: i64,
            ) -> $crate::store::StoreResult<Option<String>> {
                let q = $sql;
                let binding = sqlx::query_scalar(&q($crate::store::sign_ins::sql::SELECT))
                    .bind(id)
                    .bind(now)
                    .fetch_optional(&self.pool)
                    .await?;
                Ok(binding)
            }

            async fn delete_sign_in(&self, id: &str) -> $crate::store::StoreResult<bool> {
                let q = $sql;
                let done = sqlx::query(&q($crate::store::sign_ins::sql::DELETE))
                    .bind(id)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn purge_sign_ins(&self, now: i64) -> $crate::store::StoreResult<u64> {
                let q = $sql;
                let done = sqlx::query(&q($crate::store::sign_ins::sql::PURGE))
                    .bind(now)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected())
            }
        }
    };
}
pub(super) use sign_ins_over_pool;
