//! How a session writes: a [`Batch`] gathers the ops and events of one commit (keeping the
//! actor's in-memory view of the session in step), and a [`Sink`] hands it to the group-commit
//! writer behind the session's lease.

use std::sync::Arc;

use tokio::sync::oneshot;
use uuid::Uuid;

use crate::agent::compaction::Summary;
use crate::model::{self, Checkpoint, Event, EventKind, Message, Published, Role, SessionState};
use crate::session::core::Core;
use crate::session::deps::SessionDeps;
use crate::session::live::Slot;
use crate::store::writer::Commit;
use crate::store::{SessionProgress, StoreError, StoreResult, WriteOp};

/// Ops and events being gathered for one commit.
pub(in crate::session) struct Batch {
    session_id: Uuid,
    pub ops: Vec<WriteOp>,
    /// Told the outcome of the commit these ops go in: somebody waits for them to be durable
    /// (a run's client, for the run's start) while the actor goes on.
    pub told: Option<oneshot::Sender<StoreResult<()>>>,
}

impl Batch {
    pub fn new(session_id: Uuid) -> Batch {
        Batch {
            session_id,
            ops: Vec::new(),
            told: None,
        }
    }

    /// A batch whose commit's outcome is told to the receiver returned with it.
    pub fn told(session_id: Uuid) -> (Batch, oneshot::Receiver<StoreResult<()>>) {
        let (tell, told) = oneshot::channel();
        let batch = Batch {
            told: Some(tell),
            ..Batch::new(session_id)
        };
        (batch, told)
    }

    pub fn with(mut self, op: WriteOp) -> Batch {
        self.ops.push(op);
        self
    }

    /// Appends the next event of the session.
    pub fn event(&mut self, core: &mut Core, kind: EventKind) {
        match &kind {
            EventKind::ToolApprovalRequested { .. } => crate::metrics::approvals_pending(1),
            EventKind::ToolApprovalResolved { .. } => crate::metrics::approvals_pending(-1),
            _ => {}
        }
        let event = Published::new(Event::new(
            self.session_id,
            core.next_seq,
            kind,
            model::now(),
        ));
        // Rendered here, beside the other actors, rather than on the writer's thread, which
        // every commit waits for: the store and every subscriber use this JSON.
        event.render();
        core.next_seq += 1;
        core.record.last_seq = event.seq;
        self.ops.push(WriteOp::InsertEvent(Arc::new(event)));
    }

    /// Appends a message to the history; returns it with its index.
    pub fn message(&mut self, core: &mut Core, mut message: Message) -> Message {
        message.index = core.record.message_count;
        core.record.message_count += 1;
        if core.history_loaded {
            core.history.push(message.clone());
        }
        self.ops.push(WriteOp::InsertMessage {
            session_id: self.session_id,
            message: message.clone(),
        });
        message
    }

    /// Changes the session's state (with its `session.state` event) and writes the row.
    pub fn state(&mut self, core: &mut Core, to: SessionState, error: Option<String>) {
        let from = core.record.state;
        core.record.state = to;
        core.record.error = error;
        core.record.updated_at = model::now();
        if from != to {
            self.event(core, EventKind::StateChanged { from, to });
        }
        self.progress(core);
    }

    /// Counts a model call's usage for the session and writes it.
    pub fn usage(&mut self, core: &mut Core, usage: model::Usage) {
        core.record.usage.add(usage);
        core.record.updated_at = model::now();
        self.progress(core);
    }

    /// Writes what runs change of the session's row (see [`SessionProgress`]).
    fn progress(&mut self, core: &Core) {
        self.ops
            .push(WriteOp::UpdateProgress(SessionProgress::of(&core.record)));
    }

    pub fn checkpoint(&mut self, core: &mut Core, run_id: Uuid, step_id: Option<Uuid>) {
        let checkpoint_id = model::new_id();
        self.event(
            core,
            EventKind::Checkpoint {
                checkpoint_id,
                step_id,
            },
        );
        self.ops.push(WriteOp::InsertCheckpoint(Checkpoint {
            id: checkpoint_id,
            session_id: self.session_id,
            run_id,
            step_id,
            message_count: core.record.message_count,
            seq: core.record.last_seq,
            created_at: model::now(),
        }));
    }

    /// Appends a compaction summary to the history with its event; its usage counts for the
    /// session.
    pub fn summary(&mut self, core: &mut Core, summary: &Summary, auto: bool) {
        self.message(core, Message::new(Role::System, summary.content.clone()));
        self.usage(core, summary.usage);
        let session_id = self.session_id;
        self.event(
            core,
            EventKind::ContextCompacted {
                session_id,
                turns: summary.turns,
                chars: summary.chars,
                auto,
            },
        );
    }
}

/// Where a session's commits go: the writer, behind the session's lease, published to its
/// subscribers once durable.
#[derive(Clone, Copy)]
pub(in crate::session) struct Sink<'a> {
    pub deps: &'a SessionDeps,
    pub slot: &'a Slot,
}

impl Sink<'_> {
    fn fenced(&self, batch: Batch) -> Vec<WriteOp> {
        self.slot
            .fenced(batch.session_id, self.deps.replica, batch.ops)
    }

    /// Commits a batch and waits until it is durable (its events are then published).
    pub async fn commit(&self, mut batch: Batch) -> Result<(), StoreError> {
        let told = batch.told.take();
        let result = if batch.ops.is_empty() {
            Ok(())
        } else {
            let origin = (batch.session_id, self.slot.generation);
            let ops = self.fenced(batch);
            let publish = Some(self.slot.events.clone());
            self.deps.writer.commit(origin, ops, publish).await
        };
        if let Some(told) = told {
            let _ = told.send(result.as_ref().map(|_| ()).map_err(StoreError::retold));
        }
        result
    }

    /// Queues a batch without waiting: order is kept by the writer, and a failure shows at the
    /// next commit.
    pub async fn queue(&self, mut batch: Batch) -> Result<(), StoreError> {
        if batch.ops.is_empty() {
            if let Some(told) = batch.told.take() {
                let _ = told.send(Ok(()));
            }
            return Ok(());
        }
        let origin = (batch.session_id, self.slot.generation);
        let commit = Commit {
            origin,
            ack: batch.told.take(),
            ops: self.fenced(batch),
            publish: Some(self.slot.events.clone()),
        };
        self.deps.writer.submit(commit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::core::fixture;

    fn events(batch: &Batch) -> Vec<(i64, &'static str)> {
        batch
            .ops
            .iter()
            .filter_map(|op| match op {
                WriteOp::InsertEvent(event) => Some((event.seq, event.type_name())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn events_take_the_next_seqs_and_the_record_follows() {
        let mut core = fixture::core();
        let mut batch = Batch::new(core.record.id);
        batch.event(
            &mut core,
            EventKind::StateChanged {
                from: SessionState::Idle,
                to: SessionState::Running,
            },
        );
        batch.checkpoint(&mut core, model::new_id(), None);
        assert_eq!(
            events(&batch),
            vec![(2, "session.state"), (3, "storage.checkpoint")]
        );
        assert_eq!((core.next_seq, core.record.last_seq), (4, 3));
        let checkpoint = batch.ops.iter().find_map(|op| match op {
            WriteOp::InsertCheckpoint(checkpoint) => Some(checkpoint),
            _ => None,
        });
        let checkpoint = checkpoint.expect("the checkpoint's row");
        assert_eq!((checkpoint.seq, checkpoint.message_count), (3, 1));
    }

    #[test]
    fn a_message_takes_the_next_index_and_joins_a_loaded_history() {
        let mut core = fixture::core();
        let mut batch = Batch::new(core.record.id);
        let message = batch.message(&mut core, Message::new(Role::User, "hi"));
        assert_eq!(message.index, 1);
        assert_eq!(core.record.message_count, 2);
        assert_eq!(core.history.last().map(|m| m.content.as_str()), Some("hi"));
        core.history_loaded = false;
        let message = batch.message(&mut core, Message::new(Role::User, "again"));
        assert_eq!(message.index, 2);
        assert_eq!(core.history.len(), 2, "an unread history is not added to");
        let inserted = batch
            .ops
            .iter()
            .filter(|op| matches!(op, WriteOp::InsertMessage { .. }))
            .count();
        assert_eq!(inserted, 2);
    }

    #[test]
    fn a_state_change_has_its_event_and_the_same_state_again_only_its_row() {
        let mut core = fixture::core();
        let mut batch = Batch::new(core.record.id);
        batch.state(&mut core, SessionState::Running, None);
        batch.state(&mut core, SessionState::Running, None);
        batch.state(&mut core, SessionState::Failed, Some("boom".into()));
        assert_eq!(events(&batch).len(), 2);
        let rows = batch
            .ops
            .iter()
            .filter(|op| matches!(op, WriteOp::UpdateProgress(_)))
            .count();
        assert_eq!(rows, 3);
        assert_eq!(core.record.state, SessionState::Failed);
        assert_eq!(core.record.error.as_deref(), Some("boom"));
    }

    #[test]
    fn usage_adds_up_for_the_session() {
        let mut core = fixture::core();
        let mut batch = Batch::new(core.record.id).with(WriteOp::DeleteSession(core.record.id));
        let usage = model::Usage {
            input_tokens: 3,
            output_tokens: 4,
        };
        batch.usage(&mut core, usage);
        batch.usage(&mut core, usage);
        assert_eq!(core.record.usage.input_tokens, 6);
        assert_eq!(core.record.usage.output_tokens, 8);
        assert_eq!(batch.ops.len(), 3);
    }
}
