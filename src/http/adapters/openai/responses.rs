//! `/openai/v1/responses`: OpenAI's Responses API over tah's sessions. A conversation is a
//! session; a response is one run's stretch from where its request took over to where the
//! run ended or waited for answers ([`crate::protocols::openai`]).
//!
//! - `POST /openai/v1/responses` starts a session (no `previous_response_id` or
//!   `conversation`) or continues one: new input starts the session's next run; the answers
//!   a request carries (`function_call_output`, `mcp_approval_response` items) go to the
//!   calls the run waits for, and the response follows the run from there. JSON when the
//!   response ended (or at once with `background`), or the stream of `response.*` events.
//! - `GET …/{id}` (the response as the log has it; `?stream=true&starting_after=N` replays
//!   its events after `N`, then follows it live), `POST …/{id}/cancel`, `DELETE …/{id}` (the
//!   conversation: tah's log is append-only), `GET …/{id}/input_items`.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::sse;
use crate::http::access::{check_session_access, denied, Caller};
use crate::http::problem::{ApiJson, ApiQuery, Problem};
use crate::http::runs::input_text;
use crate::http::AppState;
use crate::model::{
    AgentChoice, AgentRecord, ClientTool, Decision, Event, EventKind, Principal, RunRecord,
    SessionAgent, SessionNeed, SessionOptions, SessionRecord,
};
use crate::protocols::calls::{last_park, RunCalls, Wait};
use crate::protocols::openai::{
    approval_item_id, call_of_approval_item, parse_conversation, Echo, Frame, ResponseId,
    ResponseView,
};
use crate::session::{
    ApprovalAnswer, ClientResult, Follow, NewSession, Pending, RunRequest, Subscription,
};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/openai/v1/responses", post(create))
        .route("/openai/v1/responses/{id}", get(retrieve).delete(delete))
        .route("/openai/v1/responses/{id}/cancel", post(cancel))
        .route("/openai/v1/responses/{id}/input_items", get(input_items))
}

/// How long a cancel waits for the run to record its end.
const CANCEL_WAIT: Duration = Duration::from_secs(10);

/// The request body: the fields tah maps; any other field is in `rest` and refused unless it
/// is null or says what tah does anyway.
#[derive(Debug, Deserialize)]
struct CreateBody {
    model: Option<String>,
    input: Option<Value>,
    instructions: Option<String>,
    tools: Option<Vec<Value>>,
    previous_response_id: Option<String>,
    conversation: Option<Value>,
    stream: Option<bool>,
    background: Option<bool>,
    metadata: Option<Value>,
    #[serde(flatten)]
    rest: Map<String, Value>,
}

/// Fields tah accepts only with the value that says what it does anyway.
fn accepted_as_is(name: &str, value: &Value) -> bool {
    match name {
        "store" | "parallel_tool_calls" => value == &Value::Bool(true),
        "tool_choice" => value == "auto",
        // tah trims a long context (`auto`), and never errs on one (`disabled` is honoured
        // up to the model's own limit).
        "truncation" => value == "auto" || value == "disabled",
        "include" => value.as_array().is_some_and(Vec::is_empty),
        "text" => value == &json!({ "format": { "type": "text" } }),
        _ => false,
    }
}

/// What a request's `input` carries.
#[derive(Debug, Default)]
struct Input {
    text: Option<String>,
    /// `function_call_output` items: call id, output.
    outputs: Vec<(String, String)>,
    /// `mcp_approval_response` items: call id, approve, reason.
    approvals: Vec<(String, bool, Option<String>)>,
}

impl Input {
    fn answers(&self) -> bool {
        !self.outputs.is_empty() || !self.approvals.is_empty()
    }
}

fn parse_input(input: Option<&Value>) -> Result<Input, Problem> {
    let mut parsed = Input::default();
    let items = match input {
        None | Some(Value::Null) => return Ok(parsed),
        Some(Value::String(text)) => {
            parsed.text = Some(input_text(text.clone())?);
            return Ok(parsed);
        }
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(Problem::bad_request(
                "input must be a string or an array of input items",
            ))
        }
    };
    let mut texts = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let kind = item["type"].as_str().unwrap_or(match item.get("role") {
            Some(_) => "message",
            None => "",
        });
        match kind {
            "message" => {
                match item["role"].as_str() {
                    Some("user") => {}
                    Some(role @ ("system" | "developer")) => {
                        return Err(Problem::bad_request(format!(
                            "input[{i}]: {role} messages are not supported: give them as \
                             instructions (the session's system prompt)"
                        )))
                    }
                    Some(role) => {
                        return Err(Problem::bad_request(format!(
                            "input[{i}]: {role} messages are not supported: tah keeps the \
                             conversation; continue it with previous_response_id or \
                             conversation"
                        )))
                    }
                    None => {
                        return Err(Problem::bad_request(format!("input[{i}].role is required")))
                    }
                }
                texts.push(message_text(i, &item["content"])?);
            }
            "function_call_output" => {
                let Some(call_id) = item["call_id"].as_str() else {
                    return Err(Problem::bad_request(format!(
                        "input[{i}].call_id must be a string"
                    )));
                };
                let output = match &item["output"] {
                    Value::String(text) => text.clone(),
                    Value::Array(_) => message_text(i, &item["output"])?,
                    _ => {
                        return Err(Problem::bad_request(format!(
                            "input[{i}].output must be a string or text content"
                        )))
                    }
                };
                parsed.outputs.push((call_id.to_string(), output));
            }
            "mcp_approval_response" => {
                let call = item["approval_request_id"]
                    .as_str()
                    .and_then(call_of_approval_item);
                let Some(call) = call else {
                    return Err(Problem::bad_request(format!(
                        "input[{i}].approval_request_id must name an mcp_approval_request item"
                    )));
                };
                let Some(approve) = item["approve"].as_bool() else {
                    return Err(Problem::bad_request(format!(
                        "input[{i}].approve must be a boolean"
                    )));
                };
                let reason = item["reason"].as_str().map(str::to_string);
                parsed.approvals.push((call.to_string(), approve, reason));
            }
            "" => {
                return Err(Problem::bad_request(format!(
                    "input[{i}] needs a type (message, function_call_output, \
                     mcp_approval_response)"
                )))
            }
            other => {
                return Err(Problem::bad_request(format!(
                    "input[{i}]: items of type {other} are not supported (only message, \
                     function_call_output and mcp_approval_response: tah keeps the \
                     conversation; continue it with previous_response_id or conversation)"
                )))
            }
        }
    }
    if !texts.is_empty() {
        parsed.text = Some(input_text(texts.join("\n"))?);
    }
    Ok(parsed)
}

/// The text of a message's content: a string, or `input_text` (`output_text`) parts.
pub(super) fn message_text(i: usize, content: &Value) -> Result<String, Problem> {
    match content {
        Value::String(text) => Ok(text.clone()),
        Value::Array(parts) => {
            let mut texts = Vec::new();
            for part in parts {
                match (part["type"].as_str(), part["text"].as_str()) {
                    (Some("input_text" | "output_text"), Some(text)) => texts.push(text),
                    (Some(other), _) => {
                        return Err(Problem::bad_request(format!(
                            "input[{i}]: content parts of type {other} are not supported \
                             (only input_text)"
                        )))
                    }
                    (None, _) => {
                        return Err(Problem::bad_request(format!(
                            "input[{i}]: every content part needs a type"
                        )))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err(Problem::bad_request(format!(
            "input[{i}].content must be a string or an array of content parts"
        ))),
    }
}

/// Function tools as the run's client tools; any other tool type is refused.
pub(super) fn client_tools(tools: &[Value]) -> Result<Vec<ClientTool>, Problem> {
    let mut out = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        match tool["type"].as_str() {
            Some("function") => {}
            Some(other) => {
                return Err(Problem::bad_request(format!(
                    "tools[{i}]: tools of type {other} are not supported: tah's own and MCP \
                     tools run on the server (the agent's); only function tools (run by the \
                     client) can be given"
                )))
            }
            None => return Err(Problem::bad_request(format!("tools[{i}].type is required"))),
        }
        let Some(name) = tool["name"].as_str() else {
            return Err(Problem::bad_request(format!(
                "tools[{i}].name must be a string"
            )));
        };
        let schema = match &tool["parameters"] {
            Value::Null => json!({ "type": "object", "properties": {} }),
            schema => schema.clone(),
        };
        out.push(ClientTool {
            name: name.to_string(),
            description: tool["description"].as_str().unwrap_or("").to_string(),
            input_schema: schema,
            timeout_s: None,
        });
    }
    Ok(out)
}

/// The function tools of a run, as a response shows them.
pub(super) fn tools_shown(tools: &[ClientTool]) -> Value {
    tools
        .iter()
        .map(|t| {
            json!({
                "type": "function", "name": t.name, "description": t.description,
                "parameters": t.input_schema, "strict": false,
            })
        })
        .collect()
}

async fn create(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiJson(body): ApiJson<CreateBody>,
) -> Result<Response, Problem> {
    let unsupported: Vec<&str> = body
        .rest
        .iter()
        .filter(|(name, value)| !value.is_null() && !accepted_as_is(name, value))
        .map(|(name, _)| name.as_str())
        .collect();
    if !unsupported.is_empty() {
        return Err(Problem::bad_request(format!(
            "not supported by tah: {} (see the OpenAI page of tah's manual for what each \
             field maps to)",
            unsupported.join(", ")
        )));
    }
    if body
        .metadata
        .as_ref()
        .is_some_and(|m| !m.is_object() && !m.is_null())
    {
        return Err(Problem::bad_request("metadata must be an object"));
    }
    let input = parse_input(body.input.as_ref())?;
    let tools = client_tools(body.tools.as_deref().unwrap_or_default())?;
    let background = body.background.unwrap_or(false);
    let stream = body.stream.unwrap_or(false);
    let conversation = match &body.conversation {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(Value::Object(c)) => match c.get("id").and_then(Value::as_str) {
            Some(id) => Some(id.to_string()),
            None => return Err(Problem::bad_request("conversation.id must be a string")),
        },
        Some(_) => {
            return Err(Problem::bad_request(
                "conversation must be a conversation id or {id}",
            ))
        }
    };
    let session = match (&body.previous_response_id, &conversation) {
        (Some(_), Some(_)) => {
            return Err(Problem::bad_request(
                "give previous_response_id or conversation, not both",
            ))
        }
        (Some(previous), None) => {
            let id = ResponseId::parse(previous)
                .ok_or_else(|| Problem::not_found(format!("response {previous} not found")))?;
            Some((id.session, Some(id)))
        }
        (None, Some(conversation)) => {
            let id = parse_conversation(conversation).ok_or_else(|| {
                Problem::not_found(format!("conversation {conversation} not found"))
            })?;
            Some((id, None))
        }
        (None, None) => None,
    };
    let (record, agent) = match session {
        Some((id, previous)) => {
            check_session_access(&state.sessions, &caller, id, SessionNeed::Interact).await?;
            let record = state.sessions.get(id).await?;
            let agent = session_agent(&state, &record).await?;
            check_same(&body, &record, &agent)?;
            if let Some(previous) = previous {
                if record.last_run_id != Some(previous.run) {
                    return Err(Problem::bad_request(
                        "previous_response_id must be the conversation's latest response: a \
                         tah conversation is one line (fork the session to branch it)",
                    ));
                }
            }
            (record, agent)
        }
        None => new_session(&state, &caller, &body).await?,
    };
    let echo = Echo {
        model: agent.spec.model.clone(),
        instructions: record.system_prompt.clone(),
        metadata: record.metadata.clone(),
        tools: tools_shown(&tools),
        previous_response_id: body.previous_response_id.clone(),
        background,
    };
    let id = record.id;
    let live = state.sessions.subscribe(id)?;
    let (response_id, run) = if input.answers() {
        if input.text.is_some() {
            return Err(Problem::bad_request(
                "a request either answers the calls its previous response waits for \
                 (function_call_output, mcp_approval_response) or gives new input, not both",
            ));
        }
        answer(&state, &record, &input, caller.id()).await?
    } else {
        let Some(text) = input.text.clone() else {
            return Err(Problem::bad_request("input is required"));
        };
        state.sessions.check_run_tools(&tools)?;
        let request = RunRequest::run(text, Pending::Refuse).with_client_tools(tools);
        let started = state.sessions.start(id, request, Follow::Record).await?;
        let run = started.into_run()?.run;
        let response_id = ResponseId {
            session: id,
            run: run.id,
            after: run.start_seq - 1,
        };
        (response_id, run)
    };
    let mut view = ResponseView::new(response_id, echo, run.created_at.timestamp());
    if background {
        view.set_queued();
    }
    if stream {
        let frames = follow(&state, &run, view, live, -1);
        return Ok(sse(frames, state.shutdown.clone()));
    }
    if background {
        return Ok(Json(view.object()).into_response());
    }
    let object = last_object(follow(&state, &run, view.clone(), live, -1)).await;
    Ok(Json(object.unwrap_or_else(|| view.object())).into_response())
}

/// A new session for a request that continues none: on the agent its `model` names, with
/// its `instructions` as system prompt and its `metadata`.
async fn new_session(
    state: &AppState,
    caller: &Principal,
    body: &CreateBody,
) -> Result<(SessionRecord, AgentRecord), Problem> {
    caller
        .may_create_sessions()
        .map_err(|d| denied(d, "session"))?;
    let (chosen, version) = choose_model(state, body.model.as_deref(), caller.tenant()).await?;
    let tenant = caller.tenant().unwrap_or(&version.tenant).to_string();
    let options = SessionOptions {
        agent: chosen,
        ..SessionOptions::default()
    };
    let options = state.sessions.check_options_on(options, &version)?;
    let metadata = body.metadata.clone().filter(|m| !m.is_null());
    let record = state
        .sessions
        .create(
            NewSession {
                system_prompt: body.instructions.clone(),
                title: None,
                metadata,
                options,
                tenant,
                owner: Some(caller.id().to_string()),
            },
            &version,
        )
        .await?;
    Ok((record, version))
}

/// The agent a `model` names: absent, `default` or the default agent's model → the default
/// agent; an agent's id → that agent (in the caller's tenant).
pub(super) async fn choose_model(
    state: &AppState,
    model: Option<&str>,
    tenant: Option<&str>,
) -> Result<(SessionAgent, AgentRecord), Problem> {
    let default = state.sessions.default_agent();
    let Some(model) = model else {
        return Ok(state.sessions.choose_agent(None, tenant).await?);
    };
    if names_model(model, &default) {
        return Ok(state.sessions.choose_agent(None, tenant).await?);
    }
    match serde_json::from_value::<AgentChoice>(json!(model)) {
        Ok(choice) => Ok(state.sessions.choose_agent(Some(&choice), tenant).await?),
        Err(_) => Err(Problem::bad_request(format!(
            "model {model:?} is neither the default agent's model ({}) nor an agent's id",
            default.spec.model
        ))),
    }
}

/// Whether `model` names `agent` (its id, or its model with or without the default
/// provider's prefix).
pub(super) fn names_model(model: &str, agent: &AgentRecord) -> bool {
    model == agent.id.to_string()
        || model == agent.spec.model
        || model.strip_prefix("default/") == Some(agent.spec.model.as_str())
        || agent.spec.model.strip_prefix("default/") == Some(model)
}

/// The agent version a session's last (or next) run uses.
async fn session_agent(state: &AppState, record: &SessionRecord) -> Result<AgentRecord, Problem> {
    let tag = &record.options.agent.tag;
    Ok(state.sessions.agent(tag.id, Some(tag.version)).await?)
}

/// A request that continues a conversation may repeat its model, instructions and metadata,
/// not change them.
fn check_same(
    body: &CreateBody,
    record: &SessionRecord,
    agent: &AgentRecord,
) -> Result<(), Problem> {
    if let Some(model) = &body.model {
        if !names_model(model, agent) {
            return Err(Problem::bad_request(format!(
                "model {model:?} is not the conversation's ({}): a conversation keeps its agent",
                agent.spec.model
            )));
        }
    }
    if let Some(instructions) = &body.instructions {
        if record.system_prompt.as_deref() != Some(instructions.as_str()) {
            return Err(Problem::bad_request(
                "instructions differ from the conversation's: they are its system prompt, set \
                 by its first request",
            ));
        }
    }
    if let Some(metadata) = body.metadata.as_ref().filter(|m| !m.is_null()) {
        if metadata != &record.metadata {
            return Err(Problem::bad_request(
                "metadata differs from the conversation's: it is set by its first request",
            ));
        }
    }
    Ok(())
}

/// Gives a request's answers to the calls the session's last run waits for; the response
/// starts where the run waited.
async fn answer(
    state: &AppState,
    record: &SessionRecord,
    input: &Input,
    answered_by: &str,
) -> Result<(ResponseId, RunRecord), Problem> {
    let id = record.id;
    let run = match record.last_run_id {
        Some(run_id) => state.sessions.run_record(id, run_id).await?,
        None => None,
    };
    let Some(run) = run else {
        return Err(Problem::bad_request(
            "nothing waits for an answer in this conversation",
        ));
    };
    let events = state.sessions.run_events(id, &run).await?;
    let mut calls = RunCalls::default();
    for event in &events {
        calls.apply(event);
    }
    let after = match (calls.is_parked(), last_park(&events)) {
        (true, Some(after)) => after,
        _ => {
            return Err(Problem::bad_request(
                "nothing waits for an answer in this conversation (its last response did not \
                 end waiting for one)",
            ))
        }
    };
    for (call_id, _) in &input.outputs {
        let waits = calls
            .waiting()
            .any(|c| &c.id == call_id && c.wait == Some(Wait::Client));
        if !waits {
            return Err(Problem::bad_request(format!(
                "function_call_output: no function call {call_id} waits for its output"
            )));
        }
    }
    for (call_id, _, _) in &input.approvals {
        let waits = calls
            .waiting()
            .any(|c| &c.id == call_id && matches!(c.wait, Some(Wait::Approval { .. })));
        if !waits {
            return Err(Problem::bad_request(format!(
                "mcp_approval_response: no approval request {} waits for an answer",
                approval_item_id(call_id)
            )));
        }
    }
    for (call_id, output) in &input.outputs {
        let result = ClientResult {
            call_id: call_id.clone(),
            output: output.clone(),
            is_error: false,
        };
        state.sessions.client_result(id, result).await?;
    }
    for (call_id, approve, reason) in &input.approvals {
        let answer = ApprovalAnswer {
            decision: if *approve {
                Decision::Allow
            } else {
                Decision::Deny
            },
            reason: reason.clone(),
            input: None,
            answered_by: Some(answered_by.to_string()),
        };
        state.sessions.approve(id, call_id.clone(), answer).await?;
    }
    let response_id = ResponseId {
        session: id,
        run: run.id,
        after,
    };
    Ok((response_id, run))
}

/// A response's stream events after `starting_after`: its opening, then what the run's log
/// gives from the response's start (events before it are read silently) until it ends.
fn follow(
    state: &AppState,
    run: &RunRecord,
    view: ResponseView,
    live: Subscription,
    starting_after: i64,
) -> impl Stream<Item = Frame> + Send + 'static {
    let id = view.id;
    let events = state
        .sessions
        .stream_from(id.session, run.start_seq - 1, live, Some(run.id));
    let opening = view.opening();
    let rest = futures::stream::unfold(Some((view, events)), |phase| async move {
        let (mut view, mut events) = phase?;
        if view.ended() {
            return None;
        }
        let event = match events.next().await {
            Some(Ok(event)) => event,
            Some(Err(error)) => {
                tracing::warn!(%error, "a response's stream ended by a storage error");
                return None;
            }
            None => return None,
        };
        let frames = view.push(&event);
        Some((frames, Some((view, events))))
    });
    futures::stream::iter(opening)
        .chain(rest.flat_map(futures::stream::iter))
        .filter(move |frame| std::future::ready(frame.sequence_number > starting_after))
}

/// The response object of the last event of a stream that ends with the response.
async fn last_object(frames: impl Stream<Item = Frame>) -> Option<Value> {
    let mut frames = std::pin::pin!(frames);
    let mut last = None;
    while let Some(frame) = frames.next().await {
        if let Some(response) = frame.data.get("response") {
            last = Some(response.clone());
        }
    }
    last
}

/// A response's id from the path, its run, and what a response shows beside the log.
async fn lookup(
    state: &AppState,
    caller: &Principal,
    raw: &str,
    need: SessionNeed,
) -> Result<(ResponseView, RunRecord), Problem> {
    let not_found = || Problem::not_found(format!("response {raw} not found"));
    let id = ResponseId::parse(raw).ok_or_else(not_found)?;
    check_session_access(&state.sessions, caller, id.session, need).await?;
    let record = state.sessions.get(id.session).await?;
    let run = state
        .sessions
        .run_record(id.session, id.run)
        .await?
        .ok_or_else(not_found)?;
    if id.after < run.start_seq - 1 {
        return Err(not_found());
    }
    let agent = session_agent(state, &record).await?;
    let echo = Echo {
        model: agent.spec.model.clone(),
        instructions: record.system_prompt.clone(),
        metadata: record.metadata.clone(),
        tools: tools_shown(&run.client_tools),
        previous_response_id: None,
        background: false,
    };
    let view = ResponseView::new(id, echo, run.created_at.timestamp());
    Ok((view, run))
}

/// The response as its run's log has it now.
async fn read(
    state: &AppState,
    mut view: ResponseView,
    run: &RunRecord,
) -> Result<ResponseView, Problem> {
    let events = state.sessions.run_events(view.id.session, run).await?;
    for event in &events {
        view.push(event);
    }
    // A point the run never reached (or passed without waiting there) names no response.
    if view.id.after != run.start_seq - 1 && !parked_at(&events, view.id.after) {
        return Err(Problem::not_found(format!(
            "response {} not found",
            view.id.encode()
        )));
    }
    Ok(view)
}

/// Whether the run waited for answers right after the event `seq`.
fn parked_at(events: &[Event], seq: i64) -> bool {
    let mut calls = RunCalls::default();
    events
        .iter()
        .any(|event| calls.apply(event) && event.seq == seq)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetrieveQuery {
    stream: Option<bool>,
    starting_after: Option<i64>,
    /// No stream event is obfuscated: accepted, and nothing to do.
    #[serde(rename = "include_obfuscation")]
    _include_obfuscation: Option<bool>,
}

async fn retrieve(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(raw): Path<String>,
    ApiQuery(query): ApiQuery<RetrieveQuery>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let (view, run) = lookup(&state, &caller, &raw, SessionNeed::Read).await?;
    if query.stream == Some(true) {
        // An EventSource that reconnects sends the last id it saw as `Last-Event-ID`.
        let last_event_id = match headers.get("last-event-id") {
            None => None,
            Some(value) => Some(
                value
                    .to_str()
                    .ok()
                    .and_then(|v| v.trim().parse::<i64>().ok())
                    .ok_or_else(|| Problem::bad_request("Last-Event-ID must be an event id"))?,
            ),
        };
        let live = state.sessions.subscribe(view.id.session)?;
        // Checks that the response exists before streaming it.
        read(&state, view.clone(), &run).await?;
        let after = query.starting_after.or(last_event_id).unwrap_or(-1);
        return Ok(sse(
            follow(&state, &run, view, live, after),
            state.shutdown.clone(),
        ));
    }
    if query.starting_after.is_some() {
        return Err(Problem::bad_request(
            "starting_after is for a stream (stream=true)",
        ));
    }
    let view = read(&state, view, &run).await?;
    Ok(Json(view.object()).into_response())
}

async fn cancel(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(raw): Path<String>,
) -> Result<Response, Problem> {
    let (view, run) = lookup(&state, &caller, &raw, SessionNeed::Interact).await?;
    let live = state.sessions.subscribe(view.id.session)?;
    let now = read(&state, view.clone(), &run).await?;
    if now.ended() {
        return Ok(Json(now.object()).into_response());
    }
    state.sessions.cancel(view.id.session).await?;
    let frames = follow(&state, &run, view, live, -1);
    let object = tokio::time::timeout(CANCEL_WAIT, last_object(frames))
        .await
        .ok()
        .flatten();
    let object = match object {
        Some(object) => object,
        None => read(&state, now, &run).await?.object(),
    };
    Ok(Json(object).into_response())
}

/// Deletes the conversation the response is part of: tah's log is append-only, so one
/// response cannot go alone.
async fn delete(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(raw): Path<String>,
) -> Result<Response, Problem> {
    let (view, run) = lookup(&state, &caller, &raw, SessionNeed::Own).await?;
    let view = read(&state, view, &run).await?;
    state.sessions.delete(view.id.session).await?;
    let body = json!({ "id": view.id.encode(), "object": "response.deleted", "deleted": true });
    Ok((StatusCode::OK, Json(body)).into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ItemsQuery {
    after: Option<String>,
    limit: Option<usize>,
    order: Option<String>,
}

/// What a response's request gave: the user's input (its run's, or messages queued into
/// it), the client's tool outputs and the approval answers, in the order the log has them.
async fn input_items(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(raw): Path<String>,
    ApiQuery(query): ApiQuery<ItemsQuery>,
) -> Result<Response, Problem> {
    let (view, run) = lookup(&state, &caller, &raw, SessionNeed::Read).await?;
    let view = read(&state, view, &run).await?;
    let limit = query.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(Problem::bad_request("limit must be between 1 and 100"));
    }
    let events = state.sessions.run_events(view.id.session, &run).await?;
    let mut items = Vec::new();
    let first = view.id.after == run.start_seq - 1;
    if first {
        if let Some(input) = &run.input {
            items.push(user_item(format!("msg_{}", run.id.simple()), input));
        }
    }
    let client: std::collections::HashSet<&str> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolClientRequested { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    let mut calls = RunCalls::default();
    for event in &events {
        let parked = calls.apply(event);
        if event.seq <= view.id.after {
            continue;
        }
        match &event.kind {
            EventKind::UserMessage {
                message,
                queued: true,
            } => items.push(user_item(format!("msg_in_{}", event.seq), &message.content)),
            EventKind::ToolFinished {
                call_id, output, ..
            } if client.contains(call_id.as_str()) => items.push(json!({
                "type": "function_call_output", "id": format!("fco_{call_id}"),
                "call_id": call_id, "output": output, "status": "completed",
            })),
            EventKind::ToolApprovalResolved {
                call_id,
                decision,
                reason,
                by: crate::model::ResolvedBy::User,
                ..
            } => items.push(json!({
                "type": "mcp_approval_response", "id": format!("mcpa_{call_id}"),
                "approval_request_id": approval_item_id(call_id),
                "approve": !matches!(decision, Decision::Deny), "reason": reason,
            })),
            _ => {}
        }
        if parked || event.is_terminal() {
            break;
        }
    }
    if query.order.as_deref() != Some("asc") {
        if let Some(order) = query.order.as_deref().filter(|o| *o != "desc") {
            return Err(Problem::bad_request(format!(
                "order must be asc or desc, not {order:?}"
            )));
        }
        items.reverse();
    }
    if let Some(after) = &query.after {
        match items.iter().position(|i| i["id"] == after.as_str()) {
            Some(at) => {
                items.drain(..=at);
            }
            None => return Err(Problem::bad_request(format!("after: no item {after}"))),
        }
    }
    let has_more = items.len() > limit;
    items.truncate(limit);
    let body = json!({
        "object": "list",
        "first_id": items.first().map(|i| i["id"].clone()),
        "last_id": items.last().map(|i| i["id"].clone()),
        "has_more": has_more,
        "data": items,
    });
    Ok(Json(body).into_response())
}

fn user_item(id: String, text: &str) -> Value {
    json!({
        "type": "message", "id": id, "role": "user", "status": "completed",
        "content": [{ "type": "input_text", "text": text }],
    })
}
