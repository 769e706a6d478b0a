//! `client.beta.environments`: tah has one environment, the server's local workspace
//! (`env_local`), derived and never stored. Creating one with `config: {type: "cloud"}` (or
//! none) answers the local environment under the name given, so that code written for the
//! vendor's cloud runs unchanged; `self_hosted` (remote workers) is refused. Updating,
//! archiving and deleting the local environment is refused: it is the server's.

use axum::extract::RawQuery;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Map, Value};

use super::{known_fields, opt_string, string_map, Query};
use crate::http::access::Caller;
use crate::http::problem::{ApiJson, Problem};
use crate::http::AppState;

/// The id of the local workspace environment.
pub const LOCAL: &str = "env_local";

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/anthropic/v1/environments", post(create).get(list))
        .route(
            "/anthropic/v1/environments/{env_id}",
            get(show).post(update).delete(delete),
        )
        .route("/anthropic/v1/environments/{env_id}/archive", post(archive))
}

/// The local environment, as their object.
pub fn local(name: &str, description: Option<String>, metadata: Option<Value>) -> Value {
    let epoch = "1970-01-01T00:00:00Z";
    json!({
        "type": "environment",
        "id": LOCAL,
        "name": name,
        "description": description,
        "metadata": metadata.unwrap_or(json!({})),
        "config": {
            "type": "cloud",
            "networking": {"type": "unrestricted"},
            "packages": {"type": "packages", "apt": [], "cargo": [], "gem": [], "go": [], "npm": [], "pip": []},
        },
        "scope": "organization",
        "created_at": epoch,
        "updated_at": epoch,
        "archived_at": null,
    })
}

fn default_local() -> Value {
    local(
        "local",
        Some("the tah server's workspace".to_string()),
        None,
    )
}

/// The environment a request names: only the local one exists.
pub fn check_id(id: &str) -> Result<(), Problem> {
    match id == LOCAL {
        true => Ok(()),
        false => Err(Problem::not_found(format!(
            "environment {id} not found (tah has one environment, {LOCAL}: its workspace)"
        ))),
    }
}

async fn create(
    Caller(_caller): Caller,
    RawQuery(raw): RawQuery,
    ApiJson(body): ApiJson<Map<String, Value>>,
) -> Result<Json<Value>, Problem> {
    Query::parse(raw.as_deref(), &[])?;
    known_fields(
        &body,
        &["name", "config", "description", "metadata", "scope"],
    )?;
    let name =
        opt_string(&body, "name", "name")?.ok_or_else(|| Problem::bad_request("name: required"))?;
    match body.get("config") {
        None | Some(Value::Null) => {}
        Some(config) => match config["type"].as_str() {
            Some("cloud") => {}
            Some("self_hosted") => {
                return Err(Problem::bad_request(
                    "config.type: self_hosted environments (remote workers) are not available \
                     yet; use {\"type\": \"cloud\"}, which is the server's local workspace",
                ))
            }
            _ => return Err(Problem::bad_request("config.type: must be cloud")),
        },
    }
    let description = opt_string(&body, "description", "description")?;
    let metadata = string_map(body.get("metadata"), "metadata")?;
    Ok(Json(local(&name, description, metadata)))
}

async fn list(Caller(_caller): Caller, RawQuery(raw): RawQuery) -> Result<Json<Value>, Problem> {
    let query = Query::parse(raw.as_deref(), &["limit", "page", "include_archived"])?;
    query.limit()?;
    query.flag("include_archived")?;
    let data = match query.one("page") {
        None | Some("") => vec![default_local()],
        Some(_) => Vec::new(),
    };
    Ok(Json(json!({"data": data, "next_page": null})))
}

async fn show(
    Caller(_caller): Caller,
    axum::extract::Path(env_id): axum::extract::Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Value>, Problem> {
    Query::parse(raw.as_deref(), &[])?;
    check_id(&env_id)?;
    Ok(Json(default_local()))
}

fn unchangeable(env_id: &str) -> Result<Json<Value>, Problem> {
    check_id(env_id)?;
    Err(Problem::new(
        StatusCode::FORBIDDEN,
        "environment-update-disabled",
        "the local environment is the server's workspace: it cannot be changed, archived or \
         deleted through this API",
    ))
}

async fn update(
    Caller(_caller): Caller,
    axum::extract::Path(env_id): axum::extract::Path<String>,
) -> Result<Json<Value>, Problem> {
    unchangeable(&env_id)
}

async fn delete(
    Caller(_caller): Caller,
    axum::extract::Path(env_id): axum::extract::Path<String>,
) -> Result<Json<Value>, Problem> {
    unchangeable(&env_id)
}

async fn archive(
    Caller(_caller): Caller,
    axum::extract::Path(env_id): axum::extract::Path<String>,
) -> Result<Json<Value>, Problem> {
    unchangeable(&env_id)
}
