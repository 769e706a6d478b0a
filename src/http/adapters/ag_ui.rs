//! `POST /v1/sessions/{id}/ag-ui`: an AG-UI run (`RunAgentInput` in, AG-UI events out as SSE),
//! what `@ag-ui/client`'s `HttpAgent` and CopilotKit send.
//!
//! What the input brings, in this order:
//! - `resume`: answers to the interrupts of the previous AG-UI run (approvals the policy asked
//!   for): `{approved, editedArgs?, reason?}`, or `cancelled` (a denial);
//! - tool messages in `messages` for calls of the client's tools that wait: their results;
//! - a last message from the user: a new tah run with its text, offered `tools` as tools the
//!   client runs for that run.
//!
//! The answer opens with `RUN_STARTED` and a `MESSAGES_SNAPSHOT` of the session's history,
//! then streams the tah run (the new one, or the one the answers let go on) until it ends or
//! waits for answers again. A reconnect (no new message, no answers) to a run that waits ends
//! at once, with the interrupt or pending calls the client's first stream ended with.

use std::collections::HashSet;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use serde_json::Value;
use uuid::Uuid;

use super::{sse_response, Driven, NoQuery};
use crate::http::access::Caller;
use crate::http::extract::Ids;
use crate::http::problem::{ApiJson, ApiQuery, Problem};
use crate::http::runs::input_text;
use crate::http::AppState;
use crate::model::SessionId;
use crate::model::{ClientTool, Decision};
use crate::protocols::ag_ui::{
    content_text, snapshot, snapshot_view, AgUiRun, InputMessage, ResumeStatus, RunAgentInput,
};
use crate::protocols::calls::{last_park, RunCalls, Wait};
use crate::session::{
    one_input_one_purpose, ApprovalAnswer, ClientResult, EventStream, Follow, Pending, RunRequest,
    SessionError,
};

pub fn routes() -> Router<AppState> {
    Router::new().route("/v1/sessions/{id}/ag-ui", post(run))
}

/// The longest thread or run id accepted, in characters.
const MAX_ID_CHARS: usize = 256;

async fn run(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids(SessionId(id)): Ids<SessionId>,
    ApiQuery(NoQuery {}): ApiQuery<NoQuery>,
    ApiJson(input): ApiJson<RunAgentInput>,
) -> Result<Response, Problem> {
    for (name, value) in [("threadId", &input.thread_id), ("runId", &input.run_id)] {
        if value.is_empty() || value.chars().count() > MAX_ID_CHARS {
            return Err(Problem::bad_request(format!(
                "{name} must be 1-{MAX_ID_CHARS} characters"
            )));
        }
    }
    let tools: Vec<ClientTool> = input.tools.iter().map(|t| t.client_tool()).collect();
    state.sessions.check_run_tools(&tools)?;
    let new_input = match input.messages.last() {
        Some(InputMessage::User { content, .. }) => Some(
            content_text(content)
                .map_err(|e| {
                    Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "unsupported-content", e)
                })
                .and_then(input_text)?,
        ),
        _ => None,
    };
    let active = state.sessions.active_run(id).await?;
    // Read before the run's events: whatever the history holds then, the events read next
    // say where it came from (see `snapshot_view`).
    let history = state.sessions.messages_page(id, -1, -1).await?;
    let so_far = match &active {
        Some(run) => state.sessions.run_events(id, run).await?,
        None => Vec::new(),
    };
    let mut calls = RunCalls::default();
    for event in &so_far {
        calls.apply(event);
    }
    let answers = Answers::of(&input, &calls, caller.id())?;
    one_input_one_purpose(active.as_ref(), !answers.is_empty(), new_input.is_some())?;
    let known_results = answers.give(&state, id).await?;
    // What the client sent that the history may not hold yet: its results, its new message.
    let mut pending: Vec<&InputMessage> = input
        .messages
        .iter()
        .filter(|m| matches!(m, InputMessage::Tool { tool_call_id, .. } if known_results.contains(tool_call_id)))
        .collect();
    if new_input.is_some() {
        pending.extend(input.messages.last());
    }
    let skip = last_park(&so_far)
        .or(so_far.last().map(|e| e.seq))
        .unwrap_or(0);
    let (history, early) = snapshot_view(&history, &so_far, skip);
    pending.extend(early.iter());
    let opening = |agui: &AgUiRun| {
        vec![
            agui.started(),
            snapshot(&history, &input.messages, &pending),
        ]
    };
    let (events, skip_through): (EventStream, i64) = match new_input {
        Some(text) => {
            let request = RunRequest::run(text, Pending::Refuse).with_client_tools(tools);
            let started = state.sessions.start(id, request, Follow::Events).await?;
            let (_run, events) = started.into_events()?;
            (events, 0)
        }
        None => match active {
            // The stream reads the run's events after this subscription: it misses none.
            Some(run) => {
                let live = state.sessions.subscribe(id)?;
                (state.sessions.run_stream(id, &run, live), skip)
            }
            None => {
                // Nothing runs: the snapshot is all there is to tell.
                let agui = AgUiRun::new(&input.thread_id, &input.run_id, 0, HashSet::new());
                let mut frames = opening(&agui);
                frames.push(agui.finished_idle());
                let texts: Vec<String> = frames.iter().map(Value::to_string).collect();
                return Ok(sse_response(
                    futures::stream::iter(texts),
                    state.shutdown.clone(),
                    &[],
                ));
            }
        },
    };
    let agui = AgUiRun::new(&input.thread_id, &input.run_id, skip_through, known_results);
    let driven = Driven {
        opening: opening(&agui),
        events,
        adapter: agui,
        sessions: state.sessions.clone(),
        session_id: id,
        closing: None,
    };
    Ok(sse_response(
        driven.into_stream(),
        state.shutdown.clone(),
        &[],
    ))
}

/// The answers an input carries for calls that wait.
struct Answers {
    approvals: Vec<(String, ApprovalAnswer)>,
    /// Call id, output, is_error.
    results: Vec<(String, String, bool)>,
}

impl Answers {
    /// Reads them, checking each against what waits: a resume for an interrupt that no
    /// longer waits is a replay and left alone.
    fn of(input: &RunAgentInput, calls: &RunCalls, answered_by: &str) -> Result<Answers, Problem> {
        let waits = |id: &str, kind: fn(&Wait) -> bool| {
            calls
                .waiting()
                .any(|c| c.id == id && c.wait.as_ref().is_some_and(kind))
        };
        let mut approvals = Vec::new();
        for entry in &input.resume {
            if !waits(&entry.interrupt_id, |w| matches!(w, Wait::Approval { .. })) {
                continue;
            }
            let answer = match entry.status {
                ResumeStatus::Cancelled => ApprovalAnswer {
                    decision: Decision::Deny,
                    reason: Some("the user cancelled the interrupt".to_string()),
                    input: None,
                    answered_by: Some(answered_by.to_string()),
                },
                ResumeStatus::Resolved => {
                    let payload = entry.payload.clone().unwrap_or(Value::Null);
                    let Some(approved) = payload["approved"].as_bool() else {
                        return Err(Problem::new(
                            StatusCode::UNPROCESSABLE_ENTITY,
                            "invalid-resume",
                            format!(
                                "the resume of interrupt {:?} needs a payload {{approved: \
                                 boolean, editedArgs?: object, reason?: string}}",
                                entry.interrupt_id
                            ),
                        ));
                    };
                    let edited = payload.get("editedArgs").filter(|v| !v.is_null()).cloned();
                    if edited.as_ref().is_some_and(|v| !v.is_object()) {
                        return Err(Problem::new(
                            StatusCode::UNPROCESSABLE_ENTITY,
                            "invalid-resume",
                            "editedArgs must be an object (the call's arguments)",
                        ));
                    }
                    ApprovalAnswer {
                        decision: if approved {
                            Decision::Allow
                        } else {
                            Decision::Deny
                        },
                        reason: payload["reason"].as_str().map(str::to_string),
                        input: edited,
                        answered_by: Some(answered_by.to_string()),
                    }
                }
            };
            approvals.push((entry.interrupt_id.clone(), answer));
        }
        let mut results = Vec::new();
        for message in &input.messages {
            let InputMessage::Tool {
                content,
                tool_call_id,
                error,
                ..
            } = message
            else {
                continue;
            };
            if !waits(tool_call_id, |w| *w == Wait::Client) {
                continue;
            }
            let text = content_text(content).map_err(|e| {
                Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "unsupported-content", e)
            })?;
            let (output, is_error) = match error {
                Some(error) if text.is_empty() => (error.clone(), true),
                Some(_) => (text, true),
                None => (text, false),
            };
            results.push((tool_call_id.clone(), output, is_error));
        }
        Ok(Answers { approvals, results })
    }

    fn is_empty(&self) -> bool {
        self.approvals.is_empty() && self.results.is_empty()
    }

    /// Gives the answers; returns the calls whose results the client sent.
    async fn give(self, state: &AppState, id: Uuid) -> Result<HashSet<String>, Problem> {
        let tolerated = |outcome: Result<Value, SessionError>| match outcome {
            // Answered meanwhile, or timed out: the stream shows what happened.
            Ok(_) | Err(SessionError::Conflict(_)) | Err(SessionError::NotFound) => Ok(()),
            Err(error) => Err(Problem::from(error)),
        };
        for (call_id, answer) in self.approvals {
            tolerated(state.sessions.approve(id, call_id, answer).await)?;
        }
        let mut known = HashSet::new();
        for (call_id, output, is_error) in self.results {
            let result = ClientResult {
                call_id: call_id.clone(),
                output,
                is_error,
            };
            tolerated(state.sessions.client_result(id, result).await)?;
            known.insert(call_id);
        }
        Ok(known)
    }
}
