//! The registry of live session actors and the API the HTTP layer uses.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::Value;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::actor::{Command, Reply, SessionActor};
use super::stream::EventStream;
use super::SessionError;
use crate::agent::{AgentDeps, AgentSettings};
use crate::model::{
    self, Event, EventKind, LlmRequestDescriptor, Message, Role, RunKind, RunRecord, RunResult,
    SessionRecord, SessionState, StepKind, Usage,
};
use crate::store::writer::Writer;
use crate::store::{Cluster, Store, StoreError, WriteOp};

/// A session's live channels, taken before its backlog is read.
pub struct Subscription {
    pub(super) live: broadcast::Receiver<Arc<Event>>,
    pub(super) wake: watch::Receiver<u64>,
}

/// Events kept in memory per session for live subscribers; one that falls further behind is
/// served from the database.
const LIVE_BUFFER: usize = 128;
/// Commands queued per actor.
const MAILBOX: usize = 64;

/// Everything an actor needs, shared by all of them.
pub struct SessionContext {
    pub store: Arc<dyn Store>,
    pub writer: Writer,
    pub deps: AgentDeps,
    pub settings: AgentSettings,
    /// Cancelled at shutdown; every run's token is a child of it.
    pub shutdown: CancellationToken,
    /// Actors, so that shutdown can wait for them to checkpoint and stop.
    pub tasks: TaskTracker,
    /// Permits for runs in progress in this process (the concurrency cap).
    pub run_permits: Arc<tokio::sync::Semaphore>,
    /// Lease coordination with other replicas (PostgreSQL); `None` on a single node.
    pub cluster: Option<Arc<dyn Cluster>>,
    /// This process's id as a lease owner.
    pub replica: Uuid,
    /// How long a lease lasts without renewal.
    pub lease_ttl: Duration,
    /// Resume interrupted runs by themselves (at start, and after taking a session over).
    pub auto_resume: bool,
}

pub(super) struct Slot {
    pub mailbox: mpsc::Sender<Command>,
    pub events: broadcast::Sender<Arc<Event>>,
    /// Bumped when another replica committed events of this session (or notifications may
    /// have been lost): subscribers then read what they miss from the store.
    pub wake: Arc<watch::Sender<u64>>,
    pub generation: u64,
    /// The lease this actor holds (`owner`, `epoch`), which every write carries so that a
    /// replica that lost the session cannot write to it (scale-out only).
    pub fence: Mutex<Option<(Uuid, i64)>>,
}

impl Slot {
    /// `ops` behind the fence of the lease held, if any.
    pub fn fenced(&self, session_id: Uuid, mut ops: Vec<WriteOp>) -> Vec<WriteOp> {
        let fence = *self.fence.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((owner, epoch)) = fence {
            ops.insert(
                0,
                WriteOp::Fence {
                    session_id,
                    owner,
                    epoch,
                },
            );
        }
        ops
    }
}

/// The live sessions of this process. Cheap to clone.
#[derive(Clone)]
pub struct Sessions {
    ctx: Arc<SessionContext>,
    slots: Arc<Mutex<HashMap<Uuid, Arc<Slot>>>>,
    generations: Arc<AtomicU64>,
    /// Leases this process holds, by session, with their epoch (scale-out only).
    leases: Arc<Mutex<HashMap<Uuid, i64>>>,
}

#[derive(Debug, Clone, Default)]
pub struct NewSession {
    pub system_prompt: Option<String>,
    pub title: Option<String>,
    pub metadata: Option<Value>,
}

#[derive(Debug, Clone)]
pub struct RunRequest {
    pub kind: RunKind,
    /// The user's input; `None` for a resume.
    pub input: Option<String>,
}

/// A run that has started (its start is durable), or the result of a completed session that a
/// resume returned as is.
pub enum RunStarted {
    Started {
        run: RunRecord,
        result: oneshot::Receiver<RunResult>,
    },
    AlreadyCompleted(RunResult),
}

#[derive(Debug, Clone, Serialize)]
pub struct CancelOutcome {
    /// True when a run (or compaction) was in progress and has been asked to stop.
    pub cancelled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<Uuid>,
    pub state: SessionState,
}

impl Sessions {
    pub fn new(ctx: SessionContext) -> Sessions {
        Sessions {
            ctx: Arc::new(ctx),
            slots: Arc::default(),
            generations: Arc::new(AtomicU64::new(1)),
            leases: Arc::default(),
        }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.ctx.store
    }

    pub fn context(&self) -> &Arc<SessionContext> {
        &self.ctx
    }

    /// Creates a session: its system message and its `session.created` event commit together.
    pub async fn create(&self, new: NewSession) -> Result<SessionRecord, SessionError> {
        if self.ctx.shutdown.is_cancelled() {
            return Err(SessionError::ShuttingDown);
        }
        let now = model::now();
        let id = model::new_id();
        let record = SessionRecord {
            id,
            parent_id: None,
            title: new.title.clone(),
            metadata: new
                .metadata
                .unwrap_or_else(|| Value::Object(Default::default())),
            system_prompt: new.system_prompt.clone(),
            state: SessionState::Idle,
            error: None,
            message_count: 1,
            last_seq: 1,
            usage: Usage::default(),
            last_run_id: None,
            created_at: now,
            updated_at: now,
        };
        let prompt = new
            .system_prompt
            .unwrap_or_else(|| self.ctx.settings.system_prompt.clone());
        let system = Message::new(Role::System, prompt);
        let event = new_event(
            id,
            1,
            EventKind::SessionCreated {
                session_id: id,
                title: new.title,
            },
        );
        self.ctx
            .writer
            .commit(
                (id, 0),
                vec![
                    WriteOp::InsertSession(record.clone()),
                    WriteOp::InsertMessage {
                        session_id: id,
                        message: system,
                    },
                    WriteOp::InsertEvent(event),
                ],
                None,
            )
            .await?;
        Ok(record)
    }

    /// Creates a new session holding a copy of `source`'s first `turns` turns (all when
    /// `None`); the copy is made inside the database.
    pub async fn fork(
        &self,
        source: Uuid,
        turns: Option<u64>,
    ) -> Result<SessionRecord, SessionError> {
        if self.ctx.shutdown.is_cancelled() {
            return Err(SessionError::ShuttingDown);
        }
        let parent = self.get(source).await?;
        let mut upto = match turns {
            Some(n) => self.ctx.store.nth_user_message(source, n).await?,
            None => None,
        };
        // An automatic summary written just before turn N+1 belongs to that turn, not to the
        // first N: a fork taken there predates it.
        while let Some(cut) = upto.filter(|&cut| cut > 1) {
            let before = self.ctx.store.messages(source, cut - 2, 1).await?;
            if !before.first().is_some_and(Message::is_summary) {
                break;
            }
            upto = Some(cut - 1);
        }
        let now = model::now();
        let id = model::new_id();
        let record = SessionRecord {
            id,
            parent_id: Some(source),
            state: SessionState::Idle,
            error: None,
            message_count: upto.unwrap_or(parent.message_count),
            last_seq: 2,
            usage: Usage::default(),
            last_run_id: None,
            created_at: now,
            updated_at: now,
            ..parent
        };
        let created = new_event(
            id,
            1,
            EventKind::SessionCreated {
                session_id: id,
                title: record.title.clone(),
            },
        );
        let forked = new_event(
            id,
            2,
            EventKind::SessionForked {
                parent_id: source,
                turns,
            },
        );
        self.ctx
            .writer
            .commit(
                (id, 0),
                vec![
                    WriteOp::InsertSession(record.clone()),
                    WriteOp::CopyMessages {
                        from: source,
                        to: id,
                        upto,
                    },
                    WriteOp::InsertEvent(created),
                    WriteOp::InsertEvent(forked),
                ],
                None,
            )
            .await?;
        // The copy happened inside the database; read the count it produced.
        Ok(self.get(id).await.unwrap_or(record))
    }

    pub async fn get(&self, id: Uuid) -> Result<SessionRecord, SessionError> {
        self.ctx
            .store
            .session(id)
            .await?
            .ok_or(SessionError::NotFound)
    }

    /// Starts a run (or a resume). Of concurrent requests exactly one starts; the others get a
    /// conflict.
    pub async fn run(&self, id: Uuid, request: RunRequest) -> Result<RunStarted, SessionError> {
        if self.ctx.shutdown.is_cancelled() {
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
    pub async fn compact(&self, id: Uuid) -> Result<Option<super::Compacted>, SessionError> {
        self.send(id, |reply| Command::Compact { reply }).await
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
        // Subscribe before reading the backlog so nothing committed in between is missed.
        let live = self.subscribe(id)?;
        if self.ctx.store.session(id).await?.is_none() {
            return Err(SessionError::NotFound);
        }
        Ok(self.stream_from(id, after, live, run))
    }

    /// Subscribes to a session's live events (for a run started right after).
    pub fn subscribe(&self, id: Uuid) -> Result<Subscription, SessionError> {
        let slot = self.slot(id)?;
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
        EventStream::new(self.ctx.store.clone(), id, after, subscription, run)
    }

    /// Marks runs that a dead process left in progress as interrupted: each such session's
    /// actor is started, and it records the interruption. Only sessions stored as active are
    /// read (an indexed query), never the whole table.
    pub async fn recover_interrupted(&self) -> Result<Vec<Uuid>, SessionError> {
        let ids = self.ctx.store.active_sessions().await?;
        let mut interrupted = Vec::new();
        for id in ids {
            if self.take_over(id).await? {
                interrupted.push(id);
            }
        }
        Ok(interrupted)
    }

    /// Resumes interrupted sessions in the background (auto-resume); each resume is an
    /// ordinary run, so clients see it on the event stream.
    pub fn resume_in_background(&self, ids: Vec<Uuid>) {
        for id in ids {
            let sessions = self.clone();
            tokio::spawn(async move {
                let request = RunRequest {
                    kind: RunKind::Resume,
                    input: None,
                };
                match sessions.run(id, request).await {
                    Ok(_) => tracing::info!(session_id = %id, "resuming an interrupted run"),
                    Err(error) => tracing::warn!(session_id = %id, %error, "could not resume"),
                }
            });
        }
    }

    /// Sends a command to the session's actor, starting the actor if needed. An actor that
    /// retires (idle eviction, a failed write) answers `Retired` to what it did not handle;
    /// the command then goes to its successor.
    async fn send<T>(
        &self,
        id: Uuid,
        command: impl Fn(Reply<T>) -> Command,
    ) -> Result<T, SessionError> {
        for _ in 0..8 {
            let (reply, answer) = oneshot::channel();
            let slot = self.slot(id)?;
            if slot.mailbox.send(command(reply)).await.is_err() {
                continue;
            }
            match answer.await {
                Ok(Err(SessionError::Retired)) | Err(_) => continue,
                Ok(result) => return result,
            }
        }
        Err(SessionError::ShuttingDown)
    }

    /// The session's slot, spawning its actor when it has none.
    fn slot(&self, id: Uuid) -> Result<Arc<Slot>, SessionError> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = slots.get(&id) {
            if !slot.mailbox.is_closed() {
                return Ok(slot.clone());
            }
        }
        if self.ctx.shutdown.is_cancelled() {
            return Err(SessionError::ShuttingDown);
        }
        let (mailbox, inbox) = mpsc::channel(MAILBOX);
        // Keep the live channels of an earlier incarnation so its subscribers stay connected.
        let (events, wake) = match slots.get(&id) {
            Some(old) => (old.events.clone(), old.wake.clone()),
            None => (
                broadcast::channel(LIVE_BUFFER).0,
                Arc::new(watch::channel(0).0),
            ),
        };
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            mailbox,
            events,
            wake,
            generation,
            fence: Mutex::new(None),
        });
        slots.insert(id, slot.clone());
        let actor = SessionActor::new(id, self.ctx.clone(), slot.clone(), self.clone());
        self.ctx.tasks.spawn(actor.run(inbox));
        Ok(slot)
    }

    /// Called by an actor about to stop: forgets its slot unless a newer actor replaced it or
    /// subscribers still listen (then the slot stays for them, its mailbox closes, and a new
    /// actor is spawned on demand). With `only_if_unwatched`, nothing happens while someone
    /// listens, and the answer says whether the actor may stop.
    pub(super) fn retire(&self, id: Uuid, generation: u64, only_if_unwatched: bool) -> bool {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let Some(slot) = slots.get(&id) else {
            return true;
        };
        if slot.generation != generation {
            return true;
        }
        let watched = slot.events.receiver_count() > 0;
        if watched && only_if_unwatched {
            return false;
        }
        if !watched {
            slots.remove(&id);
        }
        true
    }

    /// Forgets a deleted session: its subscribers' streams end.
    pub(super) fn forget(&self, id: Uuid, generation: u64) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if slots.get(&id).is_some_and(|s| s.generation == generation) {
            slots.remove(&id);
        }
    }

    /// One step; an LLM step shows the exact request it sent, rebuilt from its projection
    /// descriptor (the stored messages up to `upto`, the system prompt and budget in force).
    pub async fn step_with_request(
        &self,
        id: Uuid,
        step_id: Uuid,
    ) -> Result<Option<Value>, SessionError> {
        let Some(step) = self.ctx.store.step(id, step_id).await? else {
            return Ok(None);
        };
        let mut view = serde_json::to_value(&step).unwrap_or(Value::Null);
        if step.kind == StepKind::Llm {
            let descriptor: LlmRequestDescriptor = serde_json::from_value(step.request.clone())
                .map_err(|e| {
                    StoreError::Corrupt(format!("the request descriptor of step {step_id}: {e}"))
                })?;
            let history = self
                .ctx
                .store
                .messages(id, -1, descriptor.upto as i64)
                .await?;
            let (messages, _) = crate::agent::context::prepare_context(
                &history,
                &descriptor.system_prompt,
                descriptor.budget,
            );
            let tools: Vec<_> = self
                .ctx
                .deps
                .tools
                .schemas()
                .into_iter()
                .filter(|t| descriptor.tools.contains(&t.name))
                .collect();
            view["projection"] = step.request.clone();
            view["request"] = serde_json::json!({
                "model": descriptor.model,
                "messages": messages,
                "tools": tools,
            });
        }
        Ok(Some(view))
    }

    /// Wakes the subscribers of one session (`Some`) or of every session (`None`) so they read
    /// what they miss from the store.
    pub(super) fn wake(&self, id: Option<Uuid>) {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let bump = |slot: &Arc<Slot>| slot.wake.send_modify(|n| *n = n.wrapping_add(1));
        match id {
            Some(id) => slots.get(&id).into_iter().for_each(bump),
            None => slots.values().for_each(bump),
        }
    }

    /// Delivers a command to a session's actor if it lives here, without waiting.
    pub(super) fn notify_actor(&self, id: Uuid, command: Command) {
        let slot = {
            let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.get(&id).cloned()
        };
        if let Some(slot) = slot {
            let _ = slot.mailbox.try_send(command);
        }
    }

    pub(super) fn note_lease(&self, id: Uuid, epoch: Option<i64>) {
        let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        match epoch {
            Some(epoch) => leases.insert(id, epoch),
            None => leases.remove(&id),
        };
    }

    pub(super) fn held_leases(&self) -> HashMap<Uuid, i64> {
        self.leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Takes over a session whose run was interrupted (a dead process or replica left it
    /// running): it is recorded as interrupted, then resumed if auto-resume is on.
    pub async fn take_over(&self, id: Uuid) -> Result<bool, SessionError> {
        let interrupted = self.send(id, |reply| Command::TakeOver { reply }).await?;
        if interrupted && self.ctx.auto_resume {
            self.resume_in_background(vec![id]);
        }
        Ok(interrupted)
    }

    /// Starts the scale-out background tasks (heartbeat, takeover sweep, notifications).
    pub fn start_coordination(&self) {
        if let Some(cluster) = self.ctx.cluster.clone() {
            super::coordination::spawn(self.clone(), cluster);
        }
    }
}

pub(super) fn new_event(session_id: Uuid, seq: i64, kind: EventKind) -> Arc<Event> {
    Arc::new(Event::new(session_id, seq, kind, model::now()))
}
