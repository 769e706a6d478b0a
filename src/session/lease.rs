//! The lease this replica holds on a session (scale-out only): the one copy of it.
//!
//! The session's actor takes and gives back the lease; every write of the session carries it
//! as a fence, so a replica that lost the session cannot write to it; the heartbeat reads it
//! to tell which leases it renewed and which were lost. On a single node it stays empty.

use std::sync::Mutex;

use uuid::Uuid;

use crate::store::WriteOp;

#[derive(Debug, Default)]
pub(super) struct Lease {
    /// The lease's epoch while this replica holds it.
    epoch: Mutex<Option<i64>>,
}

/// What taking a lease found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Taken {
    /// This replica held the lease at this epoch already: what it has loaded is current.
    Kept,
    /// A new epoch: another replica may have written since, so the session must be reloaded.
    New,
}

impl Lease {
    /// Records that this replica holds the lease at `epoch`.
    pub fn take(&self, epoch: i64) -> Taken {
        let mut held = self.lock();
        let taken = if *held == Some(epoch) {
            Taken::Kept
        } else {
            Taken::New
        };
        *held = Some(epoch);
        taken
    }

    /// The lease is given back, lost, or void.
    pub fn forget(&self) {
        *self.lock() = None;
    }

    pub fn epoch(&self) -> Option<i64> {
        *self.lock()
    }

    /// The fence a write of `session_id` carries while the lease is held by `owner`.
    pub fn fence(&self, session_id: Uuid, owner: Uuid) -> Option<WriteOp> {
        self.epoch().map(|epoch| WriteOp::Fence {
            session_id,
            owner,
            epoch,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<i64>> {
        // The guarded value is a plain `Option<i64>`: a panic elsewhere cannot leave it torn.
        self.epoch.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_epoch_asks_for_a_reload_and_the_same_one_does_not() {
        let lease = Lease::default();
        assert_eq!(lease.epoch(), None);
        assert_eq!(lease.take(3), Taken::New);
        assert_eq!(lease.take(3), Taken::Kept);
        assert_eq!(lease.take(4), Taken::New);
        assert_eq!(lease.epoch(), Some(4));
    }

    #[test]
    fn a_forgotten_lease_fences_nothing_and_is_new_when_taken_again() {
        let lease = Lease::default();
        let (session, owner) = (Uuid::now_v7(), Uuid::now_v7());
        assert!(lease.fence(session, owner).is_none());
        lease.take(7);
        match lease.fence(session, owner) {
            Some(WriteOp::Fence {
                session_id,
                owner: o,
                epoch,
            }) => assert_eq!((session_id, o, epoch), (session, owner, 7)),
            other => panic!("expected a fence, got {other:?}"),
        }
        lease.forget();
        assert!(lease.fence(session, owner).is_none());
        assert_eq!(lease.take(7), Taken::New);
    }
}
