//! `/v1/agents`: agents as versioned resources. Creating one makes version 1, an update makes
//! the next version (conditional with `If-Match: "<version>"`), and archiving keeps every
//! version readable. Each answer carries the version as its `ETag`.

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::access::{denied, Caller};
use super::extract::Ids;
use super::paging::{one_more, page_limit, parse_cursor, Page};
use super::problem::{ApiJson, ApiQuery, Problem};
use super::AppState;
use crate::model::{AgentId, AgentRecord, PathId};
use crate::session::{AgentBody, AgentQuery};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/agents", post(create).get(list))
        .route("/v1/agents/{id}", get(show).post(update).delete(archive))
        .route("/v1/agents/{id}/versions", get(versions))
        .route("/v1/agents/{id}/versions/{version}", get(version))
}

/// A version number in a path.
#[derive(Debug, Clone, Copy)]
struct Version(u32);

impl PathId for Version {
    const WHAT: &'static str = "agent version";
    fn parse(raw: &str) -> Option<Version> {
        raw.parse().ok().filter(|&n| n >= 1).map(Version)
    }
}

/// An agent version as served: the stored version and the provider its model is on.
#[derive(Debug, Serialize)]
pub struct AgentView {
    #[serde(flatten)]
    record: AgentRecord,
    #[serde(skip_serializing_if = "Option::is_none")]
    provider: Option<String>,
}

impl AgentView {
    fn of(state: &AppState, record: AgentRecord) -> AgentView {
        AgentView {
            provider: state.sessions.agent_provider(&record),
            record,
        }
    }
}

/// An agent version with its `ETag`.
fn shown(state: &AppState, status: StatusCode, record: AgentRecord) -> Response {
    let etag = HeaderValue::from_str(&format!("\"{}\"", record.version))
        .unwrap_or(HeaderValue::from_static("\"0\""));
    let mut response = (status, Json(AgentView::of(state, record))).into_response();
    response.headers_mut().insert(header::ETAG, etag);
    response
}

async fn create(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiJson(body): ApiJson<Value>,
) -> Result<Response, Problem> {
    caller.may_administer().map_err(|d| denied(d, "agent"))?;
    // A body that is no agent is bad input like an agent that names what does not exist:
    // `400`, naming the field.
    let body: AgentBody =
        serde_json::from_value(body).map_err(|e| Problem::bad_request(format!("agent: {e}")))?;
    let record = state
        .sessions
        .create_agent(body, caller.home_tenant())
        .await?;
    let location = format!("/v1/agents/{}", record.id);
    let mut response = shown(&state, StatusCode::CREATED, record);
    if let Ok(location) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    Ok(response)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    limit: Option<i64>,
    cursor: Option<String>,
    #[serde(default)]
    include_archived: bool,
}

async fn list(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Page<AgentView>>, Problem> {
    let limit = page_limit(q.limit)?;
    let query = AgentQuery {
        limit: one_more(limit),
        before: parse_cursor(q.cursor.as_deref())?,
        include_archived: q.include_archived,
        tenant: caller.tenant().map(str::to_owned),
    };
    let data = state.sessions.agents(&query).await?;
    let page = Page::new(data, limit, |a| a.id.to_string());
    Ok(Json(views(&state, page)))
}

async fn show(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids(id): Ids<AgentId>,
) -> Result<Response, Problem> {
    let record = state
        .sessions
        .agent_seen_by(id, None, caller.tenant())
        .await?;
    Ok(shown(&state, StatusCode::OK, record))
}

/// `If-Match: "<version>"` (the quotes may be left out; `*` matches any version).
fn if_match(headers: &HeaderMap) -> Result<Option<u32>, Problem> {
    let Some(value) = headers.get(header::IF_MATCH) else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or_default().trim();
    if text == "*" {
        return Ok(None);
    }
    let bare = text.strip_prefix("W/").unwrap_or(text).trim_matches('"');
    bare.parse::<u32>().map(Some).map_err(|_| {
        Problem::bad_request(format!(
            "If-Match must name an agent version, such as \"3\"; got {text:?}"
        ))
    })
}

async fn update(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids(id): Ids<AgentId>,
    headers: HeaderMap,
    ApiJson(changes): ApiJson<Map<String, Value>>,
) -> Result<Response, Problem> {
    caller.may_administer().map_err(|d| denied(d, "agent"))?;
    let expected = if_match(&headers)?;
    let record = state
        .sessions
        .update_agent(id, changes, expected, caller.tenant())
        .await?;
    Ok(shown(&state, StatusCode::OK, record))
}

async fn archive(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids(id): Ids<AgentId>,
) -> Result<Response, Problem> {
    caller.may_administer().map_err(|d| denied(d, "agent"))?;
    let record = state.sessions.archive_agent(id, caller.tenant()).await?;
    Ok(shown(&state, StatusCode::OK, record))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct VersionsQuery {
    limit: Option<i64>,
    /// The last version of the page before.
    cursor: Option<String>,
}

async fn versions(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids(id): Ids<AgentId>,
    ApiQuery(q): ApiQuery<VersionsQuery>,
) -> Result<Json<Page<AgentView>>, Problem> {
    let limit = page_limit(q.limit)?;
    let before = match q.cursor.as_deref() {
        None | Some("") => None,
        Some(c) => Some(
            c.parse::<u32>()
                .map_err(|_| Problem::bad_request("cursor is not valid"))?,
        ),
    };
    let data = state
        .sessions
        .agent_versions(id, before, one_more(limit), caller.tenant())
        .await?;
    let page = Page::new(data, limit, |a| a.version.to_string());
    Ok(Json(views(&state, page)))
}

async fn version(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids((id, Version(n))): Ids<(AgentId, Version)>,
) -> Result<Response, Problem> {
    let record = state
        .sessions
        .agent_seen_by(id, Some(n), caller.tenant())
        .await?;
    Ok(shown(&state, StatusCode::OK, record))
}

fn views(state: &AppState, page: Page<AgentRecord>) -> Page<AgentView> {
    Page {
        data: page
            .data
            .into_iter()
            .map(|record| AgentView::of(state, record))
            .collect(),
        next_cursor: page.next_cursor,
    }
}
