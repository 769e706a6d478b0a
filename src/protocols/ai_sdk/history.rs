//! A session's history as the AI SDK's `UIMessage[]`: what `useChat` takes as a chat's initial
//! `messages`, so that a chat opened again shows what happened before it.
//!
//! Each run goes through [`UiMessageStream`] (the live stream's state machine, here also telling
//! a human's answers to approvals) and its chunks are folded into one assistant message the way
//! the SDK's client folds a stream: the same parts in the same order, under the same id (the
//! run's). A user message's id is `user-{index}`, its index in the session's messages. A message
//! sent while a run was busy (`?if_busy=queue`) follows the assistant message of that run, since
//! the run's stream shows the run as one message.
//!
//! The run in progress, if any, is what it has so far: its text may still be streaming and its
//! calls may wait; a stream that resumes it (`GET …/ai-sdk/chat/stream`) replays it into the same
//! message. Every other run has ended (or was interrupted and does not go on): its parts are
//! final, and a call it left without an outcome is an `output-error`.
//!
//! Pure: fed a session's events in order, it reads nothing.

use std::collections::HashMap;

use serde::Serialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::UiMessageStream;
use crate::model::{Event, EventKind};

/// What a call that a run left without an outcome shows.
const NO_OUTCOME: &str = "the run ended before this call had a result";

/// One `UIMessage`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UiMessage {
    pub id: String,
    pub role: &'static str,
    pub parts: Vec<Value>,
}

/// The messages of a session, from its events.
#[derive(Debug, Default)]
pub struct UiHistory {
    messages: Vec<UiMessage>,
    run: Option<OpenRun>,
}

/// The run whose events are being folded.
#[derive(Debug)]
struct OpenRun {
    id: Uuid,
    stream: UiMessageStream,
    /// Where its assistant message is in the history, once it has one.
    message: Option<usize>,
    /// Messages sent while it ran: they follow its assistant message.
    later: Vec<UiMessage>,
    /// The text and reasoning parts still streaming, by chunk id: their index in its message.
    open: HashMap<String, usize>,
}

impl UiHistory {
    /// Takes the session's next event.
    pub fn push(&mut self, event: &Event) {
        match &event.kind {
            EventKind::AgentStarted { run_id, .. } => {
                self.close_run();
                self.run = Some(OpenRun {
                    id: *run_id,
                    stream: UiMessageStream::with_responses(),
                    message: None,
                    later: Vec::new(),
                    open: HashMap::new(),
                });
            }
            EventKind::UserMessage { message, queued } => {
                let user = UiMessage {
                    id: format!("user-{}", message.index),
                    role: "user",
                    parts: vec![json!({"type": "text", "text": message.content})],
                };
                match &mut self.run {
                    Some(run) if *queued || run.message.is_some() => run.later.push(user),
                    _ => self.messages.push(user),
                }
            }
            _ => self.run_event(event),
        }
    }

    /// The history: the run in progress is `active` (the session's run when it runs), every
    /// other one has ended.
    pub fn finish(mut self, active: Option<Uuid>) -> Vec<UiMessage> {
        self.close_run();
        let active = active.map(|id| id.to_string());
        for message in &mut self.messages {
            let ended = Some(&message.id) != active.as_ref();
            for part in &mut message.parts {
                if ended {
                    finalize(part);
                }
                keep_fitting_approval(part);
            }
        }
        self.messages
    }

    fn run_event(&mut self, event: &Event) {
        let Some(run) = &mut self.run else {
            return;
        };
        let pushed = run.stream.push(event);
        if !pushed.chunks.is_empty() {
            let at = self.assistant_message();
            for chunk in &pushed.chunks {
                self.fold(at, chunk);
            }
        }
        if pushed.ended {
            self.close_run();
        }
    }

    /// The index of the open run's assistant message, which is added when first needed.
    fn assistant_message(&mut self) -> usize {
        let Some(run) = &mut self.run else {
            return self.messages.len().saturating_sub(1);
        };
        *run.message.get_or_insert_with(|| {
            self.messages.push(UiMessage {
                id: run.id.to_string(),
                role: "assistant",
                parts: Vec::new(),
            });
            self.messages.len() - 1
        })
    }

    fn close_run(&mut self) {
        if self.run.is_none() {
            return;
        }
        // A run shows as an assistant message even when it made no part, as its stream does.
        self.assistant_message();
        if let Some(run) = self.run.take() {
            self.messages.extend(run.later);
        }
    }

    /// Folds one chunk into the message at `at`, as the SDK's client does.
    fn fold(&mut self, at: usize, chunk: &Value) {
        let Some(run) = &mut self.run else {
            return;
        };
        let parts = &mut self.messages[at].parts;
        let id = chunk["id"].as_str().unwrap_or_default();
        match chunk["type"].as_str().unwrap_or_default() {
            "start-step" => parts.push(json!({"type": "step-start"})),
            "text-start" => {
                run.open.insert(id.to_string(), parts.len());
                parts.push(json!({"type": "text", "text": "", "state": "streaming"}));
            }
            "reasoning-start" => {
                run.open.insert(id.to_string(), parts.len());
                parts.push(json!({"type": "reasoning", "id": id, "text": "", "state": "streaming"}));
            }
            "text-delta" | "reasoning-delta" => {
                if let Some(part) = run.open.get(id).and_then(|&i| parts.get_mut(i)) {
                    let text = format!("{}{}", part["text"].as_str().unwrap_or_default(), chunk["delta"].as_str().unwrap_or_default());
                    part["text"] = json!(text);
                }
            }
            "text-end" | "reasoning-end" => {
                if let Some(part) = run.open.remove(id).and_then(|i| parts.get_mut(i)) {
                    part["state"] = json!("done");
                }
            }
            "tool-input-available" => parts.push(json!({
                "type": format!("tool-{}", chunk["toolName"].as_str().unwrap_or_default()),
                "toolCallId": chunk["toolCallId"],
                "state": "input-available",
                "input": chunk["input"],
            })),
            _ => self.fold_outcome(chunk),
        }
    }

    /// A chunk that moves a tool part on: the part may be in an earlier message (a run resumed
    /// after a restart ends the calls of the run it resumes).
    fn fold_outcome(&mut self, chunk: &Value) {
        let call_id = chunk["toolCallId"].as_str().or(chunk["approvalId"].as_str());
        let Some(part) = call_id.and_then(|id| self.tool_part(id)) else {
            return;
        };
        match chunk["type"].as_str().unwrap_or_default() {
            "tool-approval-request" => {
                part["state"] = json!("approval-requested");
                part["approval"] = json!({"id": chunk["approvalId"]});
            }
            "tool-approval-response" => {
                part["state"] = json!("approval-responded");
                let mut approval = json!({"id": chunk["approvalId"], "approved": chunk["approved"]});
                if chunk["reason"].is_string() {
                    approval["reason"] = chunk["reason"].clone();
                }
                part["approval"] = approval;
            }
            "tool-output-denied" => part["state"] = json!("output-denied"),
            "tool-output-available" => {
                part["state"] = json!("output-available");
                part["output"] = chunk["output"].clone();
            }
            "tool-output-error" => {
                part["state"] = json!("output-error");
                part["errorText"] = chunk["errorText"].clone();
            }
            _ => {}
        }
    }

    /// The latest tool part of the call.
    fn tool_part(&mut self, call_id: &str) -> Option<&mut Value> {
        self.messages
            .iter_mut()
            .rev()
            .flat_map(|m| m.parts.iter_mut().rev())
            .find(|p| is_tool(p) && p["toolCallId"] == call_id)
    }
}

fn is_tool(part: &Value) -> bool {
    part["type"].as_str().is_some_and(|t| t.starts_with("tool-"))
}

/// The part as a run that ended leaves it: text done, every call with its outcome.
fn finalize(part: &mut Value) {
    if part["state"] == "streaming" {
        part["state"] = json!("done");
    }
    let waiting = ["input-available", "approval-requested", "approval-responded"];
    if is_tool(part) && waiting.iter().any(|s| part["state"] == *s) {
        part["state"] = json!("output-error");
        part["errorText"] = json!(NO_OUTCOME);
    }
}

/// The SDK's states allow an approval only as they say: a granted one with an output or an
/// error (an error after a denial nobody answered, a time-out, shows none), a denied one with
/// `output-denied`.
fn keep_fitting_approval(part: &mut Value) {
    let Some(fields) = part.as_object_mut() else {
        return;
    };
    let fits = match fields.get("state").and_then(Value::as_str) {
        Some("output-available" | "output-error") => fields
            .get("approval")
            .is_some_and(|approval| approval["approved"] == true),
        _ => true,
    };
    if !fits {
        fields.remove("approval");
    }
}
