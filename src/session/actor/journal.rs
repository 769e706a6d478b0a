//! How an actor writes: a [`Batch`] gathers the ops and events of one commit (keeping the
//! actor's in-memory view of the session in step), [`commit`] hands it to the group-commit
//! writer behind the session's lease, and [`RunJournal`] is the actor's side of the agent loop:
//! it turns what the loop reports into rows and events.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::calls::CallDesk;
use super::Core;
use crate::agent::compaction::Summary;
use crate::agent::context::TrimStats;
use crate::agent::{Admission, Answer, Completion, Journal};
use crate::model::{
    self, CharsBeforeAfter, Checkpoint, Event, EventKind, LlmRequestDescriptor, Message, Published,
    Role, SessionState, StepKind, StepStatus, ToolCall,
};
use crate::session::live::Slot;
use crate::session::SessionDeps;
use crate::store::writer::Commit;
use crate::store::{SessionProgress, StepRow, StoreError, StoreResult, WriteOp};
use crate::tools::ToolOutput;

/// Streamed pieces gathered at most before they are handed to the writer, when a reply's
/// pieces arrive faster than they are recorded.
const PIECES_PER_COMMIT: usize = 64;

/// Ops and events being gathered for one commit.
pub(super) struct Batch {
    session_id: Uuid,
    pub ops: Vec<WriteOp>,
    /// Told the outcome of the commit these ops go in: somebody waits for them to be durable
    /// (a run's client, for the run's start) while the actor goes on.
    pub told: Option<oneshot::Sender<StoreResult<()>>>,
}

impl Batch {
    pub fn new(session_id: Uuid) -> Batch {
        Batch {
            session_id,
            ops: Vec::new(),
            told: None,
        }
    }

    /// A batch whose commit's outcome is told to the receiver returned with it.
    pub fn told(session_id: Uuid) -> (Batch, oneshot::Receiver<StoreResult<()>>) {
        let (tell, told) = oneshot::channel();
        let batch = Batch {
            told: Some(tell),
            ..Batch::new(session_id)
        };
        (batch, told)
    }

    pub fn with(mut self, op: WriteOp) -> Batch {
        self.ops.push(op);
        self
    }

    /// Appends the next event of the session.
    pub fn event(&mut self, core: &mut Core, kind: EventKind) {
        match &kind {
            EventKind::ToolApprovalRequested { .. } => crate::metrics::approvals_pending(1),
            EventKind::ToolApprovalResolved { .. } => crate::metrics::approvals_pending(-1),
            _ => {}
        }
        let event = Published::new(Event::new(
            self.session_id,
            core.next_seq,
            kind,
            model::now(),
        ));
        // Rendered here, beside the other actors, rather than on the writer's thread, which
        // every commit waits for: the store and every subscriber use this JSON.
        event.render();
        core.next_seq += 1;
        core.record.last_seq = event.seq;
        self.ops.push(WriteOp::InsertEvent(Arc::new(event)));
    }

    /// Appends a message to the history; returns it with its index.
    pub fn message(&mut self, core: &mut Core, mut message: Message) -> Message {
        message.index = core.record.message_count;
        core.record.message_count += 1;
        if core.history_loaded {
            core.history.push(message.clone());
        }
        self.ops.push(WriteOp::InsertMessage {
            session_id: self.session_id,
            message: message.clone(),
        });
        message
    }

    /// Changes the session's state (with its `session.state` event) and writes the row.
    pub fn state(&mut self, core: &mut Core, to: SessionState, error: Option<String>) {
        let from = core.record.state;
        core.record.state = to;
        core.record.error = error;
        core.record.updated_at = model::now();
        if from != to {
            self.event(core, EventKind::StateChanged { from, to });
        }
        self.progress(core);
    }

    /// Counts a model call's usage for the session and writes it.
    pub fn usage(&mut self, core: &mut Core, usage: model::Usage) {
        core.record.usage.add(usage);
        core.record.updated_at = model::now();
        self.progress(core);
    }

    /// Writes what runs change of the session's row (see [`SessionProgress`]).
    fn progress(&mut self, core: &Core) {
        self.ops
            .push(WriteOp::UpdateProgress(SessionProgress::of(&core.record)));
    }

    pub fn checkpoint(&mut self, core: &mut Core, run_id: Uuid, step_id: Option<Uuid>) {
        let checkpoint_id = model::new_id();
        self.event(
            core,
            EventKind::Checkpoint {
                checkpoint_id,
                step_id,
            },
        );
        self.ops.push(WriteOp::InsertCheckpoint(Checkpoint {
            id: checkpoint_id,
            session_id: self.session_id,
            run_id,
            step_id,
            message_count: core.record.message_count,
            seq: core.record.last_seq,
            created_at: model::now(),
        }));
    }

    /// Appends a compaction summary to the history with its event; its usage counts for the
    /// session.
    pub fn summary(&mut self, core: &mut Core, summary: &Summary, auto: bool) {
        self.message(core, Message::new(Role::System, summary.content.clone()));
        self.usage(core, summary.usage);
        let session_id = self.session_id;
        self.event(
            core,
            EventKind::ContextCompacted {
                session_id,
                turns: summary.turns,
                chars: summary.chars,
                auto,
            },
        );
    }
}

/// What a completed LLM step's record keeps as its response.
#[derive(serde::Serialize)]
struct LlmStepResponse<'a> {
    finish_reason: &'a model::FinishReason,
    message: &'a Message,
}

/// Where a session's commits go: the writer, behind the session's lease, published to its
/// subscribers once durable.
#[derive(Clone, Copy)]
pub(super) struct Sink<'a> {
    pub deps: &'a SessionDeps,
    pub slot: &'a Slot,
}

impl Sink<'_> {
    fn fenced(&self, batch: Batch) -> Vec<WriteOp> {
        self.slot
            .fenced(batch.session_id, self.deps.replica, batch.ops)
    }

    /// Commits a batch and waits until it is durable (its events are then published).
    pub async fn commit(&self, mut batch: Batch) -> Result<(), StoreError> {
        let told = batch.told.take();
        let result = if batch.ops.is_empty() {
            Ok(())
        } else {
            let origin = (batch.session_id, self.slot.generation);
            let ops = self.fenced(batch);
            let publish = Some(self.slot.events.clone());
            self.deps.writer.commit(origin, ops, publish).await
        };
        if let Some(told) = told {
            let _ = told.send(result.as_ref().map(|_| ()).map_err(StoreError::retold));
        }
        result
    }

    /// Queues a batch without waiting: order is kept by the writer, and a failure shows at the
    /// next commit.
    pub async fn queue(&self, mut batch: Batch) -> Result<(), StoreError> {
        if batch.ops.is_empty() {
            if let Some(told) = batch.told.take() {
                let _ = told.send(Ok(()));
            }
            return Ok(());
        }
        let origin = (batch.session_id, self.slot.generation);
        let commit = Commit {
            origin,
            ack: batch.told.take(),
            ops: self.fenced(batch),
            publish: Some(self.slot.events.clone()),
        };
        self.deps.writer.submit(commit).await
    }
}

/// The actor's side of the agent loop for one run.
pub(super) struct RunJournal<'a> {
    pub id: Uuid,
    pub run_id: Uuid,
    pub core: &'a mut Core,
    pub sink: Sink<'a>,
    /// What is gathered and not yet handed to the writer.
    pub batch: Batch,
    /// How the run's tool calls are admitted and answered.
    pub calls: CallDesk,
}

impl<'a> RunJournal<'a> {
    pub fn new(
        id: Uuid,
        run_id: Uuid,
        core: &'a mut Core,
        sink: Sink<'a>,
        calls: CallDesk,
    ) -> RunJournal<'a> {
        RunJournal {
            id,
            run_id,
            core,
            sink,
            batch: Batch::new(id),
            calls,
        }
    }

    /// What is gathered and not yet written, taken out of the journal.
    pub fn take_batch(&mut self) -> Batch {
        std::mem::replace(&mut self.batch, Batch::new(self.id))
    }

    /// Commits what is gathered and waits for it to be durable.
    pub(super) async fn flush_now(&mut self) -> Result<(), StoreError> {
        let batch = self.take_batch();
        self.sink.commit(batch).await
    }

    /// Queues what is gathered without waiting: order is kept by the writer, and a failure
    /// shows at the next commit that is waited for.
    pub(super) async fn queue(&mut self) -> Result<(), StoreError> {
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

    pub(super) fn tool_step(&self, id: Uuid, call: &ToolCall, status: StepStatus) -> StepRow {
        // Plain data with string keys: serialising it cannot fail.
        let request = serde_json::to_string(call).unwrap_or_else(|_| "null".to_string());
        self.step(id, StepKind::Tool, status, request)
    }
}

#[async_trait]
impl Journal for RunJournal<'_> {
    type Error = StoreError;

    fn history(&self) -> &[Message] {
        &self.core.history
    }

    fn session_id(&self) -> Option<Uuid> {
        Some(self.id)
    }

    async fn llm_started(&mut self, request: LlmRequestDescriptor) -> Result<Uuid, StoreError> {
        let step_id = model::new_id();
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
        let response = LlmStepResponse {
            finish_reason: &finish_reason,
            message: &message,
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
        std::mem::take(&mut *super::calls::lock(&self.calls.queued))
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
