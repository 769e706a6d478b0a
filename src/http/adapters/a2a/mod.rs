//! A2A v1.0 (SPEC §19), as `@a2a-js/sdk` 1.3.0 and `a2a-sdk` 1.3.0 clients call it:
//!
//! - `GET /a2a/{agent_id}/.well-known/agent-card.json`: the agent's card;
//!   `GET /.well-known/agent-card.json`: the default agent's.
//! - `POST /a2a/{agent_id}`: the JSON-RPC binding (`SendMessage`, `SendStreamingMessage`,
//!   `GetTask`, `ListTasks`, `CancelTask`, `SubscribeToTask`, the push-notification config
//!   methods, `GetExtendedAgentCard`).
//! - The HTTP+JSON binding under `/a2a/{agent_id}`: `POST /message:send`,
//!   `POST /message:stream`, `GET /tasks`, `GET /tasks/{id}`, `POST /tasks/{id}:cancel`,
//!   `POST /tasks/{id}:subscribe`, `…/tasks/{id}/pushNotificationConfigs[/{config_id}]`.
//!
//! A `contextId` is a session of the agent (none: a new one), a task is a run (its id is the
//! run's). Streams carry tah's `seq` as each frame's SSE `id:` and `metadata.tah_seq`;
//! `SubscribeToTask` replays the task from its first event, or from after `Last-Event-ID`.
//! Errors: JSON-RPC error objects with A2A's codes; on the HTTP+JSON binding, a problem+json
//! whose `error` member is the `google.rpc.Status` A2A's clients read (`details[0].reason`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use futures::{Stream, StreamExt};
use serde_json::{json, Map, Value};
use uuid::Uuid;

use self::push::PushConfig;
use super::still_parked;

mod push;
use crate::http::access::{self, Caller};
use crate::http::events::HEARTBEAT;
use crate::http::problem::{Problem, PROBLEM_JSON};
use crate::http::AppState;
use crate::model::{
    AgentChoice, AgentId, Decision, Principal, RunRecord, SessionNeed, VersionChoice,
};
use crate::protocols::a2a::{
    read_parts, Answer, PartsError, TaskState, TaskView, PROTOCOL_VERSION,
};
use crate::protocols::calls::Wait;
use crate::session::{
    ApprovalAnswer, ClientResult, EventStream, Follow, Pending, RunRequest, SessionError,
};

/// What the face knows of the server's settings.
#[derive(Debug, Clone, Copy, Default)]
pub struct Face {
    /// The server requires authentication (what the cards' security schemes say).
    pub auth_required: bool,
    /// Push notifications may go to private, loopback and link-local addresses.
    pub allow_private_push: bool,
}

pub fn routes(face: Face) -> Router<AppState> {
    Router::new()
        .route("/.well-known/agent-card.json", get(root_card))
        .route("/a2a/{agent_id}/.well-known/agent-card.json", get(card))
        .route("/a2a/{agent_id}", post(json_rpc))
        .route("/a2a/{agent_id}/message:send", post(rest_send))
        .route("/a2a/{agent_id}/message:stream", post(rest_stream))
        .route("/a2a/{agent_id}/tasks", get(rest_list))
        .route(
            "/a2a/{agent_id}/tasks/{task}",
            get(rest_get).post(rest_task_action),
        )
        .route(
            "/a2a/{agent_id}/tasks/{task}/pushNotificationConfigs",
            get(rest_push_list).post(rest_push_create),
        )
        .route(
            "/a2a/{agent_id}/tasks/{task}/pushNotificationConfigs/{config_id}",
            get(rest_push_get).delete(rest_push_delete),
        )
        .route("/a2a/{agent_id}/extendedAgentCard", get(rest_extended_card))
        .layer(Extension(face))
}

// ---------------------------------------------------------------------------------------------
// Errors

/// An A2A error: its JSON-RPC code, the HTTP status and `google.rpc` reason of the HTTP+JSON
/// binding, and a message.
#[derive(Debug, Clone)]
pub struct A2aError {
    code: i64,
    status: StatusCode,
    reason: &'static str,
    message: String,
}

impl A2aError {
    fn new(
        code: i64,
        status: StatusCode,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Self {
        A2aError {
            code,
            status,
            reason,
            message: message.into(),
        }
    }
    pub fn task_not_found(message: impl Into<String>) -> Self {
        Self::new(-32001, StatusCode::NOT_FOUND, "TASK_NOT_FOUND", message)
    }
    fn not_cancelable(message: impl Into<String>) -> Self {
        Self::new(
            -32002,
            StatusCode::BAD_REQUEST,
            "TASK_NOT_CANCELABLE",
            message,
        )
    }
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(
            -32004,
            StatusCode::BAD_REQUEST,
            "UNSUPPORTED_OPERATION",
            message,
        )
    }
    fn content_type(message: impl Into<String>) -> Self {
        Self::new(
            -32005,
            StatusCode::BAD_REQUEST,
            "CONTENT_TYPE_NOT_SUPPORTED",
            message,
        )
    }
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(-32602, StatusCode::BAD_REQUEST, "INVALID_PARAMS", message)
    }
    fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(-32600, StatusCode::BAD_REQUEST, "INVALID_REQUEST", message)
    }
    fn method_not_found(message: impl Into<String>) -> Self {
        Self::new(-32601, StatusCode::NOT_FOUND, "METHOD_NOT_FOUND", message)
    }
    fn parse_error(message: impl Into<String>) -> Self {
        Self::new(-32700, StatusCode::BAD_REQUEST, "PARSE_ERROR", message)
    }

    /// The JSON-RPC error object.
    fn rpc(&self) -> Value {
        json!({ "code": self.code, "message": self.message })
    }

    /// The HTTP+JSON answer: a problem+json with the `google.rpc.Status` as its `error`.
    fn rest(&self) -> Response {
        let status_name = match self.status.as_u16() {
            400 => "INVALID_ARGUMENT",
            401 => "UNAUTHENTICATED",
            403 => "PERMISSION_DENIED",
            404 => "NOT_FOUND",
            409 => "FAILED_PRECONDITION",
            429 => "RESOURCE_EXHAUSTED",
            _ if self.status.is_server_error() => "INTERNAL",
            _ => "FAILED_PRECONDITION",
        };
        let status_name = match self.reason {
            "TASK_NOT_CANCELABLE" | "PUSH_NOTIFICATION_NOT_SUPPORTED" | "UNSUPPORTED_OPERATION" => {
                "FAILED_PRECONDITION"
            }
            _ => status_name,
        };
        let problem = Problem::new(
            self.status,
            &self.reason.to_lowercase().replace('_', "-"),
            &self.message,
        );
        let mut body = serde_json::to_value(&problem).unwrap_or_else(|_| json!({}));
        body["error"] = json!({
            "code": self.status.as_u16(),
            "status": status_name,
            "message": self.message,
            "details": [{
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": self.reason,
                "domain": "a2a-protocol.org",
            }],
        });
        let mut response = (self.status, Json(body)).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        response
    }
}

impl From<Problem> for A2aError {
    fn from(problem: Problem) -> A2aError {
        let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::BAD_REQUEST);
        let detail = problem.detail;
        match status.as_u16() {
            404 => A2aError::task_not_found(detail),
            400 | 422 => A2aError::invalid_params(detail),
            409 => A2aError::new(
                -32004,
                StatusCode::CONFLICT,
                "UNSUPPORTED_OPERATION",
                detail,
            ),
            401 | 403 => A2aError::new(-32600, status, "PERMISSION_DENIED", detail),
            429 => A2aError::new(-32603, status, "RESOURCE_EXHAUSTED", detail),
            _ => A2aError::new(-32603, status, "INTERNAL", detail),
        }
    }
}

impl From<SessionError> for A2aError {
    fn from(error: SessionError) -> A2aError {
        A2aError::from(Problem::from(error))
    }
}

type A2aResult<T> = Result<T, A2aError>;

// ---------------------------------------------------------------------------------------------
// The request's context

/// Who calls which agent, and where the server is reached.
#[derive(Clone)]
struct Ctx {
    state: AppState,
    caller: Principal,
    agent: AgentId,
    base_url: String,
    face: Face,
}

/// Where the client reached the server: `http(s)://host`, from `Host` (and
/// `X-Forwarded-Proto` behind a proxy).
fn base_url(headers: &HeaderMap) -> String {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    let scheme = headers
        .get("x-forwarded-proto")
        .and_then(|h| h.to_str().ok())
        .filter(|p| *p == "https" || *p == "http")
        .unwrap_or("http");
    format!("{scheme}://{host}")
}

fn agent_id(raw: &str) -> A2aResult<AgentId> {
    raw.parse()
        .map_err(|_| A2aError::task_not_found(format!("agent {raw:?} not found")))
}

/// The request's context, once the agent is known to be one the caller sees.
async fn ctx(
    (state, face): (AppState, Face),
    caller: Principal,
    agent: &str,
    headers: &HeaderMap,
) -> A2aResult<Ctx> {
    if let Some(version) = headers.get("a2a-version") {
        let version = version.to_str().unwrap_or("").trim();
        if !version.is_empty() && version != PROTOCOL_VERSION && version != "1" {
            return Err(A2aError::new(
                -32009,
                StatusCode::BAD_REQUEST,
                "VERSION_NOT_SUPPORTED",
                format!("A2A-Version {version:?} is not supported: this server speaks {PROTOCOL_VERSION}"),
            ));
        }
    }
    let agent = agent_id(agent)?;
    state
        .sessions
        .agent_seen_by(agent, None, caller.tenant())
        .await
        .map_err(|error| match error {
            SessionError::AgentNotFound(detail) => A2aError::task_not_found(detail),
            other => A2aError::from(other),
        })?;
    Ok(Ctx {
        state,
        caller,
        agent,
        base_url: base_url(headers),
        face,
    })
}

// ---------------------------------------------------------------------------------------------
// Agent cards

async fn root_card(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Extension(face): Extension<Face>,
    headers: HeaderMap,
) -> Response {
    card_response(state, caller, AgentId::Default, face, &headers).await
}

async fn card(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Extension(face): Extension<Face>,
    Path(agent): Path<String>,
    headers: HeaderMap,
) -> Response {
    let Ok(agent) = agent.parse::<AgentId>() else {
        return Problem::not_found("agent not found").into_response();
    };
    card_response(state, caller, agent, face, &headers).await
}

async fn card_response(
    state: AppState,
    caller: Principal,
    agent: AgentId,
    face: Face,
    headers: &HeaderMap,
) -> Response {
    if let Err(denied) = caller.may_read_tenant() {
        return access::denied(denied, "agent").into_response();
    }
    let record = match state
        .sessions
        .agent_seen_by(agent, None, caller.tenant())
        .await
    {
        Ok(record) => record,
        Err(error) => return Problem::from(error).into_response(),
    };
    let url = format!("{}/a2a/{}", base_url(headers), record.id);
    let offered = record.spec.tools.as_ref();
    let skills: Vec<Value> = state
        .sessions
        .tools()
        .into_iter()
        .filter(|tool| offered.is_none_or(|names| names.contains(&tool.name)))
        .map(|tool| {
            json!({
                "id": tool.name,
                "name": tool.name,
                "description": tool.description,
                "tags": ["tool"],
            })
        })
        .collect();
    let description = record
        .spec
        .description
        .clone()
        .unwrap_or_else(|| format!("The tah agent {}", record.spec.name));
    let mut card = json!({
        "name": record.spec.name,
        "description": description,
        "version": record.version.to_string(),
        "supportedInterfaces": [
            {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": PROTOCOL_VERSION},
            {"url": url, "protocolBinding": "HTTP+JSON", "protocolVersion": PROTOCOL_VERSION},
        ],
        "capabilities": {
            "streaming": true,
            "pushNotifications": true,
            "extendedAgentCard": false,
        },
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": skills,
    });
    if face.auth_required || !caller.is_operator() {
        card["securitySchemes"] = json!({
            "bearer": {"httpAuthSecurityScheme": {
                "scheme": "Bearer",
                "description": "a tah key (tah_…), a session token (tahs_…), a deployment token or a JWT",
            }},
            "apiKey": {"apiKeySecurityScheme": {
                "location": "header",
                "name": "x-api-key",
                "description": "the same credentials, in the x-api-key header",
            }},
        });
        card["securityRequirements"] = json!([
            {"schemes": {"bearer": {"list": []}}},
            {"schemes": {"apiKey": {"list": []}}},
        ]);
    }
    Json(card).into_response()
}

// ---------------------------------------------------------------------------------------------
// JSON-RPC

async fn json_rpc(
    State(state): State<AppState>,
    Extension(face): Extension<Face>,
    Caller(caller): Caller,
    Path(agent): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let request: Value = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(error) => {
            return rpc_error(
                Value::Null,
                A2aError::parse_error(format!("the body is not JSON: {error}")),
            )
        }
    };
    let Some(object) = request.as_object() else {
        let what = match request.is_array() {
            true => "batches are not supported: send one request per call",
            false => "a JSON-RPC request must be an object",
        };
        return rpc_error(Value::Null, A2aError::invalid_request(what));
    };
    let id = match object.get("id") {
        Some(id @ (Value::String(_) | Value::Number(_))) => id.clone(),
        Some(Value::Null) | None => {
            return rpc_error(
                Value::Null,
                A2aError::invalid_request("id (a string or a number) is required"),
            )
        }
        Some(_) => {
            return rpc_error(
                Value::Null,
                A2aError::invalid_request("id must be a string or a number"),
            )
        }
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return rpc_error(id, A2aError::invalid_request("jsonrpc must be \"2.0\""));
    }
    for key in object.keys() {
        if !["jsonrpc", "id", "method", "params"].contains(&key.as_str()) {
            return rpc_error(
                id,
                A2aError::invalid_request(format!("{key:?} is not a JSON-RPC request member")),
            );
        }
    }
    let Some(method) = object.get("method").and_then(Value::as_str) else {
        return rpc_error(id, A2aError::invalid_request("method must be a string"));
    };
    let params = match object.get("params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(params)) => params.clone(),
        Some(_) => return rpc_error(id, A2aError::invalid_params("params must be an object")),
    };
    let ctx = match ctx((state, face), caller, &agent, &headers).await {
        Ok(ctx) => ctx,
        Err(error) => return rpc_error(id, error),
    };
    let result = match method {
        "SendMessage" => send_message(&ctx, &params).await,
        "SendStreamingMessage" => {
            return match send_streaming(&ctx, &params).await {
                Ok(frames) => rpc_stream(&ctx, id, frames),
                Err(error) => rpc_error(id, error),
            }
        }
        "SubscribeToTask" => {
            return match subscribe(&ctx, &params, &headers).await {
                Ok(frames) => rpc_stream(&ctx, id, frames),
                Err(error) => rpc_error(id, error),
            }
        }
        "GetTask" => get_task(&ctx, &params).await,
        "ListTasks" => list_tasks(&ctx, &params).await,
        "CancelTask" => cancel_task(&ctx, &params).await,
        "CreateTaskPushNotificationConfig" => push_create(&ctx, &params).await,
        "GetTaskPushNotificationConfig" => push_get(&ctx, &params).await,
        "ListTaskPushNotificationConfigs" => push_list(&ctx, &params).await,
        "DeleteTaskPushNotificationConfig" => push_delete(&ctx, &params).await.map(|()| json!({})),
        "GetExtendedAgentCard" => Err(extended_card_error()),
        other => Err(A2aError::method_not_found(match other.contains('/') {
            true => format!(
                "method {other:?} is A2A 0.3's; this server speaks A2A {PROTOCOL_VERSION} \
                 (SendMessage, GetTask, …)"
            ),
            false => format!("method {other:?} does not exist"),
        })),
    };
    match result {
        Ok(result) => Json(json!({"jsonrpc": "2.0", "id": id, "result": result})).into_response(),
        Err(error) => rpc_error(id, error),
    }
}

fn rpc_error(id: Value, error: A2aError) -> Response {
    let body = json!({"jsonrpc": "2.0", "id": id, "error": error.rpc()});
    // Refusals of the caller keep their HTTP status; the others are answered with 200, as
    // JSON-RPC over HTTP does.
    let status = match error.status.as_u16() {
        401 | 403 => error.status,
        _ => StatusCode::OK,
    };
    (status, Json(body)).into_response()
}

fn extended_card_error() -> A2aError {
    A2aError::new(
        -32007,
        StatusCode::BAD_REQUEST,
        "EXTENDED_AGENT_CARD_NOT_CONFIGURED",
        "there is no extended agent card: the card is the same for every caller that sees it",
    )
}

// ---------------------------------------------------------------------------------------------
// Parameters

type Params = Map<String, Value>;

/// Refuses members of `object` that are not in `known`, naming them (`at`: where it is).
fn only(object: &Params, known: &[&str], at: &str) -> A2aResult<()> {
    match object.keys().find(|key| !known.contains(&key.as_str())) {
        Some(key) => Err(A2aError::invalid_params(format!(
            "{at}{key} is not supported (known: {})",
            known.join(", ")
        ))),
        None => Ok(()),
    }
}

fn string_param<'a>(params: &'a Params, name: &str) -> A2aResult<Option<&'a str>> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(A2aError::invalid_params(format!("{name} must be a string"))),
    }
}

/// An integer parameter (ProtoJSON may send it as a string).
fn int_param(params: &Params, name: &str) -> A2aResult<Option<i64>> {
    let bad = || A2aError::invalid_params(format!("{name} must be a non-negative integer"));
    let n = match params.get(name) {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Number(n)) => n.as_i64().ok_or_else(bad)?,
        Some(Value::String(s)) => s.parse().map_err(|_| bad())?,
        Some(_) => return Err(bad()),
    };
    if n < 0 {
        return Err(bad());
    }
    Ok(Some(n))
}

fn bool_param(params: &Params, name: &str) -> A2aResult<Option<bool>> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(Value::String(s)) if s == "true" || s == "false" => Ok(Some(s == "true")),
        Some(_) => Err(A2aError::invalid_params(format!(
            "{name} must be a boolean"
        ))),
    }
}

fn no_tenant(params: &Params) -> A2aResult<()> {
    match string_param(params, "tenant")? {
        None => Ok(()),
        Some(_) => Err(A2aError::invalid_params(
            "tenant is not supported: a caller acts in its own tenant, which its credentials say",
        )),
    }
}

fn uuid_param(params: &Params, name: &str, what: &str) -> A2aResult<Uuid> {
    let Some(raw) = string_param(params, name)? else {
        return Err(A2aError::invalid_params(format!("{name} is required")));
    };
    Uuid::parse_str(raw).map_err(|_| A2aError::task_not_found(format!("{what} {raw:?} not found")))
}

// ---------------------------------------------------------------------------------------------
// Sessions and tasks

/// The session `id` as a context of this agent the caller may use as `need` asks.
async fn context(ctx: &Ctx, id: Uuid, need: SessionNeed) -> A2aResult<crate::model::SessionRecord> {
    let not_found = || A2aError::task_not_found(format!("context {id} not found"));
    access::check_session_access(&ctx.state.sessions, &ctx.caller, id, need)
        .await
        .map_err(|problem| match problem.status {
            404 => not_found(),
            _ => A2aError::from(problem),
        })?;
    let record = ctx.state.sessions.get(id).await.map_err(|_| not_found())?;
    if record.options.agent.tag.id != ctx.agent {
        return Err(A2aError::task_not_found(format!(
            "context {id} is a session of agent {}, not of {}",
            record.options.agent.tag.id, ctx.agent
        )));
    }
    Ok(record)
}

/// The task `id` (a run) and its context, if the caller may use it as `need` asks.
async fn task(ctx: &Ctx, id: Uuid, need: SessionNeed) -> A2aResult<(Uuid, RunRecord)> {
    let not_found = || A2aError::task_not_found(format!("task {id} not found"));
    let session = ctx
        .state
        .sessions
        .run_session(id)
        .await?
        .ok_or_else(not_found)?;
    context(ctx, session, need)
        .await
        .map_err(|error| match error.code {
            -32001 => not_found(),
            _ => error,
        })?;
    let run = ctx
        .state
        .sessions
        .run_record(session, id)
        .await?
        .ok_or_else(not_found)?;
    Ok((session, run))
}

/// The task as its events so far tell.
async fn view_of(ctx: &Ctx, session: Uuid, run: &RunRecord) -> A2aResult<TaskView> {
    let mut view = TaskView::new(run, &ctx.base_url);
    for event in ctx.state.sessions.run_events(session, run).await? {
        view.push(&event);
    }
    Ok(view)
}

fn history_length(params: &Params) -> A2aResult<Option<usize>> {
    Ok(int_param(params, "historyLength")?.map(|n| n as usize))
}

// ---------------------------------------------------------------------------------------------
// SendMessage, SendStreamingMessage

/// What a send asks, once read.
struct SendAsk {
    context_id: Option<Uuid>,
    task_id: Option<Uuid>,
    text: Option<String>,
    answers: Vec<Answer>,
    history_length: Option<usize>,
    return_immediately: bool,
    push: Option<Params>,
}

fn read_send(params: &Params) -> A2aResult<SendAsk> {
    only(
        params,
        &["tenant", "message", "configuration", "metadata"],
        "",
    )?;
    no_tenant(params)?;
    if params.get("metadata").is_some_and(|m| !is_empty(m)) {
        return Err(A2aError::invalid_params(
            "metadata is not supported on a request: tah keeps no request metadata",
        ));
    }
    let Some(message) = params.get("message").and_then(Value::as_object) else {
        return Err(A2aError::invalid_params("message (an object) is required"));
    };
    only(
        message,
        &[
            "messageId",
            "contextId",
            "taskId",
            "role",
            "parts",
            "metadata",
            "extensions",
            "referenceTaskIds",
        ],
        "message.",
    )?;
    for unsupported in ["metadata", "extensions", "referenceTaskIds"] {
        if message.get(unsupported).is_some_and(|m| !is_empty(m)) {
            return Err(A2aError::invalid_params(format!(
                "message.{unsupported} is not supported"
            )));
        }
    }
    if string_param(message, "messageId")?.is_none() {
        return Err(A2aError::invalid_params("message.messageId is required"));
    }
    match message.get("role") {
        None | Some(Value::Null) => {}
        Some(Value::String(role)) if role == "ROLE_USER" => {}
        Some(Value::Number(n)) if n.as_i64() == Some(1) => {}
        Some(other) => {
            return Err(A2aError::invalid_params(format!(
                "message.role must be ROLE_USER, not {other}"
            )))
        }
    }
    let parse_id = |name: &str, what: &str| -> A2aResult<Option<Uuid>> {
        match string_param(message, name)? {
            None => Ok(None),
            Some(raw) => Uuid::parse_str(raw)
                .map(Some)
                .map_err(|_| A2aError::task_not_found(format!("{what} {raw:?} not found"))),
        }
    };
    let context_id = parse_id("contextId", "context")?;
    let task_id = parse_id("taskId", "task")?;
    let input = read_parts(message.get("parts").unwrap_or(&Value::Null)).map_err(|e| match e {
        PartsError::Invalid(m) => A2aError::invalid_params(m),
        PartsError::ContentType(m) => A2aError::content_type(m),
    })?;
    let empty = Map::new();
    let config = match params.get("configuration") {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(config)) => config,
        Some(_) => return Err(A2aError::invalid_params("configuration must be an object")),
    };
    only(
        config,
        &[
            "acceptedOutputModes",
            "taskPushNotificationConfig",
            "historyLength",
            "returnImmediately",
        ],
        "configuration.",
    )?;
    if let Some(modes) = config.get("acceptedOutputModes") {
        let Some(modes) = modes.as_array() else {
            return Err(A2aError::invalid_params(
                "configuration.acceptedOutputModes must be an array",
            ));
        };
        let takes_text = modes.iter().any(|m| {
            matches!(
                m.as_str(),
                Some("text/plain" | "text/*" | "*/*" | "text" | "application/json")
            )
        });
        if !modes.is_empty() && !takes_text {
            return Err(A2aError::content_type(
                "tah answers text (text/plain) and data (application/json); \
                 configuration.acceptedOutputModes takes neither",
            ));
        }
    }
    let push = match config.get("taskPushNotificationConfig") {
        None | Some(Value::Null) => None,
        Some(Value::Object(push)) => Some(push.clone()),
        Some(_) => {
            return Err(A2aError::invalid_params(
                "configuration.taskPushNotificationConfig must be an object",
            ))
        }
    };
    Ok(SendAsk {
        context_id,
        task_id,
        text: input.text,
        answers: input.answers,
        history_length: history_length(config)?,
        return_immediately: bool_param(config, "returnImmediately")?.unwrap_or(false),
        push,
    })
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(o) => o.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// A send under way: the task, and its events from where the client's view of it starts.
struct Sent {
    session: Uuid,
    view: TaskView,
    /// `None`: nothing more to follow (the task waits for other answers still).
    events: Option<EventStream>,
}

/// Starts what a message asks (a new task, or answers to one that waits) and answers the
/// task and its events from there.
async fn start_send(ctx: &Ctx, send: &SendAsk) -> A2aResult<Sent> {
    let sessions = &ctx.state.sessions;
    // The context: named, the task's, or a new session of the agent.
    let session = match (send.context_id, send.task_id) {
        (Some(context_id), _) => context(ctx, context_id, SessionNeed::Interact).await?.id,
        (None, Some(task_id)) => task(ctx, task_id, SessionNeed::Interact).await?.0,
        (None, None) => {
            if !send.answers.is_empty() {
                return Err(A2aError::invalid_params(
                    "a data part answers a call of a task: give the message the task's taskId",
                ));
            }
            new_context(ctx).await?
        }
    };
    let Some(task_id) = send.task_id else {
        let Some(text) = &send.text else {
            return Err(A2aError::invalid_params(
                "a message that starts a task needs a text part",
            ));
        };
        let request = RunRequest::run(text.clone(), Pending::Refuse);
        let started = sessions.start(session, request, Follow::Events).await?;
        let (run, events) = started.into_events()?;
        let view = TaskView::new(&run, &ctx.base_url);
        return Ok(Sent {
            session,
            view,
            events: Some(events),
        });
    };
    let Some(run) = sessions.run_record(session, task_id).await? else {
        return Err(A2aError::task_not_found(format!(
            "task {task_id} not found"
        )));
    };
    let view = view_of(ctx, session, &run).await?;
    if view.state().is_terminal() {
        return Err(A2aError::unsupported(format!(
            "task {task_id} is {}: a finished task takes no more messages; send the message \
             with its contextId and no taskId to start a new task in the same context",
            view.state().as_str()
        )));
    }
    if send.answers.is_empty() {
        return Err(A2aError::invalid_params(format!(
            "task {task_id} is {}: a message on it must answer its waiting calls with data \
             parts ({{call_id, decision}} or {{call_id, output}})",
            view.state().as_str()
        )));
    }
    if send.text.is_some() {
        return Err(A2aError::invalid_params(
            "a message answers a task's calls or starts a new task, not both: send the text \
             in a message of its own once the task goes on",
        ));
    }
    // Subscribe before answering, so that nothing the answers set off is missed.
    let live = sessions.subscribe(session)?;
    for answer in &send.answers {
        let Some(call) = view.calls().waiting().find(|c| c.id == answer.call_id()) else {
            return Err(A2aError::invalid_params(format!(
                "call {} of task {task_id} does not wait for an answer",
                answer.call_id()
            )));
        };
        let outcome = match (answer, &call.wait) {
            (
                Answer::Decision {
                    call_id,
                    allow,
                    reason,
                },
                Some(Wait::Approval { .. }),
            ) => sessions
                .approve(
                    session,
                    call_id.clone(),
                    ApprovalAnswer {
                        decision: if *allow {
                            Decision::Allow
                        } else {
                            Decision::Deny
                        },
                        reason: reason.clone(),
                        input: None,
                        answered_by: Some(ctx.caller.id().to_string()),
                    },
                )
                .await
                .map(drop),
            (Answer::Output { call_id, output }, Some(Wait::Client)) => sessions
                .client_result(
                    session,
                    ClientResult {
                        call_id: call_id.clone(),
                        output: output.clone(),
                        is_error: false,
                    },
                )
                .await
                .map(drop),
            (Answer::Decision { call_id, .. }, _) => {
                return Err(A2aError::invalid_params(format!(
                    "call {call_id} waits for the client's output, not a decision"
                )))
            }
            (Answer::Output { call_id, .. }, _) => {
                return Err(A2aError::invalid_params(format!(
                    "call {call_id} waits for a decision (allow or deny), not an output"
                )))
            }
        };
        outcome?;
    }
    // What the answers made of the task.
    let view = view_of(ctx, session, &run).await?;
    let parked = view.state() == TaskState::InputRequired
        && still_parked(sessions, session, view.last_seq(), view.calls().clone()).await?;
    let events = (!parked && !view.state().is_terminal())
        .then(|| sessions.stream_from(session, view.last_seq(), live, Some(run.id)));
    Ok(Sent {
        session,
        view,
        events,
    })
}

/// A new session of the agent, for the caller.
async fn new_context(ctx: &Ctx) -> A2aResult<Uuid> {
    ctx.caller
        .may_create_sessions()
        .map_err(|d| A2aError::from(access::denied(d, "session")))?;
    let choice = AgentChoice {
        id: ctx.agent,
        version: VersionChoice::Current,
    };
    let owner = Some(ctx.caller.id().to_string());
    let record = ctx
        .state
        .sessions
        .create_on_agent(Some(&choice), ctx.caller.tenant(), owner, None)
        .await
        .map_err(|error| match error {
            SessionError::AgentNotFound(detail) => A2aError::task_not_found(detail),
            other => A2aError::from(other),
        })?;
    Ok(record.id)
}

/// How long a blocking send waits before it answers the task as it is.
const BLOCK_FOR: Duration = Duration::from_secs(600);

async fn send_message(ctx: &Ctx, params: &Params) -> A2aResult<Value> {
    let send = read_send(params)?;
    let Sent {
        session,
        mut view,
        events,
    } = start_send(ctx, &send).await?;
    if let Some(push) = &send.push {
        push::create(
            ctx_push(ctx),
            session,
            view.task_id(),
            push,
            Some(view.last_seq()),
        )
        .await?;
    }
    if let (Some(mut events), false) = (events, send.return_immediately) {
        let follow = async {
            while let Some(event) = events.next().await {
                let event = event.map_err(SessionError::from)?;
                let frame = view.push(&event);
                if frame.is_none() || !view.settled() {
                    continue;
                }
                if view.state().is_terminal()
                    || still_parked(
                        &ctx.state.sessions,
                        session,
                        event.seq,
                        view.calls().clone(),
                    )
                    .await?
                {
                    break;
                }
            }
            Ok::<(), A2aError>(())
        };
        if let Ok(outcome) = tokio::time::timeout(BLOCK_FOR, follow).await {
            outcome?;
        }
    }
    Ok(json!({ "task": view.task(send.history_length, true) }))
}

/// A stream's frames: `(seq, StreamResponse)`.
type Frames = std::pin::Pin<Box<dyn Stream<Item = (i64, Value)> + Send>>;

async fn send_streaming(ctx: &Ctx, params: &Params) -> A2aResult<Frames> {
    let send = read_send(params)?;
    let Sent {
        session,
        view,
        events,
    } = start_send(ctx, &send).await?;
    if let Some(push) = &send.push {
        push::create(
            ctx_push(ctx),
            session,
            view.task_id(),
            push,
            Some(view.last_seq()),
        )
        .await?;
    }
    Ok(match events {
        // The task as it is, then its events.
        Some(events) if send.task_id.is_some() => {
            let mut first = view.task(send.history_length, true);
            let seq = view.last_seq();
            first["metadata"] = json!({ "tah_seq": seq });
            let opening = futures::stream::iter([(seq, json!({ "task": first }))]);
            Box::pin(opening.chain(frames(ctx, session, view, events)))
        }
        Some(events) => Box::pin(frames(ctx, session, view, events)),
        None => {
            let seq = view.last_seq();
            let task = view.task(send.history_length, true);
            Box::pin(futures::stream::iter([(seq, json!({ "task": task }))]))
        }
    })
}

/// The frames of a task's events, until it ends or waits for answers only.
fn frames(
    ctx: &Ctx,
    session: Uuid,
    view: TaskView,
    events: EventStream,
) -> impl Stream<Item = (i64, Value)> + Send {
    let sessions = ctx.state.sessions.clone();
    futures::stream::unfold(Some((view, events)), move |state| {
        let sessions = sessions.clone();
        async move {
            let (mut view, mut events) = state?;
            loop {
                let event = match events.next().await {
                    Some(Ok(event)) => event,
                    Some(Err(error)) => {
                        tracing::warn!(%error, "an A2A stream ended by a storage error");
                        return None;
                    }
                    None => return None,
                };
                let Some(frame) = view.push(&event) else {
                    continue;
                };
                let seq = event.seq;
                let done = view.state().is_terminal()
                    || (view.state() == TaskState::InputRequired
                        && still_parked(&sessions, session, seq, view.calls().clone())
                            .await
                            .unwrap_or(true));
                let next = (!done).then_some((view, events));
                return Some(((seq, frame), next));
            }
        }
    })
}

/// The SSE answer of a JSON-RPC stream: each frame a JSON-RPC response with the request's id.
fn rpc_stream(ctx: &Ctx, id: Value, frames: Frames) -> Response {
    let frames = frames.map(move |(seq, frame)| {
        let data = json!({"jsonrpc": "2.0", "id": id, "result": frame}).to_string();
        (seq, data)
    });
    sse(ctx, frames)
}

fn rest_sse(ctx: &Ctx, frames: Frames) -> Response {
    sse(ctx, frames.map(|(seq, frame)| (seq, frame.to_string())))
}

fn sse(ctx: &Ctx, frames: impl Stream<Item = (i64, String)> + Send + 'static) -> Response {
    let events = frames
        .map(|(seq, data)| Ok::<_, Infallible>(SseEvent::default().id(seq.to_string()).data(data)))
        .take_until(ctx.state.shutdown.clone().cancelled_owned());
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(HEARTBEAT).text("heartbeat"))
        .into_response();
    let headers = response.headers_mut();
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

// ---------------------------------------------------------------------------------------------
// SubscribeToTask, GetTask, CancelTask, ListTasks

async fn subscribe(ctx: &Ctx, params: &Params, headers: &HeaderMap) -> A2aResult<Frames> {
    only(params, &["tenant", "id"], "")?;
    no_tenant(params)?;
    let id = uuid_param(params, "id", "task")?;
    let (session, run) = task(ctx, id, SessionNeed::Read).await?;
    let after = match headers.get("last-event-id") {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(|v| v.trim().parse::<i64>().ok())
                .filter(|n| *n >= 0)
                .ok_or_else(|| {
                    A2aError::invalid_params(
                        "Last-Event-ID must be a frame's id (tah's seq, a non-negative integer)",
                    )
                })?,
        ),
    };
    let start = run.start_seq - 1;
    let after = after.unwrap_or(start).max(start);
    let sessions = &ctx.state.sessions;
    let live = sessions.subscribe(session)?;
    // The task as it was at `after`, so that what follows is shaped as it was the first time.
    let mut view = TaskView::new(&run, &ctx.base_url);
    for event in sessions.run_events(session, &run).await? {
        if event.seq > after {
            break;
        }
        view.push(&event);
    }
    // Nothing follows a task that ended, or that waits for answers, at `after`: as a stream
    // of it would have, this one ends there.
    let parked = view.state() == TaskState::InputRequired
        && still_parked(sessions, session, after, view.calls().clone()).await?;
    if view.state().is_terminal() || (parked && after > start) {
        return Ok(Box::pin(futures::stream::empty()));
    }
    let events = sessions.stream_from(session, after, live, Some(run.id));
    Ok(Box::pin(frames(ctx, session, view, events)))
}

async fn get_task(ctx: &Ctx, params: &Params) -> A2aResult<Value> {
    only(params, &["tenant", "id", "historyLength"], "")?;
    no_tenant(params)?;
    let id = uuid_param(params, "id", "task")?;
    let (session, run) = task(ctx, id, SessionNeed::Read).await?;
    let view = view_of(ctx, session, &run).await?;
    Ok(view.task(history_length(params)?, true))
}

/// How long a cancel waits for the run to record its end.
const CANCEL_WAIT: Duration = Duration::from_secs(10);

async fn cancel_task(ctx: &Ctx, params: &Params) -> A2aResult<Value> {
    only(params, &["tenant", "id", "metadata"], "")?;
    no_tenant(params)?;
    if params.get("metadata").is_some_and(|m| !is_empty(m)) {
        return Err(A2aError::invalid_params(
            "metadata is not supported on a cancel",
        ));
    }
    let id = uuid_param(params, "id", "task")?;
    let (session, run) = task(ctx, id, SessionNeed::Interact).await?;
    let sessions = &ctx.state.sessions;
    let mut view = view_of(ctx, session, &run).await?;
    if view.state().is_terminal() {
        return Err(A2aError::not_cancelable(format!(
            "task {id} is {}: only a task in progress can be canceled",
            view.state().as_str()
        )));
    }
    let live = sessions.subscribe(session)?;
    let outcome = sessions.cancel(session).await?;
    if outcome.run_id.is_some_and(|r| r != id) {
        return Err(A2aError::not_cancelable(format!(
            "task {id} is no longer in progress"
        )));
    }
    let mut events = sessions.stream_from(session, view.last_seq(), live, Some(run.id));
    let follow = async {
        while let Some(Ok(event)) = events.next().await {
            view.push(&event);
            if view.state().is_terminal() {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(CANCEL_WAIT, follow).await;
    Ok(view.task(None, true))
}

/// Tasks per page, when the client names no page size, and at most.
const DEFAULT_PAGE: usize = 50;
const MAX_PAGE: usize = 100;
/// Runs of a session read at once.
const RUNS_PAGE: i64 = 500;

async fn list_tasks(ctx: &Ctx, params: &Params) -> A2aResult<Value> {
    only(
        params,
        &[
            "tenant",
            "contextId",
            "status",
            "pageSize",
            "pageToken",
            "historyLength",
            "statusTimestampAfter",
            "includeArtifacts",
        ],
        "",
    )?;
    no_tenant(params)?;
    let status =
        match params.get("status") {
            None | Some(Value::Null) => None,
            // `@a2a-js/sdk` 1.3.0 sends an unset status as "UNRECOGNIZED".
            Some(Value::String(s)) if s == "TASK_STATE_UNSPECIFIED" || s == "UNRECOGNIZED" => None,
            Some(Value::String(s)) => Some(TaskState::parse(s).map_err(|_| {
                A2aError::invalid_params(format!("status {s:?} is not a task state"))
            })?),
            Some(_) => {
                return Err(A2aError::invalid_params(
                    "status must be a task state's name",
                ))
            }
        };
    let page_size = match int_param(params, "pageSize")? {
        None | Some(0) => DEFAULT_PAGE,
        Some(n) if n as usize <= MAX_PAGE => n as usize,
        Some(_) => {
            return Err(A2aError::invalid_params(format!(
                "pageSize must be at most {MAX_PAGE}"
            )))
        }
    };
    let after_time = match string_param(params, "statusTimestampAfter")? {
        None => None,
        Some(raw) => Some(
            chrono::DateTime::parse_from_rfc3339(raw)
                .map_err(|_| {
                    A2aError::invalid_params("statusTimestampAfter must be an RFC 3339 timestamp")
                })?
                .with_timezone(&chrono::Utc),
        ),
    };
    let history = history_length(params)?;
    let include_artifacts = bool_param(params, "includeArtifacts")?.unwrap_or(false);
    let page_token = match string_param(params, "pageToken")? {
        None => None,
        Some(raw) => Some(PageToken::parse(raw)?),
    };
    let contexts: Vec<Uuid> = match string_param(params, "contextId")? {
        Some(raw) => {
            let id = Uuid::parse_str(raw)
                .map_err(|_| A2aError::task_not_found(format!("context {raw:?} not found")))?;
            vec![context(ctx, id, SessionNeed::Read).await?.id]
        }
        None => caller_contexts(ctx).await?,
    };
    // Newest first: contexts newest first, each one's tasks newest first. A task's state is
    // read from its events only when a filter needs it or the task is on the page.
    let filtered = status.is_some() || after_time.is_some();
    let mut tasks = Vec::new();
    let mut total = 0usize;
    let mut next = None;
    let mut more = false;
    let mut on_page = page_token.is_none();
    for session in contexts {
        let mut runs = all_runs(ctx, session).await?;
        runs.reverse();
        for run in runs {
            let wanted = on_page && tasks.len() < page_size;
            if !filtered && !wanted {
                total += 1;
                more |= on_page;
                on_page |= page_token.as_ref().is_some_and(|t| t.0 == run.id);
                continue;
            }
            let view = view_of(ctx, session, &run).await?;
            let task = view.task(history, include_artifacts);
            let at = task["status"]["timestamp"]
                .as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
            let matches = status.is_none_or(|s| s == Some(view.state()))
                && after_time.is_none_or(|after| {
                    at.is_some_and(|at| at.with_timezone(&chrono::Utc) > after)
                });
            if matches {
                total += 1;
                if wanted {
                    next = Some(run.id);
                    tasks.push(task);
                } else {
                    more |= on_page;
                }
            }
            on_page |= page_token.as_ref().is_some_and(|t| t.0 == run.id);
        }
    }
    if !on_page {
        return Err(A2aError::invalid_params(
            "pageToken names no task of this list",
        ));
    }
    let next_page = match (more, next) {
        (true, Some(id)) => PageToken(id).to_string(),
        _ => String::new(),
    };
    Ok(json!({
        "tasks": tasks,
        "nextPageToken": next_page,
        "pageSize": page_size,
        "totalSize": total,
    }))
}

/// Where a page of tasks goes on: after this task.
struct PageToken(Uuid);

impl PageToken {
    fn parse(raw: &str) -> A2aResult<PageToken> {
        Uuid::parse_str(raw)
            .map(PageToken)
            .map_err(|_| A2aError::invalid_params("pageToken is not one this server gave"))
    }
}

impl std::fmt::Display for PageToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The caller's sessions of this agent, newest first (at most a thousand).
async fn caller_contexts(ctx: &Ctx) -> A2aResult<Vec<Uuid>> {
    if let Principal::Session { session, .. } = &ctx.caller {
        return Ok(vec![context(ctx, session.0, SessionNeed::Read).await?.id]);
    }
    let records = ctx
        .state
        .sessions
        .list(&crate::session::SessionQuery {
            limit: 1000,
            before: None,
            state: None,
            parent_id: None,
            tenant: ctx.caller.tenant().map(str::to_owned),
            owner: ctx.caller.listed_owner().map(str::to_owned),
        })
        .await?;
    Ok(records
        .into_iter()
        .filter(|r| r.options.agent.tag.id == ctx.agent && r.parent_id.is_none())
        .map(|r| r.id)
        .collect())
}

async fn all_runs(ctx: &Ctx, session: Uuid) -> A2aResult<Vec<RunRecord>> {
    let mut runs: Vec<RunRecord> = Vec::new();
    loop {
        let after = runs.last().map(|r| r.id);
        let page = ctx
            .state
            .sessions
            .runs_page(session, after, RUNS_PAGE)
            .await?;
        let full = page.len() as i64 == RUNS_PAGE;
        runs.extend(page);
        if !full {
            return Ok(runs);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Push-notification configs

fn ctx_push(ctx: &Ctx) -> push::PushCtx {
    push::PushCtx {
        sessions: ctx.state.sessions.clone(),
        base_url: ctx.base_url.clone(),
        shutdown: ctx.state.shutdown.clone(),
        allow_private: ctx.face.allow_private_push,
    }
}

async fn push_create(ctx: &Ctx, params: &Params) -> A2aResult<Value> {
    let id = uuid_param(params, "taskId", "task")?;
    let (session, _) = task(ctx, id, SessionNeed::Interact).await?;
    let config = push::create(ctx_push(ctx), session, id, params, None).await?;
    Ok(config.to_json(id))
}

async fn push_get(ctx: &Ctx, params: &Params) -> A2aResult<Value> {
    only(params, &["tenant", "taskId", "id"], "")?;
    no_tenant(params)?;
    let id = uuid_param(params, "taskId", "task")?;
    let (session, _) = task(ctx, id, SessionNeed::Read).await?;
    let Some(config_id) = string_param(params, "id")? else {
        return Err(A2aError::invalid_params("id (the config's) is required"));
    };
    let configs = push::configs(&ctx.state.sessions, session, id).await?;
    configs
        .into_iter()
        .find(|c| c.id == config_id)
        .map(|c| c.to_json(id))
        .ok_or_else(|| {
            A2aError::task_not_found(format!("push notification config {config_id:?} not found"))
        })
}

async fn push_list(ctx: &Ctx, params: &Params) -> A2aResult<Value> {
    only(params, &["tenant", "taskId", "pageSize", "pageToken"], "")?;
    no_tenant(params)?;
    let id = uuid_param(params, "taskId", "task")?;
    let (session, _) = task(ctx, id, SessionNeed::Read).await?;
    let configs: Vec<Value> = push::configs(&ctx.state.sessions, session, id)
        .await?
        .into_iter()
        .map(|c: PushConfig| c.to_json(id))
        .collect();
    Ok(json!({ "configs": configs, "nextPageToken": "" }))
}

async fn push_delete(ctx: &Ctx, params: &Params) -> A2aResult<()> {
    only(params, &["tenant", "taskId", "id"], "")?;
    no_tenant(params)?;
    let id = uuid_param(params, "taskId", "task")?;
    let (session, _) = task(ctx, id, SessionNeed::Interact).await?;
    let Some(config_id) = string_param(params, "id")? else {
        return Err(A2aError::invalid_params("id (the config's) is required"));
    };
    push::delete(&ctx.state.sessions, session, id, config_id).await
}

// ---------------------------------------------------------------------------------------------
// HTTP+JSON

fn rest_json(result: A2aResult<Value>) -> Response {
    match result {
        Ok(value) => Json(value).into_response(),
        Err(error) => error.rest(),
    }
}

fn rest_body(body: &Bytes) -> A2aResult<Params> {
    if body.is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(params)) => Ok(params),
        Ok(_) => Err(A2aError::invalid_params("the body must be a JSON object")),
        Err(error) => Err(A2aError::parse_error(format!(
            "the body is not JSON: {error}"
        ))),
    }
}

/// Query parameters as params (values are strings; the readers take strings for numbers).
fn query_params(query: HashMap<String, String>) -> Params {
    query
        .into_iter()
        .map(|(k, v)| (k, Value::String(v)))
        .collect()
}

async fn rest_send(
    State(state): State<AppState>,
    Extension(face): Extension<Face>,
    Caller(caller): Caller,
    Path(agent): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let run = async {
        let ctx = ctx((state, face), caller, &agent, &headers).await?;
        send_message(&ctx, &rest_body(&body)?).await
    };
    rest_json(run.await)
}

async fn rest_stream(
    State(state): State<AppState>,
    Extension(face): Extension<Face>,
    Caller(caller): Caller,
    Path(agent): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let run = async {
        let ctx = ctx((state, face), caller, &agent, &headers).await?;
        let frames = send_streaming(&ctx, &rest_body(&body)?).await?;
        Ok::<_, A2aError>(rest_sse(&ctx, frames))
    };
    run.await.unwrap_or_else(|error| error.rest())
}

async fn rest_list(
    State(state): State<AppState>,
    Extension(face): Extension<Face>,
    Caller(caller): Caller,
    Path(agent): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let run = async {
        let ctx = ctx((state, face), caller, &agent, &headers).await?;
        list_tasks(&ctx, &query_params(query)).await
    };
    rest_json(run.await)
}

async fn rest_get(
    State(state): State<AppState>,
    Extension(face): Extension<Face>,
    Caller(caller): Caller,
    Path((agent, task)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let run = async {
        let ctx = ctx((state, face), caller, &agent, &headers).await?;
        let mut params = query_params(query);
        params.insert("id".into(), Value::String(task));
        get_task(&ctx, &params).await
    };
    rest_json(run.await)
}

/// `POST /tasks/{id}:cancel` and `POST /tasks/{id}:subscribe`.
async fn rest_task_action(
    State(state): State<AppState>,
    Extension(face): Extension<Face>,
    Caller(caller): Caller,
    Path((agent, task)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let run = async {
        let ctx = ctx((state, face), caller, &agent, &headers).await?;
        let mut params = rest_body(&body)?;
        if let Some(id) = task.strip_suffix(":cancel") {
            params.insert("id".into(), Value::String(id.to_string()));
            return cancel_task(&ctx, &params)
                .await
                .map(|t| Json(t).into_response());
        }
        if let Some(id) = task.strip_suffix(":subscribe") {
            params.insert("id".into(), Value::String(id.to_string()));
            let frames = subscribe(&ctx, &params, &headers).await?;
            return Ok(rest_sse(&ctx, frames));
        }
        Err(A2aError::method_not_found(format!(
            "POST /tasks/{task} is not a route: POST /tasks/{{id}}:cancel or /tasks/{{id}}:subscribe"
        )))
    };
    run.await.unwrap_or_else(|error| error.rest())
}

async fn rest_push_create(
    State(state): State<AppState>,
    Extension(face): Extension<Face>,
    Caller(caller): Caller,
    Path((agent, task)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let run = async {
        let ctx = ctx((state, face), caller, &agent, &headers).await?;
        let mut params = rest_body(&body)?;
        if let Some(body_task) = string_param(&params, "taskId")? {
            if body_task != task {
                return Err(A2aError::invalid_params(
                    "taskId differs from the path's task",
                ));
            }
        }
        params.insert("taskId".into(), Value::String(task));
        push_create(&ctx, &params).await
    };
    rest_json(run.await)
}

async fn rest_push_list(
    State(state): State<AppState>,
    Extension(face): Extension<Face>,
    Caller(caller): Caller,
    Path((agent, task)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let run = async {
        let ctx = ctx((state, face), caller, &agent, &headers).await?;
        let mut params = query_params(query);
        params.insert("taskId".into(), Value::String(task));
        push_list(&ctx, &params).await
    };
    rest_json(run.await)
}

async fn rest_push_get(
    State(state): State<AppState>,
    Extension(face): Extension<Face>,
    Caller(caller): Caller,
    Path((agent, task, config)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let run = async {
        let ctx = ctx((state, face), caller, &agent, &headers).await?;
        let mut params = Map::new();
        params.insert("taskId".into(), Value::String(task));
        params.insert("id".into(), Value::String(config));
        push_get(&ctx, &params).await
    };
    rest_json(run.await)
}

async fn rest_push_delete(
    State(state): State<AppState>,
    Extension(face): Extension<Face>,
    Caller(caller): Caller,
    Path((agent, task, config)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let run = async {
        let ctx = ctx((state, face), caller, &agent, &headers).await?;
        let mut params = Map::new();
        params.insert("taskId".into(), Value::String(task));
        params.insert("id".into(), Value::String(config));
        push_delete(&ctx, &params).await
    };
    match run.await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(error) => error.rest(),
    }
}

async fn rest_extended_card() -> Response {
    extended_card_error().rest()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rest_errors_carry_the_reason_a2a_clients_read() {
        let response = A2aError::task_not_found("task x not found").rest();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let error = A2aError::from(Problem::bad_request("bad"));
        assert_eq!(error.code, -32602);
        assert_eq!(A2aError::from(Problem::not_found("gone")).code, -32001);
    }
}
