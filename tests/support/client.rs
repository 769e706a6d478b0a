//! One HTTP client for the server under test: plain requests that either panic on a transport
//! error (`send`, `get`, …) or return it (`call`), whole answers as [`Reply`], every page of a
//! list, and the API's domain requests (create a session, run a turn, cancel, …). SSE
//! subscriptions are in [`crate::support::sse`].

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderMap, CONTENT_TYPE};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::support::checks::id_of;

/// How long a plain request may take; `?wait=true` runs get [`RUN_TIMEOUT`].
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
/// Items per page when a whole list is read, unless [`Api::paged_by`] says otherwise.
const PAGE: usize = 20;

/// A whole HTTP answer, read.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    /// The body as received.
    pub bytes: Bytes,
    /// The body as JSON; a body that is not JSON as a JSON string; an empty body as null.
    pub body: Value,
}

impl Reply {
    pub fn content_type(&self) -> String {
        self.headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    /// The JSON body; panics if the body is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.bytes)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }

    /// Asserts the status and returns the JSON body.
    pub fn expect_json(&self, status: StatusCode, what: &str) -> Value {
        self.assert_status(status, what);
        self.json()
    }

    /// Asserts a problem+json answer with this status and a non-empty `detail`; returns it.
    pub fn expect_problem(&self, status: StatusCode, what: &str) -> Value {
        self.assert_status(status, what);
        check_problem(self).unwrap_or_else(|e| panic!("{what}: {e}"))
    }

    #[track_caller]
    fn assert_status(&self, status: StatusCode, what: &str) {
        assert_eq!(
            self.status,
            status,
            "{what}: expected {status}, got {} with {}",
            self.status,
            self.text()
        );
    }
}

/// Checks that an answer is a problem+json document with a human-readable `detail`.
pub fn check_problem(reply: &Reply) -> Result<Value, String> {
    let content_type = reply.content_type();
    if !content_type.starts_with("application/problem+json") {
        return Err(format!(
            "content type is {content_type:?}, not application/problem+json; body {}",
            reply.text()
        ));
    }
    let problem: Value = serde_json::from_slice(&reply.bytes)
        .map_err(|e| format!("problem body is not JSON ({e}): {}", reply.text()))?;
    match problem.get("detail").and_then(Value::as_str) {
        Some(detail) if !detail.trim().is_empty() => {}
        _ => return Err(format!("problem has no detail: {problem}")),
    }
    if problem.get("status").and_then(Value::as_u64) != Some(u64::from(reply.status.as_u16())) {
        return Err(format!(
            "problem status does not match the HTTP status {}: {problem}",
            reply.status
        ));
    }
    Ok(problem)
}

/// A 409 problem whose `type` names the conflict.
pub fn assert_conflict(reply: &Reply, what: &str) {
    let problem = reply.expect_problem(StatusCode::CONFLICT, what);
    let kind = problem["type"].as_str().unwrap_or("");
    assert!(
        !kind.is_empty() && kind != "about:blank",
        "{what}: the problem type does not name the conflict: {problem}"
    );
}

/// A client of one server. Cheap to clone (the connection pool is shared).
#[derive(Clone)]
pub struct Api {
    /// Names the server in messages (`A`, `B` for replicas).
    pub name: &'static str,
    /// `http://host:port`.
    pub base: String,
    pub http: reqwest::Client,
    page: usize,
    /// The credential every request sends as `Authorization: Bearer`, if any.
    bearer: Option<String>,
}

impl Api {
    pub fn new(name: &'static str, base: &str) -> Api {
        Api {
            name,
            base: base.to_string(),
            http: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(5))
                .build()
                .expect("build the HTTP client"),
            page: PAGE,
            bearer: None,
        }
    }

    /// The same client, sending `token` as `Authorization: Bearer` on every request (a
    /// deployment token, a key or a session token).
    pub fn with_bearer(&self, token: &str) -> Api {
        Api {
            bearer: Some(token.to_string()),
            ..self.clone()
        }
    }

    /// The same client, sending no credential.
    pub fn anonymous(&self) -> Api {
        Api {
            bearer: None,
            ..self.clone()
        }
    }

    /// Reads whole lists `limit` items at a time (the default, 20, exercises paging; suites
    /// that read thousands of events use more).
    pub fn paged_by(mut self, limit: usize) -> Api {
        self.page = limit;
        self
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let timeout = if path.contains("wait=true") {
            RUN_TIMEOUT
        } else {
            REQUEST_TIMEOUT
        };
        self.authorized(self.http.request(method, self.url(path)).timeout(timeout))
    }

    /// `request` with this client's credential, if it has one.
    pub fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.bearer {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Sends a request and reads the whole answer; `Err` is a transport error (no HTTP answer).
    pub async fn try_send(&self, request: reqwest::RequestBuilder) -> Result<Reply, String> {
        let response = request.send().await.map_err(|e| format!("{e:#}"))?;
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| format!("reading the body: {e:#}"))?;
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        Ok(Reply {
            status,
            headers,
            bytes,
            body,
        })
    }

    /// Sends a request and reads the whole answer; panics on a transport error.
    pub async fn send(&self, request: reqwest::RequestBuilder) -> Reply {
        self.try_send(request)
            .await
            .unwrap_or_else(|e| panic!("{}: request failed: {e}", self.name))
    }

    /// One request with an optional JSON body; `Err` is a transport error.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Reply, String> {
        let mut request = self.request(method.clone(), path);
        if let Some(body) = body {
            request = request.json(body);
        }
        self.try_send(request)
            .await
            .map_err(|e| format!("{} {method} {path}: {e}", self.name))
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(self.request(Method::GET, path)).await
    }

    /// GET that must answer 200 with JSON.
    pub async fn get_ok(&self, path: &str) -> Value {
        self.get(path).await.expect_json(StatusCode::OK, path)
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Reply {
        self.send(self.request(Method::POST, path).json(body)).await
    }

    /// A POST without any body (and so without a content type).
    pub async fn post_empty(&self, path: &str) -> Reply {
        self.send(self.request(Method::POST, path)).await
    }

    // ---- domain requests -------------------------------------------------------------------

    /// Creates a session with no options; returns its id.
    pub async fn create_session(&self) -> String {
        let session = self.create_session_with(&json!({})).await;
        id_of(&session)
    }

    pub async fn create_session_with(&self, body: &Value) -> Value {
        self.post_json("/v1/sessions", body)
            .await
            .expect_json(StatusCode::CREATED, "POST /v1/sessions")
    }

    /// `POST /v1/sessions` that may fail (a server being killed): the reply or the error.
    pub async fn try_create_session(&self) -> Result<Reply, String> {
        self.call(Method::POST, "/v1/sessions", Some(&json!({})))
            .await
    }

    pub async fn session(&self, id: &str) -> Value {
        self.get_ok(&format!("/v1/sessions/{id}")).await
    }

    /// `POST /runs` in default mode, whatever it answers (a refusal is an answer too).
    pub async fn post_run(&self, id: &str, input: &str) -> Reply {
        self.post_json(
            &format!("/v1/sessions/{id}/runs"),
            &json!({ "input": input }),
        )
        .await
    }

    /// `POST /runs?wait=true`, whatever it answers.
    pub async fn post_run_wait(&self, id: &str, input: &str) -> Reply {
        let path = format!("/v1/sessions/{id}/runs?wait=true");
        self.post_json(&path, &json!({ "input": input })).await
    }

    /// `POST /runs?wait=true`: must answer 200 with the RunResult.
    pub async fn run_wait(&self, id: &str, input: &str) -> Value {
        self.post_run_wait(id, input).await.expect_json(
            StatusCode::OK,
            &format!("POST /v1/sessions/{id}/runs?wait=true"),
        )
    }

    /// `POST /runs` in default mode: must answer 202 with the Run.
    pub async fn start_run(&self, id: &str, input: &str) -> Value {
        self.post_run(id, input).await.expect_json(
            StatusCode::ACCEPTED,
            &format!("POST /v1/sessions/{id}/runs"),
        )
    }

    /// `POST /resume?wait=true`: must answer 200 with the RunResult.
    pub async fn resume_wait(&self, id: &str) -> Value {
        let path = format!("/v1/sessions/{id}/resume?wait=true");
        self.post_empty(&path)
            .await
            .expect_json(StatusCode::OK, &path)
    }

    pub async fn cancel(&self, id: &str) -> Value {
        let path = format!("/v1/sessions/{id}/cancel");
        self.post_empty(&path)
            .await
            .expect_json(StatusCode::OK, &path)
    }

    /// Polls a run until it is no longer `running`.
    pub async fn wait_run(&self, id: &str, run_id: &str) -> Value {
        let path = format!("/v1/sessions/{id}/runs/{run_id}");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let run = self.get_ok(&path).await;
            if run["status"] != "running" {
                return run;
            }
            assert!(
                Instant::now() < deadline,
                "run {run_id} still running after 20 s: {run}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls the session until `done(session)` holds; panics after `limit`.
    pub async fn poll_session(
        &self,
        id: &str,
        what: &str,
        limit: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let session = self.session(id).await;
            if done(&session) {
                return session;
            }
            if Instant::now() > deadline {
                panic!(
                    "{}: session {id} did not reach \"{what}\" within {limit:?}; it is {session}",
                    self.name
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    // ---- lists -----------------------------------------------------------------------------

    /// Every item of a paged list, following `next_cursor` with `cursor_param`.
    pub async fn all_pages(&self, path: &str, cursor_param: &str, limit: usize) -> Vec<Value> {
        self.raw_pages(path, cursor_param, limit)
            .await
            .iter()
            .flat_map(|page| {
                let page: Value = serde_json::from_slice(page).expect("a JSON page");
                page["data"].as_array().expect("data is an array").clone()
            })
            .collect()
    }

    /// The raw bodies of every page of a paged list (for byte-for-byte comparisons).
    pub async fn raw_pages(&self, path: &str, cursor_param: &str, limit: usize) -> Vec<Bytes> {
        let sep = if path.contains('?') { '&' } else { '?' };
        let mut pages = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let url = match &cursor {
                None => format!("{path}{sep}limit={limit}"),
                Some(c) => format!("{path}{sep}limit={limit}&{cursor_param}={c}"),
            };
            let reply = self.get(&url).await;
            let page = reply.expect_json(StatusCode::OK, &url);
            assert!(page["data"].is_array(), "{url}: no data array: {page}");
            pages.push(reply.bytes.clone());
            assert!(pages.len() < 100_000, "{url}: paging does not end");
            match page.get("next_cursor") {
                Some(Value::String(next)) => {
                    assert_ne!(
                        cursor.as_deref(),
                        Some(next.as_str()),
                        "{url}: next_cursor repeats"
                    );
                    cursor = Some(next.clone());
                }
                None | Some(Value::Null) => break,
                Some(other) => panic!("{url}: next_cursor is not a string: {other}"),
            }
        }
        pages
    }

    /// Every item of a paged list, [`Api::paged_by`] items a page.
    pub async fn pages(&self, path: &str, cursor_param: &str) -> Vec<Value> {
        self.all_pages(path, cursor_param, self.page).await
    }

    /// The whole event log of a session, read page by page.
    pub async fn events(&self, id: &str) -> Vec<Value> {
        self.pages(&format!("/v1/sessions/{id}/events"), "after")
            .await
    }

    pub async fn messages(&self, id: &str) -> Vec<Value> {
        self.pages(&format!("/v1/sessions/{id}/messages"), "after")
            .await
    }

    pub async fn steps(&self, id: &str) -> Vec<Value> {
        self.pages(&format!("/v1/sessions/{id}/steps"), "cursor")
            .await
    }

    /// The views (`GET …/steps/{step}`) of a session's LLM steps, in order: each with the
    /// `projection` its request was built from and the `request` rebuilt from it.
    pub async fn llm_step_views(&self, id: &str) -> Vec<Value> {
        let mut views = Vec::new();
        for step in self.steps(id).await.iter().filter(|s| s["type"] == "llm") {
            let path = format!("/v1/sessions/{id}/steps/{}", id_of(step));
            views.push(self.get_ok(&path).await);
        }
        views
    }

    /// How many LLM calls a session's steps record.
    pub async fn llm_step_count(&self, id: &str) -> usize {
        let steps = self.steps(id).await;
        steps.iter().filter(|s| s["type"] == "llm").count()
    }

    pub async fn runs(&self, id: &str) -> Vec<Value> {
        self.pages(&format!("/v1/sessions/{id}/runs"), "cursor")
            .await
    }

    /// The child sessions (sub-agents) of a session, from `?parent_id=`.
    pub async fn children(&self, id: &str) -> Vec<Value> {
        self.pages(&format!("/v1/sessions?parent_id={id}"), "cursor")
            .await
    }

    pub async fn sessions(&self) -> Vec<Value> {
        self.pages("/v1/sessions", "cursor").await
    }
}
