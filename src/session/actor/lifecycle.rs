//! Commands about the session's existence and ownership: delete, take over a run a dead
//! process left behind, and the loss of the lease.

use super::drive::Begin;
use super::{Phase, Stop};
use crate::model::SessionRecord;
use crate::session::actor::access::Refusal;
use crate::session::command::Reply;
use crate::session::errors::SessionError;
use crate::session::run::Batch;
use crate::store::WriteOp;

pub(super) async fn delete(phase: Phase<'_>, reply: Reply<()>) -> Result<(), Stop> {
    let actor = match phase {
        Phase::Busy(activity) => {
            let _ = reply.send(Err(activity.conflict("delete the session")));
            return Ok(());
        }
        Phase::Idle(actor, _) => actor,
    };
    let id = actor.id;
    match actor.claim().await {
        Err(refusal) => return refusal.answer(id, reply),
        Ok(core) if core.parked.is_some() => {
            let _ = reply.send(Err(super::run::approvals_pending()));
            return Ok(());
        }
        Ok(_) => {}
    }
    let batch = Batch::new(id).with(WriteOp::DeleteSession(id));
    match actor.sink().commit(batch).await {
        Ok(()) => {
            let _ = reply.send(Ok(()));
            Err(Stop::Gone)
        }
        Err(error) => {
            let stop = Stop::write_failed(id, &error);
            let _ = reply.send(Err(SessionError::Store(error)));
            Err(stop)
        }
    }
}

/// Sets the session's own cap in money: while nothing runs (a run captures its caps when it
/// starts), written at once with the session.
pub(super) async fn set_cost_cap(
    phase: Phase<'_>,
    max_cost_usd: Option<f64>,
    reply: Reply<SessionRecord>,
) -> Result<(), Stop> {
    let actor = match phase {
        Phase::Busy(activity) => {
            let _ = reply.send(Err(activity.conflict("change max_cost_usd")));
            return Ok(());
        }
        Phase::Idle(actor, _) => actor,
    };
    let id = actor.id;
    let record = match actor.claim().await {
        Err(refusal) => return refusal.answer(id, reply),
        Ok(core) => {
            core.record.options.max_cost_usd = max_cost_usd;
            core.record.updated_at = crate::model::now();
            core.record.clone()
        }
    };
    let batch = Batch::new(id).with(WriteOp::UpdateSession(record.clone()));
    match actor.sink().commit(batch).await {
        Ok(()) => {
            let _ = reply.send(Ok(record));
            Ok(())
        }
        Err(error) => {
            let stop = Stop::write_failed(id, &error);
            let _ = reply.send(Err(SessionError::Store(error)));
            Err(stop)
        }
    }
}

/// Claims the session (recording a run left in progress as interrupted) and answers whether
/// its last run was interrupted, so that it can be resumed.
pub(super) async fn take_over(phase: Phase<'_>, reply: Reply<bool>) -> Result<(), Stop> {
    let (actor, inbox) = match phase {
        // The session runs here: there is nothing to take over.
        Phase::Busy(_) => {
            let _ = reply.send(Ok(false));
            return Ok(());
        }
        Phase::Idle(actor, inbox) => (actor, inbox),
    };
    let id = actor.id;
    match actor.claim().await {
        Ok(core) => {
            let _ = reply.send(Ok(core.record.is_interrupted()));
            // A run that waits for answers: drive it again, so that its waits expire in time.
            if let Some(waiting) = core.parked.take() {
                let mut next = actor.continue_run(Begin::resumed(waiting), inbox).await?;
                while let Some((request, reply)) = next.take() {
                    next = actor.start_run(request, reply, inbox).await?;
                }
            }
            Ok(())
        }
        // Running on another replica: not ours to take over.
        Err(Refusal::Refused(SessionError::Conflict { .. })) => {
            let _ = reply.send(Ok(false));
            Ok(())
        }
        Err(refusal) => refusal.answer(id, reply),
    }
}

/// The heartbeat found the lease gone: whatever runs here stops (its writes would be
/// refused), and the session is reloaded when next claimed.
pub(super) fn lease_lost(phase: Phase<'_>) -> Result<(), Stop> {
    match phase {
        Phase::Busy(activity) => {
            activity.cancel.cancel();
            Err(Stop::LeaseLost)
        }
        Phase::Idle(actor, _) => {
            actor.slot.lease.forget();
            actor.core = None;
            Ok(())
        }
    }
}

/// Claims the session, which records a run its earlier actor left in progress when a write
/// failed (see `access`); a failed write stops this actor too, and the recovery is tried again.
pub(super) async fn recover(phase: Phase<'_>, reply: Reply<()>) -> Result<(), Stop> {
    let actor = match phase {
        // A run is active: the session was recovered already.
        Phase::Busy(_) => {
            let _ = reply.send(Ok(()));
            return Ok(());
        }
        Phase::Idle(actor, _) => actor,
    };
    let id = actor.id;
    match actor.claim().await {
        Ok(_) => {
            let _ = reply.send(Ok(()));
            Ok(())
        }
        Err(refusal) => refusal.answer(id, reply),
    }
}
