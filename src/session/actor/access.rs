//! Getting the session before a command works on it: loading it (readers) or claiming it
//! (writers: with replicas, taking its lease first), and recording a run that a dead process
//! left in progress as interrupted.

use std::time::Duration;

use uuid::Uuid;

use super::{SessionActor, Stop};
use crate::model::{self, RunResult, RunStatus, SessionState, INTERRUPTED, STORAGE_FAILED};
use crate::session::command::Reply;
use crate::session::core::Core;
use crate::session::errors::{ConflictKind, SessionError};
use crate::session::lease::Taken;
use crate::session::run::end;
use crate::session::run::Batch;
use crate::session::sessions::Sessions;
use crate::session::waiting::{self, Waiting};
use crate::store::{Cluster, StoreError, WriteOp};

/// Why a command cannot have the session.
pub(super) enum Refusal {
    /// There is no such session (any more): the actor stops.
    Missing,
    /// The request is refused (the session runs on another replica, a read failed).
    Refused(SessionError),
    /// Recording an interrupted run failed: the actor stops.
    WriteFailed(StoreError),
}

impl Refusal {
    /// Tells the command's sender, and says whether the actor goes on.
    pub fn answer<T>(self, session_id: Uuid, reply: Reply<T>) -> Result<(), Stop> {
        match self {
            Refusal::Missing => {
                let _ = reply.send(Err(SessionError::NotFound));
                Err(Stop::Gone)
            }
            Refusal::Refused(error) => {
                let _ = reply.send(Err(error));
                Ok(())
            }
            Refusal::WriteFailed(error) => {
                let stop = Stop::write_failed(session_id, &error);
                let _ = reply.send(Err(SessionError::Store(error)));
                Err(stop)
            }
        }
    }
}

impl From<StoreError> for Refusal {
    fn from(error: StoreError) -> Refusal {
        Refusal::Refused(SessionError::Store(error))
    }
}

impl SessionActor {
    /// The session for reading. Loads it on first use; on a single node, a run stored as in
    /// progress has no owner (this actor is its only one), so its process died: it is
    /// recorded as interrupted.
    pub(super) async fn load(&mut self) -> Result<&mut Core, Refusal> {
        if self.core.is_none() {
            let Some(mut core) = self.read().await? else {
                return Err(Refusal::Missing);
            };
            // With replicas, an active session may be running elsewhere: only the holder of
            // its lease may call it interrupted (see `claim`).
            if self.deps.cluster.is_none() {
                if core.record.state.is_active() {
                    self.recover_interrupted(&mut core)
                        .await
                        .map_err(Refusal::WriteFailed)?;
                }
                self.live.unstall(self.id);
            }
            self.core = Some(core);
        }
        self.core.as_mut().ok_or(Refusal::Missing)
    }

    /// The session for writing: this process must be its writer. On a single node it always
    /// is. With replicas it takes the session's lease (refused while another live replica
    /// holds it); a new epoch means another replica may have written since, so the session is
    /// read again (and what was loaded beside it kept only if its log has not moved, see
    /// [`Core::carrying`]), and a run found in progress was left by a dead replica: it is recorded as
    /// interrupted.
    pub(super) async fn claim(&mut self) -> Result<&mut Core, Refusal> {
        let Some(cluster) = self.deps.cluster.clone() else {
            return self.load().await;
        };
        let Some(epoch) = self.acquire(cluster.as_ref()).await? else {
            if self.deps.store.session(self.id).await?.is_none() {
                return Err(Refusal::Missing);
            }
            return Err(Refusal::Refused(SessionError::Conflict(
                ConflictKind::RunningElsewhere,
            )));
        };
        let taken = self.slot.lease.take(epoch);
        let mut core = match self.core.take() {
            Some(core) if taken == Taken::Kept => core,
            earlier => match self.read().await {
                Ok(Some(core)) => core.carrying(earlier),
                Ok(None) => {
                    self.release().await;
                    return Err(Refusal::Missing);
                }
                Err(error) => return Err(error.into()),
            },
        };
        let recovered = if core.record.state.is_active() {
            self.recover_interrupted(&mut core).await
        } else {
            Ok(())
        };
        self.core = Some(core);
        recovered.map_err(Refusal::WriteFailed)?;
        self.live.unstall(self.id);
        self.core.as_mut().ok_or(Refusal::Missing)
    }

    /// The session for writing, with its full history (see [`Self::claim`]).
    pub(super) async fn claim_with_history(&mut self) -> Result<&mut Core, Refusal> {
        self.claim().await?;
        let id = self.id;
        let store = self.deps.store.clone();
        let core = self.core.as_mut().ok_or(Refusal::Missing)?;
        if !core.history_loaded {
            core.history = store.messages(id, -1, i64::MAX).await?;
            core.cost_usd = crate::session::cost::spent(&*store, id).await?;
            core.history_loaded = true;
        }
        Ok(core)
    }

    /// Reads the session and its newest run from the store (not its history).
    async fn read(&self) -> Result<Option<Core>, StoreError> {
        let store = &self.deps.store;
        let Some(record) = store.session(self.id).await? else {
            return Ok(None);
        };
        let last_run = match record.last_run_id {
            Some(run_id) => store.run(self.id, run_id).await?,
            None => None,
        };
        Ok(Some(Core {
            next_seq: record.last_seq + 1,
            record,
            history: Vec::new(),
            history_loaded: false,
            parked: None,
            artifact_versions: Default::default(),
            cost_usd: None,
            last_result: last_run.as_ref().map(RunResult::from),
            last_run,
        }))
    }

    /// Takes the session's lease. A replica gives a lease back right after the commit that
    /// ends its run, so a refusal while the session is stored as idle is retried briefly.
    async fn acquire(&self, cluster: &dyn Cluster) -> Result<Option<i64>, StoreError> {
        const ATTEMPTS: usize = 10;
        for attempt in 1..=ATTEMPTS {
            let epoch = cluster
                .acquire(self.id, self.deps.replica, self.deps.lease_ttl)
                .await?;
            if epoch.is_some() || attempt == ATTEMPTS {
                return Ok(epoch);
            }
            let active = self
                .deps
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
    pub(super) async fn release(&mut self) {
        let Some(cluster) = self.deps.cluster.clone() else {
            return;
        };
        if self.slot.lease.epoch().is_some() {
            // Forgotten first: a heartbeat that sees the lease gone from the table must not
            // find it still held here, or it would judge it lost and stop the next run.
            self.slot.lease.forget();
            // Through the writer, after this actor's commits, in a transaction it shares with
            // whatever else commits then; on its own if the writer refuses this actor's writes.
            let release = WriteOp::ReleaseLease {
                session_id: self.id,
                owner: self.deps.replica,
            };
            let origin = (self.id, self.slot.generation);
            let given_back = match self.deps.writer.commit(origin, vec![release], None).await {
                Ok(()) => Ok(()),
                Err(_) => cluster.release(self.id, self.deps.replica).await,
            };
            if let Err(error) = given_back {
                tracing::warn!(session_id = %self.id, %error, "could not release a lease; it will expire");
            }
        }
    }

    /// What the session's run waits for, when it waits only for answers (nothing running):
    /// rebuilt from the run's events.
    async fn parked_calls(&self, core: &Core) -> Result<Option<Waiting>, StoreError> {
        if core.record.state != SessionState::WaitingTool {
            return Ok(None);
        }
        let Some(run) = core
            .last_run
            .as_ref()
            .filter(|r| r.status == RunStatus::Running)
        else {
            return Ok(None);
        };
        let waiting = waiting::of_run(self.deps.store.as_ref(), self.id, run.start_seq).await?;
        Ok(waiting.is_parked().then_some(waiting))
    }

    /// Records the run in progress as interrupted (or as failed on storage, when the session's
    /// last actor stopped on a failed write): as at the end of any run, the state change, then
    /// the run's terminal event.
    async fn recover_interrupted(&self, core: &mut Core) -> Result<(), StoreError> {
        if let Some(waiting) = self.parked_calls(core).await? {
            // It waits only for answers, which no restart loses: it goes on waiting.
            tracing::info!(session_id = %self.id, "a run that waits for answers goes on waiting");
            core.parked = Some(waiting);
            return Ok(());
        }
        let cause = if self.live.is_stalled(self.id) {
            STORAGE_FAILED
        } else {
            INTERRUPTED
        };
        let mut batch = Batch::new(self.id);
        batch.state(core, SessionState::Failed, Some(cause.to_string()));
        let open_run = core
            .last_run
            .clone()
            .filter(|run| run.status == RunStatus::Running);
        if let Some(run) = open_run {
            let ending = end::cut_short(run, cause, model::now());
            batch.ops.push(WriteOp::UpsertRun(ending.run.clone()));
            // Its step in flight never finished: it is not left "streaming" for good.
            batch.ops.push(WriteOp::FailOpenSteps {
                session_id: self.id,
                run_id: ending.run.id,
                error: cause.to_string(),
                at: model::now(),
            });
            batch.event(core, ending.terminal);
            core.last_result = Some(RunResult::from(&ending.run));
            core.last_run = Some(ending.run);
        }
        tracing::info!(session_id = %self.id, error = cause, "recorded a run that was cut short");
        self.sink().commit(batch).await?;
        // Whoever reached the session first (a start-up sweep, a takeover, or any request), an
        // interrupted run is resumed when auto-resume is on; a replay's is not, and the
        // replay is recorded as cut short.
        if cause == INTERRUPTED {
            Sessions::from_parts(self.deps.clone(), self.live.clone()).after_interruption(self.id);
        }
        Ok(())
    }
}
