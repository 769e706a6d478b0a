//! The MCP server the suite configures, written with rmcp's server side. This suite's own
//! binary is that server when started with `TAH_MCP_FIXTURE` set (see `main`), so a stdio
//! server needs no other build; the streamable HTTP one runs inside the test, on 127.0.0.1.
//!
//! Its tools: `echo {text}`, `fail {message}` (an `isError` result), `sleep {seconds}` (which
//! writes `started` and then `cancelled` or `finished` to its record file), `image {bytes?}` (a
//! PNG, padded to `bytes` when given: an answer of any size, and a caption), `resource` (an embedded text resource), `env {name}` (a variable of its own
//! environment), `crash` (the process exits mid-call) and `grow` (which adds a tool, `extra`,
//! and says so with `notifications/tools/list_changed`).
//!
//! Modes, from `TAH_MCP_FIXTURE`: `stdio` serves; `mute` reads stdin and never answers, like a
//! server stuck before its handshake. With `TAH_MCP_FIXTURE_FAMILY` set it also starts a
//! `sleep` of its own, which stays in its process group, to show that a group is ended whole.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// The variable that makes this binary the fixture, and the one naming its record file.
pub const MODE: &str = "TAH_MCP_FIXTURE";
pub const RECORD: &str = "TAH_MCP_FIXTURE_RECORD";
pub const FAMILY: &str = "TAH_MCP_FIXTURE_FAMILY";

/// The smallest PNG there is (1×1, transparent).
pub const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0x00, 0x01, 0x00, 0x00,
    0x05, 0x00, 0x01, 0x0d, 0x0a, 0x2d, 0xb4, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae,
    0x42, 0x60, 0x82,
];

/// Serves as the fixture when this process was started as one; `None` otherwise.
pub fn serve_if_asked() -> Option<ExitCode> {
    let mode = std::env::var(MODE).ok()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime for the fixture");
    let fixture = Fixture {
        record: std::env::var_os(RECORD).map(PathBuf::from),
        grown: Arc::default(),
    };
    if std::env::var_os(FAMILY).is_some() {
        // Left running on purpose, never waited for: only the end of the whole group ends it.
        let child = std::process::Command::new("sleep")
            .arg("300")
            .spawn()
            .expect("start the fixture's own child");
        std::mem::forget(child);
    }
    runtime.block_on(async move {
        match mode.as_str() {
            "mute" => {
                let mut sink = tokio::io::sink();
                let _ = tokio::io::copy(&mut tokio::io::stdin(), &mut sink).await;
            }
            _ => {
                let running = fixture
                    .serve(rmcp::transport::stdio())
                    .await
                    .expect("the handshake");
                let _ = running.waiting().await;
            }
        }
    });
    Some(ExitCode::SUCCESS)
}

/// A streamable HTTP fixture on 127.0.0.1 that runs until it is dropped (or `stop` is
/// cancelled); `authorizations` are the `Authorization` headers its requests carried.
pub struct HttpFixture {
    pub url: String,
    pub stop: CancellationToken,
    pub authorizations: Arc<Mutex<Vec<String>>>,
}

impl Drop for HttpFixture {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub async fn serve_http(record: Option<PathBuf>) -> HttpFixture {
    serve_http_on("127.0.0.1:0".parse().expect("an address"), record).await
}

/// The fixture on `addr` (a port that a test reserved, so that it can come and go).
pub async fn serve_http_on(addr: SocketAddr, record: Option<PathBuf>) -> HttpFixture {
    let stop = CancellationToken::new();
    let config = StreamableHttpServerConfig::default().with_cancellation_token(stop.child_token());
    let fixture = Fixture {
        record,
        grown: Arc::default(),
    };
    let service: StreamableHttpService<Fixture, LocalSessionManager> = StreamableHttpService::new(
        move || Ok(fixture.clone()),
        Arc::new(LocalSessionManager::default()),
        config,
    );
    let authorizations = Arc::new(Mutex::new(Vec::new()));
    let seen = authorizations.clone();
    let router =
        axum::Router::new()
            .nest_service("/mcp", service)
            .layer(axum::middleware::from_fn(
                move |request: axum::extract::Request, next: axum::middleware::Next| {
                    let header = request
                        .headers()
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    if let Some(header) = header {
                        seen.lock().expect("the headers").push(header);
                    }
                    next.run(request)
                },
            ));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .expect("bind the HTTP fixture");
    let addr = listener.local_addr().expect("its address");
    let until = stop.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(until.cancelled_owned())
            .await;
    });
    HttpFixture {
        url: format!("http://{addr}/mcp"),
        stop,
        authorizations,
    }
}

#[derive(Clone)]
struct Fixture {
    record: Option<PathBuf>,
    /// Whether `grow` was called: then it also has `extra`.
    grown: Arc<AtomicBool>,
}

impl Fixture {
    fn note(&self, line: &str) {
        if let Some(path) = &self.record {
            note(path, line);
        }
    }
}

/// Appends a line to a record file.
pub fn note(path: &Path, line: &str) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open the record file");
    writeln!(file, "{line}").expect("write the record file");
}

fn tool(name: &'static str, description: &'static str, schema: Value) -> Tool {
    let Value::Object(schema) = schema else {
        unreachable!("a schema is an object")
    };
    Tool::new(name, description, schema)
}

fn text_arg(request: &CallToolRequestParams, name: &str) -> String {
    request
        .arguments
        .as_ref()
        .and_then(|args| args.get(name))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn number_arg(request: &CallToolRequestParams, name: &str) -> Option<f64> {
    request
        .arguments
        .as_ref()
        .and_then(|args| args.get(name))
        .and_then(Value::as_f64)
}

impl ServerHandler for Fixture {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("tah-test-fixture", "1.0.0"))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let text = |name: &str| json!({"type": "object", "properties": {name: {"type": "string"}}, "required": [name]});
        let mut tools = vec![
            tool("echo", "Answers its text.", text("text")),
            tool("fail", "Always fails, saying its message.", text("message")),
            tool(
                "sleep",
                "Waits some seconds.",
                json!({"type": "object", "properties": {"seconds": {"type": "number"}},
                       "required": ["seconds"]}),
            ),
            tool(
                "image",
                "Draws a picture, of `bytes` bytes if given.",
                json!({"type": "object", "properties": {"bytes": {"type": "integer"}}}),
            ),
            tool("resource", "Gives a document.", json!({"type": "object"})),
            tool(
                "env",
                "Reads one of its environment variables.",
                text("name"),
            ),
            tool(
                "crash",
                "Exits in the middle of the call.",
                json!({"type": "object"}),
            ),
            tool("grow", "Adds a tool.", json!({"type": "object"})),
        ];
        if self.grown.load(Ordering::SeqCst) {
            tools.push(tool("extra", "Added by grow.", json!({"type": "object"})));
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let result = match request.name.as_ref() {
            "echo" => CallToolResult::success(vec![ContentBlock::text(text_arg(&request, "text"))]),
            "fail" => {
                CallToolResult::error(vec![ContentBlock::text(text_arg(&request, "message"))])
            }
            "sleep" => {
                let seconds = number_arg(&request, "seconds").unwrap_or(1.0);
                self.note("started");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs_f64(seconds)) => {
                        self.note("finished");
                        CallToolResult::success(vec![ContentBlock::text("slept")])
                    }
                    _ = context.ct.cancelled() => {
                        self.note("cancelled");
                        CallToolResult::error(vec![ContentBlock::text("cancelled")])
                    }
                }
            }
            "image" => {
                use base64::Engine;
                let mut png = PNG.to_vec();
                let bytes = number_arg(&request, "bytes").unwrap_or(0.0) as usize;
                png.resize(bytes.max(PNG.len()), 0);
                let data = base64::engine::general_purpose::STANDARD.encode(png);
                CallToolResult::success(vec![
                    ContentBlock::text("a transparent pixel"),
                    ContentBlock::image(data, "image/png"),
                ])
            }
            "resource" => CallToolResult::success(vec![ContentBlock::embedded_text(
                "memo://fixture/notes",
                "the notes of the fixture",
            )]),
            "env" => {
                let name = text_arg(&request, "name");
                let value = std::env::var(&name).unwrap_or_else(|_| "<unset>".to_string());
                // Also on stderr, which tah logs: a secret handed in must be taken out there too.
                eprintln!("env {name}={value}");
                CallToolResult::success(vec![ContentBlock::text(value)])
            }
            "grow" => {
                self.grown.store(true, Ordering::SeqCst);
                if let Err(error) = context.peer.notify_tool_list_changed().await {
                    return Err(ErrorData::internal_error(error.to_string(), None));
                }
                CallToolResult::success(vec![ContentBlock::text("grown")])
            }
            "extra" if self.grown.load(Ordering::SeqCst) => {
                CallToolResult::success(vec![ContentBlock::text("the extra tool")])
            }
            "crash" => {
                self.note("crashing");
                std::process::exit(3);
            }
            other => return Err(ErrorData::invalid_params(format!("no tool {other}"), None)),
        };
        Ok(result.into())
    }
}
