//! `/v1/schedules`: an agent run on a cron (SPEC §21). Creating, reading, updating (pause and
//! resume included) and deleting schedules, a manual fire, and the fires log. A schedule
//! belongs to its creator's tenant and is owned by its creator: admins reach every schedule
//! of their tenant, members their own, viewers read; session tokens none.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::access::{check_session_access, denied, forbidden, Caller};
use super::extract::Ids;
use super::paging::{one_more, page_limit, parse_cursor, CursorQuery, Page};
use super::problem::{ApiJson, ApiQuery, OptionalJson, Problem};
use super::runs::parse_input;
use super::AppState;
use crate::model::{self, PathId, Principal, SessionNeed, TenantRole};
use crate::schedules::scheduler::wake;
use crate::schedules::timing::{Misfire, Overlap, Timing, Trigger};
use crate::schedules::{agent_choice, fire, now_ms, settle};
use crate::session::SessionError;
use crate::store::schedules::{FireRow, ScheduleQuery, ScheduleRow, ScheduleStore};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/schedules", post(create).get(list))
        .route("/v1/schedules/{id}", get(show).post(update).delete(remove))
        .route("/v1/schedules/{id}/trigger", post(trigger))
        .route("/v1/schedules/{id}/fires", get(fires))
}

/// A schedule id in a path.
#[derive(Debug, Clone, Copy)]
struct ScheduleId(Uuid);

impl PathId for ScheduleId {
    const WHAT: &'static str = "schedule";
    fn parse(raw: &str) -> Option<ScheduleId> {
        raw.parse().ok().map(ScheduleId)
    }
}

fn time(ms: i64) -> Option<String> {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
}

/// A schedule as served.
#[derive(Debug, Serialize)]
struct ScheduleView {
    id: Uuid,
    tenant: String,
    owner: String,
    agent: String,
    cron: String,
    timezone: String,
    input: String,
    /// `"new"` or the session's id.
    session: String,
    misfire: String,
    overlap: String,
    max_cost_usd: Option<f64>,
    paused: bool,
    next_fire_at: Option<String>,
    created_at: Option<String>,
    updated_at: Option<String>,
}

impl From<ScheduleRow> for ScheduleView {
    fn from(s: ScheduleRow) -> ScheduleView {
        ScheduleView {
            id: s.id,
            tenant: s.tenant,
            owner: s.owner,
            agent: s.agent,
            cron: s.cron,
            timezone: s.timezone,
            input: s.input,
            session: s
                .session_id
                .map_or_else(|| "new".to_string(), |id| id.to_string()),
            misfire: s.misfire,
            overlap: s.overlap,
            max_cost_usd: s.max_cost_usd,
            paused: s.paused,
            next_fire_at: s.next_fire_at.and_then(time),
            created_at: time(s.created_at),
            updated_at: time(s.updated_at),
        }
    }
}

/// A fire as served.
#[derive(Debug, Serialize)]
struct FireView {
    id: Uuid,
    schedule_id: Uuid,
    /// The fire time it stands for.
    time: Option<String>,
    trigger: String,
    session: Option<Uuid>,
    run: Option<Uuid>,
    outcome: String,
    error: Option<String>,
    /// Fire times this line accounts for beyond itself (a misfire).
    missed: i64,
    created_at: Option<String>,
}

impl From<FireRow> for FireView {
    fn from(f: FireRow) -> FireView {
        FireView {
            id: f.id,
            schedule_id: f.schedule_id,
            time: time(f.fire_at),
            trigger: f.trigger,
            session: f.session_id,
            run: f.run_id,
            outcome: f.outcome,
            error: f.error,
            missed: f.missed,
            created_at: time(f.created_at),
        }
    }
}

fn store(state: &AppState) -> Result<&dyn ScheduleStore, Problem> {
    state.sessions.store().schedule_store().ok_or_else(|| {
        Problem::new(
            StatusCode::NOT_IMPLEMENTED,
            "not-implemented",
            "this store keeps no schedules",
        )
    })
}

/// Whether `caller` may read (or, with `write`, change) `schedule`: another tenant's, or
/// another member's, is not found; a viewer may not change one; a session token may not
/// reach schedules at all.
fn may_reach(caller: &Principal, schedule: &ScheduleRow, write: bool) -> Result<(), Problem> {
    match caller {
        Principal::Operator => Ok(()),
        Principal::Session { .. } => Err(forbidden(
            "a session token is valid only on its own session's routes",
        )),
        Principal::Member { id, tenant, role } => {
            if *tenant != schedule.tenant {
                return Err(not_found());
            }
            match role {
                TenantRole::Admin => Ok(()),
                TenantRole::Member if *id == schedule.owner => Ok(()),
                TenantRole::Member => Err(not_found()),
                TenantRole::Viewer if !write => Ok(()),
                TenantRole::Viewer => Err(forbidden(
                    "a viewer may read schedules, not change or fire them",
                )),
            }
        }
    }
}

fn not_found() -> Problem {
    Problem::not_found("schedule not found")
}

/// The schedule `id` as `caller` may reach it.
async fn reach(
    state: &AppState,
    caller: &Principal,
    id: Uuid,
    write: bool,
) -> Result<ScheduleRow, Problem> {
    let schedule = store(state)?.schedule(id).await?.ok_or_else(not_found)?;
    may_reach(caller, &schedule, write)?;
    Ok(schedule)
}

/// The fields a body sets, each checked (a `400` names the field).
#[derive(Default)]
struct Fields {
    agent: Option<String>,
    cron: Option<String>,
    timezone: Option<String>,
    input: Option<String>,
    /// `Some(None)`: a new session per fire.
    session: Option<Option<Uuid>>,
    misfire: Option<Misfire>,
    overlap: Option<Overlap>,
    max_cost_usd: Option<Option<f64>>,
    paused: Option<bool>,
}

fn bad(field: &str, detail: impl std::fmt::Display) -> Problem {
    Problem::bad_request(format!("{field}: {detail}"))
}

fn text(field: &str, value: Value) -> Result<String, Problem> {
    match value {
        Value::String(s) if !s.trim().is_empty() => Ok(s),
        _ => Err(bad(field, "must be a non-empty string")),
    }
}

fn parse_fields(body: Map<String, Value>) -> Result<Fields, Problem> {
    let mut fields = Fields::default();
    for (key, value) in body {
        match key.as_str() {
            "agent" => fields.agent = Some(text("agent", value)?),
            "cron" => fields.cron = Some(text("cron", value)?),
            "timezone" => fields.timezone = Some(text("timezone", value)?),
            "input" => {
                let input = parse_input(value).map_err(|p| bad("input", p.detail))?;
                fields.input = Some(input);
            }
            "session" => {
                let session = text("session", value)?;
                fields.session =
                    Some(match session.as_str() {
                        "new" => None,
                        id => Some(id.parse::<Uuid>().map_err(|_| {
                            bad("session", "must be \"new\" or the id of a session")
                        })?),
                    });
            }
            "misfire" => {
                let word = text("misfire", value)?;
                fields.misfire = Some(Misfire::parse(&word).ok_or_else(|| {
                    bad(
                        "misfire",
                        "must be one of \"skip\", \"run_once\", \"catch_up\"",
                    )
                })?);
            }
            "overlap" => {
                let word = text("overlap", value)?;
                fields.overlap = Some(Overlap::parse(&word).ok_or_else(|| {
                    bad("overlap", "must be one of \"skip\", \"queue\", \"allow\"")
                })?);
            }
            "max_cost_usd" => {
                fields.max_cost_usd = Some(match value {
                    Value::Null => None,
                    Value::Number(n) => match n.as_f64() {
                        Some(x) if x.is_finite() && x >= 0.0 => Some(x),
                        _ => return Err(bad("max_cost_usd", "must be a non-negative number")),
                    },
                    _ => return Err(bad("max_cost_usd", "must be a non-negative number")),
                });
            }
            "paused" => {
                fields.paused = Some(
                    value
                        .as_bool()
                        .ok_or_else(|| bad("paused", "must be true or false"))?,
                );
            }
            other => return Err(Problem::bad_request(format!("unknown field: {other}"))),
        }
    }
    Ok(fields)
}

/// Checks the agent and the session a schedule names, as `caller` may use them; answers the
/// tenant a new schedule of `caller` belongs to.
async fn check_targets(
    state: &AppState,
    caller: &Principal,
    agent: &str,
    session: Option<Uuid>,
    tenant: Option<&str>,
) -> Result<String, Problem> {
    let choice = agent_choice(agent).map_err(|e| bad("agent", e))?;
    let scope = tenant.or(caller.tenant());
    let (_, version) = state.sessions.choose_agent(Some(&choice), scope).await?;
    let mut home = tenant
        .or(caller.tenant())
        .unwrap_or(&version.tenant)
        .to_string();
    if let Some(id) = session {
        check_session_access(&state.sessions, caller, id, SessionNeed::Interact).await?;
        let record = state.sessions.get(id).await?;
        if tenant.is_none() && caller.is_operator() {
            home = record.tenant.clone();
        }
        if record.tenant != home {
            return Err(Problem::not_found("session not found"));
        }
    }
    Ok(home)
}

async fn create(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiJson(body): ApiJson<Map<String, Value>>,
) -> Result<Response, Problem> {
    caller
        .may_create_sessions()
        .map_err(|d| denied(d, "schedule"))?;
    let store = store(&state)?;
    let fields = parse_fields(body)?;
    let agent = fields.agent.ok_or_else(|| bad("agent", "is required"))?;
    let cron = fields.cron.ok_or_else(|| bad("cron", "is required"))?;
    let timezone = fields
        .timezone
        .ok_or_else(|| bad("timezone", "is required"))?;
    let input = fields.input.ok_or_else(|| bad("input", "is required"))?;
    let timing = Timing::parse(&cron, &timezone).map_err(|e| bad(e.field, e.detail))?;
    let session = fields.session.flatten();
    let tenant = check_targets(&state, &caller, &agent, session, None).await?;
    let now = now_ms();
    let schedule = ScheduleRow {
        id: model::new_id(),
        tenant,
        owner: caller.id().to_string(),
        agent,
        cron,
        timezone,
        input,
        session_id: session,
        misfire: fields.misfire.unwrap_or(Misfire::Skip).as_str().to_string(),
        overlap: fields.overlap.unwrap_or(Overlap::Skip).as_str().to_string(),
        max_cost_usd: fields.max_cost_usd.flatten(),
        paused: fields.paused.unwrap_or(false),
        next_fire_at: timing.next_after(now),
        created_at: now,
        updated_at: now,
    };
    store.insert_schedule(&schedule).await?;
    wake();
    let location = format!("/v1/schedules/{}", schedule.id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(ScheduleView::from(schedule)),
    )
        .into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    limit: Option<i64>,
    cursor: Option<String>,
}

async fn list(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Page<ScheduleView>>, Problem> {
    caller
        .may_read_tenant()
        .map_err(|d| denied(d, "schedule"))?;
    let limit = page_limit(q.limit)?;
    let query = ScheduleQuery {
        limit: one_more(limit),
        before: parse_cursor(q.cursor.as_deref())?,
        tenant: caller.tenant().map(str::to_owned),
        owner: caller.listed_owner().map(str::to_owned),
    };
    let data = store(&state)?.schedules(&query).await?;
    let views = data.into_iter().map(ScheduleView::from).collect();
    Ok(Json(Page::new(views, limit, |s| s.id.to_string())))
}

async fn show(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids(ScheduleId(id)): Ids<ScheduleId>,
) -> Result<Json<ScheduleView>, Problem> {
    Ok(Json(reach(&state, &caller, id, false).await?.into()))
}

async fn update(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids(ScheduleId(id)): Ids<ScheduleId>,
    ApiJson(body): ApiJson<Map<String, Value>>,
) -> Result<Json<ScheduleView>, Problem> {
    let mut schedule = reach(&state, &caller, id, true).await?;
    let fields = parse_fields(body)?;
    let retimed = fields.cron.is_some() || fields.timezone.is_some();
    let retarget = fields.agent.is_some() || fields.session.is_some();
    if let Some(agent) = fields.agent {
        schedule.agent = agent;
    }
    if let Some(cron) = fields.cron {
        schedule.cron = cron;
    }
    if let Some(timezone) = fields.timezone {
        schedule.timezone = timezone;
    }
    let timing =
        Timing::parse(&schedule.cron, &schedule.timezone).map_err(|e| bad(e.field, e.detail))?;
    if let Some(input) = fields.input {
        schedule.input = input;
    }
    if let Some(session) = fields.session {
        schedule.session_id = session;
    }
    if retarget {
        check_targets(
            &state,
            &caller,
            &schedule.agent,
            schedule.session_id,
            Some(&schedule.tenant),
        )
        .await?;
    }
    if let Some(misfire) = fields.misfire {
        schedule.misfire = misfire.as_str().to_string();
    }
    if let Some(overlap) = fields.overlap {
        schedule.overlap = overlap.as_str().to_string();
    }
    if let Some(max_cost_usd) = fields.max_cost_usd {
        schedule.max_cost_usd = max_cost_usd;
    }
    if let Some(paused) = fields.paused {
        schedule.paused = paused;
    }
    let now = now_ms();
    // A new cron or time zone fires from now on; a resumed schedule keeps the fire time it
    // was paused at, so the times missed meanwhile follow the misfire policy.
    if retimed {
        schedule.next_fire_at = timing.next_after(now);
    }
    schedule.updated_at = now;
    if !store(&state)?.update_schedule(&schedule).await? {
        return Err(not_found());
    }
    wake();
    Ok(Json(schedule.into()))
}

async fn remove(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids(ScheduleId(id)): Ids<ScheduleId>,
) -> Result<StatusCode, Problem> {
    reach(&state, &caller, id, true).await?;
    store(&state)?.delete_schedule(id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EmptyBody {}

/// A manual fire, now, whether or not the schedule is paused (the overlap policy holds).
async fn trigger(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids(ScheduleId(id)): Ids<ScheduleId>,
    OptionalJson(_): OptionalJson<EmptyBody>,
) -> Result<Response, Problem> {
    let schedule = reach(&state, &caller, id, true).await?;
    let fired = fire(&state.sessions, &schedule, now_ms(), Trigger::Manual, 0).await?;
    Ok((StatusCode::CREATED, Json(FireView::from(fired))).into_response())
}

async fn fires(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids(ScheduleId(id)): Ids<ScheduleId>,
    ApiQuery(q): ApiQuery<CursorQuery>,
) -> Result<Json<Page<FireView>>, Problem> {
    reach(&state, &caller, id, false).await?;
    let limit = q.limit()?;
    let data = store(&state)?
        .fires(id, q.cursor()?, one_more(limit))
        .await?;
    let mut views = Vec::with_capacity(data.len());
    for mut fire in data {
        settle(&state.sessions, &mut fire)
            .await
            .map_err(SessionError::Store)?;
        views.push(FireView::from(fire));
    }
    Ok(Json(Page::new(views, limit, |f| f.id.to_string())))
}
