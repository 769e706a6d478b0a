//! Vaults: write-only secrets of a tenant, sealed at rest under the master key
//! (`--master-key-env`), and referenced as `${vault:VAULT/NAME}` where a configuration needs
//! one.
//!
//! - `cipher`: the [`MasterKey`] and how one value is sealed (XChaCha20-Poly1305, a nonce per
//!   value, the value's place as associated data).
//! - `reference`: finding, checking and substituting references.
//! - `vaults`: [`Vaults`], the secrets of every tenant over the store: written sealed,
//!   listed by name, deleted, and opened only to resolve a reference.
//! - `redact`: the values handed out per tenant, and replacing them in a tool's output by
//!   `[secret VAULT/NAME]`.
//!
//! No value ever leaves this module except to the one consumer that asked for it by reference.

mod cipher;
mod redact;
pub mod reference;
mod vaults;

pub use cipher::{MasterKey, MasterKeyError, Sealed, NONCE_BYTES};
pub use reference::{MalformedRef, SecretRef};
pub use vaults::{SecretInfo, TenantRedactor, VaultError, Vaults, MAX_VALUE_BYTES};
