//! `Idempotency-Key` on the POST routes that start or make something (`/v1/sessions`, a
//! session's `/runs`, `/resume`, `/fork`, `/compact`, `/replay`, and the input events of OpenAI's
//! Agents API, `/openai/v1/agents/sessions/{id}/events`): the first request with a key runs and
//! its response (status and body) is kept in the database for 24 hours; a retry with the same
//! key and the same request gets that response again and starts nothing, also after a restart
//! and on another replica. The same key with another request is a `422`; a retry that arrives
//! while the first is in flight waits for it.
//!
//! Only successful (2xx) responses are kept: a refusal that a retry may overcome (a 409 while
//! a run is active, a 429, a 5xx, a bad body) frees the key again.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use super::problem::Problem;
use crate::runtime::{EdgeRecords, IdempotencyKeys, KeyClaim, StoredResponse};

/// The request header.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Set on a response that is the replay of a kept one.
pub const REPLAYED: &str = "idempotent-replayed";
/// How long a key and its response are kept.
const KEEP_MS: i64 = 24 * 60 * 60 * 1000;
/// How long a claim lasts without renewal (a process that died mid-request lets go then).
const CLAIM_MS: i64 = 30_000;
/// How often a waiting retry looks again.
const POLL: Duration = Duration::from_millis(50);
/// The longest key accepted.
const MAX_KEY_CHARS: usize = 255;

/// What the middleware needs.
#[derive(Clone)]
pub struct Keys {
    pub records: EdgeRecords,
    pub max_body_bytes: usize,
    /// When expired keys were last purged (Unix ms).
    last_purge: Arc<AtomicI64>,
}

impl Keys {
    pub fn new(records: EdgeRecords, max_body_bytes: usize) -> Keys {
        Keys {
            records,
            max_body_bytes,
            last_purge: Arc::new(AtomicI64::new(0)),
        }
    }
}

/// Whether a POST to `path` takes an idempotency key.
fn takes_key(path: &str) -> bool {
    let path = path.trim_end_matches('/');
    if path == "/v1/sessions" {
        return true;
    }
    // OpenAI's Agents API sends a session's input events with a key.
    if let Some(rest) = path.strip_prefix("/openai/v1/agents/sessions/") {
        return rest
            .strip_suffix("/events")
            .is_some_and(|id| !id.is_empty() && !id.contains('/'));
    }
    let Some(rest) = path.strip_prefix("/v1/sessions/") else {
        return false;
    };
    match rest.split_once('/') {
        Some((id, action)) => {
            !id.is_empty() && matches!(action, "runs" | "resume" | "fork" | "compact" | "replay")
        }
        None => false,
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn bad_key(detail: impl Into<String>) -> Response {
    Problem::new(StatusCode::BAD_REQUEST, "bad-idempotency-key", detail).into_response()
}

/// The key of a request, checked: `None` when it has none; `Err` says what is wrong.
fn key_of(headers: &HeaderMap) -> Result<Option<String>, String> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err("send one Idempotency-Key header, not several".to_string());
    }
    let key = value
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= MAX_KEY_CHARS)
        .filter(|k| k.bytes().all(|b| (0x21..=0x7e).contains(&b)))
        .ok_or_else(|| {
            format!(
                "Idempotency-Key must be 1 to {MAX_KEY_CHARS} visible ASCII characters \
                 (a UUID is a good choice)"
            )
        })?;
    Ok(Some(key.to_string()))
}

fn fingerprint(request: &axum::http::request::Parts, body: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(request.method.as_str());
    hash.update(b"\n");
    hash.update(request.uri.path());
    hash.update(b"\n");
    hash.update(request.uri.query().unwrap_or(""));
    hash.update(b"\n");
    hash.update(body);
    hash.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn wants_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"))
}

fn unavailable(error: impl std::fmt::Display) -> Response {
    tracing::warn!(%error, "idempotency keys cannot be read or written");
    Problem::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        format!("idempotency keys cannot be used now: {error}"),
    )
    .into_response()
}

/// The middleware: passes requests without a key (or on other routes) straight through.
pub async fn check(State(keys): State<Keys>, request: Request, next: Next) -> Response {
    if request.method() != Method::POST || !takes_key(request.uri().path()) {
        return next.run(request).await;
    }
    let key = match key_of(request.headers()) {
        Ok(Some(key)) => key,
        Ok(None) => return next.run(request).await,
        Err(why) => return bad_key(why),
    };
    let Some(table) = keys.records.idempotency() else {
        return next.run(request).await;
    };
    if wants_stream(request.headers()) {
        return bad_key(
            "Idempotency-Key is not taken with Accept: text/event-stream (a stream cannot be \
             answered again); start the run without it and follow the session's events",
        );
    }
    // A key is the principal's own: another principal's same key is another key, and never
    // answers it what was answered to the first.
    let key = match request.extensions().get::<crate::model::Principal>() {
        Some(principal) => format!(
            "{}/{}:{key}",
            principal.tenant().unwrap_or("*"),
            principal.id()
        ),
        None => key,
    };
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, keys.max_body_bytes).await {
        Ok(body) => body,
        Err(_) => {
            return Problem::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload-too-large",
                format!(
                    "the request body is larger than {} bytes",
                    keys.max_body_bytes
                ),
            )
            .into_response()
        }
    };
    let fingerprint = fingerprint(&parts, &body);
    purge_now_and_then(&keys, table).await;
    let claim = crate::model::new_id().to_string();
    loop {
        let now = now_ms();
        let held = table
            .claim_key(&KeyClaim {
                key: &key,
                fingerprint: &fingerprint,
                claim: &claim,
                now,
                claimed_until: now + CLAIM_MS,
                expires_at: now + KEEP_MS,
            })
            .await;
        match held {
            Err(error) => return unavailable(error),
            Ok(Some(record)) if record.fingerprint != fingerprint => {
                return Problem::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "idempotency-key-reused",
                    "this Idempotency-Key was used with another request (route, query or \
                     body) in the last 24 hours; use a new key for a new request",
                )
                .into_response()
            }
            Ok(Some(record)) => match record.response {
                Some(response) => return replay(response),
                // The first request is in flight: wait for its answer (or for it to let go).
                None => tokio::time::sleep(POLL).await,
            },
            Ok(None) => {
                let request = Request::from_parts(parts, Body::from(body));
                return run_claimed(keys.records.clone(), key, claim, request, next).await;
            }
        }
    }
}

/// Runs the request that holds the key, in a task of its own so that a client that goes away
/// does not leave the key without an answer, and keeps its response when it is a success.
async fn run_claimed(
    records: EdgeRecords,
    key: String,
    claim: String,
    request: Request,
    next: Next,
) -> Response {
    let task = tokio::spawn(async move {
        let Some(table) = records.idempotency() else {
            return next.run(request).await;
        };
        let run = next.run(request);
        tokio::pin!(run);
        let response = loop {
            tokio::select! {
                response = &mut run => break response,
                _ = tokio::time::sleep(Duration::from_millis(CLAIM_MS as u64 / 3)) => {
                    if let Err(error) = table.renew_key(&key, &claim, now_ms() + CLAIM_MS).await {
                        tracing::warn!(%error, "an idempotency key's claim was not renewed");
                    }
                }
            }
        };
        if !response.status().is_success() {
            if let Err(error) = table.release_key(&key, &claim).await {
                tracing::warn!(%error, "an idempotency key was not released");
            }
            return response;
        }
        let (parts, body) = response.into_parts();
        let body = match axum::body::to_bytes(body, usize::MAX).await {
            Ok(body) => body,
            Err(error) => {
                let _ = table.release_key(&key, &claim).await;
                return unavailable(error);
            }
        };
        let header_text = |name| {
            parts
                .headers
                .get(name)
                .and_then(|v: &HeaderValue| v.to_str().ok())
                .map(str::to_string)
        };
        let kept = StoredResponse {
            status: parts.status.as_u16(),
            content_type: header_text(header::CONTENT_TYPE),
            location: header_text(header::LOCATION),
            body: body.to_vec(),
        };
        if let Err(error) = table.answer_key(&key, &claim, &kept).await {
            // The request did its work; a retry may do it again, which the log says.
            tracing::warn!(%error, "an idempotent response was not kept");
            let _ = table.release_key(&key, &claim).await;
        }
        Response::from_parts(parts, Body::from(body))
    });
    match task.await {
        Ok(response) => response,
        Err(error) => unavailable(error),
    }
}

/// The kept response, as it was first answered.
fn replay(kept: StoredResponse) -> Response {
    let status = StatusCode::from_u16(kept.status).unwrap_or(StatusCode::OK);
    let mut response = (status, kept.body).into_response();
    let headers = response.headers_mut();
    headers.remove(header::CONTENT_TYPE);
    for (name, value) in [
        (header::CONTENT_TYPE, kept.content_type),
        (header::LOCATION, kept.location),
    ] {
        if let Some(value) = value.and_then(|v| HeaderValue::from_str(&v).ok()) {
            headers.insert(name, value);
        }
    }
    headers.insert(REPLAYED, HeaderValue::from_static("true"));
    response
}

/// Forgets expired keys, at most once a minute per process.
async fn purge_now_and_then(keys: &Keys, table: &dyn IdempotencyKeys) {
    let now = now_ms();
    let last = keys.last_purge.load(Ordering::Relaxed);
    if now - last < 60_000
        || keys
            .last_purge
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    if let Err(error) = table.purge_keys(now).await {
        tracing::warn!(%error, "expired idempotency keys were not purged");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_taken_on_the_routes_that_make_something() {
        for path in [
            "/v1/sessions",
            "/v1/sessions/",
            "/v1/sessions/abc/runs",
            "/v1/sessions/abc/resume",
            "/v1/sessions/abc/fork",
            "/v1/sessions/abc/compact",
            "/v1/sessions/abc/replay",
            "/openai/v1/agents/sessions/abc/events",
        ] {
            assert!(takes_key(path), "{path}");
        }
        for path in [
            "/v1/sessions/abc",
            "/v1/sessions/abc/cancel",
            "/v1/sessions//runs",
            "/v1/sessions/abc/runs/x",
            "/v1/sessions/abc/approvals/x",
            "/openai/v1/agents/sessions//events",
            "/openai/v1/agents/sessions/abc/items",
            "/healthz",
        ] {
            assert!(!takes_key(path), "{path}");
        }
    }

    #[test]
    fn a_key_is_one_header_of_visible_ascii() {
        let headers = |values: &[&str]| {
            let mut map = HeaderMap::new();
            for v in values {
                map.append(IDEMPOTENCY_KEY, HeaderValue::from_str(v).unwrap());
            }
            map
        };
        assert_eq!(key_of(&headers(&[])).ok(), Some(None));
        assert_eq!(
            key_of(&headers(&["abc-123"])).ok(),
            Some(Some("abc-123".to_string()))
        );
        assert!(key_of(&headers(&[""])).is_err());
        assert!(key_of(&headers(&["a b"])).is_err());
        assert!(key_of(&headers(&["a", "b"])).is_err());
        assert!(key_of(&headers(&[&"k".repeat(256)])).is_err());
    }
}
