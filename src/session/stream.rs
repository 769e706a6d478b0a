//! Replay-then-live event streams: a subscriber gets every committed event once, in order.
//!
//! A stream subscribes to the session's live channel before it reads the backlog from the
//! store, then serves live events, skipping those it has already sent. When it falls behind
//! the live buffer, or sees a gap, it catches up from the store; it never slows the actor.

use std::collections::VecDeque;
use std::sync::Arc;

use futures::Stream;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_stream::wrappers::WatchStream;
use tokio_stream::StreamExt;

use super::Subscription;
use uuid::Uuid;

use crate::model::Event;
use crate::store::{Store, StoreError};

/// Events read from the store per query while catching up.
const PAGE: i64 = 500;

pub struct EventStream {
    store: Arc<dyn Store>,
    session_id: Uuid,
    last_sent: i64,
    live: broadcast::Receiver<Arc<Event>>,
    /// Bumped when events committed elsewhere (another replica) are to be read from the store;
    /// a stream, so that its wait stays registered across events.
    wake: Option<WatchStream<u64>>,
    backlog: VecDeque<Arc<Event>>,
    catching_up: bool,
    /// The live channel closed: what is left comes from the store, then the stream ends.
    closed: bool,
    /// End after this run's terminal event.
    run: Option<Uuid>,
    done: bool,
}

impl EventStream {
    pub fn new(
        store: Arc<dyn Store>,
        session_id: Uuid,
        after: i64,
        subscription: Subscription,
        run: Option<Uuid>,
    ) -> EventStream {
        let Subscription { live, mut wake } = subscription;
        wake.mark_unchanged();
        EventStream {
            store,
            session_id,
            last_sent: after.max(0),
            live,
            wake: Some(WatchStream::from_changes(wake)),
            backlog: VecDeque::new(),
            catching_up: true,
            closed: false,
            run,
            done: false,
        }
    }

    /// The next event in `seq` order, or `None` when the stream is over (the run ended, or
    /// the session was deleted).
    pub async fn next(&mut self) -> Option<Result<Arc<Event>, StoreError>> {
        if self.done {
            return None;
        }
        loop {
            if let Some(event) = self.backlog.pop_front() {
                if event.seq <= self.last_sent {
                    continue;
                }
                return Some(Ok(self.sent(event)));
            }
            if self.catching_up || self.closed {
                match self
                    .store
                    .events(self.session_id, self.last_sent, PAGE)
                    .await
                {
                    Ok(page) => {
                        if (page.len() as i64) < PAGE {
                            self.catching_up = false;
                            if self.closed && page.is_empty() {
                                self.done = true;
                                return None;
                            }
                        }
                        self.backlog.extend(page.into_iter().map(Arc::new));
                        continue;
                    }
                    Err(error) => {
                        self.done = true;
                        return Some(Err(error));
                    }
                }
            }
            let received = tokio::select! {
                received = self.live.recv() => received,
                woken = async {
                    match &mut self.wake {
                        Some(wake) => wake.next().await.is_some(),
                        None => std::future::pending().await,
                    }
                } => {
                    if !woken {
                        // The slot is gone (the session was deleted); the live channel tells.
                        self.wake = None;
                    }
                    self.catching_up = true;
                    continue;
                }
            };
            match received {
                Ok(event) if event.seq <= self.last_sent => continue,
                Ok(event) if event.seq == self.last_sent + 1 => return Some(Ok(self.sent(event))),
                // A gap (events committed before we subscribed) or lag: read them back.
                Ok(_) | Err(RecvError::Lagged(_)) => self.catching_up = true,
                Err(RecvError::Closed) => {
                    // The session is gone (deleted): send what is left in the store, then end.
                    self.closed = true;
                    self.catching_up = true;
                }
            }
        }
    }

    fn sent(&mut self, event: Arc<Event>) -> Arc<Event> {
        self.last_sent = event.seq;
        if let Some(run) = self.run {
            if event.is_terminal() && event.run_id() == Some(run) {
                self.done = true;
            }
        }
        event
    }

    /// Adapts the stream to a `futures::Stream`.
    pub fn into_stream(self) -> impl Stream<Item = Result<Arc<Event>, StoreError>> {
        futures::stream::unfold(
            self,
            |mut s| async move { s.next().await.map(|item| (item, s)) },
        )
    }
}
