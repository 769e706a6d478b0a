//! The run command: starting a run or a resume, and continuing a run that waited for answers
//! without a driver (after a restart or a takeover); `drive` drives it.

use std::collections::{HashMap, HashSet};

use tokio::sync::oneshot;
use uuid::Uuid;

use super::drive::{Begin, NextRun};
use super::{Activity, Phase, SessionActor, Stop};
use crate::agent::context;
use crate::model::{
    self, EventKind, Message, Role, RunKind, RunRecord, RunResult, RunStatus, SessionState, Usage,
};
use crate::session::command::{IfBusy, Pending, Reply, RunRequest, RunStarted, RunStopped};
use crate::session::core::Core;
use crate::session::errors::{ConflictKind, SessionError};
use crate::session::lineage::{Lineage, Tree};
use crate::session::live::Inbox;
use crate::session::run::Batch;
use crate::session::run_permit::RunPermit;
use crate::session::waiting::{self, Resolution};
use crate::store::{Store, StoreError, StoreResult, WriteOp};

pub(super) async fn handle(
    phase: Phase<'_>,
    request: RunRequest,
    reply: Reply<RunStarted>,
) -> Result<(), Stop> {
    match phase {
        Phase::Busy(activity) => {
            busy(activity, request, reply);
            Ok(())
        }
        Phase::Idle(actor, inbox) => {
            let mut next = Some((request, reply));
            while let Some((request, reply)) = next.take() {
                next = actor.start_run(request, reply, inbox).await?;
            }
            Ok(())
        }
    }
}

/// A run asked for while one is active: an input is queued for it, or interrupts it; a new
/// run supersedes one that waits for answers (`?pending=deny`); anything else is refused.
fn busy(activity: &Activity, request: RunRequest, reply: Reply<RunStarted>) {
    let driven = activity.driven.as_ref();
    if let (Some(driven), Some(input)) = (driven, request.input.clone()) {
        match request.if_busy {
            IfBusy::Queue => {
                driven.board.queue(input);
                let _ = reply.send(Ok(RunStarted::Queued(driven.run.clone())));
                return;
            }
            IfBusy::Interrupt => {
                match driven.board.supersede((request, reply)) {
                    Err(refused) => {
                        let (_, reply) = *refused;
                        let _ = reply.send(Err(activity.conflict("interrupt it again")));
                    }
                    // Starts once the active run has ended as cancelled.
                    Ok(()) => activity.cancel.cancel(),
                }
                return;
            }
            IfBusy::Reject => {}
        }
    }
    let waits = driven.is_some_and(|driven| driven.board.has_pending());
    match (waits, request.pending, driven) {
        (true, Pending::Deny, Some(driven)) => {
            // Ends the active run once its waiting calls are denied; this one follows.
            driven.board.replace_successor((request, reply));
            activity.cancel.cancel();
        }
        (true, Pending::Refuse, _) => drop(reply.send(Err(approvals_pending()))),
        _ => drop(reply.send(Err(activity.conflict("start another run")))),
    }
}

/// What a resume is answered with when there is nothing to resume: the last result of a
/// completed session, or a conflict.
fn nothing_to_resume(core: &Core) -> Option<Result<RunStarted, SessionError>> {
    let nothing = || SessionError::Conflict(ConflictKind::NothingToResume);
    match core.record.state {
        SessionState::Completed => Some(match core.last_result.clone() {
            Some(result) => Ok(RunStarted::AlreadyCompleted(result)),
            None => Err(nothing()),
        }),
        SessionState::Idle => Some(Err(nothing())),
        _ => None,
    }
}

/// The input the run's turn starts with. With an input, earlier calls left without a result
/// get one, so providers accept the history; without (a resume), the input of a run
/// interrupted before it was appended is appended now.
fn opening_input(core: &mut Core, batch: &mut Batch, input: Option<String>) -> Option<String> {
    if input.is_some() {
        for call in context::dangling_tool_calls(&core.history) {
            batch.message(core, Message::tool_result(call.id, context::NOT_RUN_RESULT));
        }
        return input;
    }
    let previous = core.last_run.as_ref()?;
    let appended = core
        .history
        .iter()
        .any(|m| m.role == Role::User && m.created_at >= previous.created_at);
    if previous.kind == RunKind::Run && !appended {
        return previous.input.clone();
    }
    None
}

/// Tells the run's client of its start once that is durable, or why it is not.
fn tell_when_durable(
    started: RunRecord,
    durable: oneshot::Receiver<StoreResult<()>>,
    result: oneshot::Receiver<Result<RunResult, RunStopped>>,
    reply: Reply<RunStarted>,
) {
    tokio::spawn(async move {
        let answer = match durable.await {
            Ok(Ok(())) => Ok(RunStarted::Started {
                run: started,
                result,
            }),
            Ok(Err(error)) => Err(SessionError::Store(error)),
            // Refused before it reached the writer (an earlier write of the session
            // failed), or the writer stopped.
            Err(_) => Err(SessionError::Store(StoreError::Write(
                "the run's start was not written".to_string(),
            ))),
        };
        let _ = reply.send(answer);
    });
}

pub(super) fn approvals_pending() -> SessionError {
    SessionError::Conflict(ConflictKind::ApprovalsPending)
}

impl SessionActor {
    pub(super) async fn start_run(
        &mut self,
        request: RunRequest,
        reply: Reply<RunStarted>,
        inbox: &mut Inbox,
    ) -> Result<NextRun, Stop> {
        let id = self.id;
        let store = self.deps.store.clone();
        let core = match self.claim_with_history().await {
            Ok(core) => core,
            Err(refusal) => return refusal.answer(id, reply).map(|()| None),
        };
        if let Some(waiting) = core.parked.take() {
            // A run waits for answers: a new message supersedes it, or is refused.
            if request.pending == Pending::Refuse && request.if_busy != IfBusy::Interrupt {
                core.parked = Some(waiting);
                let _ = reply.send(Err(approvals_pending()));
                return Ok(None);
            }
            let mut begin = Begin::resumed(waiting);
            begin.cancelled = true;
            begin.superseded_by = Some((request, reply));
            return self.continue_run(begin, inbox).await;
        }
        if request.kind == RunKind::Resume {
            if let Some(answer) = nothing_to_resume(core) {
                let _ = reply.send(answer);
                return Ok(None);
            }
        }
        let decided = match (request.kind, &core.last_run) {
            (RunKind::Resume, Some(previous)) => {
                match decisions_to_honour(store.as_ref(), id, previous, &core.history).await {
                    Ok(decided) => decided,
                    Err(error) => {
                        let _ = reply.send(Err(SessionError::Store(error)));
                        return Ok(None);
                    }
                }
            }
            _ => HashMap::new(),
        };
        let slot = match request.subagent {
            // A sub-agent's run is part of its top-level run, which holds the tenant's slot.
            Some(_) => None,
            None => {
                let tenant = core.record.tenant.clone();
                match self.deps.tenant_limits.admit(store.as_ref(), &tenant).await {
                    Ok(slot) => slot,
                    Err(refused) => {
                        let _ = reply.send(Err(refused));
                        return Ok(None);
                    }
                }
            }
        };
        let Some(lineage) = self.lineage(&request) else {
            let _ = reply.send(Err(SessionError::TooBusy(
                "the server is running as many runs as it is allowed to; retry shortly".to_string(),
            )));
            return Ok(None);
        };
        let (run, mut begin) = self.open_run(&request, reply)?;
        begin.trace_parent = request.trace_parent;
        begin.decided = decided;
        begin.lineage = Some(lineage);
        begin.tenant_slot = slot;
        begin.max_cost_usd = request.max_cost_usd;
        self.drive(run, begin, inbox).await
    }

    /// A sub-agent's run has the permit its parent's call took for it; another run takes one
    /// now, or none is left.
    fn lineage(&self, request: &RunRequest) -> Option<Lineage> {
        if let Some(lineage) = request.subagent.clone() {
            return Some(lineage);
        }
        let permit = self.deps.run_permits.clone().try_acquire_owned().ok()?;
        Some(Lineage {
            tree: Tree::new(self.deps.max_subagents_per_run),
            permit: RunPermit::held(self.deps.run_permits.clone(), permit),
        })
    }

    /// The run's record and its start, gathered for its first commit; the client is told of
    /// the run once that is durable.
    fn open_run(
        &mut self,
        request: &RunRequest,
        reply: Reply<RunStarted>,
    ) -> Result<(RunRecord, Begin), Stop> {
        let id = self.id;
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
            client_tools: request.client_tools.clone(),
        };
        // The run's start goes with the turn's first commit (its user message and first model
        // step, queued when the loop first waits); the client is told of the run once it is
        // durable. If that commit fails, the client is told why, and the turn's next commit
        // that is waited for (before any tool runs) is refused, which stops the run.
        let (mut batch, durable) = Batch::told(id);
        batch.event(
            core,
            EventKind::AgentStarted {
                run_id: run.id,
                kind: request.kind,
            },
        );
        core.record.last_run_id = Some(run.id);
        batch.state(core, SessionState::Running, None);
        let input = opening_input(core, &mut batch, request.input.clone());
        batch.ops.push(WriteOp::UpsertRun(run.clone()));
        core.last_run = Some(run.clone());
        let (result_tx, result_rx) = oneshot::channel();
        tell_when_durable(run.clone(), durable, result_rx, reply);
        let begin = Begin {
            opening: Some(batch),
            ..Begin::new(input, result_tx)
        };
        Ok((run, begin))
    }

    /// Drives the run that waited for answers with nobody driving it (the actor's `parked`
    /// calls): after a restart or a takeover, when an answer arrives, or to end it.
    pub(super) async fn continue_run(
        &mut self,
        begin: Begin,
        inbox: &mut Inbox,
    ) -> Result<NextRun, Stop> {
        // The loop reads the whole history; the command that found the run may not have.
        if let Err(refusal) = self.claim_with_history().await {
            let (reply, _) = oneshot::channel::<Result<(), SessionError>>();
            return refusal.answer(self.id, reply).map(|()| None);
        }
        let run = self
            .core
            .as_ref()
            .and_then(|core| core.last_run.clone())
            .filter(|run| run.status == RunStatus::Running)
            .ok_or(Stop::Gone)?;
        if let Some(core) = self.core.as_mut() {
            core.parked = None;
        }
        // The run holds no permit while it waits, and takes none to go on: an answer never
        // meets a 429 (`Begin::lineage` is none).
        self.drive(run, begin, inbox).await
    }
}

/// What people answered to the approvals of `previous` (the run a resume continues), for the
/// calls the resume runs again: those without a result in the history.
async fn decisions_to_honour(
    store: &dyn Store,
    session_id: Uuid,
    previous: &RunRecord,
    history: &[Message],
) -> Result<HashMap<String, Resolution>, StoreError> {
    let again: HashSet<String> = context::dangling_tool_calls(history)
        .into_iter()
        .map(|call| call.id)
        .collect();
    if again.is_empty() {
        return Ok(HashMap::new());
    }
    let mut decisions = waiting::of_run(store, session_id, previous.start_seq)
        .await?
        .decisions();
    decisions.retain(|call_id, _| again.contains(call_id));
    Ok(decisions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{FinishReason, ToolCall};
    use crate::session::core::fixture;
    use serde_json::json;

    fn run(kind: RunKind, input: Option<&str>) -> RunRecord {
        RunRecord {
            id: model::new_id(),
            session_id: model::new_id(),
            kind,
            status: RunStatus::Completed,
            input: input.map(str::to_string),
            text: Some("done".into()),
            finish_reason: Some(FinishReason::Model("stop".into())),
            usage: Usage::default(),
            steps: 1,
            error: None,
            start_seq: 2,
            created_at: model::now(),
            finished_at: None,
            client_tools: Vec::new(),
        }
    }

    #[test]
    fn a_resume_of_a_completed_session_is_its_last_result_and_of_an_idle_one_a_conflict() {
        let mut core = fixture::core();
        assert!(matches!(
            nothing_to_resume(&core),
            Some(Err(SessionError::Conflict(ConflictKind::NothingToResume)))
        ));
        core.record.state = SessionState::Completed;
        assert!(matches!(nothing_to_resume(&core), Some(Err(_))));
        core.last_result = Some(RunResult::from(&run(RunKind::Run, Some("hi"))));
        assert!(matches!(
            nothing_to_resume(&core),
            Some(Ok(RunStarted::AlreadyCompleted(_)))
        ));
        core.record.state = SessionState::Failed;
        assert!(
            nothing_to_resume(&core).is_none(),
            "a failed run is resumed"
        );
    }

    #[test]
    fn a_new_input_gives_calls_left_without_a_result_one() {
        let mut core = fixture::core();
        let call = ToolCall {
            id: "a".into(),
            name: "shell".into(),
            arguments: json!({}),
        };
        core.history.push(Message::assistant("", vec![call]));
        let mut batch = Batch::new(core.record.id);
        let input = opening_input(&mut core, &mut batch, Some("next".into()));
        assert_eq!(input.as_deref(), Some("next"));
        let last = core.history.last().expect("a result");
        assert_eq!(
            (last.role, last.tool_call_id.as_deref()),
            (Role::Tool, Some("a"))
        );
        assert_eq!(last.content, context::NOT_RUN_RESULT);
    }

    #[test]
    fn a_resume_appends_the_input_its_run_was_interrupted_before_appending() {
        let mut core = fixture::core();
        let mut batch = Batch::new(core.record.id);
        assert_eq!(opening_input(&mut core, &mut batch, None), None);
        core.last_run = Some(run(RunKind::Run, Some("hello")));
        let input = opening_input(&mut core, &mut batch, None);
        assert_eq!(input.as_deref(), Some("hello"));
        core.history.push(Message::new(Role::User, "hello"));
        assert_eq!(opening_input(&mut core, &mut batch, None), None);
        core.last_run = Some(run(RunKind::Resume, None));
        core.history.pop();
        assert_eq!(opening_input(&mut core, &mut batch, None), None);
        assert!(batch.ops.is_empty(), "nothing to write for a resume");
    }
}
