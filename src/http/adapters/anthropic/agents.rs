//! `client.beta.agents`: tah's agents (SPEC §16) as their agent objects. Create makes
//! version 1; an update makes the next version (with `version`, only if that is still the
//! latest: tah's `If-Match`); archive keeps every version readable; `?version=N` reads one.

use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Map, Value};

use super::Query;
use crate::http::access::{denied, Caller};
use crate::http::extract::Ids;
use crate::http::paging::one_more;
use crate::http::problem::{ApiJson, Problem};
use crate::http::AppState;
use crate::model::AgentId;
use crate::protocols::anthropic::agents::{agent_object, create_body, update_changes};
use crate::session::{AgentBody, AgentQuery, SessionError};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/anthropic/v1/agents", post(create).get(list))
        .route("/anthropic/v1/agents/{id}", get(show).post(update))
        .route("/anthropic/v1/agents/{id}/archive", post(archive))
        .route("/anthropic/v1/agents/{id}/versions", get(versions))
}

async fn create(
    State(state): State<AppState>,
    Caller(caller): Caller,
    RawQuery(raw): RawQuery,
    ApiJson(params): ApiJson<Map<String, Value>>,
) -> Result<Response, Problem> {
    Query::parse(raw.as_deref(), &[])?;
    caller.may_administer().map_err(|d| denied(d, "agent"))?;
    let body = create_body(&params).map_err(Problem::bad_request)?;
    let body: AgentBody = serde_json::from_value(Value::Object(body))
        .map_err(|e| Problem::bad_request(format!("agent: {e}")))?;
    let record = state
        .sessions
        .create_agent(body, caller.home_tenant())
        .await?;
    Ok(Json(agent_object(&record)).into_response())
}

async fn show(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids(id): Ids<AgentId>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, Problem> {
    let query = Query::parse(raw.as_deref(), &["version"])?;
    let version = query.number("version")?;
    let record = state
        .sessions
        .agent_seen_by(id, version, caller.tenant())
        .await?;
    Ok(Json(agent_object(&record)))
}

async fn update(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids(id): Ids<AgentId>,
    RawQuery(raw): RawQuery,
    ApiJson(mut params): ApiJson<Map<String, Value>>,
) -> Result<Json<Value>, Problem> {
    Query::parse(raw.as_deref(), &[])?;
    caller.may_administer().map_err(|d| denied(d, "agent"))?;
    let expected = match params.remove("version") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(
            n.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| Problem::bad_request("version: must be a positive integer"))?,
        ),
        Some(_) => return Err(Problem::bad_request("version: must be an integer")),
    };
    let current = state
        .sessions
        .agent_seen_by(id, None, caller.tenant())
        .await?;
    let changes = update_changes(&params, &current).map_err(Problem::bad_request)?;
    let record = state
        .sessions
        .update_agent(id, changes, expected, caller.tenant())
        .await
        .map_err(|error| match error {
            SessionError::AgentStale { latest } => Problem::new(
                axum::http::StatusCode::CONFLICT,
                "agent-version-stale",
                format!("version: the agent's latest version is {latest}, not the one given"),
            ),
            other => Problem::from(other),
        })?;
    Ok(Json(agent_object(&record)))
}

async fn archive(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids(id): Ids<AgentId>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, Problem> {
    Query::parse(raw.as_deref(), &[])?;
    caller.may_administer().map_err(|d| denied(d, "agent"))?;
    let record = state.sessions.archive_agent(id, caller.tenant()).await?;
    Ok(Json(agent_object(&record)))
}

async fn list(
    State(state): State<AppState>,
    Caller(caller): Caller,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, Problem> {
    let query = Query::parse(raw.as_deref(), &["limit", "page", "include_archived"])?;
    let limit = query.limit()?;
    let before = match query.one("page") {
        None | Some("") => None,
        Some(page) => Some(
            uuid::Uuid::parse_str(page).map_err(|_| Problem::bad_request("page: not a cursor"))?,
        ),
    };
    let data = state
        .sessions
        .agents(&AgentQuery {
            limit: one_more(limit),
            before,
            include_archived: query.flag("include_archived")?,
            tenant: caller.tenant().map(str::to_owned),
        })
        .await?;
    Ok(Json(page(data, limit, |a| a.id.to_string())))
}

async fn versions(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids(id): Ids<AgentId>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, Problem> {
    let query = Query::parse(raw.as_deref(), &["limit", "page"])?;
    let limit = query.limit()?;
    let before = query.number("page")?;
    let data = state
        .sessions
        .agent_versions(id, before, one_more(limit), caller.tenant())
        .await?;
    Ok(Json(page(data, limit, |a| a.version.to_string())))
}

/// `{data, next_page}` of at most `limit` agents from `data` (read with one more).
fn page(
    mut data: Vec<crate::model::AgentRecord>,
    limit: i64,
    cursor: impl Fn(&crate::model::AgentRecord) -> String,
) -> Value {
    let limit = usize::try_from(limit).unwrap_or(0);
    let next = match data.len() > limit {
        true => {
            data.truncate(limit);
            data.last().map(cursor)
        }
        false => None,
    };
    let data: Vec<Value> = data.iter().map(agent_object).collect();
    json!({"data": data, "next_page": next})
}
