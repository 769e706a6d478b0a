//! The run command: starting a run or a resume, and driving the agent loop while the mailbox
//! is still served.

use tokio::sync::oneshot;

use super::end::{self, Conclusion, RunOutcome, Stopping};
use super::journal::{Batch, RunJournal};
use super::{Active, Activity, Phase, SessionActor, Stop};
use crate::agent::{context, run_turn};
use crate::model::{
    self, EventKind, Message, Role, RunKind, RunRecord, RunResult, RunStatus, SessionState, Usage,
};
use crate::session::command::{Reply, RunRequest, RunStarted, RunStopped};
use crate::session::live::Inbox;
use crate::session::SessionError;
use crate::store::WriteOp;

pub(super) async fn handle(
    phase: Phase<'_>,
    request: RunRequest,
    reply: Reply<RunStarted>,
) -> Result<(), Stop> {
    match phase {
        Phase::Busy(activity) => {
            let _ = reply.send(Err(activity.conflict("start another run")));
            Ok(())
        }
        Phase::Idle(actor, inbox) => actor.start_run(request, reply, inbox).await,
    }
}

fn nothing_to_resume() -> SessionError {
    SessionError::Conflict {
        kind: "nothing-to-resume",
        detail: "the session has no run to resume".to_string(),
    }
}

impl SessionActor {
    async fn start_run(
        &mut self,
        request: RunRequest,
        reply: Reply<RunStarted>,
        inbox: &mut Inbox,
    ) -> Result<(), Stop> {
        let id = self.id;
        let core = match self.claim_with_history().await {
            Ok(core) => core,
            Err(refusal) => return refusal.answer(id, reply),
        };
        if request.kind == RunKind::Resume {
            match core.record.state {
                SessionState::Completed => {
                    let _ = reply.send(match core.last_result.clone() {
                        Some(result) => Ok(RunStarted::AlreadyCompleted(result)),
                        None => Err(nothing_to_resume()),
                    });
                    return Ok(());
                }
                SessionState::Idle => {
                    let _ = reply.send(Err(nothing_to_resume()));
                    return Ok(());
                }
                _ => {}
            }
        }
        let Ok(permit) = self.deps.run_permits.clone().try_acquire_owned() else {
            let _ = reply.send(Err(SessionError::TooBusy(
                "the server is running as many runs as it is allowed to; retry shortly".to_string(),
            )));
            return Ok(());
        };
        let core = self.core.as_mut().ok_or(Stop::Gone)?;
        let run = RunRecord {
            id: model::new_id(),
            session_id: id,
            kind: request.kind,
            status: RunStatus::Running,
            input: request.input.clone(),
            text: None,
            finish_reason: None,
            usage: Usage::default(),
            steps: 0,
            error: None,
            start_seq: core.next_seq,
            created_at: model::now(),
            finished_at: None,
        };
        let mut batch = Batch::new(id);
        batch.event(
            core,
            EventKind::AgentStarted {
                run_id: run.id,
                kind: request.kind,
            },
        );
        core.record.last_run_id = Some(run.id);
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
        if let Err(error) = self.sink().commit(batch).await {
            let stop = Stop::write_failed(id, &error);
            let _ = reply.send(Err(SessionError::Store(error)));
            return Err(stop);
        }
        let (result_tx, result_rx) = oneshot::channel();
        let _ = reply.send(Ok(RunStarted::Started {
            run: run.clone(),
            result: result_rx,
        }));
        let ended = self.drive(run, input, result_tx, inbox).await;
        drop(permit);
        ended
    }

    /// Runs the loop while still answering the mailbox, then records how the run ended.
    async fn drive(
        &mut self,
        run: RunRecord,
        input: Option<String>,
        result_tx: oneshot::Sender<Result<RunResult, RunStopped>>,
        inbox: &mut Inbox,
    ) -> Result<(), Stop> {
        let activity = Activity {
            cancel: self.deps.shutdown.child_token(),
            what: Active::Run(run.id),
        };
        let sink = super::journal::Sink {
            deps: &self.deps,
            slot: &self.slot,
        };
        let core = self.core.as_mut().ok_or(Stop::Gone)?;
        // The current configuration wins, except for a prompt the session was
        // created with on purpose.
        let mut settings = self.deps.settings.clone();
        if let Some(prompt) = &core.record.system_prompt {
            settings.system_prompt = prompt.clone();
        }
        let mut journal = RunJournal::new(self.id, run.id, core, sink);
        let mut lease_lost = false;
        let result = {
            let turn = run_turn(
                &mut journal,
                &self.deps.agent,
                &settings,
                input,
                &activity.cancel,
            );
            tokio::pin!(turn);
            loop {
                tokio::select! {
                    result = &mut turn => break result,
                    Some(command) = inbox.recv() => {
                        // Boxed: a command's handler may start a run, which reads commands.
                        if let Err(Stop::LeaseLost) = Box::pin(command.handle(Phase::Busy(&activity))).await {
                            lease_lost = true;
                        }
                    }
                }
            }
        };
        if lease_lost {
            let _ = result_tx.send(Err(RunStopped::Elsewhere));
            return Err(Stop::LeaseLost);
        }
        let outcome = match RunOutcome::of(result) {
            Ok(outcome) => outcome,
            // What was queued is void. This actor stops; a successor reloads the session and
            // records the run as failed once writes succeed again.
            Err(error) => {
                let stop = Stop::write_failed(self.id, &error);
                let _ = result_tx.send(Err(RunStopped::Storage {
                    error: error.to_string(),
                }));
                return Err(stop);
            }
        };
        let stopping = match (self.deps.shutdown.is_cancelled(), &self.deps.cluster) {
            (false, _) => Stopping::No,
            (true, None) => Stopping::Alone,
            (true, Some(_)) => Stopping::Replicated,
        };
        let mut batch = journal.take_batch();
        let ending = match end::conclude(run, outcome, stopping, model::now()) {
            Conclusion::Record(ending) => *ending,
            Conclusion::LeaveForTakeover => {
                // Its lease is released at shutdown and another replica takes it over from the
                // last checkpoint at once.
                let _ = sink.commit(batch).await;
                let _ = result_tx.send(Err(RunStopped::Elsewhere));
                return Ok(());
            }
        };
        let core = journal.core;
        batch.checkpoint(core, ending.run.id, None);
        batch.state(core, ending.state, ending.session_error());
        batch.event(core, ending.terminal);
        batch.ops.push(WriteOp::UpsertRun(ending.run.clone()));
        let result = RunResult::from(&ending.run);
        core.last_result = Some(result.clone());
        core.last_run = Some(ending.run);
        match sink.commit(batch).await {
            Ok(()) => {
                let _ = result_tx.send(Ok(result));
                Ok(())
            }
            Err(error) => {
                let stop = Stop::write_failed(self.id, &error);
                let _ = result_tx.send(Err(RunStopped::Storage {
                    error: error.to_string(),
                }));
                Err(stop)
            }
        }
    }
}
