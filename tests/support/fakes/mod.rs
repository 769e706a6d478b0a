//! A fake LLM provider for tests: an axum server on `127.0.0.1:0` that answers with scripted
//! responses byte for byte (status, headers, body chunks with delays, or a connection cut
//! after some chunks), records every request it receives, and notices when a client drops a
//! response mid-body. Builders for the SSE bodies of text and tool-call replies in the OpenAI
//! and Anthropic formats live in [`openai`] and [`anthropic`].
//!
//! Every request is also checked the way the real providers check it: each tool call of an
//! assistant message must be answered by a tool result before the conversation goes on (see
//! [`tool_call_violation`]), and an Anthropic request asking for extended thinking must keep
//! its rules (see [`anthropic::thinking_violation`]). A request that breaks a rule gets a 400
//! naming the problem, and the fake fails the test when it is dropped, so no test can forget
//! the check.

pub mod anthropic;
pub mod openai;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::Response;
use serde_json::Value;

/// A piece of a response body, sent after waiting `delay`.
#[derive(Debug, Clone)]
pub struct Chunk {
    pub delay: Duration,
    pub bytes: Bytes,
}

impl Chunk {
    pub fn new(bytes: impl Into<Bytes>) -> Chunk {
        Chunk {
            delay: Duration::ZERO,
            bytes: bytes.into(),
        }
    }
}

/// One scripted response.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A complete response.
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        chunks: Vec<Chunk>,
    },
    /// A 200 event stream that sends `chunks` and then cuts the connection (the chunked body
    /// never terminates, so the client sees a broken body).
    Cut { chunks: Vec<Chunk> },
}

impl Reply {
    /// A 200 event stream sent as one chunk.
    pub fn sse(body: impl Into<String>) -> Reply {
        Reply::sse_chunks(vec![body.into()])
    }

    /// A 200 event stream sent as the given network chunks.
    pub fn sse_chunks<B: Into<Bytes>>(chunks: Vec<B>) -> Reply {
        Reply::Respond {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            chunks: chunks.into_iter().map(Chunk::new).collect(),
        }
    }

    /// A 200 event stream whose body is split into one chunk per SSE event.
    pub fn sse_events(body: &str) -> Reply {
        Reply::sse_chunks(split_events(body))
    }

    /// A response with the given status and body (content type JSON).
    pub fn status(status: u16, body: impl Into<String>) -> Reply {
        Reply::Respond {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            chunks: vec![Chunk::new(body.into())],
        }
    }

    /// A 200 event stream that sends `chunks` and then cuts the connection.
    pub fn cut<B: Into<Bytes>>(chunks: Vec<B>) -> Reply {
        Reply::Cut {
            chunks: chunks.into_iter().map(Chunk::new).collect(),
        }
    }

    /// Adds a response header (no effect on a cut).
    pub fn with_header(mut self, name: &str, value: &str) -> Reply {
        if let Reply::Respond { headers, .. } = &mut self {
            headers.push((name.to_string(), value.to_string()));
        }
        self
    }

    /// Waits `delay` before every chunk but the first.
    pub fn with_delay(mut self, delay: Duration) -> Reply {
        let chunks = match &mut self {
            Reply::Respond { chunks, .. } | Reply::Cut { chunks } => chunks,
        };
        for chunk in chunks.iter_mut().skip(1) {
            chunk.delay = delay;
        }
        self
    }

    /// Waits `delay` before the first chunk (after the headers were sent).
    pub fn with_first_delay(mut self, delay: Duration) -> Reply {
        let chunks = match &mut self {
            Reply::Respond { chunks, .. } | Reply::Cut { chunks } => chunks,
        };
        if let Some(first) = chunks.first_mut() {
            first.delay = delay;
        }
        self
    }
}

/// A request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    /// Header names lowercased.
    pub headers: HashMap<String, String>,
    /// The JSON body (a string value when the body was not JSON).
    pub body: Value,
}

/// The API a fake imitates; it decides the path it answers on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    /// `POST /v1/chat/completions`, base URL `http://addr/v1`.
    OpenAi,
    /// `POST /v1/messages`, base URL `http://addr`.
    Anthropic,
}

struct Shared {
    flavor: Flavor,
    script: Mutex<VecDeque<Reply>>,
    last: Mutex<Option<Reply>>,
    requests: Mutex<Vec<Recorded>>,
    /// Requests whose tool calls were not answered, said in a sentence each.
    violations: Mutex<Vec<String>>,
    aborted: AtomicUsize,
}

/// A running fake provider; it stops when dropped.
pub struct FakeServer {
    /// The base URL to configure a client with.
    pub base_url: String,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.task.abort();
        let violations = self.violations();
        if violations.is_empty() {
            return;
        }
        let report = format!(
            "the fake provider received requests with unanswered tool calls:\n- {}",
            violations.join("\n- ")
        );
        if std::thread::panicking() {
            eprintln!("{report}");
        } else {
            panic!("{report}");
        }
    }
}

/// Starts a fake OpenAI-compatible server (`{base_url}/chat/completions`).
pub async fn start_openai(script: Vec<Reply>) -> FakeServer {
    start(Flavor::OpenAi, script).await
}

/// Starts a fake Anthropic server (`{base_url}/v1/messages`).
pub async fn start_anthropic(script: Vec<Reply>) -> FakeServer {
    start(Flavor::Anthropic, script).await
}

/// Starts a fake that answers the requests with `script` in order; once the script is used up
/// it repeats its last entry (so `[500]` is "500 forever").
pub async fn start(flavor: Flavor, script: Vec<Reply>) -> FakeServer {
    let shared = Arc::new(Shared {
        flavor,
        script: Mutex::new(script.into()),
        last: Mutex::new(None),
        requests: Mutex::new(Vec::new()),
        violations: Mutex::new(Vec::new()),
        aborted: AtomicUsize::new(0),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the fake provider");
    let addr = listener.local_addr().expect("the fake's address");
    let state = Arc::clone(&shared);
    let app = axum::Router::new().fallback(move |uri: Uri, headers: HeaderMap, body: Bytes| {
        let state = Arc::clone(&state);
        async move { handle(state, uri, headers, body) }
    });
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let base_url = match flavor {
        Flavor::OpenAi => format!("http://{addr}/v1"),
        Flavor::Anthropic => format!("http://{addr}"),
    };
    FakeServer {
        base_url,
        shared,
        task,
    }
}

impl FakeServer {
    /// Every request received so far, in order. Panics if any broke the tool-call rule.
    pub fn requests(&self) -> Vec<Recorded> {
        let violations = self.violations();
        assert!(
            violations.is_empty(),
            "requests with unanswered tool calls:\n- {}",
            violations.join("\n- ")
        );
        self.shared.requests.lock().expect("requests lock").clone()
    }

    /// The requests that broke the tool-call rule, said in a sentence each.
    pub fn violations(&self) -> Vec<String> {
        self.shared
            .violations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn request_count(&self) -> usize {
        self.shared.requests.lock().expect("requests lock").len()
    }

    /// The body of the `n`-th request (0-based).
    pub fn body(&self, n: usize) -> Value {
        self.requests()[n].body.clone()
    }

    /// Appends replies to the script.
    pub fn push(&self, reply: Reply) {
        self.shared
            .script
            .lock()
            .expect("script lock")
            .push_back(reply);
    }

    /// How many response bodies were dropped by the client before they were complete.
    pub fn aborted_count(&self) -> usize {
        self.shared.aborted.load(Ordering::SeqCst)
    }

    /// Waits until a client dropped a response mid-body; false after `within`.
    pub async fn wait_aborted(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            if self.aborted_count() > 0 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.aborted_count() > 0
    }
}

fn handle(state: Arc<Shared>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    let violation = tool_call_violation(state.flavor, &body).or_else(|| match state.flavor {
        Flavor::Anthropic => anthropic::thinking_violation(&body),
        Flavor::OpenAi => None,
    });
    state
        .requests
        .lock()
        .expect("requests lock")
        .push(Recorded {
            path: uri.path().to_string(),
            headers: headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_ascii_lowercase(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body,
        });
    let expected = match state.flavor {
        Flavor::OpenAi => "/v1/chat/completions",
        Flavor::Anthropic => "/v1/messages",
    };
    if uri.path() != expected {
        return respond(
            &state,
            Reply::status(
                404,
                format!(r#"{{"error":{{"message":"no route for {}"}}}}"#, uri.path()),
            ),
        );
    }
    if let Some(violation) = violation {
        eprintln!("fake provider: {violation}");
        state
            .violations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(violation.clone());
        let message =
            serde_json::json!({"error": {"message": format!("fake provider: {violation}")}});
        return respond(&state, Reply::status(400, message.to_string()));
    }
    let next = state.script.lock().expect("script lock").pop_front();
    let reply = match next {
        Some(reply) => {
            *state.last.lock().expect("last lock") = Some(reply.clone());
            reply
        }
        None => state
            .last
            .lock()
            .expect("last lock")
            .clone()
            .unwrap_or_else(|| Reply::status(500, r#"{"error":{"message":"empty script"}}"#)),
    };
    respond(&state, reply)
}

/// Counts a response body as aborted when it is dropped before it was sent completely.
struct BodyGuard {
    state: Arc<Shared>,
    finished: bool,
}

impl Drop for BodyGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.state.aborted.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn respond(state: &Arc<Shared>, reply: Reply) -> Response {
    let (status, headers, chunks, cut) = match reply {
        Reply::Respond {
            status,
            headers,
            chunks,
        } => (status, headers, chunks, false),
        Reply::Cut { chunks } => (
            200,
            vec![("content-type".into(), "text/event-stream".into())],
            chunks,
            true,
        ),
    };
    let guard = BodyGuard {
        state: Arc::clone(state),
        finished: false,
    };
    let chunks: VecDeque<Chunk> = chunks.into();
    let body = futures::stream::unfold(
        (chunks, guard, false),
        move |(mut chunks, mut guard, ended)| async move {
            if ended {
                return None;
            }
            match chunks.pop_front() {
                Some(chunk) => {
                    if !chunk.delay.is_zero() {
                        tokio::time::sleep(chunk.delay).await;
                    }
                    Some((Ok(chunk.bytes), (chunks, guard, false)))
                }
                None => {
                    guard.finished = true;
                    if cut {
                        // Let the chunks reach the client before the connection is cut.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        let err = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "cut");
                        Some((Err(err), (chunks, guard, true)))
                    } else {
                        None
                    }
                }
            }
        },
    );
    let mut response = Response::new(Body::from_stream(body));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::from_bytes(name.as_bytes()),
            axum::http::HeaderValue::from_str(&value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    response
}

/// Splits an SSE body after each blank line: one chunk per event.
pub fn split_events(body: &str) -> Vec<String> {
    body.split_inclusive("\n\n").map(str::to_string).collect()
}

/// Splits a body into chunks of `size` bytes, regardless of characters.
pub fn split_bytes(body: &str, size: usize) -> Vec<Bytes> {
    body.as_bytes()
        .chunks(size.max(1))
        .map(Bytes::copy_from_slice)
        .collect()
}

/// Splits a body inside every multi-byte character (before each continuation byte).
pub fn split_inside_chars(body: &str) -> Vec<Bytes> {
    let bytes = body.as_bytes();
    let mut chunks = Vec::new();
    let mut start = 0;
    for (i, b) in bytes.iter().enumerate() {
        if i > start && (b & 0xC0) == 0x80 {
            chunks.push(Bytes::copy_from_slice(&bytes[start..i]));
            start = i;
        }
    }
    chunks.push(Bytes::copy_from_slice(&bytes[start..]));
    chunks
}

/// A tool call in a scripted reply; its arguments arrive in the given pieces.
#[derive(Debug, Clone)]
pub struct FakeToolCall {
    pub id: String,
    pub name: String,
    pub argument_pieces: Vec<String>,
}

impl FakeToolCall {
    pub fn new(id: &str, name: &str, argument_pieces: &[&str]) -> FakeToolCall {
        FakeToolCall {
            id: id.to_string(),
            name: name.to_string(),
            argument_pieces: argument_pieces.iter().map(|p| p.to_string()).collect(),
        }
    }

    /// A call whose JSON arguments arrive in one piece.
    pub fn whole(id: &str, name: &str, arguments: &Value) -> FakeToolCall {
        FakeToolCall::new(id, name, &[&arguments.to_string()])
    }
}

/// The usage every scripted reply reports.
pub const INPUT_TOKENS: u64 = 11;
pub const OUTPUT_TOKENS: u64 = 7;

/// What breaks the providers' rule in a request body, if anything: every tool call of an
/// assistant message is answered by a tool result before the next assistant or user message
/// (OpenAI: `role: "tool"` messages right after it; Anthropic: `tool_result` blocks in the
/// next, user, message), every result answers such a call, and no call is left open at the end.
pub fn tool_call_violation(flavor: Flavor, body: &Value) -> Option<String> {
    let messages = body["messages"].as_array()?;
    let mut open: Vec<String> = Vec::new();
    let mut opened_at = 0;
    let unanswered = |open: &[String], at: usize, before: &str| {
        format!("tool calls {open:?} of message {at} are not answered before {before}")
    };
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or("");
        match flavor {
            Flavor::OpenAi if role == "tool" => {
                let id = m["tool_call_id"].as_str().unwrap_or("");
                match open.iter().position(|c| c == id) {
                    Some(at) => {
                        open.remove(at);
                    }
                    None => {
                        return Some(format!(
                            "tool message {i} answers {id:?}, not an open call of the assistant message before it"
                        ))
                    }
                }
            }
            Flavor::OpenAi => {
                if !open.is_empty() {
                    return Some(unanswered(&open, opened_at, &format!("message {i}")));
                }
                if role == "assistant" {
                    open = m["tool_calls"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|c| c["id"].as_str().unwrap_or("").to_string())
                        .collect();
                    opened_at = i;
                }
            }
            Flavor::Anthropic => {
                let blocks = m["content"].as_array().cloned().unwrap_or_default();
                let of_type = |kind: &str, field: &str| -> Vec<String> {
                    blocks
                        .iter()
                        .filter(|b| b["type"] == kind)
                        .map(|b| b[field].as_str().unwrap_or("").to_string())
                        .collect()
                };
                if role == "assistant" {
                    if !open.is_empty() {
                        return Some(unanswered(&open, opened_at, &format!("message {i}")));
                    }
                    open = of_type("tool_use", "id");
                    opened_at = i;
                } else {
                    for id in of_type("tool_result", "tool_use_id") {
                        match open.iter().position(|c| *c == id) {
                            Some(at) => {
                                open.remove(at);
                            }
                            None => {
                                return Some(format!(
                                    "a tool_result in message {i} answers {id:?}, not a tool_use of the message before it"
                                ))
                            }
                        }
                    }
                    if !open.is_empty() {
                        return Some(unanswered(
                            &open,
                            opened_at,
                            &format!("the end of message {i}"),
                        ));
                    }
                }
            }
        }
    }
    (!open.is_empty()).then(|| unanswered(&open, opened_at, "the end of the request"))
}
