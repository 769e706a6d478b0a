//! Driving a run: [`SessionActor::drive`] prepares the run (its tools, its board, what its
//! calls run in), runs its turn while the mailbox is still served ([`turn`]), and records how
//! it ended ([`finish`]).

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::oneshot;
use tracing::Instrument as _;

use super::approvals::{Driven, EarlierCalls};
use super::{Active, Activity, Phase, SessionActor, Stop};
use crate::agent::{run_turn, AgentDeps, AgentError, AgentSettings, TurnOutcome};
use crate::model::{
    self, AgentSpec, ClientTool, ResolvedBy, RunRecord, RunResult, SessionAgent, SessionRecord,
};
use crate::session::command::{Reply, RunRequest, RunStarted, RunStopped};
use crate::session::cost::CostCaps;
use crate::session::deps::SessionDeps;
use crate::session::errors::SessionError;
use crate::session::lineage::{Children, Lineage, Tree, TASK};
use crate::session::live::Inbox;
use crate::session::run::board::CallBoard;
use crate::session::run::end::{self, Conclusion, RunOutcome, Stopping};
use crate::session::run::{Batch, Run, RunTools, Sink};
use crate::session::run_permit::RunPermit;
use crate::session::sessions::Sessions;
use crate::session::subagents::TaskTool;
use crate::session::tenant_limits::TenantSlot;
use crate::session::waiting::{Resolution, Waiting};
use crate::session::RunAgent;
use crate::store::{StoreError, WriteOp};
use crate::telemetry;
use crate::tools::client::ClientSide;
use crate::tools::policy::Rules;
use crate::tools::{Tool, ToolContext, ToolRegistry};

/// A run asked for while another one ended: it starts next.
pub(super) type NextRun = Option<(RunRequest, Reply<RunStarted>)>;

const SUPERSEDED: &str = "superseded by a new message";

/// How a driven run begins.
pub(super) struct Begin {
    pub input: Option<String>,
    /// What waits already (a continued run), and an answer its board took.
    pub board: CallBoard,
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
    /// A top-level run's place among its tenant's runs, for the whole tree (none: a
    /// sub-agent's run, a continued run, or no tenant limit).
    pub tenant_slot: Option<TenantSlot>,
    /// US dollars the run may spend itself (a schedule's fire), beside the session's caps.
    pub max_cost_usd: Option<f64>,
}

impl Begin {
    pub fn new(
        input: Option<String>,
        result_tx: oneshot::Sender<Result<RunResult, RunStopped>>,
    ) -> Begin {
        Begin {
            input,
            board: CallBoard::live(Waiting::default(), Rules::default()),
            cancelled: false,
            superseded_by: None,
            result_tx,
            trace_parent: tracing::Span::none(),
            opening: None,
            decided: HashMap::new(),
            lineage: None,
            tenant_slot: None,
            max_cost_usd: None,
        }
    }

    /// A run that waited, continued without a client waiting for its result.
    pub fn resumed(waiting: Waiting) -> Begin {
        Begin::answered(CallBoard::live(waiting, Rules::default()))
    }

    /// A run that waited, continued with the answer its board took.
    pub fn answered(board: CallBoard) -> Begin {
        Begin {
            board,
            ..Begin::new(None, oneshot::channel().0)
        }
    }
}

/// A run ready to be driven.
struct Prepared {
    activity: Activity,
    board: Arc<CallBoard>,
    calls: RunTools,
    agent: AgentDeps,
    settings: AgentSettings,
    /// The caps in money the run is bounded by.
    caps: CostCaps,
    span: tracing::Span,
    /// Why the run cannot start (its workspace cannot be used).
    unusable: Option<String>,
    /// The session follows its agent's updates, and this run runs a newer version.
    agent_moved: bool,
}

impl SessionActor {
    /// The tools a run of this session is offered: the server's built-in tools and the tools
    /// of its MCP servers as they are now (each narrowed to the session's choice), `task` above
    /// the deepest sub-agent level, and the client tools (the session's and the run's own; a
    /// run's tool replaces the session's of the same name).
    fn run_tools(
        &self,
        record: &SessionRecord,
        run: &RunRecord,
        agent: &RunAgent,
        lineage: (&Arc<Children>, &Arc<RunPermit>),
    ) -> ToolRegistry {
        let spec = &agent.record.spec;
        let server = &self.deps.agent.tools;
        let mut chosen = match &spec.tools {
            Some(names) => server.keep(names),
            None => server.clone(),
        };
        if let Some(names) = &record.options.tools {
            chosen = chosen.keep(names);
        }
        let servers = agent_mcp_servers(spec, record.options.mcp_servers.as_deref());
        let mut more = self.deps.mcp.tools(servers.as_deref());
        if let Some(own) = &agent.own_mcp {
            more.extend(own.tools(record.options.mcp_servers.as_deref()));
        }
        let offered = |names: &Option<Vec<String>>| {
            names
                .as_ref()
                .is_none_or(|names| names.iter().any(|n| n == TASK))
        };
        if record.options.depth < self.deps.max_subagent_depth
            && offered(&record.options.tools)
            && offered(&spec.tools)
        {
            more.push(Arc::new(TaskTool {
                sessions: Sessions::from_parts(self.deps.clone(), self.live.clone()),
                parent: record.clone(),
                subagents: spec.subagents.clone(),
                children: lineage.0.clone(),
                permit: lineage.1.clone(),
            }));
        }
        // The agent's client tools, then the session's and the run's (which may replace the
        // session's of the same name).
        let session_side: Vec<&ClientTool> = model::client_tools_of(record, run).collect();
        let agent_side = spec
            .client_tools
            .iter()
            .filter(|t| !session_side.iter().any(|s| s.name == t.name));
        more.extend(
            agent_side
                .chain(session_side.iter().copied())
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
    pub(super) async fn drive(
        &mut self,
        run: RunRecord,
        mut begin: Begin,
        inbox: &mut Inbox,
    ) -> Result<NextRun, Stop> {
        let prepared = self.prepare(&run, &mut begin).await?;
        let sink = Sink {
            deps: &self.deps,
            slot: &self.slot,
        };
        let core = self.core.as_mut().ok_or(Stop::Gone)?;
        let mut journal = Run::new(self.id, run.id, core, sink, prepared.board, prepared.calls);
        journal.caps = prepared.caps;
        if let Some(opening) = begin.opening.take() {
            journal.batch = opening;
        }
        if prepared.agent_moved {
            // The session shows the version its run runs.
            let record = journal.core.record.clone();
            journal.batch.ops.push(WriteOp::UpdateSession(record));
        }
        let (result, lease_lost) = match prepared.unusable {
            Some(error) => (Err(AgentError::NotStarted { error }), false),
            None => {
                let turn = run_turn(
                    &mut journal,
                    &prepared.agent,
                    &prepared.settings,
                    begin.input.take(),
                    &prepared.activity.cancel,
                )
                .instrument(prepared.span.clone());
                serve_while(turn, &prepared.activity, inbox).await
            }
        };
        let ended = Ended {
            agent: prepared.settings.agent.name.clone(),
            deps: &self.deps,
            sink,
            run,
            activity: prepared.activity,
            span: prepared.span,
            result_tx: begin.result_tx,
            tenant_slot: begin.tenant_slot.take(),
        };
        if lease_lost {
            let _ = ended.result_tx.send(Err(RunStopped::Elsewhere));
            return Err(Stop::LeaseLost);
        }
        finish(journal, ended, result).await
    }

    /// Gathers what the run needs: its agent version, its tools and what they run in, its board
    /// (the agent's and the session's rules, what waits already), its settings and its trace
    /// span.
    async fn prepare(&mut self, run: &RunRecord, begin: &mut Begin) -> Result<Prepared, Stop> {
        let lineage = begin.lineage.take().unwrap_or_else(|| Lineage {
            tree: Tree::new(self.deps.max_subagents_per_run),
            permit: RunPermit::unmetered(self.deps.run_permits.clone()),
        });
        let children = Arc::new(Children::new(lineage.tree));
        let (agent, agent_moved, mut unusable) = self.capture_agent().await?;
        // The agent's secrets were resolved in its tenant.
        let redactor = self.deps.vaults.redactor(&agent.record.tenant);
        let core = self.core.as_ref().ok_or(Stop::Gone)?;
        let tools = self.run_tools(&core.record, run, &agent, (&children, &lineage.permit));
        // A recorded replay's run is served from its source's log.
        let (agent, tools) = self.deps.replays.serve(self.id, agent, tools);
        let context = match self.tool_context(&core.record).await {
            Ok(context) => context,
            // Never used: the loop does not run.
            Err(error) => {
                unusable = unusable.or(Some(error));
                self.deps.agent.tool_context.clone()
            }
        };
        let core = self.core.as_ref().ok_or(Stop::Gone)?;
        let board = std::mem::replace(&mut begin.board, CallBoard::ended(Waiting::default()));
        let rules = [
            &agent.record.spec.tool_policy,
            &core.record.options.tool_policy,
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
        board.set_rules(Rules::compile(rules).unwrap_or_default());
        if let Some(next) = begin.superseded_by.take() {
            board.replace_successor(next);
        }
        let board = Arc::new(board);
        let activity = Activity {
            cancel: self.deps.shutdown.child_token(),
            what: Active::Run(run.id),
            driven: Some(Driven {
                board: board.clone(),
                tools: tools.clone(),
                deps: self.deps.clone(),
                run: run.clone(),
            }),
            earlier: EarlierCalls {
                store: self.deps.store.clone(),
                session_id: self.id,
                before: run.start_seq,
            },
        };
        if begin.cancelled {
            activity.cancel.cancel();
        }
        let settings = self.run_settings(&core.record, &agent);
        let caps = CostCaps::new(
            core.record.options.max_cost_usd,
            agent.record.spec.max_cost_usd,
            begin.max_cost_usd,
        );
        let span = telemetry::run_span(
            &begin.trace_parent,
            self.id,
            run.id,
            agent.client.name(),
            &agent.model.model,
            &agent.record.tag(),
        );
        let agent = AgentDeps {
            model: agent.client.clone(),
            tools: tools.clone(),
            tool_context: context.clone(),
        };
        let calls = RunTools {
            tools,
            context,
            running: 0,
            children,
            notes: HashMap::new(),
            decided: std::mem::take(&mut begin.decided),
            redactor: Some(redactor),
        };
        Ok(Prepared {
            activity,
            board,
            calls,
            agent,
            settings,
            caps,
            span,
            unusable,
            agent_moved,
        })
    }

    /// The agent version this run runs, captured now: the latest one for a session that
    /// follows its agent's updates (which the session then shows), else the one it is pinned
    /// to. When it cannot be had (its provider is no longer configured), the run does not
    /// start, saying why.
    async fn capture_agent(&mut self) -> Result<(RunAgent, bool, Option<String>), Stop> {
        let sessions = Sessions::from_parts(self.deps.clone(), self.live.clone());
        let core = self.core.as_mut().ok_or(Stop::Gone)?;
        let chosen = core.record.options.agent.clone();
        match sessions.run_agent(&chosen).await {
            Ok(agent) => {
                let tag = agent.record.tag();
                let moved = chosen.follows_latest && tag != chosen.tag;
                if moved {
                    core.record.options.agent.tag = tag;
                }
                Ok((agent, moved, None))
            }
            Err(error) => {
                let why = format!("the session's agent {} cannot run: {error}", chosen.tag.id);
                let default = SessionAgent::default();
                let agent = sessions.run_agent(&default).await.map_err(|_| Stop::Gone)?;
                Ok((agent, false, Some(why)))
            }
        }
    }

    /// The loop's settings for a run of this session on `agent`: the agent's prompt and
    /// limits (the default agent's are the current configuration), except for a prompt or a
    /// budget the session was created with on purpose.
    fn run_settings(&self, record: &SessionRecord, agent: &RunAgent) -> AgentSettings {
        let mut settings = self.deps.settings.clone();
        let spec = &agent.record.spec;
        if let Some(prompt) = record
            .system_prompt
            .as_ref()
            .or(spec.system_prompt.as_ref())
        {
            settings.system_prompt = prompt.clone();
        }
        settings.max_steps = spec.max_steps.or(settings.max_steps);
        settings.context_chars = spec.context_chars.or(settings.context_chars);
        let options = &record.options;
        settings.budget = settings.budget.for_session(
            options.max_tokens.or(spec.max_tokens),
            options.max_run_tokens.or(spec.max_run_tokens),
            record.usage,
        );
        settings.agent = agent.record.tag();
        settings.model = agent.model.clone();
        settings
    }
}

/// The MCP servers a run of an agent uses: the agent's (by name) narrowed to the session's
/// choice; `None`: every server of the server's.
fn agent_mcp_servers(spec: &AgentSpec, session: Option<&[String]>) -> Option<Vec<String>> {
    let agent: Option<Vec<String>> = spec
        .mcp_servers
        .as_ref()
        .map(|servers| servers.iter().map(|s| s.name().to_string()).collect());
    match (agent, session) {
        (None, None) => None,
        (Some(agent), None) => Some(agent),
        (None, Some(session)) => Some(session.to_vec()),
        (Some(agent), Some(session)) => Some(
            agent
                .into_iter()
                .filter(|name| session.contains(name))
                .collect(),
        ),
    }
}

/// Runs `work` (a run's turn, a compaction) while the mailbox is served: each command that
/// arrives meanwhile is handled in the busy phase. Says whether the session's lease was lost
/// meanwhile.
pub(super) async fn serve_while<F: std::future::Future>(
    work: F,
    activity: &Activity,
    inbox: &mut Inbox,
) -> (F::Output, bool) {
    let mut lease_lost = false;
    tokio::pin!(work);
    loop {
        tokio::select! {
            result = &mut work => return (result, lease_lost),
            Some(command) = inbox.recv() => {
                // Boxed: a command's handler may start a run, which reads commands.
                if let Err(Stop::LeaseLost) = Box::pin(command.handle(Phase::Busy(activity))).await {
                    lease_lost = true;
                }
            }
        }
    }
}

/// What the end of a driven run is recorded with.
struct Ended<'a> {
    /// The name of the agent the run ran.
    agent: String,
    deps: &'a SessionDeps,
    sink: Sink<'a>,
    run: RunRecord,
    activity: Activity,
    span: tracing::Span,
    result_tx: oneshot::Sender<Result<RunResult, RunStopped>>,
    /// Given back however the run ends: here, or when this is dropped.
    tenant_slot: Option<TenantSlot>,
}

/// Records how the run ended, and tells its client; the run that follows, if one asked to.
async fn finish(
    mut journal: Run<'_>,
    ended: Ended<'_>,
    result: Result<TurnOutcome, AgentError<StoreError>>,
) -> Result<NextRun, Stop> {
    let session_id = journal.id;
    let outcome = match RunOutcome::of(result) {
        Ok(outcome) => outcome,
        // What was queued is void. This actor stops; a successor reloads the session and
        // records the run as failed once writes succeed again.
        Err(error) => {
            let stop = Stop::write_failed(session_id, &error);
            let _ = ended.result_tx.send(Err(RunStopped::Storage {
                error: error.to_string(),
            }));
            return Err(stop);
        }
    };
    let next = ended
        .activity
        .driven
        .as_ref()
        .and_then(|driven| driven.board.take_successor());
    let shutting_down = ended.deps.shutdown.is_cancelled();
    if let RunOutcome::Cancelled { .. } = outcome {
        if shutting_down && next.is_none() && journal.is_parked() {
            // It waits only for answers, which a restart does not lose: leave it waiting.
            let batch = journal.take_batch();
            let _ = ended.sink.commit(batch).await;
            let _ = ended.result_tx.send(Err(RunStopped::Elsewhere));
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
    let stopping = match (shutting_down, &ended.deps.cluster) {
        (false, _) => Stopping::No,
        (true, None) => Stopping::Alone,
        (true, Some(_)) => Stopping::Replicated,
    };
    let batch = journal.take_batch();
    match end::conclude(ended.run.clone(), outcome, stopping, model::now()) {
        Conclusion::Record(ending) => record_end(journal, ended, batch, *ending, next).await,
        Conclusion::LeaveForTakeover => {
            // Its lease is released at shutdown and another replica takes it over from the
            // last checkpoint at once.
            let _ = ended.sink.commit(batch).await;
            let _ = ended.result_tx.send(Err(RunStopped::Elsewhere));
            Ok(None)
        }
    }
}

/// Writes the run's end (its record, the session's state, the terminal event) and tells the
/// run's client; a failed write stops the actor.
async fn record_end(
    journal: Run<'_>,
    mut ended: Ended<'_>,
    mut batch: Batch,
    ending: end::Ending,
    next: NextRun,
) -> Result<NextRun, Stop> {
    let session_id = journal.id;
    let core = journal.core;
    batch.checkpoint(core, ending.run.id, None);
    batch.state(core, ending.state, ending.session_error());
    batch.event(core, ending.terminal);
    batch.ops.push(WriteOp::UpsertRun(ending.run.clone()));
    let result = RunResult::from(&ending.run);
    let (status, took) = (ending.run.status, run_took(&ending.run));
    telemetry::run_ended(&ended.span, &ending.run);
    core.last_result = Some(result.clone());
    core.last_run = Some(ending.run);
    // The run works no more: its tenant's slot is free before its end can be seen.
    drop(ended.tenant_slot.take());
    match ended.sink.commit(batch).await {
        Ok(()) => {
            // What it used is in the database now: the next run of its tenant reads it.
            let tenant_limits = &ended.deps.tenant_limits;
            tenant_limits.forget_usage(&core.record.tenant);
            crate::metrics::run_ended(status.as_str(), &ended.agent, took);
            let _ = ended.result_tx.send(Ok(result));
            Ok(next)
        }
        Err(error) => {
            let text = error.to_string();
            let stop = Stop::write_failed(session_id, &error);
            let _ = ended.result_tx.send(Err(RunStopped::Storage {
                error: text.clone(),
            }));
            if let Some((_, reply)) = next {
                let _ = reply.send(Err(SessionError::Store(StoreError::Poisoned(text))));
            }
            Err(stop)
        }
    }
}

/// How long a run took, from its start to its end.
fn run_took(run: &RunRecord) -> std::time::Duration {
    let end = run.finished_at.unwrap_or_else(model::now);
    (end - run.created_at).to_std().unwrap_or_default()
}
