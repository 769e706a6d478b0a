//! Reading a session's whole log as of one moment, for views that fold it (a front end's
//! history): the session's record and exactly the events it had then, never anything committed
//! after, and never the whole log in memory at once.

use uuid::Uuid;

use super::{SessionError, Sessions};
use crate::model::{Event, SessionRecord};

/// Events read per query.
const PAGE: i64 = 500;

impl Sessions {
    /// The session as it is now, with each event it has so far handed to `visit` in order. The
    /// record's state tells which run, if any, the events leave in progress.
    pub async fn read_log(
        &self,
        id: Uuid,
        mut visit: impl FnMut(&Event) + Send,
    ) -> Result<SessionRecord, SessionError> {
        let session = self.get(id).await?;
        let mut after = 0;
        while after < session.last_seq {
            let page = self.deps.store.events(id, after, PAGE).await?;
            let Some(last) = page.last() else {
                break;
            };
            after = last.seq;
            for event in page.iter().take_while(|e| e.seq <= session.last_seq) {
                visit(event);
            }
        }
        Ok(session)
    }
}
