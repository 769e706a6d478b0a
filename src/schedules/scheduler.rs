//! The scheduler: a task of `tah serve` that sleeps until the earliest due fire time (and at
//! most [`POLL`], to see schedules that other replicas or requests changed), then, for each due
//! schedule, plans what is due ([`super::timing::plan`]), claims it in the store (one guarded
//! update of `next_fire_at`: one replica wins each fire time), and makes the fires. Each look
//! also starts the queued fires whose turn has come ([`super::start_queued`]), whichever
//! process queued them: a queued fire outlives the process that made it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::timing::{plan, Misfire, Timing, Trigger};
use super::{fire, now_ms, record_skipped, start_queued, QUEUE_POLL};
use crate::session::Sessions;
use crate::store::schedules::ScheduleRow;
use crate::store::StoreResult;

/// The longest sleep between two looks at the schedules.
pub const POLL: Duration = Duration::from_secs(2);
/// The shortest.
const MIN_SLEEP: Duration = Duration::from_millis(20);
/// Schedules handled per look.
const BATCH: i64 = 32;

/// Rung when a schedule is made or changed in this process: its scheduler looks at once.
static WAKE: Notify = Notify::const_new();
/// Counts the rings, so that one rung while the scheduler was busy is not missed.
static RINGS: AtomicU64 = AtomicU64::new(0);

/// Wakes this process's scheduler (a schedule was made or changed).
pub fn wake() {
    RINGS.fetch_add(1, Ordering::SeqCst);
    WAKE.notify_waiters();
}

/// Starts the scheduler; it stops when `shutdown` is cancelled.
pub fn start(sessions: Sessions, shutdown: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut failing = false;
        while !shutdown.is_cancelled() {
            let rings = RINGS.load(Ordering::SeqCst);
            let woken = WAKE.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let sleep = match tick(&sessions).await {
                Ok(sleep) => {
                    failing = false;
                    sleep
                }
                Err(error) => {
                    if !failing {
                        tracing::warn!(%error, "cannot read the schedules");
                    }
                    failing = true;
                    POLL
                }
            };
            if RINGS.load(Ordering::SeqCst) != rings {
                continue;
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                () = tokio::time::sleep(sleep) => {}
                () = &mut woken => {}
            }
        }
    })
}

/// Makes the fires due now; answers how long to sleep before the next look.
async fn tick(sessions: &Sessions) -> StoreResult<Duration> {
    let Some(store) = sessions.store().schedule_store() else {
        return Ok(POLL);
    };
    let due = store.due_schedules(now_ms(), BATCH).await?;
    for schedule in &due {
        if let Err(error) = fire_due(sessions, schedule).await {
            tracing::warn!(schedule = %schedule.id, %error, "cannot fire a schedule");
        }
    }
    // Fires queued behind a run wait for it: looked at again soon while there are any.
    let longest = match start_queued(sessions).await {
        Ok(true) => QUEUE_POLL,
        Ok(false) => POLL,
        Err(error) => {
            tracing::warn!(%error, "cannot start the queued fires");
            POLL
        }
    };
    if due.len() as i64 == BATCH {
        return Ok(MIN_SLEEP);
    }
    let next = store.next_due().await?;
    let wait = next.map_or(longest, |at| {
        Duration::from_millis(u64::try_from(at - now_ms()).unwrap_or(0))
    });
    Ok(wait.clamp(MIN_SLEEP, longest))
}

/// Claims and makes what is due of one schedule.
async fn fire_due(sessions: &Sessions, schedule: &ScheduleRow) -> StoreResult<()> {
    let Some(store) = sessions.store().schedule_store() else {
        return Ok(());
    };
    let Some(due) = schedule.next_fire_at else {
        return Ok(());
    };
    let now = now_ms();
    let timing = match Timing::parse(&schedule.cron, &schedule.timezone) {
        Ok(timing) => timing,
        Err(error) => {
            // Checked when written; a row that no longer parses fires no more.
            tracing::warn!(schedule = %schedule.id, detail = %error.detail, "a schedule's cron no longer parses");
            store.claim_fire(schedule.id, due, None).await?;
            return Ok(());
        }
    };
    let misfire = Misfire::parse(&schedule.misfire).unwrap_or(Misfire::Skip);
    let plan = plan(&timing, misfire, due, now);
    if !store.claim_fire(schedule.id, due, plan.next).await? {
        // Another replica (or an update) moved it first.
        return Ok(());
    }
    if let Some((at, missed)) = plan.skipped {
        let why = format!(
            "{missed} fire time(s) missed while the schedule was not run (misfire: {})",
            misfire.as_str()
        );
        record_skipped(sessions, schedule, at, Trigger::Scheduled, missed, why).await?;
    }
    for planned in plan.fires {
        fire(
            sessions,
            schedule,
            planned.at,
            planned.trigger,
            planned.missed,
        )
        .await?;
    }
    Ok(())
}
