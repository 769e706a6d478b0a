//! Manual compaction: summarises every turn since the last summary and appends the summary at
//! the end of the history. Cancel aborts it and nothing is written.

use super::drive::serve_while;
use super::{Active, Activity, Phase, SessionActor, Stop};
use crate::agent::compaction::{self, CompactError};
use crate::model::EventKind;
use crate::session::command::{Compacted, Reply};
use crate::session::errors::{ConflictKind, SessionError};
use crate::session::live::Inbox;
use crate::session::run::Batch;

pub(super) async fn handle(phase: Phase<'_>, reply: Reply<Option<Compacted>>) -> Result<(), Stop> {
    match phase {
        Phase::Busy(activity) => {
            let _ = reply.send(Err(activity.conflict("compact")));
            Ok(())
        }
        Phase::Idle(actor, inbox) => actor.compact(reply, inbox).await,
    }
}

impl SessionActor {
    async fn compact(
        &mut self,
        reply: Reply<Option<Compacted>>,
        inbox: &mut Inbox,
    ) -> Result<(), Stop> {
        let id = self.id;
        if let Err(refusal) = self.claim_with_history().await {
            return refusal.answer(id, reply);
        }
        let core = self.core.as_mut().ok_or(Stop::Gone)?;
        if core.parked.is_some() {
            let _ = reply.send(Err(super::run::approvals_pending()));
            return Ok(());
        }
        if compaction::compactable_turns(&core.history) == 0 {
            let _ = reply.send(Ok(None));
            return Ok(());
        }
        let activity = Activity {
            cancel: self.deps.shutdown.child_token(),
            what: Active::Compaction(core.record.state),
            driven: None,
            earlier: super::approvals::EarlierCalls {
                store: self.deps.store.clone(),
                session_id: id,
                before: i64::MAX,
            },
        };
        let sink = crate::session::run::Sink {
            deps: &self.deps,
            slot: &self.slot,
        };
        let summary = compaction::summarize(&self.deps.agent, &core.history, &activity.cancel);
        let (outcome, lease_lost) = serve_while(summary, &activity, inbox).await;
        if lease_lost {
            let _ = reply.send(Err(SessionError::Conflict(ConflictKind::LeaseLost)));
            return Err(Stop::LeaseLost);
        }
        let mut batch = Batch::new(id);
        let answer = match outcome {
            Ok(summary) => {
                batch.summary(core, &summary, /* auto */ false);
                Ok(Some(Compacted {
                    turns: summary.turns,
                    chars: summary.chars,
                }))
            }
            Err(CompactError::Cancelled) => {
                Err(SessionError::Conflict(ConflictKind::CompactionCancelled))
            }
            Err(CompactError::Model(error)) => {
                batch.event(
                    core,
                    EventKind::ContextCompactFailed {
                        session_id: id,
                        error: error.to_string(),
                    },
                );
                Err(SessionError::Upstream(error))
            }
        };
        match sink.commit(batch).await {
            Ok(()) => {
                let _ = reply.send(answer);
                Ok(())
            }
            Err(error) => {
                let stop = Stop::write_failed(id, &error);
                let _ = reply.send(Err(SessionError::Store(error)));
                Err(stop)
            }
        }
    }
}
