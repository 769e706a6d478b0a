//! Schedules (SPEC §21): an agent run on a cron in an IANA time zone, as the principal that
//! made the schedule, on a new session per fire or on one named session.
//!
//! - `timing`: the cron and time zone, and the pure plan of what is due (misfire policies).
//! - `scheduler`: the background task of `tah serve` that claims due fires in the store (once
//!   across replicas) and makes them.
//! - here: the fire itself (overlap, starting the run through `Sessions`, the fires log),
//!   starting fires queued behind their schedule's previous run, and reading a fire's outcome
//!   from its run.
//!
//! Everything is in the store (the schedule's `next_fire_at`, the fires log), so fires survive
//! restarts: a fire waiting in `queue` for the previous run is a `queued` line of the log that
//! any replica's scheduler starts once the runs before it ended, claimed once
//! ([`ScheduleStore::claim_queued`](crate::store::schedules::ScheduleStore::claim_queued)).

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

/// How often the scheduler looks whether the runs before a queued fire ended.
pub const QUEUE_POLL: Duration = Duration::from_millis(250);
/// How long a claim on a queued fire holds: the time its claimer has to record the run it
/// started before another replica may take the fire up (its claimer died).
const QUEUE_CLAIM: Duration = Duration::from_secs(30);
/// How long a fire whose run was interrupted waits for auto-resume to resume it before its
/// outcome is `failed`.
const RESUME_GRACE: Duration = Duration::from_secs(30);
/// Queued fires looked at per look.
const QUEUE_BATCH: i64 = 64;

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
    let Some(mut record) = sessions.store().run(session, run).await? else {
        return Ok(());
    };
    if record.status == RunStatus::Failed && record.error.as_deref() == Some(model::INTERRUPTED) {
        // A restart interrupted the run; a resume of it (by hand or by auto-resume) decides.
        // The session is read before its runs: a resume recorded between the two reads
        // changed the session's state and added its run in one commit, so the second read
        // finds the resume whenever the first no longer finds the session interrupted.
        let pending = resume_pending(sessions, session).await?;
        match later_resume(sessions, session, run).await? {
            Some(resume) => record = resume,
            None if pending => return Ok(()),
            None => {}
        }
    }
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

/// Whether auto-resume is about to resume `session`, interrupted and not resumed yet (its
/// resume is started in the background at start-up or on a takeover). A resume that does not
/// come within [`RESUME_GRACE`] of the interruption or of this process's start is not waited
/// for.
async fn resume_pending(sessions: &Sessions, session: Uuid) -> StoreResult<bool> {
    if !sessions.deps().auto_resume {
        return Ok(false);
    }
    let Some(record) = sessions.store().session(session).await? else {
        return Ok(false);
    };
    // Interrupted sessions are resumed at this process's start, and on a takeover later.
    let since = chrono::Utc::now() - record.updated_at.max(sessions.deps().started_at);
    Ok(record.is_interrupted() && since.to_std().unwrap_or_default() < RESUME_GRACE)
}

/// The newest resume on `session` after `run`, if any.
async fn later_resume(
    sessions: &Sessions,
    session: Uuid,
    run: Uuid,
) -> StoreResult<Option<model::RunRecord>> {
    let mut after = Some(run);
    let mut newest = None;
    loop {
        let page = sessions.store().runs(session, after, 100).await?;
        let Some(last) = page.last() else {
            return Ok(newest);
        };
        after = Some(last.id);
        newest = page
            .into_iter()
            .rev()
            .find(|r| r.kind == model::RunKind::Resume)
            .or(newest);
    }
}

/// Starts the queued fires whose turn has come (every fire of their schedule before them
/// ended), each claimed first so that one replica starts it. Answers whether fires are still
/// queued (the scheduler then looks again soon).
pub async fn start_queued(sessions: &Sessions) -> StoreResult<bool> {
    let store = sessions.store().schedule_store().ok_or_else(store_error)?;
    let queued = store.queued_fires(now_ms(), QUEUE_BATCH).await?;
    let mut waiting = false;
    let mut blocked = std::collections::HashSet::new();
    for fire in queued {
        // A schedule's queued fires start in order: a later one waits for the earlier.
        if blocked.contains(&fire.schedule_id) {
            continue;
        }
        let Some(schedule) = store.schedule(fire.schedule_id).await? else {
            continue;
        };
        if previous_running_before(sessions, &schedule, fire.id).await? {
            waiting = true;
            blocked.insert(fire.schedule_id);
            continue;
        }
        let now = now_ms();
        let until = now + QUEUE_CLAIM.as_millis() as i64;
        if !store.claim_queued(fire.id, now, until).await? {
            // Another replica took it.
            continue;
        }
        blocked.insert(fire.schedule_id);
        start_claimed(sessions, &schedule, fire).await?;
    }
    Ok(waiting)
}

/// Starts a claimed queued fire and records it. A claimer that died after making the fire's
/// session left it in the line: its run, if one was started, is the fire's.
async fn start_claimed(
    sessions: &Sessions,
    schedule: &ScheduleRow,
    mut fire: FireRow,
) -> StoreResult<()> {
    let store = sessions.store().schedule_store().ok_or_else(store_error)?;
    let session = match fire.session_id {
        Some(id) => id,
        None => match new_session(sessions, schedule).await {
            Ok(id) => {
                fire.session_id = Some(id);
                // Recorded before the run starts, so that a successor finds the session.
                store.update_fire(&fire).await?;
                id
            }
            // The process stops: the fire stays queued for the next one (or another replica).
            Err(SessionError::ShuttingDown) => return store.release_queued(fire.id).await,
            Err(error) => {
                fire.outcome = FAILED.to_string();
                fire.error = Some(error.to_string());
                return store.update_fire(&fire).await;
            }
        },
    };
    match sessions.store().runs(session, None, 1).await?.first() {
        Some(run) => {
            fire.run_id = Some(run.id);
            fire.outcome = STARTED.to_string();
            fire.error = None;
        }
        None => match start_run(sessions, schedule, &mut fire, IfBusy::Reject).await {
            Err(SessionError::ShuttingDown) => return store.release_queued(fire.id).await,
            outcome => record_start(&mut fire, outcome),
        },
    }
    store.update_fire(&fire).await
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
        // A new session per fire: this fire waits in the log for the previous runs to end;
        // the scheduler starts it then ([`start_queued`]).
        fire.outcome = QUEUED.to_string();
        store.insert_fire(&fire).await?;
        scheduler::wake();
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
    let outcome = start_run(sessions, schedule, fire, if_busy).await;
    record_start(fire, outcome);
}

/// Records in `fire` the run it started, or why none started.
fn record_start(fire: &mut FireRow, outcome: Result<Uuid, SessionError>) {
    match outcome {
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
    // The schedule's own session, or the one made for this fire already, or a new one.
    let session = match schedule.session_id.or(fire.session_id) {
        Some(id) => id,
        None => new_session(sessions, schedule).await?,
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
