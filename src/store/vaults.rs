//! Vault secrets as stored (`migrations/*/*_vaults.sql`): a row per secret, keyed by tenant,
//! vault and name, holding only what the vault layer sealed (a nonce and a ciphertext) and
//! when it was last written. Times are Unix microseconds on both backends, so one set of
//! statements serves both. The store never sees a value; sealing and opening belong to
//! `crate::vault`.

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::{StoreError, StoreResult};

/// A secret's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRow {
    pub tenant: String,
    pub vault: String,
    pub name: String,
    pub nonce: Vec<u8>,
    pub ciphertext: Vec<u8>,
    pub updated_at: DateTime<Utc>,
}

/// A secret as listed: its name and when it was last written, never its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretListing {
    pub name: String,
    pub updated_at: DateTime<Utc>,
}

#[async_trait]
pub trait VaultStore: Send + Sync {
    /// Writes a secret, replacing the one of the same tenant, vault and name.
    async fn put_secret(&self, secret: &SecretRow) -> StoreResult<()>;
    /// One secret's row.
    async fn secret(&self, tenant: &str, vault: &str, name: &str)
        -> StoreResult<Option<SecretRow>>;
    /// The secrets of a vault, by name.
    async fn secrets(&self, tenant: &str, vault: &str) -> StoreResult<Vec<SecretListing>>;
    /// Deletes a secret; whether there was one.
    async fn delete_secret(&self, tenant: &str, vault: &str, name: &str) -> StoreResult<bool>;
}

/// The statements, written for PostgreSQL (`$n`); SQLite takes the same as `?n`.
pub(super) mod sql {
    pub const PUT: &str = "INSERT INTO vault_secrets \
                           (tenant, vault, name, nonce, ciphertext, updated_at) \
                           VALUES ($1, $2, $3, $4, $5, $6) \
                           ON CONFLICT (tenant, vault, name) DO UPDATE SET \
                           nonce = excluded.nonce, ciphertext = excluded.ciphertext, \
                           updated_at = excluded.updated_at";
    pub const ONE: &str = "SELECT nonce, ciphertext, updated_at FROM vault_secrets \
                           WHERE tenant = $1 AND vault = $2 AND name = $3";
    pub const LIST: &str = "SELECT name, updated_at FROM vault_secrets \
                            WHERE tenant = $1 AND vault = $2 ORDER BY name";
    pub const DELETE: &str =
        "DELETE FROM vault_secrets WHERE tenant = $1 AND vault = $2 AND name = $3";
}

/// A time as the table keeps it, back.
pub(super) fn time_of(micros: i64, what: &str) -> StoreResult<DateTime<Utc>> {
    DateTime::from_timestamp_micros(micros)
        .ok_or_else(|| StoreError::Corrupt(format!("vault secret {what}: its time")))
}

/// Implements [`VaultStore`] over a sqlx pool; `$sql` maps a statement to the backend's
/// spelling.
macro_rules! vaults_over_pool {
    ($store:ty, $sql:expr) => {
        #[async_trait::async_trait]
        impl $crate::store::vaults::VaultStore for $store {
            async fn put_secret(
                &self,
                secret: &$crate::store::vaults::SecretRow,
            ) -> $crate::store::StoreResult<()> {
                let q = $sql;
                sqlx::query(&q($crate::store::vaults::sql::PUT))
                    .bind(&secret.tenant)
                    .bind(&secret.vault)
                    .bind(&secret.name)
                    .bind(&secret.nonce)
                    .bind(&secret.ciphertext)
                    .bind(secret.updated_at.timestamp_micros())
                    .execute(&self.pool)
                    .await?;
                Ok(())
            }

            async fn secret(
                &self,
                tenant: &str,
                vault: &str,
                name: &str,
            ) -> $crate::store::StoreResult<Option<$crate::store::vaults::SecretRow>> {
                let q = $sql;
                let row: Option<(Vec<u8>, Vec<u8>, i64)> =
                    sqlx::query_as(&q($crate::store::vaults::sql::ONE))
                        .bind(tenant)
                        .bind(vault)
                        .bind(name)
                        .fetch_optional(&self.pool)
                        .await?;
                row.map(|(nonce, ciphertext, updated_at)| {
                    Ok($crate::store::vaults::SecretRow {
                        tenant: tenant.to_string(),
                        vault: vault.to_string(),
                        name: name.to_string(),
                        nonce,
                        ciphertext,
                        updated_at: $crate::store::vaults::time_of(updated_at, name)?,
                    })
                })
                .transpose()
            }

            async fn secrets(
                &self,
                tenant: &str,
                vault: &str,
            ) -> $crate::store::StoreResult<Vec<$crate::store::vaults::SecretListing>> {
                let q = $sql;
                let rows: Vec<(String, i64)> = sqlx::query_as(&q($crate::store::vaults::sql::LIST))
                    .bind(tenant)
                    .bind(vault)
                    .fetch_all(&self.pool)
                    .await?;
                rows.into_iter()
                    .map(|(name, updated_at)| {
                        Ok($crate::store::vaults::SecretListing {
                            updated_at: $crate::store::vaults::time_of(updated_at, &name)?,
                            name,
                        })
                    })
                    .collect()
            }

            async fn delete_secret(
                &self,
                tenant: &str,
                vault: &str,
                name: &str,
            ) -> $crate::store::StoreResult<bool> {
                let q = $sql;
                let done = sqlx::query(&q($crate::store::vaults::sql::DELETE))
                    .bind(tenant)
                    .bind(vault)
                    .bind(name)
                    .execute(&self.pool)
                    .await?;
                Ok(done.rows_affected() > 0)
            }
        }
    };
}
pub(super) use vaults_over_pool;
