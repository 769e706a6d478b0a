//! Calls that wait for an answer: `GET …/approvals` lists what waits for a human,
//! `POST …/approvals/{call_id}` answers one; `GET …/tool-results` lists the calls of client
//! tools that wait for their results, `POST …/tool-results/{call_id}` gives one. Answers are
//! idempotent: the same one again is a `200`, another one a `409` with the stored answer.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::access::Caller;
use super::extract::Ids;
use super::params::NoQuery;
use super::problem::{ApiJson, ApiQuery, Problem};
use super::AppState;
use crate::model::Decision;
use crate::model::{CallId, SessionId};
use crate::session::{ApprovalAnswer, ClientResult};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/tools", get(tools))
        .route("/v1/sessions/{id}/approvals", get(pending))
        .route("/v1/sessions/{id}/approvals/{call_id}", post(approve))
        .route("/v1/sessions/{id}/tool-results", get(pending_results))
        .route(
            "/v1/sessions/{id}/tool-results/{call_id}",
            post(tool_result),
        )
}

/// The longest reason or client result accepted, in characters.
const MAX_TEXT_CHARS: usize = 200_000;

async fn tools(State(state): State<AppState>, ApiQuery(_): ApiQuery<NoQuery>) -> Json<Value> {
    Json(json!({ "data": state.sessions.tools() }))
}

async fn pending(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    ApiQuery(_): ApiQuery<NoQuery>,
) -> Result<Response, Problem> {
    let data = state.sessions.pending_approvals(id).await?;
    Ok(Json(json!({ "data": data })).into_response())
}

/// The calls of the session's client tools that wait for their results (for a client that
/// reconnects and missed their `tool.client-requested` events).
async fn pending_results(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    ApiQuery(_): ApiQuery<NoQuery>,
) -> Result<Response, Problem> {
    let data = state.sessions.pending_client_calls(id).await?;
    Ok(Json(json!({ "data": data })).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalBody {
    decision: Decision,
    reason: Option<String>,
    /// Replaces the call's input (checked against the tool's schema).
    input: Option<Value>,
}

async fn approve(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids((SessionId(id), CallId(call))): Ids<(SessionId, CallId)>,
    ApiJson(body): ApiJson<ApprovalBody>,
) -> Result<Response, Problem> {
    if body
        .reason
        .as_ref()
        .is_some_and(|r| r.chars().count() > MAX_TEXT_CHARS)
    {
        return Err(Problem::bad_request(format!(
            "reason is longer than {MAX_TEXT_CHARS} characters"
        )));
    }
    if body.input.as_ref().is_some_and(|i| !i.is_object()) {
        return Err(Problem::new(
            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-input",
            "input must be a JSON object (the call's arguments)",
        ));
    }
    let answer = ApprovalAnswer {
        decision: body.decision,
        reason: body.reason,
        input: body.input,
        answered_by: Some(caller.id().to_string()),
    };
    let resolution = state.sessions.approve(id, call, answer).await?;
    Ok(Json(resolution).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolResultBody {
    /// The result as the model sees it: a string, or any JSON (sent as its text).
    output: Value,
    #[serde(default)]
    is_error: bool,
}

async fn tool_result(
    State(state): State<AppState>,
    Ids((SessionId(id), CallId(call))): Ids<(SessionId, CallId)>,
    ApiJson(body): ApiJson<ToolResultBody>,
) -> Result<Response, Problem> {
    let output = match body.output {
        Value::String(text) => text,
        other => other.to_string(),
    };
    if output.chars().count() > MAX_TEXT_CHARS {
        return Err(Problem::bad_request(format!(
            "output is longer than {MAX_TEXT_CHARS} characters"
        )));
    }
    let result = ClientResult {
        call_id: call,
        output,
        is_error: body.is_error,
    };
    let result = state.sessions.client_result(id, result).await?;
    Ok(Json(result).into_response())
}
