//! `/v1/environments`: where sessions' built-in tools run, and the routes of the workers that
//! run a `workers` environment's calls. Admins create and delete environments; members and
//! viewers read them; a worker authenticates as a member or an admin of the environment's
//! tenant (another tenant's environment is a `404`).
//!
//! A worker dials out and long-polls: `POST …/claims?wait_s=N` answers a claimed call as soon
//! as one is queued (polling the store, so any replica serves any worker), or `204` after
//! `wait_s` seconds with none; the worker sends heartbeats under the claim while the call runs
//! and then its result. A plain request per call rather than one held stream keeps every
//! request short-lived and stateless for proxies and load balancers, and a replica that goes
//! away loses nothing but one poll.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::access::{denied, Caller};
use super::paging::{one_more, page_limit, Page};
use super::problem::{ApiJson, ApiQuery, Problem};
use super::AppState;
use crate::model::{Environment, EnvironmentKind, Principal, LOCAL_ENVIRONMENT};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/environments", post(create).get(list))
        .route("/v1/environments/{env}", get(show).delete(delete))
        .route("/v1/environments/{env}/claims", post(claim))
        .route(
            "/v1/environments/{env}/claims/{claim_id}/heartbeat",
            post(heartbeat),
        )
        .route(
            "/v1/environments/{env}/claims/{claim_id}/result",
            post(result),
        )
}

/// The longest a claim request waits for a call.
const MAX_WAIT_S: u64 = 60;
/// How long a claim request waits when it does not say.
const DEFAULT_WAIT_S: u64 = 20;
/// How often a waiting claim request looks for a call.
const POLL: Duration = Duration::from_millis(200);
/// The longest result accepted, in characters.
const MAX_OUTPUT_CHARS: usize = 200_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    name: String,
    #[serde(rename = "type")]
    kind: String,
}

async fn create(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiJson(body): ApiJson<CreateBody>,
) -> Result<Response, Problem> {
    caller
        .may_administer()
        .map_err(|d| denied(d, "environment"))?;
    let kind = EnvironmentKind::parse(&body.kind)
        .ok_or_else(|| Problem::bad_request("type must be local or workers"))?;
    let environment = state
        .sessions
        .create_environment(caller.home_tenant(), &body.name, kind)
        .await?;
    Ok((StatusCode::CREATED, Json(environment)).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    limit: Option<i64>,
    cursor: Option<String>,
}

async fn list(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Page<Environment>>, Problem> {
    caller
        .may_read_tenant()
        .map_err(|d| denied(d, "environment"))?;
    let limit = page_limit(q.limit)?;
    let after = match q.cursor.as_deref() {
        None | Some("") => None,
        Some(cursor) if cursor == LOCAL_ENVIRONMENT || is_environment_id(cursor) => Some(cursor),
        Some(_) => {
            return Err(Problem::bad_request(
                "cursor must be the next_cursor of an earlier page",
            ))
        }
    };
    let data = state
        .sessions
        .environments(caller.home_tenant(), after, one_more(limit))
        .await?;
    Ok(Json(Page::new(data, limit, |e| e.id.clone())))
}

fn is_environment_id(text: &str) -> bool {
    text.strip_prefix("env_")
        .is_some_and(|hex| hex.len() == 32 && hex.chars().all(|c| c.is_ascii_hexdigit()))
}

async fn show(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(env): Path<String>,
) -> Result<Json<Environment>, Problem> {
    caller
        .may_read_tenant()
        .map_err(|d| denied(d, "environment"))?;
    Ok(Json(
        state
            .sessions
            .environment(caller.home_tenant(), &env)
            .await?,
    ))
}

async fn delete(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(env): Path<String>,
) -> Result<Response, Problem> {
    caller
        .may_administer()
        .map_err(|d| denied(d, "environment"))?;
    state
        .sessions
        .delete_environment(caller.home_tenant(), &env)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The `workers` environment a worker serves, once the caller may run its calls.
async fn served(state: &AppState, caller: &Principal, env: &str) -> Result<Environment, Problem> {
    caller
        .may_create_sessions()
        .map_err(|d| denied(d, "environment"))?;
    let environment = state
        .sessions
        .environment(caller.home_tenant(), env)
        .await?;
    if environment.kind != EnvironmentKind::Workers {
        return Err(Problem::new(
            StatusCode::CONFLICT,
            "not-a-workers-environment",
            format!(
                "environment {:?} is of type {}: its calls run on the server, not on workers",
                environment.name,
                environment.kind.as_str()
            ),
        ));
    }
    Ok(environment)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaimQuery {
    wait_s: Option<u64>,
}

async fn claim(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(env): Path<String>,
    ApiQuery(q): ApiQuery<ClaimQuery>,
) -> Result<Response, Problem> {
    let environment = served(&state, &caller, &env).await?;
    let wait = q.wait_s.unwrap_or(DEFAULT_WAIT_S);
    if wait > MAX_WAIT_S {
        return Err(Problem::bad_request(format!(
            "wait_s must be at most {MAX_WAIT_S}"
        )));
    }
    let until = tokio::time::Instant::now() + Duration::from_secs(wait);
    let shutdown = state.sessions.deps().shutdown.clone();
    loop {
        if let Some(claim) = state
            .sessions
            .claim_worker_call(&environment.tenant, &environment.name)
            .await?
        {
            return Ok(Json(claim).into_response());
        }
        if tokio::time::Instant::now() >= until {
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = shutdown.cancelled() => return Ok(StatusCode::NO_CONTENT.into_response()),
        }
    }
}

async fn heartbeat(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path((env, claim_id)): Path<(String, String)>,
) -> Result<Json<Value>, Problem> {
    let environment = served(&state, &caller, &env).await?;
    let lease_until = state
        .sessions
        .renew_worker_claim((&environment.tenant, &environment.name), &claim_id)
        .await?;
    Ok(Json(json!({ "lease_until": lease_until })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResultBody {
    /// The result as the model sees it.
    output: String,
    #[serde(default)]
    is_error: bool,
}

async fn result(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path((env, claim_id)): Path<(String, String)>,
    ApiJson(body): ApiJson<ResultBody>,
) -> Result<Json<Value>, Problem> {
    let environment = served(&state, &caller, &env).await?;
    if body.output.chars().count() > MAX_OUTPUT_CHARS {
        return Err(Problem::bad_request(format!(
            "output is longer than {MAX_OUTPUT_CHARS} characters"
        )));
    }
    let recorded = state
        .sessions
        .worker_result(
            (&environment.tenant, &environment.name),
            &claim_id,
            body.output,
            body.is_error,
        )
        .await?;
    Ok(Json(json!(recorded)))
}
