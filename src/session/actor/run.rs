//! The run command: starting a run or a resume, continuing a run that waited for answers
//! without a driver (after a restart or a takeover), and driving the agent loop while the
//! mailbox is still served.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};
use tracing::Instrument as _;
use uuid::Uuid;

use super::{Active, Activity, Phase, SessionActor, Stop};
use crate::agent::{context, run_turn, AgentDeps, AgentError};
use crate::model::{
    self, EventKind, Message, ResolvedBy, Role, RunKind, RunRecord, RunResult, RunStatus,
    SessionRecord, SessionState, Usage,
};
use crate::session::command::{IfBusy, Pending, Reply, RunRequest, RunStarted, RunStopped};
use crate::session::live::Inbox;
use crate::session::run::board::{AnswerMsg, CallDesk, RunCalls};
use crate::session::run::end::{self, Conclusion, RunOutcome, Stopping};
use crate::session::run::{Batch, Run};
use crate::session::run_permit::RunPermit;
use crate::session::subagents::{Children, Lineage, TaskTool, Tree, TASK};
use crate::session::waiting::{self, Resolution, Waiting};
use crate::session::Sessions;
use crate::session::{ConflictKind, SessionError};
use crate::store::{Store, StoreError, WriteOp};
use crate::telemetry;
use crate::tools::client::ClientSide;
use crate::tools::policy::Rules;
use crate::tools::{Tool, ToolContext, ToolRegistry};

/// A run asked for while another one ended: it starts next.
pub(super) type NextRun = Option<(RunRequest, Reply<RunStarted>)>;

const SUPERSEDED: &str = "superseded by a new message";

pub(super) async fn handle(
    phase: Phase<'_>,
    request: RunRequest,
    reply: Reply<RunStarted>,
) -> Result<(), Stop> {
    match phase {
        Phase::Busy(activity) => {
            let calls = activity.calls.as_ref();
            if let (Some(calls), Some(input)) = (calls, &request.input) {
                match request.if_busy {
                    IfBusy::Queue => {
                        crate::session::run::board::lock(&calls.queued).push(input.clone());
                        let _ = reply.send(Ok(RunStarted::Queued(calls.run.clone())));
                        return Ok(());
                    }
                    IfBusy::Interrupt => {
                        let mut next = crate::session::run::board::lock_superseded(calls);
                        if next.is_some() {
                            drop(next);
                            let _ = reply.send(Err(activity.conflict("interrupt it again")));
                        } else {
                            // Starts once the active run has ended as cancelled.
                            *next = Some((request, reply));
                            drop(next);
                            activity.cancel.cancel();
                        }
                        return Ok(());
                    }
                    IfBusy::Reject => {}
                }
            }
            let waits = calls.is_some_and(|c| c.waiting().has_pending());
            match (waits, request.pending, calls) {
                (true, Pending::Deny, Some(calls)) => {
                    // Ends the active run once its waiting calls are denied; this one follows.
                    *crate::session::run::board::lock_superseded(calls) = Some((request, reply));
                    activity.cancel.cancel();
                }
                (true, Pending::Refuse, _) => drop(reply.send(Err(approvals_pending()))),
                _ => drop(reply.send(Err(activity.conflict("start another run")))),
            }
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

fn nothing_to_resume() -> SessionError {
    SessionError::Conflict(ConflictKind::NothingToResume)
}

pub(super) fn approvals_pending() -> SessionError {
    SessionError::Conflict(ConflictKind::ApprovalsPending)
}

/// How a driven run begins.
pub(super) struct Begin {
    pub input: Option<String>,
    /// What waits already (a continued run), and an answer that came for it.
    pub waiting: Waiting,
    pub answer: Option<AnswerMsg>,
    /// Cancelled before it is driven (a cancel or a new message for a run that waited).
    pub cancelled: bool,
    pub superseded_by: NextRun,
    pub result_tx: oneshot::Sender<Result<RunResult, RunStopped>>,
    /// The trace span the run's span is a child of (none: a root).
    pub trace_parent: tracing::Span,
    /// What the run writes first, not yet handed to the writer (a new run's start).
    pub opening: Option<Batch>,
    /// A resume's: what people answered to the approvals of the run it continues.
    pub decided: HashMap<String, Resolution>,
    /// Its tree of sub-agents and its permit (none: a continued run, which takes no permit
    /// and starts a tree of its own).
    pub lineage: Option<Lineage>,
}

impl Begin {
    fn new(
        input: Option<String>,
        result_tx: oneshot::Sender<Result<RunResult, RunStopped>>,
    ) -> Begin {
        Begin {
            input,
            waiting: Waiting::default(),
            answer: None,
            cancelled: false,
            superseded_by: None,
            result_tx,
            trace_parent: tracing::Span::none(),
            opening: None,
            decided: HashMap::new(),
            lineage: None,
        }
    }

    /// A run that waited, continued without a client waiting for its result.
    pub fn resumed(waiting: Waiting) -> Begin {
        Begin::new(None, oneshot::channel().0).with_waiting(waiting)
    }

    fn with_waiting(mut self, waiting: Waiting) -> Begin {
        self.waiting = waiting;
        self
    }
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
            match core.record.state {
                SessionState::Completed => {
                    let _ = reply.send(match core.last_result.clone() {
                        Some(result) => Ok(RunStarted::AlreadyCompleted(result)),
                        None => Err(nothing_to_resume()),
                    });
                    return Ok(None);
                }
                SessionState::Idle => {
                    let _ = reply.send(Err(nothing_to_resume()));
                    return Ok(None);
                }
                _ => {}
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
        // A sub-agent's run has the permit its parent's call took for it; another run takes one
        // now or is refused.
        let lineage = match request.subagent.clone() {
            Some(lineage) => lineage,
            None => match self.deps.run_permits.clone().try_acquire_owned() {
                Ok(permit) => Lineage {
                    tree: Tree::new(self.deps.max_subagents_per_run),
                    permit: RunPermit::held(self.deps.run_permits.clone(), permit),
                },
                Err(_) => {
                    let _ = reply.send(Err(SessionError::TooBusy(
                        "the server is running as many runs as it is allowed to; retry shortly"
                            .to_string(),
                    )));
                    return Ok(None);
                }
            },
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
        let (result_tx, result_rx) = oneshot::channel();
        let started = run.clone();
        tokio::spawn(async move {
            let answer = match durable.await {
                Ok(Ok(())) => Ok(RunStarted::Started {
                    run: started,
                    result: result_rx,
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
        let begin = Begin {
            trace_parent: request.trace_parent,
            opening: Some(batch),
            decided,
            lineage: Some(lineage),
            ..Begin::new(input, result_tx)
        };
        self.drive(run, begin, inbox).await
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

    /// The tools a run of this session is offered: the server's built-in tools and the tools
    /// of its MCP servers as they are now (each narrowed to the session's choice), `task` above
    /// the deepest sub-agent level, and the client tools (the session's and the run's own; a
    /// run's tool replaces the session's of the same name).
    fn run_tools(
        &self,
        record: &SessionRecord,
        run: &RunRecord,
        children: &Arc<Children>,
        permit: &Arc<RunPermit>,
    ) -> ToolRegistry {
        let server = &self.deps.agent.tools;
        let chosen = match &record.options.tools {
            Some(names) => server.keep(names),
            None => server.clone(),
        };
        let mut more = self.deps.mcp.tools(record.options.mcp_servers.as_deref());
        let narrowed_out = record
            .options
            .tools
            .as_ref()
            .is_some_and(|names| !names.iter().any(|n| n == TASK));
        if record.options.depth < self.deps.max_subagent_depth && !narrowed_out {
            more.push(Arc::new(TaskTool {
                sessions: Sessions::from_parts(self.deps.clone(), self.live.clone()),
                parent: record.clone(),
                children: children.clone(),
                permit: permit.clone(),
            }));
        }
        more.extend(
            model::client_tools_of(record, run)
                .map(|t| Arc::new(ClientSide(t.clone())) as Arc<dyn Tool>),
        );
        // Names were checked against the server's tools when the session was created, and MCP
        // tools have a prefix that no other tool may use.
        chosen.with(more).unwrap_or(chosen)
    }

    /// What the session's tool calls run in: its directory under the server's workspace
    /// (made again if it was removed), or the root. A directory that now leads outside the
    /// root (replaced by a symlink since) is refused: the run fails rather than run tools
    /// anywhere else.
    async fn tool_context(&self, record: &SessionRecord) -> Result<ToolContext, String> {
        let root = &self.deps.agent.tool_context;
        let Some(rel) = record.options.workspace.clone() else {
            return Ok(root.clone());
        };
        let shown = rel.clone();
        root.workspace
            .run(move |root| root.subdir(&rel))
            .await
            .map(ToolContext::new)
            .map_err(|e| format!("the session's workspace {shown:?} cannot be used: {e}"))
    }

    /// Runs the loop while still answering the mailbox, then records how the run ended.
    async fn drive(
        &mut self,
        run: RunRecord,
        begin: Begin,
        inbox: &mut Inbox,
    ) -> Result<NextRun, Stop> {
        let core = self.core.as_ref().ok_or(Stop::Gone)?;
        let lineage = begin.lineage.unwrap_or_else(|| Lineage {
            tree: Tree::new(self.deps.max_subagents_per_run),
            permit: RunPermit::unmetered(self.deps.run_permits.clone()),
        });
        let children = Arc::new(Children::new(lineage.tree));
        let tools = self.run_tools(&core.record, &run, &children, &lineage.permit);
        let (context, unusable) = match self.tool_context(&core.record).await {
            Ok(context) => (context, None),
            // Never used: the loop does not run.
            Err(error) => (self.deps.agent.tool_context.clone(), Some(error)),
        };
        let core = self.core.as_ref().ok_or(Stop::Gone)?;
        let session_rules = Arc::new(Mutex::new(
            Rules::compile(core.record.options.tool_policy.clone()).unwrap_or_default(),
        ));
        let (answers, answers_rx) = mpsc::unbounded_channel();
        let queued = crate::session::run::board::Queued::default();
        let waiting = Arc::new(Mutex::new(begin.waiting));
        if let Some(answer) = begin.answer {
            let _ = answers.send(answer);
        }
        let activity = Activity {
            cancel: self.deps.shutdown.child_token(),
            what: Active::Run(run.id),
            calls: Some(RunCalls {
                waiting: waiting.clone(),
                answers,
                tools: tools.clone(),
                session_rules: session_rules.clone(),
                deps: self.deps.clone(),
                superseded_by: Mutex::new(begin.superseded_by),
                run: run.clone(),
                queued: queued.clone(),
            }),
            earlier: super::approvals::EarlierCalls {
                store: self.deps.store.clone(),
                session_id: self.id,
                before: run.start_seq,
            },
        };
        if begin.cancelled {
            activity.cancel.cancel();
        }
        let agent = AgentDeps {
            tools: tools.clone(),
            tool_context: context.clone(),
            ..self.deps.agent.clone()
        };
        let desk = CallDesk {
            waiting,
            answers: answers_rx,
            tools,
            context,
            session_rules,
            replies: Default::default(),
            running: 0,
            children,
            notes: Default::default(),
            queued,
            decided: begin.decided,
        };
        let sink = crate::session::run::Sink {
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
        let options = &core.record.options;
        settings.budget = settings.budget.for_session(
            options.max_tokens,
            options.max_run_tokens,
            core.record.usage,
        );
        let model = &self.deps.agent.model;
        let span = telemetry::run_span(
            &begin.trace_parent,
            self.id,
            run.id,
            model.name(),
            model.model(),
        );
        let mut journal = Run::new(self.id, run.id, core, sink, desk);
        if let Some(opening) = begin.opening {
            journal.batch = opening;
        }
        let mut lease_lost = false;
        let result = if let Some(error) = unusable {
            Err(AgentError::NotStarted { error })
        } else {
            let turn = run_turn(
                &mut journal,
                &agent,
                &settings,
                begin.input,
                &activity.cancel,
            )
            .instrument(span.clone());
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
        let result_tx = begin.result_tx;
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
        let next = activity
            .calls
            .as_ref()
            .and_then(|calls| crate::session::run::board::lock_superseded(calls).take());
        let shutting_down = self.deps.shutdown.is_cancelled();
        if let RunOutcome::Cancelled { .. } = outcome {
            if shutting_down && next.is_none() && journal.calls.is_parked() {
                // It waits only for answers, which a restart does not lose: leave it waiting.
                let batch = journal.take_batch();
                let _ = sink.commit(batch).await;
                let _ = result_tx.send(Err(RunStopped::Elsewhere));
                return Ok(None);
            }
            if !shutting_down {
                match &next {
                    Some(_) => journal.settle_waiting(ResolvedBy::User, Some(SUPERSEDED)),
                    None => journal.settle_waiting(ResolvedBy::Cancel, None),
                }
                journal.settle_children();
            }
        }
        let stopping = match (shutting_down, &self.deps.cluster) {
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
                return Ok(None);
            }
        };
        let core = journal.core;
        batch.checkpoint(core, ending.run.id, None);
        batch.state(core, ending.state, ending.session_error());
        batch.event(core, ending.terminal);
        batch.ops.push(WriteOp::UpsertRun(ending.run.clone()));
        let result = RunResult::from(&ending.run);
        let (status, took) = (ending.run.status, run_took(&ending.run));
        telemetry::run_ended(&span, &ending.run);
        core.last_result = Some(result.clone());
        core.last_run = Some(ending.run);
        match sink.commit(batch).await {
            Ok(()) => {
                crate::metrics::run_ended(status.as_str(), took);
                let _ = result_tx.send(Ok(result));
                Ok(next)
            }
            Err(error) => {
                let text = error.to_string();
                let stop = Stop::write_failed(self.id, &error);
                let _ = result_tx.send(Err(RunStopped::Storage {
                    error: text.clone(),
                }));
                if let Some((_, reply)) = next {
                    let _ = reply.send(Err(SessionError::Store(StoreError::Poisoned(text))));
                }
                Err(stop)
            }
        }
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

/// How long a run took, from its start to its end.
fn run_took(run: &RunRecord) -> std::time::Duration {
    let end = run.finished_at.unwrap_or_else(model::now);
    (end - run.created_at).to_std().unwrap_or_default()
}
