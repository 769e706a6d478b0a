//! AG-UI (what `@ag-ui/client`'s `HttpAgent` and CopilotKit read) as a view of a session.
//!
//! An AG-UI run is one POST: it opens with `RUN_STARTED` and a `MESSAGES_SNAPSHOT` of the
//! session's history ([`snapshot`]), then streams the tah run's events as AG-UI events
//! ([`AgUiRun`]), and ends with `RUN_FINISHED` or `RUN_ERROR`. A tah run that waits for answers
//! ends the AG-UI run there: with an interrupt outcome when a human's approval is needed
//! (answered by the next run's `resume`), or with `pendingToolCallIds` when the client's own
//! tools were called (answered by the tool messages of the next run's `messages`).
//!
//! Ids: an LLM step is one assistant message (its id is the step id), its reasoning is the
//! reasoning message `<step id>-reasoning`, and a tool result is a tool message whose id is
//! its tool step's id. History the client does not have yet gets ids from its position
//! (`tah-<index>`); what the client sent keeps the client's ids.

use std::collections::{HashMap, HashSet};

use serde::Deserialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::calls::{RunCalls, Wait};
use super::parts::{reasoning_id, PartFrames, Parts};

mod snapshot;
use crate::model::{ClientTool, Event, EventKind, RunStatus};
pub use snapshot::{snapshot, snapshot_view};

/// The AG-UI protocol version these events follow.
pub const PROTOCOL_VERSION: &str = "1.0";

/// The body of an AG-UI run: `RunAgentInput`. Fields tah does not use are accepted and
/// ignored (the protocol's objects are open).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunAgentInput {
    pub thread_id: String,
    pub run_id: String,
    #[serde(default)]
    pub parent_run_id: Option<String>,
    pub messages: Vec<InputMessage>,
    #[serde(default)]
    pub tools: Vec<InputTool>,
    #[serde(default)]
    pub resume: Vec<ResumeEntry>,
    /// Accepted and not used (must be an array, as the protocol says).
    #[serde(default, rename = "context")]
    pub _context: Vec<Value>,
}

/// A message of `RunAgentInput.messages`, by role.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum InputMessage {
    Developer {
        id: String,
    },
    System {
        id: String,
    },
    User {
        id: String,
        content: Value,
    },
    Assistant {
        id: String,
        #[serde(default)]
        content: Option<String>,
        #[serde(default, rename = "toolCalls")]
        tool_calls: Vec<InputToolCall>,
    },
    Tool {
        id: String,
        content: Value,
        #[serde(rename = "toolCallId")]
        tool_call_id: String,
        #[serde(default)]
        error: Option<String>,
    },
    Activity {
        id: String,
    },
    Reasoning {
        id: String,
    },
}

impl InputMessage {
    pub fn id(&self) -> &str {
        match self {
            InputMessage::Developer { id }
            | InputMessage::System { id }
            | InputMessage::User { id, .. }
            | InputMessage::Assistant { id, .. }
            | InputMessage::Tool { id, .. }
            | InputMessage::Activity { id }
            | InputMessage::Reasoning { id } => id,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct InputToolCall {
    pub id: String,
}

/// A tool the client runs (`RunAgentInput.tools`).
#[derive(Debug, Clone, Deserialize)]
pub struct InputTool {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub parameters: Option<Value>,
}

impl InputTool {
    pub fn client_tool(&self) -> ClientTool {
        ClientTool {
            name: self.name.clone(),
            description: self.description.clone(),
            input_schema: self
                .parameters
                .clone()
                .unwrap_or_else(|| json!({"type": "object"})),
            timeout_s: None,
        }
    }
}

/// An answer to an interrupt of an earlier run.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumeEntry {
    pub interrupt_id: String,
    pub status: ResumeStatus,
    #[serde(default)]
    pub payload: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResumeStatus {
    Resolved,
    Cancelled,
}

/// The text of a message's content: a string, or the text of its text parts.
pub fn content_text(content: &Value) -> Result<String, String> {
    match content {
        Value::String(text) => Ok(text.clone()),
        Value::Array(parts) => {
            let mut texts = Vec::new();
            for part in parts {
                match (part["type"].as_str(), part["text"].as_str()) {
                    (Some("text"), Some(text)) => texts.push(text),
                    (kind, _) => {
                        return Err(format!(
                            "content parts of type {} are not supported (only text)",
                            kind.unwrap_or("(none)")
                        ))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err("content must be a string or an array of content parts".to_string()),
    }
}

/// What one event produced.
#[derive(Debug, Default, PartialEq)]
pub struct Pushed {
    pub events: Vec<Value>,
    /// The run waits for answers only: a live stream ends here with
    /// [`AgUiRun::finish_parked`].
    pub parked: bool,
    /// The tah run ended (the last event is `RUN_FINISHED` or `RUN_ERROR`).
    pub ended: bool,
}

/// The AG-UI events of one AG-UI run, from a tah run's events.
#[derive(Debug)]
pub struct AgUiRun {
    thread_id: String,
    run_id: String,
    skip_through: i64,
    /// Calls whose result the client sent in this run's input: it has their tool messages.
    known_results: HashSet<String>,
    calls: RunCalls,
    /// The reasoning and text messages of the LLM steps.
    parts: Parts<AgUiParts>,
    /// Sub-agents started and not finished, with their `task` call.
    subagents_open: HashMap<Uuid, String>,
    /// An event after `skip_through` has been shown.
    past_skip: bool,
}

impl AgUiRun {
    /// The AG-UI run `run_id` of thread `thread_id`, showing the tah run's events after
    /// `skip_through` (what the client has up to there is in its snapshot).
    pub fn new(
        thread_id: &str,
        run_id: &str,
        skip_through: i64,
        known_results: HashSet<String>,
    ) -> AgUiRun {
        AgUiRun {
            thread_id: thread_id.to_string(),
            run_id: run_id.to_string(),
            skip_through,
            known_results,
            calls: RunCalls::default(),
            parts: Parts::default(),
            subagents_open: HashMap::new(),
            past_skip: false,
        }
    }

    pub fn started(&self) -> Value {
        json!({
            "type": "RUN_STARTED",
            "threadId": self.thread_id,
            "runId": self.run_id,
            "protocolVersion": PROTOCOL_VERSION,
        })
    }

    /// Ends an AG-UI run that has nothing (more) to show: the session runs nothing.
    pub fn finished_idle(&self) -> Value {
        self.run_finished(json!({"type": "success"}))
    }

    /// The `RUN_FINISHED` that ends this AG-UI run with `outcome`.
    fn run_finished(&self, outcome: Value) -> Value {
        json!({
            "type": "RUN_FINISHED",
            "threadId": self.thread_id,
            "runId": self.run_id,
            "outcome": outcome,
        })
    }

    /// What the run's calls wait for, as far as the events pushed tell.
    pub fn calls(&self) -> &RunCalls {
        &self.calls
    }

    pub fn push(&mut self, event: &Event) -> Pushed {
        let mut out = Vec::new();
        let shown = event.seq > self.skip_through;
        if shown && !self.past_skip {
            // The client joins mid-run: what is open already opens again for it.
            self.past_skip = true;
            self.reopen(&mut out);
        }
        self.translate(event, &mut out);
        let parked = self.calls.apply(event);
        if !shown {
            out.clear();
        }
        Pushed {
            events: out,
            // The park the client's snapshot ends at (a reconnect) ends this stream too, as it
            // ended the client's first one; the driver goes on if something moved the run on.
            parked: parked && event.seq >= self.skip_through,
            ended: event.is_terminal(),
        }
    }

    /// The event that ends an AG-UI run where the tah run waits for answers: an interrupt
    /// per approval asked, or the calls of the client's tools that wait for its results.
    pub fn finish_parked(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        self.parts.close(&mut out);
        let interrupts: Vec<Value> = self
            .calls
            .waiting()
            .filter_map(|call| match &call.wait {
                Some(Wait::Approval { subject }) => {
                    let mut interrupt = json!({
                        "id": call.id,
                        "reason": "tool_call",
                        "toolCallId": call.id,
                        "message": format!("Allow {} on {subject}?", call.tool),
                        "responseSchema": approval_schema(),
                        "metadata": {"tool": call.tool, "subject": subject, "input": call.input},
                    });
                    if let Some(at) = call.expires_at {
                        interrupt["expiresAt"] = json!(at.to_rfc3339());
                    }
                    Some(interrupt)
                }
                _ => None,
            })
            .collect();
        let outcome = match interrupts.is_empty() {
            false => json!({"type": "interrupt", "interrupts": interrupts}),
            true => {
                let pending: Vec<&str> = self
                    .calls
                    .waiting()
                    .filter(|c| c.wait == Some(Wait::Client))
                    .map(|c| c.id.as_str())
                    .collect();
                json!({"type": "success", "pendingToolCallIds": pending})
            }
        };
        out.push(self.run_finished(outcome));
        out
    }

    fn translate(&mut self, event: &Event, out: &mut Vec<Value>) {
        match &event.kind {
            EventKind::ThinkingStream { step_id, text } => {
                self.parts.reasoning(*step_id, text, out);
            }
            EventKind::AssistantStream { step_id, text } => {
                self.parts.close_reasoning(out);
                if !text.is_empty() {
                    self.parts.open_text(*step_id, out);
                    out.push(AgUiParts::text_delta(*step_id, text));
                }
            }
            EventKind::LlmCompleted {
                step_id, message, ..
            } => {
                self.parts.completed(*step_id, message, out);
                for call in &message.tool_calls {
                    out.push(json!({"type": "TOOL_CALL_START", "toolCallId": call.id,
                        "toolCallName": call.name, "parentMessageId": step_id.to_string()}));
                    out.push(json!({"type": "TOOL_CALL_ARGS", "toolCallId": call.id,
                        "delta": call.arguments.to_string()}));
                    out.push(json!({"type": "TOOL_CALL_END", "toolCallId": call.id}));
                }
            }
            EventKind::LlmFailed { .. } => self.parts.close(out),
            // The client has the results it sent.
            EventKind::ToolFinished {
                step_id,
                call_id,
                output,
                ..
            } if !self.known_results.contains(call_id) => {
                out.push(
                    json!({"type": "TOOL_CALL_RESULT", "messageId": step_id.to_string(),
                    "toolCallId": call_id, "content": output, "role": "tool"}),
                );
            }
            EventKind::SubagentStarted {
                call_id,
                session_id,
            } => {
                self.subagents_open.insert(*session_id, call_id.clone());
                out.push(subagent_started(*session_id, call_id));
            }
            EventKind::SubagentFinished {
                session_id, status, ..
            } if self.subagents_open.remove(session_id).is_some() => {
                out.push(match status {
                    RunStatus::Completed => json!({"type": "SUBAGENT_FINISHED",
                        "subagentRunId": session_id.to_string(), "outcome": {"type": "success"}}),
                    other => json!({"type": "SUBAGENT_ERROR",
                        "subagentRunId": session_id.to_string(),
                        "message": format!("the sub-agent's run ended {}", other.as_str()),
                        "code": other.as_str()}),
                });
            }
            EventKind::AgentFinished {
                run_id,
                text,
                finish_reason,
                usage,
            } => {
                self.parts.close(out);
                let mut finished = self.run_finished(json!({"type": "success"}));
                finished["result"] =
                    json!({"run_id": run_id, "text": text, "finish_reason": finish_reason});
                finished["usage"] = json!([{
                    "inputTokens": usage.input_tokens,
                    "outputTokens": usage.output_tokens,
                    "totalTokens": usage.input_tokens + usage.output_tokens,
                }]);
                out.push(finished);
            }
            EventKind::AgentFailed { error, .. } => {
                self.parts.close(out);
                out.push(json!({"type": "RUN_ERROR", "message": error, "code": "run_failed"}));
            }
            EventKind::AgentCancelled { .. } => {
                self.parts.close(out);
                out.push(self.run_finished(json!({"type": "cancelled"})));
            }
            _ => {}
        }
    }

    /// The openings of the messages and sub-agents open now, for a client that joins here.
    fn reopen(&self, out: &mut Vec<Value>) {
        for (session_id, call_id) in &self.subagents_open {
            out.push(subagent_started(*session_id, call_id));
        }
        self.parts.reopen(out);
    }
}

/// AG-UI's reasoning and text messages.
#[derive(Debug)]
struct AgUiParts;

impl PartFrames for AgUiParts {
    fn reasoning_start(step_id: Uuid, out: &mut Vec<Value>) {
        let id = reasoning_id(step_id);
        out.push(json!({"type": "REASONING_START", "messageId": id}));
        out.push(json!({"type": "REASONING_MESSAGE_START", "messageId": id, "role": "reasoning"}));
    }

    fn reasoning_delta(step_id: Uuid, delta: &str) -> Value {
        json!({"type": "REASONING_MESSAGE_CONTENT", "messageId": reasoning_id(step_id), "delta": delta})
    }

    fn reasoning_end(step_id: Uuid, out: &mut Vec<Value>) {
        let id = reasoning_id(step_id);
        out.push(json!({"type": "REASONING_MESSAGE_END", "messageId": id}));
        out.push(json!({"type": "REASONING_END", "messageId": id}));
    }

    fn text_start(step_id: Uuid) -> Value {
        json!({"type": "TEXT_MESSAGE_START", "messageId": step_id.to_string(), "role": "assistant"})
    }

    fn text_delta(step_id: Uuid, delta: &str) -> Value {
        json!({"type": "TEXT_MESSAGE_CONTENT", "messageId": step_id.to_string(), "delta": delta})
    }

    fn text_end(step_id: Uuid) -> Value {
        json!({"type": "TEXT_MESSAGE_END", "messageId": step_id.to_string()})
    }
}

fn subagent_started(session_id: Uuid, call_id: &str) -> Value {
    json!({"type": "SUBAGENT_STARTED", "subagentRunId": session_id.to_string(), "name": "task",
        "parentToolCallId": call_id})
}

/// What a resume payload for an approval looks like: approve (optionally with replaced
/// arguments) or not, with a reason.
fn approval_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "approved": {"type": "boolean"},
            "editedArgs": {"type": "object", "description": "Replaces the call's arguments."},
            "reason": {"type": "string"},
        },
        "required": ["approved"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Decision, Message, ResolvedBy, Role, ToolCall};
    use crate::protocols::calls::tests::{adapt_log as run, type_list, types, Log};

    /// A run that shows one text message and finishes.
    const ONE_TEXT_MESSAGE_THEN_FINISHED: [&str; 4] = [
        "TEXT_MESSAGE_START",
        "TEXT_MESSAGE_CONTENT",
        "TEXT_MESSAGE_END",
        "RUN_FINISHED",
    ];

    #[test]
    fn a_turn_streams_reasoning_text_tool_calls_and_results() {
        let (log, first, _) = Log::reasoned_turn(&["Let me look."], &[""], &["A README."]);
        let mut stream = AgUiRun::new("t", "r", 0, HashSet::new());
        let (out, parks) = run(&mut stream, &log);
        assert!(parks.is_empty());
        assert_eq!(type_list(&out), "REASONING_START REASONING_MESSAGE_START REASONING_MESSAGE_CONTENT REASONING_MESSAGE_END REASONING_END TOOL_CALL_START TOOL_CALL_ARGS TOOL_CALL_END TOOL_CALL_RESULT TEXT_MESSAGE_START TEXT_MESSAGE_CONTENT TEXT_MESSAGE_END RUN_FINISHED");
        assert_eq!(out[5]["parentMessageId"], first.to_string());
        assert_eq!(out[6]["delta"], r#"{"path":"notes.md"}"#);
        assert_eq!(out[8]["content"], "README.md");
        assert_eq!(out[12]["outcome"]["type"], "success");
        assert_eq!(out[12]["usage"][0]["totalTokens"], 7);
    }

    #[test]
    fn approvals_end_the_run_with_interrupts_and_client_calls_with_pending_ids() {
        let (mut log, _) = Log::first_step("", &[("c1", "write_file")]);
        log.ask("c1");
        let mut stream = AgUiRun::new("t", "r", 0, HashSet::new());
        let (_, parks) = run(&mut stream, &log);
        assert_eq!(parks.len(), 1);
        let end = stream.finish_parked();
        assert_eq!(end[0]["outcome"]["type"], "interrupt");
        let interrupt = &end[0]["outcome"]["interrupts"][0];
        assert_eq!(interrupt["id"], "c1");
        assert_eq!(interrupt["reason"], "tool_call");
        assert_eq!(interrupt["toolCallId"], "c1");

        let (mut log, _) = Log::first_step("", &[("c2", "ask_user")]);
        log.client("c2", "ask_user");
        let park = log.events.last().unwrap().seq;
        let mut stream = AgUiRun::new("t", "r", 0, HashSet::new());
        run(&mut stream, &log);
        let end = stream.finish_parked();
        assert_eq!(
            end[0]["outcome"],
            json!({"type": "success", "pendingToolCallIds": ["c2"]})
        );

        // The next run shows what follows, without the result the client sent itself.
        log.finished("c2", "blue", false);
        let step = log.step(2);
        log.text(step, "Blue it is.");
        log.completed(step, "Blue it is.", &[]);
        log.done("Blue it is.");
        let known = HashSet::from(["c2".to_string()]);
        let (out, parks) = run(&mut AgUiRun::new("t", "r2", park, known), &log);
        // Only the park the client's snapshot ends at, which the driver passes by when the
        // run has moved on since (a reconnect with nothing new ends there).
        assert_eq!(parks, [park]);
        assert_eq!(types(&out), ONE_TEXT_MESSAGE_THEN_FINISHED);
        assert_eq!(out[3]["runId"], "r2");
    }

    #[test]
    fn a_denied_call_gets_its_result_and_failures_are_run_errors() {
        let (mut log, _) = Log::first_step("", &[("c1", "write_file")]);
        log.ask("c1");
        log.resolve("c1", Decision::Deny, ResolvedBy::User);
        log.finished("c1", "denied", true);
        log.push(EventKind::AgentFailed {
            run_id: log.run_id,
            error: "boom".into(),
        });
        let (out, _) = run(&mut AgUiRun::new("t", "r", 0, HashSet::new()), &log);
        let kinds = types(&out);
        assert_eq!(&kinds[3..], ["TOOL_CALL_RESULT", "RUN_ERROR"]);
        assert_eq!(out[4]["message"], "boom");
    }

    #[test]
    fn a_client_that_joins_mid_run_gets_what_is_open_opened_again() {
        let (mut log, _) = Log::first_step("", &[("t1", "task")]);
        log.push(EventKind::SubagentStarted {
            call_id: "t1".into(),
            session_id: Uuid::from_u128(55),
        });
        log.push(EventKind::SubagentFinished {
            call_id: "t1".into(),
            session_id: Uuid::from_u128(55),
            status: RunStatus::Completed,
        });
        log.finished("t1", "child says hi", false);
        let second = log.step(2);
        log.thinking(second, "hmm");
        log.text(second, "Half ");
        let joined = log.events.last().unwrap().seq;
        log.text(second, "done.");
        log.completed(second, "Half done.", &[]);
        log.done("Half done.");
        let (out, _) = run(&mut AgUiRun::new("t", "r", joined, HashSet::new()), &log);
        assert_eq!(types(&out), ONE_TEXT_MESSAGE_THEN_FINISHED);
        assert_eq!(out[0]["messageId"], second.to_string());
        assert_eq!(out[1]["delta"], "done.");

        // Joining while a sub-agent works opens it again, so that its end is well formed.
        let started = log.events[3].seq;
        let (out, _) = run(&mut AgUiRun::new("t", "r", started, HashSet::new()), &log);
        assert_eq!(&types(&out)[..2], ["SUBAGENT_STARTED", "SUBAGENT_FINISHED"]);
        assert_eq!(out[0]["parentToolCallId"], "t1");
    }

    fn message(index: i64, role: Role, content: &str) -> Message {
        indexed(index, Message::new(role, content))
    }

    fn indexed(index: i64, message: Message) -> Message {
        Message { index, ..message }
    }

    #[test]
    fn the_snapshot_keeps_the_clients_ids_and_names_the_rest_by_position() {
        let call = ToolCall {
            id: "c1".into(),
            name: "ask_user".into(),
            arguments: json!({"question": "colour?"}),
        };
        let history = vec![
            message(0, Role::System, "prompt"),
            message(1, Role::User, "hello"),
            message(2, Role::Assistant, "hi"),
            message(3, Role::User, "ask the client"),
            indexed(4, Message::assistant("", vec![call])),
        ];
        let client: Vec<InputMessage> = serde_json::from_value(json!([
            {"id": "u-1", "role": "user", "content": "ask the client"},
            {"id": "step-1", "role": "assistant", "toolCalls": [
                {"id": "c1", "type": "function", "function": {"name": "ask_user", "arguments": "{}"}}]},
            {"id": "res-1", "role": "tool", "toolCallId": "c1", "content": "blue"},
        ]))
        .unwrap();
        let pending = [&client[2]];
        let snap = snapshot(&history, &client, &pending);
        let ids: Vec<&str> = snap["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["tah-1", "tah-2", "u-1", "step-1", "res-1"]);
        assert_eq!(
            snap["messages"][3]["toolCalls"][0]["function"]["name"],
            "ask_user"
        );
        assert_eq!(snap["messages"][4]["content"], "blue");
    }

    #[test]
    fn a_snapshot_leaves_to_the_stream_what_follows_the_point_it_joins() {
        let (mut log, _) = Log::first_step("", &[("a", "write_file"), ("b", "list_files")]);
        log.ask("a");
        log.ran("b", "list_files", "README.md");
        let park = log.events.last().unwrap().seq;
        log.resolve("a", Decision::Deny, ResolvedBy::User);
        log.finished("a", "denied", true);
        let call = |id: &str| ToolCall {
            id: id.into(),
            name: "x".into(),
            arguments: json!({}),
        };
        // The history as read after the denial: both results are in.
        let history = vec![
            message(1, Role::User, "write"),
            indexed(2, Message::assistant("", vec![call("a"), call("b")])),
            indexed(3, Message::tool_result("a", "denied")),
            indexed(4, Message::tool_result("b", "README.md")),
        ];
        let (shown, early) = snapshot_view(&history, &log.events, park);
        let calls: Vec<_> = shown
            .iter()
            .filter_map(|m| m.tool_call_id.clone())
            .collect();
        assert_eq!(calls, ["b"], "a's result is the stream's to show");
        assert!(early.is_empty(), "b's result is in the history");
        // Read at the park point, b's result (after a's in call order) is not in yet.
        let (shown, early) = snapshot_view(&history[..2], &log.events, park);
        assert_eq!(shown.len(), 2);
        assert!(
            matches!(&early[..], [InputMessage::Tool { tool_call_id, id, .. }]
            if tool_call_id == "b" && *id == Uuid::from_u128(903).to_string())
        );
    }

    #[test]
    fn content_parts_give_their_text_and_other_media_is_refused() {
        assert_eq!(
            content_text(&json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])),
            Ok("a\nb".to_string())
        );
        assert!(content_text(&json!([{"type": "image", "source": {}}])).is_err());
        assert!(content_text(&json!(3)).is_err());
    }
}
