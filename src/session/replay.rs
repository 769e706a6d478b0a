//! Replay as evaluation (SPEC §21): a new session re-runs another session's user inputs, one
//! turn after the other, in the background, and a report compares the two turn by turn.
//!
//! - `recorded`: the model's replies and the tool results come from the source's log. Each run
//!   of the replay runs on a [`RecordedModel`] for its turn and on tools that stand for the
//!   real ones ([`RecordedTool`]): the server, the projection and the policy run again, no
//!   model is called and no tool runs. A divergence (the policy refusing a call the source
//!   ran, a step the source never made) fails that turn with an error that says where.
//! - `live`: the replay's agent (the source's, or another) calls its model and runs the tools
//!   in the replay's workspace.
//!
//! The replay's row (`replays`) says what it replays; what each side did is read from the two
//! sessions' runs, steps and messages when the report is asked for.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::command::{ApprovalAnswer, Pending, RunRequest};
use super::{Follow, NewSession, SessionError, Sessions};
use crate::llm::providers::round_usd;
use crate::llm::recorded::{RecordedModel, RecordedTurn};
use crate::llm::ModelReply;
use crate::model::{
    self, AgentChoice, AgentStep, AgentTag, ClientTool, Decision, Event, EventKind, Message,
    ResolvedBy, Role, RunKind, RunRecord, RunStatus, SessionOptions, SessionRecord, StepKind,
    StepRecord, StepStatus, ToolCall,
};
use crate::session::RunAgent;
use crate::store::replays::{ReplayRow, ReplayStore};
use crate::tools::client::ClientSide;
use crate::tools::recorded::{RecordedCall, RecordedCalls, RecordedTool};
use crate::tools::{Tool, ToolRegistry};

/// Who answers a recorded replay's approvals, as its events name them.
const REPLAY_ANSWERER: &str = "replay";

/// How a replay gets its model replies and tool results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplayMode {
    /// From the source's log.
    Recorded,
    /// From the replay's agent and tools.
    Live,
}

impl ReplayMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplayMode::Recorded => "recorded",
            ReplayMode::Live => "live",
        }
    }

    fn parse(s: &str) -> Option<ReplayMode> {
        match s {
            "recorded" => Some(ReplayMode::Recorded),
            "live" => Some(ReplayMode::Live),
            _ => None,
        }
    }
}

/// What `POST /v1/sessions/{id}/replay` asks for.
#[derive(Debug, Clone)]
pub struct ReplayRequest {
    /// The agent the replay runs (`None`: the source's).
    pub agent: Option<AgentChoice>,
    pub mode: ReplayMode,
    /// How many of the source's turns, from the first (`None`: all that have ended).
    pub turns: Option<u64>,
    /// Another directory under the server's workspace for its tools (default: the source's).
    pub workspace: Option<String>,
    /// The principal that asks (the replay's owner).
    pub owner: String,
}

/// What a replay replays, as served with the replay's session and its report.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayOf {
    pub session: Uuid,
    pub mode: ReplayMode,
    /// The agent version the replay runs, `<id>@<version>`.
    pub agent: String,
    /// How many of the source's turns it replays.
    pub turns: u64,
}

impl ReplayOf {
    fn of(row: &ReplayRow) -> ReplayOf {
        let agent = serde_json::from_str::<AgentTag>(&row.agent)
            .map(|tag| format!("{}@{}", tag.id, tag.version))
            .unwrap_or_else(|_| row.agent.clone());
        ReplayOf {
            session: row.source_id,
            mode: ReplayMode::parse(&row.mode).unwrap_or(ReplayMode::Live),
            agent,
            turns: u64::try_from(row.turns).unwrap_or(0),
        }
    }
}

/// The recorded replays running in this process, by the replay's session id: what a run of
/// such a session is served from. Cheap to clone.
#[derive(Clone, Default)]
pub struct Scripts(Arc<Mutex<HashMap<Uuid, Arc<Script>>>>);

impl Scripts {
    fn insert(&self, session: Uuid, script: Arc<Script>) {
        if let Ok(mut map) = self.0.lock() {
            map.insert(session, script);
        }
    }

    fn remove(&self, session: Uuid) {
        if let Ok(mut map) = self.0.lock() {
            map.remove(&session);
        }
    }

    /// A run of `session` as it runs: on the source's recorded replies and tool results when
    /// the session is a recorded replay in progress, else as it is.
    pub(super) fn serve(
        &self,
        session: Uuid,
        agent: RunAgent,
        tools: ToolRegistry,
    ) -> (RunAgent, ToolRegistry) {
        let script = self
            .0
            .lock()
            .ok()
            .and_then(|map| map.get(&session).cloned());
        match script {
            Some(script) => script.serve(agent, tools),
            None => (agent, tools),
        }
    }
}

/// What a recorded replay serves: the source's turns and its tool calls.
struct Script {
    turns: Vec<Arc<RecordedTurn>>,
    calls: RecordedCalls,
    /// The source's client tools, answered from the log like the others.
    client_tools: Vec<ClientTool>,
    /// How the source's approvals were answered, by call id.
    approvals: HashMap<String, ApprovalAnswer>,
    /// The turn being replayed (from 0), set before its run starts.
    current: AtomicUsize,
}

impl Script {
    fn serve(&self, mut agent: RunAgent, tools: ToolRegistry) -> (RunAgent, ToolRegistry) {
        let at = self.current.load(Ordering::SeqCst);
        let turn = self.turns.get(at).cloned().unwrap_or_else(|| {
            Arc::new(RecordedTurn {
                turn: at + 1,
                ..RecordedTurn::default()
            })
        });
        agent.client = Arc::new(RecordedModel::new(agent.client.model().to_string(), turn));
        let calls = self.calls.clone();
        let wrap = |tool: &Arc<dyn Tool>| -> Arc<dyn Tool> {
            Arc::new(RecordedTool {
                inner: tool.clone(),
                calls: calls.clone(),
            })
        };
        let mut tools = tools.map(wrap);
        let missing: Vec<Arc<dyn Tool>> = self
            .client_tools
            .iter()
            .filter(|t| tools.get(&t.name).is_none())
            .map(|t| wrap(&(Arc::new(ClientSide(t.clone())) as Arc<dyn Tool>)))
            .collect();
        if !missing.is_empty() {
            tools = tools.with(missing).unwrap_or(tools);
        }
        (agent, tools)
    }
}

/// A session's turns: each run with an input, and the resumes that continued it.
fn turns_of(runs: &[RunRecord]) -> Vec<Vec<&RunRecord>> {
    let mut turns: Vec<Vec<&RunRecord>> = Vec::new();
    for run in runs {
        match (run.kind, turns.last_mut()) {
            (RunKind::Run, _) => turns.push(vec![run]),
            (RunKind::Resume, Some(turn)) => turn.push(run),
            (RunKind::Resume, None) => {}
        }
    }
    turns
}

/// Whether every run of a turn has ended.
fn ended(turn: &[&RunRecord]) -> bool {
    turn.iter().all(|r| r.status != RunStatus::Running)
}

/// Everything of a session a replay reads: its runs, steps and messages, in order.
struct Log {
    runs: Vec<RunRecord>,
    steps: Vec<StepRecord>,
    messages: Vec<Message>,
    /// The answers to its approvals, by call id (read for a recorded replay only).
    approvals: HashMap<String, ApprovalAnswer>,
}

impl Sessions {
    fn replay_store(&self) -> Result<&dyn ReplayStore, SessionError> {
        self.deps.store.replay_store().ok_or_else(|| {
            SessionError::BadInput("this server's store keeps no replays".to_string())
        })
    }

    async fn log_of(&self, id: Uuid, approvals: bool) -> Result<Log, SessionError> {
        let store = &self.deps.store;
        let approvals = match approvals {
            true => answers_of(&store.events(id, 0, i64::MAX).await?),
            false => HashMap::new(),
        };
        Ok(Log {
            runs: store.runs(id, None, i64::MAX).await?,
            steps: store.steps(id, None, i64::MAX).await?,
            messages: store.messages(id, -1, i64::MAX).await?,
            approvals,
        })
    }

    /// Starts a replay of `source` as `request` says: a new session in the source's tenant,
    /// whose turns run in the background. Answers the new session and what it replays.
    pub async fn replay(
        &self,
        source: Uuid,
        request: ReplayRequest,
    ) -> Result<(SessionRecord, ReplayOf), SessionError> {
        if self.deps.shutdown.is_cancelled() {
            return Err(SessionError::ShuttingDown);
        }
        let replays = self.replay_store()?;
        let parent = self.get(source).await?;
        let log = self
            .log_of(source, request.mode == ReplayMode::Recorded)
            .await?;
        let turns: Vec<Vec<&RunRecord>> = turns_of(&log.runs)
            .into_iter()
            .filter(|turn| ended(turn) && turn[0].input.is_some())
            .collect();
        if turns.is_empty() {
            return Err(SessionError::BadInput(
                "session: the source has no ended turn to replay".to_string(),
            ));
        }
        let count = match request.turns {
            None => turns.len(),
            Some(0) => {
                return Err(SessionError::BadInput(
                    "turns must be at least 1 (leave it out for every turn)".to_string(),
                ))
            }
            Some(n) if n > turns.len() as u64 => {
                return Err(SessionError::BadInput(format!(
                    "turns: the source has {} ended turn(s), not {n}",
                    turns.len()
                )))
            }
            Some(n) => n as usize,
        };
        let turns = &turns[..count];
        let (chosen, version) = match &request.agent {
            Some(choice) => {
                self.choose_agent(Some(choice), Some(&parent.tenant))
                    .await?
            }
            None => {
                let tag = &parent.options.agent.tag;
                let version = self.agent(tag.id, Some(tag.version)).await?;
                (parent.options.agent.clone(), version)
            }
        };
        let recorded = request.mode == ReplayMode::Recorded;
        let options = SessionOptions {
            agent: chosen,
            depth: 0,
            task_call_id: None,
            // A recorded replay answers the client's tools from the log: nobody waits for a
            // client.
            client_tools: match recorded {
                true => Vec::new(),
                false => parent.options.client_tools.clone(),
            },
            ..parent.options.clone()
        };
        let mut options = self.check_options_on(options, &version)?;
        if let Some(workspace) = &request.workspace {
            options.workspace = self.resolve_workspace(workspace).await?;
        }
        let agent_tag = serde_json::to_string(&options.agent.tag).unwrap_or_default();
        let record = self
            .create(
                NewSession {
                    // The source's own prompt, unless another agent (with its own) is asked for.
                    system_prompt: match request.agent {
                        None => parent.system_prompt.clone(),
                        Some(_) => None,
                    },
                    title: parent.title.clone(),
                    metadata: None,
                    options,
                    tenant: parent.tenant.clone(),
                    owner: Some(request.owner.clone()),
                },
                &version,
            )
            .await?;
        let row = ReplayRow {
            session_id: record.id,
            source_id: source,
            mode: request.mode.as_str().to_string(),
            agent: agent_tag,
            turns: count as i64,
            created_at: model::now().timestamp_millis(),
            finished_at: None,
            error: None,
        };
        replays.insert_replay(&row).await?;
        let inputs: Vec<String> = turns
            .iter()
            .map(|turn| turn[0].input.clone().unwrap_or_default())
            .collect();
        let script = recorded.then(|| {
            let script = Arc::new(script_of(&log, turns, &parent.options.client_tools));
            self.deps.replays.insert(record.id, script.clone());
            script
        });
        let sessions = self.clone();
        let id = record.id;
        let left = row.clone();
        tokio::spawn(async move {
            sessions.run_replay(id, inputs, script).await;
            sessions.deps.replays.remove(id);
            if sessions.deps.shutdown.is_cancelled() {
                // Cut short by a stop: recorded so now if the stop leaves the time, else by
                // the next start ([`Sessions::recover_replays`]).
                if let Err(error) = sessions.cut_replay_short(&left).await {
                    tracing::warn!(session_id = %id, %error, "cannot record a replay cut short");
                }
                return;
            }
            let finished = model::now().timestamp_millis();
            if let Ok(store) = sessions.replay_store() {
                if let Err(error) = store.finish_replay(id, finished).await {
                    tracing::warn!(session_id = %id, %error, "could not record a replay's end");
                }
            }
        });
        Ok((record, ReplayOf::of(&row)))
    }

    /// Records the replays an earlier process left running as cut short, at start-up: their
    /// turns were driven by that process, so none goes on. With SQLite this process is the
    /// only one on the database, so every replay not ended was left; with several replicas,
    /// those whose session a stop or a takeover recorded as interrupted (a replica that dies
    /// while a turn runs has its session taken over, which records the replay so too).
    /// Answers how many were.
    pub async fn recover_replays(&self) -> Result<usize, SessionError> {
        let Some(store) = self.deps.store.replay_store() else {
            return Ok(0);
        };
        let mut cut = 0;
        for row in store.unfinished_replays().await? {
            let left = match self.deps.cluster {
                None => true,
                Some(_) => self
                    .deps
                    .store
                    .session(row.session_id)
                    .await?
                    .is_some_and(|record| record.is_interrupted()),
            };
            if left && self.cut_replay_short(&row).await? {
                cut += 1;
            }
        }
        Ok(cut)
    }

    /// What follows a run of session `id` recorded as interrupted, when the session is a
    /// replay: the replay is cut short (its process is gone), and the run is not resumed (a
    /// resume would run outside the replay, and a `recorded` one would call the model).
    /// Answers whether `id` is a replay.
    pub(super) async fn end_interrupted_replay(&self, id: Uuid) -> bool {
        let Some(store) = self.deps.store.replay_store() else {
            return false;
        };
        let row = match store.replay(id).await {
            Ok(Some(row)) => row,
            Ok(None) => return false,
            Err(error) => {
                tracing::warn!(session_id = %id, %error, "cannot read whether a session is a replay");
                return false;
            }
        };
        if row.finished_at.is_none() {
            if let Err(error) = self.cut_replay_short(&row).await {
                tracing::warn!(session_id = %id, %error, "cannot record a replay cut short");
            }
        }
        true
    }

    /// Records a replay as ended by a restart, saying how far it got; whether it was not
    /// recorded ended before.
    async fn cut_replay_short(&self, row: &ReplayRow) -> Result<bool, SessionError> {
        let Some(store) = self.deps.store.replay_store() else {
            return Ok(false);
        };
        let runs = self.deps.store.runs(row.session_id, None, i64::MAX).await?;
        let started = turns_of(&runs).len();
        let error = format!(
            "interrupted by a restart: {started} of its {} turn(s) had started when the \
             process running the replay stopped; a replay does not go on after a restart \
             (start another one for the rest)",
            row.turns
        );
        let cut = store
            .cut_replay_short(row.session_id, model::now().timestamp_millis(), &error)
            .await?;
        if cut {
            tracing::info!(session_id = %row.session_id, started, "a replay was cut short by a restart");
        }
        Ok(cut)
    }

    /// Runs the replay's turns one after the other; a turn that fails does not stop the next.
    async fn run_replay(&self, id: Uuid, inputs: Vec<String>, script: Option<Arc<Script>>) {
        for (at, input) in inputs.into_iter().enumerate() {
            if let Some(script) = &script {
                script.current.store(at, Ordering::SeqCst);
            }
            // The previous run's end is sent just before its session is free again.
            let mut tries = 0;
            loop {
                if self.deps.shutdown.is_cancelled() {
                    return;
                }
                let request = RunRequest::run(input.clone(), Pending::Refuse);
                // A recorded turn's approvals are answered as the source's were.
                let answering = script.clone().map(|script| {
                    let sessions = self.clone();
                    tokio::spawn(async move { sessions.answer_approvals(id, &script).await })
                });
                let ended = self.start(id, request, Follow::End).await;
                if let Some(answering) = answering {
                    answering.abort();
                }
                match ended {
                    Ok(_) => break,
                    Err(SessionError::Conflict(_)) if tries < 100 => {
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(error) => {
                        tracing::warn!(session_id = %id, turn = at + 1, %error,
                            "a replay's turn could not start; the replay ends");
                        return;
                    }
                }
            }
        }
    }

    /// Answers the approvals the replay `id`'s run waits for, until it is aborted: as the
    /// source's were answered, or, for a call the source ran with no approval, `deny` (the
    /// recorded model then reports the divergence).
    async fn answer_approvals(&self, id: Uuid, script: &Script) {
        let mut answered: Vec<String> = Vec::new();
        loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let Ok(pending) = self.pending_approvals(id).await else {
                continue;
            };
            for call in pending {
                if answered.contains(&call.call_id) {
                    continue;
                }
                let answer = script
                    .approvals
                    .get(&call.call_id)
                    .cloned()
                    .unwrap_or_else(|| ApprovalAnswer {
                        decision: Decision::Deny,
                        reason: Some(
                            "replay: the source ran this call without an approval".to_string(),
                        ),
                        input: None,
                        answered_by: Some(REPLAY_ANSWERER.to_string()),
                    });
                if self.approve(id, call.call_id.clone(), answer).await.is_ok() {
                    answered.push(call.call_id);
                }
            }
        }
    }

    /// The report of the replay `id`: each turn of the source next to the replay's;
    /// `None` when the session is no replay.
    pub async fn replay_report(&self, id: Uuid) -> Result<Option<ReplayReport>, SessionError> {
        let replays = self.replay_store()?;
        let Some(row) = replays.replay(id).await? else {
            return Ok(None);
        };
        let replay_of = ReplayOf::of(&row);
        let source_log = self.log_of(row.source_id, false).await.ok();
        let replay_log = self.log_of(id, false).await?;
        let empty = Log {
            runs: Vec::new(),
            steps: Vec::new(),
            messages: Vec::new(),
            approvals: HashMap::new(),
        };
        let source_log = source_log.as_ref().unwrap_or(&empty);
        let source_turns = turns_of(&source_log.runs);
        let replay_turns = turns_of(&replay_log.runs);
        let mut turns = Vec::new();
        let mut totals = Totals::default();
        for at in 0..replay_of.turns as usize {
            let source = source_turns
                .get(at)
                .map(|runs| Side::of(runs, &source_log.steps));
            let replay = replay_turns
                .get(at)
                .filter(|runs| ended(runs))
                .map(|runs| Side::of(runs, &replay_log.steps));
            let input = source_turns
                .get(at)
                .and_then(|runs| runs[0].input.clone())
                .unwrap_or_default();
            let turn = Turn::compare(at + 1, input, source, replay);
            totals.add(&turn);
            turns.push(turn);
        }
        let complete = row.finished_at.is_some();
        let messages_equal = match complete {
            true => Some(same_messages(
                &source_log.messages,
                &replay_log.messages,
                self.deps
                    .store
                    .nth_user_message(row.source_id, replay_of.turns)
                    .await?,
            )),
            false => None,
        };
        Ok(Some(ReplayReport {
            session_id: id,
            replay_of,
            complete,
            error: row.error.clone(),
            turns_done: totals.turns_done,
            messages_equal,
            turns,
            totals,
        }))
    }
}

/// What a recorded replay of `turns` serves, from the source's `log`.
fn script_of(log: &Log, turns: &[Vec<&RunRecord>], client_tools: &[ClientTool]) -> Script {
    let results: HashMap<&str, &str> = log
        .messages
        .iter()
        .filter(|m| m.role == Role::Tool)
        .filter_map(|m| Some((m.tool_call_id.as_deref()?, m.content.as_str())))
        .collect();
    let recorded_turns = turns
        .iter()
        .enumerate()
        .map(|(at, runs)| {
            let replies: Vec<ModelReply> = steps_of(runs, &log.steps)
                .filter(|s| s.kind == StepKind::Llm && s.status == StepStatus::Completed)
                .filter_map(reply_of)
                .collect();
            let results = replies
                .iter()
                .flat_map(|r| &r.tool_calls)
                .filter_map(|c| Some((c.id.clone(), results.get(c.id.as_str())?.to_string())))
                .collect();
            Arc::new(RecordedTurn {
                turn: at + 1,
                replies,
                results,
            })
        })
        .collect();
    let calls = log
        .steps
        .iter()
        .filter(|s| s.kind == StepKind::Tool)
        .filter_map(|s| match AgentStep::from(s.clone()) {
            AgentStep::Tool {
                call_id,
                tool,
                input,
                output: Some(output),
                is_error,
                ..
            } => Some((
                call_id,
                RecordedCall {
                    name: tool,
                    input,
                    output,
                    is_error: is_error.unwrap_or(false),
                },
            )),
            _ => None,
        })
        .collect();
    Script {
        turns: recorded_turns,
        calls: Arc::new(calls),
        client_tools: client_tools.to_vec(),
        approvals: log.approvals.clone(),
        current: AtomicUsize::new(0),
    }
}

/// The answers a session's approvals got (by a human, or by nobody in time), by call id.
fn answers_of(events: &[Event]) -> HashMap<String, ApprovalAnswer> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolApprovalResolved {
                call_id,
                decision,
                by: ResolvedBy::User | ResolvedBy::Timeout,
                reason,
                input,
                ..
            } => Some((
                call_id.clone(),
                ApprovalAnswer {
                    decision: *decision,
                    reason: reason.clone(),
                    input: input.clone(),
                    answered_by: Some(REPLAY_ANSWERER.to_string()),
                },
            )),
            _ => None,
        })
        .collect()
}

/// The steps of a turn's runs, in order.
fn steps_of<'a>(
    runs: &'a [&RunRecord],
    steps: &'a [StepRecord],
) -> impl Iterator<Item = &'a StepRecord> {
    steps
        .iter()
        .filter(move |s| runs.iter().any(|r| r.id == s.run_id))
}

/// The model reply an LLM step recorded: its assistant message, finish reason and usage.
fn reply_of(step: &StepRecord) -> Option<ModelReply> {
    let response = step.response.as_ref()?;
    let message: Message = serde_json::from_value(response.get("message")?.clone()).ok()?;
    Some(ModelReply {
        text: message.content,
        thinking: message.thinking,
        tool_calls: message.tool_calls,
        finish_reason: response["finish_reason"]
            .as_str()
            .unwrap_or("stop")
            .to_string(),
        usage: step.usage.unwrap_or_default(),
    })
}

/// Whether the replay's messages are the source's up to the end of the replayed turns (`cut`:
/// the index of the source's next user message; `None`: its end). Indexes and times aside.
fn same_messages(source: &[Message], replay: &[Message], cut: Option<i64>) -> bool {
    let source = source
        .iter()
        .filter(|m| cut.is_none_or(|cut| m.index < cut));
    let key = |m: &Message| {
        (
            m.role,
            m.content.clone(),
            m.thinking.clone(),
            m.tool_calls.clone(),
            m.tool_call_id.clone(),
        )
    };
    source.map(key).eq(replay.iter().map(key))
}

/// A replay's report (`GET /v1/sessions/{id}/replay-report`).
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport {
    pub session_id: Uuid,
    pub replay_of: ReplayOf,
    /// Every turn has been replayed (or the replay stopped for good).
    pub complete: bool,
    /// Why the replay stopped before its last turn ended: `interrupted by a restart …`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub turns_done: u64,
    /// Once complete: whether the replay's messages equal the source's over the replayed turns
    /// (what a `recorded` replay must show).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub messages_equal: Option<bool>,
    pub turns: Vec<Turn>,
    pub totals: Totals,
}

/// One turn, on both sides.
#[derive(Debug, Clone, Serialize)]
pub struct Turn {
    /// From 1.
    pub turn: usize,
    pub input: String,
    /// The replay's turn has ended.
    pub done: bool,
    pub final_text_equal: bool,
    pub tool_calls_equal: bool,
    /// Position by position: `equal`, `changed` (both made a call there, not the same one),
    /// `added` (only the replay), `removed` (only the source).
    pub tool_call_diff: Vec<CallDiff>,
    pub source: Option<Side>,
    /// `null` until the replay's turn has ended.
    pub replay: Option<Side>,
}

impl Turn {
    fn compare(turn: usize, input: String, source: Option<Side>, replay: Option<Side>) -> Turn {
        let no_calls = Vec::new();
        let source_calls = source.as_ref().map_or(&no_calls, |s| &s.tool_calls);
        let replay_calls = replay.as_ref().map_or(&no_calls, |s| &s.tool_calls);
        let tool_call_diff = match replay {
            Some(_) => diff(source_calls, replay_calls),
            None => Vec::new(),
        };
        let done = replay.is_some();
        let final_text_equal = done
            && source.as_ref().map(|s| &s.final_text) == replay.as_ref().map(|s| &s.final_text);
        let tool_calls_equal = done && tool_call_diff.iter().all(|d| d.change == Change::Equal);
        Turn {
            turn,
            input,
            done,
            final_text_equal,
            tool_calls_equal,
            tool_call_diff,
            source,
            replay,
        }
    }
}

/// What one side did in a turn.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    /// The turn's run (its first, when it was resumed).
    pub run_id: Uuid,
    pub status: RunStatus,
    pub final_text: String,
    pub tool_calls: Vec<CallShape>,
    /// LLM steps (a `recorded` replay's are served from the log, not by a model).
    pub model_calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// `null` when none of its steps had a price.
    pub cost_usd: Option<f64>,
    /// From the turn's first run's start to its last run's end.
    pub duration_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Side {
    fn of(runs: &[&RunRecord], steps: &[StepRecord]) -> Side {
        let first = runs[0];
        let last = runs[runs.len() - 1];
        let mut tool_calls = Vec::new();
        let mut model_calls = 0;
        let mut cost: Option<f64> = None;
        for step in steps_of(runs, steps).filter(|s| s.kind == StepKind::Llm) {
            model_calls += 1;
            if let Some(usd) = step.response.as_ref().and_then(|r| r["cost_usd"].as_f64()) {
                cost = Some(round_usd(cost.unwrap_or(0.0) + usd));
            }
            let calls = step
                .response
                .as_ref()
                .and_then(|r| r["message"].get("tool_calls").cloned())
                .and_then(|calls| serde_json::from_value::<Vec<ToolCall>>(calls).ok())
                .unwrap_or_default();
            tool_calls.extend(calls.into_iter().map(|c| CallShape {
                name: c.name,
                input: c.arguments,
            }));
        }
        let (input_tokens, output_tokens) = runs.iter().fold((0, 0), |(i, o), r| {
            (i + r.usage.input_tokens, o + r.usage.output_tokens)
        });
        let duration_ms = last
            .finished_at
            .map_or(0, |end| (end - first.created_at).num_milliseconds().max(0));
        Side {
            run_id: first.id,
            status: last.status,
            final_text: last.text.clone().unwrap_or_default(),
            tool_calls,
            model_calls,
            input_tokens,
            output_tokens,
            cost_usd: cost,
            duration_ms,
            error: last.error.clone(),
        }
    }
}

/// A tool call as the report compares it: its tool and input.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallShape {
    pub name: String,
    pub input: Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Equal,
    Changed,
    Added,
    Removed,
}

/// One position of the tool-call sequences.
#[derive(Debug, Clone, Serialize)]
pub struct CallDiff {
    /// From 0.
    pub position: usize,
    pub change: Change,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<CallShape>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replay: Option<CallShape>,
}

/// The two sequences compared position by position.
fn diff(source: &[CallShape], replay: &[CallShape]) -> Vec<CallDiff> {
    (0..source.len().max(replay.len()))
        .map(|position| {
            let (s, r) = (source.get(position), replay.get(position));
            let change = match (s, r) {
                (Some(s), Some(r)) if s == r => Change::Equal,
                (Some(_), Some(_)) => Change::Changed,
                (None, _) => Change::Added,
                (Some(_), None) => Change::Removed,
            };
            CallDiff {
                position,
                change,
                source: s.cloned(),
                replay: r.cloned(),
            }
        })
        .collect()
}

/// The report's sums.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    pub turns: u64,
    pub turns_done: u64,
    /// Turns whose final texts are equal.
    pub final_text_equal: u64,
    /// Turns whose tool-call sequences are equal.
    pub tool_calls_equal: u64,
    pub source: SideTotals,
    /// Over the turns the replay has done.
    pub replay: SideTotals,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SideTotals {
    pub model_calls: u64,
    pub tool_calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: Option<f64>,
    pub duration_ms: i64,
}

impl SideTotals {
    fn add(&mut self, side: &Side) {
        self.model_calls += side.model_calls;
        self.tool_calls += side.tool_calls.len() as u64;
        self.input_tokens += side.input_tokens;
        self.output_tokens += side.output_tokens;
        if let Some(usd) = side.cost_usd {
            self.cost_usd = Some(round_usd(self.cost_usd.unwrap_or(0.0) + usd));
        }
        self.duration_ms += side.duration_ms;
    }
}

impl Totals {
    fn add(&mut self, turn: &Turn) {
        self.turns += 1;
        if let Some(source) = &turn.source {
            self.source.add(source);
        }
        if let Some(replay) = &turn.replay {
            self.turns_done += 1;
            self.replay.add(replay);
        }
        self.final_text_equal += u64::from(turn.final_text_equal);
        self.tool_calls_equal += u64::from(turn.tool_calls_equal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(name: &str, input: Value) -> CallShape {
        CallShape {
            name: name.to_string(),
            input,
        }
    }

    #[test]
    fn tool_calls_are_compared_position_by_position() {
        let source = [
            call("list_files", json!({"path": "."})),
            call("read_file", json!({"path": "a"})),
            call("write_file", json!({"path": "b"})),
        ];
        let replay = [
            call("list_files", json!({"path": "."})),
            call("read_file", json!({"path": "c"})),
        ];
        let changes: Vec<Change> = diff(&source, &replay).iter().map(|d| d.change).collect();
        assert_eq!(changes, [Change::Equal, Change::Changed, Change::Removed]);
        let changes: Vec<Change> = diff(&replay[..1], &source)
            .iter()
            .map(|d| d.change)
            .collect();
        assert_eq!(changes, [Change::Equal, Change::Added, Change::Added]);
        assert!(diff(&[], &[]).is_empty());
    }
}
