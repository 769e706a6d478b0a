//! Cancel: stops the active run or compaction; with nothing active here, asks the replica
//! that runs the session (scale-out), else answers that nothing was running.

use super::drive::Begin;
use super::{Active, Phase, SessionActor, Stop};
use crate::model::SessionState;
use crate::session::command::{CancelOutcome, Reply};
use crate::session::errors::SessionError;

pub(super) async fn handle(phase: Phase<'_>, reply: Reply<CancelOutcome>) -> Result<(), Stop> {
    match phase {
        Phase::Busy(activity) => {
            let already = activity.cancel.is_cancelled();
            activity.cancel.cancel();
            // The state the cancel leads to: a run ends cancelled, a compaction leaves the
            // session as it was.
            let (run_id, state) = match activity.what {
                Active::Run(run_id) => (Some(run_id), SessionState::Cancelled),
                Active::Compaction(state) => (None, state),
            };
            let _ = reply.send(Ok(CancelOutcome {
                cancelled: !already,
                run_id,
                state,
            }));
            Ok(())
        }
        Phase::Idle(actor, inbox) => {
            let id = actor.id;
            let parked = match actor.load().await {
                Ok(core) => core.parked.is_some(),
                Err(refusal) => return refusal.answer(id, reply),
            };
            // A run that waits with nobody driving it is ended here; anything else may run
            // on another replica.
            let parked = match parked {
                true => match actor.claim_with_history().await {
                    Ok(core) => core.parked.take().map(|w| (w, core.record.last_run_id)),
                    Err(refusal) => return refusal.answer(id, reply),
                },
                false => None,
            };
            let Some((waiting, run_id)) = parked else {
                let _ = reply.send(actor.cancel_elsewhere().await);
                return Ok(());
            };
            // A run that waits for answers with nobody driving it: end it here.
            let _ = reply.send(Ok(CancelOutcome {
                cancelled: true,
                run_id,
                state: SessionState::Cancelled,
            }));
            let mut begin = Begin::resumed(waiting);
            begin.cancelled = true;
            actor.continue_run(begin, inbox).await.map(drop)
        }
    }
}

/// Another replica forwards a cancel: it only matters while a run is active here.
pub(super) fn remote(phase: Phase<'_>) -> Result<(), Stop> {
    if let Phase::Busy(activity) = phase {
        activity.cancel.cancel();
    }
    Ok(())
}

impl SessionActor {
    /// Cancel with no run active here: with replicas the run may be active on another one,
    /// which is asked to cancel it.
    async fn cancel_elsewhere(&mut self) -> Result<CancelOutcome, SessionError> {
        let record = match &self.deps.cluster {
            Some(_) => self.deps.store.session(self.id).await?,
            None => self.core.as_ref().map(|c| c.record.clone()),
        };
        let Some(record) = record else {
            return Err(SessionError::NotFound);
        };
        if let (Some(cluster), true) = (&self.deps.cluster, record.state.is_active()) {
            cluster.send_cancel(self.id).await?;
            return Ok(CancelOutcome {
                cancelled: true,
                run_id: record.last_run_id,
                state: SessionState::Cancelled,
            });
        }
        Ok(CancelOutcome {
            cancelled: false,
            run_id: None,
            state: record.state,
        })
    }
}
