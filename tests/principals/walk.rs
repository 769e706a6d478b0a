//! The route walk: every operation `openapi.yaml` documents, tried by every principal that the
//! contract keeps out of somewhere (and by the operator, the tenant's admin and the session's
//! owner, whom it lets in), with the ids of one tenant's resources substituted and a
//! minimal valid body; each answer's status class is checked against the contract's route
//! classes (`404` hides, `403` refuses, `401` does not know the caller, anything else is "not
//! denied"). A route the walk cannot classify, or whose path names a parameter it has no value
//! for, fails the test by name: a new route is walked as soon as the document has it.
//!
//! The matrix of what was walked (route × principal → status) is printed and written to
//! `target/principals-matrix.md`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use super::{create_key, revoke_key, session_token, Key, OPERATOR};
use crate::agents::create_agent;
use crate::support::fakes::{FakeServer, FakeToolCall};
use crate::support::scripted::{asks, call, ended, says};
use crate::support::*;
use crate::tools::pending_within;

/// How long the walk reads an answer's body (a stream's first bytes are enough).
const BODY_WAIT: Duration = Duration::from_secs(2);
/// The most of a body the walk keeps (for the matrix's failure notes).
const BODY_BYTES: usize = 2048;

/// One operation of the document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation {
    pub method: Method,
    /// The path template, e.g. `/v1/sessions/{id}/runs/{run_id}`.
    pub path: String,
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.method, self.path)
    }
}

/// The operations of `openapi.yaml`'s `paths:` block, in the document's order. The document's
/// own layout is read (two spaces before a path, four before a method), so no YAML reader is
/// needed; a line of that block the reader does not understand fails loudly.
pub fn operations(document: &str) -> Vec<Operation> {
    const METHODS: [&str; 7] = ["get", "post", "put", "delete", "patch", "head", "options"];
    let mut operations = Vec::new();
    let mut in_paths = false;
    let mut path: Option<String> = None;
    for line in document.lines() {
        if !in_paths {
            in_paths = line == "paths:";
            continue;
        }
        if !line.starts_with(' ') && !line.trim().is_empty() {
            break; // the next top-level key
        }
        if let Some(rest) = line.strip_prefix("  /") {
            let template = rest
                .strip_suffix(':')
                .unwrap_or_else(|| panic!("openapi.yaml: a path line without its colon: {line}"));
            path = Some(format!("/{}", template.trim_matches('"')));
        } else if let Some(key) = line
            .strip_prefix("    ")
            .filter(|k| !k.starts_with(' '))
            .and_then(|k| k.strip_suffix(':'))
        {
            if METHODS.contains(&key) {
                let path = path
                    .clone()
                    .unwrap_or_else(|| panic!("openapi.yaml: {key} before any path"));
                let method = Method::from_bytes(key.to_ascii_uppercase().as_bytes()).unwrap();
                operations.push(Operation { method, path });
            }
        }
    }
    assert!(
        operations.len() > 10,
        "openapi.yaml: no paths block read ({} operations)",
        operations.len()
    );
    operations
}

/// The contract's route classes (principals-contract, "Route classes and who gets what").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// No credential needed.
    Open,
    /// The tenant's agents (`specific`: one agent of tenant A), providers and tools.
    TenantRead {
        specific: bool,
    },
    /// `GET /v1/sessions`.
    SessionList,
    /// Keys, agents' changes, vaults (`specific`: names one resource of tenant A).
    Admin {
        specific: bool,
    },
    /// `POST /v1/sessions`.
    Create,
    SessionRead,
    SessionInteract,
    SessionOwn,
    /// Reading one schedule of tenant A (owned by m1): like a session's read, but session
    /// tokens never reach schedules.
    ScheduleRead,
}

/// The class of an operation, or `None` when the contract does not say.
fn class_of(op: &Operation) -> Option<Class> {
    let path = op.path.as_str();
    let m = &op.method;
    if matches!(
        path,
        "/healthz" | "/readyz" | "/openapi.yaml" | "/metrics" | "/v1/auth/cookie" | "/"
    ) || path.starts_with("/ui/")
    {
        return Some(Class::Open);
    }
    if path == "/v1/sessions" {
        return match *m {
            Method::GET => Some(Class::SessionList),
            Method::POST => Some(Class::Create),
            _ => None,
        };
    }
    if let Some(rest) = path.strip_prefix("/v1/sessions/{id}") {
        return match (m.clone(), rest) {
            (Method::GET, _) => Some(Class::SessionRead),
            (Method::DELETE | Method::POST, "") => Some(Class::SessionOwn),
            (
                Method::POST,
                "/runs"
                | "/resume"
                | "/cancel"
                | "/approvals/{call_id}"
                | "/tool-results/{call_id}"
                | "/ai-sdk/chat"
                | "/ag-ui",
            ) => Some(Class::SessionInteract),
            (Method::POST, "/fork" | "/replay" | "/compact" | "/tokens") => Some(Class::SessionOwn),
            _ => None,
        };
    }
    if path == "/v1/providers" || path == "/v1/tools" {
        return (*m == Method::GET).then_some(Class::TenantRead { specific: false });
    }
    if let Some(rest) = path.strip_prefix("/v1/agents") {
        let specific = !rest.is_empty();
        return match (m.clone(), rest) {
            (Method::GET, "" | "/{id}" | "/{id}/versions" | "/{id}/versions/{version}") => {
                Some(Class::TenantRead { specific })
            }
            (Method::POST, "") => Some(Class::Admin { specific: false }),
            (Method::POST | Method::DELETE, "/{id}") => Some(Class::Admin { specific: true }),
            _ => None,
        };
    }
    if let Some(rest) = path.strip_prefix("/v1/keys") {
        let one_key = rest.starts_with("/{") && rest.ends_with('}') && !rest[1..].contains('/');
        return match (m.clone(), rest) {
            (Method::GET | Method::POST, "") => Some(Class::Admin { specific: false }),
            (Method::DELETE, _) if one_key => Some(Class::Admin { specific: true }),
            _ => None,
        };
    }
    if let Some(rest) = path.strip_prefix("/v1/schedules") {
        // Schedules are made like sessions, and one of m1's is changed like m1's session.
        return match (m.clone(), rest) {
            (Method::GET, "") => Some(Class::SessionList),
            (Method::POST, "") => Some(Class::Create),
            (Method::GET, "/{id}" | "/{id}/fires") => Some(Class::ScheduleRead),
            (Method::POST | Method::DELETE, "/{id}") | (Method::POST, "/{id}/trigger") => {
                Some(Class::SessionOwn)
            }
            _ => None,
        };
    }
    if path.starts_with("/v1/vaults/{vault}/secrets") {
        // A vault is named in the caller's own tenant: nothing of tenant A's is named.
        return Some(Class::Admin { specific: false });
    }
    if let Some(rest) = path.strip_prefix("/v1/environments") {
        // The walk names the built-in `local`, which every tenant has: nothing of tenant A's.
        return match (m.clone(), rest) {
            (Method::GET, "" | "/{env}") => Some(Class::TenantRead { specific: false }),
            (Method::POST, "") | (Method::DELETE, "/{env}") => {
                Some(Class::Admin { specific: false })
            }
            // A worker's routes: members and admins of the tenant, like making a session.
            (Method::POST, _) if rest.starts_with("/{env}/claims") => Some(Class::Create),
            _ => None,
        };
    }
    None
}

/// The principals of the walk, in the matrix's column order: first those the contract keeps
/// out of somewhere, then those it lets in everywhere they belong (walked after the others on
/// each route, so that what they change, such as a deleted session, comes last).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Who {
    OtherTenantAdmin,
    MemberNotOwner,
    Viewer,
    TokenRead,
    TokenInteract,
    TokenOtherSession,
    ExpiredToken,
    RevokedKey,
    NoCredential,
    Owner,
    TenantAdmin,
    Operator,
}

const EVERYONE: [Who; 12] = [
    Who::OtherTenantAdmin,
    Who::MemberNotOwner,
    Who::Viewer,
    Who::TokenRead,
    Who::TokenInteract,
    Who::TokenOtherSession,
    Who::ExpiredToken,
    Who::RevokedKey,
    Who::NoCredential,
    Who::Owner,
    Who::TenantAdmin,
    Who::Operator,
];

impl Who {
    fn label(self) -> &'static str {
        match self {
            Who::OtherTenantAdmin => "B admin",
            Who::MemberNotOwner => "A member, not owner",
            Who::Viewer => "A viewer",
            Who::TokenRead => "token read",
            Who::TokenInteract => "token interact",
            Who::TokenOtherSession => "token, other session",
            Who::ExpiredToken => "expired token",
            Who::RevokedKey => "revoked key",
            Who::NoCredential => "no credential",
            Who::Operator => "operator",
            Who::TenantAdmin => "A admin",
            Who::Owner => "A member m1, owner",
        }
    }
}

/// What the contract says a principal gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Anything but 401, 403, or a 404 the operator does not get too.
    NotDenied,
    Hidden,
    Forbidden,
    Unauthorized,
}

impl Expect {
    fn label(self) -> &'static str {
        match self {
            Expect::NotDenied => "not denied",
            Expect::Hidden => "404",
            Expect::Forbidden => "403",
            Expect::Unauthorized => "401",
        }
    }
}

fn expected(class: Class, who: Who) -> Expect {
    use Expect::*;
    if class == Class::Open || matches!(who, Who::Operator | Who::TenantAdmin) {
        return NotDenied;
    }
    if who == Who::Owner {
        return match class {
            Class::Admin { .. } => Forbidden,
            _ => NotDenied,
        };
    }
    if matches!(who, Who::ExpiredToken | Who::RevokedKey | Who::NoCredential) {
        return Unauthorized;
    }
    let token = matches!(
        who,
        Who::TokenRead | Who::TokenInteract | Who::TokenOtherSession
    );
    match class {
        Class::Open => NotDenied,
        Class::TenantRead { specific } => match who {
            _ if token => Forbidden,
            Who::OtherTenantAdmin if specific => Hidden,
            _ => NotDenied,
        },
        Class::SessionList => match who {
            _ if token => Forbidden,
            _ => NotDenied,
        },
        Class::Admin { specific } => match who {
            Who::OtherTenantAdmin if specific => Hidden,
            Who::OtherTenantAdmin => NotDenied,
            _ => Forbidden,
        },
        Class::Create => match who {
            Who::OtherTenantAdmin | Who::MemberNotOwner => NotDenied,
            _ => Forbidden,
        },
        Class::SessionRead => match who {
            Who::OtherTenantAdmin | Who::MemberNotOwner => Hidden,
            Who::Viewer | Who::TokenRead | Who::TokenInteract => NotDenied,
            _ => Forbidden,
        },
        Class::SessionInteract => match who {
            Who::OtherTenantAdmin | Who::MemberNotOwner => Hidden,
            Who::TokenInteract => NotDenied,
            _ => Forbidden,
        },
        Class::SessionOwn => match who {
            Who::OtherTenantAdmin | Who::MemberNotOwner => Hidden,
            _ => Forbidden,
        },
        Class::ScheduleRead => match who {
            Who::OtherTenantAdmin | Who::MemberNotOwner => Hidden,
            Who::Viewer => NotDenied,
            _ => Forbidden,
        },
    }
}

/// The tenant-A world the walk runs in.
struct World {
    _model: FakeServer,
    server: TestServer,
    /// The credential each principal sends (`None`: none).
    credentials: BTreeMap<Who, Option<String>>,
    /// Path parameter → value, by the path's prefix (`{id}` differs by resource).
    session: String,
    agent: String,
    /// A schedule of m1's, on an agent archived since (a manual fire fails, calling no model).
    schedule: String,
    key: String,
    run: String,
    step: String,
    artifact: String,
    approval_call: String,
    client_call: String,
}

/// The client tool of session S, which the scripted model calls once.
fn client_tool() -> Value {
    json!({
        "name": "pick_color",
        "description": "Asks the user to pick a color.",
        "input_schema": {"type": "object", "properties": {"question": {"type": "string"}}}
    })
}

/// Sets tenant A up as an operator, keys, then as their holders: an agent (A's admin); a
/// session S of member m1 with one finished run, an artifact, a pending approval and a
/// pending client call; another session of m1; session tokens.
async fn world() -> World {
    let write = |id: &str, path: &str| call(id, "write_file", json!({"path": path, "content": id}));
    let model = crate::support::fakes::start_openai(vec![
        asks(&[write("a1", "a.txt")]),
        says("written"),
        asks(&[
            write("w2", "b.txt"),
            FakeToolCall::new("c1", "pick_color", &[r#"{"question":"which?"}"#]),
        ]),
        says("done"),
    ])
    .await;
    let options = crate::support::scripted::options(&model, &[]).operator_token(OPERATOR);
    let server = TestServer::start(options).await;
    let op = server.api.clone();

    let a_admin = create_key(&op, "a", "admin").await;
    let m1 = create_key(&op, "a", "member").await;
    let m2 = create_key(&op, "a", "member").await;
    let viewer = create_key(&op, "a", "viewer").await;
    let b_admin = create_key(&op, "b", "admin").await;
    let spare = create_key(&op, "a", "member").await;
    let revoked = create_key(&op, "a", "member").await;
    let admin = a_admin.client(&op);
    revoke_key(&admin, &revoked.id).await;

    let agent = id_of(&create_agent(&admin, &json!({"name": "walker", "model": "fake"})).await);

    let owner = m1.client(&op);
    let retired = id_of(&create_agent(&admin, &json!({"name": "retired", "model": "fake"})).await);
    let schedule = owner
        .post_json(
            "/v1/schedules",
            &json!({"agent": retired, "cron": "0 0 1 1 *", "timezone": "UTC", "input": "x"}),
        )
        .await
        .expect_json(StatusCode::CREATED, "m1's schedule");
    let schedule = id_of(&schedule);
    let path = format!("/v1/agents/{retired}");
    admin
        .send(admin.request(Method::DELETE, &path))
        .await
        .expect_json(StatusCode::OK, "the schedule's agent archived");
    let session = id_of(
        &owner
            .create_session_with(&json!({"client_tools": [client_tool()]}))
            .await,
    );
    owner.start_run(&session, "write a.txt").await;
    let first = pending_within(&server, &session, 1, Duration::from_secs(10)).await;
    assert_eq!(first[0]["call_id"], "a1", "{first:?}");
    let path = format!("/v1/sessions/{session}/approvals/a1");
    owner
        .post_json(&path, &json!({"decision": "allow"}))
        .await
        .expect_json(StatusCode::OK, &path);
    let after_first = ended(&server, &session).await;
    assert_eq!(after_first["state"], "completed", "{after_first}");
    let run = id_of(&owner.runs(&session).await[0]);
    let step = id_of(&owner.steps(&session).await[0]);
    let artifacts = owner
        .get_ok(&format!("/v1/sessions/{session}/artifacts"))
        .await;
    let artifact = id_of(&artifacts["data"][0]);

    owner.start_run(&session, "write b.txt and ask").await;
    let pending = pending_within(&server, &session, 1, Duration::from_secs(10)).await;
    assert_eq!(pending[0]["call_id"], "w2", "{pending:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let waiting = owner
            .get_ok(&format!("/v1/sessions/{session}/tool-results"))
            .await;
        if waiting["data"]
            .as_array()
            .is_some_and(|d| d.iter().any(|c| c["call_id"] == "c1"))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the client call c1 never waited: {waiting}"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
    }

    let other = owner.create_session().await;
    let read = session_token(&owner, &session, "read", None).await;
    let interact = session_token(&owner, &session, "interact", None).await;
    let elsewhere = session_token(&owner, &other, "interact", None).await;
    let expired = session_token(&owner, &session, "read", Some(1)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let credentials = BTreeMap::from([
        (Who::OtherTenantAdmin, Some(b_admin.key.clone())),
        (Who::MemberNotOwner, Some(m2.key.clone())),
        (Who::Viewer, Some(viewer.key.clone())),
        (Who::TokenRead, Some(read)),
        (Who::TokenInteract, Some(interact)),
        (Who::TokenOtherSession, Some(elsewhere)),
        (Who::ExpiredToken, Some(expired)),
        (Who::RevokedKey, Some(revoked.key.clone())),
        (Who::NoCredential, None),
        (Who::Operator, Some(OPERATOR.to_string())),
        (Who::TenantAdmin, Some(a_admin.key.clone())),
        (Who::Owner, Some(m1.key.clone())),
    ]);
    let Key { id: key, .. } = spare;
    World {
        _model: model,
        server,
        credentials,
        session,
        agent,
        schedule,
        key,
        run,
        step,
        artifact,
        approval_call: "w2".to_string(),
        client_call: "c1".to_string(),
    }
}

impl World {
    /// The path of `op` with tenant A's ids in it, or what it has no value for.
    fn concrete(&self, op: &Operation) -> Result<String, String> {
        let mut out = String::new();
        let mut rest = op.path.as_str();
        while let Some(open) = rest.find('{') {
            out.push_str(&rest[..open]);
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| format!("an unclosed parameter in {}", op.path))?
                + open;
            let name = &rest[open + 1..close];
            let value = match name {
                "id" if op.path.starts_with("/v1/sessions/") => &self.session,
                "id" if op.path.starts_with("/v1/agents/") => &self.agent,
                "id" if op.path.starts_with("/v1/schedules/") => &self.schedule,
                "id" | "key_id" if op.path.starts_with("/v1/keys/") => &self.key,
                "run_id" => &self.run,
                "step_id" => &self.step,
                "artifact_id" => &self.artifact,
                "call_id" if op.path.contains("/approvals/") => &self.approval_call,
                "call_id" if op.path.contains("/tool-results/") => &self.client_call,
                "chat_id" => &self.session,
                "version" => "1",
                "file" => "app.js",
                "vault" => "main",
                "env" => "local",
                "claim_id" => "none",
                "name" => "token",
                _ => return Err(format!("no value for the parameter {{{name}}}")),
            };
            out.push_str(value);
            rest = &rest[close + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }

    /// A minimal valid body for `op` (`None`: no body).
    fn body(&self, op: &Operation) -> Option<Value> {
        let path = op.path.as_str();
        let user = json!({"id": "u1", "role": "user", "content": "hello"});
        match op.method {
            Method::POST | Method::PUT | Method::PATCH => Some(match path {
                "/v1/auth/cookie" => json!({"token": OPERATOR}),
                "/v1/agents" => json!({"name": "walked", "model": "fake"}),
                "/v1/agents/{id}" => json!({"system_prompt": "changed"}),
                "/v1/keys" => json!({"role": "viewer"}),
                "/v1/schedules" => json!({"agent": "default", "cron": "0 0 1 1 *",
                                          "timezone": "UTC", "input": "x", "paused": true}),
                "/v1/schedules/{id}" => json!({"paused": true}),
                "/v1/schedules/{id}/trigger" => json!({}),
                "/v1/sessions/{id}/replay" => json!({"mode": "recorded"}),
                _ if path.starts_with("/v1/vaults/") => json!({"value": "v"}),
                "/v1/environments" => json!({"name": "walked", "type": "workers"}),
                _ if path.ends_with("/claims/{claim_id}/result") => json!({"output": "x"}),
                _ if path.ends_with("/runs") => json!({"input": "hello"}),
                _ if path.ends_with("/tokens") => json!({"scope": "read"}),
                _ if path.contains("/approvals/") => json!({"decision": "allow"}),
                _ if path.contains("/tool-results/") => json!({"output": "teal"}),
                _ if path.ends_with("/ai-sdk/chat") => json!({
                    "id": self.session,
                    "messages": [{"id": "u", "role": "user",
                                  "parts": [{"type": "text", "text": "hello"}]}],
                }),
                _ if path.ends_with("/ag-ui") => {
                    json!({"threadId": self.session, "runId": "walk", "messages": [user]})
                }
                _ if path.ends_with("/resume")
                    || path.ends_with("/cancel")
                    || path.ends_with("/compact") =>
                {
                    return None
                }
                _ => json!({}),
            }),
            _ => None,
        }
    }
}

/// What a request carries.
#[derive(Clone, Copy)]
enum Payload<'a> {
    Empty,
    Json(&'a Value),
    /// A JSON content type and a body that does not parse.
    Malformed,
}

impl<'a> From<Option<&'a Value>> for Payload<'a> {
    fn from(body: Option<&'a Value>) -> Payload<'a> {
        body.map_or(Payload::Empty, Payload::Json)
    }
}

/// What one request answered: its status and the start of its body.
struct Answer {
    status: StatusCode,
    body: String,
}

/// Sends one request with `credential` (or none); reads at most [`BODY_BYTES`] of the body
/// for at most [`BODY_WAIT`] (a stream's first bytes).
async fn send(
    api: &Api,
    credential: Option<&str>,
    method: Method,
    path: &str,
    body: Payload<'_>,
) -> Answer {
    let api = match credential {
        Some(token) => api.with_bearer(token),
        None => api.anonymous(),
    };
    let request = match body {
        Payload::Empty => api.request(method.clone(), path),
        Payload::Json(body) => api.request(method.clone(), path).json(body),
        Payload::Malformed => api
            .request(method.clone(), path)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(r#"{"unclosed": "#),
    };
    let mut response = request
        .send()
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e:#}"));
    let status = response.status();
    let mut bytes = Vec::new();
    let deadline = tokio::time::Instant::now() + BODY_WAIT;
    while bytes.len() < BODY_BYTES {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Ok(Ok(Some(chunk))) => bytes.extend_from_slice(&chunk),
            _ => break,
        }
    }
    bytes.truncate(BODY_BYTES);
    Answer {
        status,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// Whether an answer is what `expect` says; a 404 where "not denied" was expected counts as
/// not denied when the operator gets the same 404 (the thing asked for is not there).
async fn fits(world: &World, op: &Operation, path: &str, expect: Expect, got: &Answer) -> bool {
    let status = got.status;
    match expect {
        Expect::Hidden => status == StatusCode::NOT_FOUND,
        Expect::Forbidden => status == StatusCode::FORBIDDEN,
        Expect::Unauthorized => status == StatusCode::UNAUTHORIZED,
        Expect::NotDenied => match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => false,
            StatusCode::NOT_FOUND => {
                let body = world.body(op);
                let operator = send(
                    &world.server.api,
                    Some(OPERATOR),
                    op.method.clone(),
                    path,
                    body.as_ref().into(),
                )
                .await;
                operator.status == StatusCode::NOT_FOUND
            }
            _ => true,
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_denies_every_principal_the_contract_keeps_out() {
    let document = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi.yaml"))
        .expect("read openapi.yaml");
    let mut operations = operations(&document);
    // A cancel ends the waiting run, and with it the approval and the client call the
    // interact token answers: it is walked after the rest, so that those answers reach a
    // waiting call; the session's deletion is walked last of all.
    operations.sort_by_key(|op| match (&op.method, op.path.as_str()) {
        (&Method::DELETE, "/v1/sessions/{id}" | "/v1/schedules/{id}") => 2,
        (_, path) if path.ends_with("/cancel") => 1,
        _ => 0,
    });

    let mut unknown = Vec::new();
    let mut classified = Vec::new();
    for op in &operations {
        match class_of(op) {
            Some(class) => classified.push((op.clone(), class)),
            None => unknown.push(format!("{op}: no route class of the contract")),
        }
    }

    let world = world().await;
    let mut faults = Vec::new();
    let mut rows = Vec::new();
    for (op, class) in &classified {
        let path = match world.concrete(op) {
            Ok(path) => path,
            Err(why) => {
                unknown.push(format!("{op}: {why}"));
                continue;
            }
        };
        let body = world.body(op);
        let mut cells = Vec::new();
        for who in EVERYONE {
            let expect = expected(*class, who);
            let credential = world.credentials[&who].as_deref();
            let got = send(
                &world.server.api,
                credential,
                op.method.clone(),
                &path,
                body.as_ref().into(),
            )
            .await;
            let fine = fits(&world, op, &path, expect, &got).await;
            let status = got.status.as_u16();
            // A denial on a session's route comes before its body is read: a body that does
            // not parse is denied alike.
            let malformed = if fine
                && expect != Expect::NotDenied
                && body.is_some()
                && op.path.starts_with("/v1/sessions/{id}/")
            {
                let again = send(
                    &world.server.api,
                    credential,
                    op.method.clone(),
                    &path,
                    Payload::Malformed,
                )
                .await;
                (again.status != got.status).then_some(again)
            } else {
                None
            };
            if let Some(again) = malformed {
                let other = again.status.as_u16();
                cells.push(format!("**{other}** (bad body; want {})", expect.label()));
                let body: String = again.body.chars().take(300).collect();
                faults.push(format!(
                    "{op} as {}: {status} with a valid body, but {other} with a malformed one: \
                     {body}",
                    who.label()
                ));
            } else if fine {
                cells.push(status.to_string());
            } else {
                cells.push(format!("**{status}** (want {})", expect.label()));
                let body: String = got.body.chars().take(300).collect();
                faults.push(format!(
                    "{op} as {}: expected {}, got {status}: {body}",
                    who.label(),
                    expect.label()
                ));
            }
        }
        rows.push((op.to_string(), format!("{class:?}"), cells));
    }

    let matrix = matrix(&rows, operations.len(), &faults, &unknown);
    println!("{matrix}");
    let target = std::env::var("CARGO_TARGET_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/target").to_string());
    let file = std::path::Path::new(&target).join("principals-matrix.md");
    std::fs::create_dir_all(&target).expect("create the target directory");
    std::fs::write(&file, &matrix).unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
    eprintln!("the matrix is in {}", file.display());

    assert!(
        unknown.is_empty(),
        "the walk cannot try {} operations of openapi.yaml:\n- {}",
        unknown.len(),
        unknown.join("\n- ")
    );
    assert!(
        faults.is_empty(),
        "{} answers break the contract:\n- {}",
        faults.len(),
        faults.join("\n- ")
    );
}

/// The matrix as Markdown.
fn matrix(
    rows: &[(String, String, Vec<String>)],
    operations: usize,
    faults: &[String],
    unknown: &[String],
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Route × principal\n\n{operations} operations of openapi.yaml, {} walked; {} answers \
         break the contract (in bold, with what it says); {} operations could not be walked.\n\
         \"not denied\" is any status but 401, 403, and a 404 the operator does not get too. \
         Every denial on a session's route with a body was also sent with a body that does not \
         parse, and must be denied alike. The last three columns may do everything they are \
         walked on: what one of them deletes is a 404 for those after it.\n",
        rows.len(),
        faults.len(),
        unknown.len()
    );
    let _ = write!(out, "| operation | class |");
    for who in EVERYONE {
        let _ = write!(out, " {} |", who.label());
    }
    let _ = write!(out, "\n|---|---|");
    for _ in EVERYONE {
        let _ = write!(out, "---|");
    }
    out.push('\n');
    for (op, class, cells) in rows {
        let _ = writeln!(out, "| `{op}` | {class} | {} |", cells.join(" | "));
    }
    for line in unknown {
        let _ = writeln!(out, "\nNot walked: {line}");
    }
    out
}

#[test]
fn the_walk_reads_every_operation_of_the_document() {
    let mut document =
        "openapi: 3.1.0\npaths:\n  /a:\n    parameters:\n      - x\n    get:\n      \
                        tags: [t]\n    post:\n      summary: s\n  /b/{id}:\n    delete:\n      \
                        x: y\n"
            .to_string();
    for n in 0..10 {
        document += &format!("  /p{n}:\n    get:\n      summary: s\n");
    }
    document += "components:\n  /c:\n    get:\n";
    let ops: Vec<String> = operations(&document)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(&ops[..3], ["GET /a", "POST /a", "DELETE /b/{id}"]);
    assert_eq!(ops.len(), 13, "{ops:?}");
}
