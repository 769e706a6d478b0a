//! `/v1/keys` (admins of their tenant, operators of every tenant) and a session's tokens
//! (`POST /v1/sessions/{id}/tokens`, for browsers): SPEC §17.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use axum::{Json, Router};
use serde::Deserialize;

use super::access::{denied, forbidden, Caller};
use super::extract::Ids;
use super::paging::{one_more, page_limit, Page};
use super::problem::{ApiJson, ApiQuery, Problem};
use super::AppState;
use crate::model::{PathId, SessionId, TenantRole, TokenScope};
use crate::principals::{
    key_tenant, KeyView, PrincipalError, Principals, DEFAULT_TOKEN_TTL_S, MAX_TOKEN_TTL_S,
};

pub fn routes(principals: Principals) -> Router<AppState> {
    Router::new()
        .route("/v1/keys", post(create).get(list))
        .route("/v1/keys/{key_id}", delete(revoke))
        .route("/v1/sessions/{id}/tokens", post(session_token))
        .layer(axum::Extension(principals))
}

type Keys = axum::Extension<Principals>;

impl From<PrincipalError> for Problem {
    fn from(error: PrincipalError) -> Problem {
        match error {
            PrincipalError::BadInput(detail) => Problem::bad_request(detail),
            PrincipalError::Forbidden(detail) => forbidden(detail),
            PrincipalError::NotFound => Problem::not_found("key not found"),
            PrincipalError::Store(error) => Problem::from(error),
            error @ PrincipalError::Unavailable => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                error.to_string(),
            ),
            error @ (PrincipalError::Unknown(_) | PrincipalError::Expired) => {
                Problem::new(StatusCode::UNAUTHORIZED, "unauthorized", error.to_string())
            }
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateKey {
    tenant: Option<String>,
    role: String,
    name: Option<String>,
}

async fn create(
    Caller(caller): Caller,
    axum::Extension(principals): Keys,
    ApiJson(body): ApiJson<CreateKey>,
) -> Result<Response, Problem> {
    caller.may_administer().map_err(|d| denied(d, "key"))?;
    let role: TenantRole = body.role.parse().map_err(Problem::bad_request)?;
    let tenant = key_tenant(&caller, body.tenant.as_deref())?;
    let key = principals.create_key(&tenant, role, body.name).await?;
    let location = format!("/v1/keys/{}", key.view.id);
    Ok((
        StatusCode::CREATED,
        [
            (header::LOCATION, location),
            (header::CACHE_CONTROL, "no-store".to_string()),
        ],
        Json(key),
    )
        .into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    limit: Option<i64>,
    cursor: Option<String>,
}

async fn list(
    Caller(caller): Caller,
    axum::Extension(principals): Keys,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Page<KeyView>>, Problem> {
    caller.may_administer().map_err(|d| denied(d, "key"))?;
    let limit = page_limit(q.limit)?;
    let before = match q.cursor.as_deref() {
        None | Some("") => None,
        Some(cursor) => Some(
            KeyId::parse(cursor)
                .ok_or_else(|| Problem::bad_request("cursor is not valid"))?
                .0,
        ),
    };
    let data = principals
        .keys(caller.tenant(), before.as_deref(), one_more(limit))
        .await?;
    Ok(Json(Page::new(data, limit, |k| k.id.clone())))
}

/// A key's id in a path: a UUID.
#[derive(Debug, Clone)]
struct KeyId(String);

impl PathId for KeyId {
    const WHAT: &'static str = "key";
    fn parse(raw: &str) -> Option<KeyId> {
        uuid::Uuid::parse_str(raw)
            .ok()
            .map(|id| KeyId(id.to_string()))
    }
}

async fn revoke(
    Caller(caller): Caller,
    axum::Extension(principals): Keys,
    Ids(KeyId(id)): Ids<KeyId>,
) -> Result<StatusCode, Problem> {
    caller.may_administer().map_err(|d| denied(d, "key"))?;
    principals.revoke_key(&id, caller.tenant()).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenBody {
    scope: String,
    ttl_s: Option<serde_json::Value>,
}

/// `POST /v1/sessions/{id}/tokens`: the route guard has checked that the caller owns the
/// session (or administers its tenant).
async fn session_token(
    State(state): State<AppState>,
    Caller(caller): Caller,
    axum::Extension(principals): Keys,
    Ids(SessionId(id)): Ids<SessionId>,
    ApiJson(body): ApiJson<TokenBody>,
) -> Result<Response, Problem> {
    let ttl_s = match &body.ttl_s {
        None | Some(serde_json::Value::Null) => DEFAULT_TOKEN_TTL_S,
        Some(ttl) => ttl.as_u64().ok_or_else(|| {
            Problem::bad_request(format!("ttl_s must be 1 to {MAX_TOKEN_TTL_S} seconds"))
        })?,
    };
    let scope = TokenScope::parse(&body.scope)
        .ok_or_else(|| Problem::bad_request("scope must be \"read\" or \"interact\""))?;
    let session = state.sessions.get(id).await?;
    let token = principals
        .create_session_token(SessionId(id), &session.tenant, caller.id(), scope, ttl_s)
        .await?;
    Ok((
        StatusCode::CREATED,
        [(header::CACHE_CONTROL, "no-store")],
        Json(token),
    )
        .into_response())
}
