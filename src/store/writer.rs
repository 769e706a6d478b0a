//! The group-commit writer: one task per process applies the writes of every session in
//! batches, one transaction per batch, then publishes the committed events in order.
//!
//! Actors hand a [`Commit`] to the writer and may go on producing; events reach subscribers
//! only after their transaction has committed (publish-after-commit), and the ack tells the
//! actor its writes are durable. If a commit fails, its ack carries the store's own error
//! (a batch that fails is retried commit by commit to find which one it was), and later
//! commits from the same actor are refused with [`StoreError::Poisoned`] until that actor is
//! replaced, so a failed write can never leave a gap in `seq`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::{Store, StoreError, StoreResult, WriteOp};
use crate::model::Published;

/// Who wrote a commit: a session and the incarnation of its actor.
pub type Origin = (Uuid, u64);

pub struct Commit {
    pub origin: Origin,
    pub ops: Vec<WriteOp>,
    /// Where the committed events are published.
    pub publish: Option<broadcast::Sender<Arc<Published>>>,
    pub ack: Option<oneshot::Sender<StoreResult<()>>>,
}

/// What the writer's queue carries.
enum Queued {
    Commit(Commit),
    /// The actor of this origin has stopped: after its last commit, its failure (if any) is
    /// forgotten, so that the set of refused origins does not grow with every stalled actor.
    Retire(Origin),
}

impl Queued {
    fn ops(&self) -> usize {
        match self {
            Queued::Commit(commit) => commit.ops.len(),
            Queued::Retire(_) => 0,
        }
    }
}

/// Ops per transaction at most; a larger backlog is split over several transactions.
const MAX_BATCH_OPS: usize = 4096;
/// Commits queued at most; further submitters wait (backpressure on the producers).
const QUEUE: usize = 8192;

#[derive(Clone)]
pub struct Writer {
    tx: mpsc::Sender<Queued>,
    shared: Arc<Shared>,
}

/// What the writer task and its handles share.
#[derive(Default)]
struct Shared {
    /// Origins whose earlier commit failed, with why: their later commits are refused.
    poisoned: Mutex<HashMap<Origin, String>>,
    /// Why the newest commit failed, until a later one succeeds.
    failing: Mutex<Option<String>>,
}

impl Shared {
    fn poisoned(&self) -> MutexGuard<'_, HashMap<Origin, String>> {
        // A set of plain ids: a panic while it is held cannot leave it torn.
        self.poisoned.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn failing(&self) -> MutexGuard<'_, Option<String>> {
        self.failing.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Writer {
    /// Starts the writer task. It ends when every `Writer` clone is dropped and the queue is
    /// drained, so awaiting the handle at shutdown flushes every accepted write.
    pub fn spawn(store: Arc<dyn Store>) -> (Writer, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let shared = Arc::new(Shared::default());
        let handle = tokio::spawn(run(store, rx, shared.clone()));
        (Writer { tx, shared }, handle)
    }

    /// Why the store refuses writes: the error of the newest commit, while no later commit
    /// has succeeded. `None` when writes succeed.
    pub fn failing(&self) -> Option<String> {
        self.shared.failing().clone()
    }

    /// Queues a commit; returns once it is queued (not committed). A commit of an origin whose
    /// earlier commit failed is refused at once, so a producer learns of the failure at its
    /// next write even when it does not wait for acks.
    pub async fn submit(&self, commit: Commit) -> StoreResult<()> {
        if let Some(cause) = self.shared.poisoned().get(&commit.origin) {
            return Err(StoreError::Poisoned(cause.clone()));
        }
        self.tx
            .send(Queued::Commit(commit))
            .await
            .map_err(|_| StoreError::WriterGone)
    }

    /// Says that the actor of `origin` has stopped and writes no more: once its commits
    /// queued so far are done, the writer forgets whether one of them failed.
    pub async fn retire(&self, origin: Origin) {
        // A writer that is gone remembers nothing.
        let _ = self.tx.send(Queued::Retire(origin)).await;
    }

    /// Commits `ops` and waits until they are durable, publishing events to `publish`.
    pub async fn commit(
        &self,
        origin: Origin,
        ops: Vec<WriteOp>,
        publish: Option<broadcast::Sender<Arc<Published>>>,
    ) -> StoreResult<()> {
        let (ack, done) = oneshot::channel();
        self.submit(Commit {
            origin,
            ops,
            publish,
            ack: Some(ack),
        })
        .await?;
        done.await.map_err(|_| StoreError::WriterGone)?
    }
}

async fn run(store: Arc<dyn Store>, mut rx: mpsc::Receiver<Queued>, shared: Arc<Shared>) {
    let mut pending: VecDeque<Queued> = VecDeque::new();
    // The commits of the transaction that committed last, not yet acked: they are acked and
    // published while the next transaction runs.
    let mut committed: Vec<Commit> = Vec::new();
    loop {
        drain(&mut rx, &mut pending);
        if pending.is_empty() {
            // Nothing to overlap with: ack what is done before waiting for more.
            committed.drain(..).for_each(|c| finish(c, Ok(())));
            match rx.recv().await {
                Some(first) => pending.push_back(first),
                None => break,
            }
            // Let producers that are running right now (an actor mid-stream) add to this
            // batch: fewer, larger transactions for the same latency.
            tokio::task::yield_now().await;
            drain(&mut rx, &mut pending);
        }
        let mut accepted = next_batch(&mut pending, &shared);
        if accepted.is_empty() {
            continue;
        }
        let started = std::time::Instant::now();
        let groups: Vec<Vec<WriteOp>> = accepted
            .iter_mut()
            .map(|c| std::mem::take(&mut c.ops))
            .collect();
        if store.commits_on_caller() {
            // Nothing to overlap: the previous transaction's commits are acked first.
            committed.drain(..).for_each(|c| finish(c, Ok(())));
        }
        let commit = store.commit_owned(groups);
        tokio::pin!(commit);
        // Started first (a PostgreSQL commit has then sent its first statement, a SQLite one
        // under `power` is on its blocking thread), then the previous transaction's commits
        // are acked and published while it runs (a commit on the caller's thread has already
        // ended, and they were acked above).
        let polled = futures::poll!(commit.as_mut());
        committed.drain(..).for_each(|c| finish(c, Ok(())));
        let (groups, result) = match polled {
            std::task::Poll::Ready(done) => done,
            std::task::Poll::Pending => commit.await,
        };
        crate::metrics::store_commit(accepted.len(), started.elapsed());
        // The store hands back fewer groups only when its thread died with them.
        let lost = groups.len() != accepted.len();
        for (commit, ops) in accepted.iter_mut().zip(groups) {
            commit.ops = ops;
        }
        match result {
            Ok(()) => {
                *shared.failing() = None;
                committed = accepted;
            }
            Err(error) if lost => lost_batch(&shared, accepted, &error),
            Err(error) => failed(&*store, &shared, accepted, error).await,
        }
    }
    committed.drain(..).for_each(|c| finish(c, Ok(())));
}

/// Moves every commit already queued into `pending`, without waiting.
fn drain(rx: &mut mpsc::Receiver<Queued>, pending: &mut VecDeque<Queued>) {
    let mut ops: usize = pending.iter().map(Queued::ops).sum();
    while ops < MAX_BATCH_OPS {
        match rx.try_recv() {
            Ok(next) => {
                ops += next.ops();
                pending.push_back(next);
            }
            Err(_) => break,
        }
    }
}

/// Takes the next transaction's commits (up to [`MAX_BATCH_OPS`] ops, at least one commit)
/// from `pending`, refusing those of actors whose earlier commit failed. A retired origin is
/// forgotten here: every commit it queued before is done (the transactions before this one
/// have ended, and the queue keeps its order).
fn next_batch(pending: &mut VecDeque<Queued>, shared: &Shared) -> Vec<Commit> {
    let mut accepted = Vec::new();
    let mut ops = 0;
    while let Some(next) = pending.front() {
        if ops > 0 && ops + next.ops() > MAX_BATCH_OPS {
            break;
        }
        let commit = match pending.pop_front() {
            Some(Queued::Commit(commit)) => commit,
            // Its last commits are in this batch: it is forgotten after the batch.
            Some(Queued::Retire(origin))
                if accepted.iter().any(|c: &Commit| c.origin == origin) =>
            {
                pending.push_front(Queued::Retire(origin));
                break;
            }
            Some(Queued::Retire(origin)) => {
                shared.poisoned().remove(&origin);
                continue;
            }
            None => break,
        };
        let cause = shared.poisoned().get(&commit.origin).cloned();
        match cause {
            Some(cause) => finish(commit, Err(StoreError::Poisoned(cause))),
            None => {
                ops += commit.ops.len();
                accepted.push(commit);
            }
        }
    }
    accepted
}

/// A transaction failed and its ops are gone with the thread that ran it (it was rolled
/// back): nothing of it can be retried, so every commit in it fails.
fn lost_batch(shared: &Shared, accepted: Vec<Commit>, error: &StoreError) {
    let cause = error.to_string();
    tracing::error!(error = %cause, "commit failed");
    *shared.failing() = Some(cause.clone());
    for commit in accepted {
        shared.poisoned().insert(commit.origin, cause.clone());
        finish(commit, Err(StoreError::Write(cause.clone())));
    }
}

/// A transaction failed: with one commit, that commit gets the store's error; with several,
/// each is committed on its own so that one bad write fails only its actor.
async fn failed(store: &dyn Store, shared: &Shared, accepted: Vec<Commit>, error: StoreError) {
    if accepted.len() == 1 {
        tracing::error!(%error, "commit failed");
        *shared.failing() = Some(error.to_string());
        if let Some(commit) = accepted.into_iter().next() {
            shared.poisoned().insert(commit.origin, error.to_string());
            // Its one waiter gets the store's own error, variant and all.
            finish(commit, Err(error));
        }
        return;
    }
    tracing::warn!(%error, "batch commit failed; retrying commits one by one");
    for commit in accepted {
        let cause = shared.poisoned().get(&commit.origin).cloned();
        if let Some(cause) = cause {
            finish(commit, Err(StoreError::Poisoned(cause)));
            continue;
        }
        let result = store.commit(&[commit.ops.as_slice()]).await;
        match &result {
            Ok(()) => *shared.failing() = None,
            Err(error) => {
                tracing::error!(%error, session_id = %commit.origin.0, "commit failed");
                *shared.failing() = Some(error.to_string());
                shared.poisoned().insert(commit.origin, error.to_string());
            }
        }
        finish(commit, result);
    }
}

/// Acks a commit and, when it succeeded, publishes its events in order.
fn finish(commit: Commit, result: StoreResult<()>) {
    if result.is_ok() {
        if let Some(publish) = &commit.publish {
            for op in &commit.ops {
                if let WriteOp::InsertEvent(event) = op {
                    // No subscribers is fine: the event is in the database for later readers.
                    let _ = publish.send(event.clone());
                }
            }
        }
    }
    if let Some(ack) = commit.ack {
        // The actor may have gone away (cancelled); the write stands either way.
        let _ = ack.send(result);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use async_trait::async_trait;
    use chrono::{DateTime, Utc};

    use super::*;
    use crate::model::{
        Checkpoint, Event, EventKind, Message, RunRecord, SessionRecord, SessionState, StepRecord,
    };
    use crate::store::{SessionHistory, SessionQuery};

    /// A store that refuses (as fenced) every transaction that deletes `refused`, and records
    /// how many groups each transaction it was asked for held.
    struct FakeStore {
        refused: Uuid,
        transactions: Mutex<Vec<usize>>,
    }

    #[async_trait]
    impl SessionHistory for FakeStore {
        async fn artifacts(
            &self,
            _: Uuid,
            _: crate::store::ArtifactQuery,
        ) -> StoreResult<Vec<crate::model::ArtifactRecord>> {
            Ok(Vec::new())
        }
        async fn events(&self, _: Uuid, _: i64, _: i64) -> StoreResult<Vec<Event>> {
            Ok(Vec::new())
        }
        async fn messages(&self, _: Uuid, _: i64, _: i64) -> StoreResult<Vec<Message>> {
            Ok(Vec::new())
        }
        async fn steps(&self, _: Uuid, _: Option<Uuid>, _: i64) -> StoreResult<Vec<StepRecord>> {
            Ok(Vec::new())
        }
        async fn step(&self, _: Uuid, _: Uuid) -> StoreResult<Option<StepRecord>> {
            Ok(None)
        }
        async fn runs(&self, _: Uuid, _: Option<Uuid>, _: i64) -> StoreResult<Vec<RunRecord>> {
            Ok(Vec::new())
        }
        async fn run(&self, _: Uuid, _: Uuid) -> StoreResult<Option<RunRecord>> {
            Ok(None)
        }
    }

    #[async_trait]
    impl Store for FakeStore {
        async fn commit(&self, batch: &[&[WriteOp]]) -> StoreResult<()> {
            self.transactions
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(batch.len());
            let refused = batch
                .iter()
                .flat_map(|ops| ops.iter())
                .any(|op| matches!(op, WriteOp::DeleteSession(id) if *id == self.refused));
            if refused {
                Err(StoreError::Fenced)
            } else {
                Ok(())
            }
        }
        async fn session(&self, _: Uuid) -> StoreResult<Option<SessionRecord>> {
            Ok(None)
        }
        async fn sessions(&self, _: &SessionQuery) -> StoreResult<Vec<SessionRecord>> {
            Ok(Vec::new())
        }
        async fn active_sessions(&self) -> StoreResult<Vec<Uuid>> {
            Ok(Vec::new())
        }
        async fn interrupted_sessions(&self) -> StoreResult<Vec<Uuid>> {
            Ok(Vec::new())
        }
        async fn nth_user_message(&self, _: Uuid, _: u64) -> StoreResult<Option<i64>> {
            Ok(None)
        }
        async fn message_count(&self, _: Uuid) -> StoreResult<i64> {
            Ok(0)
        }
        async fn last_seq(&self, _: Uuid) -> StoreResult<i64> {
            Ok(0)
        }
        async fn latest_checkpoint(&self, _: Uuid) -> StoreResult<Option<Checkpoint>> {
            Ok(None)
        }
        async fn artifact(
            &self,
            _: Uuid,
            _: Uuid,
        ) -> StoreResult<Option<crate::model::ArtifactRecord>> {
            Ok(None)
        }
        async fn artifact_version(&self, _: Uuid, _: &str) -> StoreResult<i64> {
            Ok(0)
        }
        async fn blob(&self, _: &str) -> StoreResult<Option<Vec<u8>>> {
            Ok(None)
        }
        async fn tenant_tokens_since(&self, _: &str, _: DateTime<Utc>) -> StoreResult<u64> {
            Ok(0)
        }
    }

    fn started(session_id: Uuid) -> WriteOp {
        let kind = EventKind::StateChanged {
            from: SessionState::Idle,
            to: SessionState::Running,
        };
        WriteOp::insert_event(Event::new(session_id, 1, kind, Utc::now()))
    }

    /// Queues a commit without waiting for it; the returned receiver gets its ack.
    async fn queue(
        writer: &Writer,
        origin: Origin,
        ops: Vec<WriteOp>,
        publish: Option<broadcast::Sender<Arc<Published>>>,
    ) -> oneshot::Receiver<StoreResult<()>> {
        let (ack, done) = oneshot::channel();
        let commit = Commit {
            origin,
            ops,
            publish,
            ack: Some(ack),
        };
        writer.submit(commit).await.expect("the writer runs");
        done
    }

    fn setup() -> (Arc<FakeStore>, Writer, Uuid) {
        let refused = Uuid::new_v4();
        let store = Arc::new(FakeStore {
            refused,
            transactions: Mutex::new(Vec::new()),
        });
        let (writer, _task) = Writer::spawn(store.clone());
        (store, writer, refused)
    }

    #[tokio::test]
    async fn a_failed_commit_gets_the_stores_error_and_later_ones_are_refused() {
        let (_store, writer, refused) = setup();
        let origin = (refused, 1);
        let failed = writer
            .commit(
                origin,
                vec![WriteOp::DeleteSession(refused)],
                /*publish*/ None,
            )
            .await;
        assert!(matches!(failed, Err(StoreError::Fenced)), "{failed:?}");
        let later = writer
            .commit(origin, vec![started(refused)], /*publish*/ None)
            .await;
        assert!(matches!(later, Err(StoreError::Poisoned(_))), "{later:?}");
        // A new incarnation of the session's actor writes again.
        let fresh = writer
            .commit((refused, 2), vec![started(refused)], /*publish*/ None)
            .await;
        assert!(fresh.is_ok(), "{fresh:?}");
    }

    #[tokio::test]
    async fn a_retired_origin_is_forgotten_after_its_last_commit() {
        let (_store, writer, refused) = setup();
        let origin = (refused, 1);
        // Queued before the writer task runs: the failing commit and the retirement share
        // one pass over the queue, and the retirement waits for the commit's outcome.
        let failed = queue(&writer, origin, vec![WriteOp::DeleteSession(refused)], None).await;
        writer.retire(origin).await;
        assert!(matches!(failed.await, Ok(Err(StoreError::Fenced))));
        // A later commit (of another origin) is done after the retirement.
        let other = Uuid::new_v4();
        let later = writer
            .commit((other, 1), vec![started(other)], /*publish*/ None)
            .await;
        assert!(later.is_ok(), "{later:?}");
        assert!(
            !writer.shared.poisoned().contains_key(&origin),
            "the stopped actor's failure is forgotten"
        );
        assert!(writer.shared.poisoned().is_empty());
    }

    #[tokio::test]
    async fn a_failed_batch_is_retried_one_by_one_and_fails_only_its_culprit() {
        let (store, writer, refused) = setup();
        let good = Uuid::new_v4();
        let (events, mut subscriber) = broadcast::channel(8);
        // Queued before the writer task runs, so the three commits share one batch.
        let bad = queue(
            &writer,
            (refused, 1),
            vec![WriteOp::DeleteSession(refused)],
            /*publish*/ None,
        )
        .await;
        let again = queue(
            &writer,
            (refused, 1),
            vec![started(refused)],
            /*publish*/ None,
        )
        .await;
        let fine = queue(&writer, (good, 1), vec![started(good)], Some(events)).await;

        let bad = bad.await.expect("acked");
        assert!(matches!(bad, Err(StoreError::Fenced)), "{bad:?}");
        let again = again.await.expect("acked");
        assert!(matches!(again, Err(StoreError::Poisoned(_))), "{again:?}");
        assert!(fine.await.expect("acked").is_ok());
        // Published after its own commit succeeded.
        let event = subscriber
            .try_recv()
            .expect("the good commit's event is published");
        assert_eq!(event.session_id, good);
        // One transaction for the batch, then one per commit not refused outright.
        let transactions = store.transactions.lock().map(|t| t.clone());
        assert_eq!(transactions.ok(), Some(vec![3, 1, 1]));
    }
}
