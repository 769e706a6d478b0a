//! The Vercel AI SDK's chat routes (`DefaultChatTransport`, `useChat`):
//!
//! - `POST /v1/sessions/{id}/ai-sdk/chat` takes the SDK's body `{id, messages, trigger,
//!   messageId}`. Its last message is what is new: a user message starts a run with its text
//!   (the server's history is the truth; the rest of `messages` is not read); an assistant
//!   message continues the run it shows, with the answers it carries (approval responses,
//!   results of the client's tools). Either way the answer is the run as a UI message stream.
//! - `GET /v1/sessions/{id}/ai-sdk/chat/stream` (and `…/chat/{chat_id}/stream`, the SDK's
//!   default reconnect URL) replays the active run from its start, then follows it; `204`
//!   when the session runs nothing.
//! - `GET /v1/sessions/{id}/ai-sdk/messages` is the session's history as the SDK's
//!   `UIMessage[]` (a chat's initial `messages`), each run under the id its stream gave it.

use std::collections::HashSet;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::{sse_response, Driven, NoQuery};
use crate::http::access::Caller;
use crate::http::extract::Ids;
use crate::http::problem::{ApiJson, ApiQuery, Problem};
use crate::http::runs::{input_text, PendingParam};
use crate::http::AppState;
use crate::model::Principal;
use crate::model::SessionId;
use crate::model::{Decision, RunRecord};
use crate::protocols::ai_sdk::history::{self, UiHistory};
use crate::protocols::ai_sdk::{UiMessageStream, DONE, STREAM_HEADER};
use crate::protocols::calls::{last_park, RunCalls, Wait};
use crate::session::{
    ApprovalAnswer, ClientResult, Follow, Pending, RunRequest, SessionError, Subscription,
};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/sessions/{id}/ai-sdk/chat", post(chat))
        .route("/v1/sessions/{id}/ai-sdk/chat/stream", get(resume))
        .route(
            "/v1/sessions/{id}/ai-sdk/chat/{chat_id}/stream",
            get(resume_chat),
        )
        .route("/v1/sessions/{id}/ai-sdk/messages", get(messages))
}

/// The SDK's request body; fields it adds from the app's own `body` are ignored.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ChatBody {
    /// The chat's id on the client (the session is the one in the path).
    #[serde(rename = "id")]
    _chat_id: String,
    messages: Vec<UiMessage>,
    #[serde(default)]
    trigger: Option<String>,
    /// The message to regenerate (not used: regenerating is refused).
    #[serde(default, rename = "messageId")]
    _message_id: Option<String>,
}

#[derive(Debug, Deserialize)]
struct UiMessage {
    id: String,
    role: UiRole,
    #[serde(default)]
    parts: Vec<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum UiRole {
    System,
    User,
    Assistant,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChatQuery {
    pending: Option<PendingParam>,
}

async fn chat(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids(SessionId(id)): Ids<SessionId>,
    ApiQuery(query): ApiQuery<ChatQuery>,
    ApiJson(body): ApiJson<ChatBody>,
) -> Result<Response, Problem> {
    match body.trigger.as_deref() {
        None | Some("submit-message") => {}
        Some("regenerate-message") => {
            return Err(Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "regenerate-unsupported",
                "regenerating a reply is not supported: a session's history is append-only; \
                 fork the session before the message instead (POST /v1/sessions/{id}/fork)",
            ))
        }
        Some(other) => {
            return Err(Problem::bad_request(format!(
                "trigger must be submit-message or regenerate-message, not {other:?}"
            )))
        }
    }
    let shapeless = body
        .messages
        .iter()
        .flat_map(|m| &m.parts)
        .any(|p| !p["type"].is_string());
    if shapeless {
        return Err(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid-body",
            "every message part must be an object with a string type",
        ));
    }
    let Some(last) = body.messages.last() else {
        return Err(Problem::bad_request("messages must not be empty"));
    };
    match last.role {
        UiRole::User => {
            let text = user_text(&last.parts)?;
            let pending = match query.pending {
                Some(PendingParam::Deny) => Pending::Deny,
                _ => Pending::Refuse,
            };
            start(state, id, RunRequest::run(text, pending)).await
        }
        UiRole::Assistant => continue_run(state, id, last, &caller).await,
        UiRole::System => Err(Problem::bad_request(
            "the last message must be the user's (a new turn) or the assistant's (answers to it)",
        )),
    }
}

/// The text of a user message's text parts; other parts (files) are refused.
fn user_text(parts: &[Value]) -> Result<String, Problem> {
    let mut texts = Vec::new();
    for part in parts {
        match part["type"].as_str() {
            Some("text") => match part["text"].as_str() {
                Some(text) => texts.push(text),
                None => return Err(Problem::bad_request("a text part needs a string text")),
            },
            // Markers the SDK may keep in a message; they carry no input.
            Some("step-start") => {}
            Some(other) => {
                return Err(Problem::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "unsupported-part",
                    format!("user message parts of type {other:?} are not supported (only text)"),
                ))
            }
            None => return Err(Problem::bad_request("every message part needs a type")),
        }
    }
    input_text(texts.join("\n"))
}

async fn start(state: AppState, id: Uuid, request: RunRequest) -> Result<Response, Problem> {
    let started = state.sessions.start(id, request, Follow::Events).await?;
    let (run, events) = started.into_events()?;
    Ok(stream(&state, id, &run, events, UiMessageStream::new(0)))
}

/// A run's stream from its first event, then live (`live` was subscribed before it is read).
fn whole_run(state: &AppState, id: Uuid, run: &RunRecord, live: Subscription) -> Response {
    let events = state.sessions.run_stream(id, run, live);
    stream(
        state,
        id,
        run,
        events,
        UiMessageStream::new(/*skip_through*/ 0),
    )
}

fn stream(
    state: &AppState,
    id: Uuid,
    run: &RunRecord,
    events: crate::session::EventStream,
    adapter: UiMessageStream,
) -> Response {
    let driven = Driven {
        opening: vec![UiMessageStream::start(run.id)],
        events,
        adapter,
        sessions: state.sessions.clone(),
        session_id: id,
        closing: Some(DONE),
    };
    sse_response(
        driven.into_stream(),
        state.shutdown.clone(),
        &[STREAM_HEADER],
    )
}

/// Takes the answers an assistant message carries (approval responses on tool parts, the
/// client's tool outputs) for the calls of its run that wait, then streams the rest of the
/// run from where it waited.
async fn continue_run(
    state: AppState,
    id: Uuid,
    last: &UiMessage,
    caller: &Principal,
) -> Result<Response, Problem> {
    let run = state.sessions.run_to_continue(id, &last.id).await?;
    let live = state.sessions.subscribe(id)?;
    let so_far = state.sessions.run_events(id, &run).await?;
    let mut calls = RunCalls::default();
    for event in &so_far {
        calls.apply(event);
    }
    // The client has the message up to where the run last waited (or all of it).
    let skip_through = last_park(&so_far)
        .or(so_far.last().map(|e| e.seq))
        .unwrap_or(0);
    let mut known_outputs = HashSet::new();
    for part in &last.parts {
        if let Some(output_of) = answer(&state, id, &calls, part, caller.id()).await? {
            known_outputs.insert(output_of);
        }
    }
    let events = state.sessions.run_stream(id, &run, live);
    let adapter = UiMessageStream::continuing(skip_through, known_outputs);
    Ok(stream(&state, id, &run, events, adapter))
}

/// Gives the answer a tool part carries, if its call waits for one; returns the call when
/// the answer was a client tool's output. An answer the run no longer takes (answered
/// meanwhile, timed out) is left: the stream shows what happened.
async fn answer(
    state: &AppState,
    id: Uuid,
    calls: &RunCalls,
    part: &Value,
    answered_by: &str,
) -> Result<Option<String>, Problem> {
    let Some(kind) = part["type"].as_str() else {
        return Ok(None);
    };
    if !(kind.starts_with("tool-") || kind == "dynamic-tool") {
        return Ok(None);
    }
    let Some(call_id) = part["toolCallId"].as_str() else {
        return Err(Problem::bad_request("a tool part needs a toolCallId"));
    };
    let Some(call) = calls.waiting().find(|c| c.id == call_id) else {
        return Ok(None);
    };
    let mut output_of = None;
    let outcome = match (&call.wait, part["state"].as_str()) {
        (Some(Wait::Approval { .. }), Some("approval-responded")) => {
            let approval = &part["approval"];
            let Some(approved) = approval["approved"].as_bool() else {
                return Err(Problem::bad_request(
                    "an approval-responded tool part needs approval.approved",
                ));
            };
            let reason = approval["reason"].as_str().map(str::to_string);
            let answer = ApprovalAnswer {
                decision: if approved {
                    Decision::Allow
                } else {
                    Decision::Deny
                },
                reason,
                input: None,
                answered_by: Some(answered_by.to_string()),
            };
            state
                .sessions
                .approve(id, call.id.clone(), answer)
                .await
                .map(drop)
        }
        (Some(Wait::Client), Some(state_name @ ("output-available" | "output-error"))) => {
            let is_error = state_name == "output-error";
            let output = match is_error {
                true => part["errorText"].as_str().unwrap_or("").to_string(),
                false => match &part["output"] {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                },
            };
            output_of = Some(call.id.clone());
            let result = ClientResult {
                call_id: call.id.clone(),
                output,
                is_error,
            };
            state.sessions.client_result(id, result).await.map(drop)
        }
        _ => Ok(()),
    };
    match outcome {
        Ok(()) => Ok(output_of),
        Err(SessionError::Conflict(_)) | Err(SessionError::NotFound) => Ok(None),
        Err(error) => Err(Problem::from(error)),
    }
}

async fn resume(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    ApiQuery(_): ApiQuery<ChatQuery>,
) -> Result<Response, Problem> {
    replay_active(state, id).await
}

async fn resume_chat(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    // The transport keeps the chat URL's query (`?pending=`) on its resume URL: it is allowed
    // here and means nothing.
    ApiQuery(_): ApiQuery<ChatQuery>,
) -> Result<Response, Problem> {
    replay_active(state, id).await
}

/// The active run from its start, then live; `204` when the session runs nothing.
async fn replay_active(state: AppState, id: Uuid) -> Result<Response, Problem> {
    let live = state.sessions.subscribe(id)?;
    let Some(run) = state.sessions.active_run(id).await? else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    Ok(whole_run(&state, id, &run, live))
}

/// The session's history as `UIMessage[]`: the run in progress as far as it got.
async fn messages(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    ApiQuery(_): ApiQuery<NoQuery>,
) -> Result<Json<Vec<history::UiMessage>>, Problem> {
    let mut history = UiHistory::default();
    let session = state
        .sessions
        .read_log(id, |event| history.push(event))
        .await?;
    let active = session.last_run_id.filter(|_| session.state.is_active());
    Ok(Json(history.finish(active)))
}
