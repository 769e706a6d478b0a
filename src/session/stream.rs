//! Replay-then-live event streams: a subscriber gets every committed event once, in order.
//!
//! A stream subscribes to the session's live channel before it reads the backlog from the
//! store, then serves live events, skipping those it has already sent. When it falls behind
//! the live buffer, or sees a gap, it catches up from the store; it never slows the actor.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;
use futures::Stream;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_stream::wrappers::WatchStream;
use tokio_stream::StreamExt;

use crate::session::sessions::Subscription;
use uuid::Uuid;

use crate::model::Published;
use crate::store::{Store, StoreError};

/// Events read from the store per query while catching up.
const PAGE: i64 = 500;

pub struct EventStream {
    store: Arc<dyn Store>,
    session_id: Uuid,
    last_sent: i64,
    live: broadcast::Receiver<Arc<Published>>,
    /// Bumped when events committed elsewhere (another replica) are to be read from the store;
    /// a stream, so that its wait stays registered across events, polled only when it woke.
    wake: Option<OnWake<WatchStream<u64>>>,
    backlog: VecDeque<Arc<Published>>,
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
            wake: Some(OnWake::new(WatchStream::from_changes(wake))),
            backlog: VecDeque::new(),
            catching_up: true,
            closed: false,
            run,
            done: false,
        }
    }

    /// The next event in `seq` order, or `None` when the stream is over (the run ended, or
    /// the session was deleted).
    pub async fn next(&mut self) -> Option<Result<Arc<Published>, StoreError>> {
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
                        self.backlog
                            .extend(page.into_iter().map(|e| Arc::new(Published::new(e))));
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

    fn sent(&mut self, event: Arc<Published>) -> Arc<Published> {
        self.last_sent = event.seq;
        if let Some(run) = self.run {
            if event.is_terminal() && event.run_id() == Some(run) {
                self.done = true;
            }
        }
        event
    }

    /// Adapts the stream to a `futures::Stream`.
    pub fn into_stream(self) -> impl Stream<Item = Result<Arc<Published>, StoreError>> {
        futures::stream::unfold(
            self,
            |mut s| async move { s.next().await.map(|item| (item, s)) },
        )
    }
}

/// A stream polled only when its own waker fired (and at its first poll). A stream that waits
/// on a channel shared by many tasks (the heartbeat tick, the shutdown token, a session's
/// wake-ups) takes that channel's lock each time it is polled while it waits; a subscriber's
/// task is polled for every event it sends, so without this every event would take those
/// locks, which every subscriber of the process shares. The cost is one flag and one
/// registration of the task's waker per poll, on memory no other task touches.
pub struct OnWake<S> {
    inner: S,
    signal: Arc<Signal>,
    /// The waker the inner stream is polled with: it raises `signal` and wakes the task.
    waker: Waker,
    /// The inner stream is waiting with `waker` registered.
    waiting: bool,
}

struct Signal {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl<S> OnWake<S> {
    pub fn new(inner: S) -> OnWake<S> {
        let signal = Arc::new(Signal {
            woken: AtomicBool::new(false),
            task: AtomicWaker::new(),
        });
        OnWake {
            inner,
            waker: Waker::from(signal.clone()),
            signal,
            waiting: false,
        }
    }
}

impl<S: Stream + Unpin> Stream for OnWake<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = self.get_mut();
        // Registered first: a wake from now on reaches this task.
        this.signal.task.register(cx.waker());
        if this.waiting && !this.signal.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let mut inner_cx = Context::from_waker(&this.waker);
        let polled = Pin::new(&mut this.inner).poll_next(&mut inner_cx);
        this.waiting = polled.is_pending();
        polled
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Counts its polls; ready with its item once `ready` is set.
    struct Probe {
        polls: Arc<AtomicUsize>,
        waker: Arc<std::sync::Mutex<Option<Waker>>>,
        ready: Arc<AtomicBool>,
    }

    impl Stream for Probe {
        type Item = u32;
        fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<u32>> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            if self.ready.swap(false, Ordering::SeqCst) {
                return Poll::Ready(Some(7));
            }
            *self.waker.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    /// A waker that counts its wakes.
    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_waiting_stream_is_polled_again_only_after_its_own_wake() {
        let polls = Arc::new(AtomicUsize::new(0));
        let inner_waker = Arc::new(std::sync::Mutex::new(None));
        let ready = Arc::new(AtomicBool::new(false));
        let mut gated = OnWake::new(Probe {
            polls: polls.clone(),
            waker: inner_waker.clone(),
            ready: ready.clone(),
        });
        let task = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(task.clone());
        let mut cx = Context::from_waker(&waker);

        assert!(Pin::new(&mut gated).poll_next(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 1, "the first poll reaches it");
        // Polled for other reasons (the task's other work): the inner stream is left alone.
        for _ in 0..5 {
            assert!(Pin::new(&mut gated).poll_next(&mut cx).is_pending());
        }
        assert_eq!(polls.load(Ordering::SeqCst), 1);
        assert_eq!(task.0.load(Ordering::SeqCst), 0);

        // Its own wake reaches the task, and the next poll reaches the stream.
        ready.store(true, Ordering::SeqCst);
        inner_waker
            .lock()
            .unwrap()
            .take()
            .expect("registered")
            .wake();
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "the task is woken");
        assert_eq!(
            Pin::new(&mut gated).poll_next(&mut cx),
            Poll::Ready(Some(7))
        );
        assert_eq!(polls.load(Ordering::SeqCst), 2);
        // After an item, the next poll reaches it again (it may have more).
        assert!(Pin::new(&mut gated).poll_next(&mut cx).is_pending());
        assert_eq!(polls.load(Ordering::SeqCst), 3);
    }
}
