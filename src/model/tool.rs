//! The vocabulary of tool use that crosses layers: policy rules, the tools a client runs
//! itself, and how a call that needed a human (or a client) was resolved.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Every built-in tool's name, in the order they are offered; a tool offered that is not one of
/// them is a client's (or an MCP server's).
pub const BUILTIN_TOOLS: [&str; 7] = [
    "list_files",
    "read_file",
    "glob",
    "grep",
    "write_file",
    "edit_file",
    "shell",
];

/// What to do with a call, from the least restrictive to the most.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Allow,
    Ask,
    Deny,
}

/// One policy rule as the server's policy file and a session's `tool_policy` spell it:
/// `tool` matches the tool's name, `match` (absent = anything) the call's subject.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub tool: String,
    #[serde(rename = "match", default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    pub action: Action,
}

/// A tool the client runs itself: the model may call it, the server waits for its result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTool {
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub input_schema: Value,
    /// How long the server waits for the result (default: the approval timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<u64>,
}

/// A human's answer to an approval request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    /// Run this call.
    Allow,
    /// Run this call, and allow the same tool with the same subject from now on.
    Always,
    /// Do not run it; the model is told.
    Deny,
}

impl Decision {
    /// Whether the call runs.
    pub fn runs(self) -> bool {
        matches!(self, Decision::Allow | Decision::Always)
    }
}

/// Who resolved a call that waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResolvedBy {
    User,
    /// Nobody answered in time.
    Timeout,
    /// The run was cancelled while the call waited.
    Cancel,
    /// The server's policy (a `deny` rule, or approval mode `deny`).
    Policy,
}
