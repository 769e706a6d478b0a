//! The agent loop and context management.
//!
//! The loop calls the model with the projected context, streams its text, runs the tools it
//! asks for and appends their results, until the model answers without tool calls, the step
//! limit is reached, or the run is cancelled. It owns no state: it reads the history and
//! records everything through a [`Journal`], which a session's run implements, so this module
//! never depends on sessions or storage. A turn is [`run_turn`].

pub mod budget;
mod calls;
pub mod compaction;
pub mod context;
#[cfg(test)]
mod fixtures;
mod journal;
mod turn;

pub use calls::{Admission, Answer, Verdict};
pub use journal::{AgentError, Completion, Journal, Redactor};
pub use turn::{run_turn, AgentDeps, AgentSettings, TurnOutcome};
