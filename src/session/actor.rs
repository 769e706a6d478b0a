//! The session actor: the only task that mutates its session. It takes commands from its
//! mailbox, drives runs through the agent loop, and records everything as ops + events that
//! the group-commit writer persists and then publishes.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::registry::{
    new_event, CancelOutcome, RunRequest, RunStarted, SessionContext, Sessions, Slot,
};
use super::SessionError;
use crate::agent::compaction::{self, CompactError, Summary};
use crate::agent::context::{self, TrimStats};
use crate::agent::{run_turn, AgentError, Journal, JournalError, TurnOutcome};
use crate::model::{
    self, Checkpoint, EventKind, FinishReason, LlmRequestDescriptor, Message, Role, RunKind,
    RunRecord, RunResult, RunStatus, SessionRecord, SessionState, StepKind, StepRecord, StepStatus,
    ToolCall, Usage,
};
use crate::store::writer::Commit;
use crate::store::{Cluster, StoreError, WriteOp};
use crate::tools::ToolOutput;

pub(super) type Reply<T> = oneshot::Sender<Result<T, SessionError>>;

pub(super) enum Command {
    Run {
        request: RunRequest,
        reply: Reply<RunStarted>,
    },
    Cancel {
        reply: Reply<CancelOutcome>,
    },
    Delete {
        reply: Reply<()>,
    },
    /// Records a run left in progress by a dead process or replica as interrupted (taking
    /// the session's lease first when replicas share the database); answers whether it was.
    TakeOver {
        reply: Reply<bool>,
    },
    /// Another replica asks to cancel this session's run (only acts while one is active).
    RemoteCancel,
    /// The heartbeat found this replica no longer holds the session's lease.
    LeaseLost,
    /// Summarises all turns so far; `None` when there is nothing to compact.
    Compact {
        reply: Reply<Option<Compacted>>,
    },
}

/// What a manual compaction did.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Compacted {
    pub turns: u64,
    pub chars: u64,
}

/// How long an actor with nothing to do and nobody watching stays in memory.
const IDLE_EVICTION: Duration = Duration::from_secs(60);
/// The error recorded for a run that a dead (or stopping) process left unfinished.
pub const INTERRUPTED: &str = "interrupted";

pub(super) struct SessionActor {
    id: Uuid,
    ctx: Arc<SessionContext>,
    slot: Arc<Slot>,
    sessions: Sessions,
    core: Option<Core>,
    /// The epoch of the session's lease while this replica holds it (scale-out only).
    lease: Option<i64>,
}

/// The session's state while its actor lives.
struct Core {
    record: SessionRecord,
    next_seq: i64,
    history: Vec<Message>,
    last_result: Option<RunResult>,
    /// The newest run, for resume.
    last_run: Option<RunRecord>,
}

impl SessionActor {
    pub fn new(id: Uuid, ctx: Arc<SessionContext>, slot: Arc<Slot>, sessions: Sessions) -> Self {
        SessionActor {
            id,
            ctx,
            slot,
            sessions,
            core: None,
            lease: None,
        }
    }

    pub async fn run(mut self, mut inbox: mpsc::Receiver<Command>) {
        let retire_all = loop {
            let command = tokio::select! {
                command = inbox.recv() => command,
                _ = tokio::time::sleep(IDLE_EVICTION) => {
                    if self.sessions.retire(self.id, self.slot.generation, true) {
                        break true;
                    }
                    continue;
                }
                _ = self.ctx.shutdown.cancelled() => break true,
            };
            let Some(command) = command else { break false };
            match self.handle(command, &mut inbox).await {
                Ok(Flow::Continue) => {}
                Ok(Flow::Deleted) => {
                    self.sessions.forget(self.id, self.slot.generation);
                    break true;
                }
                Err(error) => {
                    tracing::error!(session_id = %self.id, %error, "session actor stops after a storage failure");
                    // A lease it held is void (or was taken): nobody is to renew it.
                    self.forget_lease();
                    self.sessions.retire(self.id, self.slot.generation, false);
                    break true;
                }
            }
        };
        if retire_all {
            inbox.close();
            while let Ok(command) = inbox.try_recv() {
                command.retired();
            }
        }
    }

    /// Loads the session on first use. A run stored as in progress has no owner (this actor is
    /// its only one), so its process died: it is recorded as interrupted.
    async fn load(&mut self) -> Result<Option<&mut Core>, StoreError> {
        if self.core.is_none() {
            let store = &self.ctx.store;
            let Some(record) = store.session(self.id).await? else {
                return Ok(None);
            };
            let history = store.messages(self.id, -1, i64::MAX).await?;
            let last_run = match record.last_run_id {
                Some(run_id) => store.run(self.id, run_id).await?,
                None => None,
            };
            let mut core = Core {
                next_seq: record.last_seq + 1,
                record,
                history,
                last_result: last_run.as_ref().map(RunResult::from),
                last_run,
            };
            // With replicas, an active session may be running elsewhere: only the holder of its
            // lease may call it interrupted (see `claim`).
            if core.record.state.is_active() && self.ctx.cluster.is_none() {
                self.recover_interrupted(&mut core).await?;
            }
            self.core = Some(core);
        }
        Ok(self.core.as_mut())
    }

    async fn recover_interrupted(&self, core: &mut Core) -> Result<(), StoreError> {
        let mut batch = Batch::new(self.id);
        // As at the end of any run: the state change, then the run's terminal event.
        batch.state(core, SessionState::Failed, Some(INTERRUPTED.to_string()));
        if let Some(run) = core.last_run.as_mut() {
            if run.status == RunStatus::Running {
                run.status = RunStatus::Failed;
                run.error = Some(INTERRUPTED.to_string());
                run.finished_at = Some(model::now());
                core.last_result = Some(RunResult::from(&*run));
                let run_id = run.id;
                batch.ops.push(WriteOp::UpsertRun(run.clone()));
                // Its step in flight never finished: it is not left "streaming" for good.
                batch.ops.push(WriteOp::FailOpenSteps {
                    session_id: self.id,
                    run_id,
                    error: INTERRUPTED.to_string(),
                    at: model::now(),
                });
                batch.event(
                    core,
                    EventKind::AgentFailed {
                        run_id,
                        error: INTERRUPTED.to_string(),
                    },
                );
            }
        }
        tracing::info!(session_id = %self.id, "recorded an interrupted run");
        self.commit(batch).await
    }

    async fn handle(
        &mut self,
        command: Command,
        inbox: &mut mpsc::Receiver<Command>,
    ) -> Result<Flow, StoreError> {
        // Writers claim the session first (its lease, with replicas); readers only load it.
        let writes = matches!(
            command,
            Command::Run { .. }
                | Command::Compact { .. }
                | Command::Delete { .. }
                | Command::TakeOver { .. }
        );
        let ready = if writes {
            self.claim().await
        } else {
            self.load_or_missing().await
        };
        match ready {
            Ok(Ok(())) => {}
            Ok(Err(SessionError::NotFound)) => {
                command.fail(SessionError::NotFound);
                return Ok(Flow::Deleted);
            }
            Ok(Err(error)) => {
                match command {
                    // Running on another replica: not ours to take over.
                    Command::TakeOver { reply } => drop(reply.send(Ok(false))),
                    command => command.fail(error),
                }
                return Ok(Flow::Continue);
            }
            Err(error) => {
                command.fail(SessionError::Store(error));
                return Ok(Flow::Continue);
            }
        }
        let flow = match command {
            Command::RemoteCancel => Flow::Continue,
            Command::LeaseLost => {
                self.forget_lease();
                self.core = None;
                Flow::Continue
            }
            Command::TakeOver { reply } => {
                let interrupted = self.core.as_ref().is_some_and(|c| {
                    c.record.state == SessionState::Failed
                        && c.record.error.as_deref() == Some(INTERRUPTED)
                });
                let _ = reply.send(Ok(interrupted));
                Flow::Continue
            }
            Command::Cancel { reply } => {
                let _ = reply.send(self.cancel_elsewhere().await);
                Flow::Continue
            }
            Command::Delete { reply } => {
                let batch = Batch::new(self.id).with(WriteOp::DeleteSession(self.id));
                let result = self.commit(batch).await;
                let deleted = result.is_ok();
                let _ = reply.send(result.map_err(SessionError::from));
                if deleted {
                    self.forget_lease();
                    return Ok(Flow::Deleted);
                }
                Flow::Continue
            }
            Command::Run { request, reply } => self.start_run(request, reply, inbox).await?,
            Command::Compact { reply } => self.compact(reply, inbox).await?,
        };
        self.release().await;
        Ok(flow)
    }

    /// Loads the session for reading.
    async fn load_or_missing(&mut self) -> Result<Result<(), SessionError>, StoreError> {
        Ok(match self.load().await? {
            Some(_) => Ok(()),
            None => Err(SessionError::NotFound),
        })
    }

    /// Makes this process the session's writer. On a single node it always is. With replicas
    /// it takes the session's lease (refused while another live replica holds it); a new
    /// epoch means another replica may have written since, so the session is reloaded, and a
    /// run it finds in progress was left by a dead replica: it is recorded as interrupted.
    async fn claim(&mut self) -> Result<Result<(), SessionError>, StoreError> {
        let Some(cluster) = self.ctx.cluster.clone() else {
            return self.load_or_missing().await;
        };
        let Some(epoch) = self.acquire(cluster.as_ref()).await? else {
            if self.ctx.store.session(self.id).await?.is_none() {
                return Ok(Err(SessionError::NotFound));
            }
            return Ok(Err(SessionError::Conflict {
                kind: "session-leased",
                detail:
                    "the session is running on another replica; cancel it or wait for it to end"
                        .to_string(),
            }));
        };
        if self.lease != Some(epoch) {
            self.core = None;
        }
        self.lease = Some(epoch);
        *self.slot.fence.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((self.ctx.replica, epoch));
        self.sessions.note_lease(self.id, Some(epoch));
        if self.load().await?.is_none() {
            self.release().await;
            return Ok(Err(SessionError::NotFound));
        }
        if let Some(mut core) = self.core.take() {
            let recovered = if core.record.state.is_active() {
                self.recover_interrupted(&mut core).await
            } else {
                Ok(())
            };
            self.core = Some(core);
            recovered?;
        }
        Ok(Ok(()))
    }

    /// Takes the session's lease. A replica gives a lease back right after the commit that
    /// ends its run, so a refusal while the session is stored as idle is retried briefly.
    async fn acquire(&self, cluster: &dyn Cluster) -> Result<Option<i64>, StoreError> {
        for attempt in 0..10 {
            let epoch = cluster
                .acquire(self.id, self.ctx.replica, self.ctx.lease_ttl)
                .await?;
            if epoch.is_some() || attempt == 9 {
                return Ok(epoch);
            }
            let active = self
                .ctx
                .store
                .session(self.id)
                .await?
                .is_none_or(|s| s.state.is_active());
            if active {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(None)
    }

    /// Gives the lease back (scale-out) once the session is idle here.
    async fn release(&mut self) {
        let Some(cluster) = self.ctx.cluster.clone() else {
            return;
        };
        if self.lease.is_some() {
            if let Err(error) = cluster.release(self.id, self.ctx.replica).await {
                tracing::warn!(session_id = %self.id, %error, "could not release a lease; it will expire");
            }
            self.forget_lease();
        }
    }

    fn forget_lease(&mut self) {
        self.lease = None;
        *self.slot.fence.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.sessions.note_lease(self.id, None);
    }

    /// Cancel with no run active here: with replicas the run may be active on another one,
    /// which is asked to cancel it.
    async fn cancel_elsewhere(&mut self) -> Result<CancelOutcome, SessionError> {
        let record = match &self.ctx.cluster {
            Some(_) => self.ctx.store.session(self.id).await?,
            None => self.core.as_ref().map(|c| c.record.clone()),
        };
        let Some(record) = record else {
            return Err(SessionError::NotFound);
        };
        if let (Some(cluster), true) = (&self.ctx.cluster, record.state.is_active()) {
            cluster.send_cancel(self.id).await?;
            return Ok(CancelOutcome {
                cancelled: true,
                run_id: record.last_run_id,
                state: record.state,
            });
        }
        Ok(CancelOutcome {
            cancelled: false,
            run_id: None,
            state: record.state,
        })
    }

    async fn start_run(
        &mut self,
        request: RunRequest,
        reply: Reply<RunStarted>,
        inbox: &mut mpsc::Receiver<Command>,
    ) -> Result<Flow, StoreError> {
        let Some(core) = self.core.as_mut() else {
            let _ = reply.send(Err(SessionError::NotFound));
            return Ok(Flow::Continue);
        };
        if request.kind == RunKind::Resume {
            match core.record.state {
                SessionState::Completed => {
                    let result = core.last_result.clone();
                    let _ = reply.send(match result {
                        Some(result) => Ok(RunStarted::AlreadyCompleted(result)),
                        None => Err(nothing_to_resume()),
                    });
                    return Ok(Flow::Continue);
                }
                SessionState::Idle => {
                    let _ = reply.send(Err(nothing_to_resume()));
                    return Ok(Flow::Continue);
                }
                _ => {}
            }
        }

        let Ok(permit) = self.ctx.run_permits.clone().try_acquire_owned() else {
            let _ = reply.send(Err(SessionError::TooBusy(
                "the server is running as many runs as it is allowed to; retry shortly".to_string(),
            )));
            return Ok(Flow::Continue);
        };
        let now = model::now();
        let run_id = model::new_id();
        let mut batch = Batch::new(self.id);
        let run = RunRecord {
            id: run_id,
            session_id: self.id,
            kind: request.kind,
            status: RunStatus::Running,
            input: request.input.clone(),
            text: None,
            finish_reason: None,
            usage: Usage::default(),
            steps: 0,
            error: None,
            start_seq: core.next_seq,
            created_at: now,
            finished_at: None,
        };
        batch.event(
            core,
            EventKind::AgentStarted {
                run_id,
                kind: request.kind,
            },
        );
        core.record.last_run_id = Some(run_id);
        batch.state(core, SessionState::Running, None);
        let mut input = request.input.clone();
        if input.is_some() {
            // Earlier calls left without a result get one, so providers accept the history.
            for call in context::dangling_tool_calls(&core.history) {
                batch.message(core, Message::tool_result(call.id, context::NOT_RUN_RESULT));
            }
        } else if let Some(previous) = core.last_run.as_ref() {
            // A run interrupted before its input was appended: the resume appends it.
            let appended = core
                .history
                .iter()
                .any(|m| m.role == Role::User && m.created_at >= previous.created_at);
            if previous.kind == RunKind::Run && !appended {
                input = previous.input.clone();
            }
        }
        batch.ops.push(WriteOp::UpsertRun(run.clone()));
        core.last_run = Some(run.clone());
        if let Err(error) = self.commit(batch).await {
            let _ = reply.send(Err(SessionError::Store(error)));
            return Err(StoreError::Poisoned);
        }
        let (result_tx, result_rx) = oneshot::channel();
        let _ = reply.send(Ok(RunStarted::Started {
            run: run.clone(),
            result: result_rx,
        }));
        let flow = self.drive(run, input, result_tx, inbox).await;
        drop(permit);
        flow
    }

    /// Runs the loop while still answering the mailbox: cancel reaches the run, other runs are
    /// refused.
    async fn drive(
        &mut self,
        mut run: RunRecord,
        input: Option<String>,
        result_tx: oneshot::Sender<RunResult>,
        inbox: &mut mpsc::Receiver<Command>,
    ) -> Result<Flow, StoreError> {
        let cancel = self.ctx.shutdown.child_token();
        let Some(core) = self.core.as_mut() else {
            return Ok(Flow::Continue);
        };
        // The current configuration wins (seed v0.22), except for a prompt the session was
        // created with on purpose.
        let mut settings = self.ctx.settings.clone();
        if let Some(prompt) = &core.record.system_prompt {
            settings.system_prompt = prompt.clone();
        }
        let mut journal = RunJournal {
            id: self.id,
            run_id: run.id,
            core,
            ctx: &self.ctx,
            slot: &self.slot,
            batch: Batch::new(self.id),
        };
        let mut lease_lost = false;
        let outcome = {
            let turn = run_turn(&mut journal, &self.ctx.deps, &settings, input, &cancel);
            tokio::pin!(turn);
            loop {
                tokio::select! {
                    outcome = &mut turn => break outcome,
                    Some(command) = inbox.recv() => {
                        lease_lost |= busy(command, &cancel, Activity::Run(run.id));
                    }
                }
            }
        };
        if lease_lost {
            // Another replica owns the session now; every write would be refused.
            drop(result_tx);
            return Err(StoreError::Fenced);
        }
        if self.ctx.cluster.is_some() && self.ctx.shutdown.is_cancelled() {
            // Leave the run as it is: its lease is released at shutdown and another replica
            // takes it over from the last checkpoint at once.
            let batch = std::mem::replace(&mut journal.batch, Batch::new(self.id));
            let _ = commit(&self.ctx, &self.slot, batch).await;
            return Ok(Flow::Continue);
        }
        let mut batch = std::mem::replace(&mut journal.batch, Batch::new(self.id));
        let core = journal.core;
        let shutting_down = self.ctx.shutdown.is_cancelled();
        let (state, terminal) = match outcome {
            Ok(TurnOutcome {
                text,
                finish_reason,
                usage,
                steps,
            }) => {
                run.usage = usage;
                run.steps = steps;
                run.text = Some(text.clone());
                run.finish_reason = Some(finish_reason.clone());
                if finish_reason == FinishReason::MaxSteps {
                    run.status = RunStatus::Failed;
                    run.error = Some("max_steps reached".to_string());
                    (
                        SessionState::Failed,
                        EventKind::AgentFinished {
                            run_id: run.id,
                            text,
                            finish_reason,
                            usage,
                        },
                    )
                } else {
                    run.status = RunStatus::Completed;
                    (
                        SessionState::Completed,
                        EventKind::AgentFinished {
                            run_id: run.id,
                            text,
                            finish_reason,
                            usage,
                        },
                    )
                }
            }
            Err(AgentError::Cancelled { usage, steps }) if shutting_down => {
                // Stopping the server interrupts the run like a crash would, but cleanly: it
                // stays resumable.
                run.usage = usage;
                run.steps = steps;
                run.status = RunStatus::Failed;
                run.error = Some(INTERRUPTED.to_string());
                (
                    SessionState::Failed,
                    EventKind::AgentFailed {
                        run_id: run.id,
                        error: INTERRUPTED.to_string(),
                    },
                )
            }
            Err(AgentError::Cancelled { usage, steps }) => {
                run.usage = usage;
                run.steps = steps;
                run.status = RunStatus::Cancelled;
                (
                    SessionState::Cancelled,
                    EventKind::AgentCancelled { run_id: run.id },
                )
            }
            Err(AgentError::Model {
                error,
                usage,
                steps,
            }) => {
                run.usage = usage;
                run.steps = steps;
                run.status = RunStatus::Failed;
                run.error = Some(error.to_string());
                (
                    SessionState::Failed,
                    EventKind::AgentFailed {
                        run_id: run.id,
                        error: error.to_string(),
                    },
                )
            }
            Err(AgentError::Journal(error)) => {
                // The store failed: what was queued is void. This actor stops; its successor
                // reloads the session and records the run as interrupted.
                tracing::error!(session_id = %self.id, %error, "run stopped by a storage failure");
                drop(result_tx);
                return Err(StoreError::Poisoned);
            }
        };
        run.finished_at = Some(model::now());
        let error = run.error.clone();
        batch.checkpoint(core, run.id, None);
        batch.state(
            core,
            state,
            if state == SessionState::Failed {
                error
            } else {
                None
            },
        );
        batch.event(core, terminal);
        batch.ops.push(WriteOp::UpsertRun(run.clone()));
        let result = RunResult::from(&run);
        core.last_result = Some(result.clone());
        core.last_run = Some(run);
        let committed = commit(&self.ctx, &self.slot, batch).await;
        let _ = result_tx.send(result);
        committed.map(|()| Flow::Continue)
    }

    /// Manual compaction: summarises every turn since the last summary and appends the
    /// summary at the end of the history. Cancel aborts it and nothing is written.
    async fn compact(
        &mut self,
        reply: Reply<Option<Compacted>>,
        inbox: &mut mpsc::Receiver<Command>,
    ) -> Result<Flow, StoreError> {
        let Some(core) = self.core.as_mut() else {
            let _ = reply.send(Err(SessionError::NotFound));
            return Ok(Flow::Continue);
        };
        if compaction::compactable_turns(&core.history) == 0 {
            let _ = reply.send(Ok(None));
            return Ok(Flow::Continue);
        }
        let cancel = self.ctx.shutdown.child_token();
        let state = core.record.state;
        let mut lease_lost = false;
        let outcome = {
            let summary = compaction::summarize(&self.ctx.deps, &core.history, &cancel);
            tokio::pin!(summary);
            loop {
                tokio::select! {
                    outcome = &mut summary => break outcome,
                    Some(command) = inbox.recv() => {
                        lease_lost |= busy(command, &cancel, Activity::Compaction(state));
                    }
                }
            }
        };
        if lease_lost {
            let _ = reply.send(Err(SessionError::Conflict {
                kind: "session-leased",
                detail: "another replica took the session over".to_string(),
            }));
            return Err(StoreError::Fenced);
        }
        let mut batch = Batch::new(self.id);
        let answer = match outcome {
            Ok(summary) => {
                append_summary(&mut batch, core, &summary, false);
                Ok(Some(Compacted {
                    turns: summary.turns,
                    chars: summary.chars,
                }))
            }
            Err(CompactError::Cancelled) => Err(SessionError::Conflict {
                kind: "compaction-cancelled",
                detail: "the compaction was cancelled; nothing was written".to_string(),
            }),
            Err(CompactError::Model(error)) => {
                let session_id = self.id;
                batch.event(
                    core,
                    EventKind::ContextCompactFailed {
                        session_id,
                        error: error.to_string(),
                    },
                );
                Err(SessionError::Upstream(error.to_string()))
            }
        };
        let committed = commit(&self.ctx, &self.slot, batch).await;
        let _ = reply.send(match committed {
            Ok(()) => answer,
            Err(error) => Err(SessionError::Store(error)),
        });
        Ok(Flow::Continue)
    }

    async fn commit(&self, batch: Batch) -> Result<(), StoreError> {
        commit(&self.ctx, &self.slot, batch).await
    }
}

/// Answers a command that arrives while a run is active.
/// Answers a command that arrives while a run or a compaction is active: cancel reaches it,
/// everything that would change the session is refused.
/// Answers a command that arrives while a run or a compaction is active: cancel reaches it,
/// everything that would change the session is refused. Returns true when the lease is lost.
fn busy(command: Command, cancel: &CancellationToken, activity: Activity) -> bool {
    let conflict = |what: &str| {
        let (kind, detail) = match activity {
            Activity::Run(run_id) => (
                "run-active",
                format!(
                    "run {run_id} is active; cancel it or wait for it to end before you {what}"
                ),
            ),
            Activity::Compaction(_) => (
                "compaction-active",
                format!("a compaction is in progress; wait for it or cancel it before you {what}"),
            ),
        };
        SessionError::Conflict { kind, detail }
    };
    match command {
        Command::TakeOver { reply } => drop(reply.send(Ok(false))),
        Command::Cancel { reply } => {
            let already = cancel.is_cancelled();
            cancel.cancel();
            let _ = reply.send(Ok(CancelOutcome {
                cancelled: !already,
                run_id: match activity {
                    Activity::Run(run_id) => Some(run_id),
                    Activity::Compaction(_) => None,
                },
                state: match activity {
                    Activity::Run(_) => SessionState::Running,
                    // A compaction does not change the session's state.
                    Activity::Compaction(state) => state,
                },
            }));
        }
        Command::RemoteCancel => cancel.cancel(),
        Command::LeaseLost => {
            cancel.cancel();
            return true;
        }
        Command::Run { reply, .. } => drop(reply.send(Err(conflict("start another run")))),
        Command::Delete { reply } => drop(reply.send(Err(conflict("delete the session")))),
        Command::Compact { reply } => drop(reply.send(Err(conflict("compact")))),
    }
    false
}

#[derive(Debug, Clone, Copy)]
enum Activity {
    Run(Uuid),
    /// A compaction of a session in this state.
    Compaction(SessionState),
}

fn nothing_to_resume() -> SessionError {
    SessionError::Conflict {
        kind: "nothing-to-resume",
        detail: "the session has no run to resume".to_string(),
    }
}

enum Flow {
    Continue,
    Deleted,
}

impl Command {
    fn fail(self, error: SessionError) {
        match self {
            Command::Run { reply, .. } => drop(reply.send(Err(error))),
            Command::Cancel { reply } => drop(reply.send(Err(error))),
            Command::Delete { reply } => drop(reply.send(Err(error))),
            Command::Compact { reply } => drop(reply.send(Err(error))),
            Command::TakeOver { reply } => drop(reply.send(Err(error))),
            Command::RemoteCancel | Command::LeaseLost => {}
        }
    }

    fn retired(self) {
        self.fail(SessionError::Retired);
    }
}

/// Ops and events being gathered for one commit.
struct Batch {
    session_id: Uuid,
    ops: Vec<WriteOp>,
}

impl Batch {
    fn new(session_id: Uuid) -> Batch {
        Batch {
            session_id,
            ops: Vec::new(),
        }
    }

    fn with(mut self, op: WriteOp) -> Batch {
        self.ops.push(op);
        self
    }

    fn event(&mut self, core: &mut Core, kind: EventKind) {
        let event = new_event(self.session_id, core.next_seq, kind);
        core.next_seq += 1;
        core.record.last_seq = event.seq;
        self.ops.push(WriteOp::InsertEvent(event));
    }

    /// Appends a message to the history; returns it with its index.
    fn message(&mut self, core: &mut Core, mut message: Message) -> Message {
        message.index = core.history.len() as i64;
        core.history.push(message.clone());
        core.record.message_count = core.history.len() as i64;
        self.ops.push(WriteOp::InsertMessage {
            session_id: self.session_id,
            message: message.clone(),
        });
        message
    }

    /// Changes the session's state (with its `session.state` event) and writes the row.
    fn state(&mut self, core: &mut Core, to: SessionState, error: Option<String>) {
        let from = core.record.state;
        core.record.state = to;
        core.record.error = error;
        core.record.updated_at = model::now();
        if from != to {
            self.event(core, EventKind::StateChanged { from, to });
        }
        self.ops.push(WriteOp::UpdateSession(core.record.clone()));
    }

    fn checkpoint(&mut self, core: &mut Core, run_id: Uuid, step_id: Option<Uuid>) {
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
            message_count: core.history.len() as i64,
            seq: core.record.last_seq,
            created_at: model::now(),
        }));
    }
}

/// Appends a compaction summary to the history with its event; its usage counts for the
/// session.
fn append_summary(batch: &mut Batch, core: &mut Core, summary: &Summary, auto: bool) {
    batch.message(core, Message::new(Role::System, summary.content.clone()));
    core.record.usage.add(summary.usage);
    core.record.updated_at = model::now();
    batch.ops.push(WriteOp::UpdateSession(core.record.clone()));
    let session_id = batch.session_id;
    batch.event(
        core,
        EventKind::ContextCompacted {
            session_id,
            turns: summary.turns,
            chars: summary.chars,
            auto,
        },
    );
}

/// Commits a batch and waits until it is durable (its events are then published).
async fn commit(ctx: &SessionContext, slot: &Slot, batch: Batch) -> Result<(), StoreError> {
    if batch.ops.is_empty() {
        return Ok(());
    }
    ctx.writer
        .commit(
            (batch.session_id, slot.generation),
            slot.fenced(batch.session_id, batch.ops),
            Some(slot.events.clone()),
        )
        .await
}

/// The actor's side of the agent loop: turns what the loop reports into rows and events.
struct RunJournal<'a> {
    id: Uuid,
    run_id: Uuid,
    core: &'a mut Core,
    ctx: &'a SessionContext,
    slot: &'a Slot,
    batch: Batch,
}

impl RunJournal<'_> {
    /// Commits what is gathered and waits for it to be durable.
    async fn flush(&mut self) -> Result<(), JournalError> {
        let batch = std::mem::replace(&mut self.batch, Batch::new(self.id));
        commit(self.ctx, self.slot, batch)
            .await
            .map_err(|e| JournalError(e.to_string()))
    }

    /// Queues what is gathered without waiting (deltas): order is kept by the writer, and a
    /// failure shows at the next flush.
    async fn queue(&mut self) -> Result<(), JournalError> {
        let batch = std::mem::replace(&mut self.batch, Batch::new(self.id));
        self.ctx
            .writer
            .submit(Commit {
                origin: (self.id, self.slot.generation),
                ops: self.slot.fenced(self.id, batch.ops),
                publish: Some(self.slot.events.clone()),
                ack: None,
            })
            .await
            .map_err(|e| JournalError(e.to_string()))
    }

    fn step(&self, id: Uuid, kind: StepKind, status: StepStatus, request: Value) -> StepRecord {
        StepRecord {
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
}

#[async_trait]
impl Journal for RunJournal<'_> {
    fn history(&self) -> &[Message] {
        &self.core.history
    }

    async fn llm_started(&mut self, request: LlmRequestDescriptor) -> Result<Uuid, JournalError> {
        let step_id = model::new_id();
        let request = serde_json::to_value(request).unwrap_or(Value::Null);
        let step = self.step(step_id, StepKind::Llm, StepStatus::Streaming, request);
        self.batch.ops.push(WriteOp::UpsertStep(step));
        self.batch
            .event(self.core, EventKind::LlmStarted { step_id });
        self.queue().await?;
        Ok(step_id)
    }

    async fn llm_delta(&mut self, step_id: Uuid, text: String) -> Result<(), JournalError> {
        self.batch
            .event(self.core, EventKind::AssistantStream { step_id, text });
        self.queue().await
    }

    async fn llm_retry(
        &mut self,
        step_id: Uuid,
        attempt: u32,
        error: String,
    ) -> Result<(), JournalError> {
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

    async fn llm_completed(
        &mut self,
        step_id: Uuid,
        message: Message,
        finish_reason: FinishReason,
        usage: Usage,
    ) -> Result<(), JournalError> {
        let message = self.batch.message(self.core, message);
        let mut step = self.step(step_id, StepKind::Llm, StepStatus::Completed, Value::Null);
        step.response = Some(json!({ "message": message, "finish_reason": finish_reason }));
        step.usage = Some(usage);
        step.finished_at = Some(model::now());
        self.batch.ops.push(WriteOp::UpsertStep(step));
        self.core.record.usage.add(usage);
        self.core.record.updated_at = model::now();
        self.batch
            .ops
            .push(WriteOp::UpdateSession(self.core.record.clone()));
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
        self.flush().await
    }

    async fn llm_failed(&mut self, step_id: Uuid, error: String) -> Result<(), JournalError> {
        let mut step = self.step(step_id, StepKind::Llm, StepStatus::Failed, Value::Null);
        step.error = Some(error.clone());
        step.finished_at = Some(model::now());
        self.batch.ops.push(WriteOp::UpsertStep(step));
        self.batch
            .event(self.core, EventKind::LlmFailed { step_id, error });
        self.flush().await
    }

    async fn context_trimmed(
        &mut self,
        step_id: Uuid,
        stats: &TrimStats,
    ) -> Result<(), JournalError> {
        self.batch.event(
            self.core,
            EventKind::ContextTrimmed {
                step_id,
                budget: stats.budget as u64,
                chars: model::CharsBeforeAfter {
                    before: stats.chars_before as u64,
                    after: stats.chars_after as u64,
                },
                dropped_turns: stats.dropped_turns as u64,
                elided_tool_results: stats.elided_tool_results as u64,
            },
        );
        self.queue().await
    }

    async fn user_message(&mut self, input: String) -> Result<(), JournalError> {
        let message = self
            .batch
            .message(self.core, Message::new(Role::User, input));
        self.batch
            .event(self.core, EventKind::UserMessage { message });
        self.flush().await
    }

    async fn summary_appended(&mut self, summary: Summary, auto: bool) -> Result<(), JournalError> {
        append_summary(&mut self.batch, self.core, &summary, auto);
        self.flush().await
    }

    async fn compact_failed(&mut self, error: String) -> Result<(), JournalError> {
        let session_id = self.id;
        self.batch.event(
            self.core,
            EventKind::ContextCompactFailed { session_id, error },
        );
        self.flush().await
    }

    async fn tool_started(&mut self, call: &ToolCall) -> Result<Uuid, JournalError> {
        let step_id = model::new_id();
        let request = serde_json::to_value(call).unwrap_or(Value::Null);
        let step = self.step(step_id, StepKind::Tool, StepStatus::Running, request);
        self.batch.ops.push(WriteOp::UpsertStep(step));
        self.batch.state(self.core, SessionState::WaitingTool, None);
        self.batch.event(
            self.core,
            EventKind::ToolStarted {
                step_id,
                call: call.clone(),
            },
        );
        // Durable before the tool runs: a crash mid-tool shows the call as started.
        self.flush().await?;
        Ok(step_id)
    }

    async fn tool_finished(
        &mut self,
        step_id: Uuid,
        call: &ToolCall,
        output: &ToolOutput,
    ) -> Result<(), JournalError> {
        self.batch
            .message(self.core, Message::tool_result(&call.id, &output.output));
        let mut step = self.step(
            step_id,
            StepKind::Tool,
            if output.is_error {
                StepStatus::Failed
            } else {
                StepStatus::Completed
            },
            serde_json::to_value(call).unwrap_or(Value::Null),
        );
        step.response = Some(json!({ "output": output.output, "is_error": output.is_error }));
        step.finished_at = Some(model::now());
        self.batch.ops.push(WriteOp::UpsertStep(step));
        self.batch.event(
            self.core,
            EventKind::ToolFinished {
                step_id,
                call_id: call.id.clone(),
                output: output.output.clone(),
                is_error: output.is_error,
            },
        );
        self.batch.state(self.core, SessionState::Running, None);
        self.batch.checkpoint(self.core, self.run_id, Some(step_id));
        self.flush().await
    }
}
