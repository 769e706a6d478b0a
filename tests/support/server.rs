//! One launcher for the server under test, with a fresh database (SQLite in a temporary
//! directory, or a fresh PostgreSQL database with `TAH_TEST_BACKEND=postgres`) and a fresh
//! workspace ([`workspace_fixture`]).
//!
//! By default the library's `Application` runs inside the test's own runtime on port 0, as
//! `tah serve` would (the same flags are parsed the same way). A test that must stop the
//! process with a signal, kill it with SIGKILL, freeze it, or start it again on the same
//! database asks for the real binary with [`ServerOptions::process`]; its address is read from
//! the ready line it writes to stdout, and its stderr is kept for failure reports.
//!
//! A [`TestServer`] dereferences to its [`Api`] client, so `server.create_session()` works.

use std::collections::VecDeque;
use std::ops::Deref;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

use clap::{CommandFactory, Parser};
use serde_json::Value;
use tah::app::{AppError, Application, ReadyLine, StopHandle};
use tah::cli::ServeArgs;
use tah::config::Settings;
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

use crate::support::client::Api;
use crate::support::fixtures::workspace_fixture;
use crate::support::postgres::TestDatabase;

/// How long the server may take to be ready.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `stop()` waits for the server to end after SIGTERM (or its stop handle).
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long an interruption left by kill -9 may take to be recorded after the restart. With
/// PostgreSQL the dead process's lease must expire first (`--lease-ttl-secs 1` plus a sweep
/// interval of 250 ms); SQLite records it at start.
const INTERRUPTION_TIMEOUT: Duration = Duration::from_secs(5);
/// Lines of a server process's stderr kept for failure reports.
const LOG_LINES: usize = 20_000;

/// The database the tests run against, chosen by the environment:
/// `TAH_TEST_BACKEND` unset or `sqlite` → SQLite; `postgres` → a fresh database per server on
/// the test PostgreSQL server (see [`crate::support::postgres`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// The backend of this test run (read once).
    pub fn current() -> Backend {
        static BACKEND: OnceLock<Backend> = OnceLock::new();
        *BACKEND.get_or_init(|| {
            let kind = std::env::var("TAH_TEST_BACKEND").unwrap_or_default();
            match kind.trim().to_ascii_lowercase().as_str() {
                "" | "sqlite" => Backend::Sqlite,
                "postgres" | "postgresql" | "pg" => Backend::Postgres,
                other => panic!("TAH_TEST_BACKEND={other:?}: expected sqlite or postgres"),
            }
        })
    }

    pub fn is_postgres(self) -> bool {
        self == Backend::Postgres
    }

    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::Postgres => "postgres",
        }
    }
}

/// True when this run tests the PostgreSQL backend.
pub fn is_postgres() -> bool {
    Backend::current().is_postgres()
}

/// How the server runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Launch {
    /// The library's `Application`, in the test's runtime.
    InProcess,
    /// The `tah` binary, as a child process.
    Process,
}

/// How to start a server: extra `tah serve` flags, and how it runs.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    args: Vec<String>,
    launch: Launch,
    name: &'static str,
    env: Vec<(String, String)>,
    rust_log: String,
    database_url: Option<String>,
    page: usize,
    operator_token: Option<String>,
}

impl Default for ServerOptions {
    fn default() -> ServerOptions {
        ServerOptions {
            args: Vec::new(),
            launch: Launch::InProcess,
            name: "tah",
            env: Vec::new(),
            rust_log: "info".to_string(),
            database_url: None,
            page: 20,
            operator_token: None,
        }
    }
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

    pub fn args(self, args: &[&str]) -> ServerOptions {
        args.iter().fold(self, |options, arg| options.arg(arg))
    }

    /// Runs the real `tah` binary as a child process (to signal, kill or restart it).
    pub fn process(mut self) -> ServerOptions {
        self.launch = Launch::Process;
        self
    }

    /// The server's name in messages (`A`, `B`).
    pub fn named(mut self, name: &'static str) -> ServerOptions {
        self.name = name;
        self
    }

    /// An environment variable of the process (for a provider's key).
    pub fn env(mut self, name: &str, value: &str) -> ServerOptions {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    /// The process's `RUST_LOG` (default `info`).
    pub fn rust_log(mut self, filter: &str) -> ServerOptions {
        self.rust_log = filter.to_string();
        self
    }

    /// The client reads whole lists `limit` items a page (default 20, which exercises paging).
    pub fn paged_by(mut self, limit: usize) -> ServerOptions {
        self.page = limit;
        self
    }

    /// A deployment token (`--api-token`), which the server's client then sends on every
    /// request: the client is an operator.
    pub fn operator_token(mut self, token: &str) -> ServerOptions {
        self.operator_token = Some(token.to_string());
        self.arg("--api-token").arg(token)
    }

    /// This database instead of a fresh one (replicas share one).
    pub fn database_url(mut self, url: &str) -> ServerOptions {
        self.database_url = Some(url.to_string());
        self
    }
}

enum Running {
    InProcess {
        stop: StopHandle,
        task: JoinHandle<Result<(), AppError>>,
    },
    Process {
        child: Child,
        pid: u32,
    },
}

/// A running server, its database and workspace, and a client for it.
pub struct TestServer {
    /// A client of the current process (replaced on every start).
    pub api: Api,
    options: ServerOptions,
    /// The `--database-url` of every start (the same database across restarts).
    database_url: String,
    /// With PostgreSQL: the test's own database, dropped with the server.
    pg_database: Option<TestDatabase>,
    data_dir: TempDir,
    workspace: TempDir,
    running: Option<Running>,
    /// Every stderr line a server process printed, across restarts.
    log: Arc<Mutex<VecDeque<String>>>,
}

impl Deref for TestServer {
    type Target = Api;

    fn deref(&self) -> &Api {
        &self.api
    }
}

impl TestServer {
    pub async fn start(options: ServerOptions) -> TestServer {
        let data_dir = tempfile::Builder::new()
            .prefix("tah-data-")
            .tempdir()
            .expect("create the data dir");
        let (database_url, pg_database) = match (&options.database_url, Backend::current()) {
            (Some(url), _) => (url.clone(), None),
            (None, Backend::Sqlite) => (
                format!("sqlite://{}", data_dir.path().join("data.db").display()),
                None,
            ),
            (None, Backend::Postgres) => {
                let db = TestDatabase::new("tah_api");
                (db.url.clone(), Some(db))
            }
        };
        let mut server = TestServer {
            api: Api::new(options.name, "http://127.0.0.1:0"),
            options,
            database_url,
            pg_database,
            data_dir,
            workspace: workspace_fixture(),
            running: None,
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

    pub fn backend(&self) -> Backend {
        Backend::current()
    }

    pub fn workspace(&self) -> &Path {
        self.workspace.path()
    }

    pub fn is_running(&self) -> bool {
        self.running.is_some()
    }

    /// The flags of `tah serve`, without the subcommand.
    fn serve_args(&self) -> Vec<String> {
        let mut args: Vec<String> = ["--database-url", &self.database_url, "--workspace"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.push(self.workspace.path().display().to_string());
        let chosen = |flag: &str| {
            let with_value = format!("{flag}=");
            self.options
                .args
                .iter()
                .any(|a| a == flag || a.starts_with(&with_value))
        };
        if !chosen("--listen") {
            args.extend(["--listen", "127.0.0.1:0"].map(String::from));
        }
        if self.pg_database.is_some() {
            // Auto-resume is on by default with PostgreSQL; the tests resume by themselves
            // unless they ask for it. A short lease lets a killed process's sessions be taken
            // over within a second.
            if !chosen("--auto-resume") {
                args.push("--auto-resume=false".to_string());
            }
            args.extend(["--lease-ttl-secs", "1"].map(String::from));
        }
        if !chosen("--provider") {
            // The mock, whatever provider keys the environment holds.
            args.extend(["--provider", "mock"].map(String::from));
        }
        args.extend(self.options.args.iter().cloned());
        args
    }

    /// Starts the server (again, on the same database and workspace).
    pub async fn spawn(&mut self) {
        assert!(self.running.is_none(), "the server is already running");
        let args = self.serve_args();
        let (address, running) = match self.options.launch {
            Launch::InProcess => start_in_process(args).await,
            Launch::Process => self.start_process(args).await,
        };
        self.running = Some(running);
        // A fresh client: no pooled connection to an earlier process.
        self.api =
            Api::new(self.options.name, &format!("http://{address}")).paged_by(self.options.page);
        if let Some(token) = &self.options.operator_token {
            self.api = self.api.with_bearer(token);
        }
    }

    async fn start_process(&self, args: Vec<String>) -> (std::net::SocketAddr, Running) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tah"));
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("TAH_") {
                command.env_remove(name);
            }
        }
        command
            .arg("serve")
            .args(&args)
            .current_dir(self.data_dir.path())
            .env("RUST_LOG", &self.options.rust_log)
            .env("NO_COLOR", "1")
            .env_remove("OPENAI_API_KEY")
            .env_remove("ANTHROPIC_API_KEY")
            .envs(self.options.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("spawn the tah binary");
        let pid = child.id().expect("the child has a pid");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        // Drain stderr for the whole life of the process so the child never blocks on it.
        let log = self.log.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                if log.len() == LOG_LINES {
                    log.pop_front();
                }
                log.push_back(strip_ansi(&line));
            }
        });
        match tokio::time::timeout(STARTUP_TIMEOUT, ReadyLine::read(stdout)).await {
            Ok(Some(ready)) => (ready.listening, Running::Process { child, pid }),
            Ok(None) => {
                let status = child.wait().await;
                panic!(
                    "{}: tah exited before it was ready ({status:?}); its log:\n{}",
                    self.options.name,
                    self.log_tail(200)
                );
            }
            Err(_) => {
                let _ = child.start_kill();
                panic!(
                    "{}: tah wrote no ready line within {STARTUP_TIMEOUT:?}; its log:\n{}",
                    self.options.name,
                    self.log_tail(200)
                );
            }
        }
    }

    /// Stops the server gracefully (SIGTERM, or the application's stop handle) and waits for
    /// it to end; returns its exit status (in-process: 0 for a clean stop).
    pub async fn stop(&mut self) -> ExitStatus {
        self.terminate(STOP_TIMEOUT).await.0
    }

    /// Like [`TestServer::stop`], waiting up to `limit`: the status and how long it took.
    pub async fn terminate(&mut self, limit: Duration) -> (ExitStatus, Duration) {
        let running = self.running.take().expect("the server is running");
        let started = Instant::now();
        match running {
            Running::Process { mut child, pid } => {
                let sent = tokio::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status()
                    .await
                    .expect("run kill -TERM");
                assert!(sent.success(), "kill -TERM {pid} failed");
                match tokio::time::timeout(limit, child.wait()).await {
                    Ok(status) => (status.expect("wait for tah"), started.elapsed()),
                    Err(_) => {
                        let _ = child.kill().await;
                        panic!(
                            "{}: tah did not exit within {limit:?} of SIGTERM; its log:\n{}",
                            self.options.name,
                            self.log_tail(200)
                        );
                    }
                }
            }
            Running::InProcess { stop, task } => {
                stop.stop();
                match tokio::time::timeout(limit, task).await {
                    Ok(Ok(Ok(()))) => (ExitStatus::from_raw(0), started.elapsed()),
                    Ok(Ok(Err(error))) => {
                        eprintln!("{}: the application ended with {error}", self.options.name);
                        // What the binary does on an error: exit status 1.
                        (ExitStatus::from_raw(1 << 8), started.elapsed())
                    }
                    Ok(Err(join)) => {
                        panic!("{}: the application panicked: {join}", self.options.name)
                    }
                    Err(_) => panic!(
                        "{}: the application did not stop within {limit:?}",
                        self.options.name
                    ),
                }
            }
        }
    }

    /// Kills the process with SIGKILL (no chance to clean up) and reaps it.
    pub async fn kill9(&mut self) {
        match self.running.take() {
            Some(Running::Process { mut child, .. }) => {
                child.kill().await.expect("kill -9 tah");
            }
            Some(Running::InProcess { .. }) => {
                panic!("kill -9 needs a process: start the server with ServerOptions::process()")
            }
            None => panic!("the server is not running"),
        }
    }

    /// Sends a signal by name (`STOP`, `CONT`, `TERM`, `KILL`) with kill(1).
    pub fn signal(&self, signal: &str) {
        let pid = self.pid();
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .expect("run kill(1)");
        assert!(
            status.success(),
            "kill -{signal} {pid} ({}) failed",
            self.options.name
        );
    }

    /// The server process's pid.
    pub fn pid(&self) -> u32 {
        match &self.running {
            Some(Running::Process { pid, .. }) => *pid,
            _ => panic!("no server process: start it with ServerOptions::process()"),
        }
    }

    /// Whether the server still runs (has not exited).
    pub fn alive(&mut self) -> bool {
        match self.running.as_mut() {
            None => false,
            Some(Running::Process { child, .. }) => matches!(child.try_wait(), Ok(None)),
            Some(Running::InProcess { task, .. }) => !task.is_finished(),
        }
    }

    /// Starts the server again on the same database and workspace (stopping it first if it
    /// still runs).
    pub async fn restart(&mut self) {
        if self.running.is_some() {
            let status = self.stop().await;
            assert!(status.success(), "tah exited with {status} on SIGTERM");
        }
        self.spawn().await;
    }

    /// Like `restart`, with other command-line flags (and the operator token they name).
    pub async fn restart_with(&mut self, options: ServerOptions) {
        if self.running.is_some() {
            let status = self.stop().await;
            assert!(status.success(), "tah exited with {status} on SIGTERM");
        }
        self.options.args = options.args;
        self.options.operator_token = options.operator_token;
        self.spawn().await;
    }

    /// What the server process printed so far (an in-process server logs to the test's
    /// captured output instead).
    pub fn log(&self) -> String {
        self.log_tail(usize::MAX)
    }

    /// The last `n` lines the server process printed (across restarts).
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        if log.is_empty() && self.options.launch == Launch::InProcess {
            return "(an in-process server logs to the test's captured output)".to_string();
        }
        let skip = log.len().saturating_sub(n);
        log.iter()
            .skip(skip)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Lines of the log that contain `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.iter().filter(|l| l.contains(needle)).cloned().collect()
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
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let asked = std::env::var("TAH_TEST_LOGS").is_ok_and(|v| v == "1");
        let is_process = matches!(self.running, Some(Running::Process { .. }))
            || self.options.launch == Launch::Process;
        if is_process && (std::thread::panicking() || asked) {
            eprintln!(
                "----- {} log, last 150 lines -----\n{}\n----- end of {} -----",
                self.options.name,
                self.log_tail(150),
                self.options.name
            );
        }
        match self.running.as_mut() {
            // SIGKILL also ends a stopped process.
            Some(Running::Process { child, .. }) => {
                let _ = child.start_kill();
            }
            // The shutdown goes on in the test's runtime while it lasts.
            Some(Running::InProcess { stop, .. }) => stop.stop(),
            None => {}
        }
    }
}

/// Builds and serves the library's application in this runtime, as `tah serve ARGS` would.
async fn start_in_process(args: Vec<String>) -> (std::net::SocketAddr, Running) {
    init_test_logging();
    refuse_serve_env();
    let args = ServeArgs::try_parse_from(std::iter::once("serve".to_string()).chain(args))
        .unwrap_or_else(|e| panic!("tah serve flags: {e}"));
    let settings = Settings::parse(args).unwrap_or_else(|e| panic!("tah serve settings: {e}"));
    let app = tokio::time::timeout(STARTUP_TIMEOUT, Application::build(settings))
        .await
        .unwrap_or_else(|_| panic!("the application was not built within {STARTUP_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("build the application: {e}"));
    let address = app.addr();
    let stop = app.stop_handle();
    let task = tokio::spawn(app.run_until(std::future::pending()));
    (address, Running::InProcess { stop, task })
}

/// In-process servers log through one subscriber that writes to the output libtest captures
/// (shown for failing tests); `RUST_LOG` sets the level, `warn` by default.
fn init_test_logging() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

/// An in-process server parses `tah serve`'s flags in this process, so the environment
/// fallbacks (`TAH_MAX_STEPS`, …) would reach it; the binary launcher removes them, here a
/// test refuses to run rather than test something else than it says.
fn refuse_serve_env() {
    let set: Vec<String> = ServeArgs::command()
        .get_arguments()
        .filter_map(|arg| arg.get_env())
        .filter(|name| std::env::var_os(name).is_some())
        .map(|name| name.to_string_lossy().into_owned())
        .collect();
    assert!(
        set.is_empty(),
        "unset {set:?}: in-process test servers would read them as tah serve flags"
    );
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

/// Runs `tah serve` on the mock model and a fresh SQLite database with these flags and
/// environment (none of the caller's `TAH_*` variables), for a start that is meant to fail:
/// its exit status and log.
pub fn serve_expecting_exit(args: &[&str], env: &[(&str, &str)]) -> (ExitStatus, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let database = format!("sqlite://{}", dir.path().join("tah.db").display());
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_tah"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("TAH_") {
            command.env_remove(name);
        }
    }
    let output = command
        .args(["serve", "--listen", "127.0.0.1:0", "--provider", "mock"])
        .args(["--database-url", &database])
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run tah");
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
