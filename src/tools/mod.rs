//! Tools the agent can call: the [`Tool`] trait, the [`ToolRegistry`] that offers and runs them,
//! the built-in tools, the [`Workspace`] that confines them, the [`sandbox`] (bubblewrap or
//! Landlock) that `shell` runs in, and the pure [`policy`] that says whether a call may run.
//!
//! A tool knows nothing of sessions, the store or policy: it gets a [`ToolContext`] (the
//! workspace of the session it runs for) and the model's input, and answers text, plus the files
//! it produced ([`Artifact`]s) for the session layer to keep. A tool's failure is data for the
//! model (`is_error`), never a failure of the server.
//!
//! # Layout
//!
//! - [`workspace`]: the security boundary between the model and the host filesystem.
//! - [`builtin`]: `list_files`, `read_file`, `glob`, `grep`, `write_file`, `edit_file`, `shell`.
//! - [`sandbox`]: the start-up probe that picks bubblewrap or Landlock, the confined `sh -c` it
//!   runs, and the limits on each call.
//! - [`registry`]: choosing tools by name, describing them, validating and running calls.
//! - [`schema`]: the small JSON-schema check used for edited approval inputs.
//! - [`policy`]: allow / ask / deny rules, as a pure function.

pub mod builtin;
pub mod client;
pub mod egress;
pub mod policy;
pub mod recorded;
pub mod registry;
pub mod sandbox;
pub mod schema;
pub mod setid;
pub mod workspace;

#[cfg(test)]
mod hostile;

use async_trait::async_trait;
use bytes::Bytes;
use serde::Serialize;
use serde_json::Value;

use crate::model::ToolSchema;

pub use registry::{ToolInfo, ToolRegistry, ToolSettings, UnknownTools};
pub use sandbox::{Sandbox, SandboxStatus};
pub use workspace::Workspace;

/// A tool's own error: shown to the model as `{"error": "..."}`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

/// What one call runs against: the workspace of the session it is made for, and the call's id
/// while it runs. For a call whose subject the policy (or a human) decided on, the workspace
/// refuses any path of the call that leads elsewhere by the time it runs.
#[derive(Clone, Debug)]
pub struct ToolContext {
    pub workspace: Workspace,
    /// The id of the call being run (set by the loop for each call it runs).
    pub call_id: Option<String>,
}

impl ToolContext {
    pub fn new(workspace: Workspace) -> ToolContext {
        ToolContext {
            workspace,
            call_id: None,
        }
    }

    /// This context for one call, decided on the subject `decided` when one was read.
    pub fn for_call(&self, call_id: &str, decided: Option<&str>) -> ToolContext {
        ToolContext {
            workspace: self.workspace.deciding(decided),
            call_id: Some(call_id.to_owned()),
        }
    }
}

/// Where a tool comes from, as `GET /v1/tools` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolSource {
    Builtin,
    Mcp,
    Client,
}

/// Whether a tool can run on this host; an unavailable tool is listed but never offered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    Available,
    Unavailable { reason: String },
}

/// What a policy rule's `match` is compared with (see [`policy`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Subject {
    pub kind: SubjectKind,
    pub text: String,
}

impl Subject {
    /// What stands for a subject nobody looked at: the rules for the tool have no subject
    /// pattern (see [`policy::Rules::read_subject_of`]), so they match whatever it is.
    pub const UNREAD: Subject = Subject {
        kind: SubjectKind::Input,
        text: String::new(),
    };
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SubjectKind {
    /// A workspace-relative path (file tools): `*` stops at `/`, `**` crosses it.
    Path,
    /// A shell command.
    Command,
    /// The JSON of the input (every other tool).
    Input,
}

/// Something a call produced, for the session to keep as an artifact: the one way any tool
/// hands bytes to the session. A tool puts it in [`ToolResult::artifacts`] (see
/// [`ToolResult::with_artifact`]); the session records each as the next version of its path,
/// in the commit of the call's result, with an `artifact.created` event, unless it is larger
/// than `--max-artifact-bytes` (then the call's output says it was not kept). The built-in
/// file tools hand over the file they wrote; an MCP tool hands over the images and embedded
/// resources its server returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// The name it is kept under; its versions count up per name. For a file of the workspace,
    /// its workspace-relative, `/`-separated path with symlinks resolved; for other content, a
    /// name the tool chooses (an MCP tool might use `mcp/<server>/<resource name>`).
    pub path: String,
    /// The `Content-Type` it is served with (`image/png`, `text/plain; charset=utf-8`).
    pub media_type: String,
    pub content: Bytes,
}

impl Artifact {
    /// An artifact of `content` kept under `path`, served as `media_type`.
    pub fn new(
        path: impl Into<String>,
        media_type: impl Into<String>,
        content: impl Into<Bytes>,
    ) -> Artifact {
        Artifact {
            path: path.into(),
            media_type: media_type.into(),
            content: content.into(),
        }
    }
}

/// What a tool answers when it succeeds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolResult {
    pub output: String,
    pub artifacts: Vec<Artifact>,
}

impl ToolResult {
    /// This result with `artifact` added to what the session keeps.
    pub fn with_artifact(mut self, artifact: Artifact) -> ToolResult {
        self.artifacts.push(artifact);
        self
    }
}

impl From<String> for ToolResult {
    fn from(output: String) -> ToolResult {
        ToolResult {
            output,
            artifacts: Vec::new(),
        }
    }
}

#[async_trait]
pub trait Tool: Send + Sync {
    /// The name the model calls it by.
    fn name(&self) -> &str;
    fn description(&self) -> String;
    /// A JSON schema of the input object.
    fn input_schema(&self) -> Value;
    fn source(&self) -> ToolSource {
        ToolSource::Builtin
    }
    /// The MCP server a tool comes from.
    fn server(&self) -> Option<&str> {
        None
    }
    /// The client's tool this stands for, when a client runs it (the server never does).
    fn client_tool(&self) -> Option<&crate::model::ClientTool> {
        None
    }
    fn availability(&self) -> Availability {
        Availability::Available
    }
    /// The sandbox the tool runs commands in (`"bwrap"`, `"landlock"`), for `GET /v1/tools`.
    fn sandbox(&self) -> Option<&'static str> {
        None
    }
    /// What policy rules match this call against. File tools answer the path they would touch,
    /// symlinks resolved where it exists; the default is the input's JSON.
    async fn subject(&self, _ctx: &ToolContext, input: &Value) -> Subject {
        Subject {
            kind: SubjectKind::Input,
            text: input.to_string(),
        }
    }
    /// Runs the tool. Long blocking work must not block the runtime (use `spawn_blocking`);
    /// the caller drops the future on cancellation, and a tool must leave nothing running then.
    async fn call(&self, ctx: &ToolContext, input: &Value) -> Result<ToolResult, ToolError>;

    fn schema(&self) -> ToolSchema {
        ToolSchema {
            name: self.name().to_owned(),
            description: self.description(),
            parameters: self.input_schema(),
        }
    }
}

/// The outcome of one tool call as recorded in the history.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub output: String,
    pub is_error: bool,
    /// Files the call produced; empty for errors.
    pub artifacts: Vec<Artifact>,
}

impl ToolOutput {
    pub fn error(message: impl std::fmt::Display) -> ToolOutput {
        ToolOutput {
            output: serde_json::json!({ "error": message.to_string() }).to_string(),
            is_error: true,
            artifacts: Vec::new(),
        }
    }
}
