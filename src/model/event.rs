//! Events: the append-only, per-session log that clients replay and watch live.
//!
//! An [`Event`] keeps its typed [`EventKind`] from the moment it is made until it is written
//! out; its wire JSON and SSE frame are made once, by the
//! [`Published`](super::published::Published) that carries it to the store and subscribers.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::{
    ArtifactRecord, Decision, FinishReason, Message, ResolvedBy, Rule, RunKind, RunStatus,
    SessionState, ToolCall, Usage,
};

/// One event of a session's log: `seq` is contiguous per session, starting at 1. On the wire
/// it is `{session_id, seq, type, data, created_at}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub session_id: Uuid,
    pub seq: i64,
    /// Serialised as the wire's `type` and `data`.
    #[serde(flatten)]
    pub kind: EventKind,
    pub created_at: DateTime<Utc>,
}

impl Event {
    pub fn new(session_id: Uuid, seq: i64, kind: EventKind, created_at: DateTime<Utc>) -> Event {
        Event {
            session_id,
            seq,
            kind,
            created_at,
        }
    }

    /// Rebuilds an event from its stored columns: the wire `type` and the `data` JSON.
    pub fn from_stored(
        session_id: Uuid,
        seq: i64,
        type_name: &str,
        data: &str,
        created_at: DateTime<Utc>,
    ) -> Result<Event, serde_json::Error> {
        let kind = EventKind::from_parts(type_name, data)?;
        Ok(Event::new(session_id, seq, kind, created_at))
    }

    /// The wire `type` of the event.
    pub fn type_name(&self) -> &'static str {
        self.kind.type_name()
    }

    /// True for the events that end a run: exactly one of them closes every run.
    pub fn is_terminal(&self) -> bool {
        self.kind.is_terminal()
    }

    /// The run this event belongs to, for the events that name one.
    pub fn run_id(&self) -> Option<Uuid> {
        self.kind.run_id()
    }
}

/// What can happen in a session; each variant serialises to its wire `type` and `data`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
pub enum EventKind {
    #[serde(rename = "session.created")]
    SessionCreated {
        session_id: Uuid,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        title: Option<String>,
        /// The agent version the session starts on (absent in sessions made before agents).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent: Option<super::AgentTag>,
        /// That version's model, `<provider>/<model>`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
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
    UserMessage {
        message: Message,
        /// Sent while a run was active and appended at its next step boundary
        /// (`?if_busy=queue`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        queued: bool,
    },
    #[serde(rename = "llm.started")]
    LlmStarted { step_id: Uuid },
    #[serde(rename = "agent.assistant-stream")]
    AssistantStream { step_id: Uuid, text: String },
    /// A piece of the model's reasoning as it streams (before its text).
    #[serde(rename = "agent.thinking-stream")]
    ThinkingStream { step_id: Uuid, text: String },
    #[serde(rename = "llm.completed")]
    LlmCompleted {
        step_id: Uuid,
        message: Message,
        finish_reason: FinishReason,
        usage: Usage,
        /// What the step cost in US dollars, when its model has a price.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost_usd: Option<f64>,
    },
    /// Follows each completed LLM step: its tokens, its cost (absent when its model has no
    /// price) and the session's total cost so far (absent while no step had a price).
    #[serde(rename = "session.usage")]
    SessionUsage {
        input_tokens: u64,
        output_tokens: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost_usd: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        total_cost_usd: Option<f64>,
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
    /// A tool call produced a file, now kept with the session (committed with the call's
    /// `tool.finished`, right after it).
    #[serde(rename = "artifact.created")]
    ArtifactCreated { artifact: ArtifactRecord },
    /// A call waits for a human's answer (policy said `ask`).
    #[serde(rename = "tool.approval-requested")]
    ToolApprovalRequested {
        step_id: Uuid,
        call_id: String,
        tool: String,
        input: Value,
        /// What the policy matched: the command, the path, or the input's JSON.
        subject: String,
        /// When nobody's answer is taken any more (`None`: never).
        expires_at: Option<DateTime<Utc>>,
    },
    #[serde(rename = "tool.approval-resolved")]
    ToolApprovalResolved {
        call_id: String,
        decision: Decision,
        by: ResolvedBy,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// The input the call runs with, when the answer replaced it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input: Option<Value>,
        /// The principal that answered (`by: user`): a key's id, `jwt:<sub>`, `operator`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        answered_by: Option<String>,
    },
    /// An `always` answer added a session rule.
    #[serde(rename = "tool.policy-updated")]
    ToolPolicyUpdated { rule: Rule },
    /// A call of a tool the client runs waits for the client's result.
    #[serde(rename = "tool.client-requested")]
    ToolClientRequested {
        step_id: Uuid,
        call_id: String,
        tool: String,
        input: Value,
        expires_at: Option<DateTime<Utc>>,
        /// For a built-in tool's call of a session in a `workers` environment: the
        /// environment whose workers run it (the call waits until one of them sends its
        /// result, not the client).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        environment: Option<String>,
    },
    /// A `task` call started a sub-agent: a child session with its own log.
    #[serde(rename = "subagent.started")]
    SubagentStarted { call_id: String, session_id: Uuid },
    /// The sub-agent of a `task` call ended (`cancelled` when its parent's run was).
    #[serde(rename = "subagent.finished")]
    SubagentFinished {
        call_id: String,
        session_id: Uuid,
        status: RunStatus,
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
        finish_reason: FinishReason,
        usage: Usage,
    },
    #[serde(rename = "agent.failed")]
    AgentFailed { run_id: Uuid, error: String },
    #[serde(rename = "agent.cancelled")]
    AgentCancelled { run_id: Uuid },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CharsBeforeAfter {
    pub before: u64,
    pub after: u64,
}

impl EventKind {
    /// The wire `type`.
    pub fn type_name(&self) -> &'static str {
        match self {
            EventKind::SessionCreated { .. } => "session.created",
            EventKind::SessionForked { .. } => "session.forked",
            EventKind::StateChanged { .. } => "session.state",
            EventKind::AgentStarted { .. } => "agent.started",
            EventKind::UserMessage { .. } => "user.message",
            EventKind::LlmStarted { .. } => "llm.started",
            EventKind::AssistantStream { .. } => "agent.assistant-stream",
            EventKind::ThinkingStream { .. } => "agent.thinking-stream",
            EventKind::LlmCompleted { .. } => "llm.completed",
            EventKind::SessionUsage { .. } => "session.usage",
            EventKind::LlmRetry { .. } => "llm.retry",
            EventKind::LlmFailed { .. } => "llm.failed",
            EventKind::ToolStarted { .. } => "tool.started",
            EventKind::ToolFinished { .. } => "tool.finished",
            EventKind::ArtifactCreated { .. } => "artifact.created",
            EventKind::ToolApprovalRequested { .. } => "tool.approval-requested",
            EventKind::ToolApprovalResolved { .. } => "tool.approval-resolved",
            EventKind::ToolPolicyUpdated { .. } => "tool.policy-updated",
            EventKind::ToolClientRequested { .. } => "tool.client-requested",
            EventKind::SubagentStarted { .. } => "subagent.started",
            EventKind::SubagentFinished { .. } => "subagent.finished",
            EventKind::ContextTrimmed { .. } => "agent.context.trimmed",
            EventKind::ContextCompacted { .. } => "agent.context.compacted",
            EventKind::ContextCompactFailed { .. } => "agent.context.compact-failed",
            EventKind::Checkpoint { .. } => "storage.checkpoint",
            EventKind::AgentFinished { .. } => "agent.finished",
            EventKind::AgentFailed { .. } => "agent.failed",
            EventKind::AgentCancelled { .. } => "agent.cancelled",
        }
    }

    /// True for the events that end a run.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            EventKind::AgentFinished { .. }
                | EventKind::AgentFailed { .. }
                | EventKind::AgentCancelled { .. }
        )
    }

    /// The run an event names, if it names one.
    pub fn run_id(&self) -> Option<Uuid> {
        match self {
            EventKind::AgentStarted { run_id, .. }
            | EventKind::AgentFinished { run_id, .. }
            | EventKind::AgentFailed { run_id, .. }
            | EventKind::AgentCancelled { run_id } => Some(*run_id),
            _ => None,
        }
    }

    /// The `data` object as JSON text, cut from the kind's own serialisation: the tests'
    /// check of [`Event::stored_data`], which the store uses.
    #[cfg(test)]
    pub fn data_json(&self) -> String {
        // The adjacently tagged form is `{"type":"<name>","data":<data>}`; type names need no
        // escaping, so the data is what lies between that prefix and the closing brace.
        let whole = serde_json::to_string(self).unwrap_or_default();
        let prefix = r#"{"type":""#.len() + self.type_name().len() + r#"","data":"#.len();
        match whole.get(prefix..whole.len().saturating_sub(1)) {
            Some(data) => data.to_string(),
            None => "{}".to_string(),
        }
    }

    /// The `data` object as a JSON value.
    pub fn data_value(&self) -> Value {
        match serde_json::to_value(self) {
            Ok(Value::Object(mut map)) => map.remove("data").unwrap_or(Value::Null),
            _ => Value::Null,
        }
    }

    /// Rebuilds a kind from its wire `type` and `data` value.
    pub fn from_value_parts(type_name: &str, data: Value) -> Result<EventKind, serde_json::Error> {
        let mut whole = serde_json::Map::with_capacity(2);
        whole.insert("type".into(), Value::String(type_name.to_string()));
        whole.insert("data".into(), data);
        serde_json::from_value(Value::Object(whole))
    }

    /// Rebuilds a kind from its wire `type` and `data` JSON text.
    pub fn from_parts(type_name: &str, data: &str) -> Result<EventKind, serde_json::Error> {
        let type_json = serde_json::to_string(type_name)?;
        serde_json::from_str(&format!(r#"{{"type":{type_json},"data":{data}}}"#))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Published;

    #[test]
    fn kinds_serialise_to_wire_names() {
        let id = Uuid::nil();
        let kind = EventKind::AssistantStream {
            step_id: id,
            text: "hé".into(),
        };
        assert_eq!(kind.type_name(), "agent.assistant-stream");
        assert_eq!(kind.data_value()["text"], "hé");
        let kind = EventKind::StateChanged {
            from: SessionState::Idle,
            to: SessionState::Running,
        };
        assert_eq!(kind.type_name(), "session.state");
        assert_eq!(kind.data_value()["from"], "idle");
        assert_eq!(kind.data_value()["to"], "running");
    }

    #[test]
    fn type_names_match_the_serialised_tag() {
        let id = Uuid::nil();
        let kinds = [
            EventKind::SessionCreated {
                session_id: id,
                title: Some("t".into()),
                agent: Some(super::super::AgentTag::default()),
                model: Some("default/mock".into()),
            },
            EventKind::AgentFinished {
                run_id: id,
                text: "done \"quoted\" \u{0} 世界".into(),
                finish_reason: FinishReason::MaxSteps,
                usage: Usage::default(),
            },
            EventKind::Checkpoint {
                checkpoint_id: id,
                step_id: None,
            },
            EventKind::ThinkingStream {
                step_id: id,
                text: "so… 🤔".into(),
            },
            EventKind::SessionUsage {
                input_tokens: 12,
                output_tokens: 3,
                cost_usd: Some(0.000054),
                total_cost_usd: Some(0.000108),
            },
            EventKind::SessionUsage {
                input_tokens: 12,
                output_tokens: 3,
                cost_usd: None,
                total_cost_usd: None,
            },
        ];
        for kind in kinds {
            let whole = serde_json::to_value(&kind).unwrap();
            assert_eq!(whole["type"], kind.type_name());
            let data: Value = serde_json::from_str(&kind.data_json()).unwrap();
            assert_eq!(data, whole["data"]);
            assert_eq!(data, kind.data_value());
            let back = EventKind::from_parts(kind.type_name(), &kind.data_json()).unwrap();
            assert_eq!(back, kind);
            let event = Published::new(Event::new(Uuid::now_v7(), 12, kind.clone(), Utc::now()));
            assert_eq!(
                event.stored_data(),
                Ok(kind.data_json().as_str()),
                "{}",
                kind.type_name()
            );
        }
    }

    #[test]
    fn unknown_types_are_refused() {
        assert!(EventKind::from_parts("no.such", "{}").is_err());
        assert!(EventKind::from_parts("agent.cancelled", "{}").is_err());
    }
}
