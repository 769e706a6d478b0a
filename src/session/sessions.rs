//! [`Sessions`]: the API of the session layer that the HTTP layer (or any embedding program)
//! uses. Creating and forking a session are single commits; everything that changes an
//! existing session is a command to its actor.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::Instant;
use uuid::Uuid;

use super::actor::SessionActor;
use super::command::{
    ApprovalAnswer, CancelOutcome, Command, Compacted, Reply, RunRequest, RunStarted,
};
use super::live::{LiveSessions, Slot};
use super::stream::EventStream;
use super::waiting::{self, ClientResult, PendingApproval, PendingClientCall, Waiting};
use super::{coordination, steps};
use crate::model::{
    self, AgentChoice, AgentRecord, Event, EventKind, Message, Published, Role, SessionAgent,
    SessionOptions, SessionRecord, SessionState, Usage,
};
use crate::session::deps::SessionDeps;
use crate::session::errors::{ConflictKind, SessionError};
use crate::store::{Store, WriteOp};

/// A session's live channels, taken before its backlog is read.
pub struct Subscription {
    pub(super) live: broadcast::Receiver<Arc<Published>>,
    pub(super) wake: watch::Receiver<u64>,
}

/// The sessions of this process. Cheap to clone.
#[derive(Clone)]
pub struct Sessions {
    pub(super) deps: Arc<SessionDeps>,
    live: LiveSessions,
}

#[derive(Debug, Clone, Default)]
pub struct NewSession {
    pub system_prompt: Option<String>,
    pub title: Option<String>,
    pub metadata: Option<Value>,
    /// Validated by the caller against the server's tools.
    pub options: SessionOptions,
    /// The tenant it belongs to.
    pub tenant: String,
    /// The principal that makes it.
    pub owner: Option<String>,
}

/// How often a command is handed to a session's next actor when the one it reached stopped.
const DELIVERY_ATTEMPTS: usize = 8;

impl Sessions {
    /// The sessions of a process. Starts the task that recovers sessions stopped by a failed
    /// write, so it must be called within the async runtime.
    pub fn new(deps: SessionDeps) -> Sessions {
        let (live, stalled) = LiveSessions::new();
        let sessions = Sessions {
            deps: Arc::new(deps),
            live,
        };
        let tasks = sessions.deps.tasks.clone();
        tasks.spawn(recover_stalled(sessions.clone(), stalled));
        sessions
    }

    /// A handle on the sessions of this process, for an actor.
    pub(super) fn from_parts(deps: Arc<SessionDeps>, live: LiveSessions) -> Sessions {
        Sessions { deps, live }
    }

    /// How many sessions this process holds in memory.
    pub fn live_count(&self) -> usize {
        self.live.count()
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.deps.store
    }

    pub fn deps(&self) -> &Arc<SessionDeps> {
        &self.deps
    }

    /// Why the server is not ready to write: the database refuses writes, or it accepts them
    /// again but a session whose run a failed write stopped is not recorded as failed yet.
    pub fn write_failure(&self) -> Option<String> {
        if let Some(error) = self.deps.writer.failing() {
            return Some(format!("the database refuses writes: {error}"));
        }
        let (n, cause) = self.live.stalled()?;
        Some(format!(
            "a write failed ({cause}), and {n} session(s) whose run it stopped are not recorded \
             as failed yet"
        ))
    }

    /// Creates a session on `agent` (the version its options name, as
    /// [`Sessions::choose_agent`] answered it): its system message and its `session.created`
    /// event commit together.
    pub async fn create(
        &self,
        new: NewSession,
        agent: &AgentRecord,
    ) -> Result<SessionRecord, SessionError> {
        let record = self.new_record(model::new_id(), None, new);
        self.insert(record, agent).await
    }

    /// Creates the child session a sub-agent works in: `parent`'s agent, prompt, tools, policy
    /// workspace and environment (not its client's tools: nobody answers them for a child), one
    /// level deeper; or, when `agent` names another agent, that agent's in `parent`'s workspace
    /// and environment.
    pub async fn create_child(
        &self,
        parent: &SessionRecord,
        id: Uuid,
        call_id: &str,
        description: &str,
        agent: Option<(SessionAgent, AgentRecord)>,
    ) -> Result<SessionRecord, SessionError> {
        let depth = parent.options.depth + 1;
        let task_call_id = Some(call_id.to_string());
        let (options, system_prompt) = match &agent {
            None => (
                SessionOptions {
                    client_tools: Vec::new(),
                    depth,
                    task_call_id,
                    ..parent.options.clone()
                },
                parent.system_prompt.clone(),
            ),
            Some((chosen, _)) => (
                SessionOptions {
                    workspace: parent.options.workspace.clone(),
                    // Its tools run where its parent's do, as its workspace is its parent's.
                    environment: parent.options.environment.clone(),
                    depth,
                    task_call_id,
                    agent: chosen.clone(),
                    ..SessionOptions::default()
                },
                None,
            ),
        };
        let new = NewSession {
            system_prompt,
            title: Some(description.to_string()),
            metadata: None,
            options,
            tenant: parent.tenant.clone(),
            owner: parent.owner.clone(),
        };
        let record = self.new_record(id, Some(parent.id), new);
        let agent = match agent {
            Some((_, version)) => version,
            None => self.agent_version(&record).await?,
        };
        self.insert(record, &agent).await
    }

    fn new_record(&self, id: Uuid, parent_id: Option<Uuid>, new: NewSession) -> SessionRecord {
        let fresh = SessionRecord::new(id, parent_id, model::now());
        SessionRecord {
            title: new.title,
            metadata: new.metadata.unwrap_or(fresh.metadata.clone()),
            system_prompt: new.system_prompt,
            // Its system message and `session.created` event.
            message_count: 1,
            last_seq: 1,
            options: new.options,
            tenant: new.tenant,
            owner: new.owner,
            ..fresh
        }
    }

    /// Writes a new session on `agent` with its system message and `session.created` event.
    async fn insert(
        &self,
        record: SessionRecord,
        agent: &AgentRecord,
    ) -> Result<SessionRecord, SessionError> {
        if self.deps.shutdown.is_cancelled() {
            return Err(SessionError::ShuttingDown);
        }
        let id = record.id;
        let prompt = record
            .system_prompt
            .clone()
            .or_else(|| agent.spec.system_prompt.clone())
            .unwrap_or_else(|| self.deps.settings.system_prompt.clone());
        let system = Message::new(Role::System, prompt);
        let event = new_event(id, 1, self.created(&record, agent));
        let system = WriteOp::InsertMessage {
            session_id: id,
            message: system,
        };
        self.write_new(&record, vec![system, WriteOp::InsertEvent(event)])
            .await?;
        Ok(record)
    }

    /// The agent version a session's options name.
    async fn agent_version(&self, record: &SessionRecord) -> Result<AgentRecord, SessionError> {
        let tag = &record.options.agent.tag;
        self.agent(tag.id, Some(tag.version)).await
    }

    /// A new session's `session.created`: its title, agent version and model.
    fn created(&self, record: &SessionRecord, agent: &AgentRecord) -> EventKind {
        let model = match self.agent_model(agent) {
            Ok(model) => model.qualified(),
            Err(_) => agent.spec.model.clone(),
        };
        EventKind::SessionCreated {
            session_id: record.id,
            title: record.title.clone(),
            agent: Some(agent.tag()),
            model: Some(model),
        }
    }

    /// Writes a new session's row and `ops` in one commit, the first of its log.
    async fn write_new(
        &self,
        record: &SessionRecord,
        ops: Vec<WriteOp>,
    ) -> Result<(), SessionError> {
        let mut all = Vec::with_capacity(ops.len() + 1);
        all.push(WriteOp::InsertSession(record.clone()));
        all.extend(ops);
        self.deps.writer.commit((record.id, 0), all, None).await?;
        Ok(())
    }

    /// Creates a new session holding a copy of `source`'s first `turns` turns (all when
    /// `None`) and of the artifacts recorded during them; the copy is made inside the
    /// database, and the artifacts' bytes are shared, not copied. The fork works in its
    /// parent's workspace unless `workspace` names another directory under the server's root,
    /// and runs its parent's agent unless `agent` names another.
    pub async fn fork(
        &self,
        source: Uuid,
        turns: Option<u64>,
        workspace: Option<&str>,
        agent: Option<&AgentChoice>,
        owner: &str,
    ) -> Result<SessionRecord, SessionError> {
        if self.deps.shutdown.is_cancelled() {
            return Err(SessionError::ShuttingDown);
        }
        let mut parent = self.get(source).await?;
        if let Some(workspace) = workspace {
            parent.options.workspace = self.resolve_workspace(workspace).await?;
        }
        let chosen = match agent {
            Some(choice) => {
                let (chosen, version) = self
                    .choose_agent(Some(choice), Some(&parent.tenant))
                    .await?;
                let options = SessionOptions {
                    agent: chosen,
                    ..parent.options.clone()
                };
                parent.options = self.check_options_on(options, &version)?;
                Some(version)
            }
            None => None,
        };
        let mut upto = match turns {
            Some(n) => self.deps.store.nth_user_message(source, n).await?,
            None => None,
        };
        // An automatic summary written just before turn N+1 belongs to that turn, not to the
        // first N: a fork taken there predates it.
        while let Some(cut) = upto.filter(|&cut| cut > 1) {
            let before = self.deps.store.messages(source, cut - 2, 1).await?;
            if !before.first().is_some_and(Message::is_summary) {
                break;
            }
            upto = Some(cut - 1);
        }
        // All turns of a running session would include the one in progress: only the turns
        // that have ended can be forked. What was committed when the session was read is what
        // is copied, whatever happens to the session meanwhile.
        let upto = match upto {
            Some(cut) => cut,
            None if parent.state.is_active() => {
                return Err(SessionError::Conflict(ConflictKind::ForkWhileRunning))
            }
            None => parent.message_count,
        };
        let now = model::now();
        let id = model::new_id();
        let record = SessionRecord {
            id,
            parent_id: Some(source),
            state: SessionState::Idle,
            error: None,
            message_count: upto,
            last_seq: 2,
            usage: Usage::default(),
            last_run_id: None,
            created_at: now,
            updated_at: now,
            owner: Some(owner.to_string()),
            ..parent
        };
        let agent = match chosen {
            Some(version) => version,
            None => self.agent_version(&record).await?,
        };
        let created = new_event(id, 1, self.created(&record, &agent));
        let forked = new_event(
            id,
            2,
            EventKind::SessionForked {
                parent_id: source,
                turns,
            },
        );
        let (from, to, upto) = (source, id, Some(upto));
        let ops = vec![
            WriteOp::CopyMessages { from, to, upto },
            WriteOp::CopyArtifacts { from, to, upto },
            WriteOp::InsertEvent(created),
            WriteOp::InsertEvent(forked),
        ];
        self.write_new(&record, ops).await?;
        // The copy happened inside the database; read the count it produced.
        Ok(self.get(id).await.unwrap_or(record))
    }

    /// Sets a session's labels (its title and metadata), whatever its runs are doing: nothing
    /// else writes them after the session is made. Answers the session as it is now (`NotFound`
    /// when there is none: the write then changed nothing).
    pub async fn set_labels(
        &self,
        id: Uuid,
        title: Option<String>,
        metadata: serde_json::Value,
    ) -> Result<SessionRecord, SessionError> {
        let labels = crate::store::SessionLabels {
            id,
            title,
            metadata,
            updated_at: crate::model::now(),
        };
        self.deps
            .store
            .commit(&[&[WriteOp::UpdateLabels(labels)]])
            .await?;
        self.get(id).await
    }

    pub async fn get(&self, id: Uuid) -> Result<SessionRecord, SessionError> {
        self.deps
            .store
            .session(id)
            .await?
            .ok_or(SessionError::NotFound)
    }

    /// The approvals the session's run waits for, rebuilt from its events.
    pub async fn pending_approvals(&self, id: Uuid) -> Result<Vec<PendingApproval>, SessionError> {
        Ok(self
            .active_run_calls(id)
            .await?
            .map(|waiting| waiting.pending_approvals())
            .unwrap_or_default())
    }

    /// The calls of the session's client tools that its run waits for the results of,
    /// rebuilt from its events (for a client that reconnects).
    pub async fn pending_client_calls(
        &self,
        id: Uuid,
    ) -> Result<Vec<PendingClientCall>, SessionError> {
        Ok(self
            .active_run_calls(id)
            .await?
            .map(|waiting| waiting.pending_client_calls())
            .unwrap_or_default())
    }

    /// The calls of the session's active run; `None` when no run is active.
    async fn active_run_calls(&self, id: Uuid) -> Result<Option<Waiting>, SessionError> {
        let session = self.get(id).await?;
        if !session.state.is_active() {
            return Ok(None);
        }
        let Some(run_id) = session.last_run_id else {
            return Ok(None);
        };
        let Some(run) = self.deps.store.run(id, run_id).await? else {
            return Ok(None);
        };
        let waiting = waiting::of_run(self.deps.store.as_ref(), id, run.start_seq).await?;
        Ok(Some(waiting))
    }

    /// A human's answer to a call waiting for approval; answers the resolution once it is
    /// recorded.
    pub async fn approve(
        &self,
        id: Uuid,
        call_id: String,
        answer: ApprovalAnswer,
    ) -> Result<Value, SessionError> {
        self.send(id, |reply| Command::Approve {
            call_id: call_id.clone(),
            answer: answer.clone(),
            reply,
        })
        .await
    }

    /// A client's result for a call of one of its tools; answers once it is recorded.
    pub async fn client_result(
        &self,
        id: Uuid,
        result: ClientResult,
    ) -> Result<Value, SessionError> {
        let command = |reply| Command::ClientResult {
            result: result.clone(),
            reply,
        };
        self.send(id, command).await
    }

    /// Starts a run (or a resume). Of concurrent requests exactly one starts; the others get a
    /// conflict.
    pub async fn run(&self, id: Uuid, request: RunRequest) -> Result<RunStarted, SessionError> {
        if self.deps.shutdown.is_cancelled() {
            return Err(SessionError::ShuttingDown);
        }
        self.send(id, |reply| Command::Run {
            request: request.clone(),
            reply,
        })
        .await
    }

    pub async fn cancel(&self, id: Uuid) -> Result<CancelOutcome, SessionError> {
        self.send(id, |reply| Command::Cancel { reply }).await
    }

    /// Manual compaction; `None` when there is nothing to compact.
    pub async fn compact(&self, id: Uuid) -> Result<Option<Compacted>, SessionError> {
        self.send(id, |reply| Command::Compact { reply }).await
    }

    /// Sets the session's own `max_cost_usd` (`None`: clears it, its agent's cap applies);
    /// refused while a run is active. Answers the session as it is now.
    pub async fn set_cost_cap(
        &self,
        id: Uuid,
        max_cost_usd: Option<f64>,
    ) -> Result<SessionRecord, SessionError> {
        self.send(id, |reply| Command::SetCostCap {
            max_cost_usd,
            reply,
        })
        .await
    }

    /// What the session's LLM steps have cost, in US dollars (`None`: none had a price).
    pub async fn spent(&self, id: Uuid) -> Result<Option<f64>, SessionError> {
        Ok(super::cost::spent(self.deps.store.as_ref(), id).await?)
    }

    pub async fn delete(&self, id: Uuid) -> Result<(), SessionError> {
        self.send(id, |reply| Command::Delete { reply }).await
    }

    /// The session's events after `after`, then live ones as they commit; with `run`, ends
    /// after that run's terminal event.
    pub async fn follow(
        &self,
        id: Uuid,
        after: i64,
        run: Option<Uuid>,
    ) -> Result<EventStream, SessionError> {
        // A run a failed write stopped is recorded first, so that the stream has its end.
        if self.live.is_stalled(id) {
            self.send(id, |reply| Command::Recover { reply })
                .await
                .map_err(|error| match error {
                    SessionError::Store(error) => SessionError::Unrecorded(error),
                    other => other,
                })?;
        }
        // Subscribe before reading the backlog so nothing committed in between is missed.
        let live = self.subscribe(id)?;
        if self.deps.store.session(id).await?.is_none() {
            return Err(SessionError::NotFound);
        }
        Ok(self.stream_from(id, after, live, run))
    }

    /// Subscribes to a session's live events (for a run started right after).
    pub fn subscribe(&self, id: Uuid) -> Result<Subscription, SessionError> {
        let slot = self.get_or_spawn(id)?;
        Ok(Subscription {
            live: slot.events.subscribe(),
            wake: slot.wake.subscribe(),
        })
    }

    /// Wraps a subscription obtained with [`Sessions::subscribe`] into a stream from `after`.
    pub fn stream_from(
        &self,
        id: Uuid,
        after: i64,
        subscription: Subscription,
        run: Option<Uuid>,
    ) -> EventStream {
        EventStream::new(self.deps.store.clone(), id, after, subscription, run)
    }

    /// One step; an LLM step shows the exact request it sent, rebuilt from its descriptor.
    pub async fn step_with_request(
        &self,
        id: Uuid,
        step_id: Uuid,
    ) -> Result<Option<Value>, SessionError> {
        Ok(steps::with_request(&self.deps, id, step_id).await?)
    }

    /// Marks runs that a dead process left in progress as interrupted: each such session's
    /// actor is started, and it records the interruption. Only sessions stored as active are
    /// read (an indexed query), never the whole table. With auto-resume, every interrupted
    /// run is resumed, also those a graceful stop recorded as interrupted.
    pub async fn recover_interrupted(&self) -> Result<Vec<Uuid>, SessionError> {
        let ids = self.deps.store.active_sessions().await?;
        let mut interrupted = Vec::new();
        for id in ids {
            if self.take_over(id).await? {
                interrupted.push(id);
            }
        }
        if self.deps.auto_resume {
            let stopped: Vec<Uuid> = self
                .deps
                .store
                .interrupted_sessions()
                .await?
                .into_iter()
                // Those just taken over are being resumed already.
                .filter(|id| !interrupted.contains(id))
                .collect();
            interrupted.extend(stopped.iter().copied());
            self.resume_in_background(stopped);
        }
        Ok(interrupted)
    }

    /// Takes over a session whose run was interrupted (a dead process or replica left it
    /// running): its actor records it as interrupted, and resumes it if auto-resume is on.
    pub async fn take_over(&self, id: Uuid) -> Result<bool, SessionError> {
        self.send(id, |reply| Command::TakeOver { reply }).await
    }

    /// What follows a run of session `id` recorded as interrupted: with auto-resume, its
    /// resume; a replay's is cut short instead ([`Sessions::end_interrupted_replay`]).
    pub(super) fn after_interruption(&self, id: Uuid) {
        if self.deps.auto_resume {
            self.resume_in_background(vec![id]);
            return;
        }
        let sessions = self.clone();
        tokio::spawn(async move {
            sessions.end_interrupted_replay(id).await;
        });
    }

    /// Resumes interrupted sessions in the background (auto-resume); each resume is an
    /// ordinary run, so clients see it on the event stream. A sub-agent is left to its
    /// parent: the parent's resume runs the `task` call again, which continues the child. A
    /// replay is not resumed: it is recorded as cut short.
    pub fn resume_in_background(&self, ids: Vec<Uuid>) {
        for id in ids {
            let sessions = self.clone();
            tokio::spawn(async move {
                if sessions.end_interrupted_replay(id).await {
                    return;
                }
                match sessions.deps.store.session(id).await {
                    Ok(Some(record)) if record.options.task_call_id.is_some() => {
                        tracing::info!(session_id = %id, "a sub-agent resumes with its parent");
                        return;
                    }
                    _ => {}
                }
                match sessions.run(id, RunRequest::resume()).await {
                    Ok(_) => tracing::info!(session_id = %id, "resuming an interrupted run"),
                    Err(error) => tracing::warn!(session_id = %id, %error, "could not resume"),
                }
            });
        }
    }

    /// Starts the scale-out background tasks (heartbeat, takeover sweep, notifications).
    pub fn start_coordination(&self) {
        let Some(cluster) = self.deps.cluster.clone() else {
            return;
        };
        let sessions = self.clone();
        let take_over = move |id| {
            let sessions = sessions.clone();
            async move { sessions.take_over(id).await }
        };
        coordination::spawn(self.deps.clone(), self.live.clone(), cluster, take_over);
    }

    /// Sends a command to the session's actor, starting the actor if needed. An actor that
    /// stops drops what it did not handle; the command then goes to its successor.
    async fn send<T>(
        &self,
        id: Uuid,
        command: impl Fn(Reply<T>) -> Command,
    ) -> Result<T, SessionError> {
        for _ in 0..DELIVERY_ATTEMPTS {
            let (reply, answer) = oneshot::channel();
            let slot = self.get_or_spawn(id)?;
            if slot.mailbox.send(command(reply)).await.is_err() {
                continue;
            }
            match answer.await {
                // The actor stopped before it answered.
                Err(_) => continue,
                Ok(result) => return result,
            }
        }
        Err(SessionError::ShuttingDown)
    }

    /// The session's slot, spawning its actor when it has none running (never while the
    /// server shuts down).
    fn get_or_spawn(&self, id: Uuid) -> Result<Arc<Slot>, SessionError> {
        if let Some(slot) = self.live.running(id) {
            return Ok(slot);
        }
        if self.deps.shutdown.is_cancelled() {
            return Err(SessionError::ShuttingDown);
        }
        Ok(self.live.get_or_spawn(id, |slot, inbox| {
            let actor = SessionActor::new(id, self.deps.clone(), slot, self.live.clone());
            self.deps.tasks.spawn(actor.run(inbox));
        }))
    }
}

/// The first wait before a stalled session's recovery is tried; it doubles up to the longest.
const RECOVERY_FIRST_WAIT: Duration = Duration::from_millis(500);
const RECOVERY_LONGEST_WAIT: Duration = Duration::from_secs(2);

/// Recovers sessions whose actor stopped on a failed write: once writes succeed again, a new
/// actor records the run they left as failed (`storage`), and their followers get its terminal
/// event. Tries again with a growing wait while writes still fail.
async fn recover_stalled(sessions: Sessions, mut stalled: mpsc::UnboundedReceiver<Uuid>) {
    let shutdown = sessions.deps.shutdown.clone();
    // Each stalled session, with when to try next and how long to wait after that.
    let mut pending: HashMap<Uuid, (Instant, Duration)> = HashMap::new();
    loop {
        let due = pending.values().map(|(at, _)| *at).min();
        tokio::select! {
            id = stalled.recv() => match id {
                Some(id) => {
                    pending
                        .entry(id)
                        .or_insert((Instant::now() + RECOVERY_FIRST_WAIT, RECOVERY_FIRST_WAIT));
                }
                None => return,
            },
            _ = async {
                match due {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {
                let now = Instant::now();
                let ready: Vec<Uuid> = pending
                    .iter()
                    .filter(|(_, (at, _))| *at <= now)
                    .map(|(id, _)| *id)
                    .collect();
                for id in ready {
                    match sessions.send(id, |reply| Command::Recover { reply }).await {
                        Ok(()) => {
                            tracing::info!(session_id = %id, "session recovered after a failed write");
                            pending.remove(&id);
                        }
                        // Deleted, or another replica holds it now: nothing is left to record.
                        Err(SessionError::NotFound | SessionError::Conflict(_)) => {
                            sessions.live.unstall(id);
                            pending.remove(&id);
                        }
                        Err(error) => {
                            if let Some((at, wait)) = pending.get_mut(&id) {
                                *wait = (*wait * 2).min(RECOVERY_LONGEST_WAIT);
                                *at = Instant::now() + *wait;
                                tracing::warn!(session_id = %id, %error, retry_in_ms = wait.as_millis() as u64, "the session cannot be recovered yet");
                            }
                        }
                    }
                }
            }
            _ = shutdown.cancelled() => return,
        }
    }
}

fn new_event(session_id: Uuid, seq: i64, kind: EventKind) -> Arc<Published> {
    Arc::new(Published::new(Event::new(
        session_id,
        seq,
        kind,
        model::now(),
    )))
}
