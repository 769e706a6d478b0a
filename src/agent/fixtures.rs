//! Messages for the unit tests of the agent's pure functions.

use serde_json::json;

use crate::model::{Message, Role, ToolCall};

pub fn sys(c: &str) -> Message {
    Message::new(Role::System, c)
}

pub fn user(c: &str) -> Message {
    Message::new(Role::User, c)
}

pub fn reply(c: &str) -> Message {
    Message::assistant(c, Vec::new())
}

/// A `read_file` call with this id.
pub fn call(id: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: "read_file".into(),
        arguments: json!({"path": "a.txt"}),
    }
}

/// An assistant message making these calls.
pub fn calls(ids: &[&str]) -> Message {
    Message::assistant("", ids.iter().map(|id| call(id)).collect())
}

pub fn tool(id: &str, c: &str) -> Message {
    Message::tool_result(id, c)
}
