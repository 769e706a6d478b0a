//! The Vercel AI SDK's UI message stream (what `useChat` and `DefaultChatTransport` read) as a
//! view of a run's events. One tah run is one assistant UI message (its id is the run id);
//! each LLM step is a step of that message (`start-step` … `finish-step`), its reasoning and
//! text are `reasoning-*` and `text-*` parts, and its tool calls are tool parts that go
//! through the SDK's states: `tool-input-available`, `tool-approval-request` (the policy asked
//! a human), then `tool-output-available`, `tool-output-error` or `tool-output-denied`.
//!
//! [`UiMessageStream`] is a small state machine: events in, chunks out. It stores nothing and
//! reads nothing; the HTTP layer feeds it the run's events from the log (replayed, then live)
//! and writes the chunks as SSE `data:` lines. Events at or before `skip_through` only update
//! its state: that is how a stream continues a message the client already has (after an
//! approval, from the point where the run waited).
//!
//! [`history`] folds the same chunks into the `UIMessage`s a client would have built from them:
//! a session's history for a chat that is opened again.

use std::collections::HashSet;

use serde_json::{json, Value};
use uuid::Uuid;

use super::calls::RunCalls;
use super::parts::{reasoning_id, PartFrames, Parts};
use crate::model::{Decision, Event, EventKind, FinishReason, ResolvedBy};

pub mod history;

/// The response header that tells the SDK the body is a UI message stream.
pub const STREAM_HEADER: (&str, &str) = ("x-vercel-ai-ui-message-stream", "v1");

/// The last SSE `data:` line of a stream.
pub const DONE: &str = "[DONE]";

/// What one event produced.
#[derive(Debug, Default, PartialEq)]
pub struct Pushed {
    pub chunks: Vec<Value>,
    /// The run waits for answers only (its calls wait for a human or the client): a stream
    /// that is live ends here with [`UiMessageStream::finish_parked`].
    pub parked: bool,
    /// The run ended: nothing follows.
    pub ended: bool,
}

/// The chunks of one run, from its events.
#[derive(Debug)]
pub struct UiMessageStream {
    skip_through: i64,
    calls: RunCalls,
    step_open: bool,
    /// The reasoning and text parts of the LLM steps.
    parts: Parts<UiParts>,
    /// Calls a human denied: their tool part is `output-denied`, not an error.
    denied: HashSet<String>,
    /// Calls whose output the client sent with this request: its tool part has it already.
    known_outputs: HashSet<String>,
    /// A human's answer to an approval is told as the SDK's `tool-approval-response`. A live
    /// stream leaves it out (the client that answered has it, and AI SDK 6 does not know the
    /// chunk); a history needs it to show the answer.
    responses: bool,
}

impl UiMessageStream {
    /// A stream of a run whose events up to `skip_through` the client already has.
    pub fn new(skip_through: i64) -> UiMessageStream {
        UiMessageStream::continuing(skip_through, HashSet::new())
    }

    /// The same, for a request that also sent the outputs of the client's tools for
    /// `known_outputs` (their parts keep the outputs the client gave them).
    pub fn continuing(skip_through: i64, known_outputs: HashSet<String>) -> UiMessageStream {
        UiMessageStream {
            skip_through,
            calls: RunCalls::default(),
            step_open: false,
            parts: Parts::default(),
            denied: HashSet::new(),
            known_outputs,
            responses: false,
        }
    }

    /// A stream of a whole run that also tells a human's answers to approvals
    /// (`tool-approval-response`), for [`history`].
    pub fn with_responses() -> UiMessageStream {
        UiMessageStream {
            responses: true,
            ..UiMessageStream::new(0)
        }
    }

    /// The first chunk of every stream: the assistant message is the run.
    pub fn start(run_id: Uuid) -> Value {
        json!({"type": "start", "messageId": run_id.to_string()})
    }

    /// What the run's calls wait for, as far as the events pushed tell.
    pub fn calls(&self) -> &RunCalls {
        &self.calls
    }

    pub fn push(&mut self, event: &Event) -> Pushed {
        let mut out = Vec::new();
        let ended = event.is_terminal();
        self.translate(&event.kind, &mut out);
        let parked = self.calls.apply(event);
        if event.seq <= self.skip_through {
            out.clear();
        }
        Pushed {
            chunks: out,
            parked: parked && event.seq > self.skip_through,
            ended,
        }
    }

    /// The chunks that end a stream where the run waits for answers.
    pub fn finish_parked(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        self.close_step(&mut out);
        out.push(json!({"type": "finish", "finishReason": "tool-calls"}));
        out
    }

    fn translate(&mut self, kind: &EventKind, out: &mut Vec<Value>) {
        match kind {
            EventKind::LlmStarted { .. } => {
                self.close_step(out);
                out.push(json!({"type": "start-step"}));
                self.step_open = true;
            }
            EventKind::ThinkingStream { step_id, text } => {
                self.parts.reasoning(*step_id, text, out);
            }
            EventKind::AssistantStream { step_id, text } => {
                self.parts.close_reasoning(out);
                self.parts.open_text(*step_id, out);
                if !text.is_empty() {
                    out.push(UiParts::text_delta(*step_id, text));
                }
            }
            EventKind::LlmCompleted {
                step_id, message, ..
            } => {
                self.parts.completed(*step_id, message, out);
                for call in &message.tool_calls {
                    out.push(json!({
                        "type": "tool-input-available",
                        "toolCallId": call.id,
                        "toolName": call.name,
                        "input": call.arguments,
                    }));
                }
            }
            EventKind::LlmFailed { .. } => self.parts.close(out),
            EventKind::ToolApprovalRequested { call_id, .. } => {
                out.push(json!({"type": "tool-approval-request", "approvalId": call_id, "toolCallId": call_id}));
            }
            EventKind::ToolApprovalResolved {
                call_id,
                decision,
                by: ResolvedBy::User,
                reason,
                ..
            } => {
                let denied = *decision == Decision::Deny;
                if self.responses {
                    let mut response = json!({"type": "tool-approval-response", "approvalId": call_id, "approved": !denied});
                    if let Some(reason) = reason {
                        response["reason"] = json!(reason);
                    }
                    out.push(response);
                }
                if denied {
                    out.push(json!({"type": "tool-output-denied", "toolCallId": call_id}));
                    self.denied.insert(call_id.clone());
                }
            }
            EventKind::ToolFinished {
                call_id,
                output,
                is_error,
                ..
            } => {
                if self.denied.remove(call_id) || self.known_outputs.contains(call_id) {
                    return;
                }
                out.push(match is_error {
                    false => json!({"type": "tool-output-available", "toolCallId": call_id, "output": output}),
                    true => json!({"type": "tool-output-error", "toolCallId": call_id, "errorText": output}),
                });
            }
            EventKind::AgentFinished { finish_reason, .. } => {
                self.close_all(out);
                out.push(
                    json!({"type": "finish", "finishReason": finish_reason_of(finish_reason)}),
                );
            }
            EventKind::AgentFailed { error, .. } => {
                self.close_all(out);
                out.push(json!({"type": "error", "errorText": error}));
                out.push(json!({"type": "finish", "finishReason": "error"}));
            }
            EventKind::AgentCancelled { .. } => {
                self.close_all(out);
                out.push(json!({"type": "abort", "reason": "the run was cancelled"}));
            }
            _ => {}
        }
    }

    fn close_step(&mut self, out: &mut Vec<Value>) {
        self.parts.close(out);
        if self.step_open {
            out.push(json!({"type": "finish-step"}));
            self.step_open = false;
        }
    }

    fn close_all(&mut self, out: &mut Vec<Value>) {
        self.close_step(out);
    }
}

/// The SDK's `reasoning-*` and `text-*` chunks.
#[derive(Debug)]
struct UiParts;

impl PartFrames for UiParts {
    fn reasoning_start(step_id: Uuid, out: &mut Vec<Value>) {
        out.push(json!({"type": "reasoning-start", "id": reasoning_id(step_id)}));
    }

    fn reasoning_delta(step_id: Uuid, delta: &str) -> Value {
        json!({"type": "reasoning-delta", "id": reasoning_id(step_id), "delta": delta})
    }

    fn reasoning_end(step_id: Uuid, out: &mut Vec<Value>) {
        out.push(json!({"type": "reasoning-end", "id": reasoning_id(step_id)}));
    }

    fn text_start(step_id: Uuid) -> Value {
        json!({"type": "text-start", "id": step_id.to_string()})
    }

    fn text_delta(step_id: Uuid, delta: &str) -> Value {
        json!({"type": "text-delta", "id": step_id.to_string(), "delta": delta})
    }

    fn text_end(step_id: Uuid) -> Value {
        json!({"type": "text-end", "id": step_id.to_string()})
    }
}

/// The SDK's finish reasons: `stop | length | content-filter | tool-calls | error | other`.
fn finish_reason_of(reason: &FinishReason) -> &'static str {
    match reason.as_str() {
        "stop" | "end_turn" | "stop_sequence" => "stop",
        "length" | "max_tokens" => "length",
        "content_filter" | "refusal" => "content-filter",
        "tool_calls" | "tool_use" => "tool-calls",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocols::calls::tests::{adapt_log as chunks, type_list, types, Log};

    #[test]
    fn a_turn_with_reasoning_text_and_a_tool_call_becomes_one_message() {
        let (log, _, second) =
            Log::reasoned_turn(&["I should ", "look."], &[], &["It has ", "a README."]);
        let (out, parks) = chunks(&mut UiMessageStream::new(0), &log);
        assert!(parks.is_empty());
        assert_eq!(type_list(&out), "start-step reasoning-start reasoning-delta reasoning-delta reasoning-end tool-input-available tool-output-available finish-step start-step text-start text-delta text-delta text-end finish-step finish");
        assert_eq!(out[5]["toolName"], "list_files");
        assert_eq!(out[6]["output"], "README.md");
        assert_eq!(out[9]["id"], second.to_string());
        assert_eq!(out[11]["delta"], "a README.");
        assert_eq!(out[14]["finishReason"], "stop");
    }

    #[test]
    fn an_approval_parks_the_stream_and_the_next_one_continues_after_it() {
        let (mut log, _) = Log::first_step("", &[("c1", "write_file")]);
        log.ask("c1");
        let park = log.events.last().unwrap().seq;
        let mut first = UiMessageStream::new(0);
        let (mut out, parks) = chunks(&mut first, &log);
        assert_eq!(parks, vec![park]);
        out.extend(first.finish_parked());
        assert_eq!(
            type_list(&out),
            "start-step tool-input-available tool-approval-request finish-step finish"
        );
        assert_eq!(out[2]["approvalId"], "c1");
        assert_eq!(out[4]["finishReason"], "tool-calls");

        log.resolve("c1", Decision::Deny, ResolvedBy::User);
        log.finished("c1", "{\"error\":\"the user denied this call\"}", true);
        let step = log.step(2);
        log.text(step, "Not written.");
        log.completed(step, "Not written.", &[]);
        log.done("Not written.");
        let (out, parks) = chunks(&mut UiMessageStream::new(park), &log);
        assert!(parks.is_empty());
        assert_eq!(type_list(&out), "tool-output-denied finish-step start-step text-start text-delta text-end finish-step finish");
    }

    #[test]
    fn outputs_the_client_sent_are_not_sent_back() {
        let (mut log, _) = Log::first_step("", &[("c1", "ask_user")]);
        log.client("c1", "ask_user");
        let park = log.events.last().unwrap().seq;
        log.finished("c1", "{\"colour\":\"blue\"}", false);
        let known = HashSet::from(["c1".to_string()]);
        let (out, _) = chunks(&mut UiMessageStream::continuing(park, known), &log);
        assert!(out.is_empty(), "{out:?}");
        // A stream that replays the run shows the output as tah recorded it.
        let (out, _) = chunks(&mut UiMessageStream::new(0), &log);
        assert_eq!(types(&out).last(), Some(&"tool-output-available"));
    }

    #[test]
    fn a_failed_run_ends_with_an_error_and_text_it_did_not_stream_is_sent_whole() {
        let (mut log, _) = Log::first_step("all at once", &[]);
        log.push(EventKind::AgentFailed {
            run_id: log.run_id,
            error: "the provider refused".into(),
        });
        let (out, _) = chunks(&mut UiMessageStream::new(0), &log);
        assert_eq!(
            type_list(&out),
            "start-step text-start text-delta text-end finish-step error finish"
        );
        assert_eq!(out[2]["delta"], "all at once");
        assert_eq!(out[5]["errorText"], "the provider refused");
    }

    #[test]
    fn tool_errors_and_cancels_are_told() {
        let (mut log, _) = Log::first_step("", &[("c1", "read_file")]);
        log.started("c1", "read_file");
        log.finished("c1", "no such file", true);
        log.push(EventKind::AgentCancelled { run_id: log.run_id });
        let (out, _) = chunks(&mut UiMessageStream::new(0), &log);
        assert_eq!(
            type_list(&out),
            "start-step tool-input-available tool-output-error finish-step abort"
        );
        assert_eq!(out[2]["errorText"], "no such file");
    }
}
