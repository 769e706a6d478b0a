//! `tah acp`: the Agent Client Protocol (v1) over stdio, bridged to a tah server's REST and
//! SSE API, so that editors that speak ACP (Zed, JetBrains, goose) drive tah sessions.
//!
//! One JSON-RPC message per line on stdin and stdout. The bridge keeps nothing of its own: an
//! ACP session id is a tah session id, and what it shows comes from the session's log
//! ([`crate::protocols::acp`] maps the events).
//!
//! - `initialize`: protocol version 1; `loadSession`; prompts of text (and resource links,
//!   given to the model as their URI); no client MCP servers.
//! - `session/new {cwd, mcpServers}`: a tah session of `--agent` (or the default agent), with
//!   `cwd` kept in its metadata (`acp.cwd`): its tools work in the server's workspace, which
//!   is where tah runs, not the editor's directory. `mcpServers` must be empty: the agent's
//!   MCP servers are the server's (`--mcp-config`), and the bridge cannot hand the editor's
//!   to a server that may run elsewhere.
//! - `session/load`: the session's history as `session/update` notifications, then `{}`.
//! - `session/prompt`: a run; its text, reasoning and tool calls stream as `session/update`;
//!   an approval becomes `session/request_permission`, and the editor's choice approves or
//!   denies on the server; answered with the run's `stopReason`.
//! - `session/cancel`: cancels the session's run (its prompt answers `cancelled`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};

use crate::model::{Event, EventKind};
use crate::protocols::acp::{
    decision_of, permission_request, run_end, AcpUpdates, Reading, RunEnd,
};

/// ACP's protocol version this bridge speaks.
pub const PROTOCOL_VERSION: u64 = 1;

/// JSON-RPC error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const INTERNAL_ERROR: i64 = -32603;
/// ACP's "authentication required".
const AUTH_REQUIRED: i64 = -32000;
/// ACP's "resource not found".
const NOT_FOUND: i64 = -32002;

/// Events read per page when replaying a session.
const PAGE: usize = 500;

pub struct AcpOptions {
    /// The tah server's base URL.
    pub server: String,
    pub agent: Option<String>,
    pub token: Option<String>,
}

#[derive(Debug)]
struct RpcError {
    code: i64,
    message: String,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }

    fn params(message: impl Into<String>) -> RpcError {
        RpcError::new(INVALID_PARAMS, message)
    }
}

type RpcResult = Result<Value, RpcError>;

struct Bridge {
    http: reqwest::Client,
    base: String,
    agent: Option<String>,
    token: Option<String>,
    out: mpsc::UnboundedSender<Value>,
    /// The editor's answers to this bridge's requests, by their id.
    waiting: Mutex<HashMap<i64, oneshot::Sender<Value>>>,
    next_id: AtomicI64,
}

/// Serves ACP on stdin and stdout until stdin ends.
pub async fn run(options: AcpOptions) -> Result<(), String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .build()
        .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
    let (out, mut outgoing) = mpsc::unbounded_channel::<Value>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(message) = outgoing.recv().await {
            let mut line = message.to_string();
            line.push('\n');
            if stdout.write_all(line.as_bytes()).await.is_err() || stdout.flush().await.is_err() {
                break;
            }
        }
    });
    let bridge = Arc::new(Bridge {
        http,
        base: options.server.trim_end_matches('/').to_string(),
        agent: options.agent,
        token: options.token.filter(|t| !t.is_empty()),
        out,
        waiting: Mutex::new(HashMap::new()),
        next_id: AtomicI64::new(0),
    });
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    loop {
        let line = match lines.next_line().await {
            Ok(Some(line)) => line,
            Ok(None) => break,
            Err(error) => return Err(format!("reading stdin: {error}")),
        };
        if line.trim().is_empty() {
            continue;
        }
        bridge.take(&line);
    }
    drop(bridge);
    let _ = writer.await;
    Ok(())
}

impl Bridge {
    fn send(&self, message: Value) {
        let _ = self.out.send(message);
    }

    fn error(&self, id: Value, error: RpcError) {
        self.send(json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": error.code, "message": error.message},
        }));
    }

    fn notify(&self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    fn update(&self, session_id: &str, update: Value) {
        self.notify(
            "session/update",
            json!({"sessionId": session_id, "update": update}),
        );
    }

    /// Takes one line from the editor.
    fn take(self: &Arc<Self>, line: &str) {
        let message: Value = match serde_json::from_str(line) {
            Ok(message) => message,
            Err(error) => {
                return self.error(
                    Value::Null,
                    RpcError::new(PARSE_ERROR, format!("not JSON: {error}")),
                )
            }
        };
        let Value::Object(object) = &message else {
            return self.error(
                Value::Null,
                RpcError::new(INVALID_REQUEST, "a message must be one JSON-RPC object"),
            );
        };
        let id = object.get("id").cloned();
        match (object.get("method"), id) {
            (Some(Value::String(method)), Some(id)) => {
                let bridge = self.clone();
                let method = method.clone();
                let params = object.get("params").cloned().unwrap_or(Value::Null);
                tokio::spawn(async move {
                    match bridge.request(&method, params).await {
                        Ok(result) => {
                            bridge.send(json!({"jsonrpc": "2.0", "id": id, "result": result}))
                        }
                        Err(error) => bridge.error(id, error),
                    }
                });
            }
            (Some(Value::String(method)), None) => {
                let bridge = self.clone();
                let method = method.clone();
                let params = object.get("params").cloned().unwrap_or(Value::Null);
                tokio::spawn(async move { bridge.notification(&method, params).await });
            }
            (Some(_), id) => self.error(
                id.unwrap_or(Value::Null),
                RpcError::new(INVALID_REQUEST, "method must be a string"),
            ),
            (None, Some(id)) => {
                let waiter = id
                    .as_i64()
                    .and_then(|n| self.waiting.lock().expect("the waiters").remove(&n));
                if let Some(waiter) = waiter {
                    let _ = waiter.send(message);
                }
            }
            (None, None) => self.error(
                Value::Null,
                RpcError::new(INVALID_REQUEST, "a request needs a method"),
            ),
        }
    }

    async fn request(&self, method: &str, params: Value) -> RpcResult {
        match method {
            "initialize" => initialize(&params),
            "session/new" => self.new_session(&params).await,
            "session/load" => self.load_session(&params).await,
            "session/prompt" => self.prompt(&params).await,
            other => Err(RpcError::new(
                METHOD_NOT_FOUND,
                format!("method not found: {other}"),
            )),
        }
    }

    async fn notification(&self, method: &str, params: Value) {
        if method == "session/cancel" {
            if let Ok(id) = session_id(&params) {
                let _ = self
                    .call(
                        reqwest::Method::POST,
                        &format!("/v1/sessions/{id}/cancel"),
                        None,
                    )
                    .await;
            }
        }
        // Other notifications (`$/cancel_request`, extensions) have nothing to act on.
    }

    /// Sends the editor a request and waits for its answer.
    async fn ask(&self, method: &str, params: Value) -> Value {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().expect("the waiters").insert(id, tx);
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        rx.await.unwrap_or(Value::Null)
    }

    fn http(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// A call of tah's API, its JSON answer; tah's problems become JSON-RPC errors.
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> RpcResult {
        let mut request = self.http(method, path);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| RpcError::new(INTERNAL_ERROR, format!("the tah server: {e}")))?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(body);
        }
        let detail = body["detail"].as_str().unwrap_or(&text).to_string();
        Err(match status.as_u16() {
            401 => RpcError::new(AUTH_REQUIRED, format!("authentication required: {detail}")),
            404 => RpcError::new(NOT_FOUND, "session not found"),
            _ => RpcError::new(INTERNAL_ERROR, format!("tah answered {status}: {detail}")),
        })
    }

    async fn new_session(&self, params: &Value) -> RpcResult {
        let cwd = session_place(params)?;
        let mut body = json!({"metadata": {"acp": {"cwd": cwd}}});
        if let Some(agent) = &self.agent {
            body["agent"] = json!(agent);
        }
        let session = self
            .call(reqwest::Method::POST, "/v1/sessions", Some(body))
            .await?;
        Ok(json!({"sessionId": session["id"]}))
    }

    async fn load_session(&self, params: &Value) -> RpcResult {
        session_place(params)?;
        let id = session_id(params)?;
        let mut updates = AcpUpdates::new(Reading::Replay);
        let mut after = 0i64;
        loop {
            let page = self
                .call(
                    reqwest::Method::GET,
                    &format!("/v1/sessions/{id}/events?after={after}&limit={PAGE}"),
                    None,
                )
                .await?;
            let events: Vec<Event> = serde_json::from_value(page["data"].clone())
                .map_err(|e| RpcError::new(INTERNAL_ERROR, format!("the session's log: {e}")))?;
            for event in &events {
                for update in updates.push(event) {
                    self.update(&id, update);
                }
                after = event.seq;
            }
            if events.len() < PAGE {
                break;
            }
        }
        Ok(json!({}))
    }

    async fn prompt(&self, params: &Value) -> RpcResult {
        let id = session_id(params)?;
        let input = prompt_text(&params["prompt"])?;
        let session = self
            .call(reqwest::Method::GET, &format!("/v1/sessions/{id}"), None)
            .await?;
        let after = session["last_seq"].as_i64().unwrap_or(0);
        self.call(
            reqwest::Method::POST,
            &format!("/v1/sessions/{id}/runs"),
            Some(json!({ "input": input })),
        )
        .await?;
        let response = self
            .http(
                reqwest::Method::GET,
                &format!("/v1/sessions/{id}/events?after={after}"),
            )
            .header("accept", "text/event-stream")
            .send()
            .await
            .map_err(|e| RpcError::new(INTERNAL_ERROR, format!("the tah server: {e}")))?;
        if !response.status().is_success() {
            return Err(RpcError::new(
                INTERNAL_ERROR,
                format!("the session's events: {}", response.status()),
            ));
        }
        let mut updates = AcpUpdates::new(Reading::Live);
        let mut body = response.bytes_stream();
        let mut buffer = String::new();
        while let Some(chunk) = body.next().await {
            let chunk =
                chunk.map_err(|e| RpcError::new(INTERNAL_ERROR, format!("the stream: {e}")))?;
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buffer.find("\n\n") {
                let frame: String = buffer.drain(..end + 2).collect();
                let data: Vec<&str> = frame
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if data.is_empty() {
                    continue;
                }
                let Ok(event) = serde_json::from_str::<Event>(&data.join("\n")) else {
                    continue;
                };
                for update in updates.push(&event) {
                    self.update(&id, update);
                }
                if let EventKind::ToolApprovalRequested {
                    call_id,
                    tool,
                    input,
                    ..
                } = &event.kind
                {
                    self.permission(&id, call_id, tool, input).await;
                }
                match run_end(&event) {
                    Some(RunEnd::Stopped(reason)) => return Ok(json!({ "stopReason": reason })),
                    Some(RunEnd::Failed(error)) => {
                        return Err(RpcError::new(
                            INTERNAL_ERROR,
                            format!("the run failed: {error}"),
                        ))
                    }
                    None => {}
                }
            }
        }
        Err(RpcError::new(
            INTERNAL_ERROR,
            "the session's event stream ended before its run did",
        ))
    }

    /// Asks the editor about a call that waits for approval and answers the server with its
    /// choice. A cancelled request answers nothing: the prompt's cancel ends the run.
    async fn permission(&self, session: &str, call_id: &str, tool: &str, input: &Value) {
        let answer = self
            .ask(
                "session/request_permission",
                permission_request(session, call_id, tool, input),
            )
            .await;
        let result = &answer["result"];
        if result["outcome"]["outcome"] == "cancelled" {
            return;
        }
        let decision = decision_of(result);
        let _ = self
            .call(
                reqwest::Method::POST,
                &format!("/v1/sessions/{session}/approvals/{call_id}"),
                Some(json!({ "decision": decision })),
            )
            .await;
    }
}

fn initialize(params: &Value) -> RpcResult {
    if !params["protocolVersion"].is_u64() {
        return Err(RpcError::params(
            "protocolVersion must be a protocol version (an integer)",
        ));
    }
    Ok(json!({
        "protocolVersion": PROTOCOL_VERSION,
        "agentCapabilities": {
            "loadSession": true,
            "promptCapabilities": {"image": false, "audio": false, "embeddedContext": false},
            "mcpCapabilities": {"http": false, "sse": false},
        },
        "authMethods": [],
        "agentInfo": {"name": "tah", "version": env!("CARGO_PKG_VERSION")},
    }))
}

/// Checks `cwd`, `additionalDirectories` and `mcpServers` of `session/new` and
/// `session/load`; the `cwd`.
fn session_place(params: &Value) -> Result<String, RpcError> {
    let Some(cwd) = params["cwd"].as_str() else {
        return Err(RpcError::params("cwd must be a string (an absolute path)"));
    };
    if !cwd.starts_with('/') {
        return Err(RpcError::params("cwd must be an absolute path"));
    }
    match &params["additionalDirectories"] {
        Value::Null => {}
        Value::Array(dirs) if dirs.is_empty() => {}
        _ => {
            return Err(RpcError::params(
                "additionalDirectories are not supported: a tah session works in the server's \
                 workspace",
            ))
        }
    }
    match &params["mcpServers"] {
        Value::Array(servers) if servers.is_empty() => {}
        Value::Array(_) => {
            return Err(RpcError::params(
                "mcpServers are not supported: a tah agent's MCP servers are the server's \
                 (tah serve --mcp-config)",
            ))
        }
        _ => return Err(RpcError::params("mcpServers must be an array")),
    }
    Ok(cwd.to_string())
}

fn session_id(params: &Value) -> Result<String, RpcError> {
    let raw = params["sessionId"]
        .as_str()
        .ok_or_else(|| RpcError::params("sessionId must be a string"))?;
    uuid::Uuid::parse_str(raw)
        .map(|id| id.to_string())
        .map_err(|_| RpcError::new(NOT_FOUND, "session not found"))
}

/// The text of a prompt's content blocks: text as it is, a resource link as its URI.
fn prompt_text(prompt: &Value) -> Result<String, RpcError> {
    let Some(blocks) = prompt.as_array() else {
        return Err(RpcError::params(
            "prompt must be an array of content blocks",
        ));
    };
    let mut parts = Vec::new();
    for block in blocks {
        match block["type"].as_str() {
            Some("text") => match block["text"].as_str() {
                Some(text) => parts.push(text.to_string()),
                None => return Err(RpcError::params("a text block needs a string text")),
            },
            Some("resource_link") => match block["uri"].as_str() {
                Some(uri) => parts.push(uri.to_string()),
                None => return Err(RpcError::params("a resource_link block needs a uri")),
            },
            Some(other) => {
                return Err(RpcError::params(format!(
                    "prompt blocks of type {other:?} are not supported (text and resource_link)"
                )))
            }
            None => return Err(RpcError::params("every prompt block needs a type")),
        }
    }
    let text = parts.join("\n");
    if text.trim().is_empty() {
        return Err(RpcError::params("the prompt has no text"));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_text_and_links() {
        let prompt = json!([{"type": "text", "text": "hi"}, {"type": "resource_link", "uri": "file:///a", "name": "a"}]);
        assert_eq!(prompt_text(&prompt).unwrap(), "hi\nfile:///a");
        for bad in [
            json!("hi"),
            json!([{"type": "image"}]),
            json!([]),
            json!([{"text": "x"}]),
        ] {
            assert_eq!(prompt_text(&bad).unwrap_err().code, INVALID_PARAMS, "{bad}");
        }
    }

    #[test]
    fn a_session_needs_an_absolute_cwd_and_no_mcp_servers() {
        assert!(session_place(&json!({"cwd": "/w", "mcpServers": []})).is_ok());
        for bad in [
            json!({"cwd": "w", "mcpServers": []}),
            json!({"mcpServers": []}),
            json!({"cwd": "/w"}),
            json!({"cwd": "/w", "mcpServers": [{"name": "x", "command": "y", "args": [], "env": []}]}),
            json!({"cwd": "/w", "mcpServers": [], "additionalDirectories": ["/x"]}),
        ] {
            assert_eq!(
                session_place(&bad).unwrap_err().code,
                INVALID_PARAMS,
                "{bad}"
            );
        }
    }
}
