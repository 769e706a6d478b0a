//! What a run's journal records of its sub-agents: which child each `task` call started
//! (continuing the one an interrupted attempt started), how each ended, and that a cancel
//! ended those still running.

use uuid::Uuid;

use super::Run;
use crate::model::{EventKind, RunStatus};
use crate::store::{SessionQuery, StoreError};

impl Run<'_> {
    /// Names the child of a `task` call that starts (`subagent.started`), unless the run's
    /// tree has started all the sub-agents it may (the call then fails, naming none).
    pub(in crate::session) async fn child_started(
        &mut self,
        call_id: &str,
    ) -> Result<(), StoreError> {
        let existing = self.child_of_call(call_id).await?;
        if let Some(session_id) = self.calls.children.start(call_id, existing) {
            let started = EventKind::SubagentStarted {
                call_id: call_id.to_string(),
                session_id,
            };
            self.batch.event(self.core, started);
        }
        Ok(())
    }

    /// Records how the child of a finished `task` call ended (`subagent.finished`).
    pub(in crate::session) fn child_finished(&mut self, call_id: &str) {
        if let Some((session_id, status)) = self.calls.children.finish(call_id) {
            let finished = EventKind::SubagentFinished {
                call_id: call_id.to_string(),
                session_id,
                status,
            };
            self.batch.event(self.core, finished);
        }
    }

    /// Records that the sub-agents of calls the cancel cut short were cancelled with them.
    pub(in crate::session) fn settle_children(&mut self) {
        for (call_id, session_id) in self.calls.children.unfinished() {
            let kind = EventKind::SubagentFinished {
                call_id,
                session_id,
                status: RunStatus::Cancelled,
            };
            self.batch.event(self.core, kind);
        }
    }

    /// The child session an earlier attempt of a `task` call started, if any: after an
    /// interruption the call runs again and continues that child.
    async fn child_of_call(&self, call_id: &str) -> Result<Option<Uuid>, StoreError> {
        let query = SessionQuery {
            limit: -1,
            before: None,
            state: None,
            parent_id: Some(self.core.record.id),
            ..SessionQuery::default()
        };
        let children = self.sink.deps.store.sessions(&query).await?;
        Ok(children
            .into_iter()
            .find(|c| c.options.task_call_id.as_deref() == Some(call_id))
            .map(|c| c.id))
    }
}
