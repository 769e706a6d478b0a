//! OpenAI's Agents API as a view of a session's log: a *turn* is a run (`turn_<run hex>`),
//! the session's *items* are its messages, reasoning, calls and their outputs, and its
//! stream is `agent.session.*` events.
//!
//! [`SessionView`] is fed the log in order and gives, per log event, the stream's events and
//! the items as they stand. Stream events are numbered from the log so that `Last-Event-ID`
//! resumes exactly: the `k`-th event made from the log event `seq` is `seq × 16 + k`.
//! A call waiting for a human's approval or for the client's result is a required action of
//! type `function_call` (answered by `agent.session.input.tool_result`: for an approval,
//! `success` allows the call and its absence denies it).
//!
//! Pure: no I/O. The HTTP face reads the log and writes the frames.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Value};
use uuid::Uuid;

use super::responses::{label_of, Frame, FRAMES_PER_EVENT};
use crate::model::{Event, EventKind, RunStatus, Usage};
use crate::protocols::calls::RunCalls;

/// A turn's id: its run's.
pub fn turn_id(run: Uuid) -> String {
    format!("turn_{}", run.simple())
}

/// The run a turn id names.
pub fn parse_turn(id: &str) -> Option<Uuid> {
    Uuid::try_parse(id.strip_prefix("turn_")?).ok()
}

/// Token usage in OpenAI's shape.
pub fn usage(usage: &Usage) -> Value {
    json!({
        "input_tokens": usage.input_tokens,
        "input_tokens_details": { "cached_tokens": 0 },
        "output_tokens": usage.output_tokens,
        "output_tokens_details": { "reasoning_tokens": 0 },
        "total_tokens": usage.input_tokens + usage.output_tokens,
    })
}

/// What a session object says beside what the log gives.
#[derive(Debug, Clone, Default)]
pub struct SessionStatic {
    pub id: Uuid,
    pub agent: Value,
    pub created_at: i64,
    pub metadata: Value,
}

/// What a session object says that changes as the session runs.
#[derive(Debug, Clone)]
pub struct SessionNow {
    pub status: &'static str,
    pub error: Option<String>,
    pub last_active_at: i64,
    pub usage: Usage,
    pub required_actions: Vec<Value>,
}

/// The `AgentSession` object.
pub fn session_object(info: &SessionStatic, state: SessionNow) -> Value {
    json!({
        "id": info.id.to_string(),
        "object": "agent.session",
        "agent": info.agent,
        "created_at": info.created_at,
        "environment": { "type": "none" },
        "error": state.error,
        "last_active_at": state.last_active_at,
        "metadata": info.metadata,
        "required_actions": state.required_actions,
        "status": state.status,
        "usage": usage(&state.usage),
        "vault_ids": [],
    })
}

/// The calls of `run` that wait for an answer (a human's approval, the client's result), as
/// required actions of type `function_call`.
pub fn required_actions(calls: &RunCalls, run: Option<Uuid>) -> Vec<Value> {
    let turn = run.map(turn_id);
    calls
        .waiting()
        .map(|call| {
            json!({
                "type": "function_call", "call_id": call.id, "name": call.tool,
                "arguments": call.input, "turn_id": turn,
            })
        })
        .collect()
}

/// A session's log, read in order.
#[derive(Debug, Clone)]
pub struct SessionView {
    info: SessionStatic,
    status: &'static str,
    error: Option<String>,
    last_active_at: i64,
    usage: Usage,
    run: Option<Uuid>,
    run_started_at: i64,
    run_usage: Usage,
    calls: RunCalls,
    client_calls: HashSet<String>,
    items: Vec<Value>,
    /// Index in `items` of each call's `mcp_call` item.
    call_items: HashMap<String, usize>,
    message: Option<usize>,
    reasoning: Option<usize>,
    step: Option<Uuid>,
    /// The sub-agents started: child session, its item, and the call.
    pub subagents: Vec<Value>,
}

impl SessionView {
    pub fn new(info: SessionStatic) -> SessionView {
        let created = info.created_at;
        SessionView {
            info,
            status: "idle",
            error: None,
            last_active_at: created,
            usage: Usage::default(),
            run: None,
            run_started_at: created,
            run_usage: Usage::default(),
            calls: RunCalls::default(),
            client_calls: HashSet::new(),
            items: Vec::new(),
            call_items: HashMap::new(),
            message: None,
            reasoning: None,
            step: None,
            subagents: Vec::new(),
        }
    }

    /// The session's items as the log has them so far.
    pub fn items(&self) -> &[Value] {
        &self.items
    }

    /// The `AgentSession` object.
    pub fn object(&self) -> Value {
        let required = match self.status {
            "requires_action" => required_actions(&self.calls, self.run),
            _ => Vec::new(),
        };
        let state = SessionNow {
            status: self.status,
            error: self.error.clone(),
            last_active_at: self.last_active_at,
            usage: self.usage,
            required_actions: required,
        };
        session_object(&self.info, state)
    }

    fn turn(&self, status: &str, completed_at: Option<i64>, error: Option<&str>) -> Value {
        json!({
            "id": self.run.map(turn_id),
            "object": "agent.session.turn",
            "agent_id": self.info.agent["id"],
            "session_id": self.info.id.to_string(),
            "created_at": self.run_started_at,
            "started_at": self.run_started_at,
            "completed_at": completed_at,
            "status": status,
            "error": error.map(|message| json!({ "code": "server_error", "message": message })),
            "subagent_id": null,
            "usage": usage(&self.run_usage),
        })
    }

    /// Reads the next event; the stream events it gives.
    pub fn push(&mut self, event: &Event) -> Vec<Frame> {
        let at = event.created_at.timestamp();
        self.last_active_at = at;
        let parked = self.calls.apply(event);
        let mut out = Out {
            base: event.seq * FRAMES_PER_EVENT,
            session: self.info.id.to_string(),
            frames: Vec::new(),
        };
        self.shape(&event.kind, at, &mut out);
        if parked {
            self.status = "requires_action";
            let session = self.object();
            out.push(
                "agent.session.requires_action",
                json!({ "session": session }),
            );
        }
        out.frames.truncate(FRAMES_PER_EVENT as usize);
        out.frames
    }

    fn add_item(&mut self, item: Value, out: &mut Out) -> usize {
        let at = self.items.len();
        self.items.push(item);
        out.push(
            "agent.session.turn.item.added",
            json!({
                "item": self.items[at], "output_index": at,
                "turn_id": self.run.map(turn_id),
            }),
        );
        at
    }

    fn done_item(&mut self, at: usize, status: &str, out: &mut Out) {
        self.items[at]["status"] = Value::String(status.to_string());
        out.push(
            "agent.session.turn.item.done",
            json!({ "item": self.items[at], "output_index": at, "turn_id": self.run.map(turn_id) }),
        );
    }

    fn shape(&mut self, kind: &EventKind, at: i64, out: &mut Out) {
        let turn = self.run.map(turn_id);
        match kind {
            EventKind::SessionCreated { .. } => {
                let session = self.object();
                out.push("agent.session.created", json!({ "session": session }));
            }
            EventKind::AgentStarted { run_id, .. } => {
                self.run = Some(*run_id);
                self.run_started_at = at;
                self.run_usage = Usage::default();
                self.calls = RunCalls::default();
                self.status = "in_progress";
                let turn = self.turn("in_progress", None, None);
                let id = turn_id(*run_id);
                out.push(
                    "agent.session.turn.created",
                    json!({ "turn": turn, "turn_id": id }),
                );
                out.push(
                    "agent.session.turn.in_progress",
                    json!({ "turn": turn, "turn_id": id }),
                );
                let session = self.object();
                out.push("agent.session.in_progress", json!({ "session": session }));
            }
            EventKind::UserMessage { message, .. } => {
                let item = json!({
                    "type": "message", "id": format!("msg_{}", message.index), "role": "user",
                    "status": "completed", "phase": null, "turn_id": turn,
                    "content": [{ "type": "input_text", "text": message.content }],
                });
                self.add_item(item, out);
            }
            EventKind::LlmStarted { step_id } => {
                self.step = Some(*step_id);
                self.message = None;
                self.reasoning = None;
            }
            EventKind::ThinkingStream { text, .. } => {
                let at = match self.reasoning {
                    Some(at) => at,
                    None => {
                        let item = json!({
                            "type": "reasoning", "id": format!("rs_{}", self.step_hex()),
                            "status": "in_progress", "turn_id": turn,
                            "summary": [{ "type": "summary_text", "text": "" }],
                        });
                        let at = self.add_item(item, out);
                        out.push(
                            "agent.session.turn.reasoning_summary_part.added",
                            json!({
                                "item_id": self.items[at]["id"], "output_index": at,
                                "summary_index": 0, "part": self.items[at]["summary"][0],
                                "turn_id": turn,
                            }),
                        );
                        self.reasoning = Some(at);
                        at
                    }
                };
                append_text(&mut self.items[at]["summary"][0]["text"], text);
                out.push(
                    "agent.session.turn.reasoning_summary_text.delta",
                    json!({
                        "item_id": self.items[at]["id"], "output_index": at,
                        "summary_index": 0, "delta": text, "turn_id": turn,
                    }),
                );
            }
            EventKind::AssistantStream { text, .. } => {
                self.close_reasoning(out);
                let at = self.open_message(out);
                append_text(&mut self.items[at]["content"][0]["text"], text);
                out.push(
                    "agent.session.turn.output_text.delta",
                    json!({
                        "item_id": self.items[at]["id"], "output_index": at, "content_index": 0,
                        "delta": text, "turn_id": turn,
                    }),
                );
            }
            EventKind::LlmCompleted { message, usage, .. } => {
                let thinking: String = message.thinking.iter().map(|t| t.text()).collect();
                self.close_reasoning(out);
                if self.reasoning.is_none() && !thinking.is_empty() {
                    let item = json!({
                        "type": "reasoning", "id": format!("rs_{}", self.step_hex()),
                        "status": "completed", "turn_id": turn,
                        "summary": [{ "type": "summary_text", "text": thinking }],
                    });
                    let at = self.add_item(item, out);
                    self.done_item(at, "completed", out);
                }
                if self.message.is_none() && !message.content.is_empty() {
                    let at = self.open_message(out);
                    self.items[at]["content"][0]["text"] = Value::String(message.content.clone());
                }
                if let Some(at) = self.message {
                    let item_id = self.items[at]["id"].clone();
                    let part = self.items[at]["content"][0].clone();
                    out.push(
                        "agent.session.turn.output_text.done",
                        json!({
                            "item_id": item_id, "output_index": at, "content_index": 0,
                            "text": part["text"], "turn_id": turn,
                        }),
                    );
                    out.push(
                        "agent.session.turn.content_part.done",
                        json!({
                            "item_id": item_id, "output_index": at, "content_index": 0,
                            "part": part, "turn_id": turn,
                        }),
                    );
                    self.done_item(at, "completed", out);
                }
                self.usage.add(*usage);
                self.run_usage.add(*usage);
            }
            EventKind::ToolClientRequested {
                call_id,
                tool,
                input,
                ..
            } => {
                self.client_calls.insert(call_id.clone());
                let item = json!({
                    "type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id,
                    "name": tool, "arguments": input, "status": "in_progress", "turn_id": turn,
                });
                let at = self.add_item(item, out);
                self.done_item(at, "completed", out);
            }
            EventKind::ToolStarted { call, .. } => {
                if self.client_calls.contains(&call.id) {
                    return;
                }
                let (server_label, name) = label_of(&call.name);
                let item = json!({
                    "type": "mcp_call", "id": format!("mcp_{}", call.id), "name": name,
                    "server_label": server_label, "arguments": call.arguments, "output": null,
                    "error": null, "status": "in_progress", "turn_id": turn,
                });
                let at = self.add_item(item, out);
                self.call_items.insert(call.id.clone(), at);
            }
            EventKind::ToolFinished {
                call_id,
                output,
                is_error,
                ..
            } => {
                if self.client_calls.contains(call_id) {
                    let item = json!({
                        "type": "function_call_output", "id": format!("fco_{call_id}"),
                        "call_id": call_id, "output": output, "status": "completed",
                        "turn_id": turn,
                    });
                    self.add_item(item, out);
                    return;
                }
                let Some(&at) = self.call_items.get(call_id) else {
                    return;
                };
                let field = if *is_error { "error" } else { "output" };
                self.items[at][field] = Value::String(output.clone());
                self.done_item(at, if *is_error { "failed" } else { "completed" }, out);
            }
            EventKind::SubagentStarted {
                call_id,
                session_id,
            } => {
                let subagent = json!({
                    "id": session_id.to_string(), "object": "agent.session.subagent",
                    "session_id": self.info.id.to_string(), "status": "active",
                    "opened_at": at, "closed_at": null, "name": call_id,
                    "instructions": null, "parent_agent_id": self.info.agent["id"],
                });
                self.subagents.push(subagent.clone());
                out.push(
                    "agent.session.subagent.created",
                    json!({ "subagent": subagent }),
                );
            }
            EventKind::SubagentFinished { session_id, .. } => {
                let id = session_id.to_string();
                if let Some(subagent) = self.subagents.iter_mut().find(|s| s["id"] == id) {
                    subagent["status"] = json!("closed");
                    subagent["closed_at"] = json!(at);
                    let subagent = subagent.clone();
                    out.push(
                        "agent.session.subagent.closed",
                        json!({ "subagent": subagent }),
                    );
                }
            }
            EventKind::AgentFinished { .. } => {
                self.status = "idle";
                self.error = None;
                self.end_turn("completed", "agent.session.turn.completed", at, None, out);
                let session = self.object();
                out.push("agent.session.idle", json!({ "session": session }));
            }
            EventKind::AgentFailed { error, .. } => {
                self.status = "failed";
                self.error = Some(error.clone());
                self.end_turn("failed", "agent.session.turn.failed", at, Some(error), out);
                let session = self.object();
                out.push("agent.session.failed", json!({ "session": session }));
            }
            EventKind::AgentCancelled { .. } => {
                self.status = "idle";
                self.end_turn("cancelled", "agent.session.turn.cancelled", at, None, out);
                let session = self.object();
                out.push("agent.session.idle", json!({ "session": session }));
            }
            _ => {}
        }
    }

    fn end_turn(
        &mut self,
        status: &str,
        kind: &'static str,
        at: i64,
        error: Option<&str>,
        out: &mut Out,
    ) {
        let turn = self.turn(status, Some(at), error);
        let id = self.run.map(turn_id);
        let usage = usage(&self.run_usage);
        out.push(kind, json!({ "turn": turn, "turn_id": id, "usage": usage }));
    }

    fn close_reasoning(&mut self, out: &mut Out) {
        let Some(at) = self.reasoning else {
            return;
        };
        if self.items[at]["status"] != "in_progress" {
            return;
        }
        let (item_id, turn) = (self.items[at]["id"].clone(), self.run.map(turn_id));
        let part = self.items[at]["summary"][0].clone();
        out.push(
            "agent.session.turn.reasoning_summary_text.done",
            json!({
                "item_id": item_id, "output_index": at, "summary_index": 0,
                "text": part["text"], "turn_id": turn,
            }),
        );
        out.push(
            "agent.session.turn.reasoning_summary_part.done",
            json!({
                "item_id": item_id, "output_index": at, "summary_index": 0, "part": part,
                "turn_id": turn,
            }),
        );
        self.done_item(at, "completed", out);
    }

    fn step_hex(&self) -> String {
        self.step
            .map(|s| s.simple().to_string())
            .unwrap_or_default()
    }

    fn open_message(&mut self, out: &mut Out) -> usize {
        if let Some(at) = self.message {
            return at;
        }
        let turn = self.run.map(turn_id);
        let part = json!({ "type": "output_text", "text": "", "annotations": [], "logprobs": [] });
        let item = json!({
            "type": "message", "id": format!("msg_{}", self.step_hex()), "role": "assistant",
            "status": "in_progress", "phase": null, "turn_id": turn, "content": [part],
        });
        let at = self.add_item(item, out);
        out.push(
            "agent.session.turn.content_part.added",
            json!({
                "item_id": self.items[at]["id"], "output_index": at, "content_index": 0,
                "part": part, "turn_id": turn,
            }),
        );
        self.message = Some(at);
        at
    }
}

/// A turn (a run) as the Agents API shows it, from tah's run record.
pub fn turn_of(run: &crate::model::RunRecord, session: Uuid, agent_id: &Value) -> Value {
    let status = match run.status {
        RunStatus::Running => "in_progress",
        RunStatus::Completed => "completed",
        RunStatus::Cancelled => "cancelled",
        _ => "failed",
    };
    json!({
        "id": turn_id(run.id),
        "object": "agent.session.turn",
        "agent_id": agent_id,
        "session_id": session.to_string(),
        "created_at": run.created_at.timestamp(),
        "started_at": run.created_at.timestamp(),
        "completed_at": run.finished_at.map(|t| t.timestamp()),
        "status": status,
        "error": run.error.as_ref().map(|m| json!({ "code": "server_error", "message": m })),
        "subagent_id": null,
        "usage": usage(&run.usage),
    })
}

struct Out {
    base: i64,
    session: String,
    frames: Vec<Frame>,
}

impl Out {
    fn push(&mut self, kind: &'static str, mut data: Value) {
        let n = self.base + self.frames.len() as i64;
        data["type"] = json!(kind);
        data["event_id"] = json!(format!("evt_{n}"));
        if data.get("session").is_none() && data.get("subagent").is_none() {
            data["session_id"] = json!(self.session);
        }
        self.frames.push(Frame {
            sequence_number: n,
            kind,
            data,
        });
    }
}

fn append_text(target: &mut Value, text: &str) {
    let mut now = target.as_str().unwrap_or("").to_string();
    now.push_str(text);
    *target = Value::String(now);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocols::calls::tests::Log;

    #[test]
    fn a_turn_gives_turn_item_and_idle_events_numbered_in_order() {
        let (log, _, _) = Log::reasoned_turn(&["hm"], &["look"], &["it ", "is"]);
        let mut view = SessionView::new(SessionStatic {
            id: Uuid::from_u128(1),
            agent: json!({ "id": "default" }),
            ..SessionStatic::default()
        });
        let frames: Vec<Frame> = log.events.iter().flat_map(|e| view.push(e)).collect();
        let numbers: Vec<i64> = frames.iter().map(|f| f.sequence_number).collect();
        assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{numbers:?}");
        let kinds: Vec<&str> = frames.iter().map(|f| f.kind).collect();
        assert_eq!(kinds[0], "agent.session.turn.created");
        assert_eq!(kinds.last(), Some(&"agent.session.idle"));
        assert!(kinds.contains(&"agent.session.turn.completed"));
        let types: Vec<&str> = view
            .items()
            .iter()
            .map(|i| i["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["reasoning", "message", "mcp_call", "message"]);
        assert_eq!(
            parse_turn(&turn_id(Uuid::from_u128(5))),
            Some(Uuid::from_u128(5))
        );
    }
}
