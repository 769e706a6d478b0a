//! The Agent Client Protocol's view of a session's log: the `session/update` payloads
//! (`SessionUpdate`) that `tah acp` sends an editor, the `session/request_permission` of an
//! approval, and the `stopReason` of a run's end.
//!
//! Two readings of the same events: **live** (a prompt's run as it streams: text and
//! reasoning from their stream pieces) and **replay** (`session/load`: the history, text and
//! reasoning from each completed model reply, the user's messages as `user_message_chunk`).
//! Tool calls read the same in both: announced (`tool_call`) when the model's reply names them,
//! `in_progress` when they start, `completed`/`failed` with their output when they finish (a
//! denied call finishes as an error saying so).
//!
//! Pure: fed events in `seq` order, it keeps no other state.

use std::collections::HashSet;

use serde_json::{json, Value};

use crate::model::{Decision, Event, EventKind, FinishReason, Role, ToolCall};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    Live,
    Replay,
}

/// How a run ended, for `session/prompt`'s answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// `stopReason`.
    Stopped(&'static str),
    /// The run failed: a JSON-RPC error with this message.
    Failed(String),
}

#[derive(Debug, Clone)]
pub struct AcpUpdates {
    reading: Reading,
    /// Calls already announced with a `tool_call`.
    announced: HashSet<String>,
}

impl AcpUpdates {
    pub fn new(reading: Reading) -> AcpUpdates {
        AcpUpdates {
            reading,
            announced: HashSet::new(),
        }
    }

    /// The `update` objects of one event.
    pub fn push(&mut self, event: &Event) -> Vec<Value> {
        let live = self.reading == Reading::Live;
        match &event.kind {
            EventKind::UserMessage { message, .. } if !live => {
                vec![chunk("user_message_chunk", &message.content)]
            }
            EventKind::AssistantStream { text, .. } if live && !text.is_empty() => {
                vec![chunk("agent_message_chunk", text)]
            }
            EventKind::ThinkingStream { text, .. } if live && !text.is_empty() => {
                vec![chunk("agent_thought_chunk", text)]
            }
            EventKind::LlmCompleted { message, .. } => {
                let mut updates = Vec::new();
                if !live && message.role == Role::Assistant {
                    for block in &message.thinking {
                        if !block.text().is_empty() {
                            updates.push(chunk("agent_thought_chunk", block.text()));
                        }
                    }
                    if !message.content.is_empty() {
                        updates.push(chunk("agent_message_chunk", &message.content));
                    }
                }
                for call in &message.tool_calls {
                    updates.extend(self.announce(call));
                }
                updates
            }
            EventKind::ToolStarted { call, .. } => {
                let mut updates: Vec<Value> = self.announce(call).into_iter().collect();
                updates.push(json!({
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": call.id,
                    "status": "in_progress",
                }));
                updates
            }
            EventKind::ToolFinished {
                call_id,
                output,
                is_error,
                ..
            } => vec![json!({
                "sessionUpdate": "tool_call_update",
                "toolCallId": call_id,
                "status": if *is_error { "failed" } else { "completed" },
                "content": [{"type": "content", "content": {"type": "text", "text": output}}],
                "rawOutput": output,
            })],
            _ => Vec::new(),
        }
    }

    fn announce(&mut self, call: &ToolCall) -> Option<Value> {
        if !self.announced.insert(call.id.clone()) {
            return None;
        }
        Some(json!({
            "sessionUpdate": "tool_call",
            "toolCallId": call.id,
            "title": call.name,
            "name": call.name,
            "kind": tool_kind(&call.name),
            "status": "pending",
            "rawInput": call.arguments,
        }))
    }
}

fn chunk(kind: &str, text: &str) -> Value {
    json!({"sessionUpdate": kind, "content": {"type": "text", "text": text}})
}

/// ACP's `ToolKind` of a tah tool.
pub fn tool_kind(tool: &str) -> &'static str {
    match tool {
        "read_file" | "list_files" => "read",
        "write_file" | "edit_file" => "edit",
        "glob" | "grep" => "search",
        "shell" => "execute",
        "task" => "think",
        _ => "other",
    }
}

/// The option ids of a permission request: the editor's choice maps to tah's decision.
pub const ALLOW_OPTION: &str = "allow";
pub const ALWAYS_OPTION: &str = "always";
pub const DENY_OPTION: &str = "deny";

/// `session/request_permission`'s params for a call that waits for approval.
pub fn permission_request(session_id: &str, call_id: &str, tool: &str, input: &Value) -> Value {
    json!({
        "sessionId": session_id,
        "toolCall": {
            "toolCallId": call_id,
            "title": tool,
            "kind": tool_kind(tool),
            "status": "pending",
            "rawInput": input,
        },
        "options": [
            {"optionId": ALLOW_OPTION, "name": "Allow", "kind": "allow_once"},
            {"optionId": ALWAYS_OPTION, "name": "Always allow in this session", "kind": "allow_always"},
            {"optionId": DENY_OPTION, "name": "Deny", "kind": "reject_once"},
        ],
    })
}

/// The decision an editor's `RequestPermissionResponse` makes: allow (or always allow: a rule
/// for the rest of the session) only when it selected that option; anything else (deny,
/// cancelled, an unknown option) denies.
pub fn decision_of(response: &Value) -> Decision {
    let outcome = &response["outcome"];
    match (outcome["outcome"].as_str(), outcome["optionId"].as_str()) {
        (Some("selected"), Some(ALLOW_OPTION)) => Decision::Allow,
        (Some("selected"), Some(ALWAYS_OPTION)) => Decision::Always,
        _ => Decision::Deny,
    }
}

/// How the run ended, when `event` ends it.
pub fn run_end(event: &Event) -> Option<RunEnd> {
    match &event.kind {
        EventKind::AgentFinished { finish_reason, .. } => {
            Some(RunEnd::Stopped(stop_reason(finish_reason)))
        }
        EventKind::AgentCancelled { .. } => Some(RunEnd::Stopped("cancelled")),
        EventKind::AgentFailed { error, .. } => Some(RunEnd::Failed(error.clone())),
        _ => None,
    }
}

/// ACP's `StopReason` of a finished run.
pub fn stop_reason(reason: &FinishReason) -> &'static str {
    match reason {
        FinishReason::MaxSteps => "max_turn_requests",
        FinishReason::Budget => "max_tokens",
        FinishReason::Model(reason) => match reason.as_str() {
            "length" | "max_tokens" => "max_tokens",
            "content_filter" | "refusal" => "refusal",
            _ => "end_turn",
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocols::calls::tests::Log;

    fn updates(log: &Log, reading: Reading) -> Vec<Value> {
        let mut acp = AcpUpdates::new(reading);
        log.events.iter().flat_map(|e| acp.push(e)).collect()
    }

    fn kinds(updates: &[Value]) -> Vec<String> {
        updates
            .iter()
            .map(|u| {
                let kind = u["sessionUpdate"].as_str().unwrap();
                match u["status"].as_str() {
                    Some(status) => format!("{kind}:{status}"),
                    None => kind.to_string(),
                }
            })
            .collect()
    }

    #[test]
    fn a_live_run_streams_its_pieces_and_its_calls() {
        let (log, _, _) = Log::reasoned_turn(&["hm"], &["Let me look."], &["All ", "good."]);
        let live = updates(&log, Reading::Live);
        assert_eq!(
            kinds(&live),
            [
                "agent_thought_chunk",
                "agent_message_chunk",
                "tool_call:pending",
                "tool_call_update:in_progress",
                "tool_call_update:completed",
                "agent_message_chunk",
                "agent_message_chunk",
            ]
        );
        assert_eq!(live[2]["kind"], "read");
        assert_eq!(live[4]["content"][0]["content"]["text"], "README.md");
        assert_eq!(
            run_end(log.events.last().unwrap()),
            Some(RunEnd::Stopped("end_turn"))
        );
    }

    #[test]
    fn a_replay_reads_whole_replies_not_pieces() {
        let (log, _, _) = Log::reasoned_turn(&["hm"], &["Let me look."], &["All ", "good."]);
        let replay = updates(&log, Reading::Replay);
        let texts: Vec<&str> = replay
            .iter()
            .filter(|u| u["sessionUpdate"] == "agent_message_chunk")
            .map(|u| u["content"]["text"].as_str().unwrap())
            .collect();
        assert_eq!(texts, ["All good."]);
        assert!(kinds(&replay).contains(&"tool_call_update:completed".to_string()));
    }

    #[test]
    fn permission_answers_map_to_decisions() {
        let selected = |id: &str| json!({"outcome": {"outcome": "selected", "optionId": id}});
        assert_eq!(decision_of(&selected(ALLOW_OPTION)), Decision::Allow);
        assert_eq!(decision_of(&selected(ALWAYS_OPTION)), Decision::Always);
        assert_eq!(decision_of(&selected(DENY_OPTION)), Decision::Deny);
        assert_eq!(decision_of(&selected("other")), Decision::Deny);
        assert_eq!(
            decision_of(&json!({"outcome": {"outcome": "cancelled"}})),
            Decision::Deny
        );
        let request = permission_request("s", "c1", "write_file", &json!({"path": "a"}));
        assert_eq!(request["toolCall"]["kind"], "edit");
        assert_eq!(request["options"][0]["kind"], "allow_once");
        assert_eq!(request["options"][2]["kind"], "reject_once");
    }

    #[test]
    fn stop_reasons() {
        assert_eq!(stop_reason(&FinishReason::Model("stop".into())), "end_turn");
        assert_eq!(
            stop_reason(&FinishReason::Model("length".into())),
            "max_tokens"
        );
        assert_eq!(
            stop_reason(&FinishReason::Model("refusal".into())),
            "refusal"
        );
        assert_eq!(stop_reason(&FinishReason::MaxSteps), "max_turn_requests");
    }
}
