//! The group-commit writer: one task per process applies the writes of every session in
//! batches, one transaction per batch, then publishes the committed events in order.
//!
//! Actors hand a [`Commit`] to the writer and may go on producing; events reach subscribers
//! only after their transaction has committed (publish-after-commit), and the ack tells the
//! actor its writes are durable. If a commit fails, later commits from the same actor are
//! refused until that actor is replaced, so a failed write can never leave a gap in `seq`.

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::{Store, StoreError, StoreResult, WriteOp};
use crate::model::Event;

/// Who wrote a commit: a session and the incarnation of its actor.
pub type Origin = (Uuid, u64);

pub struct Commit {
    pub origin: Origin,
    pub ops: Vec<WriteOp>,
    /// Where the committed events are published.
    pub publish: Option<broadcast::Sender<Arc<Event>>>,
    pub ack: Option<oneshot::Sender<StoreResult<()>>>,
}

/// Ops per transaction at most; a larger backlog is split over several transactions.
const MAX_BATCH_OPS: usize = 4096;
/// Commits queued at most; further submitters wait (backpressure on the producers).
const QUEUE: usize = 8192;

#[derive(Clone)]
pub struct Writer {
    tx: mpsc::Sender<Commit>,
}

impl Writer {
    /// Starts the writer task. It ends when every `Writer` clone is dropped and the queue is
    /// drained, so awaiting the handle at shutdown flushes every accepted write.
    pub fn spawn(store: Arc<dyn Store>) -> (Writer, JoinHandle<()>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let handle = tokio::spawn(run(store, rx));
        (Writer { tx }, handle)
    }

    /// Queues a commit; returns once it is queued (not committed).
    pub async fn submit(&self, commit: Commit) -> StoreResult<()> {
        self.tx
            .send(commit)
            .await
            .map_err(|_| StoreError::WriterGone)
    }

    /// Commits `ops` and waits until they are durable, publishing events to `publish`.
    pub async fn commit(
        &self,
        origin: Origin,
        ops: Vec<WriteOp>,
        publish: Option<broadcast::Sender<Arc<Event>>>,
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

async fn run(store: Arc<dyn Store>, mut rx: mpsc::Receiver<Commit>) {
    let mut poisoned: HashSet<Origin> = HashSet::new();
    let mut batch: Vec<Commit> = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut ops = first.ops.len();
        batch.push(first);
        // Let producers that are running right now (an actor mid-stream) add to this batch:
        // fewer, larger transactions for the same latency.
        tokio::task::yield_now().await;
        while ops < MAX_BATCH_OPS {
            match rx.try_recv() {
                Ok(next) => {
                    ops += next.ops.len();
                    batch.push(next);
                }
                Err(_) => break,
            }
        }
        // Refuse commits of actors whose earlier commit failed.
        let (refused, accepted): (Vec<Commit>, Vec<Commit>) = std::mem::take(&mut batch)
            .into_iter()
            .partition(|c| poisoned.contains(&c.origin));
        for commit in refused {
            finish(commit, Err(StoreError::Poisoned));
        }
        if accepted.is_empty() {
            continue;
        }
        let groups: Vec<&[WriteOp]> = accepted.iter().map(|c| c.ops.as_slice()).collect();
        match store.commit(&groups).await {
            Ok(()) => accepted.into_iter().for_each(|c| finish(c, Ok(()))),
            Err(error) if accepted.len() == 1 => {
                tracing::error!(%error, "commit failed");
                for commit in accepted {
                    poisoned.insert(commit.origin);
                    finish(commit, Err(error_copy(&error)));
                }
            }
            Err(error) => {
                // Find the culprit: commit each on its own so one bad write fails only its actor.
                tracing::warn!(%error, "batch commit failed; retrying commits one by one");
                for commit in accepted {
                    if poisoned.contains(&commit.origin) {
                        finish(commit, Err(StoreError::Poisoned));
                        continue;
                    }
                    let result = store.commit(&[commit.ops.as_slice()]).await;
                    if let Err(error) = &result {
                        tracing::error!(%error, session_id = %commit.origin.0, "commit failed");
                        poisoned.insert(commit.origin);
                    }
                    finish(commit, result);
                }
            }
        }
    }
}

fn error_copy(error: &StoreError) -> StoreError {
    StoreError::Corrupt(error.to_string())
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
