//! [`Vaults`]: a tenant's secrets over the store, sealed on the way in and opened only to
//! substitute a reference. It remembers, per tenant, every value it handed out, so that
//! [`Vaults::redact`] can take them back out of what tools return.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::cipher::{MasterKey, Sealed};
use super::redact::Redactions;
use super::reference::{self, valid_name, MalformedRef, SecretRef, SubstituteError};
use crate::store::vaults::{SecretRow, VaultStore};
use crate::store::{Store, StoreError};

/// The largest value a secret may have.
pub const MAX_VALUE_BYTES: usize = 64 * 1024;

/// Why a vault operation failed. No message ever holds a value.
#[derive(Debug, thiserror::Error)]
pub enum VaultError {
    #[error("vaults are disabled: start the server with --master-key-env NAME")]
    Disabled,
    #[error(
        "{what} {0:?} is not a name: 1 to 128 of A-Z a-z 0-9 _ . -",
        what = .1
    )]
    BadName(String, &'static str),
    #[error("a secret's value may have at most {MAX_VALUE_BYTES} bytes")]
    TooLarge,
    #[error(transparent)]
    Malformed(#[from] MalformedRef),
    #[error("the secret ${{vault:{0}}} does not exist")]
    Missing(SecretRef),
    #[error(
        "the secret ${{vault:{0}}} does not open under this master key (another key sealed it, \
         or its row was altered)"
    )]
    Unreadable(SecretRef),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Takes one tenant's handed-out values out of a text (`None`: it holds none).
pub type TenantRedactor = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// A secret as answered: where it is and when it was written, never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SecretInfo {
    pub vault: String,
    pub name: String,
    pub updated_at: DateTime<Utc>,
}

/// The vaults of every tenant.
#[derive(Clone)]
pub struct Vaults {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn Store>,
    key: Option<MasterKey>,
    redactions: Redactions,
}

impl std::fmt::Debug for Vaults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vaults")
            .field("enabled", &self.enabled())
            .finish_non_exhaustive()
    }
}

/// Where a value is sealed: its associated data.
fn place(tenant: &str, secret: &SecretRef) -> String {
    format!("{tenant}/{}/{}", secret.vault, secret.name)
}

impl Vaults {
    /// The vaults over `store`; without a key every operation is [`VaultError::Disabled`].
    pub fn new(store: Arc<dyn Store>, key: Option<MasterKey>) -> Vaults {
        Vaults {
            inner: Arc::new(Inner {
                store,
                key,
                redactions: Redactions::default(),
            }),
        }
    }

    pub fn enabled(&self) -> bool {
        self.inner.key.is_some()
    }

    fn key(&self) -> Result<&MasterKey, VaultError> {
        self.inner.key.as_ref().ok_or(VaultError::Disabled)
    }

    fn table(&self) -> Result<&dyn VaultStore, VaultError> {
        self.inner
            .store
            .vaults()
            .ok_or_else(|| StoreError::Unusable("this store keeps no vaults".into()).into())
    }

    /// Checks a vault's and a secret's names.
    pub fn secret_ref(vault: &str, name: &str) -> Result<SecretRef, VaultError> {
        if !valid_name(vault) {
            return Err(VaultError::BadName(vault.to_string(), "vault"));
        }
        if !valid_name(name) {
            return Err(VaultError::BadName(name.to_string(), "secret"));
        }
        Ok(SecretRef {
            vault: vault.to_string(),
            name: name.to_string(),
        })
    }

    /// Writes a secret (replacing one of the same name).
    pub async fn put(
        &self,
        tenant: &str,
        secret: &SecretRef,
        value: &str,
    ) -> Result<SecretInfo, VaultError> {
        let key = self.key()?;
        if value.len() > MAX_VALUE_BYTES {
            return Err(VaultError::TooLarge);
        }
        let Sealed { nonce, ciphertext } = key.seal(&place(tenant, secret), value.as_bytes());
        let row = SecretRow {
            tenant: tenant.to_string(),
            vault: secret.vault.clone(),
            name: secret.name.clone(),
            nonce,
            ciphertext,
            updated_at: crate::model::now(),
        };
        self.table()?.put_secret(&row).await?;
        Ok(SecretInfo {
            vault: row.vault,
            name: row.name,
            updated_at: row.updated_at,
        })
    }

    /// The secrets of a vault, by name.
    pub async fn list(&self, tenant: &str, vault: &str) -> Result<Vec<SecretInfo>, VaultError> {
        self.key()?;
        if !valid_name(vault) {
            return Err(VaultError::BadName(vault.to_string(), "vault"));
        }
        let listed = self.table()?.secrets(tenant, vault).await?;
        Ok(listed
            .into_iter()
            .map(|s| SecretInfo {
                vault: vault.to_string(),
                name: s.name,
                updated_at: s.updated_at,
            })
            .collect())
    }

    /// Deletes a secret; whether there was one.
    pub async fn delete(&self, tenant: &str, secret: &SecretRef) -> Result<bool, VaultError> {
        self.key()?;
        Ok(self
            .table()?
            .delete_secret(tenant, &secret.vault, &secret.name)
            .await?)
    }

    /// One secret's value, remembered for redaction.
    async fn value(&self, tenant: &str, secret: &SecretRef) -> Result<String, VaultError> {
        let key = self.key()?;
        let row = self
            .table()?
            .secret(tenant, &secret.vault, &secret.name)
            .await?
            .ok_or_else(|| VaultError::Missing(secret.clone()))?;
        let sealed = Sealed {
            nonce: row.nonce,
            ciphertext: row.ciphertext,
        };
        let bytes = key
            .open(&place(tenant, secret), &sealed)
            .ok_or_else(|| VaultError::Unreadable(secret.clone()))?;
        let value = String::from_utf8(bytes).map_err(|_| VaultError::Unreadable(secret.clone()))?;
        self.inner.redactions.remember(tenant, secret, &value);
        Ok(value)
    }

    /// `text` with its references replaced by the tenant's values. Text without a reference
    /// comes back as it is, and needs no key.
    pub async fn resolve(&self, tenant: &str, text: &str) -> Result<String, VaultError> {
        if !reference::mentions(text) {
            return Ok(text.to_string());
        }
        let mut values = HashMap::new();
        for secret in reference::references(text)? {
            if let std::collections::hash_map::Entry::Vacant(slot) = values.entry(secret) {
                let value = self.value(tenant, slot.key()).await?;
                slot.insert(value);
            }
        }
        reference::substitute(text, |secret| {
            values
                .get(secret)
                .cloned()
                .ok_or_else(|| VaultError::Missing(secret.clone()))
        })
        .map_err(|e| match e {
            SubstituteError::Malformed(e) => VaultError::Malformed(e),
            SubstituteError::Value(e) => e,
        })
    }

    /// `text` with every value handed out for `tenant` replaced by `[secret VAULT/NAME]`;
    /// `None` when it holds none.
    pub fn redact(&self, tenant: &str, text: &str) -> Option<String> {
        self.inner.redactions.redact(tenant, text)
    }

    /// [`Vaults::redact`] for one tenant, as a function (values handed out later are taken
    /// out too).
    pub fn redactor(&self, tenant: &str) -> TenantRedactor {
        let redactions = self.inner.redactions.clone();
        let tenant = tenant.to_string();
        Arc::new(move |text: &str| redactions.redact(&tenant, text))
    }
}
