//! The session actor: the only task that mutates its session.
//!
//! It takes [`Command`]s from its mailbox one at a time. Each command has one handler, in the
//! file of its family (`run`, `cancel`, `compact`, `lifecycle`); [`Command::handle`] is the
//! one place that matches on a command. While a run or a compaction is active, the actor keeps
//! reading its mailbox and hands each command to its handler in the [`Phase::Busy`] phase, so
//! cancel reaches the run and everything that would change the session is refused.
//!
//! `access` loads the session and, with replicas, takes its lease; `run` starts a run or a
//! resume, and `drive` drives it (prepare, the turn while the mailbox is served, finish) as a
//! [`crate::session::run::Run`]; `approvals` takes every answer to a waiting call the same
//! way: find the board that holds the call, then answer on it.

mod access;
mod approvals;
mod cancel;
mod compact;
mod drive;
mod lifecycle;
mod run;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::command::Command;
use super::core::Core;
use super::deps::SessionDeps;
use super::errors::{ConflictKind, SessionError};
use super::live::{Inbox, LiveSessions, Retire, Slot};
use super::run::Sink;
use crate::model::SessionState;
use crate::store::StoreError;

/// How long an actor with nothing to do and nobody watching stays in memory.
const IDLE_EVICTION: Duration = Duration::from_secs(60);

pub(super) struct SessionActor {
    id: Uuid,
    deps: Arc<SessionDeps>,
    slot: Arc<Slot>,
    live: LiveSessions,
    /// The session as this actor knows it, once loaded.
    core: Option<Core>,
}

/// Why an actor stops. An actor that stops answers nothing more: the commands left in its
/// mailbox are dropped, and their senders hand them to the actor's successor.
#[derive(Debug)]
pub(super) enum Stop {
    /// Nothing to do and nobody watching.
    Idle,
    /// The server is shutting down.
    Shutdown,
    /// The session was deleted, or never existed.
    Gone,
    /// A write failed (and was logged), for this reason: what the actor holds may be ahead of
    /// the database, so a successor reloads the session.
    WriteFailed(String),
    /// Another replica holds the session's lease now; every write would be refused.
    LeaseLost,
}

/// What the actor is doing when a command arrives.
pub(super) enum Phase<'a> {
    /// Nothing is active: the handler has the actor (and its mailbox) to itself.
    Idle(&'a mut SessionActor, &'a mut Inbox),
    /// A run or a compaction is active; the handler reaches it only through its `Activity`.
    Busy(&'a Activity),
}

/// The run or compaction in progress, as commands that arrive meanwhile see it.
pub(super) struct Activity {
    pub cancel: CancellationToken,
    pub what: Active,
    /// For a run: its board, where its calls wait for answers.
    driven: Option<approvals::Driven>,
    /// Where an answer to a call of an earlier run is looked up.
    earlier: approvals::EarlierCalls,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Active {
    Run(Uuid),
    /// A compaction of a session in this state (a compaction does not change it).
    Compaction(SessionState),
}

impl Activity {
    /// The refusal of something that would change the session while this is active.
    pub fn conflict(&self, what: &'static str) -> SessionError {
        SessionError::Conflict(match self.what {
            Active::Run(run_id) => ConflictKind::RunActive {
                run_id,
                before: what,
            },
            Active::Compaction(_) => ConflictKind::CompactionActive { before: what },
        })
    }
}

impl Stop {
    /// The actor stops because a write failed; says so in the log.
    pub fn write_failed(session_id: Uuid, error: &StoreError) -> Stop {
        tracing::error!(%session_id, %error, "session actor stops after a storage failure");
        Stop::WriteFailed(error.to_string())
    }
}

impl Command {
    /// Hands the command to its handler: the one place a command is matched.
    pub(super) async fn handle(self, phase: Phase<'_>) -> Result<(), Stop> {
        match self {
            Command::Run { request, reply } => run::handle(phase, request, reply).await,
            Command::Cancel { reply } => cancel::handle(phase, reply).await,
            Command::RemoteCancel => cancel::remote(phase),
            Command::Compact { reply } => compact::handle(phase, reply).await,
            Command::Delete { reply } => lifecycle::delete(phase, reply).await,
            Command::SetCostCap {
                max_cost_usd,
                reply,
            } => lifecycle::set_cost_cap(phase, max_cost_usd, reply).await,
            Command::TakeOver { reply } => lifecycle::take_over(phase, reply).await,
            Command::LeaseLost => lifecycle::lease_lost(phase),
            Command::Recover { reply } => lifecycle::recover(phase, reply).await,
            Command::Approve {
                call_id,
                answer,
                reply,
            } => approvals::approve(phase, call_id, answer, reply).await,
            Command::ClientResult { result, reply } => {
                approvals::client_result(phase, result, reply).await
            }
        }
    }
}

impl SessionActor {
    pub fn new(
        id: Uuid,
        deps: Arc<SessionDeps>,
        slot: Arc<Slot>,
        live: LiveSessions,
    ) -> SessionActor {
        SessionActor {
            id,
            deps,
            slot,
            live,
            core: None,
        }
    }

    /// Serves the mailbox until the actor stops, then leaves its slot.
    ///
    /// An actor that stops on a failed write leaves its slot to its subscribers, who get the
    /// run's terminal event once a successor records it. A successor of a stalled session
    /// tries that record first, so when it fails too the record is not near: the slot is
    /// dropped, and its subscribers' streams end rather than wait for it.
    pub async fn run(mut self, mut inbox: Inbox) {
        let stop = self.serve(&mut inbox).await;
        let unrecorded = matches!(stop, Stop::WriteFailed(_)) && self.live.is_stalled(self.id);
        match &stop {
            Stop::LeaseLost => {
                tracing::warn!(session_id = %self.id, "session actor stops: another replica holds the session");
            }
            // What it did not write is recorded by a successor once writes succeed again.
            Stop::WriteFailed(cause) => self.live.stall(self.id, cause),
            Stop::Idle | Stop::Shutdown | Stop::Gone => {}
        }
        // A lease it held is given back, void or taken: nobody is to renew it.
        self.slot.lease.forget();
        let generation = self.slot.generation;
        // This incarnation writes no more: once its queued commits are done, the writer may
        // forget whether one failed.
        self.deps.writer.retire((self.id, generation)).await;
        match stop {
            Stop::Gone => self.live.forget(self.id, generation),
            Stop::WriteFailed(_) if unrecorded => {
                tracing::warn!(session_id = %self.id, "the session's failed run cannot be recorded yet; its event streams end");
                self.live.forget(self.id, generation);
            }
            // Idle eviction has left the slot already; at shutdown nothing spawns again.
            Stop::Idle | Stop::Shutdown => {}
            Stop::WriteFailed(_) | Stop::LeaseLost => {
                self.live.retire(self.id, generation, Retire::Always);
            }
        }
        inbox.close();
    }

    async fn serve(&mut self, inbox: &mut Inbox) -> Stop {
        loop {
            let command = tokio::select! {
                command = inbox.recv() => command,
                _ = tokio::time::sleep(IDLE_EVICTION) => {
                    if self.live.retire(self.id, self.slot.generation, Retire::IfUnwatched) {
                        return Stop::Idle;
                    }
                    continue;
                }
                _ = self.deps.shutdown.cancelled() => return Stop::Shutdown,
            };
            // Every sender is gone: the slot was replaced or dropped.
            let Some(command) = command else {
                return Stop::Idle;
            };
            // Boxed, as is the release: the actor's task holds the state of the largest future
            // it awaits inline for as long as the actor lives, idle most of that time, and a
            // command's (a whole run's) is several KB.
            if let Err(stop) = Box::pin(command.handle(Phase::Idle(self, inbox))).await {
                return stop;
            }
            // With replicas, the lease goes back as soon as the session is idle here.
            Box::pin(self.release()).await;
        }
    }

    fn sink(&self) -> Sink<'_> {
        Sink {
            deps: &self.deps,
            slot: &self.slot,
        }
    }
}
