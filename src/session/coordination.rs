//! Scale-out coordination (PostgreSQL): the background tasks that keep this replica's view of
//! the cluster current.
//!
//! - The heartbeat renews every lease this replica holds in one statement; a lease that was
//!   not renewed is lost, and its actor stops without writing (its writes would be fenced).
//! - The sweeper takes over sessions whose run was left without a live lease (a dead or
//!   stopped replica): they are recorded as interrupted and, with auto-resume, resumed.
//! - The listener drains notifications: events committed on other replicas wake the local
//!   subscribers of that session (they read the new events from the table), cancel requests
//!   reach the local run, and after a reconnect every subscriber catches up.

use std::sync::Arc;
use std::time::Duration;

use super::actor::Command;
use super::registry::Sessions;
use crate::store::{Cluster, ClusterNotice};

/// Sessions taken over per sweep at most.
const SWEEP_BATCH: i64 = 32;

pub(super) fn spawn(sessions: Sessions, cluster: Arc<dyn Cluster>) {
    let ctx = sessions.context().clone();
    let ttl = ctx.lease_ttl;
    let tasks = ctx.tasks.clone();
    tasks.spawn(heartbeat(sessions.clone(), cluster.clone(), ttl));
    tasks.spawn(sweeper(sessions.clone(), cluster.clone(), ttl));
    tasks.spawn(listener(sessions, cluster));
}

async fn heartbeat(sessions: Sessions, cluster: Arc<dyn Cluster>, ttl: Duration) {
    let ctx = sessions.context().clone();
    let mut tick = tokio::time::interval(ttl / 3);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = ctx.shutdown.cancelled() => return,
        }
        // Only leases noted before the renewal can be judged by it.
        let before = sessions.held_leases();
        match cluster.renew(ctx.replica, ttl).await {
            Ok(renewed) => {
                for (id, epoch) in before {
                    if !renewed.contains(&(id, epoch))
                        && sessions.held_leases().get(&id) == Some(&epoch)
                    {
                        tracing::warn!(session_id = %id, "lost the lease of a session");
                        sessions.notify_actor(id, Command::LeaseLost);
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "lease heartbeat failed"),
        }
    }
}

async fn sweeper(sessions: Sessions, cluster: Arc<dyn Cluster>, ttl: Duration) {
    let ctx = sessions.context().clone();
    let mut tick = tokio::time::interval((ttl / 4).max(Duration::from_millis(250)));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = ctx.shutdown.cancelled() => return,
        }
        let orphaned = match cluster.orphaned(SWEEP_BATCH).await {
            Ok(ids) => ids,
            Err(error) => {
                tracing::warn!(%error, "takeover sweep failed");
                continue;
            }
        };
        for id in orphaned {
            let sessions = sessions.clone();
            ctx.tasks.spawn(async move {
                match sessions.take_over(id).await {
                    Ok(true) => {
                        tracing::info!(session_id = %id, "took over an interrupted session")
                    }
                    Ok(false) => {}
                    Err(error) => tracing::warn!(session_id = %id, %error, "takeover failed"),
                }
            });
        }
    }
}

async fn listener(sessions: Sessions, cluster: Arc<dyn Cluster>) {
    let ctx = sessions.context().clone();
    loop {
        let mut notices = match cluster.listen().await {
            Ok(notices) => notices,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for notifications; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                    _ = ctx.shutdown.cancelled() => return,
                }
            }
        };
        // Whatever was committed while nobody listened is read from the table.
        sessions.wake(None);
        loop {
            let notice = tokio::select! {
                notice = notices.next() => notice,
                _ = ctx.shutdown.cancelled() => return,
            };
            match notice {
                Ok(ClusterNotice::Events {
                    origin, session_id, ..
                }) => {
                    // Local commits reach local subscribers directly.
                    if origin != ctx.replica {
                        sessions.wake(Some(session_id));
                    }
                }
                Ok(ClusterNotice::Cancel { session_id }) => {
                    sessions.notify_actor(session_id, Command::RemoteCancel)
                }
                Ok(ClusterNotice::Reconnected) => {
                    tracing::warn!("notification connection re-established; subscribers catch up");
                    sessions.wake(None);
                }
                Err(error) => {
                    tracing::warn!(%error, "notification connection failed; reconnecting");
                    break;
                }
            }
        }
    }
}
