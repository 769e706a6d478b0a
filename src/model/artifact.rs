//! Artifacts: the files a session produced (what `write_file` and `edit_file` wrote), kept
//! with the session as numbered versions of a path. The bytes are stored once per sha256,
//! apart from the record; a record names them by their digest.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// One version of a file a session produced, as stored and served (the bytes are served
/// apart, by `…/artifacts/{id}/content`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactRecord {
    pub id: Uuid,
    /// Workspace-relative, `/`-separated.
    pub path: String,
    /// 1 for the first artifact of a path in a session, then counting up.
    pub version: i64,
    /// Bytes.
    pub size: u64,
    /// Lower-case hex SHA-256 of the bytes.
    pub sha256: String,
    pub media_type: String,
    /// The tool step that produced it (in the parent session, for what a fork inherited).
    pub step_id: Uuid,
    pub run_id: Uuid,
    pub created_at: DateTime<Utc>,
}
