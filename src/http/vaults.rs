//! `/v1/vaults/{vault}/secrets`: a tenant's secrets, write-only. An admin (of its tenant; an
//! operator acts on `default`) writes, lists and deletes them; no route ever answers a value.
//! Without a master key every route answers `409 vaults-disabled`. The caller's right is
//! checked before the body is read.

use axum::extract::{FromRequest, Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::access::{denied, Caller};
use super::problem::{ApiJson, Problem};
use super::AppState;
use crate::model::Principal;
use crate::vault::{VaultError, Vaults};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/vaults/{vault}/secrets", get(list))
        .route(
            "/v1/vaults/{vault}/secrets/{name}",
            put(write).delete(delete),
        )
}

impl From<VaultError> for Problem {
    fn from(error: VaultError) -> Problem {
        match error {
            VaultError::Disabled => {
                Problem::new(StatusCode::CONFLICT, "vaults-disabled", error.to_string())
            }
            VaultError::BadName(..) | VaultError::TooLarge | VaultError::Malformed(_) => {
                Problem::bad_request(error.to_string())
            }
            VaultError::Missing(_) => Problem::not_found(error.to_string()),
            VaultError::Unreadable(_) => {
                tracing::error!(%error, "vault secret");
                Problem::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    error.to_string(),
                )
            }
            VaultError::Store(error) => Problem::from(error),
        }
    }
}

/// The vaults, once the caller is known to administer its tenant.
fn admitted<'a>(state: &'a AppState, caller: &Principal) -> Result<&'a Vaults, Problem> {
    caller.may_administer().map_err(|d| denied(d, "vault"))?;
    let vaults = &state.sessions.deps().vaults;
    if !vaults.enabled() {
        return Err(VaultError::Disabled.into());
    }
    Ok(vaults)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretBody {
    value: String,
}

async fn write(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path((vault, name)): Path<(String, String)>,
    request: Request,
) -> Result<Json<Value>, Problem> {
    let vaults = admitted(&state, &caller)?;
    let secret = Vaults::secret_ref(&vault, &name)?;
    let ApiJson(body) = ApiJson::<Value>::from_request(request, &state).await?;
    // Serde's message names the field and what it expected, never the value.
    let body: SecretBody =
        serde_json::from_value(body).map_err(|e| Problem::bad_request(format!("secret: {e}")))?;
    let info = vaults
        .put(caller.home_tenant(), &secret, &body.value)
        .await?;
    Ok(Json(json!(info)))
}

async fn list(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(vault): Path<String>,
) -> Result<Json<Value>, Problem> {
    let vaults = admitted(&state, &caller)?;
    let data = vaults.list(caller.home_tenant(), &vault).await?;
    Ok(Json(json!({ "data": data })))
}

async fn delete(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path((vault, name)): Path<(String, String)>,
) -> Result<Response, Problem> {
    let vaults = admitted(&state, &caller)?;
    let secret = Vaults::secret_ref(&vault, &name)?;
    if vaults.delete(caller.home_tenant(), &secret).await? {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(Problem::not_found(format!("secret {secret} not found")))
    }
}
