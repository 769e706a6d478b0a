//! Principals, tenants and session tokens (SPEC §17), through HTTP and the CLI only:
//!
//! - `walk`: every operation of `openapi.yaml` tried by every kind of principal that should
//!   not reach it (another tenant's admin, a member who does not own the session, a viewer,
//!   session tokens of each scope, of another session and expired, a revoked key, no
//!   credential), each answer checked against the contract's route classes; the route ×
//!   principal matrix is printed and written to `target/principals-matrix.md`.
//! - `tenants`: lists never show another tenant's sessions or agents, a member lists only its
//!   own sessions, a viewer reads but neither runs nor creates, a fork keeps its tenant, and
//!   sessions made before any key existed stay in tenant `default` for the operators.
//! - `tokens`: `answered_by` on an approval, session tokens on the event stream
//!   (`?access_token=`), expired tokens and revoked keys, the page's sign-in with a key.
//! - `cli`: `tah keys create|list|revoke` against a server's database.
//!
//! Every server runs with a deployment token ([`OPERATOR`]), whose client is an operator.

mod cli;
mod tenants;
mod tokens;
mod walk;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::*;

/// The deployment token (`--api-token`) of the suite's servers: an operator over every tenant.
pub const OPERATOR: &str = "principals-operator-token";

/// A key as `POST /v1/keys` made it.
#[derive(Debug, Clone)]
pub struct Key {
    pub id: String,
    /// The secret (`tah_…`), shown once.
    pub key: String,
    pub role: String,
}

impl Key {
    /// A client of `api`'s server that sends this key.
    pub fn client(&self, api: &Api) -> Api {
        api.with_bearer(&self.key)
    }
}

/// The options of a server on the mock model with the suite's operator token.
pub fn operated() -> ServerOptions {
    ServerOptions::new().operator_token(OPERATOR)
}

/// `POST /v1/keys` by `by` (an operator or an admin) that must answer 201; checks the key's
/// shape and returns it.
pub async fn create_key(by: &Api, tenant: &str, role: &str) -> Key {
    let body = json!({"tenant": tenant, "role": role, "name": format!("{tenant}-{role}")});
    let made = by
        .post_json("/v1/keys", &body)
        .await
        .expect_json(StatusCode::CREATED, &format!("POST /v1/keys {body}"));
    let key = made["key"].as_str().unwrap_or_default().to_string();
    assert!(
        key.len() == 4 + 64
            && key.starts_with("tah_")
            && key[4..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "a key is tah_ and 64 lowercase hex digits: {made}"
    );
    assert_eq!(
        (&made["tenant"], &made["role"]),
        (&json!(tenant), &json!(role)),
        "{made}"
    );
    Key {
        id: id_of(&made),
        key,
        role: role.to_string(),
    }
}

/// `DELETE /v1/keys/{id}` by `by`, which must answer 204.
pub async fn revoke_key(by: &Api, id: &str) {
    let path = format!("/v1/keys/{id}");
    let reply = by.send(by.request(Method::DELETE, &path)).await;
    assert_eq!(
        reply.status,
        StatusCode::NO_CONTENT,
        "DELETE {path}: {}",
        reply.text()
    );
}

/// `POST /v1/sessions/{id}/tokens` by `by` (who owns the session) that must answer 201;
/// returns the whole answer (`token`, `expires_at`, `scope`, `session_id`).
pub async fn session_token_of(by: &Api, session: &str, scope: &str, ttl_s: Option<u64>) -> Value {
    let mut body = json!({"scope": scope});
    if let Some(ttl) = ttl_s {
        body["ttl_s"] = json!(ttl);
    }
    let path = format!("/v1/sessions/{session}/tokens");
    let made = by
        .post_json(&path, &body)
        .await
        .expect_json(StatusCode::CREATED, &format!("POST {path} {body}"));
    let token = made["token"].as_str().unwrap_or_default();
    assert!(
        token.len() == 5 + 64 && token.starts_with("tahs_"),
        "a session token is tahs_ and 64 hex digits: {made}"
    );
    assert_eq!(
        (&made["scope"], &made["session_id"]),
        (&json!(scope), &json!(session)),
        "{made}"
    );
    assert!(made["expires_at"].is_string(), "{made}");
    made
}

/// A session token's secret (see [`session_token_of`]).
pub async fn session_token(by: &Api, session: &str, scope: &str, ttl_s: Option<u64>) -> String {
    session_token_of(by, session, scope, ttl_s).await["token"]
        .as_str()
        .expect("a token")
        .to_string()
}

/// The ids of a list's items.
pub fn ids(items: &[Value]) -> Vec<String> {
    items.iter().map(id_of).collect()
}

/// Asserts a `401` problem with `WWW-Authenticate: Bearer`; returns its detail.
#[track_caller]
pub fn assert_unauthorized(reply: &Reply, what: &str) -> String {
    let problem = reply.expect_problem(StatusCode::UNAUTHORIZED, what);
    assert_eq!(
        problem["type"], "urn:tah:problem:unauthorized",
        "{what}: {problem}"
    );
    let challenge = reply
        .headers
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    assert!(
        challenge.starts_with("Bearer"),
        "{what}: a 401 names the Bearer scheme, got {challenge:?}"
    );
    problem["detail"].as_str().unwrap_or_default().to_string()
}
