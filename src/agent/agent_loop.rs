//! [`AgentLoop`]: how a run turns the model's replies into steps. The seed draws several loops
//! (coding, research, parallel, team) behind one interface; a loop reads and records
//! everything through the [`Journal`], so a new one needs nothing from sessions or storage.
//! Only the [`DefaultLoop`] ships.

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::turn::{run_turn, AgentDeps, AgentError, AgentSettings, Journal, TurnOutcome};

/// One way of running a turn to its end.
pub trait AgentLoop: Send + Sync {
    /// The name a session would choose it by.
    fn name(&self) -> &'static str;

    /// Runs one turn: with `input`, a new one; without, the interrupted turn is continued.
    /// Unless a loop says otherwise, it runs the default turn ([`run_turn`]).
    fn run<'a, J: Journal + 'a>(
        &'a self,
        journal: &'a mut J,
        deps: &'a AgentDeps,
        settings: &'a AgentSettings,
        input: Option<String>,
        cancel: &'a CancellationToken,
    ) -> BoxFuture<'a, Result<TurnOutcome, AgentError<J::Error>>> {
        Box::pin(run_turn(journal, deps, settings, input, cancel))
    }
}

/// The seed's default loop: call the model with the projected context, run the tools it asks
/// for, append their results, and go on until it answers without tool calls, `max_steps` is
/// reached, or the run is cancelled.
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultLoop;

impl AgentLoop for DefaultLoop {
    fn name(&self) -> &'static str {
        "default"
    }
}
