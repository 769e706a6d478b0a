//! A session's log as Claude Managed Agents' session events: a pure function of the log.
//!
//! [`SessionEvents`] is fed the log from its first event; each log event gives zero or more
//! [`Frame`]s, numbered `seq × 16 + k` (`k` < 16, the frame's place among that event's), so
//! that frame ids are integers, strictly increasing within the session, and resume exactly:
//! a stream resumed after frame `n` sends every frame whose id is greater than `n`.
//!
//! Event ids (the objects' own `id`):
//! - a tool call's events (`agent.tool_use`, `agent.mcp_tool_use`, `agent.custom_tool_use`)
//!   carry tah's call id, so that `requires_action.event_ids` are what
//!   `user.tool_confirmation.tool_use_id` and `user.custom_tool_result.custom_tool_use_id`
//!   name;
//! - a step's `agent.message` and `agent.thinking` are `sevt_msg_<step>` and
//!   `sevt_thk_<step>` (their deltas, streamed before the step ends, name them already);
//!   `span.model_request_start` is `sevt_span_<step>`;
//! - every other event is `sevt_<frame id>`.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::model::{Decision, Event, EventKind, FinishReason, ResolvedBy, Usage, BUILTIN_TOOLS};
use crate::protocols::calls::RunCalls;

/// How many frames one log event may give at most: frame ids are `seq × FRAMES + k`.
pub const FRAMES: i64 = 16;

/// The delta kinds a stream may ask for (`event_deltas`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Deltas {
    pub message: bool,
    pub thinking: bool,
}

/// One session event (or, in a stream that asked for deltas, an `event_start` /
/// `event_delta` preview) with its frame id.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub id: i64,
    /// The event's `type` (the SSE `event:` name).
    pub kind: String,
    pub event: Value,
    /// A preview (`event_start`, `event_delta`): streamed only, never listed.
    pub preview: bool,
}

/// The vendor's name of a built-in tool (tah's own name where it has none).
pub fn vendor_tool_name(tah: &str) -> &str {
    match tah {
        "shell" => "bash",
        "read_file" => "read",
        "write_file" => "write",
        "edit_file" => "edit",
        other => other,
    }
}

/// tah's name of a built-in tool named the vendor's way (or tah's way).
pub fn tah_tool_name(vendor: &str) -> Option<&'static str> {
    let name = match vendor {
        "bash" => "shell",
        "read" => "read_file",
        "write" => "write_file",
        "edit" => "edit_file",
        other => other,
    };
    BUILTIN_TOOLS.iter().copied().find(|t| *t == name)
}

/// `mcp__<server>__<tool>` split into its server and tool.
pub fn mcp_parts(name: &str) -> Option<(&str, &str)> {
    name.strip_prefix(crate::mcp::PREFIX)?.split_once("__")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallKind {
    Builtin,
    Mcp,
    Custom,
}

fn kind_of_name(name: &str) -> CallKind {
    match mcp_parts(name) {
        Some(_) => CallKind::Mcp,
        None => CallKind::Builtin,
    }
}

#[derive(Debug, Clone)]
struct KnownCall {
    name: String,
    input: Value,
    kind: CallKind,
}

/// The session events of a log, event by event.
#[derive(Debug, Default)]
pub struct SessionEvents {
    deltas: Deltas,
    calls: HashMap<String, KnownCall>,
    /// Calls whose tool-use event was given.
    announced: HashSet<String>,
    /// Steps whose message / thinking preview was opened.
    previewed: HashSet<(Uuid, bool)>,
    run: RunCalls,
    parked: bool,
    usage: Usage,
}

/// The frames of one log event, as they are made.
struct Out<'a> {
    seq: i64,
    at: &'a DateTime<Utc>,
    frames: Vec<Frame>,
}

impl Out<'_> {
    fn next_id(&self) -> i64 {
        self.seq * FRAMES + self.frames.len() as i64
    }

    /// An event with the id `sevt_<frame id>`.
    fn event(&mut self, kind: &str, fields: Value) {
        let id = format!("sevt_{}", self.next_id());
        self.with_id(id, kind, fields);
    }

    fn with_id(&mut self, id: String, kind: &str, fields: Value) {
        let mut event = json!({"id": id, "type": kind, "processed_at": stamp(self.at)});
        if let (Some(event), Value::Object(fields)) = (event.as_object_mut(), fields) {
            event.extend(fields);
        }
        self.push(kind, event, false);
    }

    fn push(&mut self, kind: &str, event: Value, preview: bool) {
        debug_assert!((self.frames.len() as i64) < FRAMES);
        let id = self.next_id();
        self.frames.push(Frame {
            id,
            kind: kind.to_string(),
            event,
            preview,
        });
    }
}

/// A time as the vendor's objects show it.
pub fn stamp(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

fn message_id(step: Uuid) -> String {
    format!("sevt_msg_{}", step.simple())
}

fn thinking_id(step: Uuid) -> String {
    format!("sevt_thk_{}", step.simple())
}

fn span_id(step: Uuid) -> String {
    format!("sevt_span_{}", step.simple())
}

fn text_blocks(text: &str) -> Value {
    json!([{"type": "text", "text": text}])
}

impl SessionEvents {
    /// A view that gives the previews `deltas` asks for (none: only events).
    pub fn new(deltas: Deltas) -> SessionEvents {
        SessionEvents {
            deltas,
            ..SessionEvents::default()
        }
    }

    /// The frames of the next log event.
    pub fn push(&mut self, event: &Event) -> Vec<Frame> {
        let mut out = Out {
            seq: event.seq,
            at: &event.created_at,
            frames: Vec::new(),
        };
        let parked_now = self.run.apply(event);
        // A parked run goes on: after a person's answer (or its timeout), or at the next step
        // or tool it runs. A client's result waits for the step it leads to (a cancel ends
        // waiting calls with results too, and the run then does not go on).
        let answer = matches!(
            event.kind,
            EventKind::ToolApprovalResolved {
                by: ResolvedBy::User | ResolvedBy::Timeout,
                ..
            }
        );
        let step = matches!(
            event.kind,
            EventKind::LlmStarted { .. } | EventKind::ToolStarted { .. }
        );
        let resumes = self.parked && !parked_now && (answer || step);
        if resumes && step {
            self.parked = false;
            out.event("session.status_running", json!({}));
        }
        self.frames(&mut out, &event.kind);
        if resumes && answer {
            self.parked = false;
            out.event("session.status_running", json!({}));
        }
        if parked_now {
            self.parked = true;
            let ids: Vec<String> = self.run.waiting().map(|c| c.id.clone()).collect();
            out.event(
                "session.status_idle",
                json!({
                    "stop_reason": {"type": "requires_action", "event_ids": ids},
                    "stop_details": null,
                }),
            );
        }
        out.frames
    }

    fn frames(&mut self, out: &mut Out, kind: &EventKind) {
        match kind {
            EventKind::AgentStarted { .. } => {
                self.run = RunCalls::default();
                self.parked = false;
                out.event("session.status_running", json!({}));
            }
            EventKind::UserMessage { message, .. } => {
                out.event(
                    "user.message",
                    json!({"content": text_blocks(&message.content)}),
                );
            }
            EventKind::LlmStarted { step_id } => {
                out.with_id(span_id(*step_id), "span.model_request_start", json!({}));
            }
            EventKind::AssistantStream { step_id, text } => {
                if self.deltas.message {
                    self.preview(out, *step_id, false, text);
                }
            }
            EventKind::ThinkingStream { step_id, text } => {
                if self.deltas.thinking {
                    self.preview(out, *step_id, true, text);
                }
            }
            EventKind::LlmCompleted {
                step_id,
                message,
                usage,
                ..
            } => {
                self.usage.add(*usage);
                for call in &message.tool_calls {
                    self.calls.insert(
                        call.id.clone(),
                        KnownCall {
                            name: call.name.clone(),
                            input: call.arguments.clone(),
                            kind: kind_of_name(&call.name),
                        },
                    );
                }
                if !message.thinking.is_empty() {
                    out.with_id(thinking_id(*step_id), "agent.thinking", json!({}));
                }
                if !message.content.is_empty() {
                    out.with_id(
                        message_id(*step_id),
                        "agent.message",
                        json!({"content": text_blocks(&message.content)}),
                    );
                }
                out.event(
                    "span.model_request_end",
                    json!({
                        "model_request_start_id": span_id(*step_id),
                        "is_error": false,
                        "model_usage": model_usage(*usage),
                    }),
                );
            }
            EventKind::LlmRetry { error, .. } => {
                out.event(
                    "session.error",
                    json!({"error": error_object("model_request_failed_error", error, "retrying")}),
                );
            }
            EventKind::LlmFailed { step_id, error } => {
                out.event(
                    "span.model_request_end",
                    json!({
                        "model_request_start_id": span_id(*step_id),
                        "is_error": true,
                        "model_usage": model_usage(Usage::default()),
                    }),
                );
                out.event(
                    "session.error",
                    json!({"error": error_object("model_request_failed_error", error, "exhausted")}),
                );
            }
            EventKind::ToolApprovalRequested { call_id, .. } => {
                self.announce(out, call_id, Some("ask"));
            }
            EventKind::ToolClientRequested {
                call_id,
                tool,
                input,
                ..
            } => {
                let call = self.calls.entry(call_id.clone()).or_insert(KnownCall {
                    name: tool.clone(),
                    input: input.clone(),
                    kind: CallKind::Custom,
                });
                call.kind = CallKind::Custom;
                self.announce(out, call_id, None);
            }
            EventKind::ToolApprovalResolved {
                call_id,
                decision,
                by,
                reason,
                ..
            } => match by {
                ResolvedBy::User => {
                    let result = match decision {
                        Decision::Deny => "deny",
                        Decision::Allow | Decision::Always => "allow",
                    };
                    out.event(
                        "user.tool_confirmation",
                        json!({"tool_use_id": call_id, "result": result, "deny_message": reason}),
                    );
                }
                ResolvedBy::Policy => self.announce(out, call_id, Some("deny")),
                ResolvedBy::Timeout | ResolvedBy::Cancel => {}
            },
            EventKind::ToolStarted { call, .. } => {
                self.calls.entry(call.id.clone()).or_insert(KnownCall {
                    name: call.name.clone(),
                    input: call.arguments.clone(),
                    kind: kind_of_name(&call.name),
                });
                self.announce(out, &call.id, Some("allow"));
            }
            EventKind::ToolFinished {
                call_id,
                output,
                is_error,
                ..
            } => {
                self.announce(out, call_id, None);
                let kind = self.calls.get(call_id).map(|c| c.kind);
                let content = text_blocks(output);
                match kind {
                    Some(CallKind::Custom) => out.event(
                        "user.custom_tool_result",
                        json!({"custom_tool_use_id": call_id, "content": content, "is_error": is_error}),
                    ),
                    Some(CallKind::Mcp) => out.event(
                        "agent.mcp_tool_result",
                        json!({"mcp_tool_use_id": call_id, "content": content, "is_error": is_error}),
                    ),
                    _ => out.event(
                        "agent.tool_result",
                        json!({"tool_use_id": call_id, "content": content, "is_error": is_error}),
                    ),
                }
            }
            EventKind::ContextCompacted { .. } => {
                out.event("agent.thread_context_compacted", json!({}));
            }
            EventKind::AgentFinished { finish_reason, .. } => {
                self.session_usage(out);
                let stop = match finish_reason {
                    FinishReason::Budget => "budget_reached",
                    FinishReason::MaxSteps => {
                        out.event(
                            "session.error",
                            json!({"error": error_object(
                                "tool_use_limit_reached_error",
                                "the run made as many model calls as its max_steps allows",
                                "terminal",
                            )}),
                        );
                        "end_turn"
                    }
                    FinishReason::Model(_) => "end_turn",
                };
                self.idle(out, stop);
            }
            EventKind::AgentFailed { error, .. } => {
                out.event(
                    "session.error",
                    json!({"error": error_object("unknown_error", error, "terminal")}),
                );
                self.session_usage(out);
                self.idle(out, "retries_exhausted");
            }
            EventKind::AgentCancelled { .. } => {
                self.session_usage(out);
                self.idle(out, "end_turn");
            }
            EventKind::SessionCreated { .. }
            | EventKind::SessionForked { .. }
            | EventKind::StateChanged { .. }
            | EventKind::ArtifactCreated { .. }
            | EventKind::ToolPolicyUpdated { .. }
            | EventKind::SubagentStarted { .. }
            | EventKind::SubagentFinished { .. }
            | EventKind::ContextTrimmed { .. }
            | EventKind::ContextCompactFailed { .. }
            | EventKind::SessionUsage { .. }
            | EventKind::Checkpoint { .. } => {}
        }
    }

    fn idle(&mut self, out: &mut Out, stop: &str) {
        self.parked = false;
        out.event(
            "session.status_idle",
            json!({"stop_reason": {"type": stop}, "stop_details": null}),
        );
    }

    fn session_usage(&self, out: &mut Out) {
        out.event(
            "session.usage",
            json!({"usage": {
                "input_tokens": self.usage.input_tokens,
                "output_tokens": self.usage.output_tokens,
            }}),
        );
    }

    /// An `event_start` the first time a step's message (or thinking) streams, then its delta.
    fn preview(&mut self, out: &mut Out, step: Uuid, thinking: bool, text: &str) {
        let (id, kind) = match thinking {
            true => (thinking_id(step), "agent.thinking"),
            false => (message_id(step), "agent.message"),
        };
        if self.previewed.insert((step, thinking)) {
            out.push(
                "event_start",
                json!({"type": "event_start", "event": {"id": id, "type": kind}}),
                true,
            );
        }
        out.push(
            "event_delta",
            json!({
                "type": "event_delta",
                "event_id": id,
                "delta": {"type": "content_delta", "content": {"type": "text", "text": text}},
            }),
            true,
        );
    }

    /// The tool-use event of a call, once: `agent.tool_use`, `agent.mcp_tool_use` or
    /// `agent.custom_tool_use`, with the policy's verdict where the log has one.
    fn announce(&mut self, out: &mut Out, call_id: &str, permission: Option<&str>) {
        if self.announced.contains(call_id) {
            return;
        }
        let Some(call) = self.calls.get(call_id) else {
            return;
        };
        self.announced.insert(call_id.to_string());
        let mut fields = json!({"input": call.input});
        match call.kind {
            CallKind::Custom => {
                fields["name"] = json!(call.name);
                out.with_id(call_id.to_string(), "agent.custom_tool_use", fields);
                return;
            }
            CallKind::Mcp => {
                let (server, tool) = mcp_parts(&call.name).unwrap_or(("", &call.name));
                fields["mcp_server_name"] = json!(server);
                fields["name"] = json!(tool);
            }
            CallKind::Builtin => fields["name"] = json!(vendor_tool_name(&call.name)),
        }
        if let Some(permission) = permission {
            fields["evaluated_permission"] = json!(permission);
        }
        let kind = match call.kind {
            CallKind::Mcp => "agent.mcp_tool_use",
            _ => "agent.tool_use",
        };
        out.with_id(call_id.to_string(), kind, fields);
    }
}

fn model_usage(usage: Usage) -> Value {
    json!({
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    })
}

fn error_object(kind: &str, message: &str, retry: &str) -> Value {
    json!({"type": kind, "message": message, "retry_status": {"type": retry}})
}

/// The frame id a stream resumes after: an integer frame id, as `Last-Event-ID` carries it.
pub fn parse_frame_id(text: &str) -> Option<i64> {
    text.trim().parse::<i64>().ok().filter(|n| *n >= 0)
}

/// The last frame id a log of `last_seq` events can have given.
pub fn last_frame_of(last_seq: i64) -> i64 {
    last_seq * FRAMES + FRAMES - 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Message, RunKind, ToolCall};
    use crate::protocols::calls::tests::Log;

    fn all(log: &Log, deltas: Deltas) -> Vec<Frame> {
        let mut view = SessionEvents::new(deltas);
        log.events.iter().flat_map(|e| view.push(e)).collect()
    }

    fn kinds(frames: &[Frame]) -> Vec<&str> {
        frames.iter().map(|f| f.kind.as_str()).collect()
    }

    fn turn(log: &mut Log, text: &str) {
        let step_id = Uuid::from_u128(1);
        log.push(EventKind::LlmStarted { step_id });
        log.push(EventKind::AssistantStream {
            step_id,
            text: text.to_string(),
        });
        log.push(EventKind::LlmCompleted {
            step_id,
            message: Message::assistant(text, Vec::new()),
            finish_reason: FinishReason::Model("stop".into()),
            usage: Usage {
                input_tokens: 3,
                output_tokens: 4,
            },
            cost_usd: None,
        });
    }

    #[test]
    fn a_turn_is_running_message_usage_and_idle_with_increasing_ids() {
        let mut log = Log::new();
        turn(&mut log, "hello");
        let run_id = log.run_id;
        log.push(EventKind::AgentFinished {
            run_id,
            text: "hello".into(),
            finish_reason: FinishReason::Model("stop".into()),
            usage: Usage::default(),
        });
        let frames = all(&log, Deltas::default());
        assert_eq!(
            kinds(&frames),
            [
                "session.status_running",
                "span.model_request_start",
                "agent.message",
                "span.model_request_end",
                "session.usage",
                "session.status_idle"
            ]
        );
        assert!(frames.windows(2).all(|w| w[0].id < w[1].id));
        let message = &frames[2].event;
        assert_eq!(message["content"][0]["text"], "hello");
        assert_eq!(frames[5].event["stop_reason"]["type"], "end_turn");
        assert_eq!(frames[4].event["usage"]["output_tokens"], 4);
        // Deltas come only when asked, and name the message that follows.
        let with = all(
            &log,
            Deltas {
                message: true,
                thinking: false,
            },
        );
        let start = with.iter().find(|f| f.kind == "event_start").unwrap();
        assert_eq!(start.event["event"]["id"], message["id"]);
    }

    #[test]
    fn an_approval_parks_with_the_call_id_and_the_answer_runs_again() {
        let mut log = Log::new();
        let step_id = Uuid::from_u128(2);
        let call = ToolCall {
            id: "call_1".into(),
            name: "shell".into(),
            arguments: json!({"command": "ls"}),
        };
        log.push(EventKind::LlmCompleted {
            step_id,
            message: Message::assistant("", vec![call.clone()]),
            finish_reason: FinishReason::Model("tool_calls".into()),
            usage: Usage::default(),
            cost_usd: None,
        });
        log.push(EventKind::ToolApprovalRequested {
            step_id,
            call_id: "call_1".into(),
            tool: "shell".into(),
            input: json!({"command": "ls"}),
            subject: "ls".into(),
            expires_at: None,
        });
        log.push(EventKind::ToolApprovalResolved {
            call_id: "call_1".into(),
            decision: Decision::Allow,
            by: ResolvedBy::User,
            reason: None,
            input: None,
            answered_by: None,
        });
        log.push(EventKind::ToolStarted { step_id, call });
        log.push(EventKind::ToolFinished {
            step_id,
            call_id: "call_1".into(),
            output: "ok".into(),
            is_error: false,
        });
        let frames = all(&log, Deltas::default());
        assert_eq!(
            kinds(&frames),
            [
                "session.status_running",
                "span.model_request_end",
                "agent.tool_use",
                "session.status_idle",
                "user.tool_confirmation",
                "session.status_running",
                "agent.tool_result"
            ]
        );
        assert_eq!(frames[2].event["id"], "call_1");
        assert_eq!(frames[2].event["name"], "bash");
        assert_eq!(frames[2].event["evaluated_permission"], "ask");
        assert_eq!(
            frames[3].event["stop_reason"],
            json!({"type": "requires_action", "event_ids": ["call_1"]})
        );
        assert_eq!(frames[6].event["tool_use_id"], "call_1");
    }

    #[test]
    fn a_parked_run_that_is_cancelled_does_not_run_again() {
        let mut log = Log::new();
        let step_id = Uuid::from_u128(4);
        let call = ToolCall {
            id: "w1".into(),
            name: "write_file".into(),
            arguments: json!({"path": "a"}),
        };
        log.push(EventKind::LlmCompleted {
            step_id,
            message: Message::assistant("", vec![call]),
            finish_reason: FinishReason::Model("tool_calls".into()),
            usage: Usage::default(),
            cost_usd: None,
        });
        log.push(EventKind::ToolApprovalRequested {
            step_id,
            call_id: "w1".into(),
            tool: "write_file".into(),
            input: json!({"path": "a"}),
            subject: "a".into(),
            expires_at: None,
        });
        log.push(EventKind::ToolApprovalResolved {
            call_id: "w1".into(),
            decision: Decision::Deny,
            by: ResolvedBy::Cancel,
            reason: None,
            input: None,
            answered_by: None,
        });
        log.push(EventKind::ToolFinished {
            step_id,
            call_id: "w1".into(),
            output: "cancelled".into(),
            is_error: true,
        });
        let run_id = log.run_id;
        log.push(EventKind::AgentCancelled { run_id });
        let frames = all(&log, Deltas::default());
        assert_eq!(
            kinds(&frames),
            [
                "session.status_running",
                "span.model_request_end",
                "agent.tool_use",
                "session.status_idle",
                "agent.tool_result",
                "session.usage",
                "session.status_idle"
            ]
        );
        assert_eq!(frames[6].event["stop_reason"]["type"], "end_turn");
    }

    #[test]
    fn client_and_mcp_calls_have_their_own_events() {
        let mut log = Log::new();
        let step_id = Uuid::from_u128(3);
        let calls = vec![
            ToolCall {
                id: "c1".into(),
                name: "lookup".into(),
                arguments: json!({"q": 1}),
            },
            ToolCall {
                id: "m1".into(),
                name: "mcp__fs__read".into(),
                arguments: json!({}),
            },
        ];
        log.push(EventKind::LlmCompleted {
            step_id,
            message: Message::assistant("", calls.clone()),
            finish_reason: FinishReason::Model("tool_calls".into()),
            usage: Usage::default(),
            cost_usd: None,
        });
        log.push(EventKind::ToolStarted {
            step_id,
            call: calls[1].clone(),
        });
        log.push(EventKind::ToolFinished {
            step_id,
            call_id: "m1".into(),
            output: "x".into(),
            is_error: false,
        });
        log.push(EventKind::ToolClientRequested {
            step_id,
            call_id: "c1".into(),
            tool: "lookup".into(),
            input: json!({"q": 1}),
            expires_at: None,
            environment: None,
        });
        let frames = all(&log, Deltas::default());
        assert_eq!(
            kinds(&frames),
            [
                "session.status_running",
                "span.model_request_end",
                "agent.mcp_tool_use",
                "agent.mcp_tool_result",
                "agent.custom_tool_use",
                "session.status_idle"
            ]
        );
        assert_eq!(frames[2].event["mcp_server_name"], "fs");
        assert_eq!(frames[2].event["name"], "read");
        assert_eq!(frames[4].event["id"], "c1");
        let _ = RunKind::Run;
    }
}
