//! Errors in each face's own shape. Handlers, extractors and the layers in front of them
//! (authentication, access, limits, the body limit) answer problem+json everywhere; on a face
//! that speaks another vendor's API, this layer reshapes that answer into the vendor's error
//! object, with the same status, so the vendor's SDK raises its own typed error (an
//! `AuthenticationError` for a `401`, a `NotFoundError` for a `404`, …) with tah's detail as
//! its message.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::{json, Value};

use crate::http::PROBLEM_JSON;

/// A face whose errors have a shape of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorShape {
    /// `{"type":"error","error":{"type","message"},"request_id"}`: Anthropic's API.
    Anthropic,
    /// `{"error":{"message","type","param","code"}}`: OpenAI's API.
    OpenAi,
}

impl ErrorShape {
    /// The face that serves `path`, if its errors have a shape of their own.
    pub fn of_path(path: &str) -> Option<ErrorShape> {
        if path.starts_with("/anthropic/") {
            Some(ErrorShape::Anthropic)
        } else if path.starts_with("/openai/") {
            Some(ErrorShape::OpenAi)
        } else {
            None
        }
    }

    /// The error body of this face for `status` with `message`; `code` is tah's problem kind
    /// (the part after `urn:tah:problem:`), kept where the vendor's shape has room for it.
    pub fn body(self, status: StatusCode, message: &str, code: &str) -> Value {
        match self {
            ErrorShape::Anthropic => json!({
                "type": "error",
                "error": {"type": anthropic_type(status), "message": message},
            }),
            ErrorShape::OpenAi => json!({
                "error": {
                    "message": message,
                    "type": openai_type(status),
                    "param": null,
                    "code": code,
                }
            }),
        }
    }
}

/// Anthropic's error type for a status (docs.anthropic.com, "Errors").
fn anthropic_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        400 | 405 | 409 | 412 | 415 | 422 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        408 => "timeout_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// OpenAI's error type for a status.
fn openai_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        s if s >= 500 => "server_error",
        _ => "invalid_request_error",
    }
}

/// Reshapes the problem+json answers of the faces with an error shape of their own (headers
/// such as `Retry-After` are kept). Everything else passes untouched.
pub async fn face_errors(request: Request, next: Next) -> Response {
    let Some(shape) = ErrorShape::of_path(request.uri().path()) else {
        return next.run(request).await;
    };
    let response = next.run(request).await;
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    if !is_problem {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let problem: Value = match axum::body::to_bytes(body, 64 * 1024).await {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        Err(_) => Value::Null,
    };
    let message = problem["detail"].as_str().unwrap_or("the request failed");
    let code = problem["type"]
        .as_str()
        .and_then(|t| t.strip_prefix("urn:tah:problem:"))
        .unwrap_or("error");
    let body = serde_json::to_vec(&shape.body(parts.status, message, code)).unwrap_or_default();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_face_has_its_vendors_error_shape() {
        assert_eq!(
            ErrorShape::of_path("/anthropic/v1/sessions"),
            Some(ErrorShape::Anthropic)
        );
        assert_eq!(
            ErrorShape::of_path("/openai/v1/responses"),
            Some(ErrorShape::OpenAi)
        );
        assert_eq!(ErrorShape::of_path("/v1/sessions"), None);
        let a = ErrorShape::Anthropic.body(StatusCode::NOT_FOUND, "session not found", "x");
        assert_eq!(a["type"], "error");
        assert_eq!(a["error"]["type"], "not_found_error");
        assert_eq!(a["error"]["message"], "session not found");
        let o = ErrorShape::OpenAi.body(StatusCode::UNAUTHORIZED, "no key", "unauthorized");
        assert_eq!(o["error"]["type"], "authentication_error");
        assert_eq!(o["error"]["code"], "unauthorized");
    }
}
