//! A small HTTP client for one replica, and an SSE subscriber that records every event with
//! the instant it arrived.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What a request produced.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub content_type: String,
    /// The JSON body, the text as a JSON string, or null when empty.
    pub body: Value,
}

#[derive(Clone)]
pub struct Api {
    pub name: &'static str,
    pub base: String,
    pub http: reqwest::Client,
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
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// One request; `Err` is a transport error.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Reply, String> {
        let mut request = self
            .http
            .request(method.clone(), self.url(path))
            .timeout(REQUEST_TIMEOUT);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("{} {method} {path}: {e:#}", self.name))?;
        let status = response.status();
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| format!("{} {method} {path}: reading the body: {e:#}", self.name))?;
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        Ok(Reply {
            status,
            content_type,
            body,
        })
    }

    /// A request that must answer `expected`.
    pub async fn expect(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        expected: StatusCode,
    ) -> Value {
        match self.call(method.clone(), path, body).await {
            Ok(reply) if reply.status == expected => reply.body,
            Ok(reply) => panic!(
                "{} {method} {path}: expected {expected}, got {} {}",
                self.name, reply.status, reply.body
            ),
            Err(e) => panic!("{e}"),
        }
    }

    pub async fn get(&self, path: &str) -> Value {
        self.expect(Method::GET, path, None, StatusCode::OK).await
    }

    pub async fn create_session(&self) -> String {
        let session = self
            .expect(
                Method::POST,
                "/v1/sessions",
                Some(&json!({"title": "replicas"})),
                StatusCode::CREATED,
            )
            .await;
        session["id"]
            .as_str()
            .unwrap_or_else(|| panic!("the new session has no id: {session}"))
            .to_string()
    }

    /// Starts a run (202); returns the Run.
    pub async fn start_run(&self, id: &str, input: &str) -> Value {
        self.expect(
            Method::POST,
            &format!("/v1/sessions/{id}/runs"),
            Some(&json!({ "input": input })),
            StatusCode::ACCEPTED,
        )
        .await
    }

    /// Runs a turn to its end (`?wait=true`); returns the RunResult.
    pub async fn run_wait(&self, id: &str, input: &str) -> Value {
        self.expect(
            Method::POST,
            &format!("/v1/sessions/{id}/runs?wait=true"),
            Some(&json!({ "input": input })),
            StatusCode::OK,
        )
        .await
    }

    pub async fn session(&self, id: &str) -> Value {
        self.get(&format!("/v1/sessions/{id}")).await
    }

    /// Every item of a paged list (pages of 500), following `next_cursor`.
    pub async fn pages(&self, path: &str, cursor_param: &str) -> Vec<Value> {
        let sep = if path.contains('?') { '&' } else { '?' };
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..10_000 {
            let url = match &cursor {
                None => format!("{path}{sep}limit=500"),
                Some(c) => format!("{path}{sep}limit=500&{cursor_param}={c}"),
            };
            let page = self.get(&url).await;
            out.extend(
                page["data"]
                    .as_array()
                    .unwrap_or_else(|| panic!("{} {url}: no data array: {page}", self.name))
                    .iter()
                    .cloned(),
            );
            match &page["next_cursor"] {
                Value::String(next) => cursor = Some(next.clone()),
                Value::Number(next) => cursor = Some(next.to_string()),
                Value::Null => return out,
                other => panic!("{} {url}: odd next_cursor {other}", self.name),
            }
        }
        panic!("{} {path}: paging does not end", self.name)
    }

    /// The session's whole event log (JSON pages).
    pub async fn events(&self, id: &str) -> Vec<Value> {
        self.pages(&format!("/v1/sessions/{id}/events"), "after")
            .await
    }

    pub async fn runs(&self, id: &str) -> Vec<Value> {
        self.pages(&format!("/v1/sessions/{id}/runs"), "cursor")
            .await
    }

    pub async fn messages(&self, id: &str) -> Vec<Value> {
        self.pages(&format!("/v1/sessions/{id}/messages"), "after")
            .await
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
}

type Frames = Pin<
    Box<
        dyn Stream<Item = Result<eventsource_stream::Event, EventStreamError<reqwest::Error>>>
            + Send,
    >,
>;

/// One event as a subscriber received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub event: Value,
    pub at: Instant,
}

impl Seen {
    pub fn kind(&self) -> &str {
        self.event["type"].as_str().unwrap_or("")
    }

    pub fn seq(&self) -> i64 {
        self.event["seq"].as_i64().unwrap_or(-1)
    }
}

#[derive(Default)]
struct Record {
    seen: Vec<Seen>,
    /// Frames whose `id:`/`event:` disagree with their data, or that are not JSON.
    bad_frames: Vec<String>,
    /// Why the stream ended, if it did.
    ended: Option<String>,
}

/// An SSE subscriber to a session's events (`GET /events`, `Accept: text/event-stream`), from
/// the start of the log, recording until dropped.
pub struct Subscriber {
    pub label: String,
    record: Arc<Mutex<Record>>,
    changed: watch::Receiver<usize>,
    task: JoinHandle<()>,
}

impl Subscriber {
    /// Connects; returns once the server has answered (it is subscribed by then).
    pub async fn open(api: &Api, id: &str, label: &str) -> Subscriber {
        let path = format!("/v1/sessions/{id}/events");
        let response = api
            .http
            .get(api.url(&path))
            .header(ACCEPT, "text/event-stream")
            .send()
            .await
            .unwrap_or_else(|e| panic!("{label}: GET {path} (SSE): {e:#}"));
        let status = response.status();
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        if status != StatusCode::OK || !content_type.starts_with("text/event-stream") {
            let body = response.text().await.unwrap_or_default();
            panic!("{label}: GET {path} (SSE): {status} {content_type:?} {body}");
        }
        let mut frames: Frames = Box::pin(response.bytes_stream().eventsource());
        let record: Arc<Mutex<Record>> = Arc::default();
        let (tx, changed) = watch::channel(0usize);
        let task = {
            let record = record.clone();
            tokio::spawn(async move {
                loop {
                    let frame = frames.next().await;
                    let at = Instant::now();
                    let mut r = record.lock().unwrap_or_else(|e| e.into_inner());
                    match frame {
                        None => {
                            r.ended = Some("the server ended the stream".to_string());
                        }
                        Some(Err(e)) => {
                            r.ended = Some(format!("the stream broke: {e}"));
                        }
                        Some(Ok(frame)) => match serde_json::from_str::<Value>(&frame.data) {
                            Ok(event) => {
                                let seq = event["seq"].as_i64().unwrap_or(-1);
                                if frame.id != seq.to_string()
                                    || event["type"].as_str() != Some(frame.event.as_str())
                                {
                                    r.bad_frames.push(format!(
                                        "id {:?} / event {:?} vs data {event}",
                                        frame.id, frame.event
                                    ));
                                }
                                r.seen.push(Seen { event, at });
                            }
                            Err(e) => r
                                .bad_frames
                                .push(format!("data is not JSON ({e}): {frame:?}")),
                        },
                    }
                    let n = r.seen.len();
                    let over = r.ended.is_some();
                    drop(r);
                    let _ = tx.send(n);
                    if over {
                        return;
                    }
                }
            })
        };
        Subscriber {
            label: label.to_string(),
            record,
            changed,
            task,
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .seen
            .clone()
    }

    pub fn events(&self) -> Vec<Value> {
        self.seen().into_iter().map(|s| s.event).collect()
    }

    /// Frames that were malformed or disagreed with their data.
    pub fn bad_frames(&self) -> Vec<String> {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .bad_frames
            .clone()
    }

    /// Waits until what was received satisfies `done`; panics after `limit` (or when the
    /// stream ends first) with what was received.
    pub async fn wait_for(
        &mut self,
        what: &str,
        limit: Duration,
        done: impl Fn(&[Seen]) -> bool,
    ) -> Vec<Seen> {
        match self.try_wait_for(limit, done).await {
            Ok(seen) => seen,
            Err((problem, seen)) => panic!(
                "{}: {problem} \"{what}\"; received {} events:\n{}",
                self.label,
                seen.len(),
                crate::checks::describe(&seen.into_iter().map(|s| s.event).collect::<Vec<_>>())
            ),
        }
    }

    /// Waits until what was received satisfies `done`: `Err` with why and what was received
    /// after `limit`, or when the stream ended first.
    pub async fn try_wait_for(
        &mut self,
        limit: Duration,
        done: impl Fn(&[Seen]) -> bool,
    ) -> Result<Vec<Seen>, (String, Vec<Seen>)> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let (seen, ended) = {
                let r = self.record.lock().unwrap_or_else(|e| e.into_inner());
                if done(&r.seen) {
                    return Ok(r.seen.clone());
                }
                (r.seen.clone(), r.ended.clone())
            };
            match ended {
                Some(why) => return Err((format!("{why} before"), seen)),
                None if tokio::time::Instant::now() >= deadline => {
                    return Err((format!("nothing satisfied within {limit:?}:"), seen))
                }
                None => {}
            }
            let _ = tokio::time::timeout_at(deadline, self.changed.changed()).await;
        }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// True once `seen` holds a terminal event (`agent.finished|failed|cancelled`) of any run, or
/// of `run_id` when given.
pub fn has_terminal(seen: &[Seen], run_id: Option<&str>) -> bool {
    seen.iter().any(|s| {
        crate::checks::is_terminal(&s.event)
            && run_id.is_none_or(|r| s.event["data"]["run_id"].as_str() == Some(r))
    })
}

/// How many token deltas (`agent.assistant-stream`) `seen` holds.
pub fn deltas(seen: &[Seen]) -> usize {
    seen.iter()
        .filter(|s| s.kind() == "agent.assistant-stream")
        .count()
}
