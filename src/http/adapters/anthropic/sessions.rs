//! `client.beta.sessions`: tah's sessions under their own UUIDs. A session made here is an
//! ordinary tah session (`/v1/sessions` shows it); its `title` and `metadata` are tah's, and
//! being archived is the one setting this face keeps, in the session's metadata under
//! [`ARCHIVED`] (not shown in their `metadata`).

use axum::extract::{RawQuery, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::environments::check_id;
use super::{known_fields, opt_string, refuse_unless_empty, string_map, Query};
use crate::http::access::{denied, Caller};
use crate::http::extract::Ids;
use crate::http::paging::one_more;
use crate::http::problem::{ApiJson, Problem};
use crate::http::AppState;
use crate::model::{
    AgentChoice, AgentId, Principal, SessionId, SessionOptions, SessionRecord, SessionState,
    VersionChoice,
};
use crate::protocols::anthropic::agents::agent_object;
use crate::protocols::anthropic::events::stamp;
use crate::session::{Follow, IfBusy, NewSession, Pending, RunRequest, SessionQuery};

/// The metadata key that marks a session archived through this face (its time).
pub const ARCHIVED: &str = "anthropic.archived_at";

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/anthropic/v1/sessions", post(create).get(list))
        .route(
            "/anthropic/v1/sessions/{id}",
            get(show).post(update).delete(delete),
        )
        .route("/anthropic/v1/sessions/{id}/archive", post(archive))
}

/// A session as their object.
pub async fn session_object(state: &AppState, record: &SessionRecord) -> Result<Value, Problem> {
    let tag = &record.options.agent.tag;
    let agent = match state.sessions.agent(tag.id, Some(tag.version)).await {
        Ok(agent) => {
            let mut object = agent_object(&agent);
            if let Some(map) = object.as_object_mut() {
                for key in ["metadata", "created_at", "updated_at", "archived_at"] {
                    map.remove(key);
                }
            }
            object
        }
        Err(_) => json!({"type": "agent", "id": tag.id.to_string(), "version": tag.version,
                         "name": tag.name}),
    };
    let mut metadata = crate::protocols::anthropic::agents::string_map(&record.metadata);
    let archived_at = metadata
        .as_object_mut()
        .and_then(|m| m.remove(ARCHIVED))
        .unwrap_or(Value::Null);
    // A turn that waits for answers is idle (`requires_action`), as theirs is.
    let status = match record.state {
        SessionState::Running => "running",
        _ => "idle",
    };
    Ok(json!({
        "type": "session",
        "id": record.id.to_string(),
        "title": record.title,
        "metadata": metadata,
        "status": status,
        "agent": agent,
        "environment_id": super::environments::LOCAL,
        "created_at": stamp(&record.created_at),
        "updated_at": stamp(&record.updated_at),
        "archived_at": archived_at,
        "budget": null,
        "outcome_evaluations": [],
        "resources": [],
        "stats": {},
        "usage": {
            "input_tokens": record.usage.input_tokens,
            "output_tokens": record.usage.output_tokens,
        },
        "vault_ids": [],
    }))
}

pub fn is_archived(record: &SessionRecord) -> bool {
    record.metadata.get(ARCHIVED).is_some_and(|v| !v.is_null())
}

/// `agent`: an id, or `{type: "agent", id, version?}`.
fn agent_choice(value: Option<&Value>) -> Result<AgentChoice, Problem> {
    let parse = |id: &str| -> Result<AgentId, Problem> {
        id.parse()
            .map_err(|_| Problem::not_found(format!("agent {id} not found")))
    };
    match value {
        None | Some(Value::Null) => Err(Problem::bad_request("agent: required")),
        Some(Value::String(id)) => Ok(AgentChoice {
            id: parse(id)?,
            version: VersionChoice::Current,
        }),
        Some(Value::Object(map)) => {
            match map.get("type").and_then(Value::as_str) {
                None | Some("agent") => {}
                Some("agent_with_overrides") => {
                    return Err(Problem::bad_request(
                        "agent.type: agent_with_overrides is not supported; make a new agent \
                         version with the overrides instead",
                    ))
                }
                Some(_) => return Err(Problem::bad_request("agent.type: must be agent")),
            }
            if let Some(key) = map
                .keys()
                .find(|k| !["type", "id", "version"].contains(&k.as_str()))
            {
                return Err(Problem::bad_request(format!("agent.{key}: unknown field")));
            }
            let id = map
                .get("id")
                .and_then(Value::as_str)
                .ok_or_else(|| Problem::bad_request("agent.id: must be a string"))?;
            let version = match map.get("version") {
                None | Some(Value::Null) => VersionChoice::Current,
                Some(Value::Number(n)) => VersionChoice::Pinned(
                    n.as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .filter(|n| *n >= 1)
                        .ok_or_else(|| {
                            Problem::bad_request("agent.version: must be a positive integer")
                        })?,
                ),
                Some(_) => return Err(Problem::bad_request("agent.version: must be an integer")),
            };
            Ok(AgentChoice {
                id: parse(id)?,
                version,
            })
        }
        Some(_) => Err(Problem::bad_request(
            "agent: must be an agent id or {\"type\": \"agent\", \"id\", \"version\"}",
        )),
    }
}

/// Starts a turn with `text` (queued into the running one, if any: tah's `if_busy=queue`).
/// The agent version's custom tools are given as the run's client tools, so that every call of
/// one waits for the client's result whatever the policy says (theirs are outside it).
pub async fn start_turn(
    state: &AppState,
    record: &SessionRecord,
    text: String,
) -> Result<(), Problem> {
    let chosen = &record.options.agent;
    let version = (!chosen.follows_latest).then_some(chosen.tag.version);
    let tools = match state.sessions.agent(chosen.tag.id, version).await {
        Ok(agent) => agent.spec.client_tools,
        Err(_) => Vec::new(),
    };
    let request = RunRequest::run(text, Pending::Refuse)
        .if_busy(IfBusy::Queue)
        .with_client_tools(tools);
    state
        .sessions
        .start(record.id, request, Follow::Record)
        .await?;
    Ok(())
}

/// The text of a `user.message`'s content: text blocks only.
pub fn message_text(content: Option<&Value>, field: &str) -> Result<String, Problem> {
    let blocks = content
        .and_then(Value::as_array)
        .ok_or_else(|| Problem::bad_request(format!("{field}.content: must be an array")))?;
    let mut texts = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        match block["type"].as_str() {
            Some("text") => match block["text"].as_str() {
                Some(text) => texts.push(text),
                None => {
                    return Err(Problem::bad_request(format!(
                        "{field}.content[{i}].text: must be a string"
                    )))
                }
            },
            Some(other) => {
                return Err(Problem::bad_request(format!(
                    "{field}.content[{i}].type: {other} blocks are not supported (only text)"
                )))
            }
            None => {
                return Err(Problem::bad_request(format!(
                    "{field}.content[{i}].type: required"
                )))
            }
        }
    }
    crate::http::runs::input_text(texts.join("\n"))
        .map_err(|_| Problem::bad_request(format!("{field}.content: must hold some text")))
}

async fn create(
    State(state): State<AppState>,
    Caller(caller): Caller,
    RawQuery(raw): RawQuery,
    ApiJson(body): ApiJson<Map<String, Value>>,
) -> Result<Json<Value>, Problem> {
    Query::parse(raw.as_deref(), &[])?;
    known_fields(
        &body,
        &[
            "agent",
            "environment_id",
            "title",
            "metadata",
            "initial_events",
            "budget",
            "resources",
            "vault_ids",
        ],
    )?;
    caller
        .may_create_sessions()
        .map_err(|d| denied(d, "session"))?;
    refuse_unless_empty(
        &body,
        "budget",
        "not supported: tah's budgets are tokens (an agent's max_tokens), not list cost",
    )?;
    refuse_unless_empty(
        &body,
        "resources",
        "not supported: the local environment is the server's workspace (no repositories, \
         files or memory stores are mounted)",
    )?;
    refuse_unless_empty(
        &body,
        "vault_ids",
        "not supported: tah's vault secrets are referenced by an agent's MCP servers",
    )?;
    let environment = opt_string(&body, "environment_id", "environment_id")?
        .ok_or_else(|| Problem::bad_request("environment_id: required"))?;
    check_id(&environment)?;
    let title = opt_string(&body, "title", "title")?;
    if title.as_ref().is_some_and(|t| t.chars().count() > 1_000) {
        return Err(Problem::bad_request("title: longer than 1000 characters"));
    }
    let metadata = string_map(body.get("metadata"), "metadata")?;
    let first = match body.get("initial_events") {
        None | Some(Value::Null) => None,
        Some(Value::Array(events)) => {
            let mut texts = Vec::new();
            for (i, event) in events.iter().enumerate() {
                let field = format!("initial_events[{i}]");
                match event["type"].as_str() {
                    Some("user.message") => texts.push(message_text(event.get("content"), &field)?),
                    Some(other) => {
                        return Err(Problem::bad_request(format!(
                            "{field}.type: {other} is not supported (only user.message)"
                        )))
                    }
                    None => return Err(Problem::bad_request(format!("{field}.type: required"))),
                }
            }
            (!texts.is_empty()).then(|| texts.join("\n"))
        }
        Some(_) => return Err(Problem::bad_request("initial_events: must be an array")),
    };
    let choice = agent_choice(body.get("agent"))?;
    let (agent, version) = state
        .sessions
        .choose_agent(Some(&choice), caller.tenant())
        .await?;
    let tenant = caller.tenant().unwrap_or(&version.tenant).to_string();
    let options = SessionOptions {
        agent,
        ..SessionOptions::default()
    };
    let options = state.sessions.check_options_on(options, &version)?;
    let record = state
        .sessions
        .create(
            NewSession {
                system_prompt: None,
                title,
                metadata,
                options,
                tenant,
                owner: Some(caller.id().to_string()),
            },
            &version,
        )
        .await?;
    if let Some(text) = first {
        start_turn(&state, &record, text).await?;
    }
    let record = state.sessions.get(record.id).await?;
    Ok(Json(session_object(&state, &record).await?))
}

async fn show(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, Problem> {
    Query::parse(raw.as_deref(), &[])?;
    let record = state.sessions.get(id).await?;
    Ok(Json(session_object(&state, &record).await?))
}

async fn update(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    RawQuery(raw): RawQuery,
    ApiJson(body): ApiJson<Map<String, Value>>,
) -> Result<Json<Value>, Problem> {
    Query::parse(raw.as_deref(), &[])?;
    known_fields(
        &body,
        &["title", "metadata", "agent", "budget", "vault_ids"],
    )?;
    refuse_unless_empty(
        &body,
        "agent",
        "not supported: a session's tools are its agent version's (make a new version)",
    )?;
    refuse_unless_empty(&body, "budget", "not supported (see the create's budget)")?;
    refuse_unless_empty(
        &body,
        "vault_ids",
        "not supported (see the create's vault_ids)",
    )?;
    let mut record = state.sessions.get(id).await?;
    if body.contains_key("title") {
        let title = opt_string(&body, "title", "title")?;
        if title.as_ref().is_some_and(|t| t.chars().count() > 1_000) {
            return Err(Problem::bad_request("title: longer than 1000 characters"));
        }
        record.title = title;
    }
    match body.get("metadata") {
        None => {}
        Some(Value::Null) => {
            let archived = record.metadata.get(ARCHIVED).cloned();
            let mut map = Map::new();
            if let Some(archived) = archived {
                map.insert(ARCHIVED.into(), archived);
            }
            record.metadata = Value::Object(map);
        }
        Some(Value::Object(updates)) => {
            let mut map = record.metadata.as_object().cloned().unwrap_or_default();
            for (key, value) in updates {
                if key == ARCHIVED {
                    return Err(Problem::bad_request(format!(
                        "metadata.{key}: reserved (archive the session instead)"
                    )));
                }
                match value {
                    Value::Null => {
                        map.remove(key);
                    }
                    Value::String(_) => {
                        map.insert(key.clone(), value.clone());
                    }
                    _ => {
                        return Err(Problem::bad_request(format!(
                            "metadata.{key}: must be a string or null"
                        )))
                    }
                }
            }
            record.metadata = Value::Object(map);
        }
        Some(_) => return Err(Problem::bad_request("metadata: must be an object")),
    }
    let record = state
        .sessions
        .set_labels(id, record.title, record.metadata)
        .await?;
    Ok(Json(session_object(&state, &record).await?))
}

async fn archive(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, Problem> {
    Query::parse(raw.as_deref(), &[])?;
    let mut record = state.sessions.get(id).await?;
    if !is_archived(&record) {
        if !record.metadata.is_object() {
            record.metadata = json!({});
        }
        record.metadata[ARCHIVED] = json!(stamp(&crate::model::now()));
        record = state
            .sessions
            .set_labels(id, record.title, record.metadata)
            .await?;
    }
    Ok(Json(session_object(&state, &record).await?))
}

async fn delete(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, Problem> {
    Query::parse(raw.as_deref(), &[])?;
    state.sessions.delete(id).await?;
    Ok(Json(
        json!({"id": id.to_string(), "type": "session_deleted"}),
    ))
}

async fn list(
    State(state): State<AppState>,
    Caller(caller): Caller,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, Problem> {
    let query = Query::parse(
        raw.as_deref(),
        &[
            "limit",
            "page",
            "order",
            "agent_id",
            "agent_version",
            "statuses",
            "include_archived",
        ],
    )?;
    caller.may_read_tenant().map_err(|d| denied(d, "session"))?;
    let limit = query.limit()?;
    match query.one("order") {
        None | Some("desc") => {}
        Some(_) => {
            return Err(Problem::bad_request(
                "order: only desc (newest first) is supported",
            ))
        }
    }
    let before = match query.one("page") {
        None | Some("") => None,
        Some(page) => {
            Some(Uuid::parse_str(page).map_err(|_| Problem::bad_request("page: not a cursor"))?)
        }
    };
    let agent_id = query.one("agent_id");
    let agent_version = query.number("agent_version")?;
    let statuses = query.all("statuses");
    if let Some(bad) = statuses
        .iter()
        .find(|s| !["running", "idle", "rescheduling", "terminated"].contains(s))
    {
        return Err(Problem::bad_request(format!(
            "statuses: {bad} is not a session status"
        )));
    }
    let include_archived = query.flag("include_archived")?;
    let mut data = state
        .sessions
        .list(&SessionQuery {
            limit: one_more(limit),
            before,
            state: None,
            parent_id: None,
            tenant: caller.tenant().map(str::to_owned),
            owner: listed_owner(&caller),
        })
        .await?;
    let more = data.len() as i64 > limit;
    data.truncate(limit as usize);
    let next = more
        .then(|| data.last().map(|s| s.id.to_string()))
        .flatten();
    let mut objects = Vec::new();
    for record in &data {
        if !include_archived && is_archived(record) {
            continue;
        }
        let tag = &record.options.agent.tag;
        if agent_id.is_some_and(|a| a != tag.id.to_string()) {
            continue;
        }
        if agent_version.is_some_and(|v| v != tag.version) {
            continue;
        }
        let object = session_object(&state, record).await?;
        if !statuses.is_empty() && !statuses.contains(&object["status"].as_str().unwrap_or("")) {
            continue;
        }
        objects.push(object);
    }
    Ok(Json(
        json!({"data": objects, "next_page": next, "prev_page": null}),
    ))
}

fn listed_owner(caller: &Principal) -> Option<String> {
    caller.listed_owner().map(str::to_owned)
}
