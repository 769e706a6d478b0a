//! Events: the append-only, per-session log that clients replay and watch live.

use std::sync::{Arc, OnceLock};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::{Message, RunKind, SessionState, ToolCall, Usage};

/// One committed event as clients see it: `seq` is contiguous per session, starting at 1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub session_id: Uuid,
    pub seq: i64,
    #[serde(rename = "type")]
    pub kind: String,
    pub data: Value,
    pub created_at: DateTime<Utc>,
    /// The event's JSON, rendered once however many subscribers are sent it.
    #[serde(skip)]
    pub rendered: RenderedJson,
}

/// A lazily rendered JSON text; not part of an event's identity.
#[derive(Debug, Clone, Default)]
pub struct RenderedJson(OnceLock<Arc<str>>);

impl PartialEq for RenderedJson {
    fn eq(&self, _: &RenderedJson) -> bool {
        true
    }
}

impl Event {
    pub fn new(
        session_id: Uuid,
        seq: i64,
        kind: String,
        data: Value,
        created_at: DateTime<Utc>,
    ) -> Event {
        Event {
            session_id,
            seq,
            kind,
            data,
            created_at,
            rendered: RenderedJson::default(),
        }
    }

    /// The event as JSON (what SSE `data:` lines carry), rendered on first use.
    pub fn json(&self) -> Arc<str> {
        self.rendered
            .0
            .get_or_init(|| {
                // Plain data with string keys: serialising it cannot fail.
                serde_json::to_string(self).unwrap_or_default().into()
            })
            .clone()
    }

    /// True for the events that end a run: exactly one of them closes every run.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self.kind.as_str(),
            "agent.finished" | "agent.failed" | "agent.cancelled"
        )
    }

    /// The run this event belongs to, for the events that name one.
    pub fn run_id(&self) -> Option<Uuid> {
        self.data
            .get("run_id")
            .and_then(Value::as_str)
            .and_then(|s| s.parse().ok())
    }
}

/// What can happen in a session; each variant serialises to its wire `type` and `data`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", content = "data")]
pub enum EventKind {
    #[serde(rename = "session.created")]
    SessionCreated {
        session_id: Uuid,
        #[serde(skip_serializing_if = "Option::is_none")]
        title: Option<String>,
    },
    #[serde(rename = "session.forked")]
    SessionForked { parent_id: Uuid, turns: Option<u64> },
    #[serde(rename = "session.state")]
    StateChanged {
        from: SessionState,
        to: SessionState,
    },
    #[serde(rename = "agent.started")]
    AgentStarted { run_id: Uuid, kind: RunKind },
    #[serde(rename = "user.message")]
    UserMessage { message: Message },
    #[serde(rename = "llm.started")]
    LlmStarted { step_id: Uuid },
    #[serde(rename = "agent.assistant-stream")]
    AssistantStream { step_id: Uuid, text: String },
    #[serde(rename = "llm.completed")]
    LlmCompleted {
        step_id: Uuid,
        message: Message,
        finish_reason: String,
        usage: Usage,
    },
    #[serde(rename = "llm.retry")]
    LlmRetry {
        step_id: Uuid,
        attempt: u32,
        error: String,
    },
    #[serde(rename = "llm.failed")]
    LlmFailed { step_id: Uuid, error: String },
    #[serde(rename = "tool.started")]
    ToolStarted { step_id: Uuid, call: ToolCall },
    #[serde(rename = "tool.finished")]
    ToolFinished {
        step_id: Uuid,
        call_id: String,
        output: String,
        is_error: bool,
    },
    #[serde(rename = "agent.context.trimmed")]
    ContextTrimmed {
        step_id: Uuid,
        budget: u64,
        chars: CharsBeforeAfter,
        dropped_turns: u64,
        elided_tool_results: u64,
    },
    #[serde(rename = "agent.context.compacted")]
    ContextCompacted {
        session_id: Uuid,
        turns: u64,
        chars: u64,
        auto: bool,
    },
    #[serde(rename = "agent.context.compact-failed")]
    ContextCompactFailed { session_id: Uuid, error: String },
    #[serde(rename = "storage.checkpoint")]
    Checkpoint {
        checkpoint_id: Uuid,
        step_id: Option<Uuid>,
    },
    #[serde(rename = "agent.finished")]
    AgentFinished {
        run_id: Uuid,
        text: String,
        finish_reason: String,
        usage: Usage,
    },
    #[serde(rename = "agent.failed")]
    AgentFailed { run_id: Uuid, error: String },
    #[serde(rename = "agent.cancelled")]
    AgentCancelled { run_id: Uuid },
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct CharsBeforeAfter {
    pub before: u64,
    pub after: u64,
}

impl EventKind {
    /// Splits the variant into its wire `type` and `data`.
    pub fn into_parts(self) -> (String, Value) {
        // Serialising a derive(Serialize) enum of plain data into a Value cannot fail.
        match serde_json::to_value(&self) {
            Ok(Value::Object(mut map)) => {
                let kind = match map.remove("type") {
                    Some(Value::String(s)) => s,
                    _ => String::new(),
                };
                let data = map
                    .remove("data")
                    .unwrap_or(Value::Object(Default::default()));
                (kind, data)
            }
            _ => (String::new(), Value::Null),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_serialise_to_wire_names() {
        let id = Uuid::nil();
        let (kind, data) = EventKind::AssistantStream {
            step_id: id,
            text: "hé".into(),
        }
        .into_parts();
        assert_eq!(kind, "agent.assistant-stream");
        assert_eq!(data["text"], "hé");
        let (kind, data) = EventKind::StateChanged {
            from: SessionState::Idle,
            to: SessionState::Running,
        }
        .into_parts();
        assert_eq!(kind, "session.state");
        assert_eq!(data["from"], "idle");
        assert_eq!(data["to"], "running");
    }
}
