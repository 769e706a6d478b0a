//! Compaction (seed 0.31): summarising earlier turns with the model into a summary message
//! that later requests use instead of the turns themselves. The full history is never changed;
//! the summary is one more `system` message in it.

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::context::{self, summary_content, summary_input, SUMMARY_PROMPT};
use super::AgentDeps;
use crate::llm::{LlmError, LlmErrorKind, ModelRequest, Purpose, StreamItem};
use crate::model::{Message, Role, Usage};

/// A summary ready to be appended to the history.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// The summary message's content (starts with the summary prefix).
    pub content: String,
    /// Turns summarised (user messages since the previous summary).
    pub turns: u64,
    /// Characters of the summary.
    pub chars: u64,
    pub usage: Usage,
}

#[derive(Debug, thiserror::Error)]
pub enum CompactError {
    #[error("cancelled")]
    Cancelled,
    #[error(transparent)]
    Model(#[from] LlmError),
}

/// The part of the history a new summary covers: from the newest summary (which the summariser
/// merges) to the end.
pub fn compactable(history: &[Message]) -> &[Message] {
    let from = history.iter().rposition(Message::is_summary).unwrap_or(0);
    &history[from..]
}

/// Turns in the part a summary would cover (0 = nothing to compact).
pub fn compactable_turns(history: &[Message]) -> u64 {
    context::turn_starts(compactable(history)).len() as u64
}

/// Summarises the turns since the last summary (and that summary) with the model.
pub async fn summarize(
    deps: &AgentDeps,
    history: &[Message],
    cancel: &CancellationToken,
) -> Result<Summary, CompactError> {
    let part = compactable(history);
    let turns = context::turn_starts(part).len() as u64;
    let request = ModelRequest {
        messages: vec![
            Message::new(Role::System, SUMMARY_PROMPT),
            Message::new(Role::User, summary_input(part)),
        ],
        tools: Vec::new(),
        purpose: Purpose::Summary,
    };
    let mut stream = deps.model.stream(request);
    let reply = loop {
        let item = tokio::select! {
            item = stream.next() => item,
            _ = cancel.cancelled() => return Err(CompactError::Cancelled),
        };
        match item {
            Some(Ok(StreamItem::Done(reply))) => break reply,
            Some(Ok(_)) => {}
            Some(Err(error)) => return Err(error.into()),
            None => {
                return Err(LlmError::new(
                    deps.model.name(),
                    LlmErrorKind::Protocol,
                    "the summary ended without completing",
                )
                .into())
            }
        }
    };
    let text = reply.text.trim();
    if text.is_empty() {
        return Err(LlmError::new(
            deps.model.name(),
            LlmErrorKind::Protocol,
            "the model returned an empty summary",
        )
        .into());
    }
    Ok(Summary {
        content: summary_content(text),
        turns,
        chars: text.chars().count() as u64,
        usage: reply.usage,
    })
}
