//! The master key and the sealing of one value under it: XChaCha20-Poly1305 with a random
//! 24-byte nonce per value, stored beside the ciphertext, and the value's place
//! (`tenant/vault/name`) as associated data, so that a row copied to another name or tenant
//! does not open.

use std::fmt;

use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{Key, XChaCha20Poly1305, XNonce};
use rand::RngCore;

/// The length of a nonce, stored beside each ciphertext.
pub const NONCE_BYTES: usize = 24;

/// Why a master key was refused. The messages never quote the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MasterKeyError {
    #[error("the environment variable {0} is not set")]
    Unset(String),
    #[error(
        "the key in {name} is unusable: {reason}; give 32 bytes as 64 hex characters or as \
         base64 (standard or URL-safe)"
    )]
    Invalid { name: String, reason: &'static str },
}

/// The key every secret is sealed under (32 bytes).
#[derive(Clone)]
pub struct MasterKey(Key);

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MasterKey(<redacted>)")
    }
}

impl MasterKey {
    /// The key in the environment variable `name`.
    pub fn from_env(name: &str) -> Result<MasterKey, MasterKeyError> {
        let value = std::env::var(name)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .ok_or_else(|| MasterKeyError::Unset(name.to_string()))?;
        MasterKey::parse(&value).map_err(|reason| MasterKeyError::Invalid {
            name: name.to_string(),
            reason,
        })
    }

    /// 32 bytes as 64 hex characters, or as standard or URL-safe base64 (padded or not).
    pub fn parse(text: &str) -> Result<MasterKey, &'static str> {
        let text = text.trim();
        let bytes = if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            hex(text)
        } else {
            use base64::engine::general_purpose::{
                STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD,
            };
            [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
                .iter()
                .find_map(|engine| engine.decode(text).ok())
                .ok_or("it is neither 64 hex characters nor base64")?
        };
        if bytes.len() != 32 {
            return Err("it does not hold exactly 32 bytes");
        }
        Ok(MasterKey(*Key::from_slice(&bytes)))
    }

    /// Seals `value` for its place: a fresh nonce and the ciphertext (with its tag).
    pub fn seal(&self, place: &str, value: &[u8]) -> Sealed {
        let mut nonce = [0u8; NONCE_BYTES];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        let payload = Payload {
            msg: value,
            aad: place.as_bytes(),
        };
        // Encryption in memory fails only for messages beyond the cipher's limit (256 GiB).
        let ciphertext = XChaCha20Poly1305::new(&self.0)
            .encrypt(XNonce::from_slice(&nonce), payload)
            .unwrap_or_default();
        Sealed {
            nonce: nonce.to_vec(),
            ciphertext,
        }
    }

    /// Opens what [`MasterKey::seal`] sealed for `place`; `None` when the key, the place, the
    /// nonce or the ciphertext is not the one it was sealed with.
    pub fn open(&self, place: &str, sealed: &Sealed) -> Option<Vec<u8>> {
        if sealed.nonce.len() != NONCE_BYTES {
            return None;
        }
        let payload = Payload {
            msg: &sealed.ciphertext,
            aad: place.as_bytes(),
        };
        XChaCha20Poly1305::new(&self.0)
            .decrypt(XNonce::from_slice(&sealed.nonce), payload)
            .ok()
    }
}

/// A sealed value as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    pub nonce: Vec<u8>,
    pub ciphertext: Vec<u8>,
}

/// The bytes of an even-length string of hex digits (checked by the caller).
fn hex(text: &str) -> Vec<u8> {
    let digit = |b: u8| match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        _ => b - b'A' + 10,
    };
    text.as_bytes()
        .chunks(2)
        .map(|pair| digit(pair[0]) << 4 | digit(pair[1]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    fn key() -> MasterKey {
        MasterKey::parse(HEX).expect("a hex key")
    }

    #[test]
    fn a_value_opens_where_it_was_sealed() {
        let sealed = key().seal("default/prod/token", b"s3cret");
        assert_eq!(sealed.nonce.len(), NONCE_BYTES);
        assert!(!sealed
            .ciphertext
            .windows(6)
            .any(|w| w == b"s3cret".as_slice()));
        assert_eq!(
            key().open("default/prod/token", &sealed).as_deref(),
            Some(b"s3cret".as_slice())
        );
        // A nonce per value: sealing twice gives two ciphertexts.
        assert_ne!(key().seal("default/prod/token", b"s3cret"), sealed);
    }

    #[test]
    fn a_value_moved_to_another_place_does_not_open() {
        let sealed = key().seal("default/prod/token", b"s3cret");
        assert_eq!(key().open("default/prod/other", &sealed), None);
        assert_eq!(key().open("acme/prod/token", &sealed), None);
        let other = MasterKey::parse(&HEX.replace("00", "ff")).expect("a key");
        assert_eq!(other.open("default/prod/token", &sealed), None);
    }

    #[test]
    fn a_tampered_value_does_not_open() {
        let sealed = key().seal("t/v/n", b"s3cret");
        let mut flipped = sealed.clone();
        flipped.ciphertext[0] ^= 1;
        assert_eq!(key().open("t/v/n", &flipped), None);
        let mut renonced = sealed.clone();
        renonced.nonce[0] ^= 1;
        assert_eq!(key().open("t/v/n", &renonced), None);
        let mut cut = sealed;
        cut.nonce.pop();
        assert_eq!(key().open("t/v/n", &cut), None);
    }

    #[test]
    fn keys_are_hex_or_base64_of_32_bytes() {
        let bytes: Vec<u8> = (0u8..32).collect();
        let standard = base64::engine::general_purpose::STANDARD.encode(&bytes);
        let url = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode([0xfbu8; 32]);
        let sealed = key().seal("t/v/n", b"x");
        for text in [
            HEX,
            &HEX.to_uppercase(),
            &standard,
            &format!(" {standard}\n"),
        ] {
            let parsed = MasterKey::parse(text).expect("a key");
            assert_eq!(
                parsed.open("t/v/n", &sealed).as_deref(),
                Some(b"x".as_slice())
            );
        }
        assert!(url.contains('-') || url.contains('_'));
        assert!(MasterKey::parse(&url).is_ok());
        for bad in [
            "",
            "abc",
            &HEX[..62],
            &format!("{HEX}00"),
            "not base64 at all!",
        ] {
            assert!(MasterKey::parse(bad).is_err(), "{bad:?}");
        }
        let short = base64::engine::general_purpose::STANDARD.encode([1u8; 16]);
        assert_eq!(
            MasterKey::parse(&short).err(),
            Some("it does not hold exactly 32 bytes")
        );
    }

    #[test]
    fn a_refused_key_names_its_variable_and_never_its_value() {
        let name = "TAH_TEST_MASTER_KEY_REFUSED";
        std::env::set_var(name, "sup3r-secret-but-short");
        let message = MasterKey::from_env(name).expect_err("refused").to_string();
        assert!(message.contains(name), "{message}");
        assert!(!message.contains("sup3r"), "{message}");
        let unset = MasterKey::from_env("TAH_TEST_MASTER_KEY_UNSET").expect_err("unset");
        assert!(unset.to_string().contains("TAH_TEST_MASTER_KEY_UNSET"));
        assert!(format!("{:?}", key()).contains("redacted"));
    }
}
