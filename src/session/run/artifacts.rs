//! Keeping what a tool call produced: each file becomes an artifact of the session, the next
//! version of its path, recorded in the batch that also records the call's `tool.finished`,
//! so that an artifact is never committed without its call's outcome, nor the outcome without
//! its artifacts. The bytes go to the store once per sha256.
//!
//! Any tool's files are kept this way (the built-in file tools', an MCP tool's images and
//! resources): whatever a call returns in [`ToolOutput::artifacts`](crate::tools::ToolOutput)
//! goes through [`Run::keep_artifacts`] and [`Run::record_artifacts`].

use bytes::Bytes;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::Run;
use crate::model::{self, ArtifactRecord, EventKind};
use crate::store::{NewArtifact, StoreError, WriteOp};
use crate::tools::Artifact;

/// Above this size the digest is computed on the blocking pool, off the actor's thread.
const HASH_INLINE_BYTES: usize = 256 * 1024;

/// A call's artifacts, ready to be recorded: the records of those kept, with their bytes, and
/// the note for the call's result about those that were not.
pub(in crate::session) struct Keeping {
    kept: Vec<(ArtifactRecord, Bytes)>,
    pub note: Option<String>,
}

impl Run<'_> {
    /// What becomes of `artifacts`, produced by the call of tool step `step_id`: each gets the
    /// next version of its path and its digest. One larger than `--max-artifact-bytes` is not
    /// kept; the note then says so, with its size and the limit, for the call's result (a file
    /// a tool wrote stays in the workspace; an MCP server's image is dropped).
    pub(in crate::session) async fn keep_artifacts(
        &mut self,
        step_id: Uuid,
        artifacts: &[Artifact],
    ) -> Result<Keeping, StoreError> {
        let max = self.sink.deps.max_artifact_bytes;
        let mut kept = Vec::new();
        let mut not_kept = Vec::new();
        for artifact in artifacts {
            let size = artifact.content.len() as u64;
            if size > max {
                tracing::warn!(
                    session_id = %self.id,
                    %step_id,
                    path = %artifact.path,
                    size,
                    max,
                    "a file the tool produced is larger than --max-artifact-bytes: not kept as an artifact"
                );
                not_kept.push(format!("{} ({size} bytes)", artifact.path));
                continue;
            }
            let record = ArtifactRecord {
                id: model::new_id(),
                path: artifact.path.clone(),
                version: self.next_version(&artifact.path).await?,
                size,
                sha256: sha256_hex(&artifact.content).await,
                media_type: artifact.media_type.clone(),
                step_id,
                run_id: self.run_id,
                created_at: model::now(),
            };
            kept.push((record, artifact.content.clone()));
        }
        let note = (!not_kept.is_empty()).then(|| {
            format!(
                "[not kept as an artifact of the session, larger than the server keeps (at \
                 most {max} bytes): {}]",
                not_kept.join(", ")
            )
        });
        Ok(Keeping { kept, note })
    }

    /// Adds what `keeping` keeps to the batch being gathered (which holds the call's outcome):
    /// for each artifact its bytes, its record and its `artifact.created` event.
    pub(in crate::session) fn record_artifacts(&mut self, keeping: Keeping) {
        for (artifact, content) in keeping.kept {
            self.batch.ops.push(WriteOp::InsertArtifact(NewArtifact {
                session_id: self.id,
                artifact: artifact.clone(),
                message_count: self.core.record.message_count,
                // The seq of the event pushed next.
                seq: self.core.next_seq,
                content,
            }));
            self.batch
                .event(self.core, EventKind::ArtifactCreated { artifact });
        }
    }

    /// The version the next artifact of `path` gets: one more than the newest this session
    /// has (read from the store once per path and actor, then counted here: only this actor
    /// writes the session's artifacts).
    async fn next_version(&mut self, path: &str) -> Result<i64, StoreError> {
        let newest = match self.core.artifact_versions.get(path) {
            Some(version) => *version,
            None => {
                let store = &self.sink.deps.store;
                store.artifact_version(self.id, path).await?
            }
        };
        let next = newest + 1;
        self.core.artifact_versions.insert(path.to_string(), next);
        Ok(next)
    }
}

/// The lower-case hex SHA-256 of `content`.
async fn sha256_hex(content: &Bytes) -> String {
    if content.len() <= HASH_INLINE_BYTES {
        return hex(&Sha256::digest(content));
    }
    let moved = content.clone();
    match tokio::task::spawn_blocking(move || hex(&Sha256::digest(&moved))).await {
        Ok(digest) => digest,
        // The blocking pool refused the work (the runtime shuts down): hash here instead.
        Err(_) => hex(&Sha256::digest(content)),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn digests_are_lower_case_hex_inline_or_not() {
        let empty = bytes::Bytes::new();
        assert_eq!(
            sha256_hex(&empty).await,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let big = bytes::Bytes::from(vec![b'a'; HASH_INLINE_BYTES + 1]);
        let inline = hex(&Sha256::digest(&big));
        assert_eq!(sha256_hex(&big).await, inline);
        assert_eq!(inline.len(), 64);
    }
}
