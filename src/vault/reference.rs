//! References to secrets, `${vault:VAULT/NAME}`, written as a whole value or inside one
//! (`Bearer ${vault:prod/token}`): finding them, checking them, and putting values in their
//! place.

use std::fmt;

/// What opens a reference.
const OPEN: &str = "${vault:";

/// The longest vault or secret name.
pub const MAX_NAME_CHARS: usize = 128;

/// Whether `name` may name a vault or a secret: 1 to 128 of `A-Z a-z 0-9 _ . -`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_CHARS
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// One secret, by vault and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SecretRef {
    pub vault: String,
    pub name: String,
}

impl SecretRef {
    pub fn new(vault: &str, name: &str) -> SecretRef {
        SecretRef {
            vault: vault.to_string(),
            name: name.to_string(),
        }
    }
}

impl fmt::Display for SecretRef {
    /// `VAULT/NAME`, as references and redactions spell it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.vault, self.name)
    }
}

/// A reference that does not parse; the message quotes what was written (a reference, never
/// a value).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a vault reference: write ${{vault:VAULT/NAME}}, both names 1 to 128 of \
     A-Z a-z 0-9 _ . -"
)]
pub struct MalformedRef(pub String);

/// Whether `text` holds a reference (well formed or not).
pub fn mentions(text: &str) -> bool {
    text.contains(OPEN)
}

/// The pieces of `text`: literal text and references, in order.
enum Piece<'a> {
    Text(&'a str),
    Ref(SecretRef),
}

fn pieces(text: &str) -> Result<Vec<Piece<'_>>, MalformedRef> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(OPEN) {
        if at > 0 {
            out.push(Piece::Text(&rest[..at]));
        }
        let after = &rest[at + OPEN.len()..];
        let Some(end) = after.find('}') else {
            return Err(MalformedRef(truncated(&rest[at..])));
        };
        let inner = &after[..end];
        let parsed = inner
            .split_once('/')
            .filter(|(vault, name)| valid_name(vault) && valid_name(name))
            .map(|(vault, name)| SecretRef {
                vault: vault.to_string(),
                name: name.to_string(),
            });
        match parsed {
            Some(reference) => out.push(Piece::Ref(reference)),
            None => {
                return Err(MalformedRef(truncated(
                    &rest[at..at + OPEN.len() + end + 1],
                )))
            }
        }
        rest = &after[end + 1..];
    }
    if !rest.is_empty() {
        out.push(Piece::Text(rest));
    }
    Ok(out)
}

/// At most 300 bytes of what was written, for a message.
fn truncated(text: &str) -> String {
    let mut end = text.len().min(300);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// The references in `text`, in order; an error for the first malformed one.
pub fn references(text: &str) -> Result<Vec<SecretRef>, MalformedRef> {
    Ok(pieces(text)?
        .into_iter()
        .filter_map(|piece| match piece {
            Piece::Ref(reference) => Some(reference),
            Piece::Text(_) => None,
        })
        .collect())
}

/// `text` with each reference replaced by what `value` gives for it.
pub fn substitute<E>(
    text: &str,
    mut value: impl FnMut(&SecretRef) -> Result<String, E>,
) -> Result<String, SubstituteError<E>> {
    let mut out = String::with_capacity(text.len());
    for piece in pieces(text).map_err(SubstituteError::Malformed)? {
        match piece {
            Piece::Text(text) => out.push_str(text),
            Piece::Ref(reference) => {
                out.push_str(&value(&reference).map_err(SubstituteError::Value)?)
            }
        }
    }
    Ok(out)
}

/// Why [`substitute`] failed: a reference that does not parse, or what the lookup said.
#[derive(Debug)]
pub enum SubstituteError<E> {
    Malformed(MalformedRef),
    Value(E),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_found_whole_or_inside_a_value() {
        assert_eq!(
            references("${vault:prod/token}"),
            Ok(vec![SecretRef::new("prod", "token")])
        );
        assert_eq!(
            references("Bearer ${vault:a.b/c_d-1} and ${vault:x/y}!"),
            Ok(vec![
                SecretRef::new("a.b", "c_d-1"),
                SecretRef::new("x", "y")
            ])
        );
        assert_eq!(references("plain $HOME ${OTHER}"), Ok(vec![]));
        assert!(!mentions("plain ${OTHER}"));
        assert!(mentions("x ${vault:"));
    }

    #[test]
    fn a_malformed_reference_is_refused_and_quoted() {
        for bad in [
            "${vault:prod}",
            "${vault:prod/}",
            "${vault:/token}",
            "${vault:prod/to ken}",
            "${vault:a/b/c}",
            "x ${vault:prod/token",
        ] {
            let err = references(bad).expect_err(bad);
            assert!(bad.contains(&err.0), "{bad:?} → {err}");
        }
        let long = format!("${{vault:v/{}}}", "n".repeat(129));
        assert!(references(&long).is_err());
    }

    #[test]
    fn substitution_puts_values_in_place() {
        let out = substitute("Bearer ${vault:p/t}; ${vault:p/u}", |r| {
            Ok::<_, ()>(format!("<{}>", r.name))
        })
        .expect("substituted");
        assert_eq!(out, "Bearer <t>; <u>");
        let failed = substitute("${vault:p/t}", |_| Err::<String, _>("missing"));
        assert!(matches!(failed, Err(SubstituteError::Value("missing"))));
        assert!(matches!(
            substitute("${vault:p}", |_| Ok::<_, ()>(String::new())),
            Err(SubstituteError::Malformed(_))
        ));
    }
}
