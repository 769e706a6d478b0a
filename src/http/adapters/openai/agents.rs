//! `/openai/v1/agents`: OpenAI's Agents API (`client.beta.agents`, `OpenAI-Beta: agents=v1`)
//! over tah's agents and sessions. Agents are tah's agents; a session is a tah session on
//! one of them (`environment` `none` or `openai_hosted` is the local workspace); its events,
//! items, turns (runs), artifacts and subagents (sub-agent sessions) are views of its log
//! and resources ([`crate::protocols::openai::agents`]).

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::responses::{choose_model, client_tools, message_text, tools_shown};
use super::sse;
use crate::http::access::{denied, Caller};
use crate::http::problem::{ApiJson, ApiQuery, OptionalJson, Problem};
use crate::http::AppState;
use crate::model::{
    AgentChoice, AgentId, AgentRecord, ClientTool, Decision, SessionOptions, SessionRecord,
    SessionState,
};
use crate::protocols::calls::{RunCalls, Wait};
use crate::protocols::openai::agents::{
    self, parse_turn, required_actions, turn_id, turn_of, SessionNow, SessionStatic, SessionView,
};
use crate::protocols::openai::FRAMES_PER_EVENT;
use crate::session::{
    AgentBody, AgentQuery, ApprovalAnswer, ArtifactQuery, ArtifactVersions, ClientResult, Follow,
    IfBusy, NewSession, Pending, RunRequest, SessionQuery,
};

pub fn routes() -> Router<AppState> {
    const S: &str = "/openai/v1/agents/sessions/{id}";
    Router::new()
        .route("/openai/v1/agents", post(create_agent).get(list_agents))
        .route(
            "/openai/v1/agents/{agent_id}",
            get(get_agent).post(update_agent).delete(delete_agent),
        )
        .route(
            "/openai/v1/agents/sessions",
            post(create_session).get(list_sessions),
        )
        .route(
            S,
            get(get_session).post(update_session).delete(delete_session),
        )
        .route(&format!("{S}/events"), post(send_events).get(stream_events))
        .route(&format!("{S}/items"), get(items))
        .route(&format!("{S}/turns"), get(turns))
        .route(&format!("{S}/turns/{{turn_id}}"), get(turn))
        .route(&format!("{S}/turns/{{turn_id}}/items"), get(turn_items))
        .route(&format!("{S}/artifacts"), get(artifacts))
        .route(&format!("{S}/artifacts/{{artifact_id}}"), get(artifact))
        .route(
            &format!("{S}/artifacts/{{artifact_id}}/content"),
            get(artifact_content),
        )
        .route(&format!("{S}/subagents"), get(subagents))
        .route(&format!("{S}/subagents/{{subagent_id}}"), get(subagent))
        .route(
            &format!("{S}/subagents/{{subagent_id}}/items"),
            get(subagent_items),
        )
        .route(
            &format!("{S}/subagents/{{subagent_id}}/turns"),
            get(subagent_turns),
        )
        .route(
            &format!("{S}/subagents/{{subagent_id}}/turns/{{turn_id}}"),
            get(subagent_turn),
        )
        .route(
            &format!("{S}/subagents/{{subagent_id}}/turns/{{turn_id}}/items"),
            get(subagent_turn_items),
        )
}

/// Fields that are refused unless null (or, for the listed ones, their neutral value).
fn refuse_rest(rest: &Map<String, Value>) -> Result<(), Problem> {
    let unsupported: Vec<&str> = rest
        .iter()
        .filter(|(name, value)| {
            !value.is_null()
                && !matches!(
                    (name.as_str(), value),
                    ("review", Value::String(v)) if v == "none"
                )
                && !matches!((name.as_str(), value), ("vault_ids", Value::Array(v)) if v.is_empty())
        })
        .map(|(name, _)| name.as_str())
        .collect();
    match unsupported.is_empty() {
        true => Ok(()),
        false => Err(Problem::bad_request(format!(
            "not supported by tah: {} (see the OpenAI page of tah's manual)",
            unsupported.join(", ")
        ))),
    }
}

fn not_found(what: &str, id: &str) -> Problem {
    Problem::not_found(format!("{what} {id} not found"))
}

fn parse_session(raw: &str) -> Result<Uuid, Problem> {
    Uuid::try_parse(raw).map_err(|_| not_found("session", raw))
}

fn parse_agent(raw: &str) -> Result<AgentId, Problem> {
    serde_json::from_value::<AgentId>(json!(raw)).map_err(|_| not_found("agent", raw))
}

// ---------------------------------------------------------------------------------------
// Agents

#[derive(Debug, Deserialize)]
struct AgentParams {
    model: Option<String>,
    name: Option<String>,
    instructions: Option<String>,
    metadata: Option<Value>,
    tools: Option<Vec<Value>>,
    #[serde(flatten)]
    rest: Map<String, Value>,
}

/// An agent as the Agents API shows it.
fn agent_shown(record: &AgentRecord) -> Value {
    json!({
        "id": record.id.to_string(),
        "object": "agent",
        "created_at": record.created_at.timestamp(),
        "updated_at": record.updated_at.timestamp(),
        "name": record.spec.name,
        "model": record.spec.model,
        "instructions": record.spec.system_prompt,
        "metadata": record.spec.metadata,
        "tools": tools_shown(&record.spec.client_tools),
        "multi_agent": { "enabled": !record.spec.subagents.is_empty() },
        "reasoning": { "effort": null },
        "service_tier": "default",
        "text": { "format": { "type": "text" } },
    })
}

async fn create_agent(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiJson(params): ApiJson<AgentParams>,
) -> Result<Response, Problem> {
    caller.may_administer().map_err(|d| denied(d, "agent"))?;
    refuse_rest(&params.rest)?;
    let Some(model) = params.model else {
        return Err(Problem::bad_request("model is required"));
    };
    let tools = client_tools(params.tools.as_deref().unwrap_or_default())?;
    let body = json!({
        "name": params.name.unwrap_or_else(|| "agent".to_string()),
        "model": model,
        "system_prompt": params.instructions,
        "client_tools": tools,
        "metadata": params.metadata.filter(|m| !m.is_null()).unwrap_or(json!({})),
    });
    let body: AgentBody =
        serde_json::from_value(body).map_err(|e| Problem::bad_request(e.to_string()))?;
    let tenant = caller.home_tenant().to_string();
    let record = state.sessions.create_agent(body, &tenant).await?;
    Ok(Json(agent_shown(&record)).into_response())
}

async fn get_agent(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(raw): Path<String>,
) -> Result<Response, Problem> {
    caller.may_read_tenant().map_err(|d| denied(d, "agent"))?;
    let id = parse_agent(&raw)?;
    let record = state
        .sessions
        .agent_seen_by(id, None, caller.tenant())
        .await?;
    Ok(Json(agent_shown(&record)).into_response())
}

async fn update_agent(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(raw): Path<String>,
    ApiJson(params): ApiJson<AgentParams>,
) -> Result<Response, Problem> {
    caller.may_administer().map_err(|d| denied(d, "agent"))?;
    refuse_rest(&params.rest)?;
    let id = parse_agent(&raw)?;
    let mut changes = Map::new();
    if let Some(model) = params.model {
        changes.insert("model".into(), json!(model));
    }
    if let Some(name) = params.name {
        changes.insert("name".into(), json!(name));
    }
    if let Some(instructions) = params.instructions {
        changes.insert("system_prompt".into(), json!(instructions));
    }
    if let Some(metadata) = params.metadata.filter(|m| !m.is_null()) {
        changes.insert("metadata".into(), metadata);
    }
    if let Some(tools) = params.tools {
        changes.insert("client_tools".into(), json!(client_tools(&tools)?));
    }
    let record = state
        .sessions
        .update_agent(id, changes, None, caller.tenant())
        .await?;
    Ok(Json(agent_shown(&record)).into_response())
}

async fn delete_agent(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(raw): Path<String>,
) -> Result<Response, Problem> {
    caller.may_administer().map_err(|d| denied(d, "agent"))?;
    let id = parse_agent(&raw)?;
    let record = state.sessions.archive_agent(id, caller.tenant()).await?;
    let body = json!({ "id": record.id.to_string(), "object": "agent.deleted", "deleted": true });
    Ok(Json(body).into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    after: Option<String>,
    limit: Option<i64>,
    order: Option<String>,
    agent_id: Option<String>,
}

fn list_limit(limit: Option<i64>) -> Result<i64, Problem> {
    let limit = limit.unwrap_or(20);
    match (1..=100).contains(&limit) {
        true => Ok(limit),
        false => Err(Problem::bad_request("limit must be between 1 and 100")),
    }
}

/// Newest first only: tah's lists page backwards from a cursor.
fn check_desc(order: Option<&str>) -> Result<(), Problem> {
    match order {
        None | Some("desc") => Ok(()),
        Some(other) => Err(Problem::bad_request(format!(
            "order {other:?} is not supported: tah lists newest first (desc)"
        ))),
    }
}

fn page(data: Vec<Value>, limit: i64) -> Value {
    let has_more = data.len() as i64 > limit;
    let data: Vec<Value> = data.into_iter().take(limit as usize).collect();
    json!({
        "object": "list",
        "first_id": data.first().map(|v| v["id"].clone()),
        "last_id": data.last().map(|v| v["id"].clone()),
        "has_more": has_more,
        "data": data,
    })
}

async fn list_agents(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Response, Problem> {
    caller.may_read_tenant().map_err(|d| denied(d, "agent"))?;
    check_desc(query.order.as_deref())?;
    if query.agent_id.is_some() {
        return Err(Problem::bad_request(
            "agent_id filters sessions, not agents",
        ));
    }
    let limit = list_limit(query.limit)?;
    let before = match query.after.as_deref() {
        None => None,
        Some(raw) => Some(
            Uuid::try_parse(raw)
                .map_err(|_| Problem::bad_request(format!("after: {raw} is not an agent id")))?,
        ),
    };
    let records = state
        .sessions
        .agents(&AgentQuery {
            limit: limit + 1,
            before,
            include_archived: false,
            tenant: caller.tenant().map(str::to_owned),
        })
        .await?;
    let data = records.iter().map(agent_shown).collect();
    Ok(Json(page(data, limit)).into_response())
}

// ---------------------------------------------------------------------------------------
// Sessions

#[derive(Debug, Deserialize)]
struct SessionParams {
    environment: Option<Value>,
    agent: Option<InlineAgent>,
    agent_id: Option<String>,
    input: Option<Value>,
    metadata: Option<Value>,
    stream: Option<bool>,
    #[serde(flatten)]
    rest: Map<String, Value>,
}

#[derive(Debug, Deserialize)]
struct InlineAgent {
    model: Option<String>,
    instructions: Option<String>,
    tools: Option<Vec<Value>>,
    name: Option<String>,
    #[serde(flatten)]
    rest: Map<String, Value>,
}

/// The local workspace is the environment: `none` and `openai_hosted` map to it.
fn check_environment(environment: Option<&Value>) -> Result<(), Problem> {
    let Some(environment) = environment.filter(|e| !e.is_null()) else {
        return Err(Problem::bad_request("environment is required"));
    };
    match environment["type"].as_str() {
        Some("none" | "openai_hosted") => Ok(()),
        Some("self_hosted") => Err(Problem::bad_request(
            "environment self_hosted is not supported: remote workers are not available yet; \
             use none or openai_hosted (the server's local workspace)",
        )),
        Some(other) => Err(Problem::bad_request(format!(
            "environment.type {other:?} is not supported (none, openai_hosted)"
        ))),
        None => Err(Problem::bad_request("environment.type is required")),
    }
}

/// The text of the Agents API's input messages (or a string).
fn input_text(input: &Value) -> Result<String, Problem> {
    match input {
        Value::String(text) => crate::http::runs::input_text(text.clone()),
        Value::Array(messages) => {
            let mut texts = Vec::new();
            for (i, message) in messages.iter().enumerate() {
                if message["role"].as_str().is_some_and(|r| r != "user") {
                    return Err(Problem::bad_request(format!(
                        "input[{i}]: only user messages can be sent"
                    )));
                }
                texts.push(message_text(i, &message["content"])?);
            }
            crate::http::runs::input_text(texts.join("\n"))
        }
        _ => Err(Problem::bad_request(
            "input must be a string or an array of user messages",
        )),
    }
}

async fn create_session(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiJson(params): ApiJson<SessionParams>,
) -> Result<Response, Problem> {
    caller
        .may_create_sessions()
        .map_err(|d| denied(d, "session"))?;
    refuse_rest(&params.rest)?;
    check_environment(params.environment.as_ref())?;
    if params
        .metadata
        .as_ref()
        .is_some_and(|m| !m.is_object() && !m.is_null())
    {
        return Err(Problem::bad_request("metadata must be an object"));
    }
    let text = match params.input.as_ref().filter(|i| !i.is_null()) {
        Some(input) => Some(input_text(input)?),
        None => None,
    };
    let (chosen, version, system_prompt, tools) = match (&params.agent, &params.agent_id) {
        (Some(_), Some(_)) => return Err(Problem::bad_request("give agent or agent_id, not both")),
        (None, Some(raw)) => {
            let choice = serde_json::from_value::<AgentChoice>(json!(raw))
                .map_err(|_| not_found("agent", raw))?;
            let (chosen, version) = state
                .sessions
                .choose_agent(Some(&choice), caller.tenant())
                .await?;
            (chosen, version, None, Vec::new())
        }
        (Some(inline), None) => {
            refuse_rest(&inline.rest)?;
            let _ = &inline.name;
            let (chosen, version) =
                choose_model(&state, inline.model.as_deref(), caller.tenant()).await?;
            let tools = client_tools(inline.tools.as_deref().unwrap_or_default())?;
            (chosen, version, inline.instructions.clone(), tools)
        }
        (None, None) => {
            let (chosen, version) = state.sessions.choose_agent(None, caller.tenant()).await?;
            (chosen, version, None, Vec::new())
        }
    };
    let tenant = caller.tenant().unwrap_or(&version.tenant).to_string();
    let options = SessionOptions {
        agent: chosen,
        client_tools: tools,
        ..SessionOptions::default()
    };
    let options = state.sessions.check_options_on(options, &version)?;
    let record = state
        .sessions
        .create(
            NewSession {
                system_prompt,
                title: None,
                metadata: params.metadata.clone().filter(|m| !m.is_null()),
                options,
                tenant,
                owner: Some(caller.id().to_string()),
            },
            &version,
        )
        .await?;
    let id = record.id;
    if params.stream == Some(true) {
        let live = state.sessions.subscribe(id)?;
        if let Some(text) = text {
            let request = RunRequest::run(text, Pending::Refuse);
            state.sessions.start(id, request, Follow::Record).await?;
        }
        let info = static_of(&record, &version);
        return Ok(event_stream(&state, id, info, live, -1, true));
    }
    if let Some(text) = text {
        let request = RunRequest::run(text, Pending::Refuse);
        state.sessions.start(id, request, Follow::Record).await?;
    }
    let record = state.sessions.get(id).await?;
    Ok(Json(session_object(&state, &record).await?).into_response())
}

fn static_of(record: &SessionRecord, agent: &AgentRecord) -> SessionStatic {
    let tools: Vec<ClientTool> = agent
        .spec
        .client_tools
        .iter()
        .chain(&record.options.client_tools)
        .cloned()
        .collect();
    SessionStatic {
        id: record.id,
        agent: json!({
            "id": agent.id.to_string(),
            "name": agent.spec.name,
            "model": agent.spec.model,
            "instructions": record.system_prompt.clone().or(agent.spec.system_prompt.clone()),
            "tools": tools_shown(&tools),
            "multi_agent": { "enabled": !agent.spec.subagents.is_empty() },
            "reasoning": { "effort": null },
            "service_tier": "default",
            "text": { "format": { "type": "text" } },
        }),
        created_at: record.created_at.timestamp(),
        metadata: record.metadata.clone(),
    }
}

/// A session's whole log, read into its view.
async fn read_session(state: &AppState, id: Uuid) -> Result<SessionView, Problem> {
    let record = state.sessions.get(id).await?;
    let tag = &record.options.agent.tag;
    let agent = state.sessions.agent(tag.id, Some(tag.version)).await?;
    let mut view = SessionView::new(static_of(&record, &agent));
    state
        .sessions
        .read_log(id, |event| {
            view.push(event);
        })
        .await?;
    Ok(view)
}

/// A session's object from its record (and, while it waits, its last run's calls), without
/// reading its whole log.
async fn session_object(state: &AppState, record: &SessionRecord) -> Result<Value, Problem> {
    let tag = &record.options.agent.tag;
    let agent = state.sessions.agent(tag.id, Some(tag.version)).await?;
    let mut required = Vec::new();
    let status = match record.state {
        SessionState::Running => "in_progress",
        SessionState::WaitingTool => {
            if let Some(run_id) = record.last_run_id {
                if let Some(run) = state.sessions.run_record(record.id, run_id).await? {
                    let mut calls = RunCalls::default();
                    for event in state.sessions.run_events(record.id, &run).await? {
                        calls.apply(&event);
                    }
                    required = required_actions(&calls, Some(run_id));
                }
            }
            "requires_action"
        }
        SessionState::Failed => "failed",
        _ => "idle",
    };
    let error = match record.state {
        SessionState::Failed => record.error.clone(),
        _ => None,
    };
    let now = SessionNow {
        status,
        error,
        last_active_at: record.updated_at.timestamp(),
        usage: record.usage,
        required_actions: required,
    };
    Ok(agents::session_object(&static_of(record, &agent), now))
}

async fn get_session(
    State(state): State<AppState>,
    Path(raw): Path<String>,
) -> Result<Response, Problem> {
    let record = state.sessions.get(parse_session(&raw)?).await?;
    Ok(Json(session_object(&state, &record).await?).into_response())
}

#[derive(Debug, Deserialize)]
struct UpdateParams {
    metadata: Option<Value>,
    #[serde(flatten)]
    rest: Map<String, Value>,
}

/// tah keeps a session's agent and metadata as made: an update may repeat them only.
async fn update_session(
    State(state): State<AppState>,
    Path(raw): Path<String>,
    OptionalJson(params): OptionalJson<Option<UpdateParams>>,
) -> Result<Response, Problem> {
    let id = parse_session(&raw)?;
    let record = state.sessions.get(id).await?;
    if let Some(params) = params {
        refuse_rest(&params.rest)?;
        if let Some(metadata) = params.metadata.filter(|m| !m.is_null()) {
            if metadata != record.metadata {
                return Err(Problem::bad_request(
                    "metadata is not supported in an update: a tah session keeps the \
                     metadata it was made with",
                ));
            }
        }
    }
    Ok(Json(session_object(&state, &record).await?).into_response())
}

async fn delete_session(
    State(state): State<AppState>,
    Path(raw): Path<String>,
) -> Result<Response, Problem> {
    let id = parse_session(&raw)?;
    state.sessions.delete(id).await?;
    let body = json!({ "id": id.to_string(), "object": "agent.session.deleted", "deleted": true });
    Ok(Json(body).into_response())
}

async fn list_sessions(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Response, Problem> {
    caller.may_read_tenant().map_err(|d| denied(d, "session"))?;
    check_desc(query.order.as_deref())?;
    let limit = list_limit(query.limit)?;
    let before = match query.after.as_deref() {
        None => None,
        Some(raw) => Some(
            Uuid::try_parse(raw)
                .map_err(|_| Problem::bad_request(format!("after: {raw} is not a session id")))?,
        ),
    };
    let agent = match query.agent_id.as_deref() {
        None => None,
        Some(raw) => Some(parse_agent(raw)?),
    };
    let mut data = Vec::new();
    let mut cursor = before;
    // Pages of tah's list until `limit + 1` sessions of the agent (or the end).
    loop {
        let records = state
            .sessions
            .list(&SessionQuery {
                limit: 100,
                before: cursor,
                state: None,
                parent_id: None,
                tenant: caller.tenant().map(str::to_owned),
                owner: caller.listed_owner().map(str::to_owned),
            })
            .await?;
        let full = records.len() == 100;
        cursor = records.last().map(|r| r.id);
        for record in records {
            if record.parent_id.is_some() {
                continue;
            }
            if agent.is_some_and(|a| record.options.agent.tag.id != a) {
                continue;
            }
            data.push(session_object(&state, &record).await?);
            if data.len() as i64 > limit {
                break;
            }
        }
        if !full || data.len() as i64 > limit {
            break;
        }
    }
    Ok(Json(page(data, limit)).into_response())
}

// ---------------------------------------------------------------------------------------
// Events

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsBody {
    events: Vec<Value>,
}

async fn send_events(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(raw): Path<String>,
    ApiJson(body): ApiJson<EventsBody>,
) -> Result<Response, Problem> {
    let id = parse_session(&raw)?;
    if body.events.is_empty() {
        return Err(Problem::bad_request("events must not be empty"));
    }
    // Checked first, so that a bad event starts nothing.
    for (i, event) in body.events.iter().enumerate() {
        match event["type"].as_str() {
            Some("agent.session.input.message") => {
                input_text(&event["input"])?;
            }
            Some("agent.session.input.tool_result") => {
                if !event["call_id"].is_string() || !event["success"].is_boolean() {
                    return Err(Problem::bad_request(format!(
                        "events[{i}]: a tool_result needs call_id and success"
                    )));
                }
            }
            Some("agent.session.input.cancel") => {}
            Some(other) => {
                return Err(Problem::bad_request(format!(
                    "events[{i}]: events of type {other} are not supported"
                )))
            }
            None => {
                return Err(Problem::bad_request(format!(
                    "events[{i}].type is required"
                )))
            }
        }
    }
    for event in &body.events {
        match event["type"].as_str() {
            Some("agent.session.input.message") => {
                let text = input_text(&event["input"])?;
                // During an active turn the message steers it (queued for its next step).
                let request = RunRequest::run(text, Pending::Refuse).if_busy(IfBusy::Queue);
                state.sessions.start(id, request, Follow::Record).await?;
            }
            Some("agent.session.input.tool_result") => {
                tool_result(&state, id, event, caller.id()).await?;
            }
            Some("agent.session.input.cancel") => {
                state.sessions.cancel(id).await?;
            }
            _ => {}
        }
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A client's result for a function call, or (for a call that waits for approval) the
/// answer: `success` allows it, anything else denies it with the `error` as reason.
async fn tool_result(
    state: &AppState,
    id: Uuid,
    event: &Value,
    answered_by: &str,
) -> Result<(), Problem> {
    let call_id = event["call_id"].as_str().unwrap_or_default();
    let success = event["success"].as_bool().unwrap_or(false);
    let record = state.sessions.get(id).await?;
    let run = match record.last_run_id {
        Some(run_id) => state.sessions.run_record(id, run_id).await?,
        None => None,
    };
    let mut calls = RunCalls::default();
    if let Some(run) = &run {
        for event in state.sessions.run_events(id, run).await? {
            calls.apply(&event);
        }
    }
    let Some(call) = calls.waiting().find(|c| c.id == call_id) else {
        return Err(Problem::bad_request(format!(
            "tool_result: no call {call_id} waits for a result"
        )));
    };
    let error = event["error"].as_str().map(str::to_string);
    match &call.wait {
        Some(Wait::Client) => {
            let output = match &event["output"] {
                Value::Null => error.unwrap_or_default(),
                Value::String(text) => text.clone(),
                Value::Array(_) => message_text(0, &event["output"])?,
                other => other.to_string(),
            };
            let result = ClientResult {
                call_id: call.id.clone(),
                output,
                is_error: !success,
            };
            state.sessions.client_result(id, result).await?;
        }
        Some(Wait::Approval { .. }) => {
            let answer = ApprovalAnswer {
                decision: if success {
                    Decision::Allow
                } else {
                    Decision::Deny
                },
                reason: error,
                input: None,
                answered_by: Some(answered_by.to_string()),
            };
            state.sessions.approve(id, call.id.clone(), answer).await?;
        }
        None => {}
    }
    Ok(())
}

/// The session's `agent.session.*` events with `id: <n>`: after `Last-Event-ID` when given
/// (the log is read from its start so that items keep their indices; what was sent is
/// skipped), else live only.
async fn stream_events(
    State(state): State<AppState>,
    Path(raw): Path<String>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let id = parse_session(&raw)?;
    let last_event_id = match headers.get("last-event-id") {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<i64>().ok())
                .filter(|n| *n >= 0)
                .ok_or_else(|| Problem::bad_request("Last-Event-ID must be an event id"))?,
        ),
    };
    let live = state.sessions.subscribe(id)?;
    let record = state.sessions.get(id).await?;
    let tag = &record.options.agent.tag;
    let agent = state.sessions.agent(tag.id, Some(tag.version)).await?;
    let after = last_event_id.unwrap_or(record.last_seq * FRAMES_PER_EVENT + FRAMES_PER_EVENT - 1);
    let info = static_of(&record, &agent);
    Ok(event_stream(&state, id, info, live, after, false))
}

/// The stream of a session's events numbered after `after`; with `until_turn_ends`, it ends
/// once the session is idle or failed after a turn (the create stream: it stays open while
/// the turn waits for answers, which the SDK's tool handlers may send).
fn event_stream(
    state: &AppState,
    id: Uuid,
    info: SessionStatic,
    live: crate::session::Subscription,
    after: i64,
    until_turn_ends: bool,
) -> Response {
    let events = state.sessions.stream_from(id, 0, live, None);
    let view = SessionView::new(info);
    let frames = futures::stream::unfold(Some((view, events)), move |phase| async move {
        let (mut view, mut events) = phase?;
        let event = match events.next().await {
            Some(Ok(event)) => event,
            Some(Err(error)) => {
                tracing::warn!(%error, "an agent session's stream ended by a storage error");
                return None;
            }
            None => return None,
        };
        let frames = view.push(&event);
        let ends = until_turn_ends
            && frames
                .iter()
                .any(|f| matches!(f.kind, "agent.session.idle" | "agent.session.failed"));
        let next = (!ends).then_some((view, events));
        Some((frames, next))
    })
    .flat_map(futures::stream::iter)
    .filter(move |frame| std::future::ready(frame.sequence_number > after));
    sse(frames, state.shutdown.clone())
}

// ---------------------------------------------------------------------------------------
// Items, turns, artifacts, subagents

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ItemsQuery {
    after: Option<String>,
    limit: Option<i64>,
    order: Option<String>,
}

/// A page of `all` (in log order) as the query asks.
fn items_page(mut all: Vec<Value>, query: &ItemsQuery) -> Result<Value, Problem> {
    let limit = list_limit(query.limit)?;
    match query.order.as_deref() {
        None | Some("asc") => {}
        Some("desc") => all.reverse(),
        Some(other) => {
            return Err(Problem::bad_request(format!(
                "order must be asc or desc, not {other:?}"
            )))
        }
    }
    if let Some(after) = &query.after {
        let at = all
            .iter()
            .position(|i| i["id"] == after.as_str())
            .ok_or_else(|| Problem::bad_request(format!("after: no item {after}")))?;
        all.drain(..=at);
    }
    all.truncate(limit as usize + 1);
    Ok(page(all, limit))
}

async fn items(
    State(state): State<AppState>,
    Path(raw): Path<String>,
    ApiQuery(query): ApiQuery<ItemsQuery>,
) -> Result<Response, Problem> {
    let view = read_session(&state, parse_session(&raw)?).await?;
    Ok(Json(items_page(view.items().to_vec(), &query)?).into_response())
}

async fn turns(
    State(state): State<AppState>,
    Path(raw): Path<String>,
    ApiQuery(query): ApiQuery<ItemsQuery>,
) -> Result<Response, Problem> {
    turns_of(&state, parse_session(&raw)?, &query).await
}

async fn turn(
    State(state): State<AppState>,
    Path((raw, turn)): Path<(String, String)>,
) -> Result<Response, Problem> {
    turn_in(&state, parse_session(&raw)?, &turn).await
}

async fn turn_items(
    State(state): State<AppState>,
    Path((raw, turn)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<ItemsQuery>,
) -> Result<Response, Problem> {
    turn_items_in(&state, parse_session(&raw)?, &turn, &query).await
}

/// The turns (runs) of a session.
async fn turns_of(state: &AppState, id: Uuid, query: &ItemsQuery) -> Result<Response, Problem> {
    let record = state.sessions.get(id).await?;
    let agent_id = json!(record.options.agent.tag.id.to_string());
    let runs = state.sessions.runs_page(id, None, 10_000).await?;
    let all = runs.iter().map(|r| turn_of(r, id, &agent_id)).collect();
    Ok(Json(items_page(all, query)?).into_response())
}

async fn turn_in(state: &AppState, id: Uuid, turn: &str) -> Result<Response, Problem> {
    let run_id = parse_turn(turn).ok_or_else(|| not_found("turn", turn))?;
    let record = state.sessions.get(id).await?;
    let run = state
        .sessions
        .run_record(id, run_id)
        .await?
        .ok_or_else(|| not_found("turn", turn))?;
    let agent_id = json!(record.options.agent.tag.id.to_string());
    Ok(Json(turn_of(&run, id, &agent_id)).into_response())
}

async fn turn_items_in(
    state: &AppState,
    id: Uuid,
    turn: &str,
    query: &ItemsQuery,
) -> Result<Response, Problem> {
    let run_id = parse_turn(turn).ok_or_else(|| not_found("turn", turn))?;
    state
        .sessions
        .run_record(id, run_id)
        .await?
        .ok_or_else(|| not_found("turn", turn))?;
    let view = read_session(state, id).await?;
    let wanted = turn_id(run_id);
    let all = view
        .items()
        .iter()
        .filter(|i| i["turn_id"] == wanted.as_str())
        .cloned()
        .collect();
    Ok(Json(items_page(all, query)?).into_response())
}

fn artifact_shown(session: Uuid, a: &crate::model::ArtifactRecord) -> Value {
    json!({
        "id": a.id.to_string(),
        "object": "agent.session.artifact",
        "created_at": a.created_at.timestamp(),
        "environment_id": "local",
        "path": a.path,
        "session_id": session.to_string(),
        "size_bytes": a.size,
        "turn_id": turn_id(a.run_id),
    })
}

async fn artifacts(
    State(state): State<AppState>,
    Path(raw): Path<String>,
    ApiQuery(query): ApiQuery<ItemsQuery>,
) -> Result<Response, Problem> {
    let id = parse_session(&raw)?;
    state.sessions.get(id).await?;
    let all = state
        .sessions
        .artifacts_page(
            id,
            ArtifactQuery {
                versions: ArtifactVersions::Newest,
                after: None,
                limit: 10_000,
            },
        )
        .await?;
    let all = all.iter().map(|a| artifact_shown(id, a)).collect();
    Ok(Json(items_page(all, &query)?).into_response())
}

async fn find_artifact(
    state: &AppState,
    raw: &str,
    artifact: &str,
) -> Result<(Uuid, crate::model::ArtifactRecord), Problem> {
    let id = parse_session(raw)?;
    let artifact_id = Uuid::try_parse(artifact).map_err(|_| not_found("artifact", artifact))?;
    let record = state
        .sessions
        .artifact(id, artifact_id)
        .await?
        .ok_or_else(|| not_found("artifact", artifact))?;
    Ok((id, record))
}

async fn artifact(
    State(state): State<AppState>,
    Path((raw, artifact)): Path<(String, String)>,
) -> Result<Response, Problem> {
    let (id, record) = find_artifact(&state, &raw, &artifact).await?;
    Ok(Json(artifact_shown(id, &record)).into_response())
}

async fn artifact_content(
    State(state): State<AppState>,
    Path((raw, artifact)): Path<(String, String)>,
) -> Result<Response, Problem> {
    let (_, record) = find_artifact(&state, &raw, &artifact).await?;
    let bytes = state
        .sessions
        .blob(&record.sha256)
        .await?
        .ok_or_else(|| not_found("artifact", &artifact))?;
    let mut response = bytes.into_response();
    if let Ok(value) = HeaderValue::from_str(&record.media_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    Ok(response)
}

async fn subagents(
    State(state): State<AppState>,
    Path(raw): Path<String>,
    ApiQuery(query): ApiQuery<ItemsQuery>,
) -> Result<Response, Problem> {
    let view = read_session(&state, parse_session(&raw)?).await?;
    Ok(Json(items_page(view.subagents.clone(), &query)?).into_response())
}

/// A sub-agent of the session: one of the child sessions its log started.
async fn find_subagent(
    state: &AppState,
    raw: &str,
    subagent: &str,
) -> Result<(SessionView, Value), Problem> {
    let view = read_session(state, parse_session(raw)?).await?;
    let found = view
        .subagents
        .iter()
        .find(|s| s["id"] == subagent)
        .cloned()
        .ok_or_else(|| not_found("subagent", subagent))?;
    Ok((view, found))
}

async fn subagent(
    State(state): State<AppState>,
    Path((raw, subagent)): Path<(String, String)>,
) -> Result<Response, Problem> {
    let (_, found) = find_subagent(&state, &raw, &subagent).await?;
    Ok(Json(found).into_response())
}

/// The sub-agent's session, once it is known to be one of the session's.
async fn child_of(state: &AppState, raw: &str, subagent: &str) -> Result<Uuid, Problem> {
    find_subagent(state, raw, subagent).await?;
    parse_session(subagent)
}

async fn subagent_turns(
    State(state): State<AppState>,
    Path((raw, subagent)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<ItemsQuery>,
) -> Result<Response, Problem> {
    let child = child_of(&state, &raw, &subagent).await?;
    turns_of(&state, child, &query).await
}

async fn subagent_turn(
    State(state): State<AppState>,
    Path((raw, subagent, turn)): Path<(String, String, String)>,
) -> Result<Response, Problem> {
    let child = child_of(&state, &raw, &subagent).await?;
    turn_in(&state, child, &turn).await
}

async fn subagent_turn_items(
    State(state): State<AppState>,
    Path((raw, subagent, turn)): Path<(String, String, String)>,
    ApiQuery(query): ApiQuery<ItemsQuery>,
) -> Result<Response, Problem> {
    let child = child_of(&state, &raw, &subagent).await?;
    turn_items_in(&state, child, &turn, &query).await
}

async fn subagent_items(
    State(state): State<AppState>,
    Path((raw, subagent)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<ItemsQuery>,
) -> Result<Response, Problem> {
    let child = child_of(&state, &raw, &subagent).await?;
    let view = read_session(&state, child).await?;
    Ok(Json(items_page(view.items().to_vec(), &query)?).into_response())
}
