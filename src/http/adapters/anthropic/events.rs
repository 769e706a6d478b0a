//! `client.beta.sessions.events`: send, list, stream.
//!
//! - `POST …/events` `{events: [...]}`, checked first, then taken in order: `user.message`
//!   starts a turn (during a turn, running or waiting for answers, it is queued into that
//!   turn and read at its next step: tah's `if_busy=queue`);
//!   `user.interrupt` cancels the turn; `user.tool_confirmation` answers an approval
//!   (`tool_use_id` is the call's id, as `requires_action.event_ids` give it);
//!   `user.custom_tool_result` gives a client tool's result.
//! - `GET …/events`: the session's events (`?limit&page`, `order=asc|desc`, `types[]`,
//!   `created_at[gt|gte|lt|lte]`); `page` is the last frame id of the page before.
//! - `GET …/events/stream`: SSE, `event: <type>`, `id: <frame id>`, `data: <event>`; live
//!   only, or after `Last-Event-ID` (exactly: no gap, no duplicate); `event_deltas[]` adds
//!   `event_start` / `event_delta` previews of `agent.message` and `agent.thinking`.

use std::convert::Infallible;

use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde_json::{json, Map, Value};
use uuid::Uuid;

use super::sessions::{is_archived, message_text, start_turn};
use super::Query;
use crate::http::access::Caller;
use crate::http::events::HEARTBEAT;
use crate::http::extract::Ids;
use crate::http::problem::{ApiJson, Problem};
use crate::http::AppState;
use crate::model::{Decision, SessionId};
use crate::protocols::anthropic::events::{
    last_frame_of, parse_frame_id, Deltas, Frame, SessionEvents,
};
use crate::session::{ApprovalAnswer, ClientResult, SessionError};

/// Events read per query.
const PAGE: i64 = 500;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/anthropic/v1/sessions/{id}/events", post(send).get(list))
        .route("/anthropic/v1/sessions/{id}/events/stream", get(stream))
}

async fn send(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids(SessionId(id)): Ids<SessionId>,
    RawQuery(raw): RawQuery,
    ApiJson(body): ApiJson<Map<String, Value>>,
) -> Result<Json<Value>, Problem> {
    Query::parse(raw.as_deref(), &[])?;
    super::known_fields(&body, &["events"])?;
    let events = body
        .get("events")
        .and_then(Value::as_array)
        .ok_or_else(|| Problem::bad_request("events: must be an array"))?;
    if events.is_empty() {
        return Err(Problem::bad_request("events: must not be empty"));
    }
    let record = state.sessions.get(id).await?;
    // Every event is checked before any is taken.
    let mut actions = Vec::new();
    for (i, event) in events.iter().enumerate() {
        actions.push(parse_event(event, &format!("events[{i}]"))?);
    }
    if is_archived(&record) && actions.iter().any(|a| matches!(a, Action::Message(_))) {
        return Err(Problem::new(
            StatusCode::CONFLICT,
            "session-archived",
            "the session is archived: it takes no new messages",
        ));
    }
    for action in actions {
        match action {
            Action::Message(text) => start_turn(&state, &record, text).await?,
            Action::Interrupt => {
                state.sessions.cancel(id).await?;
            }
            Action::Confirm {
                call_id,
                allow,
                message,
            } => {
                let answer = ApprovalAnswer {
                    decision: if allow {
                        Decision::Allow
                    } else {
                        Decision::Deny
                    },
                    reason: message,
                    input: None,
                    answered_by: Some(caller.id().to_string()),
                };
                state
                    .sessions
                    .approve(id, call_id, answer)
                    .await
                    .map_err(unanswerable)?;
            }
            Action::Result {
                call_id,
                output,
                is_error,
            } => {
                let result = ClientResult {
                    call_id,
                    output,
                    is_error,
                };
                state
                    .sessions
                    .client_result(id, result)
                    .await
                    .map_err(unanswerable)?;
            }
        }
    }
    Ok(Json(json!({})))
}

/// An answer to a call that does not wait for one (any more).
fn unanswerable(error: SessionError) -> Problem {
    Problem::from(error)
}

enum Action {
    Message(String),
    Interrupt,
    Confirm {
        call_id: String,
        allow: bool,
        message: Option<String>,
    },
    Result {
        call_id: String,
        output: String,
        is_error: bool,
    },
}

fn fields(event: &Map<String, Value>, allowed: &[&str], field: &str) -> Result<(), Problem> {
    match event
        .iter()
        .find(|(k, v)| !allowed.contains(&k.as_str()) && !v.is_null())
    {
        Some((key, _)) => Err(Problem::bad_request(format!(
            "{field}.{key}: unknown or unsupported field"
        ))),
        None => Ok(()),
    }
}

fn string_field(event: &Map<String, Value>, key: &str, field: &str) -> Result<String, Problem> {
    event
        .get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| Problem::bad_request(format!("{field}.{key}: must be a string")))
}

fn parse_event(event: &Value, field: &str) -> Result<Action, Problem> {
    let event = event
        .as_object()
        .ok_or_else(|| Problem::bad_request(format!("{field}: must be an object")))?;
    let kind = event
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| Problem::bad_request(format!("{field}.type: required")))?;
    match kind {
        "user.message" => {
            fields(event, &["type", "content"], field)?;
            Ok(Action::Message(message_text(event.get("content"), field)?))
        }
        "user.interrupt" => {
            fields(event, &["type"], field)?;
            Ok(Action::Interrupt)
        }
        "user.tool_confirmation" => {
            fields(
                event,
                &["type", "tool_use_id", "result", "deny_message"],
                field,
            )?;
            let call_id = string_field(event, "tool_use_id", field)?;
            let allow = match event.get("result").and_then(Value::as_str) {
                Some("allow") => true,
                Some("deny") => false,
                _ => {
                    return Err(Problem::bad_request(format!(
                        "{field}.result: must be allow or deny"
                    )))
                }
            };
            let message = match event.get("deny_message") {
                None | Some(Value::Null) => None,
                Some(Value::String(m)) => Some(m.clone()),
                Some(_) => {
                    return Err(Problem::bad_request(format!(
                        "{field}.deny_message: must be a string"
                    )))
                }
            };
            Ok(Action::Confirm {
                call_id,
                allow,
                message,
            })
        }
        "user.custom_tool_result" => {
            fields(
                event,
                &["type", "custom_tool_use_id", "content", "is_error"],
                field,
            )?;
            let call_id = string_field(event, "custom_tool_use_id", field)?;
            let is_error = match event.get("is_error") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(Problem::bad_request(format!(
                        "{field}.is_error: must be a boolean"
                    )))
                }
            };
            let output = match event.get("content") {
                None | Some(Value::Null) => String::new(),
                Some(Value::Array(blocks)) => {
                    let mut texts = Vec::new();
                    for (i, block) in blocks.iter().enumerate() {
                        match (block["type"].as_str(), block["text"].as_str()) {
                            (Some("text"), Some(text)) => texts.push(text.to_string()),
                            (Some("text"), None) => {
                                return Err(Problem::bad_request(format!(
                                    "{field}.content[{i}].text: must be a string"
                                )))
                            }
                            (other, _) => {
                                return Err(Problem::bad_request(format!(
                                    "{field}.content[{i}].type: {} blocks are not supported \
                                     (only text)",
                                    other.unwrap_or("untyped")
                                )))
                            }
                        }
                    }
                    texts.join("\n")
                }
                Some(_) => {
                    return Err(Problem::bad_request(format!(
                        "{field}.content: must be an array"
                    )))
                }
            };
            Ok(Action::Result {
                call_id,
                output,
                is_error,
            })
        }
        "user.define_outcome" | "user.tool_result" | "system.message" => {
            Err(Problem::bad_request(format!(
                "{field}.type: {kind} is not supported by tah (outcomes, self-hosted tool results \
                 and system messages have no equivalent yet)"
            )))
        }
        other => Err(Problem::bad_request(format!(
            "{field}.type: {other} is not an event a client sends"
        ))),
    }
}

/// Every event of the session's log, as their events (previews left out).
async fn all_frames(state: &AppState, id: Uuid) -> Result<Vec<Frame>, Problem> {
    let mut view = SessionEvents::new(Deltas::default());
    let mut frames = Vec::new();
    let mut after = 0;
    loop {
        let page = state.sessions.events_page(id, after, PAGE).await?;
        for event in &page {
            frames.extend(view.push(event).into_iter().filter(|f| !f.preview));
        }
        match page.last() {
            Some(last) if page.len() as i64 == PAGE => after = last.seq,
            _ => break,
        }
    }
    Ok(frames)
}

fn time_param(query: &Query, key: &str) -> Result<Option<DateTime<Utc>>, Problem> {
    match query.one(key) {
        None => Ok(None),
        Some(text) => DateTime::parse_from_rfc3339(text)
            .map(|t| Some(t.with_timezone(&Utc)))
            .map_err(|_| Problem::bad_request(format!("{key}: must be an RFC 3339 time"))),
    }
}

async fn list(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, Problem> {
    let query = Query::parse(
        raw.as_deref(),
        &[
            "limit",
            "page",
            "order",
            "types",
            "created_at[gt]",
            "created_at[gte]",
            "created_at[lt]",
            "created_at[lte]",
        ],
    )?;
    let limit = query.limit()? as usize;
    let desc = match query.one("order") {
        None | Some("asc") => false,
        Some("desc") => true,
        Some(_) => return Err(Problem::bad_request("order: must be asc or desc")),
    };
    let page = match query.one("page") {
        None | Some("") => None,
        Some(text) => {
            Some(parse_frame_id(text).ok_or_else(|| Problem::bad_request("page: not a cursor"))?)
        }
    };
    let types = query.all("types");
    let gt = time_param(&query, "created_at[gt]")?;
    let gte = time_param(&query, "created_at[gte]")?;
    let lt = time_param(&query, "created_at[lt]")?;
    let lte = time_param(&query, "created_at[lte]")?;
    state.sessions.get(id).await?;
    let mut frames = all_frames(&state, id).await?;
    if desc {
        frames.reverse();
    }
    let kept = frames.into_iter().filter(|f| {
        let at = f.event["processed_at"]
            .as_str()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc));
        let after_page = match (page, desc) {
            (None, _) => true,
            (Some(p), false) => f.id > p,
            (Some(p), true) => f.id < p,
        };
        after_page
            && (types.is_empty() || types.contains(&f.kind.as_str()))
            && at.is_none_or(|at| {
                gt.is_none_or(|t| at > t)
                    && gte.is_none_or(|t| at >= t)
                    && lt.is_none_or(|t| at < t)
                    && lte.is_none_or(|t| at <= t)
            })
    });
    let mut data: Vec<Frame> = kept.take(limit + 1).collect();
    let next = match data.len() > limit {
        true => {
            data.truncate(limit);
            data.last().map(|f| f.id.to_string())
        }
        false => None,
    };
    let data: Vec<Value> = data.into_iter().map(|f| f.event).collect();
    Ok(Json(json!({"data": data, "next_page": next})))
}

async fn stream(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let query = Query::parse(raw.as_deref(), &["event_deltas", "access_token"])?;
    let mut deltas = Deltas::default();
    for kind in query.all("event_deltas") {
        match kind {
            "agent.message" => deltas.message = true,
            "agent.thinking" => deltas.thinking = true,
            other => {
                return Err(Problem::bad_request(format!(
                    "event_deltas: {other} has no deltas (agent.message, agent.thinking have)"
                )))
            }
        }
    }
    let resume = match headers.get("last-event-id") {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .ok()
                .and_then(parse_frame_id)
                .ok_or_else(|| {
                    Problem::bad_request(
                        "Last-Event-ID: must be a frame id (a non-negative integer)",
                    )
                })?,
        ),
    };
    // Live only: what the log holds now was not asked for (read before subscribing, so that
    // nothing committed in between is missed).
    let after = match resume {
        Some(after) => after,
        None => last_frame_of(state.sessions.get(id).await?.last_seq),
    };
    let events = state.sessions.follow(id, 0, None).await?;
    let view = SessionEvents::new(deltas);
    let frames = futures::stream::unfold(
        (events, view),
        move |(mut events, mut view)| async move {
            loop {
                let event = match events.next().await? {
                    Ok(event) => event,
                    Err(error) => {
                        tracing::warn!(%error, "an Anthropic event stream ended by a storage error");
                        return None;
                    }
                };
                let frames: Vec<Frame> = view
                    .push(&event)
                    .into_iter()
                    .filter(|f| f.id > after)
                    .collect();
                if !frames.is_empty() {
                    return Some((frames, (events, view)));
                }
            }
        },
    )
    .flat_map(futures::stream::iter)
    .map(|frame| {
        Ok::<_, Infallible>(
            SseEvent::default()
                .id(frame.id.to_string())
                .event(frame.kind)
                .data(frame.event.to_string()),
        )
    })
    .take_until(state.shutdown.clone().cancelled_owned());
    let mut response = Sse::new(frames)
        .keep_alive(KeepAlive::new().interval(HEARTBEAT).text("heartbeat"))
        .into_response();
    let headers = response.headers_mut();
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}
