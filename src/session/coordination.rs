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

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use super::command::Command;
use super::live::LiveSessions;
use crate::session::deps::SessionDeps;
use crate::session::errors::SessionError;
use crate::store::{Cluster, ClusterNotice};

/// Sessions taken over per sweep at most.
const SWEEP_BATCH: i64 = 32;

/// Starts the three tasks. `take_over` records a session left by a dead replica as
/// interrupted (and resumes it with auto-resume); it answers whether it was.
pub(super) fn spawn<F, Fut>(
    deps: Arc<SessionDeps>,
    live: LiveSessions,
    cluster: Arc<dyn Cluster>,
    take_over: F,
) where
    F: Fn(Uuid) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<bool, SessionError>> + Send + 'static,
{
    let tasks = deps.tasks.clone();
    tasks.spawn(heartbeat(deps.clone(), live.clone(), cluster.clone()));
    tasks.spawn(sweeper(deps.clone(), cluster.clone(), take_over));
    tasks.spawn(listener(deps, live, cluster));
}

async fn heartbeat(ctx: Arc<SessionDeps>, sessions: LiveSessions, cluster: Arc<dyn Cluster>) {
    let ttl = ctx.lease_ttl;
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
                    if !renewed.contains(&(id, epoch)) && sessions.lease_epoch(id) == Some(epoch) {
                        tracing::warn!(session_id = %id, "lost the lease of a session");
                        sessions.notify(id, Command::LeaseLost);
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "lease heartbeat failed"),
        }
    }
}

async fn sweeper<F, Fut>(ctx: Arc<SessionDeps>, cluster: Arc<dyn Cluster>, take_over: F)
where
    F: Fn(Uuid) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<bool, SessionError>> + Send + 'static,
{
    let ttl = ctx.lease_ttl;
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
            let taking_over = take_over(id);
            ctx.tasks.spawn(async move {
                match taking_over.await {
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

async fn listener(ctx: Arc<SessionDeps>, sessions: LiveSessions, cluster: Arc<dyn Cluster>) {
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
                    sessions.notify(session_id, Command::RemoteCancel)
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
