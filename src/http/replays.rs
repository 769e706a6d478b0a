//! `/v1/sessions/{id}/replay` (a new session that replays this one's turns) and
//! `/v1/sessions/{id}/replay-report` (a replay compared with its source, turn by turn).

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;

use super::access::{denied, Caller};
use super::extract::Ids;
use super::problem::{OptionalJson, Problem};
use super::AppState;
use crate::model::{AgentChoice, SessionId};
use crate::session::replay::{ReplayMode, ReplayReport, ReplayRequest};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/sessions/{id}/replay", post(replay))
        .route("/v1/sessions/{id}/replay-report", get(report))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    /// The agent the replay runs: an id, `id@version`, or `{"id", "version"}` (default: the
    /// source's).
    agent: Option<Value>,
    /// `recorded` or `live`.
    mode: Option<Value>,
    /// How many of the source's turns, from the first (default: all).
    turns: Option<Value>,
    /// Another directory under the server's workspace (default: the source's).
    workspace: Option<String>,
}

const MODES: &str = "mode must be \"recorded\" or \"live\"";

/// The agent a body names, as a session's `agent` would name it; `id@N` pins version N.
fn agent_of(value: Value) -> Result<Option<AgentChoice>, Problem> {
    let value = match value {
        Value::Null => return Ok(None),
        Value::String(text) => match text.split_once('@') {
            Some((id, version)) => {
                let version: u64 = version.parse().map_err(|_| {
                    Problem::bad_request(format!(
                        "agent: {version:?} after @ is not a version number"
                    ))
                })?;
                serde_json::json!({ "id": id, "version": version })
            }
            None => Value::String(text),
        },
        other => other,
    };
    serde_json::from_value(value)
        .map(Some)
        .map_err(|e| Problem::bad_request(format!("agent: {e}").replace("agent: agent", "agent")))
}

fn turns_of(value: Option<Value>) -> Result<Option<u64>, Problem> {
    const BAD: &str = "turns must be a positive integer";
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(0) => Err(Problem::bad_request(
                "turns must be at least 1 (leave it out for every turn)",
            )),
            Some(n) => Ok(Some(n)),
            None => Err(Problem::bad_request(BAD)),
        },
        Some(_) => Err(Problem::bad_request(BAD)),
    }
}

async fn replay(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Ids(SessionId(id)): Ids<SessionId>,
    OptionalJson(body): OptionalJson<ReplayBody>,
) -> Result<Response, Problem> {
    caller
        .may_create_sessions()
        .map_err(|d| denied(d, "session"))?;
    let mode = match body.mode {
        Some(Value::String(mode)) if mode == "recorded" => ReplayMode::Recorded,
        Some(Value::String(mode)) if mode == "live" => ReplayMode::Live,
        None | Some(Value::Null) => {
            return Err(Problem::bad_request(format!("{MODES} (it is required)")))
        }
        Some(_) => return Err(Problem::bad_request(MODES)),
    };
    let request = ReplayRequest {
        agent: agent_of(body.agent.unwrap_or(Value::Null))?,
        mode,
        turns: turns_of(body.turns)?,
        workspace: body.workspace,
        owner: caller.id().to_string(),
    };
    let (record, replay_of) = state.sessions.replay(id, request).await?;
    let mut view = serde_json::to_value(&record).unwrap_or(Value::Null);
    if let Value::Object(fields) = &mut view {
        fields.insert(
            "replay_of".to_string(),
            serde_json::to_value(replay_of).unwrap_or(Value::Null),
        );
    }
    let location = format!("/v1/sessions/{}", record.id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(view),
    )
        .into_response())
}

async fn report(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
) -> Result<Json<ReplayReport>, Problem> {
    state.sessions.get(id).await?;
    state
        .sessions
        .replay_report(id)
        .await?
        .map(Json)
        .ok_or_else(|| Problem::not_found("this session is not a replay"))
}
