//! Reading a session's whole log as of one moment, for views that fold it (a front end's
//! history): the session's record and exactly the events it had then, never anything committed
//! after, and never the whole log in memory at once.
//!
//! A fork's log starts with `session.forked`: the turns it copied happened in its parent's log
//! (and a fork of a fork's in its grandparent's), so those come first, up to where each fork
//! was taken: no event after the fork's creation, and no turn from the first one it did not
//! copy. A parent that was deleted has no log left: its copied turns are not there.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::model::{Event, EventKind, SessionRecord};
use crate::session::errors::SessionError;
use crate::session::sessions::Sessions;

/// Events read per query.
const PAGE: i64 = 500;

/// How much of a session's log belongs to the history being read.
#[derive(Debug, Clone, Copy)]
struct Cut {
    /// The last event read (the session's own log as of the read).
    seq: i64,
    /// No event after this instant (when the fork that copied these turns was made).
    until: Option<DateTime<Utc>>,
    /// No turn from the user message of this index on (the first turn the fork left out).
    before_message: Option<i64>,
}

impl Cut {
    /// The event is the user message of the first turn cut away.
    fn cuts_turn(&self, event: &Event) -> bool {
        match (&event.kind, self.before_message) {
            (EventKind::UserMessage { message, .. }, Some(before)) => message.index >= before,
            _ => false,
        }
    }

    /// This cut, further cut where `fork` was taken from a log: at its creation, and, when it
    /// copied `turns`, before the parent's turn of that number.
    fn at_fork(self, fork: &SessionRecord, before_message: Option<i64>) -> Cut {
        Cut {
            seq: i64::MAX,
            until: Some(
                self.until
                    .map_or(fork.created_at, |t| t.min(fork.created_at)),
            ),
            before_message: match (self.before_message, before_message) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
        }
    }
}

impl Sessions {
    /// The session as it is now, with each event of its history so far handed to `visit` in
    /// order (a fork's copied turns first, from its ancestors' logs). The record's state tells
    /// which run, if any, the events leave in progress.
    pub async fn read_log(
        &self,
        id: Uuid,
        mut visit: impl FnMut(&Event) + Send,
    ) -> Result<SessionRecord, SessionError> {
        let session = self.get(id).await?;
        let own = Cut {
            seq: session.last_seq,
            until: None,
            before_message: None,
        };
        for (log, cut) in self.lineage(&session, own).await? {
            self.read_cut(log, cut, &mut visit).await?;
        }
        Ok(session)
    }

    /// The logs the session's history is made of, oldest first, each with its cut.
    async fn lineage(
        &self,
        session: &SessionRecord,
        own: Cut,
    ) -> Result<Vec<(Uuid, Cut)>, SessionError> {
        let mut logs = vec![(session.id, own)];
        let mut fork = session.clone();
        let mut cut = own;
        while let Some((parent, turns)) = self.forked_from(fork.id).await? {
            let before_message = match turns {
                Some(n) => self.deps.store.nth_user_message(parent, n).await?,
                None => None,
            };
            cut = cut.at_fork(&fork, before_message);
            logs.push((parent, cut));
            match self.deps.store.session(parent).await? {
                Some(record) => fork = record,
                None => break,
            }
        }
        logs.reverse();
        Ok(logs)
    }

    /// The session a fork was taken from, and how many turns it copied (all: `None`).
    async fn forked_from(&self, id: Uuid) -> Result<Option<(Uuid, Option<u64>)>, SessionError> {
        let head = self.deps.store.events(id, 0, 2).await?;
        Ok(head.iter().find_map(|event| match event.kind {
            EventKind::SessionForked { parent_id, turns } => Some((parent_id, turns)),
            _ => None,
        }))
    }

    /// Hands `visit` the events of one log within `cut`. A run's `agent.started` (and the state
    /// change with it) is held until the next event shows the run belongs (its user message is
    /// not cut away); a run the read ends on (the session's run in progress) keeps it.
    async fn read_cut(
        &self,
        id: Uuid,
        cut: Cut,
        visit: &mut (impl FnMut(&Event) + Send),
    ) -> Result<(), SessionError> {
        let mut after = 0;
        let mut held: Vec<Event> = Vec::new();
        'pages: while after < cut.seq {
            let page = self.deps.store.events(id, after, PAGE).await?;
            let Some(last) = page.last() else {
                break;
            };
            after = last.seq;
            for event in page {
                if cut.cuts_turn(&event) {
                    return Ok(());
                }
                if event.seq > cut.seq || cut.until.is_some_and(|t| event.created_at > t) {
                    break 'pages;
                }
                // A run's opening events are held until the run shows it belongs.
                let starts = matches!(event.kind, EventKind::AgentStarted { .. });
                let changes = matches!(event.kind, EventKind::StateChanged { .. });
                if starts || (changes && !held.is_empty()) {
                    held.push(event);
                    continue;
                }
                held.drain(..).for_each(|e| visit(&e));
                visit(&event);
            }
        }
        held.iter().for_each(visit);
        Ok(())
    }
}
