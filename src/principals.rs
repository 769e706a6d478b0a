//! Keys and session tokens (SPEC §17): made, listed, revoked, and resolved to the
//! [`Principal`] a request acts as. Both are 32 random bytes in hex behind a prefix (`tah_` for
//! a key, `tahs_` for a session token); the store keeps only their SHA-256, so reading the
//! database gives no credential. The HTTP layer and `tah keys` share this.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use rand::RngCore;
use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::model::{valid_tenant, Principal, SessionId, TenantRole, TokenScope, DEFAULT_TENANT};
use crate::store::principals::{KeyRow, PrincipalStore, SessionTokenRow};
use crate::store::{Store, StoreError};

/// What a key starts with.
pub const KEY_PREFIX: &str = "tah_";
/// What a session token starts with.
pub const SESSION_TOKEN_PREFIX: &str = "tahs_";
/// The longest a session token lives, in seconds (a day).
pub const MAX_TOKEN_TTL_S: u64 = 86_400;
/// How long a session token lives unless asked otherwise, in seconds.
pub const DEFAULT_TOKEN_TTL_S: u64 = 3_600;
/// The longest key name, in characters.
const MAX_KEY_NAME_CHARS: usize = 200;

/// A key as listed: never the key itself.
#[derive(Debug, Clone, Serialize)]
pub struct KeyView {
    pub id: String,
    pub tenant: String,
    pub role: TenantRole,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// A new key: its view and, this once, the key.
#[derive(Debug, Clone, Serialize)]
pub struct NewKey {
    #[serde(flatten)]
    pub view: KeyView,
    pub key: String,
}

/// A new session token.
#[derive(Debug, Clone, Serialize)]
pub struct NewSessionToken {
    pub token: String,
    pub session_id: SessionId,
    pub scope: TokenScope,
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

/// Why a credential was not accepted, or a request about keys refused.
#[derive(Debug, thiserror::Error)]
pub enum PrincipalError {
    /// The credential names no principal (unknown, revoked).
    #[error("{0}")]
    Unknown(&'static str),
    /// A session token that expired.
    #[error("the session token expired: ask for a new one")]
    Expired,
    /// A bad value in a request (a `400`).
    #[error("{0}")]
    BadInput(String),
    /// The principal may not do this (a `403`).
    #[error("{0}")]
    Forbidden(String),
    /// No such key (or another tenant's).
    #[error("key not found")]
    NotFound,
    /// The store keeps no keys (a store without server tables).
    #[error("this server's store keeps no keys")]
    Unavailable,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The keys and session tokens of a store.
#[derive(Clone)]
pub struct Principals {
    store: Arc<dyn Store>,
    /// Whether a key that is not revoked exists, as last seen, and when (Unix ms).
    live_keys: Arc<(AtomicBool, AtomicI64)>,
}

/// How long whether any key exists is trusted before it is read again (another replica may
/// have made or revoked one), in milliseconds.
const LIVE_KEYS_TTL_MS: i64 = 5_000;

impl Principals {
    pub fn new(store: Arc<dyn Store>) -> Principals {
        Principals {
            store,
            live_keys: Arc::new((AtomicBool::new(false), AtomicI64::new(i64::MIN))),
        }
    }

    fn table(&self) -> Result<&dyn PrincipalStore, PrincipalError> {
        self.store.principals().ok_or(PrincipalError::Unavailable)
    }

    /// Makes a key for `tenant` in `role`; the key is in the answer and nowhere else.
    pub async fn create_key(
        &self,
        tenant: &str,
        role: TenantRole,
        name: Option<String>,
    ) -> Result<NewKey, PrincipalError> {
        if !valid_tenant(tenant) {
            return Err(PrincipalError::BadInput(format!(
                "tenant {tenant:?} is not a valid tenant name: 1 to 128 of A-Z a-z 0-9 - _ ."
            )));
        }
        if let Some(name) = &name {
            if name.trim().is_empty() || name.chars().count() > MAX_KEY_NAME_CHARS {
                return Err(PrincipalError::BadInput(format!(
                    "name must be 1 to {MAX_KEY_NAME_CHARS} characters"
                )));
            }
        }
        let key = new_secret(KEY_PREFIX);
        let now = crate::model::now();
        let row = KeyRow {
            id: crate::model::new_id().to_string(),
            hash: digest(&key),
            tenant: tenant.to_string(),
            role: role.as_str().to_string(),
            name,
            created_at: now.timestamp_millis(),
            revoked_at: None,
        };
        self.table()?.insert_key(&row).await?;
        self.live_keys.0.store(true, Ordering::Relaxed);
        self.live_keys.1.store(now_ms(), Ordering::Relaxed);
        Ok(NewKey {
            view: view_of(row)?,
            key,
        })
    }

    /// Keys newest first, of `tenant` or of every tenant.
    pub async fn keys(
        &self,
        tenant: Option<&str>,
        before: Option<&str>,
        limit: i64,
    ) -> Result<Vec<KeyView>, PrincipalError> {
        let rows = self.table()?.keys(tenant, before, limit).await?;
        rows.into_iter().map(view_of).collect()
    }

    /// Revokes the key `id` (only if it is `tenant`'s, when given): it is refused from now
    /// on.
    pub async fn revoke_key(&self, id: &str, tenant: Option<&str>) -> Result<(), PrincipalError> {
        match self.table()?.revoke_key(id, tenant, now_ms()).await? {
            true => {
                // Read again at the next request whether any key is left.
                self.live_keys.1.store(i64::MIN, Ordering::Relaxed);
                Ok(())
            }
            false => Err(PrincipalError::NotFound),
        }
    }

    /// Whether any key that is not revoked exists (read at most every few seconds).
    pub async fn any_live_key(&self) -> bool {
        let now = now_ms();
        let (live, read_at) = &*self.live_keys;
        if now.saturating_sub(read_at.load(Ordering::Relaxed)) < LIVE_KEYS_TTL_MS {
            return live.load(Ordering::Relaxed);
        }
        let Ok(table) = self.table() else {
            return false;
        };
        match table.any_live_key().await {
            Ok(any) => {
                live.store(any, Ordering::Relaxed);
                read_at.store(now, Ordering::Relaxed);
                any
            }
            Err(error) => {
                tracing::warn!(%error, "cannot read whether any API key exists");
                // Failing closed: a server that had keys keeps requiring them.
                live.load(Ordering::Relaxed)
            }
        }
    }

    /// The principal of a key, unless it is unknown or revoked.
    pub async fn key_principal(&self, key: &str) -> Result<Principal, PrincipalError> {
        let row = self.table()?.key_by_hash(&digest(key)).await?;
        principal_of_key(row)
    }

    /// The principal of the key `id`, unless it is unknown or revoked (a sign-in made with
    /// it).
    pub async fn key_principal_by_id(&self, id: &str) -> Result<Principal, PrincipalError> {
        principal_of_key(self.table()?.key(id).await?)
    }

    /// Makes a session token for `session` (of `tenant`), made by `issuer`.
    pub async fn create_session_token(
        &self,
        session: SessionId,
        tenant: &str,
        issuer: &str,
        scope: TokenScope,
        ttl_s: u64,
    ) -> Result<NewSessionToken, PrincipalError> {
        if !(1..=MAX_TOKEN_TTL_S).contains(&ttl_s) {
            return Err(PrincipalError::BadInput(format!(
                "ttl_s must be 1 to {MAX_TOKEN_TTL_S} seconds"
            )));
        }
        let token = new_secret(SESSION_TOKEN_PREFIX);
        let now = now_ms();
        let expires_at = now + (ttl_s as i64) * 1000;
        let table = self.table()?;
        table
            .insert_session_token(&SessionTokenRow {
                hash: digest(&token),
                session_id: session.to_string(),
                scope: scope.as_str().to_string(),
                tenant: tenant.to_string(),
                issuer: issuer.to_string(),
                created_at: now,
                expires_at,
            })
            .await?;
        // Tokens expired an hour ago are of no use even for saying "expired".
        if let Err(error) = table.purge_session_tokens(now - 3_600_000).await {
            tracing::warn!(%error, "cannot forget expired session tokens");
        }
        Ok(NewSessionToken {
            token,
            session_id: session,
            scope,
            expires_at: time_of(expires_at)?,
        })
    }

    /// The principal of a session token, unless it is unknown or expired.
    pub async fn session_token_principal(&self, token: &str) -> Result<Principal, PrincipalError> {
        let row = self
            .table()?
            .session_token(&digest(token))
            .await?
            .ok_or(PrincipalError::Unknown("the session token is not valid"))?;
        if row.expires_at <= now_ms() {
            return Err(PrincipalError::Expired);
        }
        let corrupt = |what: &str| StoreError::Corrupt(format!("session token: {what}"));
        Ok(Principal::Session {
            session: row.session_id.parse().map_err(|_| corrupt("session id"))?,
            scope: TokenScope::parse(&row.scope).ok_or_else(|| corrupt("scope"))?,
            tenant: row.tenant,
            issuer: row.issuer,
        })
    }

    /// The principal a bearer credential of tah's own kinds names: `None` when it is neither
    /// a key nor a session token by its prefix.
    pub async fn resolve(&self, credential: &str) -> Option<Result<Principal, PrincipalError>> {
        if credential.starts_with(SESSION_TOKEN_PREFIX) {
            Some(self.session_token_principal(credential).await)
        } else if credential.starts_with(KEY_PREFIX) {
            Some(self.key_principal(credential).await)
        } else {
            None
        }
    }
}

/// The principal of a key's row, unless there is none or it was revoked.
fn principal_of_key(row: Option<KeyRow>) -> Result<Principal, PrincipalError> {
    let row = row.ok_or(PrincipalError::Unknown("the API key is not valid"))?;
    if row.revoked_at.is_some() {
        return Err(PrincipalError::Unknown("the API key was revoked"));
    }
    let role = row
        .role
        .parse()
        .map_err(|_| StoreError::Corrupt(format!("key {}: role {:?}", row.id, row.role)))?;
    Ok(Principal::Member {
        id: row.id,
        tenant: row.tenant,
        role,
    })
}

/// The tenant a request names for a key: an operator's choice (default `default`), or the
/// admin's own tenant; another tenant is refused.
pub fn key_tenant(principal: &Principal, asked: Option<&str>) -> Result<String, PrincipalError> {
    match (principal.tenant(), asked) {
        (None, asked) => Ok(asked.unwrap_or(DEFAULT_TENANT).to_string()),
        (Some(own), None) => Ok(own.to_string()),
        (Some(own), Some(asked)) if own == asked => Ok(own.to_string()),
        (Some(_), Some(_)) => Err(PrincipalError::Forbidden(
            "an admin makes keys for its own tenant only".into(),
        )),
    }
}

/// `prefix` + 32 random bytes from the operating system, in lower-case hex.
fn new_secret(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let mut secret = String::with_capacity(prefix.len() + 64);
    secret.push_str(prefix);
    for b in bytes {
        secret.push_str(&format!("{b:02x}"));
    }
    secret
}

/// What the store knows a credential by: its SHA-256, in hex.
fn digest(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn time_of(ms: i64) -> Result<chrono::DateTime<chrono::Utc>, PrincipalError> {
    chrono::DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| StoreError::Corrupt(format!("a time: {ms}")).into())
}

fn view_of(row: KeyRow) -> Result<KeyView, PrincipalError> {
    let role = row
        .role
        .parse()
        .map_err(|_| StoreError::Corrupt(format!("key {}: role {:?}", row.id, row.role)))?;
    Ok(KeyView {
        id: row.id,
        tenant: row.tenant,
        role,
        name: row.name,
        created_at: time_of(row.created_at)?,
        revoked_at: row.revoked_at.map(time_of).transpose()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_prefixed_hex_and_stored_as_a_digest() {
        let key = new_secret(KEY_PREFIX);
        assert_eq!(key.len(), 4 + 64);
        assert!(key[4..].bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(key, new_secret(KEY_PREFIX));
        assert_eq!(digest(&key).len(), 64);
        assert!(!digest(&key).contains(&key[4..]));
    }

    #[test]
    fn admins_make_keys_for_their_own_tenant_only() {
        let admin = Principal::Member {
            id: "k".into(),
            tenant: "acme".into(),
            role: TenantRole::Admin,
        };
        assert_eq!(key_tenant(&admin, None).unwrap(), "acme");
        assert_eq!(key_tenant(&admin, Some("acme")).unwrap(), "acme");
        assert!(key_tenant(&admin, Some("other")).is_err());
        assert_eq!(key_tenant(&Principal::Operator, None).unwrap(), "default");
        assert_eq!(key_tenant(&Principal::Operator, Some("b")).unwrap(), "b");
    }
}
