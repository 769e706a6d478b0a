//! Schedules (SPEC §21): an agent run on a cron in an IANA time zone, as the principal that
//! made the schedule, on a new session per fire or on one named session.
//!
//! - `timing`: the cron and time zone, and the pure plan of what is due (misfire policies).
//! - `scheduler`: the background task of `tah serve` that claims due fires in the store (once
//!   across replicas) and makes them.
//! - here: the fire itself (overlap, starting the run through `Sessions`, the fires log), and
//!   reading a fire's outcome from its run.
//!
//! Everything is in the store (the schedule's `next_fire_at`, the fires log), so fires survive
//! restarts; a fire waiting in `queue` for the previous run is the one thing held in memory.

pub mod scheduler;
pub mod timing;

use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use crate::model::{self, AgentChoice, RunStatus};
use crate::session::{Follow, IfBusy, Pending, RunRequest, SessionError, Sessions};
use crate::store::schedules::{FireRow, ScheduleRow};
use crate::store::{StoreError, StoreResult};
use timing::{Overlap, Trigger};

/// How often a fire queued behind a running run looks whether that run ended.
const QUEUE_POLL: Duration = Duration::from_millis(250);

/// Fire outcomes.
pub const QUEUED: &str = "queued";
pub const STARTED: &str = "started";
pub const COMPLETED: &str = "completed";
pub const FAILED: &str = "failed";
pub const SKIPPED: &str = "skipped";

pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn store_error() -> StoreError {
    StoreError::Unsupported("this store keeps no schedules".into())
}

/// A new fire row.
fn fire_row(schedule: &ScheduleRow, at: i64, trigger: Trigger, missed: i64) -> FireRow {
    FireRow {
        id: model::new_id(),
        schedule_id: schedule.id,
        fire_at: at,
        trigger: trigger.as_str().to_string(),
        session_id: schedule.session_id,
        run_id: None,
        outcome: STARTED.to_string(),
        error: None,
        missed,
        created_at: now_ms(),
    }
}

/// Records a skipped fire.
pub async fn record_skipped(
    sessions: &Sessions,
    schedule: &ScheduleRow,
    at: i64,
    trigger: Trigger,
    missed: i64,
    why: String,
) -> StoreResult<FireRow> {
    let store = sessions.store().schedule_store().ok_or_else(store_error)?;
    let mut fire = fire_row(schedule, at, trigger, missed);
    fire.session_id = None;
    fire.outcome = SKIPPED.to_string();
    fire.error = Some(why);
    store.insert_fire(&fire).await?;
    Ok(fire)
}

/// Brings a `started` fire's outcome up to date from its run (`completed` or `failed` once the
/// run ended), recording it.
pub async fn settle(sessions: &Sessions, fire: &mut FireRow) -> StoreResult<()> {
    if fire.outcome != STARTED {
        return Ok(());
    }
    let (Some(session), Some(run)) = (fire.session_id, fire.run_id) else {
        return Ok(());
    };
    let Some(record) = sessions.store().run(session, run).await? else {
        return Ok(());
    };
    let (outcome, error) = match record.status {
        RunStatus::Running => return Ok(()),
        RunStatus::Completed => (COMPLETED, None),
        RunStatus::Failed => (
            FAILED,
            Some(record.error.unwrap_or_else(|| "the run failed".into())),
        ),
        RunStatus::Cancelled => (FAILED, Some("the run was cancelled".to_string())),
    };
    fire.outcome = outcome.to_string();
    fire.error = error;
    if let Some(store) = sessions.store().schedule_store() {
        store.update_fire(fire).await?;
    }
    Ok(())
}

/// Whether the schedule's previous fire's run is still running (or waits to start).
async fn previous_running(sessions: &Sessions, schedule: &ScheduleRow) -> StoreResult<bool> {
    let store = sessions.store().schedule_store().ok_or_else(store_error)?;
    let Some(mut previous) = store.last_run_fire(schedule.id).await? else {
        return Ok(false);
    };
    settle(sessions, &mut previous).await?;
    Ok(previous.outcome == QUEUED || previous.outcome == STARTED)
}

/// Makes one fire of `schedule` at `at`: the overlap policy first, then the run, and the
/// fire recorded in the log (a failure to start is a `failed` fire, not an error).
pub async fn fire(
    sessions: &Sessions,
    schedule: &ScheduleRow,
    at: i64,
    trigger: Trigger,
    missed: i64,
) -> StoreResult<FireRow> {
    let store = sessions.store().schedule_store().ok_or_else(store_error)?;
    let overlap = Overlap::parse(&schedule.overlap).unwrap_or(Overlap::Skip);
    let busy = previous_running(sessions, schedule).await?;
    if busy && overlap == Overlap::Skip {
        return record_skipped(
            sessions,
            schedule,
            at,
            trigger,
            missed,
            "the previous fire's run is still running (overlap: skip)".into(),
        )
        .await;
    }
    let mut fire = fire_row(schedule, at, trigger, missed);
    if busy && overlap == Overlap::Queue && schedule.session_id.is_none() {
        // A new session per fire: this fire waits for the previous run to end.
        fire.outcome = QUEUED.to_string();
        store.insert_fire(&fire).await?;
        let sessions = sessions.clone();
        let schedule = schedule.clone();
        let queued = fire.clone();
        tokio::spawn(async move {
            let shutdown = sessions.deps().shutdown.clone();
            loop {
                match previous_running_before(&sessions, &schedule, queued.id).await {
                    Ok(false) => break,
                    Ok(true) => {}
                    Err(error) => tracing::warn!(%error, "cannot read a schedule's fires"),
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    () = tokio::time::sleep(QUEUE_POLL) => {}
                }
            }
            let mut fire = queued;
            start(&sessions, &schedule, &mut fire, IfBusy::Reject).await;
            if let Some(store) = sessions.store().schedule_store() {
                if let Err(error) = store.update_fire(&fire).await {
                    tracing::warn!(%error, "cannot record a schedule's fire");
                }
            }
        });
        return Ok(fire);
    }
    // On the schedule's own session, a run already active takes the input as queued input
    // (`queue` and `allow` alike: a session runs one run at a time).
    let if_busy = match (busy, schedule.session_id) {
        (true, Some(_)) => IfBusy::Queue,
        _ => IfBusy::Reject,
    };
    start(sessions, schedule, &mut fire, if_busy).await;
    store.insert_fire(&fire).await?;
    Ok(fire)
}

/// Whether a fire older than `fire_id` still runs or waits (what a queued fire waits for).
async fn previous_running_before(
    sessions: &Sessions,
    schedule: &ScheduleRow,
    fire_id: Uuid,
) -> StoreResult<bool> {
    let store = sessions.store().schedule_store().ok_or_else(store_error)?;
    let mut after = None;
    let mut running = false;
    loop {
        let page = store.fires(schedule.id, after, 200).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        for mut fire in page {
            if fire.id >= fire_id {
                return Ok(running);
            }
            settle(sessions, &mut fire).await?;
            running |= fire.outcome == QUEUED || fire.outcome == STARTED;
        }
    }
    Ok(running)
}

/// Starts the fire's run, filling in its session, run, outcome and error.
async fn start(sessions: &Sessions, schedule: &ScheduleRow, fire: &mut FireRow, if_busy: IfBusy) {
    match start_run(sessions, schedule, fire, if_busy).await {
        Ok(run) => {
            fire.run_id = Some(run);
            fire.outcome = STARTED.to_string();
            fire.error = None;
        }
        Err(error) => {
            fire.outcome = FAILED.to_string();
            fire.error = Some(error.to_string());
        }
    }
}

async fn start_run(
    sessions: &Sessions,
    schedule: &ScheduleRow,
    fire: &mut FireRow,
    if_busy: IfBusy,
) -> Result<Uuid, SessionError> {
    let session = match schedule.session_id {
        Some(id) => id,
        None => {
            let id = new_session(sessions, schedule).await?;
            fire.session_id = Some(id);
            id
        }
    };
    fire.session_id = Some(session);
    // The fire's run spends at most the schedule's cap itself, also in a reused session.
    let request = RunRequest::run(schedule.input.clone(), Pending::Refuse)
        .if_busy(if_busy)
        .max_cost_usd(schedule.max_cost_usd);
    let started = sessions
        .start(session, request, Follow::Record)
        .await?
        .into_run()?;
    Ok(started.run.id)
}

/// A new session for a fire: the schedule's agent (its version current now), its tenant, its
/// owner, and the schedule's `max_cost_usd` as its own cap (what a resume of it by hand is
/// bounded by).
async fn new_session(sessions: &Sessions, schedule: &ScheduleRow) -> Result<Uuid, SessionError> {
    let choice = agent_choice(&schedule.agent)?;
    let metadata = Some(serde_json::json!({ "schedule_id": schedule.id }));
    let record = sessions
        .create_on_agent(
            Some(&choice),
            Some(&schedule.tenant),
            Some(schedule.owner.clone()),
            metadata,
        )
        .await?;
    if let Some(cap) = schedule.max_cost_usd {
        sessions.set_cost_cap(record.id, Some(cap)).await?;
    }
    Ok(record.id)
}

/// The agent a schedule names, as a session would name it.
pub fn agent_choice(agent: &str) -> Result<AgentChoice, SessionError> {
    serde_json::from_value(Value::String(agent.to_string()))
        .map_err(|e| SessionError::BadInput(format!("agent: {e}")))
}
