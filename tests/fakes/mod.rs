//! A fake LLM provider for tests: an axum server on `127.0.0.1:0` that answers with scripted
//! responses byte for byte (status, headers, body chunks with delays, or a connection cut
//! after some chunks), records every request it receives, and notices when a client drops a
//! response mid-body. Builders for the SSE bodies of text and tool-call replies in the OpenAI
//! and Anthropic formats live in [`openai`] and [`anthropic`].
//!
//! Shared by every black-box test that needs a provider (`mod fakes;`), so that the whole
//! server can run against a real HTTP provider without the network.

#![allow(dead_code)]

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
    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.requests.lock().expect("requests lock").clone()
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
    let body = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
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

/// SSE bodies in the OpenAI Chat Completions streaming format.
pub mod openai {
    use serde_json::{json, Value};

    use super::FakeToolCall;

    pub const DONE: &str = "data: [DONE]\n\n";

    /// One `data:` chunk with a choice carrying `delta` and `finish_reason`.
    pub fn chunk(delta: Value, finish_reason: Option<&str>) -> String {
        data(json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "fake",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            "usage": null,
        }))
    }

    /// The final usage chunk (`choices: []`).
    pub fn usage_chunk(prompt_tokens: u64, completion_tokens: u64) -> String {
        data(json!({
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "fake",
            "choices": [],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }))
    }

    pub fn data(value: Value) -> String {
        format!("data: {value}\n\n")
    }

    /// A text reply streamed in `pieces`, then `stop`, the usage chunk and `[DONE]`.
    pub fn text_reply(pieces: &[&str]) -> String {
        let mut out = chunk(json!({"role": "assistant", "content": ""}), None);
        for piece in pieces {
            out.push_str(&chunk(json!({"content": piece}), None));
        }
        out.push_str(&chunk(json!({}), Some("stop")));
        out.push_str(&usage_chunk(super::INPUT_TOKENS, super::OUTPUT_TOKENS));
        out.push_str(DONE);
        out
    }

    /// A reply with optional text and tool calls: the first fragment of each call carries its
    /// id and name, later ones the argument pieces; then `tool_calls`, usage and `[DONE]`.
    pub fn tool_calls_reply(text: &str, calls: &[FakeToolCall]) -> String {
        let mut out = chunk(json!({"role": "assistant", "content": null}), None);
        if !text.is_empty() {
            out.push_str(&chunk(json!({"content": text}), None));
        }
        for (index, call) in calls.iter().enumerate() {
            out.push_str(&chunk(
                json!({"tool_calls": [{
                    "index": index,
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": ""},
                }]}),
                None,
            ));
            for piece in &call.argument_pieces {
                out.push_str(&chunk(
                    json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
                    None,
                ));
            }
        }
        out.push_str(&chunk(json!({}), Some("tool_calls")));
        out.push_str(&usage_chunk(super::INPUT_TOKENS, super::OUTPUT_TOKENS));
        out.push_str(DONE);
        out
    }
}

/// SSE bodies in the Anthropic Messages streaming format.
pub mod anthropic {
    use serde_json::{json, Value};

    use super::FakeToolCall;

    /// One typed event.
    pub fn event(name: &str, data: Value) -> String {
        format!("event: {name}\ndata: {data}\n\n")
    }

    pub fn ping() -> String {
        event("ping", json!({"type": "ping"}))
    }

    pub fn message_start(input_tokens: u64) -> String {
        event(
            "message_start",
            json!({"type": "message_start", "message": {
                "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake",
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": input_tokens, "output_tokens": 1},
            }}),
        )
    }

    pub fn text_start(index: usize) -> String {
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index,
                   "content_block": {"type": "text", "text": ""}}),
        )
    }

    pub fn text_delta(index: usize, text: &str) -> String {
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index,
                   "delta": {"type": "text_delta", "text": text}}),
        )
    }

    pub fn block_stop(index: usize) -> String {
        event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        )
    }

    pub fn message_delta(stop_reason: &str, output_tokens: u64) -> String {
        event(
            "message_delta",
            json!({"type": "message_delta",
                   "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                   "usage": {"output_tokens": output_tokens}}),
        )
    }

    pub fn message_stop() -> String {
        event("message_stop", json!({"type": "message_stop"}))
    }

    pub fn error(kind: &str, message: &str) -> String {
        event(
            "error",
            json!({"type": "error", "error": {"type": kind, "message": message}}),
        )
    }

    /// A text reply streamed in `pieces`, with a ping, ending with `end_turn`.
    pub fn text_reply(pieces: &[&str]) -> String {
        let mut out = message_start(super::INPUT_TOKENS);
        out.push_str(&text_start(0));
        out.push_str(&ping());
        for piece in pieces {
            out.push_str(&text_delta(0, piece));
        }
        out.push_str(&block_stop(0));
        out.push_str(&message_delta("end_turn", super::OUTPUT_TOKENS));
        out.push_str(&message_stop());
        out
    }

    /// A reply with optional text then `tool_use` blocks whose input arrives as
    /// `input_json_delta` pieces, ending with `tool_use`.
    pub fn tool_calls_reply(text: &str, calls: &[FakeToolCall]) -> String {
        let mut out = message_start(super::INPUT_TOKENS);
        let mut index = 0;
        if !text.is_empty() {
            out.push_str(&text_start(0));
            out.push_str(&text_delta(0, text));
            out.push_str(&block_stop(0));
            index = 1;
        }
        for call in calls {
            out.push_str(&event(
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block": {
                    "type": "tool_use", "id": call.id, "name": call.name, "input": {},
                }}),
            ));
            out.push_str(&ping());
            for piece in &call.argument_pieces {
                out.push_str(&event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": index,
                           "delta": {"type": "input_json_delta", "partial_json": piece}}),
                ));
            }
            out.push_str(&block_stop(index));
            index += 1;
        }
        out.push_str(&message_delta("tool_use", super::OUTPUT_TOKENS));
        out.push_str(&message_stop());
        out
    }
}
