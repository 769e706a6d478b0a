//! RFC 9457 problem details: every error the API returns, and the extractors that turn bad
//! input (malformed JSON, wrong types, bad ids, bad query strings) into clear 4xx problems.

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::session::{SessionError, StoreError};

pub const PROBLEM_JSON: &str = "application/problem+json";

/// An error response: `type` is `urn:tah:problem:<kind>`.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// Seconds after which a retry may succeed (sent as `Retry-After`).
    #[serde(skip)]
    pub retry_after: Option<u64>,
    /// The stored answer, when a call was already answered differently.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolution: Option<Box<serde_json::Value>>,
}

impl Problem {
    pub fn new(status: StatusCode, kind: &str, detail: impl Into<String>) -> Problem {
        Problem {
            kind: format!("urn:tah:problem:{kind}"),
            title: status.canonical_reason().unwrap_or("Error").to_string(),
            status: status.as_u16(),
            detail: detail.into(),
            retry_after: None,
            resolution: None,
        }
    }

    pub fn bad_request(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::BAD_REQUEST, "bad-request", detail)
    }

    pub fn not_found(detail: impl Into<String>) -> Problem {
        Problem::new(StatusCode::NOT_FOUND, "not-found", detail)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&self).unwrap_or_default();
        let mut response = (status, body).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

impl From<SessionError> for Problem {
    fn from(error: SessionError) -> Problem {
        match error {
            SessionError::NotFound => Problem::not_found("session not found"),
            SessionError::BadInput(detail) => Problem::bad_request(detail),
            SessionError::AgentNotFound(detail) | SessionError::EnvironmentNotFound(detail) => {
                Problem::not_found(detail)
            }
            error @ SessionError::AgentStale { .. } => Problem::new(
                StatusCode::PRECONDITION_FAILED,
                "agent-version-stale",
                error.to_string(),
            ),
            SessionError::Invalid(detail) => {
                Problem::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid-input", detail)
            }
            SessionError::EditedInputDenied(detail) => {
                Problem::new(StatusCode::FORBIDDEN, "edited-input-denied", detail)
            }
            SessionError::NoSuchCall(detail) => {
                Problem::new(StatusCode::NOT_FOUND, "no-such-call", detail)
            }
            SessionError::AlreadyResolved { detail, resolution } => Problem {
                resolution: Some(Box::new(resolution)),
                ..Problem::new(StatusCode::CONFLICT, "already-resolved", detail)
            },
            SessionError::Conflict(kind) => {
                Problem::new(StatusCode::CONFLICT, kind.code(), kind.detail())
            }
            SessionError::Upstream(error) => {
                Problem::new(StatusCode::BAD_GATEWAY, "model-failed", error.to_string())
            }
            SessionError::TooBusy(detail) => Problem {
                retry_after: Some(1),
                ..Problem::new(StatusCode::TOO_MANY_REQUESTS, "too-many-runs", detail)
            },
            SessionError::TenantLimit {
                detail,
                retry_after,
            } => Problem {
                retry_after: Some(retry_after),
                ..Problem::new(StatusCode::TOO_MANY_REQUESTS, "tenant-limit", detail)
            },
            SessionError::ShuttingDown => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the server is shutting down; retry on another instance or later",
            ),
            // The database refuses writes (full, read-only, gone): nothing was changed, and
            // the request may succeed once it accepts writes again.
            SessionError::Store(
                error @ (StoreError::Write(_)
                | StoreError::Poisoned(_)
                | StoreError::Unusable(_)
                | StoreError::WriterGone),
            ) => {
                tracing::error!(%error, "storage error");
                Problem {
                    retry_after: Some(5),
                    ..Problem::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "storage-unavailable",
                        format!("the database refused the request: {error}"),
                    )
                }
            }
            SessionError::Unrecorded(error) => Problem {
                retry_after: Some(2),
                ..Problem::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "storage-unavailable",
                    format!(
                        "the session's last run stopped because the database refused a write, \
                         and it cannot be recorded as failed yet ({error}); its events are served \
                         again once it is"
                    ),
                )
            },
            SessionError::Store(error) => {
                tracing::error!(%error, "storage error");
                Problem::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "storage",
                    "the database could not complete the request",
                )
            }
        }
    }
}

impl From<StoreError> for Problem {
    fn from(error: StoreError) -> Problem {
        Problem::from(SessionError::Store(error))
    }
}

/// A JSON object body whose rejections are problems (see [`OptionalJson`] for bodies that
/// may be absent).
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // Read a JSON value first: serde would accept an array for a struct, which no client
        // means.
        let value = match axum::Json::<serde_json::Value>::from_request(req, state).await {
            Ok(axum::Json(value)) => value,
            Err(rejection) => return Err(json_problem(rejection)),
        };
        if !value.is_object() {
            return Err(Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-body",
                "the request body must be a JSON object",
            ));
        }
        serde_json::from_value(value).map(ApiJson).map_err(|error| {
            Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid-body",
                format!("the request body is not valid: {error}"),
            )
        })
    }
}

/// A JSON body that may be absent (no body at all reads as `T::default()`).
pub struct OptionalJson<T>(pub T);

impl<S, T> FromRequest<S> for OptionalJson<T>
where
    T: DeserializeOwned + Default,
    S: Send + Sync,
{
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // A body of another type is refused even when empty: an HTML form's POST (text/plain,
        // multipart, urlencoded) never reaches a handler.
        let content_type = req.headers().get(header::CONTENT_TYPE);
        if content_type.is_some_and(|v| !is_json(v)) {
            return Err(Problem::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported-media-type",
                "expected no body, or a JSON body with Content-Type: application/json",
            ));
        }
        let empty = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v == "0")
            || (content_type.is_none()
                && !req.headers().contains_key(header::TRANSFER_ENCODING)
                && !req.headers().contains_key(header::CONTENT_LENGTH));
        if empty {
            return Ok(OptionalJson(T::default()));
        }
        ApiJson::<T>::from_request(req, state)
            .await
            .map(|ApiJson(v)| OptionalJson(v))
    }
}

/// `application/json` or `application/<something>+json`, with any parameters.
fn is_json(value: &header::HeaderValue) -> bool {
    let Ok(text) = value.to_str() else {
        return false;
    };
    let essence = text
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

fn json_problem(rejection: JsonRejection) -> Problem {
    let status = rejection.status();
    let kind = match rejection {
        _ if status == StatusCode::PAYLOAD_TOO_LARGE => "payload-too-large",
        JsonRejection::MissingJsonContentType(_) => "unsupported-media-type",
        JsonRejection::JsonSyntaxError(_) => "malformed-json",
        JsonRejection::JsonDataError(_) => "invalid-body",
        _ => "bad-body",
    };
    let detail = match status {
        StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            "expected a JSON body with Content-Type: application/json".to_string()
        }
        StatusCode::PAYLOAD_TOO_LARGE => "the request body is too large".to_string(),
        _ => rejection.body_text(),
    };
    Problem::new(status, kind, detail)
}

/// A query string whose rejections are problems.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(Problem))]
pub struct ApiQuery<T>(pub T);

impl From<QueryRejection> for Problem {
    fn from(rejection: QueryRejection) -> Problem {
        Problem::new(StatusCode::BAD_REQUEST, "bad-query", rejection.body_text())
    }
}

/// Turns every error response the framework makes on its own (unknown route, wrong method,
/// body too large…) into a problem, so clients see one error format.
pub async fn problem_responses(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    if is_problem {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 16 * 1024)
        .await
        .ok()
        .and_then(|b| String::from_utf8(b.to_vec()).ok())
        .filter(|t| !t.trim().is_empty());
    let (kind, default_detail) = match status {
        StatusCode::NOT_FOUND => ("not-found", "no such route"),
        StatusCode::METHOD_NOT_ALLOWED => (
            "method-not-allowed",
            "this route does not accept that method",
        ),
        StatusCode::PAYLOAD_TOO_LARGE => ("payload-too-large", "the request body is too large"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            ("unsupported-media-type", "unsupported content type")
        }
        StatusCode::REQUEST_TIMEOUT => ("timeout", "the request took too long"),
        _ if status.is_server_error() => ("internal", "the server failed to handle the request"),
        _ => ("bad-request", "the request is not valid"),
    };
    let detail = if status.is_server_error() {
        default_detail.to_string()
    } else {
        text.unwrap_or_else(|| default_detail.to_string())
    };
    let mut problem = Problem::new(status, kind, detail).into_response();
    // Keep headers such as Allow (405) that tell the client what to do.
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            problem.headers_mut().insert(name.clone(), value.clone());
        }
    }
    problem
}
