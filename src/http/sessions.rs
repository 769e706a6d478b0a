//! `/v1/sessions`: create, list, get, delete, fork, and the read-only views of a session's
//! messages and steps.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::access::{denied, Caller};
use super::extract::Ids;
use super::paging::{
    one_more, page_by_id, page_limit, parse_cursor, session_page, CursorQuery, Page,
};
use super::problem::{ApiQuery, OptionalJson, Problem};
use super::AppState;
use crate::model::{
    AgentChoice, AgentStep, ClientTool, Message, Rule, RunRecord, SessionOptions, SessionRecord,
    SessionState,
};
use crate::model::{SessionId, StepId};
use crate::session::{NewSession, SessionQuery};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/sessions", post(create).get(list))
        .route("/v1/sessions/{id}", get(show).post(update).delete(delete))
        .route("/v1/sessions/{id}/fork", post(fork))
        .route("/v1/sessions/{id}/messages", get(messages))
        .route("/v1/sessions/{id}/steps", get(steps))
        .route("/v1/sessions/{id}/steps/{step_id}", get(step))
}

const MAX_TITLE_CHARS: usize = 1_000;
const MAX_SYSTEM_PROMPT_CHARS: usize = 100_000;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    system_prompt: Option<String>,
    title: Option<String>,
    metadata: Option<Value>,
    /// The tools it is offered (default: all the server offers).
    tools: Option<Vec<String>>,
    /// Its own policy rules, applied with the server's.
    #[serde(default)]
    tool_policy: Vec<Rule>,
    /// Tools its client runs.
    #[serde(default)]
    client_tools: Vec<ClientTool>,
    /// The directory under the server's workspace its tools see (default: the root).
    workspace: Option<String>,
    /// Token budget of the whole session (input + output), N ≥ 1.
    max_tokens: Option<u64>,
    /// Token budget of each of its runs, N ≥ 1.
    max_run_tokens: Option<u64>,
    /// US dollars its LLM steps may cost over all its runs, a positive number (read here, so
    /// that a refusal names the field).
    max_cost_usd: Option<Value>,
    /// The MCP servers whose tools it is offered (default: all of them).
    mcp_servers: Option<Vec<String>>,
    /// The agent it runs (default: the default agent).
    agent: Option<AgentChoice>,
    /// The environment its built-in tools run in (default: its agent's, else `local`).
    environment: Option<String>,
}

async fn create(
    State(state): State<AppState>,
    Caller(caller): Caller,
    OptionalJson(body): OptionalJson<CreateBody>,
) -> Result<Response, Problem> {
    caller
        .may_create_sessions()
        .map_err(|d| denied(d, "session"))?;
    if body
        .title
        .as_ref()
        .is_some_and(|t| t.chars().count() > MAX_TITLE_CHARS)
    {
        return Err(Problem::bad_request(format!(
            "title is longer than {MAX_TITLE_CHARS} characters"
        )));
    }
    if body
        .system_prompt
        .as_ref()
        .is_some_and(|p| p.chars().count() > MAX_SYSTEM_PROMPT_CHARS)
    {
        return Err(Problem::bad_request(format!(
            "system_prompt is longer than {MAX_SYSTEM_PROMPT_CHARS} characters"
        )));
    }
    if body.metadata.as_ref().is_some_and(|m| !m.is_object()) {
        return Err(Problem::bad_request("metadata must be a JSON object"));
    }
    for (name, value) in [
        ("max_tokens", body.max_tokens),
        ("max_run_tokens", body.max_run_tokens),
    ] {
        if value == Some(0) {
            return Err(Problem::bad_request(format!(
                "{name} must be at least 1 (leave it out for the server's default)"
            )));
        }
    }
    let max_cost_usd = cost_cap(body.max_cost_usd.unwrap_or(Value::Null))?;
    let options = SessionOptions {
        tools: body.tools,
        mcp_servers: body.mcp_servers,
        tool_policy: body.tool_policy,
        client_tools: body.client_tools,
        max_tokens: body.max_tokens,
        max_run_tokens: body.max_run_tokens,
        max_cost_usd,
        ..SessionOptions::default()
    };
    let (agent, version) = state
        .sessions
        .choose_agent(body.agent.as_ref(), caller.tenant())
        .await?;
    // An operator's session belongs to its agent's tenant; anyone else's to their own.
    let tenant = caller.tenant().unwrap_or(&version.tenant).to_string();
    let options = SessionOptions { agent, ..options };
    let mut options = state.sessions.check_options_on(options, &version)?;
    options.environment = Some(
        state
            .sessions
            .session_environment(
                &tenant,
                body.environment.as_deref(),
                version.spec.environment.as_deref(),
            )
            .await?,
    );
    if let Some(workspace) = &body.workspace {
        options.workspace = state.sessions.resolve_workspace(workspace).await?;
    }
    let record = state
        .sessions
        .create(
            NewSession {
                system_prompt: body.system_prompt,
                title: body.title,
                metadata: body.metadata,
                options,
                tenant,
                owner: Some(caller.id().to_string()),
            },
            &version,
        )
        .await?;
    Ok(created(record))
}

/// `201 Created` with a new session (created or forked) and where it lives.
fn created(record: SessionRecord) -> Response {
    let location = format!("/v1/sessions/{}", record.id);
    (
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(SessionView::from(record)),
    )
        .into_response()
}

/// A session as served: the stored record plus, for one session, its last run and what its
/// LLM steps have cost.
#[derive(Debug, Serialize)]
pub struct SessionView {
    #[serde(flatten)]
    record: SessionRecord,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_run: Option<RunRecord>,
    /// US dollars its priced LLM steps have cost (not shown when none had a price).
    #[serde(skip_serializing_if = "Option::is_none")]
    total_cost_usd: Option<f64>,
}

impl From<SessionRecord> for SessionView {
    fn from(record: SessionRecord) -> SessionView {
        SessionView {
            record,
            last_run: None,
            total_cost_usd: None,
        }
    }
}

/// A cap in money as a request gives it: a positive, finite number of US dollars, or `null`
/// (none).
fn cost_cap(value: Value) -> Result<Option<f64>, Problem> {
    match value {
        Value::Null => Ok(None),
        Value::Number(n) if n.as_f64().is_some_and(|usd| usd.is_finite() && usd > 0.0) => {
            Ok(n.as_f64())
        }
        _ => Err(Problem::bad_request(
            "max_cost_usd must be a positive number of US dollars (or null for none)",
        )),
    }
}

/// `POST /v1/sessions/{id}`: changes what may change of a session: `max_cost_usd` (a
/// positive number; `null` clears the session's own cap, its agent's then applies), `title`
/// (a string or `null`) and `metadata` (an object). Answers the session as `GET` does.
async fn update(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    OptionalJson(body): OptionalJson<Value>,
) -> Result<Json<SessionView>, Problem> {
    let Value::Object(fields) = body else {
        return Err(Problem::bad_request("the body must be a JSON object"));
    };
    let mut cap = None;
    let mut title = None;
    let mut metadata = None;
    for (key, value) in fields {
        match key.as_str() {
            "max_cost_usd" => cap = Some(cost_cap(value)?),
            "title" => {
                title = Some(match value {
                    Value::Null => None,
                    Value::String(t) if t.chars().count() <= MAX_TITLE_CHARS => Some(t),
                    Value::String(_) => {
                        return Err(Problem::bad_request(format!(
                            "title is longer than {MAX_TITLE_CHARS} characters"
                        )))
                    }
                    _ => return Err(Problem::bad_request("title must be a string or null")),
                })
            }
            "metadata" if value.is_object() => metadata = Some(value),
            "metadata" => return Err(Problem::bad_request("metadata must be a JSON object")),
            other => {
                return Err(Problem::bad_request(format!(
                    "unknown field {other:?}: a session update takes max_cost_usd, title and \
                     metadata"
                )))
            }
        }
    }
    let sessions = &state.sessions;
    let mut record = sessions.get(id).await?;
    if let Some(cap) = cap {
        record = sessions.set_cost_cap(id, cap).await?;
    }
    if title.is_some() || metadata.is_some() {
        let title = title.unwrap_or(record.title);
        let metadata = metadata.unwrap_or(record.metadata);
        record = sessions.set_labels(id, title, metadata).await?;
    }
    view(&state, record).await.map(Json)
}

/// The session as `GET` serves it: with its last run and its spend.
async fn view(state: &AppState, record: SessionRecord) -> Result<SessionView, Problem> {
    let id = record.id;
    let last_run = match record.last_run_id {
        Some(run_id) => state.sessions.run_record(id, run_id).await?,
        None => None,
    };
    let total_cost_usd = state.sessions.spent(id).await?;
    Ok(SessionView {
        record,
        last_run,
        total_cost_usd,
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    limit: Option<i64>,
    cursor: Option<String>,
    state: Option<String>,
    parent_id: Option<String>,
}

async fn list(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Page<SessionRecord>>, Problem> {
    caller.may_read_tenant().map_err(|d| denied(d, "session"))?;
    let limit = page_limit(q.limit)?;
    let before = parse_cursor(q.cursor.as_deref())?;
    let state_filter = match q.state.as_deref() {
        None | Some("") => None,
        Some(s) => Some(SessionState::parse(s).ok_or_else(|| {
            Problem::bad_request(
                "state must be one of idle, running, waiting_tool, completed, failed, cancelled",
            )
        })?),
    };
    let parent_id = match q.parent_id.as_deref() {
        None | Some("") => None,
        Some(id) => Some(
            Uuid::parse_str(id)
                .map_err(|_| Problem::bad_request("parent_id must be a session id (a UUID)"))?,
        ),
    };
    let data = state
        .sessions
        .list(&SessionQuery {
            limit: one_more(limit),
            before,
            state: state_filter,
            parent_id,
            tenant: caller.tenant().map(str::to_owned),
            owner: caller.listed_owner().map(str::to_owned),
        })
        .await?;
    Ok(Json(Page::new(data, limit, |s| s.id.to_string())))
}

async fn show(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
) -> Result<Json<SessionView>, Problem> {
    let record = state.sessions.get(id).await?;
    view(&state, record).await.map(Json)
}

async fn delete(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
) -> Result<StatusCode, Problem> {
    state.sessions.delete(id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ForkBody {
    turns: Option<Value>,
    /// Another directory under the server's workspace (default: the parent's).
    workspace: Option<String>,
    /// Another agent (default: the parent's).
    agent: Option<AgentChoice>,
}

async fn fork(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids(SessionId(id)): Ids<SessionId>,
    OptionalJson(body): OptionalJson<ForkBody>,
) -> Result<Response, Problem> {
    let turns = match body.turns {
        None | Some(Value::Null) => None,
        // 3.0 is an integer to JSON Schema; 3.5 and -1 are not turn counts.
        Some(Value::Number(n)) => match (n.as_u64(), n.as_f64()) {
            (Some(n), _) => Some(n),
            (None, Some(f)) if f >= 0.0 && f.fract() == 0.0 && f <= u64::MAX as f64 => {
                Some(f as u64)
            }
            _ => return Err(Problem::bad_request("turns must be a non-negative integer")),
        },
        Some(_) => return Err(Problem::bad_request("turns must be a non-negative integer")),
    };
    let record = state
        .sessions
        .fork(
            id,
            turns,
            body.workspace.as_deref(),
            body.agent.as_ref(),
            caller.id(),
        )
        .await?;
    Ok(created(record))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct IndexQuery {
    after: Option<i64>,
    limit: Option<i64>,
}

async fn messages(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    ApiQuery(q): ApiQuery<IndexQuery>,
) -> Result<Json<Page<Message>>, Problem> {
    let limit = page_limit(q.limit)?;
    let after = q.after.unwrap_or(-1).max(-1);
    let read = |id, after, limit| state.sessions.messages_page(id, after, limit);
    session_page(&state, id, limit, after, read, |m| m.index.to_string()).await
}

async fn steps(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    ApiQuery(q): ApiQuery<CursorQuery>,
) -> Result<Json<Page<AgentStep>>, Problem> {
    let sessions = &state.sessions;
    let read = |id, after, limit| async move {
        let steps = sessions.steps_page(id, after, limit).await?;
        Ok(steps.into_iter().map(AgentStep::from).collect())
    };
    page_by_id(&state, id, &q, read, AgentStep::id).await
}

async fn step(
    State(state): State<AppState>,
    Ids((SessionId(id), StepId(step_id))): Ids<(SessionId, StepId)>,
) -> Result<Json<Value>, Problem> {
    state.sessions.get(id).await?;
    let view = state
        .sessions
        .step_with_request(id, step_id)
        .await?
        .ok_or_else(|| Problem::not_found("step not found"))?;
    Ok(Json(view))
}
