//! A run's place among `--max-concurrent-runs`. A run holds its permit while it works; while
//! all it does is wait for its sub-agents it lends it: the first child takes the parent's
//! permit, the others wait in line for one, and the parent waits in line for one again when
//! its last child has ended. So permits are held only by runs that work, never by a parent
//! that waits for children that wait for permits: a tree of sub-agents cannot deadlock at
//! any limit, and it never runs more than the limit at once.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The permit of one run (none for a run that was continued without one).
#[derive(Debug)]
pub struct RunPermit {
    semaphore: Arc<Semaphore>,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    permit: Option<OwnedSemaphorePermit>,
    /// The run counts against the limit: it takes a permit again after its children.
    metered: bool,
    /// Children the run waits for.
    lent: usize,
}

impl RunPermit {
    /// A run that holds `permit`.
    pub fn held(semaphore: Arc<Semaphore>, permit: OwnedSemaphorePermit) -> Arc<RunPermit> {
        RunPermit::new(semaphore, Some(permit))
    }

    /// A run that holds no permit and takes none: one that waited for answers and is
    /// continued (an answer never meets a full server).
    pub fn unmetered(semaphore: Arc<Semaphore>) -> Arc<RunPermit> {
        RunPermit::new(semaphore, None)
    }

    fn new(semaphore: Arc<Semaphore>, permit: Option<OwnedSemaphorePermit>) -> Arc<RunPermit> {
        Arc::new(RunPermit {
            semaphore,
            state: Mutex::new(State {
                metered: permit.is_some(),
                permit,
                lent: 0,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Plain data behind the lock, never held across an await.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The run begins to wait for a child: the permit it holds goes with the loan, to the
    /// child.
    pub fn lend(self: &Arc<Self>) -> Loan {
        let mut state = self.lock();
        state.lent += 1;
        Loan {
            owner: self.clone(),
            permit: state.permit.take(),
            open: true,
        }
    }

    /// One child less; whether the run now needs a permit again.
    fn settle(&self) -> bool {
        let mut state = self.lock();
        state.lent = state.lent.saturating_sub(1);
        state.lent == 0 && state.metered && state.permit.is_none()
    }

    /// Whether the run holds a permit now.
    #[cfg(test)]
    fn holds(&self) -> bool {
        self.lock().permit.is_some()
    }
}

/// A run waits for one child.
pub struct Loan {
    owner: Arc<RunPermit>,
    /// The parent's permit, for the first child.
    permit: Option<OwnedSemaphorePermit>,
    open: bool,
}

impl Loan {
    /// The child's permit: its parent's, or the next free one, waited for in line.
    pub async fn child_permit(&mut self) -> Result<Arc<RunPermit>, tokio::sync::AcquireError> {
        let semaphore = self.owner.semaphore.clone();
        let permit = match self.permit.take() {
            Some(permit) => permit,
            None => semaphore.clone().acquire_owned().await?,
        };
        Ok(RunPermit::held(semaphore, permit))
    }

    /// The child has ended: when it was the last, the parent (if it counts) waits in line
    /// for a permit to go on with.
    pub async fn end(mut self) {
        self.open = false;
        drop(self.permit.take());
        if !self.owner.settle() {
            return;
        }
        let Ok(permit) = self.owner.semaphore.clone().acquire_owned().await else {
            return;
        };
        let mut state = self.owner.lock();
        // Another child may have begun meanwhile: it has the permit's place.
        if state.lent == 0 && state.permit.is_none() {
            state.permit = Some(permit);
        }
    }
}

impl Drop for Loan {
    fn drop(&mut self) {
        // Dropped unended: the parent's run is being cancelled and takes no permit again.
        if self.open {
            self.owner.settle();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_parent_lends_its_permit_to_its_first_child_and_takes_one_back_after_the_last() {
        let semaphore = Arc::new(Semaphore::new(1));
        let first = semaphore.clone().try_acquire_owned().unwrap();
        let parent = RunPermit::held(semaphore.clone(), first);
        let mut one = parent.lend();
        let mut two = parent.lend();
        assert!(!parent.holds());
        let child_one = one.child_permit().await.unwrap();
        // The second child waits in line while the first holds the only permit.
        let waiting = tokio::time::timeout(Duration::from_millis(50), two.child_permit()).await;
        assert!(waiting.is_err());
        drop(child_one);
        let child_two = two.child_permit().await.unwrap();
        one.end().await;
        assert!(!parent.holds(), "a child still runs: the parent waits");
        drop(child_two);
        two.end().await;
        assert!(parent.holds());
        assert_eq!(semaphore.available_permits(), 0);
        drop(parent);
        assert_eq!(semaphore.available_permits(), 1);
    }

    #[tokio::test]
    async fn a_run_without_a_permit_takes_none_and_a_dropped_loan_gives_nothing_back() {
        let semaphore = Arc::new(Semaphore::new(2));
        let continued = RunPermit::unmetered(semaphore.clone());
        let mut loan = continued.lend();
        let child = loan.child_permit().await.unwrap();
        assert_eq!(semaphore.available_permits(), 1);
        drop(child);
        loan.end().await;
        assert!(!continued.holds());
        assert_eq!(semaphore.available_permits(), 2);

        let parent = RunPermit::held(
            semaphore.clone(),
            semaphore.clone().try_acquire_owned().unwrap(),
        );
        let mut cancelled = parent.lend();
        let child = cancelled.child_permit().await.unwrap();
        drop(child);
        drop(cancelled);
        assert!(!parent.holds());
        assert_eq!(semaphore.available_permits(), 2);
    }
}
