//! Vaults: write-only secrets of a tenant, sealed at rest under the master key
//! (`--master-key-env`), and referenced as `${vault:VAULT/NAME}` where a configuration needs
//! one.
//!
//! - `cipher`: the [`MasterKey`] and how one value is sealed (XChaCha20-Poly1305, a nonce per
//!   value, the value's place as associated data).
//! - `reference`: finding, checking and substituting references.
//!
//! No value ever leaves this module except to the one consumer that asked for it by reference.

mod cipher;
pub mod reference;

pub use cipher::{MasterKey, MasterKeyError, Sealed, NONCE_BYTES};
pub use reference::{MalformedRef, SecretRef};
