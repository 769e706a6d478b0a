//! The test harness: starts the real `tah` binary (`tah serve`) on port 0 with a fresh
//! database and a small workspace, and talks to it over HTTP only — JSON requests, paged
//! reads, and Server-Sent Events parsed with `eventsource-stream`.
//!
//! A `TestServer` owns its child process (killed on drop), its database, its data directory
//! and its workspace, so it can be stopped (SIGTERM), killed (SIGKILL) and started again on the
//! same database — which is what the durability and lifecycle tests need.
//!
//! The backend is chosen by the environment (see [`Backend`]): SQLite by default (a file in the
//! data directory), or PostgreSQL with `TAH_TEST_BACKEND=postgres` and `TAH_TEST_PG_URL` (a
//! fresh `tah_api_<hex>` database per `TestServer`, dropped with it unless the test failed).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use reqwest::header::{HeaderMap, ACCEPT, CONTENT_TYPE};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

/// How long the server may take to log its address.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a plain (non-streaming) request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a test waits for the next SSE frame before it calls the stream stuck.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `stop()` waits for the process to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// How long an interruption left by kill -9 may take to be recorded after the restart. With
/// PostgreSQL the dead process's lease must expire first (`--lease-ttl-secs 1` plus a sweep
/// interval of 250 ms); SQLite records it at start.
const INTERRUPTION_TIMEOUT: Duration = Duration::from_secs(5);
/// How long dropping a test's PostgreSQL database may take.
const DROP_DATABASE_TIMEOUT: Duration = Duration::from_secs(10);

/// The database the tests run against, chosen by the environment:
/// `TAH_TEST_BACKEND` unset or `sqlite` → SQLite; `postgres` → PostgreSQL at
/// `TAH_TEST_PG_URL` (e.g. `postgres://postgres@127.0.0.1:5432/tah_test`, as
/// `scripts/pg-test-cluster.sh start` exports it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    /// The URL given; every `TestServer` uses its own database on that server.
    Postgres {
        url: String,
    },
}

impl Backend {
    /// The backend of this test run (read once).
    pub fn current() -> &'static Backend {
        static BACKEND: OnceLock<Backend> = OnceLock::new();
        BACKEND.get_or_init(|| {
            let kind = std::env::var("TAH_TEST_BACKEND").unwrap_or_default();
            match kind.trim().to_ascii_lowercase().as_str() {
                "" | "sqlite" => Backend::Sqlite,
                "postgres" | "postgresql" | "pg" => {
                    let url = std::env::var("TAH_TEST_PG_URL").unwrap_or_default();
                    assert!(
                        url.starts_with("postgres://") || url.starts_with("postgresql://"),
                        "TAH_TEST_BACKEND={kind} needs TAH_TEST_PG_URL=postgres://…, got {url:?} \
                         (eval \"$(scripts/pg-test-cluster.sh start)\")"
                    );
                    Backend::Postgres { url }
                }
                other => panic!("TAH_TEST_BACKEND={other:?}: expected sqlite or postgres"),
            }
        })
    }

    pub fn is_postgres(&self) -> bool {
        matches!(self, Backend::Postgres { .. })
    }

    pub fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres { .. } => "postgres",
        }
    }
}

/// True when this run tests the PostgreSQL backend.
pub fn is_postgres() -> bool {
    Backend::current().is_postgres()
}

/// `url` with its database (the last path segment) replaced by `database`; a query string is
/// kept.
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = match url.find('?') {
        Some(q) => url.split_at(q),
        None => (url, ""),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let base = match base[authority_start..].rfind('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    format!("{base}/{database}{query}")
}

/// The README the mock model reads; its first sentence shows up in every answer.
pub const README: &str = "# Demo\n\nDemo is a small sample project. It exists for tests.\n";
pub const README_FIRST_SENTENCE: &str = "Demo is a small sample project.";

/// Extra command-line arguments for `tah serve`.
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    pub args: Vec<String>,
}

impl ServerOptions {
    pub fn new() -> ServerOptions {
        ServerOptions::default()
    }

    /// Slows the mock model's text pieces, so a turn can be watched (and cancelled) mid-stream.
    pub fn mock_delay_ms(self, ms: u64) -> ServerOptions {
        self.arg("--mock-delay-ms").arg(&ms.to_string())
    }

    pub fn arg(mut self, arg: &str) -> ServerOptions {
        self.args.push(arg.to_string());
        self
    }
}

/// A running `tah serve` process and an HTTP client for it.
pub struct TestServer {
    pub base_url: String,
    pub client: reqwest::Client,
    child: Option<Child>,
    options: ServerOptions,
    /// The `--database-url` of every start (the same database across restarts).
    database_url: String,
    /// With PostgreSQL: the test's own database, dropped with the server.
    pg_database: Option<String>,
    data_dir: TempDir,
    workspace: TempDir,
    /// Every stderr line the server printed, across restarts (shown when a test fails).
    log: Arc<Mutex<Vec<String>>>,
}

/// A fresh workspace: a README, `src/main.rs` and `docs/`, so a mock turn is
/// list_files → read_file README.md → summary.
pub fn workspace_fixture() -> TempDir {
    let dir = tempfile::Builder::new()
        .prefix("tah-workspace-")
        .tempdir()
        .expect("create the workspace dir");
    std::fs::write(dir.path().join("README.md"), README).expect("write README.md");
    std::fs::create_dir_all(dir.path().join("src")).expect("create src/");
    std::fs::write(
        dir.path().join("src/main.rs"),
        "fn main() {\n    println!(\"demo\");\n}\n",
    )
    .expect("write src/main.rs");
    std::fs::create_dir_all(dir.path().join("docs")).expect("create docs/");
    std::fs::write(dir.path().join("docs/guide.md"), "# Guide\n\nRead me.\n")
        .expect("write docs/guide.md");
    dir
}

impl TestServer {
    pub async fn start(options: ServerOptions) -> TestServer {
        let data_dir = tempfile::Builder::new()
            .prefix("tah-data-")
            .tempdir()
            .expect("create the data dir");
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .expect("build the HTTP client");
        let (database_url, pg_database) = match Backend::current() {
            Backend::Sqlite => (
                format!("sqlite://{}", data_dir.path().join("data.db").display()),
                None,
            ),
            Backend::Postgres { url } => {
                let name = format!("tah_api_{:016x}", rand::random::<u64>());
                (with_database(url, &name), Some(name))
            }
        };
        let mut server = TestServer {
            base_url: String::new(),
            client,
            child: None,
            options,
            database_url,
            pg_database,
            data_dir,
            workspace: workspace_fixture(),
            log: Arc::default(),
        };
        server.spawn().await;
        server
    }

    /// The SQLite database file (with PostgreSQL, a file that does not exist).
    pub fn database_path(&self) -> PathBuf {
        self.data_dir.path().join("data.db")
    }

    /// The `--database-url` the server runs with.
    pub fn database_url(&self) -> &str {
        &self.database_url
    }

    pub fn backend(&self) -> &'static Backend {
        Backend::current()
    }

    pub fn workspace(&self) -> &Path {
        self.workspace.path()
    }

    /// What the server printed so far.
    pub fn log(&self) -> String {
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .join("\n")
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    async fn spawn(&mut self) {
        assert!(self.child.is_none(), "the server is already running");
        let mut command = Command::new(env!("CARGO_BIN_EXE_tah"));
        command
            .arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--database-url")
            .arg(&self.database_url)
            .arg("--workspace")
            .arg(self.workspace.path());
        if self.pg_database.is_some() {
            // Auto-resume is on by default with PostgreSQL; the tests resume by themselves. A
            // short lease lets a killed process's sessions be taken over within a second.
            command
                .arg("--auto-resume=false")
                .arg("--lease-ttl-secs")
                .arg("1");
        }
        command
            .args(&self.options.args)
            .current_dir(self.data_dir.path())
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("OPENAI_API_KEY")
            .env_remove("ANTHROPIC_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("TAH_") {
                command.env_remove(name);
            }
        }
        let mut child = command.spawn().expect("spawn the tah binary");
        let stderr = child.stderr.take().expect("piped stderr");
        let (address_tx, address_rx) = oneshot::channel::<String>();
        let log = self.log.clone();
        // Drain stderr for the whole life of the process so the child never blocks on it.
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            let mut address_tx = Some(address_tx);
            while let Ok(Some(line)) = lines.next_line().await {
                let line = strip_ansi(&line);
                if let Some(address) = listening_address(&line) {
                    if let Some(tx) = address_tx.take() {
                        let _ = tx.send(address);
                    }
                }
                log.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        });
        let address = match tokio::time::timeout(STARTUP_TIMEOUT, address_rx).await {
            Ok(Ok(address)) => address,
            Ok(Err(_)) => {
                let status = child.wait().await;
                panic!(
                    "tah exited before it listened ({status:?}); its log:\n{}",
                    self.log()
                );
            }
            Err(_) => panic!(
                "tah did not log its address within {STARTUP_TIMEOUT:?}; its log:\n{}",
                self.log()
            ),
        };
        self.base_url = format!("http://{address}");
        self.child = Some(child);
    }

    /// Sends SIGTERM and waits for the process to exit; returns its exit status.
    pub async fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("the server is running");
        let pid = child.id().expect("the child has a pid");
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill -TERM");
        assert!(sent.success(), "kill -TERM {pid} failed");
        match tokio::time::timeout(STOP_TIMEOUT, child.wait()).await {
            Ok(status) => status.expect("wait for tah"),
            Err(_) => {
                let _ = child.kill().await;
                panic!(
                    "tah did not exit within {STOP_TIMEOUT:?} of SIGTERM; its log:\n{}",
                    self.log()
                );
            }
        }
    }

    /// Kills the process with SIGKILL (no chance to clean up) and reaps it.
    pub async fn kill9(&mut self) {
        let mut child = self.child.take().expect("the server is running");
        child.kill().await.expect("kill -9 tah");
    }

    /// Starts the server again on the same database and workspace (stopping it first with
    /// SIGTERM if it still runs).
    pub async fn restart(&mut self) {
        if self.child.is_some() {
            let status = self.stop().await;
            assert!(status.success(), "tah exited with {status} on SIGTERM");
        }
        self.spawn().await;
    }

    /// Like `restart`, with other command-line arguments.
    pub async fn restart_with(&mut self, options: ServerOptions) {
        if self.child.is_some() {
            let status = self.stop().await;
            assert!(status.success(), "tah exited with {status} on SIGTERM");
        }
        self.options = options;
        self.spawn().await;
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base_url, path)
    }

    // ---- plain requests --------------------------------------------------------------------

    pub async fn send(&self, request: reqwest::RequestBuilder) -> Reply {
        let response = request
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .unwrap_or_else(|e| panic!("request failed: {e}; server log:\n{}", self.log()));
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await.expect("read the response body");
        Reply {
            status,
            headers,
            body,
        }
    }

    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.client.request(method, self.url(path))
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(self.request(Method::GET, path)).await
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Reply {
        self.send(self.request(Method::POST, path).json(body)).await
    }

    /// A POST without any body (and so without a content type).
    pub async fn post_empty(&self, path: &str) -> Reply {
        self.send(self.request(Method::POST, path)).await
    }

    /// GET that must answer 200 with JSON.
    pub async fn get_ok(&self, path: &str) -> Value {
        self.get(path).await.expect_json(StatusCode::OK, path)
    }

    // ---- domain helpers --------------------------------------------------------------------

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

    pub async fn session(&self, id: &str) -> Value {
        self.get_ok(&format!("/v1/sessions/{id}")).await
    }

    /// `POST /runs?wait=true`: must answer 200 with the RunResult.
    pub async fn run_wait(&self, id: &str, input: &str) -> Value {
        let path = format!("/v1/sessions/{id}/runs?wait=true");
        self.post_json(&path, &json!({ "input": input }))
            .await
            .expect_json(StatusCode::OK, &path)
    }

    /// `POST /runs` in default mode: must answer 202 with the Run.
    pub async fn start_run(&self, id: &str, input: &str) -> Value {
        let path = format!("/v1/sessions/{id}/runs");
        self.post_json(&path, &json!({ "input": input }))
            .await
            .expect_json(StatusCode::ACCEPTED, &path)
    }

    pub async fn cancel(&self, id: &str) -> Value {
        let path = format!("/v1/sessions/{id}/cancel");
        self.post_empty(&path)
            .await
            .expect_json(StatusCode::OK, &path)
    }

    /// Waits until an interrupted run is recorded: the session `failed` with error
    /// `interrupted`. SQLite records it at start, so it must already be there; PostgreSQL
    /// records it once the dead process's lease expired (within [`INTERRUPTION_TIMEOUT`]).
    /// Returns the session.
    pub async fn wait_interrupted(&self, id: &str) -> Value {
        let patience = if self.pg_database.is_some() {
            INTERRUPTION_TIMEOUT
        } else {
            Duration::ZERO
        };
        let started = tokio::time::Instant::now();
        let deadline = started + patience;
        loop {
            let session = self.session(id).await;
            if session["state"] == "failed" && session["error"] == "interrupted" {
                eprintln!(
                    "interruption of session {id} recorded {:?} after the first check",
                    started.elapsed()
                );
                return session;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "session {id} is not recorded as interrupted ({} backend, waited {patience:?}): \
                 {session}\nserver log:\n{}",
                Backend::current().name(),
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Polls a run until it is no longer `running`.
    pub async fn wait_run(&self, id: &str, run_id: &str) -> Value {
        let path = format!("/v1/sessions/{id}/runs/{run_id}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let run = self.get_ok(&path).await;
            if run["status"] != "running" {
                return run;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "run {run_id} still running after 20 s: {run}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

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
            pages.push(reply.body.clone());
            assert!(pages.len() < 10_000, "{url}: paging does not end");
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

    /// The whole event log of a session, read page by page.
    pub async fn events(&self, id: &str) -> Vec<Value> {
        self.all_pages(&format!("/v1/sessions/{id}/events"), "after", 20)
            .await
    }

    pub async fn messages(&self, id: &str) -> Vec<Value> {
        self.all_pages(&format!("/v1/sessions/{id}/messages"), "after", 20)
            .await
    }

    pub async fn steps(&self, id: &str) -> Vec<Value> {
        self.all_pages(&format!("/v1/sessions/{id}/steps"), "cursor", 20)
            .await
    }

    pub async fn runs(&self, id: &str) -> Vec<Value> {
        self.all_pages(&format!("/v1/sessions/{id}/runs"), "cursor", 20)
            .await
    }

    pub async fn sessions(&self) -> Vec<Value> {
        self.all_pages("/v1/sessions", "cursor", 20).await
    }

    // ---- SSE -------------------------------------------------------------------------------

    /// Subscribes to a session's events over SSE.
    pub async fn sse(&self, id: &str, from: SseFrom) -> SseStream {
        let mut path = format!("/v1/sessions/{id}/events");
        if let SseFrom::After(k) = from {
            path.push_str(&format!("?after={k}"));
        }
        let mut request = self.client.get(self.url(&path));
        if let SseFrom::LastEventId(k) = from {
            request = request.header("Last-Event-ID", k.to_string());
        }
        let response = request
            .header(ACCEPT, "text/event-stream")
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path} (SSE) failed: {e}"));
        SseStream::from_response(response, &path).await
    }

    /// `POST /runs` with `Accept: text/event-stream`: the run's events as SSE.
    pub async fn run_streaming(&self, id: &str, input: &str) -> SseStream {
        let path = format!("/v1/sessions/{id}/runs");
        let response = self
            .client
            .post(self.url(&path))
            .header(ACCEPT, "text/event-stream")
            .json(&json!({ "input": input }))
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path} (SSE) failed: {e}"));
        SseStream::from_response(response, &path).await
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
        let Some(name) = self.pg_database.take() else {
            return;
        };
        if std::thread::panicking() {
            eprintln!(
                "the failed test's PostgreSQL database is kept: {}",
                self.database_url
            );
            return;
        }
        // A thread with its own runtime: drop() may run inside the test's runtime.
        let url = self.database_url.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                use sqlx::migrate::MigrateDatabase;
                tokio::time::timeout(
                    DROP_DATABASE_TIMEOUT,
                    sqlx::Postgres::force_drop_database(&url),
                )
                .await
                .map_err(|_| format!("timed out after {DROP_DATABASE_TIMEOUT:?}"))?
                .map_err(|e| e.to_string())
            })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("could not drop the test database {name}: {e}"),
            Err(_) => eprintln!("could not drop the test database {name}: the thread panicked"),
        }
    }
}

/// Where an SSE subscription starts.
#[derive(Debug, Clone, Copy)]
pub enum SseFrom {
    /// No cursor: the whole log, then live.
    Start,
    /// `?after=k`.
    After(i64),
    /// The `Last-Event-ID: k` header, as a reconnecting EventSource sends it.
    LastEventId(i64),
}

/// A whole HTTP answer, read.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
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
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }

    /// Asserts the status and returns the JSON body.
    pub fn expect_json(&self, status: StatusCode, what: &str) -> Value {
        assert_eq!(
            self.status,
            status,
            "{what}: expected {status}, got {} with {}",
            self.status,
            self.text()
        );
        self.json()
    }

    /// Asserts a problem+json answer with this status and a non-empty `detail`; returns it.
    pub fn expect_problem(&self, status: StatusCode, what: &str) -> Value {
        assert_eq!(
            self.status,
            status,
            "{what}: expected {status}, got {} with {}",
            self.status,
            self.text()
        );
        check_problem(self).unwrap_or_else(|e| panic!("{what}: {e}"))
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
    let problem: Value = serde_json::from_slice(&reply.body)
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

/// One SSE frame: `id:`, `event:` and the event JSON from `data:`.
#[derive(Debug, Clone, PartialEq)]
pub struct SseFrame {
    pub id: String,
    pub event: String,
    pub data: Value,
}

impl SseFrame {
    pub fn seq(&self) -> i64 {
        self.data["seq"]
            .as_i64()
            .unwrap_or_else(|| panic!("frame data has no seq: {:?}", self))
    }
}

/// What reading the next frame produced.
#[derive(Debug)]
pub enum Next {
    Frame(SseFrame),
    /// The response body ended cleanly.
    End,
    /// The stream broke (transport or parse error).
    Error(String),
    Timeout,
}

type FrameStream = Pin<
    Box<
        dyn Stream<Item = Result<eventsource_stream::Event, EventStreamError<reqwest::Error>>>
            + Send,
    >,
>;

/// An open SSE response.
pub struct SseStream {
    pub status: StatusCode,
    pub headers: HeaderMap,
    what: String,
    inner: FrameStream,
}

impl SseStream {
    /// Wraps a response that must be `200 text/event-stream`.
    pub async fn from_response(response: reqwest::Response, what: &str) -> SseStream {
        let status = response.status();
        let headers = response.headers().clone();
        let content_type = headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        if status != StatusCode::OK || !content_type.starts_with("text/event-stream") {
            let body = response.text().await.unwrap_or_default();
            panic!("{what}: expected 200 text/event-stream, got {status} {content_type:?}: {body}");
        }
        SseStream {
            status,
            headers,
            what: what.to_string(),
            inner: Box::pin(response.bytes_stream().eventsource()),
        }
    }

    pub async fn next_within(&mut self, timeout: Duration) -> Next {
        match tokio::time::timeout(timeout, self.inner.next()).await {
            Err(_) => Next::Timeout,
            Ok(None) => Next::End,
            Ok(Some(Err(e))) => Next::Error(e.to_string()),
            Ok(Some(Ok(event))) => {
                let data: Value = serde_json::from_str(&event.data).unwrap_or_else(|e| {
                    panic!("{}: frame data is not JSON ({e}): {:?}", self.what, event)
                });
                Next::Frame(SseFrame {
                    id: event.id,
                    event: event.event,
                    data,
                })
            }
        }
    }

    /// The next frame; panics on end, error or timeout.
    pub async fn next_frame(&mut self) -> SseFrame {
        match self.next_within(FRAME_TIMEOUT).await {
            Next::Frame(frame) => frame,
            other => panic!("{}: expected a frame, got {other:?}", self.what),
        }
    }

    /// Reads frames up to and including the first one that matches.
    pub async fn until(&mut self, mut done: impl FnMut(&SseFrame) -> bool) -> Vec<SseFrame> {
        let mut frames = Vec::new();
        loop {
            let frame = self.next_frame().await;
            let stop = done(&frame);
            frames.push(frame);
            if stop {
                return frames;
            }
        }
    }

    /// Reads frames up to and including the first of this type.
    pub async fn until_type(&mut self, kind: &str) -> Vec<SseFrame> {
        self.until(|f| f.event == kind).await
    }

    /// Reads exactly `n` frames.
    pub async fn take(&mut self, n: usize) -> Vec<SseFrame> {
        let mut frames = Vec::with_capacity(n);
        for _ in 0..n {
            frames.push(self.next_frame().await);
        }
        frames
    }
}

// ---- assertions shared by the test modules ---------------------------------------------------

pub fn id_of(value: &Value) -> String {
    value["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no id in {value}"))
        .to_string()
}

pub fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// Asserts that the events' `seq` run 1, 2, 3, … with no gap and no duplicate.
pub fn assert_contiguous_from_one(events: &[Value]) {
    assert_contiguous_from(events, 1);
}

pub fn assert_contiguous_from(events: &[Value], first: i64) {
    for (i, event) in events.iter().enumerate() {
        assert_eq!(
            event["seq"].as_i64(),
            Some(first + i as i64),
            "event #{i} breaks the sequence from {first}: {event}\nall types: {:?}",
            types(events)
        );
    }
}

/// Asserts the frames are the events, one to one: `id:` = seq, `event:` = type, data = event.
pub fn assert_frames_are(frames: &[SseFrame], events: &[Value], what: &str) {
    let frame_seqs: Vec<&str> = frames.iter().map(|f| f.id.as_str()).collect();
    let event_seqs: Vec<String> = events.iter().map(|e| e["seq"].to_string()).collect();
    assert_eq!(
        frame_seqs, event_seqs,
        "{what}: the frames' ids are not the expected seqs"
    );
    for (frame, event) in frames.iter().zip(events) {
        assert_eq!(
            frame.event,
            event["type"].as_str().unwrap_or("?"),
            "{what}: event: line of seq {}",
            frame.id
        );
        assert_eq!(
            &frame.data, event,
            "{what}: data of seq {} differs from the stored event",
            frame.id
        );
    }
}

/// The event JSON carried by a list of frames.
pub fn frame_events(frames: &[SseFrame]) -> Vec<Value> {
    frames.iter().map(|f| f.data.clone()).collect()
}

/// Terminal events (agent.finished / failed / cancelled) of one run.
pub fn terminal_events_of<'a>(events: &'a [Value], run_id: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| {
            matches!(
                e["type"].as_str(),
                Some("agent.finished" | "agent.failed" | "agent.cancelled")
            ) && e["data"]["run_id"] == run_id
        })
        .collect()
}

/// Asserts, turn by turn (a turn starts at a user message), that every assistant tool call
/// has exactly one tool message answering it and every tool message answers a call of its
/// turn. (Tool call ids are only unique within a turn: the mock numbers them per turn.)
pub fn assert_tool_calls_answered(messages: &[Value]) {
    let mut turns: Vec<&[Value]> = Vec::new();
    let mut start = 0;
    for (i, m) in messages.iter().enumerate() {
        if m["role"] == "user" && i > start {
            turns.push(&messages[start..i]);
            start = i;
        }
    }
    turns.push(&messages[start..]);
    for turn in turns {
        let calls: Vec<String> = turn
            .iter()
            .filter(|m| m["role"] == "assistant")
            .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
            .map(|c| c["id"].as_str().unwrap_or_default().to_string())
            .collect();
        for call in &calls {
            let answers = turn
                .iter()
                .filter(|m| m["role"] == "tool" && m["tool_call_id"] == call.as_str())
                .count();
            assert_eq!(
                answers, 1,
                "tool call {call} has {answers} tool messages in its turn; messages: {messages:#?}"
            );
        }
        for m in turn.iter().filter(|m| m["role"] == "tool") {
            let id = m["tool_call_id"].as_str().unwrap_or("");
            assert!(
                calls.iter().any(|c| c == id),
                "tool message answers no call of its turn: {m}"
            );
        }
    }
}

/// Asserts message indexes are 0, 1, 2, … .
pub fn assert_indexes_contiguous(messages: &[Value]) {
    for (i, m) in messages.iter().enumerate() {
        assert_eq!(m["index"].as_i64(), Some(i as i64), "message #{i}: {m}");
    }
}

/// What a message is, without its timestamp: (role, content, tool call names, tool_call_id).
pub fn message_shape(m: &Value) -> Value {
    json!({
        "index": m["index"],
        "role": m["role"],
        "content": m["content"],
        "tool_calls": m.get("tool_calls").cloned().unwrap_or(json!([])),
        "tool_call_id": m.get("tool_call_id").cloned().unwrap_or(Value::Null),
    })
}

/// The median of some durations.
pub fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn listening_address(line: &str) -> Option<String> {
    let rest = &line[line.find("listening on http://")? + "listening on http://".len()..];
    let address: String = rest
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != '"' && *c != '\u{1b}')
        .collect();
    (!address.is_empty()).then_some(address)
}

/// Removes ANSI colour sequences, in case the log is coloured despite NO_COLOR.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

#[test]
fn with_database_replaces_the_last_path_segment() {
    assert_eq!(
        with_database("postgres://postgres@127.0.0.1:5432/tah_test", "x"),
        "postgres://postgres@127.0.0.1:5432/x"
    );
    assert_eq!(
        with_database("postgresql://u:p@h/db?sslmode=disable", "x"),
        "postgresql://u:p@h/x?sslmode=disable"
    );
    assert_eq!(with_database("postgres://h:1", "x"), "postgres://h:1/x");
    assert_eq!(with_database("postgres://h:1/", "x"), "postgres://h:1/x");
}
