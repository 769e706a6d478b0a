//! What the faces read of sessions, through [`Sessions`]: lists, pages of a session's log and
//! records, its artifacts, the run a client follows. Reads need no owner: they go straight to
//! the store, and a session that does not exist is [`SessionError::NotFound`].

use uuid::Uuid;

use super::{ConflictKind, SessionError, Sessions};
use crate::model::{ArtifactRecord, Event, Message, RunRecord, SessionRecord, StepRecord};
use crate::store::{ArtifactQuery, SessionQuery};

/// Events read per query.
const PAGE: i64 = 500;

impl Sessions {
    /// A page of sessions, as `query` asks.
    pub async fn list(&self, query: &SessionQuery) -> Result<Vec<SessionRecord>, SessionError> {
        Ok(self.deps.store.sessions(query).await?)
    }

    /// One run of a session; `None` when the session has no such run.
    pub async fn run_record(
        &self,
        id: Uuid,
        run_id: Uuid,
    ) -> Result<Option<RunRecord>, SessionError> {
        Ok(self.deps.store.run(id, run_id).await?)
    }

    /// The session a run belongs to; `None` when no session has that run.
    pub async fn run_session(&self, run_id: Uuid) -> Result<Option<Uuid>, SessionError> {
        Ok(self.deps.store.run_session(run_id).await?)
    }

    /// The session's run in progress; `None` when it runs nothing. The session must exist.
    pub async fn active_run(&self, id: Uuid) -> Result<Option<RunRecord>, SessionError> {
        let session = self.get(id).await?;
        match session.last_run_id {
            Some(run_id) if session.state.is_active() => self.run_record(id, run_id).await,
            _ => Ok(None),
        }
    }

    /// The run a client's message shows (`message_id` is a run's id), or else the session's
    /// last run: what a client continues. No run at all is a conflict.
    pub async fn run_to_continue(
        &self,
        id: Uuid,
        message_id: &str,
    ) -> Result<RunRecord, SessionError> {
        let session = self.get(id).await?;
        if let Ok(run_id) = Uuid::parse_str(message_id) {
            if let Some(run) = self.run_record(id, run_id).await? {
                return Ok(run);
            }
        }
        let last = match session.last_run_id {
            Some(run_id) => self.run_record(id, run_id).await?,
            None => None,
        };
        last.ok_or(SessionError::Conflict(ConflictKind::NothingToContinue))
    }

    /// Runs of a session in creation order, after `after`, at most `limit`.
    pub async fn runs_page(
        &self,
        id: Uuid,
        after: Option<Uuid>,
        limit: i64,
    ) -> Result<Vec<RunRecord>, SessionError> {
        Ok(self.deps.store.runs(id, after, limit).await?)
    }

    /// Steps of a session in creation order, after `after`, at most `limit`.
    pub async fn steps_page(
        &self,
        id: Uuid,
        after: Option<Uuid>,
        limit: i64,
    ) -> Result<Vec<StepRecord>, SessionError> {
        Ok(self.deps.store.steps(id, after, limit).await?)
    }

    /// Messages of a session with `index > after`, in order, at most `limit`.
    pub async fn messages_page(
        &self,
        id: Uuid,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Message>, SessionError> {
        Ok(self.deps.store.messages(id, after, limit).await?)
    }

    /// Events of a session with `seq > after`, in order, at most `limit`.
    pub async fn events_page(
        &self,
        id: Uuid,
        after: i64,
        limit: i64,
    ) -> Result<Vec<Event>, SessionError> {
        Ok(self.deps.store.events(id, after, limit).await?)
    }

    /// The events of `run` committed so far, from its `agent.started` on.
    pub async fn run_events(&self, id: Uuid, run: &RunRecord) -> Result<Vec<Event>, SessionError> {
        let mut events: Vec<Event> = Vec::new();
        let mut after = run.start_seq - 1;
        loop {
            let page = self.events_page(id, after, PAGE).await?;
            let full = page.len() as i64 == PAGE;
            for event in page {
                after = event.seq;
                let ends = event.is_terminal() && event.run_id() == Some(run.id);
                events.push(event);
                if ends {
                    return Ok(events);
                }
            }
            if !full {
                return Ok(events);
            }
        }
    }

    /// A session's artifacts in creation order, as `query` asks.
    pub async fn artifacts_page(
        &self,
        id: Uuid,
        query: ArtifactQuery,
    ) -> Result<Vec<ArtifactRecord>, SessionError> {
        Ok(self.deps.store.artifacts(id, query).await?)
    }

    /// One artifact of a session; `None` when the session has no such artifact.
    pub async fn artifact(
        &self,
        id: Uuid,
        artifact_id: Uuid,
    ) -> Result<Option<ArtifactRecord>, SessionError> {
        Ok(self.deps.store.artifact(id, artifact_id).await?)
    }

    /// The bytes stored under a sha256 (an artifact's content).
    pub async fn blob(&self, sha256: &str) -> Result<Option<Vec<u8>>, SessionError> {
        Ok(self.deps.store.blob(sha256).await?)
    }

    /// Whether the database can be used now (for readiness).
    pub async fn store_health(&self) -> Result<(), SessionError> {
        Ok(self.deps.store.health().await?)
    }
}
