//! Runs: start a turn, resume, cancel, and read runs and their results, in the three run modes
//! (202 + events, `?wait=true`, `Accept: text/event-stream`).

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::events::{sse_response, wants_event_stream};
use super::extract::Ids;
use super::paging::{page_by_id, CursorQuery, Page};
use super::problem::{ApiJson, ApiQuery, OptionalJson, Problem};
use super::AppState;
use crate::model::RunRecord;
use crate::model::{RunId, SessionId};
use crate::session::{Follow, IfBusy, Pending, RunEnd, RunRequest, Started, StartedRun};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/sessions/{id}/runs", post(start).get(list))
        .route("/v1/sessions/{id}/runs/{run_id}", get(show))
        .route("/v1/sessions/{id}/resume", post(resume))
        .route("/v1/sessions/{id}/cancel", post(cancel))
        .route("/v1/sessions/{id}/compact", post(compact))
}

/// The longest input a run accepts, in characters.
pub const MAX_INPUT_CHARS: usize = 200_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunBody {
    input: Value,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunQuery {
    #[serde(default, deserialize_with = "super::params::lenient_bool")]
    wait: Option<bool>,
    /// What to do about calls of the active run that wait for an answer.
    pending: Option<PendingParam>,
    /// What to do while another run is active (`POST /runs` only).
    if_busy: Option<IfBusyParam>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum IfBusyParam {
    /// Refuse the new run (409, the default).
    Reject,
    /// Append the input to the active run at its next step boundary.
    Queue,
    /// Cancel the active run, then start the new one.
    Interrupt,
}

impl From<IfBusyParam> for IfBusy {
    fn from(param: IfBusyParam) -> IfBusy {
        match param {
            IfBusyParam::Reject => IfBusy::Reject,
            IfBusyParam::Queue => IfBusy::Queue,
            IfBusyParam::Interrupt => IfBusy::Interrupt,
        }
    }
}

/// A resume continues the run there is: what to do about a new run's predecessor
/// (`pending`) does not apply to it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResumeQuery {
    #[serde(default, deserialize_with = "super::params::lenient_bool")]
    wait: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EmptyBody {}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum PendingParam {
    /// Refuse the new run while calls wait (the default).
    Refuse,
    /// Deny every waiting call and start the new run.
    Deny,
}

/// `input` is a string or a user message object `{role: "user", content: "..."}`.
pub(super) fn parse_input(input: Value) -> Result<String, Problem> {
    let text = match input {
        Value::String(s) => s,
        Value::Object(mut map) => {
            match map.remove("role") {
                None => {}
                Some(Value::String(r)) if r == "user" => {}
                Some(_) => return Err(Problem::bad_request("input.role must be \"user\"")),
            }
            let content = match map.remove("content") {
                Some(Value::String(c)) => c,
                _ => return Err(Problem::bad_request("input.content must be a string")),
            };
            if let Some(key) = map.keys().next() {
                return Err(Problem::bad_request(format!("input has an unknown field: {key}")));
            }
            content
        }
        _ => {
            return Err(Problem::bad_request(
                "input must be a string or a user message object {\"role\":\"user\",\"content\":\"...\"}",
            ))
        }
    };
    input_text(text)
}

/// Checks a run's input text: not blank, not too long.
pub(super) fn input_text(text: String) -> Result<String, Problem> {
    if text.trim().is_empty() {
        return Err(Problem::bad_request("input must not be empty"));
    }
    if text.chars().count() > MAX_INPUT_CHARS {
        return Err(Problem::new(
            StatusCode::BAD_REQUEST,
            "input-too-long",
            format!("input is longer than {MAX_INPUT_CHARS} characters"),
        ));
    }
    Ok(text)
}

async fn start(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    ApiQuery(query): ApiQuery<RunQuery>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<RunBody>,
) -> Result<Response, Problem> {
    let input = parse_input(body.input)?;
    begin(
        state,
        id,
        RunRequest::run(
            input,
            match query.pending {
                Some(PendingParam::Deny) => Pending::Deny,
                Some(PendingParam::Refuse) | None => Pending::Refuse,
            },
        )
        .if_busy(query.if_busy.map(IfBusy::from).unwrap_or_default()),
        query.wait == Some(true),
        &headers,
    )
    .await
}

async fn resume(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    ApiQuery(query): ApiQuery<ResumeQuery>,
    headers: HeaderMap,
    OptionalJson(_): OptionalJson<EmptyBody>,
) -> Result<Response, Problem> {
    let wait = query.wait == Some(true);
    begin(state, id, RunRequest::resume(), wait, &headers).await
}

async fn begin(
    state: AppState,
    id: Uuid,
    request: RunRequest,
    wait: bool,
    headers: &HeaderMap,
) -> Result<Response, Problem> {
    let follow = if wants_event_stream(headers) {
        Follow::Events
    } else if wait {
        Follow::End
    } else {
        Follow::Record
    };
    let started = match state.sessions.start(id, request, follow).await? {
        Started::Completed(result) => return Ok(Json(result).into_response()),
        Started::Run(started) => *started,
    };
    let StartedRun {
        run, events, end, ..
    } = started;
    if let Some(events) = events {
        return Ok(sse_response(events, state.shutdown.clone()));
    }
    match end {
        None => Ok(accepted(id, &run)),
        Some(RunEnd::Ended(result)) => Ok(Json(result).into_response()),
        Some(RunEnd::Storage { error }) => Err(Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "storage-failed",
            format!(
                "run {} stopped because the database refused a write ({error}); it is recorded \
                 as failed (\"storage\") once writes succeed again, and can then be resumed",
                run.id
            ),
        )),
        // Left to be taken over by another replica: it has no result yet.
        Some(RunEnd::Elsewhere) => Err(Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!(
                "this server stopped before run {} ended; another replica continues it as a \
                 resume run: follow the session's events (GET /v1/sessions/{id}/events) or its \
                 last_run_id",
                run.id
            ),
        )),
        Some(RunEnd::NotSeen) => Err(Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!(
                "run {} did not end on this server; follow the session's events \
                 (GET /v1/sessions/{id}/events)",
                run.id
            ),
        )),
    }
}

/// `202 Accepted` with the run and where it lives.
fn accepted(id: Uuid, run: &RunRecord) -> Response {
    let location = format!("/v1/sessions/{id}/runs/{}", run.id);
    (
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        Json(run),
    )
        .into_response()
}

async fn cancel(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    OptionalJson(_): OptionalJson<EmptyBody>,
) -> Result<Response, Problem> {
    let outcome = state.sessions.cancel(id).await?;
    Ok(Json(outcome).into_response())
}

/// Manual compaction: `200 {turns, chars}`, or `204` when there is nothing to compact.
async fn compact(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    OptionalJson(_): OptionalJson<EmptyBody>,
) -> Result<Response, Problem> {
    match state.sessions.compact(id).await? {
        Some(compacted) => Ok(Json(compacted).into_response()),
        None => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

async fn list(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    ApiQuery(q): ApiQuery<CursorQuery>,
) -> Result<Json<Page<RunRecord>>, Problem> {
    let read = |id, after, limit| state.sessions.runs_page(id, after, limit);
    page_by_id(&state, id, &q, read, |r| r.id).await
}

async fn show(
    State(state): State<AppState>,
    Ids((SessionId(id), RunId(run_id))): Ids<(SessionId, RunId)>,
) -> Result<Json<RunRecord>, Problem> {
    state.sessions.get(id).await?;
    state
        .sessions
        .run_record(id, run_id)
        .await?
        .map(Json)
        .ok_or_else(|| Problem::not_found("run not found"))
}
