//! The `MESSAGES_SNAPSHOT` of a session's history, with the ids the client already uses for
//! what it sent.

use std::collections::HashSet;

use serde_json::{json, Value};

use super::{content_text, InputMessage};
use crate::model::{Event, EventKind, Message, Role};

/// The session's history as AG-UI messages, with the ids the client already uses for them.
///
/// `history` is the stored history; `client` what the client sent; `pending` messages the
/// client sent that the history may not hold yet (its new user message, its tool results),
/// placed where they belong unless the history has them. System messages (the prompt,
/// summaries) are not shown.
pub fn snapshot(history: &[Message], client: &[InputMessage], pending: &[&InputMessage]) -> Value {
    let ids = aligned_ids(history, client);
    let mut out: Vec<Value> = Vec::new();
    for (message, id) in history.iter().zip(ids) {
        let id = id.unwrap_or_else(|| format!("tah-{}", message.index));
        match message.role {
            Role::System => {}
            Role::User => out.push(json!({"id": id, "role": "user", "content": message.content})),
            Role::Assistant => {
                let mut m = json!({"id": id, "role": "assistant", "content": message.content});
                if !message.tool_calls.is_empty() {
                    m["toolCalls"] = message
                        .tool_calls
                        .iter()
                        .map(|c| {
                            json!({"id": c.id, "type": "function", "function": {
                                "name": c.name, "arguments": c.arguments.to_string()}})
                        })
                        .collect();
                }
                out.push(m);
            }
            Role::Tool => out.push(json!({
                "id": id,
                "role": "tool",
                "toolCallId": message.tool_call_id.clone().unwrap_or_default(),
                "content": message.content,
            })),
        }
    }
    for message in pending {
        if out.iter().any(|m| m["id"] == message.id()) {
            continue;
        }
        match message {
            InputMessage::User { id, content } => out.push(json!({
                "id": id,
                "role": "user",
                "content": content_text(content).unwrap_or_default(),
            })),
            InputMessage::Tool {
                id,
                content,
                tool_call_id,
                ..
            } => {
                // After the assistant message that made the call, and the results before it.
                let call = |m: &Value| {
                    m["toolCalls"]
                        .as_array()
                        .is_some_and(|calls| calls.iter().any(|c| c["id"] == *tool_call_id))
                };
                let at = match out.iter().position(call) {
                    Some(mut at) => {
                        at += 1;
                        while at < out.len() && out[at]["role"] == "tool" {
                            at += 1;
                        }
                        at
                    }
                    None => out.len(),
                };
                let text = content_text(content).unwrap_or_default();
                out.insert(
                    at,
                    json!({"id": id, "role": "tool", "toolCallId": tool_call_id, "content": text}),
                );
            }
            _ => {}
        }
    }
    json!({"type": "MESSAGES_SNAPSHOT", "messages": out})
}

/// What the snapshot of a run joined after `skip_through` shows, from the history read
/// *before* the run's events: the history without what the stream will show (messages of
/// events after `skip_through`), and the results of calls that finished before it but are not
/// in the history yet (results join it in call order), as tool messages with the ids the
/// stream gives them.
pub fn snapshot_view(
    history: &[Message],
    run_events: &[Event],
    skip_through: i64,
) -> (Vec<Message>, Vec<InputMessage>) {
    let mut later_indexes = HashSet::new();
    let mut later_results = HashSet::new();
    let mut early_results = Vec::new();
    for event in run_events {
        let later = event.seq > skip_through;
        match &event.kind {
            EventKind::LlmCompleted { message, .. } | EventKind::UserMessage { message, .. }
                if later =>
            {
                later_indexes.insert(message.index);
            }
            EventKind::ToolFinished {
                step_id,
                call_id,
                output,
                ..
            } => match later {
                true => {
                    later_results.insert(call_id.clone());
                }
                false => early_results.push(InputMessage::Tool {
                    id: step_id.to_string(),
                    content: Value::String(output.clone()),
                    tool_call_id: call_id.clone(),
                    error: None,
                }),
            },
            _ => {}
        }
    }
    let shown: Vec<Message> = history
        .iter()
        .filter(|m| !later_indexes.contains(&m.index))
        .filter(|m| {
            m.role != Role::Tool
                || !m
                    .tool_call_id
                    .as_ref()
                    .is_some_and(|c| later_results.contains(c))
        })
        .cloned()
        .collect();
    let has_result = |call: &str| {
        shown
            .iter()
            .any(|m| m.role == Role::Tool && m.tool_call_id.as_deref() == Some(call))
    };
    let early: Vec<InputMessage> = early_results
        .into_iter()
        .filter(|m| match m {
            InputMessage::Tool { tool_call_id, .. } => !has_result(tool_call_id),
            _ => false,
        })
        .collect();
    (shown, early)
}

/// For each history message, the id of the client's message that is the same one, if the
/// client has it: tool results by their call, assistant messages by their calls (or text),
/// user messages by their text; matched in order, so that one client message answers for
/// one history message at most.
fn aligned_ids(history: &[Message], client: &[InputMessage]) -> Vec<Option<String>> {
    let mut next = 0;
    history
        .iter()
        .map(|message| {
            let same = |c: &InputMessage| match (message.role, c) {
                (Role::Tool, InputMessage::Tool { tool_call_id, .. }) => {
                    message.tool_call_id.as_deref() == Some(tool_call_id.as_str())
                }
                (
                    Role::Assistant,
                    InputMessage::Assistant {
                        content,
                        tool_calls,
                        ..
                    },
                ) => match message.tool_calls.first() {
                    Some(first) => tool_calls.iter().any(|t| t.id == first.id),
                    None => {
                        tool_calls.is_empty() && content.as_deref().unwrap_or("") == message.content
                    }
                },
                (Role::User, InputMessage::User { content, .. }) => {
                    content_text(content).is_ok_and(|t| t == message.content)
                }
                _ => false,
            };
            if message.role == Role::System {
                return None;
            }
            let found = client[next..].iter().position(same)?;
            let id = client[next + found].id().to_string();
            next += found + 1;
            Some(id)
        })
        .collect()
}
