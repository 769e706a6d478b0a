//! A run of a session: what the agent loop reports, turned into rows and events. A [`Run`]
//! is prepared by the actor's run command, driven by the loop (it is the loop's
//! [`Journal`]), and ended by the actor with what [`end`] concludes.
//!
//! - `batch`: how a session writes ([`Batch`], [`Sink`]).
//! - `board`: the calls of the run that wait for an answer, their answers and queued inputs.
//! - `answers`: how the run takes the answers its board holds, and timeouts.
//! - `admission`: the policy's decision on a call (a pure `admit`), and its record.
//! - `calls`: the records of a call's start, finish and result.
//! - `artifacts`: the files a call produced, kept as artifacts.
//! - `children`: the sub-agents of the run's `task` calls.
//! - `end`: how a run ends, decided in one pure place.

mod admission;
mod answers;
mod artifacts;
pub(in crate::session) mod batch;
pub(in crate::session) mod board;
mod calls;
mod children;
pub(in crate::session) mod end;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use uuid::Uuid;

use crate::agent::compaction::Summary;
use crate::agent::context::TrimStats;
use crate::agent::{Admission, Answer, Completion, Journal, Redactor};
use crate::llm::providers::Price;
use crate::model::{
    self, CharsBeforeAfter, EventKind, LlmRequestDescriptor, Message, Role, StepKind, StepStatus,
    ToolCall,
};
use crate::session::core::Core;
use crate::session::cost::CostCaps;
use crate::session::lineage::Children;
use crate::session::waiting::Resolution;
use crate::store::{StepRow, StoreError, WriteOp};
use crate::tools::ToolOutput;
use crate::tools::{ToolContext, ToolRegistry};
pub(in crate::session) use admission::denial_reason;
pub(in crate::session) use batch::{Batch, Sink};
use board::CallBoard;

/// Streamed pieces gathered at most before they are handed to the writer, when a reply's
/// pieces arrive faster than they are recorded.
const PIECES_PER_COMMIT: usize = 64;

/// What a completed LLM step's record keeps as its response.
#[derive(serde::Serialize)]
struct LlmStepResponse<'a> {
    finish_reason: &'a model::FinishReason,
    message: &'a Message,
    #[serde(skip_serializing_if = "Option::is_none")]
    cost_usd: Option<f64>,
}

/// A run being driven: the agent loop's journal.
pub(in crate::session) struct Run<'a> {
    pub id: Uuid,
    pub run_id: Uuid,
    pub core: &'a mut Core,
    pub sink: Sink<'a>,
    /// What is gathered and not yet handed to the writer.
    pub batch: Batch,
    /// The run's calls that wait, and what came for them (shared with the actor).
    pub board: Arc<CallBoard>,
    /// What the run's calls run with.
    pub calls: RunTools,
    /// The price of the current LLM step's model, when the providers file gives one.
    price: Option<Price>,
    /// The caps in money the run is bounded by (besides its tenant's of the day).
    pub caps: CostCaps,
    /// What this run's LLM steps have cost so far, in US dollars.
    spent: f64,
}

/// What a run's tool calls run with, the run's own.
pub(in crate::session) struct RunTools {
    pub tools: ToolRegistry,
    pub context: ToolContext,
    /// Calls started and not finished.
    pub running: usize,
    /// The sub-agents of the run's `task` calls.
    pub children: Arc<Children>,
    /// What the result of a call says beyond the tool's output (artifacts not kept), by call
    /// id: from its `tool.finished` until its result joins the history.
    pub notes: HashMap<String, String>,
    /// What people answered to the approvals of the run this one resumes, for its calls
    /// that run again: admitted as answered, not asked about again.
    pub decided: HashMap<String, Resolution>,
    /// Takes the secrets handed to the run's agent (its tenant's vault values) out of tool
    /// outputs.
    pub redactor: Option<Redactor>,
}

impl<'a> Run<'a> {
    pub fn new(
        id: Uuid,
        run_id: Uuid,
        core: &'a mut Core,
        sink: Sink<'a>,
        board: Arc<CallBoard>,
        calls: RunTools,
    ) -> Run<'a> {
        Run {
            id,
            run_id,
            core,
            sink,
            batch: Batch::new(id),
            board,
            calls,
            price: None,
            caps: CostCaps::default(),
            spent: 0.0,
        }
    }

    /// Whether the run waits only for answers (nothing runs): it may then be left as it is.
    pub fn is_parked(&self) -> bool {
        self.calls.running == 0 && self.board.is_parked()
    }

    /// What is gathered and not yet written, taken out of the journal.
    pub fn take_batch(&mut self) -> Batch {
        std::mem::replace(&mut self.batch, Batch::new(self.id))
    }

    /// Commits what is gathered and waits for it to be durable.
    pub(in crate::session) async fn flush_now(&mut self) -> Result<(), StoreError> {
        let batch = self.take_batch();
        self.sink.commit(batch).await
    }

    /// Queues what is gathered without waiting: order is kept by the writer, and a failure
    /// shows at the next commit that is waited for.
    pub(in crate::session) async fn queue(&mut self) -> Result<(), StoreError> {
        let batch = self.take_batch();
        self.sink.queue(batch).await
    }

    /// Pieces that arrived together are queued together, up to [`PIECES_PER_COMMIT`] ops.
    async fn pieces_recorded(&mut self) -> Result<(), StoreError> {
        if self.batch.ops.len() < PIECES_PER_COMMIT {
            return Ok(());
        }
        self.queue().await
    }

    /// Records a message of the user's (one queued while the run was busy, or not). It goes
    /// with the model step that follows, queued when the loop first waits for the model: that
    /// call has no effect to protect, and the next durable commit (a tool's start, the run's
    /// end) comes after it in the writer's order.
    fn append_user_message(&mut self, input: String, queued: bool) {
        let message = self
            .batch
            .message(self.core, Message::new(Role::User, input));
        self.batch
            .event(self.core, EventKind::UserMessage { message, queued });
    }

    /// A step of the run; its request is JSON text (see [`StepRow`]).
    fn step(&self, id: Uuid, kind: StepKind, status: StepStatus, request: String) -> StepRow {
        StepRow {
            id,
            session_id: self.id,
            run_id: self.run_id,
            kind,
            status,
            request,
            response: None,
            usage: None,
            error: None,
            created_at: model::now(),
            finished_at: None,
        }
    }

    pub(in crate::session) fn tool_step(
        &self,
        id: Uuid,
        call: &ToolCall,
        status: StepStatus,
    ) -> StepRow {
        // Plain data with string keys: serialising it cannot fail.
        let request = serde_json::to_string(call).unwrap_or_else(|_| "null".to_string());
        self.step(id, StepKind::Tool, status, request)
    }
}

#[async_trait]
impl Journal for Run<'_> {
    type Error = StoreError;

    fn history(&self) -> &[Message] {
        &self.core.history
    }

    fn session_id(&self) -> Option<Uuid> {
        Some(self.id)
    }

    fn redactor(&self) -> Option<Redactor> {
        self.calls.redactor.clone()
    }

    async fn spend_limit(&mut self) -> Result<Option<String>, StoreError> {
        if let Some(limit) = self.caps.reached(self.core.cost_usd, self.spent) {
            return Ok(Some(limit));
        }
        let deps = self.sink.deps;
        let tenant = &self.core.record.tenant;
        deps.tenant_limits
            .cost_reached(deps.store.as_ref(), tenant)
            .await
    }

    async fn llm_started(&mut self, request: LlmRequestDescriptor) -> Result<Uuid, StoreError> {
        let step_id = model::new_id();
        self.price = self
            .sink
            .deps
            .providers
            .price(&request.provider, &request.model);
        // A struct of strings, numbers and lists: serialising it cannot fail.
        let request = serde_json::to_string(&request).unwrap_or_else(|_| "null".to_string());
        let step = self.step(step_id, StepKind::Llm, StepStatus::Streaming, request);
        self.batch.ops.push(WriteOp::UpsertStep(step));
        self.batch
            .event(self.core, EventKind::LlmStarted { step_id });
        // Queued when the loop first waits for the model.
        Ok(step_id)
    }

    async fn llm_delta(&mut self, step_id: Uuid, text: String) -> Result<(), StoreError> {
        self.batch
            .event(self.core, EventKind::AssistantStream { step_id, text });
        self.pieces_recorded().await
    }

    async fn llm_thinking(&mut self, step_id: Uuid, text: String) -> Result<(), StoreError> {
        self.batch
            .event(self.core, EventKind::ThinkingStream { step_id, text });
        self.pieces_recorded().await
    }

    async fn waiting(&mut self) -> Result<(), StoreError> {
        self.queue().await
    }

    async fn llm_retry(
        &mut self,
        step_id: Uuid,
        attempt: u32,
        error: String,
    ) -> Result<(), StoreError> {
        self.batch.event(
            self.core,
            EventKind::LlmRetry {
                step_id,
                attempt,
                error,
            },
        );
        self.queue().await
    }

    async fn llm_completed(&mut self, step_id: Uuid, reply: Completion) -> Result<(), StoreError> {
        let Completion {
            message,
            finish_reason,
            usage,
        } = reply;
        let message = self.batch.message(self.core, message);
        // The request was written when the step started; an update keeps it.
        let mut step = self.step(step_id, StepKind::Llm, StepStatus::Completed, "null".into());
        let cost_usd = self.price.map(|price| price.cost_usd(usage));
        let response = LlmStepResponse {
            finish_reason: &finish_reason,
            message: &message,
            cost_usd,
        };
        step.response = serde_json::to_string(&response).ok();
        step.usage = Some(usage);
        step.finished_at = Some(model::now());
        self.batch.ops.push(WriteOp::UpsertStep(step));
        if !message.thinking.is_empty() {
            let (request, response) = model::thinking_step_parts(step_id, &message.thinking);
            let mut thinking = self.step(
                model::new_id(),
                StepKind::Thinking,
                StepStatus::Completed,
                request.to_string(),
            );
            thinking.response = Some(response.to_string());
            thinking.finished_at = Some(thinking.created_at);
            self.batch.ops.push(WriteOp::UpsertStep(thinking));
        }
        self.batch.usage(self.core, usage);
        self.batch.event(
            self.core,
            EventKind::LlmCompleted {
                step_id,
                message,
                finish_reason,
                usage,
                cost_usd,
            },
        );
        // Every step is followed by `session.usage`; an unpriced one leaves the cost absent
        // and the session's total as it was (absent while no step had a price).
        if let Some(cost) = cost_usd {
            self.spent = crate::llm::providers::round_usd(self.spent + cost);
            let limits = &self.sink.deps.tenant_limits;
            limits.add_cost(&self.core.record.tenant, cost);
        }
        let total_cost_usd = self.core.add_cost(cost_usd);
        self.batch.event(
            self.core,
            EventKind::SessionUsage {
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
                cost_usd,
                total_cost_usd,
            },
        );
        self.batch.checkpoint(self.core, self.run_id, Some(step_id));
        // Not committed on its own: it goes with what follows before the loop waits again (a
        // tool's start, an approval's request, the run's end), which are waited for.
        Ok(())
    }

    async fn llm_failed(&mut self, step_id: Uuid, error: String) -> Result<(), StoreError> {
        let mut step = self.step(step_id, StepKind::Llm, StepStatus::Failed, "null".into());
        step.error = Some(error.clone());
        step.finished_at = Some(model::now());
        self.batch.ops.push(WriteOp::UpsertStep(step));
        self.batch
            .event(self.core, EventKind::LlmFailed { step_id, error });
        self.flush_now().await
    }

    async fn context_trimmed(
        &mut self,
        step_id: Uuid,
        stats: &TrimStats,
    ) -> Result<(), StoreError> {
        self.batch.event(
            self.core,
            EventKind::ContextTrimmed {
                step_id,
                budget: stats.budget as u64,
                chars: CharsBeforeAfter {
                    before: stats.chars_before as u64,
                    after: stats.chars_after as u64,
                },
                dropped_turns: stats.dropped_turns as u64,
                elided_tool_results: stats.elided_tool_results as u64,
            },
        );
        Ok(())
    }

    async fn user_message(&mut self, input: String) -> Result<(), StoreError> {
        self.append_user_message(input, /*queued*/ false);
        Ok(())
    }

    fn take_queued(&mut self) -> Vec<String> {
        self.board.take_queued()
    }

    async fn queued_message(&mut self, input: String) -> Result<(), StoreError> {
        self.append_user_message(input, /*queued*/ true);
        Ok(())
    }

    async fn summary_appended(&mut self, summary: Summary, auto: bool) -> Result<(), StoreError> {
        self.batch.summary(self.core, &summary, auto);
        self.flush_now().await
    }

    async fn compact_failed(&mut self, error: String) -> Result<(), StoreError> {
        let session_id = self.id;
        self.batch.event(
            self.core,
            EventKind::ContextCompactFailed { session_id, error },
        );
        self.flush_now().await
    }

    async fn admit(&mut self, call: &ToolCall) -> Result<Admission, StoreError> {
        self.admit_call(call).await
    }

    async fn next_answer(&mut self) -> Result<Answer, StoreError> {
        self.next_call_answer().await
    }

    async fn tool_started(&mut self, step_id: Uuid, call: &ToolCall) -> Result<(), StoreError> {
        self.call_started(step_id, call).await
    }

    async fn tool_finished(
        &mut self,
        step_id: Uuid,
        call: &ToolCall,
        output: &ToolOutput,
    ) -> Result<(), StoreError> {
        self.call_finished(step_id, call, output).await
    }

    async fn tool_results(
        &mut self,
        results: &[(ToolCall, ToolOutput)],
        done: bool,
    ) -> Result<(), StoreError> {
        self.call_results(results, done).await
    }
}
