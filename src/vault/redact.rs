//! [`Redactions`]: the values handed out for each tenant, and taking them back out of text
//! (a tool's output) before it is recorded: each becomes `[secret VAULT/NAME]`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::reference::SecretRef;

/// A value handed out and the label it is redacted to.
type Handed = (String, String);

/// Per tenant, the values handed out and the label of each, longest value first (so that a
/// value containing another is replaced whole).
#[derive(Debug, Clone, Default)]
pub struct Redactions {
    handed: Arc<Mutex<HashMap<String, Vec<Handed>>>>,
}

impl Redactions {
    /// Remembers that `value`, the secret `secret` of `tenant`, was handed out.
    pub fn remember(&self, tenant: &str, secret: &SecretRef, value: &str) {
        if value.is_empty() {
            return;
        }
        let mut handed = self.handed.lock().unwrap_or_else(PoisonError::into_inner);
        let values = handed.entry(tenant.to_string()).or_default();
        let label = format!("[secret {secret}]");
        match values.iter_mut().find(|(v, _)| v == value) {
            Some(known) => known.1 = label,
            None => values.push((value.to_string(), label)),
        }
        values.sort_by_key(|(value, _)| std::cmp::Reverse(value.len()));
    }

    /// `text` with every value handed out for `tenant` replaced by its label; `None` when it
    /// holds none.
    pub fn redact(&self, tenant: &str, text: &str) -> Option<String> {
        let handed = self.handed.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Option<String> = None;
        for (value, label) in handed.get(tenant)? {
            let current = out.as_deref().unwrap_or(text);
            if current.contains(value.as_str()) {
                out = Some(current.replace(value.as_str(), label));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_handed_value_is_replaced_longest_first() {
        let r = Redactions::default();
        r.remember("t", &SecretRef::new("p", "short"), "abc");
        r.remember("t", &SecretRef::new("p", "long"), "abcdef");
        r.remember("t", &SecretRef::new("p", "empty"), "");
        assert_eq!(
            r.redact("t", "x abcdef y abc z abcdef").as_deref(),
            Some("x [secret p/long] y [secret p/short] z [secret p/long]")
        );
        assert_eq!(r.redact("t", "nothing here"), None);
        // Another tenant's values are its own.
        assert_eq!(r.redact("other", "abcdef"), None);
        // The same value under a new name takes the newer label.
        r.remember("t", &SecretRef::new("q", "again"), "abc");
        assert_eq!(r.redact("t", "abc").as_deref(), Some("[secret q/again]"));
    }
}
