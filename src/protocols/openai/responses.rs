//! OpenAI's Responses API as a view of a session's log: a *response* is the stretch of one
//! run's events from where its request took over (the run's start, or the point where the
//! run waited for the answers that request carried) to where it ended or next waited for
//! answers. Its id encodes the session, the run and that starting point, so nothing is
//! stored: `resp_<session hex><run hex><after seq>`.
//!
//! [`ResponseView`] is fed a run's events in order. Events up to the response's start are
//! read silently (they tell which calls wait); later ones give the stream's `response.*`
//! events and build the `Response` object. Stream events are numbered from the log so that a
//! stream resumes exactly: the opening `response.created` and `response.in_progress` are
//! `0` and `1`, and the `k`-th event made from the log event `seq` is `seq × 16 + k`.
//!
//! Pure: no I/O. The HTTP face reads the log and writes the frames.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Value};
use uuid::Uuid;

use crate::model::{Event, EventKind, FinishReason, Usage};
use crate::protocols::calls::RunCalls;

/// How many stream events one log event may give at most (see the module's numbering).
pub const FRAMES_PER_EVENT: i64 = 16;

/// The server label of tah's own tools shown as `mcp_call` items.
pub const TAH_SERVER_LABEL: &str = "tah";

/// A response's id: the session, the run, and the log seq after which the response starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseId {
    pub session: Uuid,
    pub run: Uuid,
    pub after: i64,
}

impl ResponseId {
    pub fn encode(&self) -> String {
        format!(
            "resp_{}{}{}",
            self.session.simple(),
            self.run.simple(),
            self.after
        )
    }

    pub fn parse(id: &str) -> Option<ResponseId> {
        let rest = id.strip_prefix("resp_")?;
        let session = Uuid::try_parse(rest.get(..32)?).ok()?;
        let run = Uuid::try_parse(rest.get(32..64)?).ok()?;
        let after = rest.get(64..)?;
        if after.is_empty() || !after.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(ResponseId {
            session,
            run,
            after: after.parse().ok()?,
        })
    }
}

/// A conversation's id: the session's.
pub fn conversation_id(session: Uuid) -> String {
    format!("conv_{}", session.simple())
}

/// The session a conversation id (or a bare session UUID) names.
pub fn parse_conversation(id: &str) -> Option<Uuid> {
    let hex = id.strip_prefix("conv_").unwrap_or(id);
    Uuid::try_parse(hex).ok()
}

/// The id of the `mcp_approval_request` item of a call that waits for approval.
pub fn approval_item_id(call_id: &str) -> String {
    format!("mcpr_{call_id}")
}

/// The call an `mcp_approval_request` item id names.
pub fn call_of_approval_item(id: &str) -> Option<&str> {
    id.strip_prefix("mcpr_").filter(|c| !c.is_empty())
}

/// One stream event: its `sequence_number` and its JSON (which carries the number too).
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub sequence_number: i64,
    pub kind: &'static str,
    pub data: Value,
}

/// Where a response is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Queued,
    InProgress,
    Completed,
    Incomplete,
    Failed,
    Cancelled,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
            Status::Incomplete => "incomplete",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }

    pub fn is_final(self) -> bool {
        !matches!(self, Status::Queued | Status::InProgress)
    }
}

/// What the `Response` object says beside what the log gives.
#[derive(Debug, Clone, Default)]
pub struct Echo {
    pub model: String,
    pub instructions: Option<String>,
    pub metadata: Value,
    pub tools: Value,
    pub previous_response_id: Option<String>,
    pub background: bool,
}

/// A response being read from its run's log.
#[derive(Debug, Clone)]
pub struct ResponseView {
    pub id: ResponseId,
    pub echo: Echo,
    created_at: i64,
    status: Status,
    error: Option<Value>,
    incomplete: Option<&'static str>,
    output: Vec<Value>,
    usage: Usage,
    calls: RunCalls,
    /// Calls of the client's tools (shown as `function_call`, never as `mcp_call`).
    client_calls: HashSet<String>,
    /// Calls that asked for approval (their `mcp_call` names the request).
    approvals: HashSet<String>,
    /// Output index of each call's `mcp_call` item in this response.
    call_items: HashMap<String, usize>,
    reasoning: Option<usize>,
    message: Option<usize>,
    step: Option<Uuid>,
}

impl ResponseView {
    pub fn new(id: ResponseId, echo: Echo, created_at: i64) -> ResponseView {
        ResponseView {
            id,
            echo,
            created_at,
            status: Status::InProgress,
            error: None,
            incomplete: None,
            output: Vec::new(),
            usage: Usage::default(),
            calls: RunCalls::default(),
            client_calls: HashSet::new(),
            approvals: HashSet::new(),
            call_items: HashMap::new(),
            reasoning: None,
            message: None,
            step: None,
        }
    }

    pub fn status(&self) -> Status {
        self.status
    }

    /// Shown as `queued` until the run makes its first move (a background response).
    pub fn set_queued(&mut self) {
        if self.status == Status::InProgress && self.output.is_empty() {
            self.status = Status::Queued;
        }
    }

    /// The response ended (its run ended, or waits for answers).
    pub fn ended(&self) -> bool {
        self.status.is_final()
    }

    /// The calls of the run, as far as it was read.
    pub fn calls(&self) -> &RunCalls {
        &self.calls
    }

    /// The two stream events that open a response.
    pub fn opening(&self) -> Vec<Frame> {
        let snapshot = self.object();
        vec![
            frame(0, "response.created", json!({ "response": snapshot })),
            frame(1, "response.in_progress", json!({ "response": snapshot })),
        ]
    }

    /// Reads the next event of the run; the stream events it gives (none before the
    /// response's start, or after its end).
    pub fn push(&mut self, event: &Event) -> Vec<Frame> {
        let parked = self.calls.apply(event);
        self.note_call(&event.kind);
        if event.seq <= self.id.after || self.ended() {
            return Vec::new();
        }
        if self.status == Status::Queued {
            self.status = Status::InProgress;
        }
        let mut out = Out {
            base: event.seq * FRAMES_PER_EVENT,
            frames: Vec::new(),
        };
        self.shape(&event.kind, &mut out);
        if parked && !self.ended() {
            self.close_open(&mut out);
            self.status = Status::Completed;
            let response = self.object();
            out.push("response.completed", json!({ "response": response }));
        }
        debug_assert!(out.frames.len() as i64 <= FRAMES_PER_EVENT);
        out.frames.truncate(FRAMES_PER_EVENT as usize);
        out.frames
    }

    fn note_call(&mut self, kind: &EventKind) {
        match kind {
            EventKind::ToolClientRequested { call_id, .. } => {
                self.client_calls.insert(call_id.clone());
            }
            EventKind::ToolApprovalRequested { call_id, .. } => {
                self.approvals.insert(call_id.clone());
            }
            _ => {}
        }
    }

    fn shape(&mut self, kind: &EventKind, out: &mut Out) {
        match kind {
            EventKind::LlmStarted { step_id } => {
                self.step = Some(*step_id);
                self.reasoning = None;
                self.message = None;
            }
            EventKind::ThinkingStream { text, .. } => {
                let at = self.open_reasoning(out);
                append_text(&mut self.output[at]["content"][0]["text"], text);
                out.push(
                    "response.reasoning_text.delta",
                    json!({
                        "item_id": self.output[at]["id"], "output_index": at,
                        "content_index": 0, "delta": text,
                    }),
                );
            }
            EventKind::AssistantStream { text, .. } => {
                self.close_reasoning(out);
                let at = self.open_message(out);
                self.text_delta(at, text, out);
            }
            EventKind::LlmCompleted { message, usage, .. } => {
                if self.reasoning.is_none() && !message.thinking.is_empty() {
                    let text: String = message.thinking.iter().map(|t| t.text()).collect();
                    let at = self.open_reasoning(out);
                    self.output[at]["content"][0]["text"] = Value::String(text);
                }
                self.close_reasoning(out);
                if self.message.is_none() && !message.content.is_empty() {
                    let at = self.open_message(out);
                    self.text_delta(at, &message.content, out);
                }
                self.close_message(out);
                self.usage.add(*usage);
            }
            EventKind::ToolClientRequested {
                call_id,
                tool,
                input,
                ..
            } => {
                let arguments = input.to_string();
                let item = json!({
                    "type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id,
                    "name": tool, "arguments": "", "status": "in_progress",
                });
                let at = self.add_item(item, out);
                let item_id = self.output[at]["id"].clone();
                out.push(
                    "response.function_call_arguments.delta",
                    json!({ "item_id": item_id, "output_index": at, "delta": arguments }),
                );
                out.push(
                    "response.function_call_arguments.done",
                    json!({
                        "item_id": item_id, "output_index": at, "name": tool,
                        "arguments": arguments,
                    }),
                );
                self.output[at]["arguments"] = Value::String(arguments);
                self.done_item(at, "completed", out);
            }
            EventKind::ToolApprovalRequested {
                call_id,
                tool,
                input,
                ..
            } => {
                let (server_label, name) = label_of(tool);
                let item = json!({
                    "type": "mcp_approval_request", "id": approval_item_id(call_id),
                    "server_label": server_label, "name": name, "arguments": input.to_string(),
                });
                let at = self.add_item(item, out);
                out.push(
                    "response.output_item.done",
                    json!({ "output_index": at, "item": self.output[at] }),
                );
            }
            EventKind::ToolStarted { call, .. } => {
                if self.client_calls.contains(&call.id) {
                    return;
                }
                let (server_label, name) = label_of(&call.name);
                let approval = self
                    .approvals
                    .contains(&call.id)
                    .then(|| approval_item_id(&call.id));
                let item = json!({
                    "type": "mcp_call", "id": format!("mcp_{}", call.id),
                    "server_label": server_label, "name": name,
                    "arguments": call.arguments.to_string(), "status": "in_progress",
                    "output": null, "error": null, "approval_request_id": approval,
                });
                let at = self.add_item(item, out);
                self.call_items.insert(call.id.clone(), at);
                out.push(
                    "response.mcp_call.in_progress",
                    json!({ "item_id": self.output[at]["id"], "output_index": at }),
                );
            }
            EventKind::ToolFinished {
                call_id,
                output,
                is_error,
                ..
            } => {
                let Some(&at) = self.call_items.get(call_id) else {
                    return;
                };
                let status = match is_error {
                    true => {
                        self.output[at]["error"] = Value::String(output.clone());
                        "failed"
                    }
                    false => {
                        self.output[at]["output"] = Value::String(output.clone());
                        "completed"
                    }
                };
                out.push(
                    match is_error {
                        true => "response.mcp_call.failed",
                        false => "response.mcp_call.completed",
                    },
                    json!({ "item_id": self.output[at]["id"], "output_index": at }),
                );
                self.done_item(at, status, out);
            }
            EventKind::AgentFinished {
                finish_reason,
                usage: _,
                ..
            } => {
                self.close_open(out);
                let kind = match finish_reason {
                    FinishReason::MaxSteps | FinishReason::Budget => {
                        self.status = Status::Incomplete;
                        self.incomplete = Some("max_output_tokens");
                        "response.incomplete"
                    }
                    FinishReason::Model(reason) if reason == "length" => {
                        self.status = Status::Incomplete;
                        self.incomplete = Some("max_output_tokens");
                        "response.incomplete"
                    }
                    FinishReason::Model(reason) if reason == "content_filter" => {
                        self.status = Status::Incomplete;
                        self.incomplete = Some("content_filter");
                        "response.incomplete"
                    }
                    FinishReason::Model(_) => {
                        self.status = Status::Completed;
                        "response.completed"
                    }
                };
                let response = self.object();
                out.push(kind, json!({ "response": response }));
            }
            EventKind::AgentFailed { error, .. } => {
                self.close_open(out);
                self.status = Status::Failed;
                self.error = Some(json!({ "code": "server_error", "message": error }));
                let response = self.object();
                out.push("response.failed", json!({ "response": response }));
            }
            EventKind::AgentCancelled { .. } => {
                self.close_open(out);
                self.status = Status::Cancelled;
                let response = self.object();
                out.push("response.failed", json!({ "response": response }));
            }
            _ => {}
        }
    }

    fn add_item(&mut self, item: Value, out: &mut Out) -> usize {
        let at = self.output.len();
        self.output.push(item);
        out.push(
            "response.output_item.added",
            json!({ "output_index": at, "item": self.output[at] }),
        );
        at
    }

    fn done_item(&mut self, at: usize, status: &str, out: &mut Out) {
        self.output[at]["status"] = Value::String(status.to_string());
        out.push(
            "response.output_item.done",
            json!({ "output_index": at, "item": self.output[at] }),
        );
    }

    fn step_hex(&self) -> String {
        self.step
            .map(|s| s.simple().to_string())
            .unwrap_or_default()
    }

    fn open_reasoning(&mut self, out: &mut Out) -> usize {
        if let Some(at) = self.reasoning {
            return at;
        }
        let item = json!({
            "type": "reasoning", "id": format!("rs_{}", self.step_hex()), "summary": [],
            "content": [{ "type": "reasoning_text", "text": "" }], "status": "in_progress",
        });
        let at = self.add_item(item, out);
        self.reasoning = Some(at);
        at
    }

    fn close_reasoning(&mut self, out: &mut Out) {
        let Some(at) = self.reasoning.take() else {
            return;
        };
        if self.output[at]["status"] != "in_progress" {
            return;
        }
        out.push(
            "response.reasoning_text.done",
            json!({
                "item_id": self.output[at]["id"], "output_index": at, "content_index": 0,
                "text": self.output[at]["content"][0]["text"],
            }),
        );
        self.done_item(at, "completed", out);
        // Closed: a later piece of the same step opens no second item.
        self.reasoning = Some(at);
    }

    fn open_message(&mut self, out: &mut Out) -> usize {
        if let Some(at) = self.message {
            return at;
        }
        let item = json!({
            "type": "message", "id": format!("msg_{}", self.step_hex()), "role": "assistant",
            "status": "in_progress", "content": [],
        });
        let at = self.add_item(item, out);
        let part = json!({ "type": "output_text", "text": "", "annotations": [], "logprobs": [] });
        out.push(
            "response.content_part.added",
            json!({
                "item_id": self.output[at]["id"], "output_index": at, "content_index": 0,
                "part": part,
            }),
        );
        if let Some(content) = self.output[at]["content"].as_array_mut() {
            content.push(part);
        }
        self.message = Some(at);
        at
    }

    fn text_delta(&mut self, at: usize, text: &str, out: &mut Out) {
        append_text(&mut self.output[at]["content"][0]["text"], text);
        out.push(
            "response.output_text.delta",
            json!({
                "item_id": self.output[at]["id"], "output_index": at, "content_index": 0,
                "delta": text, "logprobs": [],
            }),
        );
    }

    fn close_message(&mut self, out: &mut Out) {
        let Some(at) = self.message else {
            return;
        };
        if self.output[at]["status"] != "in_progress" {
            return;
        }
        let item_id = self.output[at]["id"].clone();
        let part = self.output[at]["content"][0].clone();
        out.push(
            "response.output_text.done",
            json!({
                "item_id": item_id, "output_index": at, "content_index": 0,
                "text": part["text"], "logprobs": [],
            }),
        );
        out.push(
            "response.content_part.done",
            json!({ "item_id": item_id, "output_index": at, "content_index": 0, "part": part }),
        );
        self.done_item(at, "completed", out);
    }

    /// Closes what a step left open (a run that ended mid-step).
    fn close_open(&mut self, out: &mut Out) {
        self.close_reasoning(out);
        self.close_message(out);
        let open: Vec<usize> = self.call_items.values().copied().collect();
        for at in open {
            if self.output[at]["status"] == "in_progress" {
                self.done_item(at, "incomplete", out);
            }
        }
    }

    /// The `Response` object as far as the log was read.
    pub fn object(&self) -> Value {
        let text: String = self
            .output
            .iter()
            .filter(|item| item["type"] == "message")
            .flat_map(|item| item["content"].as_array().into_iter().flatten())
            .filter_map(|part| part["text"].as_str())
            .collect();
        let usage = json!({
            "input_tokens": self.usage.input_tokens,
            "input_tokens_details": { "cached_tokens": 0 },
            "output_tokens": self.usage.output_tokens,
            "output_tokens_details": { "reasoning_tokens": 0 },
            "total_tokens": self.usage.input_tokens + self.usage.output_tokens,
        });
        json!({
            "id": self.id.encode(),
            "object": "response",
            "created_at": self.created_at,
            "status": self.status.as_str(),
            "background": self.echo.background,
            "error": self.error,
            "incomplete_details": self.incomplete.map(|reason| json!({ "reason": reason })),
            "instructions": self.echo.instructions,
            "max_output_tokens": null,
            "metadata": self.echo.metadata,
            "model": self.echo.model,
            "output": self.output,
            "output_text": text,
            "parallel_tool_calls": true,
            "previous_response_id": self.echo.previous_response_id,
            "conversation": { "id": conversation_id(self.id.session) },
            "store": true,
            "temperature": null,
            "text": { "format": { "type": "text" } },
            "tool_choice": "auto",
            "tools": self.echo.tools,
            "top_p": null,
            "truncation": "disabled",
            "usage": if self.status.is_final() { usage } else { Value::Null },
        })
    }
}

/// The stream events made from one log event, numbered as they are made.
struct Out {
    base: i64,
    frames: Vec<Frame>,
}

impl Out {
    fn push(&mut self, kind: &'static str, data: Value) {
        let n = self.base + self.frames.len() as i64;
        self.frames.push(frame(n, kind, data));
    }
}

fn frame(sequence_number: i64, kind: &'static str, mut data: Value) -> Frame {
    data["type"] = Value::String(kind.to_string());
    data["sequence_number"] = json!(sequence_number);
    Frame {
        sequence_number,
        kind,
        data,
    }
}

fn append_text(target: &mut Value, text: &str) {
    let mut now = target.as_str().unwrap_or("").to_string();
    now.push_str(text);
    *target = Value::String(now);
}

/// An `mcp_call`'s server label and tool name: `mcp__SERVER__TOOL` is the MCP server's tool;
/// tah's own tools are the `tah` server's.
pub fn label_of(tool: &str) -> (String, String) {
    if let Some(rest) = tool.strip_prefix("mcp__") {
        if let Some((server, name)) = rest.split_once("__") {
            return (server.to_string(), name.to_string());
        }
    }
    (TAH_SERVER_LABEL.to_string(), tool.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocols::calls::tests::Log;

    fn view(after: i64) -> ResponseView {
        let id = ResponseId {
            session: Uuid::from_u128(1),
            run: Uuid::from_u128(7),
            after,
        };
        ResponseView::new(id, Echo::default(), 0)
    }

    #[test]
    fn ids_round_trip_and_refuse_what_they_do_not_encode() {
        let id = ResponseId {
            session: Uuid::from_u128(u128::MAX - 3),
            run: Uuid::from_u128(42),
            after: 1234,
        };
        assert_eq!(ResponseId::parse(&id.encode()), Some(id));
        for bad in [
            "",
            "resp_",
            "resp_abc",
            "msg_x",
            &format!("{}x", id.encode()),
        ] {
            assert_eq!(ResponseId::parse(bad), None, "{bad}");
        }
        let session = Uuid::from_u128(9);
        assert_eq!(parse_conversation(&conversation_id(session)), Some(session));
        assert_eq!(call_of_approval_item(&approval_item_id("c1")), Some("c1"));
    }

    #[test]
    fn a_reasoned_turn_streams_items_in_order_with_increasing_numbers() {
        let (log, _, _) = Log::reasoned_turn(&["hm"], &["look"], &["it ", "is"]);
        let mut view = view(0);
        let mut frames = view.opening();
        for event in &log.events {
            frames.extend(view.push(event));
        }
        let numbers: Vec<i64> = frames.iter().map(|f| f.sequence_number).collect();
        assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{numbers:?}");
        let kinds: Vec<&str> = frames.iter().map(|f| f.kind).collect();
        assert_eq!(kinds.first(), Some(&"response.created"));
        assert_eq!(kinds.last(), Some(&"response.completed"));
        for kind in [
            "response.reasoning_text.delta",
            "response.content_part.added",
            "response.mcp_call.in_progress",
            "response.mcp_call.completed",
            "response.output_text.done",
        ] {
            assert!(kinds.contains(&kind), "{kind}");
        }
        let object = view.object();
        assert_eq!(object["status"], "completed");
        assert_eq!(object["output_text"], "lookit is");
        let types: Vec<&str> = object["output"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["reasoning", "message", "mcp_call", "message"]);
    }

    #[test]
    fn a_response_starts_after_its_point_and_shows_nothing_before() {
        let (log, _, _) = Log::reasoned_turn(&[], &["a"], &["b"]);
        let middle = log.events[log.events.len() / 2].seq;
        let mut view = view(middle);
        let frames: Vec<Frame> = log.events.iter().flat_map(|e| view.push(e)).collect();
        assert!(frames.iter().all(|f| f.sequence_number > middle * 16));
        assert_eq!(view.status(), Status::Completed);
    }
}
