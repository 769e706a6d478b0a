//! The loop's one interface to a session: it reads the history and records every fact through
//! a [`Journal`], which a session's run implements; and how a run fails ([`AgentError`]).

use std::sync::Arc;

use async_trait::async_trait;
use uuid::Uuid;

use super::calls::{Admission, Answer};
use super::compaction::Summary;
use super::context::TrimStats;
use crate::llm::LlmError;
use crate::model::{FinishReason, LlmRequestDescriptor, Message, ToolCall, Usage};
use crate::tools::ToolOutput;

/// A completed LLM step's reply, as the journal records it.
#[derive(Debug, Clone)]
pub struct Completion {
    /// The assistant message, with its tool calls and thinking.
    pub message: Message,
    pub finish_reason: FinishReason,
    pub usage: Usage,
}

/// Takes secrets back out of a tool's output: the text with each secret value the run's
/// configuration was given replaced by a label, or `None` when it holds none.
pub type Redactor = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Where the loop reads the history and records what happens. Every method persists before it
/// returns (or queues the write in order, for deltas), so a crash loses at most the step in
/// flight. A journal that cannot record a fact answers its own `Error`, which ends the run.
#[async_trait]
pub trait Journal: Send {
    /// Why a fact could not be recorded (for the session actor: a store error).
    type Error: std::error::Error + Send + Sync + 'static;

    /// The full history, including everything recorded so far in this run.
    fn history(&self) -> &[Message];
    /// The session this journal records, for the traces' `gen_ai.conversation.id`.
    fn session_id(&self) -> Option<Uuid> {
        None
    }
    /// What every tool output passes through before it is traced, recorded or shown to the
    /// model; `None`: outputs are kept as they are.
    fn redactor(&self) -> Option<Redactor> {
        None
    }
    /// Why the run may not start another LLM step because of what it has cost: a cap in money
    /// it has reached, in words; `None` while every cap leaves room (a step's cost is known
    /// only once it is done, so this is asked at each step boundary).
    async fn spend_limit(&mut self) -> Result<Option<String>, Self::Error> {
        Ok(None)
    }
    /// An LLM step begins; `request` describes how to rebuild the exact request.
    async fn llm_started(&mut self, request: LlmRequestDescriptor) -> Result<Uuid, Self::Error>;
    /// A piece of the model's text.
    async fn llm_delta(&mut self, step_id: Uuid, text: String) -> Result<(), Self::Error>;
    /// A piece of the model's reasoning, streamed before its text.
    async fn llm_thinking(&mut self, step_id: Uuid, text: String) -> Result<(), Self::Error>;
    /// The loop is about to wait: for the model's next piece, a tool, or an answer. What was
    /// recorded since the last wait is handed on now, so a journal may gather what it is told
    /// between two waits (the pieces that arrived together, a reply with its tool's start, a
    /// tool's result with the next model step) and write it in one commit.
    async fn waiting(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
    async fn llm_retry(
        &mut self,
        step_id: Uuid,
        attempt: u32,
        error: String,
    ) -> Result<(), Self::Error>;
    /// The reply is complete: appends the assistant message (with its thinking, which is also
    /// the step's thinking step) and checkpoints.
    async fn llm_completed(&mut self, step_id: Uuid, reply: Completion) -> Result<(), Self::Error>;
    async fn llm_failed(&mut self, step_id: Uuid, error: String) -> Result<(), Self::Error>;
    async fn context_trimmed(
        &mut self,
        step_id: Uuid,
        stats: &TrimStats,
    ) -> Result<(), Self::Error>;
    /// Appends the user's input for this turn (after any auto-compaction).
    async fn user_message(&mut self, input: String) -> Result<(), Self::Error>;
    /// Inputs sent for this run while it was active (`?if_busy=queue`), taken out of their
    /// queue at a step boundary.
    fn take_queued(&mut self) -> Vec<String> {
        Vec::new()
    }
    /// Appends an input that was queued for the running turn, as a user message.
    async fn queued_message(&mut self, input: String) -> Result<(), Self::Error> {
        self.user_message(input).await
    }
    /// Appends a compaction summary and announces it.
    async fn summary_appended(&mut self, summary: Summary, auto: bool) -> Result<(), Self::Error>;
    /// A compaction failed; the turn goes on with trimming.
    async fn compact_failed(&mut self, error: String) -> Result<(), Self::Error>;
    /// Decides (and records) whether a call of the current reply runs now, is refused, or
    /// waits for an answer.
    async fn admit(&mut self, call: &ToolCall) -> Result<Admission, Self::Error>;
    /// The next answer to a call that waits (a human's, a client's, or a timeout's); only
    /// asked while some call waits.
    async fn next_answer(&mut self) -> Result<Answer, Self::Error>;
    /// A tool call begins (recorded before it runs).
    async fn tool_started(&mut self, step_id: Uuid, call: &ToolCall) -> Result<(), Self::Error>;
    /// A call is done (it ran, or was refused or answered): its outcome is recorded.
    async fn tool_finished(
        &mut self,
        step_id: Uuid,
        call: &ToolCall,
        output: &ToolOutput,
    ) -> Result<(), Self::Error>;
    /// Results join the history, in the order of the calls, with a checkpoint; `done` when
    /// every call of the reply has its result.
    async fn tool_results(
        &mut self,
        results: &[(ToolCall, ToolOutput)],
        done: bool,
    ) -> Result<(), Self::Error>;
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError<E> {
    #[error("cancelled")]
    Cancelled { usage: Usage, steps: i64 },
    #[error("{error}")]
    Model {
        error: LlmError,
        usage: Usage,
        steps: i64,
    },
    /// The journal failed to record a fact; the run stopped there.
    #[error("recording the run failed: {0}")]
    Journal(#[source] E),
    /// The run could not begin: what it needs (its tools' workspace) cannot be used.
    #[error("{error}")]
    NotStarted { error: String },
}

impl<E> From<E> for AgentError<E> {
    fn from(error: E) -> AgentError<E> {
        AgentError::Journal(error)
    }
}
