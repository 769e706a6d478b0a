//! The live sessions of this process: one slot per session whose actor runs here (or whose
//! subscribers still listen), with the actor's mailbox, the session's live channels and its
//! lease.
//!
//! This module keeps the map and nothing else: it does not know how an actor is made (the
//! caller of [`LiveSessions::get_or_spawn`] says that), so actors may use it without a cycle.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{broadcast, mpsc, watch};
use uuid::Uuid;

use super::command::Command;
use super::lease::Lease;
use crate::model::Published;
use crate::store::WriteOp;

/// Events kept in memory per session for live subscribers; one that falls further behind is
/// served from the database.
const LIVE_BUFFER: usize = 128;
/// Commands queued per actor.
const MAILBOX: usize = 64;

pub(super) type Inbox = mpsc::Receiver<Command>;

pub(super) struct Slot {
    pub mailbox: mpsc::Sender<Command>,
    pub events: broadcast::Sender<Arc<Published>>,
    /// Bumped when another replica committed events of this session (or notifications may
    /// have been lost): subscribers then read what they miss from the store.
    pub wake: Arc<watch::Sender<u64>>,
    /// Which incarnation of the session's actor owns this slot.
    pub generation: u64,
    pub lease: Lease,
}

impl Slot {
    /// `ops` behind the fence of the lease `owner` holds, if it holds one.
    pub fn fenced(&self, session_id: Uuid, owner: Uuid, mut ops: Vec<WriteOp>) -> Vec<WriteOp> {
        if let Some(fence) = self.lease.fence(session_id, owner) {
            ops.insert(0, fence);
        }
        ops
    }
}

/// Cheap to clone; every clone sees the same map.
#[derive(Clone)]
pub(super) struct LiveSessions {
    slots: Arc<Mutex<HashMap<Uuid, Arc<Slot>>>>,
    generations: Arc<AtomicU64>,
    /// Sessions whose actor stopped because a write failed, with why, until their run is
    /// recorded.
    stalled: Arc<Mutex<HashMap<Uuid, String>>>,
    /// Tells the recovery task about a newly stalled session.
    recovery: mpsc::UnboundedSender<Uuid>,
}

impl LiveSessions {
    /// The registry, and the receiving end of stalled sessions (for the task that recovers
    /// them).
    pub fn new() -> (LiveSessions, mpsc::UnboundedReceiver<Uuid>) {
        let (recovery, stalled) = mpsc::unbounded_channel();
        let live = LiveSessions {
            slots: Arc::default(),
            generations: Arc::default(),
            stalled: Arc::default(),
            recovery,
        };
        (live, stalled)
    }

    /// A write of the session failed (`cause`) and its actor stopped: its run is to be
    /// recorded as failed (`storage`) as soon as writes succeed again.
    pub fn stall(&self, id: Uuid, cause: &str) {
        self.stalled_set().insert(id, cause.to_string());
        // The task is gone only at shutdown; the session is then recovered at the next start.
        let _ = self.recovery.send(id);
    }

    /// Whether the session's last actor stopped on a failed write.
    pub fn is_stalled(&self, id: Uuid) -> bool {
        self.stalled_set().contains_key(&id)
    }

    /// The session's state is written again.
    pub fn unstall(&self, id: Uuid) {
        self.stalled_set().remove(&id);
    }

    /// How many sessions stopped on a failed write and are not recorded yet, and the cause of
    /// one of those failures; `None` when there are none.
    pub fn stalled(&self) -> Option<(usize, String)> {
        let stalled = self.stalled_set();
        let cause = stalled.values().next()?.clone();
        Some((stalled.len(), cause))
    }

    fn stalled_set(&self) -> MutexGuard<'_, HashMap<Uuid, String>> {
        // A set of plain ids: a panic while it is held cannot leave it torn.
        self.stalled.lock().unwrap_or_else(|e| e.into_inner())
    }
    /// The session's slot; when it has no running actor, a new slot is made and `spawn` starts
    /// its actor on the new mailbox. Subscribers of an earlier incarnation stay connected.
    pub fn get_or_spawn(&self, id: Uuid, spawn: impl FnOnce(Arc<Slot>, Inbox)) -> Arc<Slot> {
        let mut slots = self.lock();
        if let Some(slot) = slots.get(&id) {
            if !slot.mailbox.is_closed() {
                return slot.clone();
            }
        }
        let (mailbox, inbox) = mpsc::channel(MAILBOX);
        let (events, wake) = match slots.get(&id) {
            Some(old) => (old.events.clone(), old.wake.clone()),
            None => (
                broadcast::channel(LIVE_BUFFER).0,
                Arc::new(watch::channel(0).0),
            ),
        };
        let slot = Arc::new(Slot {
            mailbox,
            events,
            wake,
            generation: self.generations.fetch_add(1, Ordering::Relaxed) + 1,
            lease: Lease::default(),
        });
        slots.insert(id, slot.clone());
        spawn(slot.clone(), inbox);
        slot
    }

    /// The session's slot if its actor is running.
    /// How many sessions are held in memory.
    pub fn count(&self) -> usize {
        self.lock().len()
    }

    pub fn running(&self, id: Uuid) -> Option<Arc<Slot>> {
        self.lock()
            .get(&id)
            .filter(|slot| !slot.mailbox.is_closed())
            .cloned()
    }

    /// Called by an actor about to stop: forgets its slot unless a newer actor replaced it or
    /// subscribers still listen (then the slot stays for them, its mailbox closes, and a new
    /// actor is spawned on demand). With [`Retire::IfUnwatched`], nothing happens while someone
    /// listens, and the answer says whether the actor may stop.
    pub fn retire(&self, id: Uuid, generation: u64, how: Retire) -> bool {
        let mut slots = self.lock();
        let Some(slot) = slots.get(&id) else {
            return true;
        };
        if slot.generation != generation {
            return true;
        }
        let watched = slot.events.receiver_count() > 0;
        if watched && how == Retire::IfUnwatched {
            return false;
        }
        if !watched {
            slots.remove(&id);
        }
        true
    }

    /// Forgets a deleted session: its subscribers' streams end.
    pub fn forget(&self, id: Uuid, generation: u64) {
        let mut slots = self.lock();
        if slots.get(&id).is_some_and(|s| s.generation == generation) {
            slots.remove(&id);
        }
    }

    /// Wakes the subscribers of one session (`Some`) or of every session (`None`) so they read
    /// what they miss from the store.
    pub fn wake(&self, id: Option<Uuid>) {
        let slots = self.lock();
        let bump = |slot: &Arc<Slot>| slot.wake.send_modify(|n| *n = n.wrapping_add(1));
        match id {
            Some(id) => slots.get(&id).into_iter().for_each(bump),
            None => slots.values().for_each(bump),
        }
    }

    /// Delivers a command to a session's actor if it lives here, without waiting.
    pub fn notify(&self, id: Uuid, command: Command) {
        let slot = self.lock().get(&id).cloned();
        if let Some(slot) = slot {
            let _ = slot.mailbox.try_send(command);
        }
    }

    /// The leases this process holds, with their epochs.
    pub fn held_leases(&self) -> Vec<(Uuid, i64)> {
        self.lock()
            .iter()
            .filter_map(|(id, slot)| slot.lease.epoch().map(|epoch| (*id, epoch)))
            .collect()
    }

    /// The epoch of the lease this process holds on `id` now, if any.
    pub fn lease_epoch(&self, id: Uuid) -> Option<i64> {
        self.lock().get(&id).and_then(|slot| slot.lease.epoch())
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Uuid, Arc<Slot>>> {
        // A map of `Arc`s: a panic while it is held cannot leave an entry half-written.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How an actor leaves its slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retire {
    /// Only when nobody listens (idle eviction).
    IfUnwatched,
    /// In any case (a failure, shutdown); the slot stays for its subscribers.
    Always,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spawned(live: &LiveSessions, id: Uuid) -> (Arc<Slot>, Option<Inbox>) {
        let mut inbox = None;
        let slot = live.get_or_spawn(id, |_, i| inbox = Some(i));
        (slot, inbox)
    }

    #[test]
    fn a_slot_is_spawned_once_while_its_mailbox_is_open() {
        let (live, _stalled) = LiveSessions::new();
        let id = Uuid::now_v7();
        let (first, inbox) = spawned(&live, id);
        assert!(inbox.is_some());
        let (again, none) = spawned(&live, id);
        assert!(none.is_none());
        assert_eq!(first.generation, again.generation);
        drop(inbox);
        let (next, inbox) = spawned(&live, id);
        assert!(inbox.is_some());
        assert!(next.generation > first.generation);
    }

    #[test]
    fn a_watched_slot_stays_for_its_subscribers() {
        let (live, _stalled) = LiveSessions::new();
        let id = Uuid::now_v7();
        let (slot, _inbox) = spawned(&live, id);
        let _subscriber = slot.events.subscribe();
        assert!(!live.retire(id, slot.generation, Retire::IfUnwatched));
        assert!(live.retire(id, slot.generation, Retire::Always));
        assert!(live.lock().contains_key(&id));
        drop(_subscriber);
        assert!(live.retire(id, slot.generation, Retire::IfUnwatched));
        assert!(!live.lock().contains_key(&id));
    }

    #[test]
    fn held_leases_come_from_the_slots() {
        let (live, _stalled) = LiveSessions::new();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let (slot_a, _ia) = spawned(&live, a);
        let (_slot_b, _ib) = spawned(&live, b);
        assert!(live.held_leases().is_empty());
        slot_a.lease.take(2);
        assert_eq!(live.held_leases(), vec![(a, 2)]);
        assert_eq!(live.lease_epoch(a), Some(2));
        assert_eq!(live.lease_epoch(b), None);
    }

    #[tokio::test]
    async fn a_stalled_session_is_announced_once_per_stall_and_remembered_until_unstalled() {
        let (live, mut stalled) = LiveSessions::new();
        let id = Uuid::now_v7();
        assert!(!live.is_stalled(id));
        live.stall(id, "disk full");
        assert!(live.is_stalled(id));
        assert_eq!(stalled.recv().await, Some(id));
        assert_eq!(live.stalled(), Some((1, "disk full".to_string())));
        live.unstall(id);
        assert!(!live.is_stalled(id));
        assert_eq!(live.stalled(), None);
    }
}
