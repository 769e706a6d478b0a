//! Environments: where a session's built-in tools run. `local` (the server itself) always
//! exists and is not stored; a `workers` environment's calls are queued for the `tah worker`
//! processes that dial in for it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The built-in environment's name (and id): the tools run on the server.
pub const LOCAL_ENVIRONMENT: &str = "local";

/// What runs an environment's tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EnvironmentKind {
    /// The server itself.
    Local,
    /// The workers that dial in for it.
    Workers,
}

impl EnvironmentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EnvironmentKind::Local => "local",
            EnvironmentKind::Workers => "workers",
        }
    }

    pub fn parse(s: &str) -> Option<EnvironmentKind> {
        match s {
            "local" => Some(EnvironmentKind::Local),
            "workers" => Some(EnvironmentKind::Workers),
            _ => None,
        }
    }
}

/// An environment as served.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Environment {
    pub id: String,
    pub name: String,
    #[serde(rename = "type")]
    pub kind: EnvironmentKind,
    pub tenant: String,
    /// `None` for the built-in `local`.
    pub created_at: Option<DateTime<Utc>>,
}

impl Environment {
    /// The built-in `local` environment, as `tenant` sees it.
    pub fn local(tenant: &str) -> Environment {
        Environment {
            id: LOCAL_ENVIRONMENT.to_string(),
            name: LOCAL_ENVIRONMENT.to_string(),
            kind: EnvironmentKind::Local,
            tenant: tenant.to_string(),
            created_at: None,
        }
    }
}

/// Whether an environment name is well formed: 1–64 of `A-Z a-z 0-9 - _ .`, not a UUID-like
/// id's prefix `env_`.
pub fn valid_environment_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with("env_")
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The built-in tools a worker may simply run again after a worker died holding the call:
/// reading ones, and the writes whose outcome does not depend on how often they ran
/// (`write_file` writes the same bytes; `edit_file` replaces one exact, unique string, so a
/// second run finds it gone and answers an error rather than editing twice). `shell` is not:
/// a command may have side effects, so a `shell` call whose worker died is answered as
/// interrupted instead of being run again.
pub fn rerun_safe(tool: &str) -> bool {
    matches!(
        tool,
        "list_files" | "read_file" | "glob" | "grep" | "write_file" | "edit_file"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(valid_environment_name("gpu-box_1.eu"));
        assert!(!valid_environment_name(""));
        assert!(!valid_environment_name("a b"));
        assert!(!valid_environment_name("env_1"));
        assert!(!valid_environment_name(&"x".repeat(65)));
    }

    #[test]
    fn shell_is_never_rerun() {
        assert!(!rerun_safe("shell"));
        assert!(rerun_safe("read_file"));
        assert!(!rerun_safe("task"));
    }
}
