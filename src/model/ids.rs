//! Typed ids: what an id names is in its type, so a run id cannot be passed where a session id
//! is meant. Each is serde-transparent over its value, so the wire form is unchanged.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// An id as a path names it: what it names (for "… not found" messages) and how it is parsed.
pub trait PathId: Sized {
    /// What the id names, in words: "session", "run", "call"…
    const WHAT: &'static str;

    /// The id a path segment names; `None` when no such id can exist.
    fn parse(raw: &str) -> Option<Self>;

    /// Why a segment that is no such id names nothing.
    fn malformed() -> String {
        format!("{} not found: not a valid id", Self::WHAT)
    }
}

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            pub fn uuid(self) -> Uuid {
                self.0
            }
        }

        impl From<Uuid> for $name {
            fn from(id: Uuid) -> $name {
                $name(id)
            }
        }

        impl From<$name> for Uuid {
            fn from(id: $name) -> Uuid {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;
            fn from_str(raw: &str) -> Result<$name, uuid::Error> {
                Uuid::parse_str(raw).map($name)
            }
        }

        impl PathId for $name {
            const WHAT: &'static str = $what;
            fn parse(raw: &str) -> Option<$name> {
                raw.parse().ok()
            }
        }
    };
}

uuid_id!(
    /// A session.
    SessionId,
    "session"
);
uuid_id!(
    /// A run of a session.
    RunId,
    "run"
);
uuid_id!(
    /// An LLM or tool step of a session.
    StepId,
    "step"
);
uuid_id!(
    /// One version of an artifact.
    ArtifactId,
    "artifact"
);

/// The longest call id accepted, in characters.
pub const MAX_CALL_ID_CHARS: usize = 256;

/// A tool call, as the model named it (an opaque string of at most [`MAX_CALL_ID_CHARS`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CallId(pub String);

impl CallId {
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PathId for CallId {
    const WHAT: &'static str = "call";
    fn parse(raw: &str) -> Option<CallId> {
        (!raw.is_empty() && raw.chars().count() <= MAX_CALL_ID_CHARS)
            .then(|| CallId(raw.to_string()))
    }

    fn malformed() -> String {
        "no call with this call_id".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_their_value_on_the_wire() {
        let id = Uuid::now_v7();
        let session = SessionId(id);
        assert_eq!(
            serde_json::to_value(session).unwrap(),
            serde_json::json!(id.to_string())
        );
        let back: SessionId = serde_json::from_value(serde_json::json!(id.to_string())).unwrap();
        assert_eq!(back, session);
        let call = CallId("call_1".to_string());
        assert_eq!(
            serde_json::to_value(&call).unwrap(),
            serde_json::json!("call_1")
        );
    }

    #[test]
    fn a_malformed_id_names_nothing() {
        assert!(SessionId::parse("not-a-uuid").is_none());
        assert!(RunId::parse("1").is_none());
        assert!(CallId::parse("").is_none());
        assert!(CallId::parse(&"x".repeat(MAX_CALL_ID_CHARS + 1)).is_none());
        assert!(CallId::parse("call_1").is_some());
        let id = Uuid::now_v7();
        assert_eq!(StepId::parse(&id.to_string()), Some(StepId(id)));
    }
}
