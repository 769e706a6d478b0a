//! Messages: the model-visible history of a session, append-only and indexed from 0.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            _ => return None,
        })
    }
}

/// A tool call requested by the model. `arguments` is the parsed JSON object the model sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub index: i64,
    pub role: Role,
    pub content: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    pub created_at: DateTime<Utc>,
}

/// The prefix that marks a compaction summary (a `system` message inside the history).
pub const SUMMARY_PREFIX: &str = "[Summary of the earlier conversation]";

/// What starts a user message's line in the transcript a summariser is given (and nothing
/// else starts a line with it there).
pub const TRANSCRIPT_USER_MARKER: &str = "user: ";

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Message {
        Message {
            index: 0,
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            created_at: super::now(),
        }
    }

    pub fn assistant(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Message {
        Message {
            tool_calls,
            ..Message::new(Role::Assistant, content)
        }
    }

    pub fn tool_result(call_id: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            tool_call_id: Some(call_id.into()),
            ..Message::new(Role::Tool, content)
        }
    }

    /// True for a compaction summary: a system message that starts with [`SUMMARY_PREFIX`].
    pub fn is_summary(&self) -> bool {
        self.role == Role::System && self.content.starts_with(SUMMARY_PREFIX)
    }

    /// The size that counts against a context budget: characters of the content plus the JSON
    /// of the tool calls.
    pub fn size_chars(&self) -> usize {
        let calls = if self.tool_calls.is_empty() {
            0
        } else {
            serde_json::to_string(&self.tool_calls)
                .map(|s| s.chars().count())
                .unwrap_or(0)
        };
        self.content.chars().count() + calls
    }
}

/// A tool as the model sees it: a name, a description and a JSON Schema for its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSchema {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}
