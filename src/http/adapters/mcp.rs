//! tah as an MCP server: `/mcp` speaks MCP's Streamable HTTP transport (rmcp's server side,
//! stateless: every POST stands alone, so any replica answers it; GET has no stream to offer
//! and is answered `405`, as the transport allows). Requests are authenticated like `/v1`; each
//! tool acts as the request's principal, which rmcp hands over in the request's HTTP parts.
//!
//! Tools:
//! - `tah_run {agent?, session_id?, input}`: a turn on an existing session, or a new session
//!   (of `agent`, or the default agent) with `input` as its first turn; waits for the run and
//!   answers its final text with `structuredContent {session_id, run_id, text, status, …}`,
//!   sending `notifications/progress` on the way when the request carries a progress token.
//!   A run that waits for an approval or a client tool's output is answered with what waits
//!   (`status: "waiting"`, `pending: [{call_id, tool, kind, input}]`).
//! - `tah_answer {session_id, call_id, decision?, reason?, output?, is_error?}`: approves or
//!   denies a waiting call, or gives a client tool's output; then waits for the run again.
//! - `tah_sessions {limit?}`: the caller's sessions, newest first.
//! - `tah_session {session_id}`: a session's state, last run and last messages.
//!
//! Another tenant's (or, for a member, another owner's) session is a tool error saying it was
//! not found, as tah's own API answers `404`.
//!
//! Tasks (the 2026-07-28 tasks extension, SEP-2663): a client that declares the extension gets
//! `tah_run` and `tah_answer` as tasks, `<session id>.<run id>`: `tasks/get` reads the run
//! (`working`, `input_required` with one elicitation per waiting call keyed by its call id,
//! `completed` with the tool result, `cancelled`), `tasks/update` answers the calls and
//! `tasks/cancel` cancels the run. Nothing is kept for them: the run's log is the task.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams, ContentBlock,
    CreateTaskResult, DetailedTask, GetTaskParams, GetTaskResult, Implementation, InputRequest,
    InputRequests, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ServerCapabilities, ServerConfig, Task, TaskPayload, TaskStatus, Tool, ToolAnnotations,
    UpdateTaskParams,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tower::ServiceExt as _;
use uuid::Uuid;

use crate::http::access::{check_session_access, denied};
use crate::http::problem::Problem;
use crate::http::runs::MAX_INPUT_CHARS;
use crate::http::AppState;
use crate::model::{AgentChoice, Decision, Principal, RunRecord, SessionNeed};
use crate::protocols::calls::RunCalls;
use crate::protocols::mcp::{Outcome, RunWatch};
use crate::session::{
    ApprovalAnswer, ClientResult, EventStream, Follow, Pending, RunRequest, SessionQuery,
};
use axum::RequestExt as _;

/// Events read per query when checking that a parked run still waits.
const PAGE: i64 = 500;
/// Messages `tah_session` shows.
const LAST_MESSAGES: i64 = 10;
/// Sessions `tah_sessions` lists when no limit is given, and at most.
const DEFAULT_LIMIT: i64 = 20;
const MAX_LIMIT: i64 = 100;
/// How often a task's client is told to poll `tasks/get`.
const TASK_POLL_MS: u64 = 500;

pub fn routes() -> Router<AppState> {
    Router::new().route("/mcp", any(serve))
}

async fn serve(State(state): State<AppState>, request: Request) -> Response {
    // rmcp reads the body itself: hold it to the server's body limit as axum's extractors do.
    let (parts, body) = request.with_limited_body().into_parts();
    let body = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(error) => return body_refused(error),
    };
    let request = Request::from_parts(parts, axum::body::Body::from(body));
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_sse_keep_alive(Some(crate::http::events::HEARTBEAT))
        // tah's own guard checks Host and Origin for every route.
        .disable_allowed_hosts()
        .disable_allowed_origins()
        .with_cancellation_token(state.shutdown.child_token());
    let server = TahMcp { state };
    let service: StreamableHttpService<TahMcp, LocalSessionManager> = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    match service.oneshot(request).await {
        Ok(response) => response.map(axum::body::Body::new),
        Err(never) => match never {},
    }
}

/// The answer to a body that could not be read: too large for the server's limit, or cut off.
fn body_refused(error: axum::Error) -> Response {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    let mut too_large = false;
    while let Some(e) = cause {
        too_large |= e.is::<http_body_util::LengthLimitError>();
        cause = e.source();
    }
    match too_large {
        true => Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload-too-large",
            "the request body is too large",
        )
        .into_response(),
        false => Problem::bad_request("the request body could not be read").into_response(),
    }
}

#[derive(Clone)]
struct TahMcp {
    state: AppState,
}

/// A tool's failure, answered as an MCP tool error (`isError: true`) with this text.
struct ToolError(String);

impl From<Problem> for ToolError {
    fn from(problem: Problem) -> ToolError {
        ToolError(match problem.status {
            404 => "session not found".to_string(),
            _ => problem.detail,
        })
    }
}

impl From<crate::session::SessionError> for ToolError {
    fn from(error: crate::session::SessionError) -> ToolError {
        ToolError::from(Problem::from(error))
    }
}

type ToolResult = Result<CallToolResult, ToolError>;

fn tool(
    name: &'static str,
    description: &'static str,
    input: Value,
    output: Option<Value>,
) -> Tool {
    let object = |v: Value| match v {
        Value::Object(map) => Arc::new(map),
        _ => unreachable!("a schema is an object"),
    };
    let mut tool = Tool::new(name, description, object(input));
    if let Some(output) = output {
        tool = tool.with_raw_output_schema(object(output));
    }
    tool
}

fn session_id_schema() -> Value {
    json!({"type": "string", "format": "uuid", "description": "A tah session's id."})
}

/// What `tah_run` and `tah_answer` answer in `structuredContent`.
fn run_output_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "session_id": {"type": "string"},
            "run_id": {"type": ["string", "null"]},
            "text": {"type": "string", "description": "The run's final text (or its latest reply's, while it waits)."},
            "status": {"type": "string", "enum": ["completed", "waiting", "failed", "cancelled", "running"]},
            "finish_reason": {"type": "string"},
            "error": {"type": "string"},
            "pending": {
                "type": "array",
                "description": "The calls the run waits for: answer each with tah_answer.",
                "items": {
                    "type": "object",
                    "properties": {
                        "call_id": {"type": "string"},
                        "tool": {"type": "string"},
                        "kind": {"type": "string", "enum": ["approval", "client"]},
                        "input": {}
                    },
                    "required": ["call_id", "tool", "kind"]
                }
            }
        },
        "required": ["session_id", "run_id", "text", "status"]
    })
}

fn tools() -> Vec<Tool> {
    vec![
        tool(
            "tah_run",
            "Runs a turn of a tah agent and answers its final text. Without session_id it starts \
             a new session (of `agent`, or the default agent); with it, the turn continues that \
             session. When the run waits for an approval or a client tool's output, the answer \
             lists the pending calls: answer them with tah_answer.",
            json!({
                "type": "object",
                "properties": {
                    "input": {"type": "string", "minLength": 1, "maxLength": MAX_INPUT_CHARS, "description": "The user's message."},
                    "agent": {"type": "string", "description": "The agent of a new session (an agent id); not with session_id."},
                    "session_id": session_id_schema()
                },
                "required": ["input"],
                "additionalProperties": false
            }),
            Some(run_output_schema()),
        ),
        tool(
            "tah_answer",
            "Answers a call the session's run waits for: an approval (`decision`) or a client \
             tool's output (`output`); then waits for the run and answers as tah_run does.",
            json!({
                "type": "object",
                "properties": {
                    "session_id": session_id_schema(),
                    "call_id": {"type": "string", "minLength": 1},
                    "decision": {"type": "string", "enum": ["allow", "deny"], "description": "For an approval."},
                    "reason": {"type": "string", "description": "Why, with a decision (the model sees a denial's reason)."},
                    "output": {"type": "string", "description": "A client tool's output."},
                    "is_error": {"type": "boolean", "description": "The client tool's output is an error."}
                },
                "required": ["session_id", "call_id"],
                "additionalProperties": false
            }),
            Some(run_output_schema()),
        ),
        tool(
            "tah_sessions",
            "Lists the caller's tah sessions, newest first.",
            json!({
                "type": "object",
                "properties": {
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT}
                },
                "additionalProperties": false
            }),
            None,
        )
        .with_annotations(ToolAnnotations::new().read_only(true)),
        tool(
            "tah_session",
            "A tah session: its state, last run and last messages.",
            json!({
                "type": "object",
                "properties": {"session_id": session_id_schema()},
                "required": ["session_id"],
                "additionalProperties": false
            }),
            None,
        )
        .with_annotations(ToolAnnotations::new().read_only(true)),
    ]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunArgs {
    input: String,
    agent: Option<String>,
    session_id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerArgs {
    session_id: String,
    call_id: String,
    decision: Option<Decision>,
    reason: Option<String>,
    output: Option<String>,
    #[serde(default)]
    is_error: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionsArgs {
    limit: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionArgs {
    session_id: String,
}

fn args<T: DeserializeOwned>(arguments: Option<Map<String, Value>>) -> Result<T, ToolError> {
    let value = Value::Object(arguments.unwrap_or_default());
    serde_json::from_value(value).map_err(|e| ToolError(format!("invalid arguments: {e}")))
}

fn session_id(raw: &str) -> Result<Uuid, ToolError> {
    Uuid::parse_str(raw).map_err(|_| ToolError("session_id must be a session id (a UUID)".into()))
}

/// The principal of the request: rmcp keeps the HTTP request's parts in the context, where
/// tah's authentication left it.
fn principal(context: &RequestContext<RoleServer>) -> Principal {
    context
        .extensions
        .get::<axum::http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Principal>())
        .cloned()
        .unwrap_or(Principal::Operator)
}

impl ServerHandler for TahMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new("tah", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "tah runs long-lived agent sessions. tah_run starts or continues one and answers \
                 its final text; tah_answer answers what a run waits for.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let caller = principal(&context);
        let arguments = request.arguments;
        let result = match request.name.as_ref() {
            "tah_run" => match args(arguments) {
                Ok(args) => return self.respond(self.run(&caller, args, &context).await),
                Err(error) => Err(error),
            },
            "tah_answer" => match args(arguments) {
                Ok(args) => return self.respond(self.answer(&caller, args, &context).await),
                Err(error) => Err(error),
            },
            "tah_sessions" => match args(arguments) {
                Ok(args) => self.sessions(&caller, args).await,
                Err(error) => Err(error),
            },
            "tah_session" => match args(arguments) {
                Ok(args) => self.session(&caller, args).await,
                Err(error) => Err(error),
            },
            other => {
                return Err(ErrorData::invalid_params(
                    format!(
                        "no tool named {other:?} (tah_run, tah_answer, tah_sessions, tah_session)"
                    ),
                    None,
                ))
            }
        };
        Ok(result
            .unwrap_or_else(|ToolError(text)| CallToolResult::error(vec![ContentBlock::text(text)]))
            .into())
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        let (id, run) = self
            .task_run(&principal(&context), &request.task_id, SessionNeed::Read)
            .await?;
        let events = self
            .state
            .sessions
            .run_events(id, &run)
            .await
            .map_err(task_error)?;
        let mut watch = RunWatch::default();
        for event in &events {
            watch.push(event);
        }
        let payload = match watch.outcome() {
            Outcome::Running => TaskPayload::Working,
            Outcome::Cancelled => TaskPayload::Cancelled,
            Outcome::Waiting => TaskPayload::InputRequired {
                input_requests: input_requests(&watch)?,
            },
            Outcome::Finished { .. } | Outcome::Failed { .. } => {
                let result = serde_json::to_value(run_result(id, &run, &watch))
                    .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
                let Value::Object(result) = result else {
                    return Err(ErrorData::internal_error(
                        "a tool result is an object",
                        None,
                    ));
                };
                TaskPayload::Completed { result }
            }
        };
        let mut task = task_of(id, &run, payload.status());
        if let Some(last) = events.last() {
            task.last_updated_at = last.created_at.to_rfc3339();
        }
        task.status_message = Some(watch.summary());
        Ok(GetTaskResult::new(DetailedTask::new(task, payload)))
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let caller = principal(&context);
        let (id, _) = self
            .task_run(&caller, &request.task_id, SessionNeed::Interact)
            .await?;
        let sessions = &self.state.sessions;
        let approvals = sessions.pending_approvals(id).await.map_err(task_error)?;
        for (call_id, response) in request.input_responses {
            let accepted = response["action"] == "accept";
            let content = &response["content"];
            let outcome = if approvals.iter().any(|a| a.call_id == call_id) {
                let decision = match (accepted, content["decision"].as_str()) {
                    (true, Some("allow")) => Decision::Allow,
                    (true, Some("deny")) | (false, _) => Decision::Deny,
                    _ => {
                        return Err(ErrorData::invalid_params(
                            format!("the answer to {call_id:?} needs content.decision \"allow\" or \"deny\""),
                            None,
                        ))
                    }
                };
                let answer = ApprovalAnswer {
                    decision,
                    reason: content["reason"].as_str().map(str::to_string),
                    input: None,
                    answered_by: Some(caller.id().to_string()),
                };
                sessions.approve(id, call_id.clone(), answer).await
            } else {
                let (output, is_error) = match (accepted, content["output"].as_str()) {
                    (true, Some(output)) => (output.to_string(), content["is_error"] == true),
                    (false, _) => ("the client declined to run the tool".to_string(), true),
                    (true, None) => {
                        return Err(ErrorData::invalid_params(
                            format!("the answer to {call_id:?} needs content.output (a string)"),
                            None,
                        ))
                    }
                };
                let result = ClientResult {
                    call_id: call_id.clone(),
                    output,
                    is_error,
                };
                sessions.client_result(id, result).await
            };
            outcome.map_err(|error| match Problem::from(error) {
                p if p.status == 404 => ErrorData::invalid_params(
                    format!("no call {call_id:?} of the task waits for an answer"),
                    None,
                ),
                p => ErrorData::invalid_params(p.detail, None),
            })?;
        }
        Ok(())
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let (id, run) = self
            .task_run(
                &principal(&context),
                &request.task_id,
                SessionNeed::Interact,
            )
            .await?;
        let sessions = &self.state.sessions;
        let active = sessions.active_run(id).await.map_err(task_error)?;
        if active.is_some_and(|active| active.id == run.id) {
            sessions.cancel(id).await.map_err(task_error)?;
        }
        Ok(())
    }
}

/// A client that declared the tasks extension (SEP-2663) gets runs as tasks.
fn wants_task(context: &RequestContext<RoleServer>) -> bool {
    context
        .client_capabilities()
        .is_some_and(|capabilities| capabilities.supports_tasks())
}

/// A run as a task: its id is `<session id>.<run id>`, tah's own ids.
fn task_of(id: Uuid, run: &RunRecord, status: TaskStatus) -> Task {
    let created = run.created_at.to_rfc3339();
    let mut task = Task::new(format!("{id}.{}", run.id), status, created.clone(), created)
        .with_poll_interval_ms(TASK_POLL_MS);
    task.ttl_ms = None;
    task
}

fn task_error(error: crate::session::SessionError) -> ErrorData {
    match Problem::from(error) {
        p if p.status == 404 => ErrorData::resource_not_found("task not found", None),
        p => ErrorData::internal_error(p.detail, None),
    }
}

/// The calls a parked run waits for, as the elicitations a task's client answers with
/// `tasks/update` (keyed by call id): `{decision: "allow"|"deny", reason?}` for an approval,
/// `{output, is_error?}` for a client tool.
fn input_requests(watch: &RunWatch) -> Result<InputRequests, ErrorData> {
    let mut requests = InputRequests::new();
    for call in watch.pending() {
        let (message, schema) = match call.kind {
            "client" => (
                format!("{} (call {}) waits for its output", call.tool, call.call_id),
                json!({"type": "object", "properties": {
                    "output": {"type": "string"}, "is_error": {"type": "boolean"}},
                    "required": ["output"]}),
            ),
            _ => (
                format!(
                    "{} (call {}) waits for approval: {}",
                    call.tool, call.call_id, call.input
                ),
                json!({"type": "object", "properties": {
                    "decision": {"type": "string", "enum": ["allow", "deny"]},
                    "reason": {"type": "string"}},
                    "required": ["decision"]}),
            ),
        };
        let request = json!({"method": "elicitation/create", "params": {
            "mode": "form", "message": message, "requestedSchema": schema}});
        let request: InputRequest = serde_json::from_value(request)
            .map_err(|e| ErrorData::internal_error(format!("an input request: {e}"), None))?;
        requests.insert(call.call_id, request);
    }
    Ok(requests)
}

/// The tool result of a run as `watch` saw it (`run` when it saw no event of it).
fn run_result(id: Uuid, run: &RunRecord, watch: &RunWatch) -> CallToolResult {
    let mut structured = watch.structured(id);
    if structured["run_id"].is_null() {
        structured["run_id"] = json!(run.id);
    }
    let mut result = CallToolResult::structured(structured);
    result.content = vec![ContentBlock::text(watch.summary())];
    result.is_error = Some(watch.is_error());
    result
}

/// What `tah_run` and `tah_answer` answer: the run's result, or (for a client that declared
/// the tasks extension) the run as a task.
enum Answer {
    Result(CallToolResult),
    Task(Box<CreateTaskResult>),
}

impl TahMcp {
    fn respond(&self, answer: Result<Answer, ToolError>) -> Result<CallToolResponse, ErrorData> {
        Ok(match answer {
            Ok(Answer::Result(result)) => result.into(),
            Ok(Answer::Task(task)) => CallToolResponse::Task(*task),
            Err(ToolError(text)) => CallToolResult::error(vec![ContentBlock::text(text)]).into(),
        })
    }

    async fn run(
        &self,
        caller: &Principal,
        args: RunArgs,
        context: &RequestContext<RoleServer>,
    ) -> Result<Answer, ToolError> {
        if args.input.trim().is_empty() {
            return Err(ToolError("input must not be empty".into()));
        }
        if args.input.chars().count() > MAX_INPUT_CHARS {
            return Err(ToolError(format!(
                "input is longer than {MAX_INPUT_CHARS} characters"
            )));
        }
        let sessions = &self.state.sessions;
        let id = match (&args.session_id, &args.agent) {
            (Some(_), Some(_)) => {
                return Err(ToolError(
                    "give agent (a new session) or session_id (an existing one), not both".into(),
                ))
            }
            (Some(raw), None) => {
                let id = session_id(raw)?;
                check_session_access(sessions, caller, id, SessionNeed::Interact).await?;
                id
            }
            (None, agent) => self.new_session(caller, agent.as_deref()).await?,
        };
        let request = RunRequest::run(args.input, Pending::Refuse);
        if wants_task(context) {
            let started = sessions.start(id, request, Follow::Record).await?;
            let run = started.into_run()?.run;
            return Ok(Answer::Task(Box::new(CreateTaskResult::new(task_of(
                id,
                &run,
                TaskStatus::Working,
            )))));
        }
        let started = sessions.start(id, request, Follow::Events).await?;
        let (run, events) = started.into_events()?;
        Ok(Answer::Result(
            self.follow(id, &run, events, context).await?,
        ))
    }

    async fn new_session(
        &self,
        caller: &Principal,
        agent: Option<&str>,
    ) -> Result<Uuid, ToolError> {
        caller
            .may_create_sessions()
            .map_err(|d| ToolError::from(denied(d, "session")))?;
        let choice: Option<AgentChoice> = match agent {
            None => None,
            Some(agent) => {
                Some(serde_json::from_value(json!(agent)).map_err(|e| ToolError(e.to_string()))?)
            }
        };
        let owner = Some(caller.id().to_string());
        let record = self
            .state
            .sessions
            .create_on_agent(choice.as_ref(), caller.tenant(), owner, None)
            .await
            .map_err(|error| match Problem::from(error) {
                p if p.status == 404 => ToolError("agent not found".into()),
                p => ToolError(p.detail),
            })?;
        Ok(record.id)
    }

    async fn answer(
        &self,
        caller: &Principal,
        args: AnswerArgs,
        context: &RequestContext<RoleServer>,
    ) -> Result<Answer, ToolError> {
        let id = session_id(&args.session_id)?;
        let sessions = &self.state.sessions;
        check_session_access(sessions, caller, id, SessionNeed::Interact).await?;
        let live = sessions.subscribe(id)?;
        let Some(run) = sessions.active_run(id).await? else {
            return Err(ToolError("the session's run waits for nothing".into()));
        };
        let call_id = args.call_id.clone();
        let outcome =
            match (args.decision, args.output) {
                (Some(_), Some(_)) | (None, None) => return Err(ToolError(
                    "give decision (an approval) or output (a client tool's result), one of them"
                        .into(),
                )),
                (Some(decision), None) => {
                    let answer = ApprovalAnswer {
                        decision,
                        reason: args.reason,
                        input: None,
                        answered_by: Some(caller.id().to_string()),
                    };
                    sessions.approve(id, args.call_id, answer).await
                }
                (None, Some(output)) => {
                    let result = ClientResult {
                        call_id: args.call_id,
                        output,
                        is_error: args.is_error,
                    };
                    sessions.client_result(id, result).await
                }
            };
        outcome.map_err(|error| match Problem::from(error) {
            p if p.status == 404 => ToolError(format!(
                "no call {call_id:?} of the run waits for an answer"
            )),
            p => ToolError(p.detail),
        })?;
        if wants_task(context) {
            return Ok(Answer::Task(Box::new(CreateTaskResult::new(task_of(
                id,
                &run,
                TaskStatus::Working,
            )))));
        }
        let events = sessions.run_stream(id, &run, live);
        Ok(Answer::Result(
            self.follow(id, &run, events, context).await?,
        ))
    }

    /// Follows the run until it ends or waits for answers only, reporting progress.
    async fn follow(
        &self,
        id: Uuid,
        run: &RunRecord,
        mut events: EventStream,
        context: &RequestContext<RoleServer>,
    ) -> ToolResult {
        let token = context.meta.get_progress_token();
        let mut watch = RunWatch::default();
        let mut reported = 0u32;
        loop {
            let next = tokio::select! {
                next = events.next() => next,
                // The client went away: the run goes on, as any tah run does.
                _ = context.ct.cancelled() => break,
            };
            let Some(event) = next else { break };
            let event = event.map_err(crate::session::SessionError::from)?;
            let pushed = watch.push(&event);
            if let (Some(token), Some(message)) = (&token, pushed.progress) {
                reported += 1;
                let progress = ProgressNotificationParam::new(token.clone(), reported.into())
                    .with_message(message);
                // A client that stopped listening still gets the result.
                let _ = context.peer.notify_progress(progress).await;
            }
            if pushed.ended {
                break;
            }
            if pushed.parked
                && self
                    .still_parked(id, event.seq, watch.calls().clone())
                    .await?
            {
                break;
            }
        }
        Ok(run_result(id, run, &watch))
    }

    /// Whether the run still waits after `seq`: nothing committed since moved it on (a
    /// replay of a run that waited and went on does not stop there).
    async fn still_parked(
        &self,
        id: Uuid,
        seq: i64,
        mut probe: RunCalls,
    ) -> Result<bool, ToolError> {
        let later = self.state.sessions.events_page(id, seq, PAGE).await?;
        for event in &later {
            probe.apply(event);
        }
        Ok(probe.is_parked())
    }

    /// The session and run a task id names, when `caller` may do what `need` says to it.
    async fn task_run(
        &self,
        caller: &Principal,
        task_id: &str,
        need: SessionNeed,
    ) -> Result<(Uuid, RunRecord), ErrorData> {
        let not_found = || ErrorData::resource_not_found("task not found", None);
        let (session, run) = task_id.split_once('.').ok_or_else(not_found)?;
        let (Ok(id), Ok(run_id)) = (Uuid::parse_str(session), Uuid::parse_str(run)) else {
            return Err(not_found());
        };
        let sessions = &self.state.sessions;
        check_session_access(sessions, caller, id, need)
            .await
            .map_err(|p| match p.status {
                404 => not_found(),
                _ => ErrorData::invalid_request(p.detail, None),
            })?;
        let run = sessions
            .run_record(id, run_id)
            .await
            .map_err(task_error)?
            .ok_or_else(not_found)?;
        Ok((id, run))
    }

    async fn sessions(&self, caller: &Principal, args: SessionsArgs) -> ToolResult {
        caller
            .may_read_tenant()
            .map_err(|d| ToolError::from(denied(d, "session")))?;
        let limit = args.limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(ToolError(format!(
                "limit must be between 1 and {MAX_LIMIT}"
            )));
        }
        let records = self
            .state
            .sessions
            .list(&SessionQuery {
                limit,
                before: None,
                state: None,
                parent_id: None,
                tenant: caller.tenant().map(str::to_owned),
                owner: caller.listed_owner().map(str::to_owned),
            })
            .await?;
        let listed: Vec<Value> = records
            .iter()
            .map(|s| {
                json!({
                    "session_id": s.id,
                    "title": s.title,
                    "state": s.state,
                    "agent": s.options.agent,
                    "message_count": s.message_count,
                    "last_run_id": s.last_run_id,
                    "updated_at": s.updated_at,
                })
            })
            .collect();
        let text = match listed.len() {
            0 => "no sessions".to_string(),
            n => {
                records
                    .iter()
                    .map(|s| {
                        format!(
                            "{} {} ({} messages)",
                            s.id,
                            s.state.as_str(),
                            s.message_count
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
                    + if n as i64 == limit { "\n…" } else { "" }
            }
        };
        let mut result = CallToolResult::structured(json!({ "sessions": listed }));
        result.content = vec![ContentBlock::text(text)];
        Ok(result)
    }

    async fn session(&self, caller: &Principal, args: SessionArgs) -> ToolResult {
        let id = session_id(&args.session_id)?;
        let sessions = &self.state.sessions;
        check_session_access(sessions, caller, id, SessionNeed::Read).await?;
        let record = sessions.get(id).await?;
        let last_run = match record.last_run_id {
            Some(run_id) => sessions.run_record(id, run_id).await?,
            None => None,
        };
        let after = (record.message_count - LAST_MESSAGES - 1).max(-1);
        let mut messages = sessions.messages_page(id, after, LAST_MESSAGES + 1).await?;
        let skip = messages.len().saturating_sub(LAST_MESSAGES as usize);
        messages.drain(..skip);
        let pending = sessions.pending_approvals(id).await?;
        let clients = sessions.pending_client_calls(id).await?;
        let shown: Vec<Value> = messages
            .iter()
            .map(|m| {
                json!({
                    "index": m.index,
                    "role": m.role,
                    "content": m.content,
                    "tool_calls": m.tool_calls.iter().map(|c| json!({"id": c.id, "name": c.name})).collect::<Vec<_>>(),
                    "tool_call_id": m.tool_call_id,
                })
            })
            .collect();
        let text = std::iter::once(format!(
            "session {} is {} ({} messages)",
            record.id,
            record.state.as_str(),
            record.message_count
        ))
        .chain(messages.iter().map(|m| {
            let role = serde_json::to_value(m.role).unwrap_or_default();
            format!("{}: {}", role.as_str().unwrap_or("?"), m.content)
        }))
        .collect::<Vec<_>>()
        .join("\n");
        let mut result = CallToolResult::structured(json!({
            "session_id": record.id,
            "title": record.title,
            "state": record.state,
            "agent": record.options.agent,
            "message_count": record.message_count,
            "last_run": last_run,
            "pending_approvals": pending,
            "pending_client_calls": clients,
            "messages": shown,
        }));
        result.content = vec![ContentBlock::text(text)];
        Ok(result)
    }
}
