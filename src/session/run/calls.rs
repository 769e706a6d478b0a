//! The records of a run's tool calls: each start, finish and result, and the end of the calls
//! that still wait when the run stops.

use serde_json::{json, Value};
use uuid::Uuid;

use super::Run;
use crate::model::{
    self, Decision, EventKind, Message, ResolvedBy, SessionState, StepStatus, ToolCall,
};
use crate::session::errors::{ConflictKind, SessionError, Unanswered};
use crate::session::lineage::TASK;
use crate::session::waiting::{denied_output, refusal_output, ClientResult, Kind, Resolution};
use crate::store::{StoreError, WriteOp};
use crate::tools::ToolOutput;

impl Run<'_> {
    pub(in crate::session) async fn call_started(
        &mut self,
        step_id: Uuid,
        call: &ToolCall,
    ) -> Result<(), StoreError> {
        let step = self.tool_step(step_id, call, StepStatus::Running);
        self.batch.ops.push(WriteOp::UpsertStep(step));
        self.batch.state(self.core, SessionState::WaitingTool, None);
        let kind = EventKind::ToolStarted {
            step_id,
            call: call.clone(),
        };
        self.board.apply(&kind);
        self.batch.event(self.core, kind);
        if call.name == TASK {
            self.child_started(&call.id).await?;
        }
        self.calls.running += 1;
        // Durable before the tool runs: a crash mid-tool shows the call as started.
        self.flush_now().await
    }

    pub(in crate::session) async fn call_finished(
        &mut self,
        step_id: Uuid,
        call: &ToolCall,
        output: &ToolOutput,
    ) -> Result<(), StoreError> {
        let started = self.board.is_open(&call.id);
        if started {
            self.calls.running = self.calls.running.saturating_sub(1);
        }
        let status = if output.is_error {
            StepStatus::Failed
        } else {
            StepStatus::Completed
        };
        // Its artifacts commit with its outcome, in this batch, announced right after it.
        let mut keeping = self.keep_artifacts(step_id, &output.artifacts).await?;
        let text = match &keeping.note {
            Some(note) => format!("{}\n{note}", output.output),
            None => output.output.clone(),
        };
        if let Some(note) = keeping.note.take() {
            self.calls.notes.insert(call.id.clone(), note);
        }
        let mut step = self.tool_step(step_id, call, status);
        step.response = Some(json!({ "output": text, "is_error": output.is_error }).to_string());
        step.finished_at = Some(model::now());
        self.batch.ops.push(WriteOp::UpsertStep(step));
        let kind = EventKind::ToolFinished {
            step_id,
            call_id: call.id.clone(),
            output: text.clone(),
            is_error: output.is_error,
        };
        self.board.apply(&kind);
        self.batch.event(self.core, kind);
        self.child_finished(&call.id);
        self.record_artifacts(keeping);
        let Some(reply) = self.board.take_reply(&call.id) else {
            // Nobody waits on it: handed on when the loop next waits, durable before the run
            // ends.
            return Ok(());
        };
        // A client's answer is acknowledged once it is durable.
        self.flush_now().await?;
        let result = ClientResult {
            call_id: call.id.clone(),
            output: text,
            is_error: output.is_error,
        };
        let _ = reply.send(Ok(serde_json::to_value(result).unwrap_or(Value::Null)));
        Ok(())
    }

    pub(in crate::session) async fn call_results(
        &mut self,
        results: &[(ToolCall, ToolOutput)],
        done: bool,
    ) -> Result<(), StoreError> {
        for (call, output) in results {
            let content = match self.calls.notes.remove(&call.id) {
                Some(note) => format!("{}\n{note}", output.output),
                None => output.output.clone(),
            };
            self.batch
                .message(self.core, Message::tool_result(&call.id, &content));
        }
        if done {
            self.batch.state(self.core, SessionState::Running, None);
        }
        self.batch.checkpoint(self.core, self.run_id, None);
        // The model call that follows has no effect to protect: queued with it, when the loop
        // waits for the model.
        Ok(())
    }

    /// Ends every call that still waits, as `by` says (a cancel, or a new message that
    /// superseded the run): each gets its resolution and a result, so nothing is left
    /// dangling for the next run.
    pub(in crate::session) fn settle_waiting(&mut self, by: ResolvedBy, reason: Option<&str>) {
        for (call_id, item) in self.board.pending() {
            let output = match item.kind {
                Kind::Approval => {
                    let resolution = Resolution {
                        call_id: call_id.clone(),
                        decision: Decision::Deny,
                        by,
                        reason: reason.map(str::to_string),
                        input: None,
                        answered_by: None,
                    };
                    self.record_resolution(&resolution);
                    refusal_output(&resolution)
                }
                Kind::Client => match by {
                    ResolvedBy::User => denied_output(reason),
                    _ => ToolOutput::error("the run was cancelled before the client answered"),
                },
            };
            let call = ToolCall {
                id: call_id.clone(),
                name: item.tool.clone(),
                arguments: item.input.clone(),
            };
            let mut step = self.tool_step(item.step_id, &call, StepStatus::Failed);
            step.response = Some(json!({ "output": output.output, "is_error": true }).to_string());
            step.finished_at = Some(model::now());
            self.batch.ops.push(WriteOp::UpsertStep(step));
            let kind = EventKind::ToolFinished {
                step_id: item.step_id,
                call_id: call_id.clone(),
                output: output.output.clone(),
                is_error: true,
            };
            self.board.apply(&kind);
            self.batch.event(self.core, kind);
            self.batch
                .message(self.core, Message::tool_result(&call_id, &output.output));
            if let Some(reply) = self.board.take_reply(&call_id) {
                let _ = reply.send(Err(SessionError::Conflict(ConflictKind::RunEnded(
                    Unanswered::Result,
                ))));
            }
        }
    }
}
