//! One run of the default loop (the seed's `defaultLoop`), with `max_steps` and cancellation.

use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::compaction::{self, CompactError, Summary};
use super::context::{self, TrimStats};
use crate::llm::{LlmError, ModelClient, ModelRequest, Purpose, StreamItem};
use crate::model::{FinishReason, LlmRequestDescriptor, Message, Role, ToolCall, Usage};
use crate::tools::{ToolOutput, ToolRegistry};

/// The configuration in force for a run: always the server's current one (seed v0.22).
#[derive(Debug, Clone)]
pub struct AgentSettings {
    pub system_prompt: String,
    /// LLM calls per run at most; `None` = unlimited.
    pub max_steps: Option<u32>,
    /// Character budget of each request; `None` = send the full history.
    pub context_chars: Option<usize>,
}

/// What the loop needs besides the session.
#[derive(Clone)]
pub struct AgentDeps {
    pub model: Arc<dyn ModelClient>,
    pub tools: ToolRegistry,
}

/// The journal could not record a fact (the store failed); the run cannot go on.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct JournalError(pub String);

/// Where the loop reads the history and records what happens. Every method persists before it
/// returns (or queues the write in order, for deltas), so a crash loses at most the step in
/// flight.
#[async_trait]
pub trait Journal: Send {
    /// The full history, including everything recorded so far in this run.
    fn history(&self) -> &[Message];
    /// An LLM step begins; `request` describes how to rebuild the exact request.
    async fn llm_started(&mut self, request: LlmRequestDescriptor) -> Result<Uuid, JournalError>;
    async fn llm_delta(&mut self, step_id: Uuid, text: String) -> Result<(), JournalError>;
    async fn llm_retry(
        &mut self,
        step_id: Uuid,
        attempt: u32,
        error: String,
    ) -> Result<(), JournalError>;
    /// The reply is complete: appends the assistant message and checkpoints.
    async fn llm_completed(
        &mut self,
        step_id: Uuid,
        message: Message,
        finish_reason: FinishReason,
        usage: Usage,
    ) -> Result<(), JournalError>;
    async fn llm_failed(&mut self, step_id: Uuid, error: String) -> Result<(), JournalError>;
    async fn context_trimmed(
        &mut self,
        step_id: Uuid,
        stats: &TrimStats,
    ) -> Result<(), JournalError>;
    /// Appends the user's input for this turn (after any auto-compaction).
    async fn user_message(&mut self, input: String) -> Result<(), JournalError>;
    /// Appends a compaction summary and announces it.
    async fn summary_appended(&mut self, summary: Summary, auto: bool) -> Result<(), JournalError>;
    /// A compaction failed; the turn goes on with trimming.
    async fn compact_failed(&mut self, error: String) -> Result<(), JournalError>;
    /// A tool call begins (recorded before it runs).
    async fn tool_started(&mut self, call: &ToolCall) -> Result<Uuid, JournalError>;
    /// The tool is done: appends its result message and checkpoints.
    async fn tool_finished(
        &mut self,
        step_id: Uuid,
        call: &ToolCall,
        output: &ToolOutput,
    ) -> Result<(), JournalError>;
}

/// How a run ended without error.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutcome {
    pub text: String,
    /// The model's last finish reason, or `max_steps`.
    pub finish_reason: FinishReason,
    pub usage: Usage,
    pub steps: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cancelled")]
    Cancelled { usage: Usage, steps: i64 },
    #[error("{error}")]
    Model {
        error: LlmError,
        usage: Usage,
        steps: i64,
    },
    #[error("storage failed: {0}")]
    Journal(#[from] JournalError),
}

/// Runs the loop until the model answers without tool calls. With `input` (a new turn), the
/// user message is appended first, after compacting the earlier turns when the turn's first
/// request would be over budget. Tool calls of the current turn that have no result yet (an
/// interrupted turn being resumed) are run before the next model call.
pub async fn run_turn(
    journal: &mut dyn Journal,
    deps: &AgentDeps,
    settings: &AgentSettings,
    input: Option<String>,
    cancel: &CancellationToken,
) -> Result<TurnOutcome, AgentError> {
    let mut usage = Usage::default();
    let mut steps: i64 = 0;
    let mut last_text = String::new();
    if let Some(input) = input {
        if let Some(budget) = settings.context_chars {
            auto_compact(journal, deps, settings, &input, budget, cancel, &mut usage).await?;
        }
        journal.user_message(input).await?;
    }
    loop {
        for call in pending_calls(journal.history()) {
            if cancel.is_cancelled() {
                return Err(AgentError::Cancelled { usage, steps });
            }
            let step_id = journal.tool_started(&call).await?;
            let output = tokio::select! {
                output = deps.tools.execute(&call) => output,
                _ = cancel.cancelled() => return Err(AgentError::Cancelled { usage, steps }),
            };
            journal.tool_finished(step_id, &call, &output).await?;
        }
        if cancel.is_cancelled() {
            return Err(AgentError::Cancelled { usage, steps });
        }
        if settings
            .max_steps
            .is_some_and(|max| steps >= i64::from(max))
        {
            return Ok(TurnOutcome {
                text: last_text,
                finish_reason: FinishReason::MaxSteps,
                usage,
                steps,
            });
        }

        let history = journal.history();
        let (messages, stats) =
            context::prepare_context(history, &settings.system_prompt, settings.context_chars);
        let tools = deps.tools.schemas();
        let descriptor = LlmRequestDescriptor {
            upto: history.len(),
            system_prompt: settings.system_prompt.clone(),
            budget: settings.context_chars,
            model: deps.model.model().to_string(),
            provider: deps.model.name().to_string(),
            tools: tools.iter().map(|t| t.name.clone()).collect(),
            trim: stats.clone(),
        };
        let step_id = journal.llm_started(descriptor).await?;
        if stats.trimmed() {
            journal.context_trimmed(step_id, &stats).await?;
        }
        steps += 1;
        let mut stream = deps.model.stream(ModelRequest {
            messages,
            tools,
            purpose: Purpose::Turn,
        });
        let reply = loop {
            let item = tokio::select! {
                item = stream.next() => item,
                _ = cancel.cancelled() => {
                    drop(stream);
                    journal.llm_failed(step_id, "cancelled".to_string()).await?;
                    return Err(AgentError::Cancelled { usage, steps });
                }
            };
            match item {
                Some(Ok(StreamItem::Delta(text))) => journal.llm_delta(step_id, text).await?,
                Some(Ok(StreamItem::Retry { attempt, error })) => {
                    journal.llm_retry(step_id, attempt, error).await?
                }
                Some(Ok(StreamItem::Done(reply))) => break reply,
                Some(Err(error)) => {
                    journal.llm_failed(step_id, error.to_string()).await?;
                    return Err(AgentError::Model {
                        error,
                        usage,
                        steps,
                    });
                }
                None => {
                    let error = LlmError::new(
                        deps.model.name(),
                        crate::llm::LlmErrorKind::Protocol,
                        "the reply ended without completing",
                    );
                    journal.llm_failed(step_id, error.to_string()).await?;
                    return Err(AgentError::Model {
                        error,
                        usage,
                        steps,
                    });
                }
            }
        };
        usage.add(reply.usage);
        let done = reply.tool_calls.is_empty();
        last_text = reply.text.clone();
        let message = Message::assistant(reply.text, reply.tool_calls);
        let finish_reason = FinishReason::Model(reply.finish_reason);
        journal
            .llm_completed(step_id, message, finish_reason.clone(), reply.usage)
            .await?;
        if done {
            return Ok(TurnOutcome {
                text: last_text,
                finish_reason,
                usage,
                steps,
            });
        }
    }
}

/// Compacts the earlier turns when the turn's first request would exceed the budget: one
/// attempt; on failure the turn goes on and trimming does the rest.
async fn auto_compact(
    journal: &mut dyn Journal,
    deps: &AgentDeps,
    settings: &AgentSettings,
    input: &str,
    budget: usize,
    cancel: &CancellationToken,
    usage: &mut Usage,
) -> Result<(), AgentError> {
    let history = journal.history();
    if compaction::compactable_turns(history) == 0 {
        return Ok(());
    }
    let (messages, _) = context::prepare_context(history, &settings.system_prompt, None);
    let first_request =
        context::context_chars(&messages) + Message::new(Role::User, input).size_chars();
    if first_request <= budget {
        return Ok(());
    }
    match compaction::summarize(deps, history, cancel).await {
        Ok(summary) => {
            usage.add(summary.usage);
            journal.summary_appended(summary, true).await?;
        }
        Err(CompactError::Cancelled) => {
            return Err(AgentError::Cancelled {
                usage: *usage,
                steps: 0,
            })
        }
        Err(CompactError::Model(error)) => journal.compact_failed(error.to_string()).await?,
    }
    Ok(())
}

/// Tool calls of the current turn (after the last user message) that have no result yet.
fn pending_calls(history: &[Message]) -> Vec<ToolCall> {
    let start = history
        .iter()
        .rposition(|m| m.role == Role::User)
        .unwrap_or(0);
    context::dangling_tool_calls(&history[start..])
}
