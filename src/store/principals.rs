//! API keys and session tokens as stored (`migrations/*/*_principals.sql`). Both are found by
//! the SHA-256 of their value, which is never stored. The HTTP layer decides what a credential
//! is and what it may reach (`model::Principal`); this is only the tables, with the same
//! statements on both backends (ids as text, times as Unix milliseconds).

use async_trait::async_trait;

use super::StoreResult;

/// A key as stored (never the key itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRow {
    pub id: String,
    pub hash: String,
    pub tenant: String,
    pub role: String,
    pub name: Option<String>,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// A session token as stored (never the token itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionTokenRow {
    pub hash: String,
    pub session_id: String,
    pub scope: String,
    pub tenant: String,
    pub issuer: String,
    pub created_at: i64,
    pub expires_at: i64,
}

#[async_trait]
pub trait PrincipalStore: Send + Sync {
    async fn insert_key(&self, key: &KeyRow) -> StoreResult<()>;
    /// The key `id`, revoked or not.
    async fn key(&self, id: &str) -> StoreResult<Option<KeyRow>>;
    /// The key whose value hashes to `hash`, revoked or not.
    async fn key_by_hash(&self, hash: &str) -> StoreResult<Option<KeyRow>>;
    /// Keys (revoked ones too) with `id < before`, newest first, of one tenant or of all.
    async fn keys(
        &self,
        tenant: Option<&str>,
        before: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<KeyRow>>;
    /// Revokes the key `id` (of `tenant`, when given) at `at`; whether a key that was not
    /// revoked was found.
    async fn revoke_key(&self, id: &str, tenant: Option<&str>, at: i64) -> StoreResult<bool>;
    /// Whether any key has not been revoked.
    async fn any_live_key(&self) -> StoreResult<bool>;

    async fn insert_session_token(&self, token: &SessionTokenRow) -> StoreResult<()>;
    /// The session token whose value hashes to `hash`, expired or not.
    async fn session_token(&self, hash: &str) -> StoreResult<Option<SessionTokenRow>>;
    /// Forgets the session tokens that expired before `before`.
    async fn purge_session_tokens(&self, before: i64) -> StoreResult<u64>;
}

/// The statements, written for PostgreSQL (`$n`); SQLite takes the same as `?n`.
pub(super) mod sql {
    pub const INSERT_KEY: &str = "INSERT INTO api_keys (id, hash, tenant, role, name, created_at) \
                                  VALUES ($1, $2, $3, $4, $5, $6)";
    pub const KEY: &str = "SELECT id, hash, tenant, role, name, created_at, revoked_at \
                           FROM api_keys WHERE id = $1";
    pub const KEY_BY_HASH: &str = "SELECT id, hash, tenant, role, name, created_at, revoked_at \
                                   FROM api_keys WHERE hash = $1";
    /// `$1`: tenant or NULL for all; `$2`: the cursor (every id sorts below `~`).
    pub const KEYS: &str = "SELECT id, hash, tenant, role, name, created_at, revoked_at \
                            FROM api_keys WHERE ($1 IS NULL OR tenant = $1) AND id < $2 \
                            ORDER BY id DESC LIMIT $3";
    pub const REVOKE_KEY: &str = "UPDATE api_keys SET revoked_at = $3 WHERE id = $1 \
                                  AND ($2 IS NULL OR tenant = $2) AND revoked_at IS NULL";
    pub const ANY_LIVE_KEY: &str = "SELECT id FROM api_keys WHERE revoked_at IS NULL LIMIT 1";
    pub const INSERT_TOKEN: &str = "INSERT INTO session_tokens (hash, session_id, scope, tenant, \
                                    issuer, created_at, expires_at) \
                                    VALUES ($1, $2, $3, $4, $5, $6, $7)";
    pub const TOKEN: &str = "SELECT hash, session_id, scope, tenant, issuer, created_at, \
                             expires_at FROM session_tokens WHERE hash = $1";
    pub const PURGE_TOKENS: &str = "DELETE FROM session_tokens WHERE expires_at < $1";
}

/// A key's row, in the order the key statements read it.
pub(super) type KeyTuple = (
    String,
    String,
    String,
    String,
    Option<String>,
    i64,
    Option<i64>,
);

pub(super) fn key_of(row: KeyTuple) -> KeyRow {
    let (id, hash, tenant, role, name, created_at, revoked_at) = row;
    KeyRow {
        id,
        hash,
        tenant,
        role,
        name,
        created_at,
        revoked_at,
    }
}

/// A session token's row, in [`sql::TOKEN`]'s order.
pub(super) type TokenTuple = (String, String, String, String, String, i64, i64);

pub(super) fn token_of(row: TokenTuple) -> SessionTokenRow {
    let (hash, session_id, scope, tenant, issuer, created_at, expires_at) = row;
    SessionTokenRow {
        hash,
        session_id,
        scope,
        tenant,
        issuer,
        created_at,
        expires_at,
    }
}

/// Implements [`PrincipalStore`] over a sqlx pool; `$sql` maps a statement to the backend's
/// spelling.
macro_rules! principals_over_pool {
    ($store:ty, $sql:expr) => {
        #[async_trait::async_trait]
        impl $crate::store::principals::PrincipalStore for $store {
            async fn insert_key(
                &self,
                key: &$crate::store::principals::KeyRow,
            ) -> $crate::store::StoreResult<()> {
                let q = $sql;
                sqlx::query(&q($crate::store::principals::sql::INSERT_KEY))
                    .bind(&key.id)
                    .bind(&key.hash)
                    .bind(&key.tenant)
                    .bind(&key.role)
                    .bind(&key.name)
                    .bind(key.created_at)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn key(
                &self,
                id: &str,
            ) -> $crate::store::StoreResult<Option<$crate::store::principals::KeyRow>> {
                let q = $sql;
                let row: Option<$crate::store::principals::KeyTuple> =
                    sqlx::query_as(&q($crate::store::principals::sql::KEY))
                        .bind(id)
                        .fetch_optional(&self.pool)
                        .await?;
                Ok(row.map($crate::store::principals::key_of))
            }

            async fn key_by_hash(
                &self,
                hash: &str,
            ) -> $crate::store::StoreResult<Option<$crate::store::principals::KeyRow>> {
                let q = $sql;
                let row: Option<$crate::store::principals::KeyTuple> =
                    sqlx::query_as(&q($crate::store::principals::sql::KEY_BY_HASH))
                        .bind(hash)
                        .fetch_optional(&self.pool)
                        .await?;
                Ok(row.map($crate::store::principals::key_of))
            }

            async fn keys(
                &self,
                tenant: Option<&str>,
                before: Option<&str>,
                limit: i64,
            ) -> $crate::store::StoreResult<Vec<$crate::store::principals::KeyRow>> {
                let q = $sql;
                let rows: Vec<$crate::store::principals::KeyTuple> =
                    sqlx::query_as(&q($crate::store::principals::sql::KEYS))
                        .bind(tenant)
                        .bind(before.unwrap_or("~"))
                        .bind(limit)
                        .fetch_all(&self.pool)
                        .await?;
                Ok(rows
                    .into_iter()
                    .map($crate::store::principals::key_of)
                    .collect())
            }

            async fn revoke_key(
                &self,
                id: &str,
                tenant: Option<&str>,
                at: i64,
            ) -> $crate::store::StoreResult<bool> {
                let q = $sql;
                let done = sqlx::query(&q($crate::store::principals::sql::REVOKE_KEY))
                    .bind(id)
                    .bind(tenant)
                    .bind(at)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected() > 0)
            }

            async fn any_live_key(&self) -> $crate::store::StoreResult<bool> {
                let q = $sql;
                let row: Option<String> =
                    sqlx::query_scalar(&q($crate::store::principals::sql::ANY_LIVE_KEY))
                        .fetch_optional(&self.pool)
                        .await?;
                Ok(row.is_some())
            }

            async fn insert_session_token(
                &self,
                token: &$crate::store::principals::SessionTokenRow,
            ) -> $crate::store::StoreResult<()> {
                let q = $sql;
                sqlx::query(&q($crate::store::principals::sql::INSERT_TOKEN))
                    .bind(&token.hash)
                    .bind(&token.session_id)
                    .bind(&token.scope)
                    .bind(&token.tenant)
                    .bind(&token.issuer)
                    .bind(token.created_at)
                    .bind(token.expires_at)
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn session_token(
                &self,
                hash: &str,
            ) -> $crate::store::StoreResult<Option<$crate::store::principals::SessionTokenRow>>
            {
                let q = $sql;
                let row: Option<$crate::store::principals::TokenTuple> =
                    sqlx::query_as(&q($crate::store::principals::sql::TOKEN))
                        .bind(hash)
                        .fetch_optional(&self.pool)
                        .await?;
                Ok(row.map($crate::store::principals::token_of))
            }

            async fn purge_session_tokens(&self, before: i64) -> $crate::store::StoreResult<u64> {
                let q = $sql;
                let done = sqlx::query(&q($crate::store::principals::sql::PURGE_TOKENS))
                    .bind(before)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected())
            }
        }
    };
}
pub(super) use principals_over_pool;
