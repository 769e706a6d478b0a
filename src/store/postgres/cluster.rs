//! Coordination of the replicas that share one PostgreSQL database: the [`Cluster`] side of
//! [`PostgresStore`]. Session leases (owner, epoch, expiry; times from the database's clock),
//! the fence a commit checks against them, and the notifications: commits announce their
//! newest events with `NOTIFY`, replicas ask each other to cancel a run, and every replica
//! `LISTEN`s on one dedicated connection.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnection, PgListener};
use sqlx::Row;
use uuid::Uuid;

use super::PostgresStore;
use crate::store::{Cluster, ClusterListener, ClusterNotice, StoreError, StoreResult, WriteOp};

/// The channel on which commits announce `replica:session:seq`.
const EVENTS_CHANNEL: &str = "tah_events";
/// The channel on which replicas ask each other to act on a session (`cancel:session`).
const COMMANDS_CHANNEL: &str = "tah_commands";

/// Refuses the commit unless `owner` still holds the session's lease at `epoch`.
pub(super) async fn check_fence(
    conn: &mut PgConnection,
    session_id: Uuid,
    owner: Uuid,
    epoch: i64,
) -> StoreResult<()> {
    // FOR SHARE orders this check against a takeover's UPDATE of the lease.
    let held: Option<bool> = sqlx::query_scalar(
        "SELECT lease_owner = $2 AND lease_epoch = $3 FROM sessions WHERE id = $1 FOR SHARE",
    )
    .bind(session_id)
    .bind(owner)
    .bind(epoch)
    .fetch_optional(conn)
    .await?
    .flatten();
    // A session deleted in the meantime has nothing left to protect.
    if held == Some(false) {
        return Err(StoreError::Fenced);
    }
    Ok(())
}

/// A session row's lease: its id, owner and epoch.
pub(super) type Lease = (Uuid, Option<Uuid>, i64);

/// Checks every fence of a batch (the `Fence` ops of all its groups) in one statement, in id
/// order, before the batch's other ops: as [`check_fence`] does one by one. Lease columns are
/// only written by the lease statements, never by a batch's ops, so checking them first is
/// the same as checking each where it stands.
/// `locked`: the leases of the rows the commit has locked already (every fenced one among
/// them), read instead of the table.
pub(super) async fn check_fences(
    conn: &mut PgConnection,
    ops: &[&WriteOp],
    locked: Option<&[Lease]>,
) -> StoreResult<()> {
    let fences: Vec<(Uuid, Uuid, i64)> = ops
        .iter()
        .filter_map(|op| match op {
            WriteOp::Fence {
                session_id,
                owner,
                epoch,
            } => Some((*session_id, *owner, *epoch)),
            _ => None,
        })
        .collect();
    let read;
    let held = match (locked, fences.as_slice()) {
        (_, []) => return Ok(()),
        (Some(locked), _) => locked,
        (None, [(session_id, owner, epoch)]) => {
            return check_fence(conn, *session_id, *owner, *epoch).await
        }
        (None, _) => {
            let mut ids: Vec<Uuid> = fences.iter().map(|(id, _, _)| *id).collect();
            ids.sort_unstable();
            ids.dedup();
            read = sqlx::query_as(
                "SELECT id, lease_owner, lease_epoch FROM sessions WHERE id = ANY($1) \
                 ORDER BY id FOR SHARE",
            )
            .bind(&ids)
            .fetch_all(conn)
            .await?;
            &read
        }
    };
    for (session_id, owner, epoch) in fences {
        // A session deleted in the meantime has nothing left to protect; a lease without an
        // owner fences on its epoch alone (as `lease_owner = $2 AND …` is NULL, not false).
        let Some((_, lease_owner, lease_epoch)) = held.iter().find(|row| row.0 == session_id)
        else {
            continue;
        };
        if lease_owner.is_some_and(|o| o != owner) || *lease_epoch != epoch {
            return Err(StoreError::Fenced);
        }
    }
    Ok(())
}

/// The notifications that announce the newest seq of each session the ops insert events
/// into; sent inside the commit's transaction (PostgreSQL delivers them only if it commits),
/// with the commit's statement that writes events (see `write.rs`) or by [`announce`].
pub(super) fn events_notices(replica: Uuid, ops: &[&WriteOp]) -> Vec<String> {
    newest_seqs(ops)
        .into_iter()
        .map(|(session_id, seq)| events_payload(replica, session_id, seq))
        .collect()
}

/// Sends `payloads` on the events channel (none: nothing).
pub(super) async fn announce(
    conn: &mut PgConnection,
    payloads: &[String],
) -> Result<(), sqlx::Error> {
    if payloads.is_empty() {
        return Ok(());
    }
    sqlx::query("SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p")
        .bind(EVENTS_CHANNEL)
        .bind(payloads)
        .execute(conn)
        .await?;
    Ok(())
}

/// `SELECT` of the statement that sends the notifications in `$n` (a `text[]`).
pub(super) fn announce_select(n: usize) -> String {
    format!("SELECT pg_notify('{EVENTS_CHANNEL}', p) FROM unnest(${n}::text[]) AS p")
}

/// The newest seq of each session that the ops insert events into, in order of first mention.
fn newest_seqs(ops: &[&WriteOp]) -> Vec<(Uuid, i64)> {
    let mut newest: Vec<(Uuid, i64)> = Vec::new();
    for op in ops {
        if let WriteOp::InsertEvent(e) = op {
            match newest.iter_mut().find(|(id, _)| *id == e.session_id) {
                Some(entry) => entry.1 = entry.1.max(e.seq),
                None => newest.push((e.session_id, e.seq)),
            }
        }
    }
    newest
}

fn events_payload(replica: Uuid, session_id: Uuid, seq: i64) -> String {
    format!("{replica}:{session_id}:{seq}")
}

fn cancel_payload(session_id: Uuid) -> String {
    format!("cancel:{session_id}")
}

/// A notification as a notice; `None` for a malformed one.
fn parse_notice(channel: &str, payload: &str) -> Option<ClusterNotice> {
    match channel {
        EVENTS_CHANNEL => {
            let mut parts = payload.splitn(3, ':');
            match (
                parts.next().and_then(|s| Uuid::parse_str(s).ok()),
                parts.next().and_then(|s| Uuid::parse_str(s).ok()),
                parts.next().and_then(|s| s.parse().ok()),
            ) {
                (Some(origin), Some(session_id), Some(seq)) => Some(ClusterNotice::Events {
                    origin,
                    session_id,
                    seq,
                }),
                _ => None,
            }
        }
        COMMANDS_CHANNEL => payload
            .strip_prefix("cancel:")
            .and_then(|s| Uuid::parse_str(s).ok())
            .map(|session_id| ClusterNotice::Cancel { session_id }),
        _ => None,
    }
}

fn millis(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

#[async_trait]
impl Cluster for PostgresStore {
    async fn acquire(
        &self,
        session_id: Uuid,
        owner: Uuid,
        ttl: Duration,
    ) -> StoreResult<Option<i64>> {
        let epoch: Option<i64> = sqlx::query_scalar(
            "UPDATE sessions SET \
               lease_epoch = CASE WHEN lease_owner = $2 AND lease_expires_at > now() \
                             THEN lease_epoch ELSE lease_epoch + 1 END, \
               lease_owner = $2, \
               lease_expires_at = now() + make_interval(secs => $3::double precision / 1000) \
             WHERE id = $1 AND (lease_owner IS NULL OR lease_owner = $2 OR lease_expires_at <= now()) \
             RETURNING lease_epoch",
        )
        .bind(session_id)
        .bind(owner)
        .bind(millis(ttl))
        .fetch_optional(&self.pool)
        .await?;
        Ok(epoch)
    }

    async fn renew(&self, owner: Uuid, ttl: Duration) -> StoreResult<Vec<(Uuid, i64)>> {
        let rows = sqlx::query(
            // The rows are locked in id order, as the writer locks the sessions it updates:
            // two transactions that update several sessions never wait for each other in a
            // cycle. A lease that expired while this replica was slow is still its own until
            // another replica takes it (which bumps the epoch that commits are fenced by), so
            // it is renewed too.
            "UPDATE sessions SET lease_expires_at = now() + make_interval(secs => $2::double precision / 1000) \
             FROM (SELECT id FROM sessions WHERE lease_owner = $1 \
                   ORDER BY id FOR NO KEY UPDATE) AS mine \
             WHERE sessions.id = mine.id RETURNING sessions.id, sessions.lease_epoch",
        )
        .bind(owner)
        .bind(millis(ttl))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("id")?, r.try_get("lease_epoch")?)))
            .collect()
    }

    async fn release(&self, session_id: Uuid, owner: Uuid) -> StoreResult<()> {
        sqlx::query(
            "UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL \
             WHERE id = $1 AND lease_owner = $2",
        )
        .bind(session_id)
        .bind(owner)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn release_all(&self, owner: Uuid) -> StoreResult<()> {
        sqlx::query("UPDATE sessions SET lease_owner = NULL, lease_expires_at = NULL WHERE lease_owner = $1")
            .bind(owner)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn orphaned(&self, limit: i64) -> StoreResult<Vec<Uuid>> {
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "SELECT id FROM sessions WHERE state IN ('running', 'waiting_tool') \
             AND (lease_owner IS NULL OR lease_expires_at <= now()) \
             LIMIT $1 FOR UPDATE SKIP LOCKED",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(ids)
    }

    async fn send_cancel(&self, session_id: Uuid) -> StoreResult<()> {
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(COMMANDS_CHANNEL)
            .bind(cancel_payload(session_id))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    async fn listen(&self) -> StoreResult<Box<dyn ClusterListener>> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener
            .listen_all([EVENTS_CHANNEL, COMMANDS_CHANNEL])
            .await?;
        Ok(Box::new(PgNotices { listener }))
    }
}

/// Notifications from a dedicated connection; sqlx reconnects it after a loss, which is
/// reported as [`ClusterNotice::Reconnected`] so subscribers catch up from the table.
struct PgNotices {
    listener: PgListener,
}

#[async_trait]
impl ClusterListener for PgNotices {
    async fn next(&mut self) -> StoreResult<ClusterNotice> {
        loop {
            let Some(notification) = self.listener.try_recv().await? else {
                return Ok(ClusterNotice::Reconnected);
            };
            let notice = parse_notice(notification.channel(), notification.payload());
            match notice {
                Some(notice) => return Ok(notice),
                None => tracing::warn!(
                    payload = notification.payload(),
                    "ignored a malformed notification"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {

    use chrono::Utc;

    use super::*;
    use crate::model::{Event, EventKind, SessionState};

    fn event(session_id: Uuid, seq: i64) -> WriteOp {
        let kind = EventKind::StateChanged {
            from: SessionState::Idle,
            to: SessionState::Running,
        };
        WriteOp::insert_event(Event::new(session_id, seq, kind, Utc::now()))
    }

    #[test]
    fn a_commit_announces_the_newest_seq_of_each_session() {
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let ops = [
            event(a, 4),
            event(b, 1),
            WriteOp::DeleteSession(b),
            event(a, 5),
        ];
        let ops: Vec<&WriteOp> = ops.iter().collect();
        assert_eq!(newest_seqs(&ops), vec![(a, 5), (b, 1)]);
        assert_eq!(newest_seqs(&[&WriteOp::DeleteSession(a)]), vec![]);
    }

    #[test]
    fn notices_read_back_what_was_sent() {
        let (replica, session_id) = (Uuid::new_v4(), Uuid::new_v4());
        assert_eq!(
            parse_notice(EVENTS_CHANNEL, &events_payload(replica, session_id, 7)),
            Some(ClusterNotice::Events {
                origin: replica,
                session_id,
                seq: 7
            })
        );
        assert_eq!(
            parse_notice(COMMANDS_CHANNEL, &cancel_payload(session_id)),
            Some(ClusterNotice::Cancel { session_id })
        );
    }

    #[test]
    fn malformed_notifications_are_no_notices() {
        let id = Uuid::new_v4();
        for (channel, payload) in [
            (EVENTS_CHANNEL, format!("{id}:{id}")),
            (EVENTS_CHANNEL, format!("{id}:{id}:seven")),
            (EVENTS_CHANNEL, format!("replica:{id}:7")),
            (COMMANDS_CHANNEL, format!("pause:{id}")),
            ("elsewhere", cancel_payload(id)),
        ] {
            assert_eq!(parse_notice(channel, &payload), None, "{channel} {payload}");
        }
    }
}
