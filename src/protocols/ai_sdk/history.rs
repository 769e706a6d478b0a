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
                parts
                    .push(json!({"type": "reasoning", "id": id, "text": "", "state": "streaming"}));
            }
            "text-delta" | "reasoning-delta" => {
                if let Some(part) = run.open.get(id).and_then(|&i| parts.get_mut(i)) {
                    let text = format!(
                        "{}{}",
                        part["text"].as_str().unwrap_or_default(),
                        chunk["delta"].as_str().unwrap_or_default()
                    );
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
        let call_id = chunk["toolCallId"]
            .as_str()
            .or(chunk["approvalId"].as_str());
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
                let mut approval =
                    json!({"id": chunk["approvalId"], "approved": chunk["approved"]});
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
    part["type"]
        .as_str()
        .is_some_and(|t| t.starts_with("tool-"))
}

/// The part as a run that ended leaves it: text done, every call with its outcome.
fn finalize(part: &mut Value) {
    if part["state"] == "streaming" {
        part["state"] = json!("done");
    }
    let waiting = [
        "input-available",
        "approval-requested",
        "approval-responded",
    ];
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Decision, Message, ResolvedBy, Role, RunKind};
    use crate::protocols::calls::tests::Log;

    /// The user's message number `index`, sent as `text`.
    fn user(log: &mut Log, index: i64, text: &str, queued: bool) {
        let message = Message {
            index,
            ..Message::new(Role::User, text)
        };
        log.push(EventKind::UserMessage { message, queued });
    }

    fn history(log: &Log, active: Option<Uuid>) -> Vec<UiMessage> {
        let mut history = UiHistory::default();
        for event in &log.events {
            history.push(event);
        }
        history.finish(active)
    }

    fn ids(messages: &[UiMessage]) -> Vec<String> {
        messages.iter().map(|m| m.id.clone()).collect()
    }

    fn tool<'m>(message: &'m UiMessage, call: &str) -> &'m Value {
        message
            .parts
            .iter()
            .find(|p| p["toolCallId"] == call)
            .expect("a tool part")
    }

    #[test]
    fn a_turn_folds_into_the_message_its_stream_makes() {
        let mut log = Log::new();
        user(&mut log, 1, "what is here?", false);
        let first = log.step(1);
        log.thinking(first, "I should ");
        log.thinking(first, "look.");
        log.completed(first, "", &[("c1", "list_files")]);
        log.ran("c1", "list_files", "README.md");
        let second = log.step(2);
        log.text(second, "It has ");
        log.text(second, "a README.");
        log.completed(second, "It has a README.", &[]);
        log.done("It has a README.");
        let messages = history(&log, None);
        assert_eq!(ids(&messages), ["user-1", &log.run_id.to_string()]);
        assert_eq!(messages[0].role, "user");
        assert_eq!(
            messages[0].parts,
            [json!({"type": "text", "text": "what is here?"})]
        );
        assert_eq!(messages[1].role, "assistant");
        assert_eq!(
            messages[1].parts,
            [
                json!({"type": "step-start"}),
                json!({"type": "reasoning", "id": format!("{first}-reasoning"), "text": "I should look.", "state": "done"}),
                json!({"type": "tool-list_files", "toolCallId": "c1", "state": "output-available", "input": {"path": "notes.md"}, "output": "README.md"}),
                json!({"type": "step-start"}),
                json!({"type": "text", "text": "It has a README.", "state": "done"}),
            ]
        );
    }

    #[test]
    fn answers_to_approvals_show_as_the_sdk_keeps_them() {
        let calls = [
            ("a", "write_file"),
            ("b", "write_file"),
            ("c", "write_file"),
        ];
        let (mut log, _) = Log::first_step("", &calls);
        for (call, _) in calls {
            log.ask(call);
        }
        log.resolve("a", Decision::Allow, ResolvedBy::User);
        log.ran("a", "write_file", "wrote");
        log.push(EventKind::ToolApprovalResolved {
            call_id: "b".into(),
            decision: Decision::Deny,
            by: ResolvedBy::User,
            reason: Some("not today".into()),
            input: None,
            answered_by: None,
        });
        log.finished("b", "the user denied this call", true);
        log.resolve("c", Decision::Deny, ResolvedBy::Timeout);
        log.finished("c", "nobody answered", true);
        log.done("");
        let messages = history(&log, None);
        let message = &messages[0];
        assert_eq!(
            tool(message, "a"),
            &json!({"type": "tool-write_file", "toolCallId": "a", "state": "output-available", "input": {"path": "notes.md"}, "output": "wrote", "approval": {"id": "a", "approved": true}})
        );
        assert_eq!(
            tool(message, "b"),
            &json!({"type": "tool-write_file", "toolCallId": "b", "state": "output-denied", "input": {"path": "notes.md"}, "approval": {"id": "b", "approved": false, "reason": "not today"}})
        );
        // Nobody answered: an error, with no answer to show.
        assert_eq!(
            tool(message, "c"),
            &json!({"type": "tool-write_file", "toolCallId": "c", "state": "output-error", "input": {"path": "notes.md"}, "errorText": "nobody answered"})
        );
    }

    #[test]
    fn a_run_in_progress_is_what_it_has_so_far_and_an_ended_one_is_final() {
        let mut log = Log::new();
        user(&mut log, 1, "write it", false);
        let step = log.step(1);
        log.text(step, "Writing");
        let run = log.run_id;
        let so_far = history(&log, Some(run));
        assert_eq!(so_far[1].parts[1]["state"], "streaming");
        log.completed(step, "Writing", &[("w", "write_file")]);
        log.ask("w");
        let waiting = history(&log, Some(run));
        assert_eq!(tool(&waiting[1], "w")["state"], "approval-requested");
        assert_eq!(tool(&waiting[1], "w")["approval"], json!({"id": "w"}));
        // The same log, of a run that does not go on (the server stopped, nothing resumed it).
        let left = history(&log, None);
        assert_eq!(
            tool(&left[1], "w"),
            &json!({"type": "tool-write_file", "toolCallId": "w", "state": "output-error", "input": {"path": "notes.md"}, "errorText": NO_OUTCOME})
        );
        assert_eq!(left[1].parts[1]["state"], "done");
    }

    #[test]
    fn a_queued_message_follows_its_run_and_a_resumed_run_ends_earlier_calls() {
        let mut log = Log::new();
        let first = log.run_id;
        user(&mut log, 1, "look", false);
        let step = log.step(1);
        log.completed(step, "", &[("c1", "list_files")]);
        log.started("c1", "list_files");
        user(&mut log, 3, "and then?", true);
        // The server stopped here; a resume run ends the call.
        let second = Uuid::from_u128(8);
        log.push(EventKind::AgentStarted {
            run_id: second,
            kind: RunKind::Resume,
        });
        log.run_id = second;
        log.finished("c1", "README.md", false);
        let step = log.step(2);
        log.completed(step, "Done.", &[]);
        log.done("Done.");
        let messages = history(&log, None);
        assert_eq!(
            ids(&messages),
            [
                "user-1".to_string(),
                first.to_string(),
                "user-3".to_string(),
                second.to_string()
            ]
        );
        assert_eq!(tool(&messages[1], "c1")["state"], "output-available");
        assert_eq!(tool(&messages[1], "c1")["output"], "README.md");
        assert_eq!(
            messages[3].parts,
            [
                json!({"type": "step-start"}),
                json!({"type": "text", "text": "Done.", "state": "done"})
            ]
        );
    }
}
