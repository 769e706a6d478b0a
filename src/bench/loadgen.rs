//! The load generator behind `tah bench`: starts (or finds) a tah server, drives it over HTTP
//! like real clients — C sessions × T sequential `?wait=true` turns, S SSE subscribers per
//! session that must each see every event exactly once — measures it from outside (latency,
//! throughput, `/proc` CPU and memory), then sends the same workload straight to the fake model
//! for the floor.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use futures::StreamExt;
use reqwest::header::{ACCEPT, AUTHORIZATION};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::fake_model::{self, parse_stamps, unix_micros};
use super::stats::{Proc, Summary};
use super::{BenchArgs, BenchProvider};

/// How long a subscriber may take, after the last turn, to receive the session's last event.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// Reconnections (with `Last-Event-ID`) a subscriber may make before it gives up.
const MAX_RECONNECTS: u32 = 5;
/// The longest a single turn may take.
const TURN_TIMEOUT: Duration = Duration::from_secs(600);
/// Error messages kept for the report.
const ERROR_SAMPLES: usize = 10;

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.idle_sessions.is_none() && args.turns == 0 {
        bail!("--turns must be at least 1");
    }
    if args.idle_sessions == Some(0) {
        bail!("--idle-sessions must be at least 1");
    }
    let load_before = load_average();
    let env = Environment::start(&args).await?;
    let workload = async {
        match args.idle_sessions {
            Some(n) => idle(&args, &env, n).await,
            None => turns(&args, &env).await,
        }
    };
    // On Ctrl-C, still stop the server and remove the temporary directory.
    let result = tokio::select! {
        result = workload => result,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
    };
    let log = env.stop().await;
    let mut report = result?;
    report.load_average_1m = load_before;
    report.cpus = std::thread::available_parallelism().map_or(0, usize::from);
    report.server_log_errors = log.errors;
    report.server_log_warnings = log.warnings;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.render());
    }
    if report.errors > 0 {
        bail!("{} error(s) during the benchmark", report.errors);
    }
    Ok(())
}

/// The 1-minute load average (`/proc/loadavg`): other work on the machine skews every figure.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

// ---- the server under test -------------------------------------------------------------------

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> std::io::Result<TempDir> {
        let path = std::env::temp_dir().join(format!(
            "tah-bench-{}-{}",
            std::process::id(),
            unix_micros()
        ));
        std::fs::create_dir_all(&path)?;
        Ok(TempDir(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What the spawned server wrote to stderr: the last lines, and how many errors and warnings.
#[derive(Default)]
struct ServerLog {
    tail: Mutex<VecDeque<String>>,
    errors: AtomicU64,
    warnings: AtomicU64,
}

impl ServerLog {
    fn line(&self, line: &str) {
        match line.split_whitespace().nth(1) {
            Some("ERROR") => {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
            Some("WARN") => {
                self.warnings.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        if let Ok(mut tail) = self.tail.lock() {
            if tail.len() == 20 {
                tail.pop_front();
            }
            tail.push_back(line.to_string());
        }
    }

    fn tail(&self) -> String {
        self.tail
            .lock()
            .map(|t| t.iter().cloned().collect::<Vec<_>>().join("\n"))
            .unwrap_or_default()
    }
}

struct LogCounts {
    errors: u64,
    warnings: u64,
}

/// The server under test and the fake model behind it.
struct Environment {
    /// `http://host:port`, without a trailing slash.
    base: String,
    /// The server process, for `/proc`.
    pid: Option<u32>,
    /// The fake model's base URL (`http://addr/v1`) for the floor, when known.
    fake_url: Option<String>,
    /// How the server was obtained, for the report.
    description: String,
    child: Option<Child>,
    fake_task: Option<JoinHandle<std::io::Result<()>>>,
    log: Arc<ServerLog>,
    tempdir: Option<TempDir>,
}

impl Environment {
    async fn start(args: &BenchArgs) -> anyhow::Result<Environment> {
        if let Some(server) = &args.server {
            return Ok(Environment {
                base: server.trim_end_matches('/').to_string(),
                pid: args.server_pid,
                fake_url: args
                    .fake_model_url
                    .as_ref()
                    .map(|u| u.trim_end_matches('/').to_string()),
                description: format!("running server {server}"),
                child: None,
                fake_task: None,
                log: Arc::new(ServerLog::default()),
                tempdir: None,
            });
        }
        let tempdir = TempDir::new().context("cannot create a temporary directory")?;
        let workspace = tempdir.path().join("workspace");
        write_workspace(&workspace).context("cannot write the bench workspace")?;
        let (fake_url, fake_task) = match args.provider {
            BenchProvider::Fake => {
                let addr = "127.0.0.1:0".parse().map_err(|e| anyhow!("{e}"))?;
                let (addr, task) = fake_model::spawn_fake_model(addr, args.knobs())
                    .await
                    .context("cannot start the fake model")?;
                (Some(format!("http://{addr}/v1")), Some(task))
            }
            BenchProvider::Mock => (None, None),
        };
        let database_url = args
            .database_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}", tempdir.path().join("bench.db").display()));
        let exe = std::env::current_exe().context("cannot find the tah executable")?;
        let mut command = tokio::process::Command::new(exe);
        command
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--database-url", &database_url])
            .arg("--workspace")
            .arg(&workspace);
        match (&fake_url, args.provider) {
            (Some(url), BenchProvider::Fake) => {
                command
                    .args(["--provider", "openai", "--model", "fake", "--base-url", url])
                    .env("OPENAI_API_KEY", "bench");
            }
            _ => {
                command
                    .args(["--provider", "mock", "--mock-delay-ms"])
                    .arg(args.piece_delay_ms.to_string());
            }
        }
        command.args(&args.server_args);
        // The workload is fixed by the flags, not by whatever TAH_* the caller has set.
        for (name, _) in std::env::vars_os() {
            let is_tah = name.to_str().is_some_and(|n| n.starts_with("TAH_"));
            if is_tah {
                command.env_remove(&name);
            }
        }
        for proxy in [
            "HTTP_PROXY",
            "http_proxy",
            "HTTPS_PROXY",
            "https_proxy",
            "ALL_PROXY",
            "all_proxy",
        ] {
            command.env_remove(proxy);
        }
        command
            .env("RUST_LOG", &args.server_log)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().context("cannot start `tah serve`")?;
        let pid = child.id();
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| anyhow!("no stderr from the server"))?;
        let log = Arc::new(ServerLog::default());
        let (address_tx, address_rx) = oneshot::channel::<String>();
        tokio::spawn(drain_stderr(stderr, log.clone(), address_tx));
        let address = match tokio::time::timeout(Duration::from_secs(60), address_rx).await {
            Ok(Ok(address)) => address,
            _ => {
                let _ = child.start_kill();
                bail!(
                    "the server did not report its address; its last lines:\n{}",
                    log.tail()
                );
            }
        };
        let base = format!("http://{address}");
        wait_ready(&base).await.with_context(|| {
            format!(
                "the server did not become ready; its last lines:\n{}",
                log.tail()
            )
        })?;
        let store = if database_url.starts_with("postgres") {
            "PostgreSQL"
        } else {
            "SQLite"
        };
        Ok(Environment {
            base,
            pid,
            fake_url,
            description: format!("spawned `tah serve` ({store}, pid {})", pid.unwrap_or(0)),
            child: Some(child),
            fake_task,
            log,
            tempdir: Some(tempdir),
        })
    }

    /// Stops what was spawned (the server gracefully if it can) and removes the temporary
    /// directory.
    async fn stop(mut self) -> LogCounts {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id() {
                let _ = tokio::process::Command::new("kill")
                    .args(["-TERM", &pid.to_string()])
                    .status()
                    .await;
            }
            if tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .is_err()
            {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
        }
        if let Some(task) = self.fake_task.take() {
            task.abort();
        }
        self.tempdir.take();
        LogCounts {
            errors: self.log.errors.load(Ordering::Relaxed),
            warnings: self.log.warnings.load(Ordering::Relaxed),
        }
    }
}

/// A small workspace for the file tools: a README and a few files.
fn write_workspace(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("src"))?;
    std::fs::write(
        dir.join("README.md"),
        "# Bench workspace\n\nA small workspace the load generator points the server at.\n",
    )?;
    std::fs::write(
        dir.join("src/main.rs"),
        "fn main() {\n    println!(\"hello\");\n}\n",
    )?;
    std::fs::write(dir.join("Cargo.toml"), "[package]\nname = \"bench\"\n")?;
    Ok(())
}

async fn drain_stderr(
    stderr: tokio::process::ChildStderr,
    log: Arc<ServerLog>,
    address: oneshot::Sender<String>,
) {
    const MARK: &str = "listening on http://";
    let mut address = Some(address);
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(at) = line.find(MARK) {
            let rest = &line[at + MARK.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || ".:[]".contains(c)))
                .unwrap_or(rest.len());
            if let Some(tx) = address.take() {
                let _ = tx.send(rest[..end].to_string());
            }
        }
        log.line(&line);
    }
}

async fn wait_ready(base: &str) -> anyhow::Result<()> {
    let client = reqwest::Client::builder().no_proxy().build()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("GET /readyz did not answer 200 within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---- the client side -------------------------------------------------------------------------

/// Errors of any request, counted, with the first few messages.
#[derive(Default)]
struct Errors {
    count: AtomicU64,
    samples: Mutex<Vec<String>>,
}

impl Errors {
    fn record(&self, what: impl std::fmt::Display) {
        self.count.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut samples) = self.samples.lock() {
            if samples.len() < ERROR_SAMPLES {
                samples.push(what.to_string());
            }
        }
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn samples(&self) -> Vec<String> {
        self.samples.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    errors: Errors,
}

#[derive(Deserialize)]
struct Created {
    id: String,
}

#[derive(Deserialize)]
struct SessionView {
    last_seq: i64,
}

#[derive(Deserialize)]
struct RunOutcome {
    status: String,
    #[serde(default)]
    error: Option<Value>,
}

impl Client {
    fn new(base: &str, token: Option<String>, connections: usize) -> anyhow::Result<Client> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(connections.max(8))
            .tcp_nodelay(true)
            .no_proxy()
            .connect_timeout(Duration::from_secs(10))
            .build()?;
        Ok(Client {
            http,
            base: base.to_string(),
            token,
            errors: Errors::default(),
        })
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let request = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => request.header(AUTHORIZATION, format!("Bearer {token}")),
            None => request,
        }
    }

    async fn create_session(&self) -> anyhow::Result<String> {
        let response = self
            .request(Method::POST, "/v1/sessions")
            .json(&json!({"title": "bench"}))
            .timeout(Duration::from_secs(60))
            .send()
            .await?;
        let response = expect_status(response, StatusCode::CREATED, "POST /v1/sessions").await?;
        Ok(response.json::<Created>().await?.id)
    }

    async fn run_turn(&self, session: &str, turn: usize) -> anyhow::Result<()> {
        let response = self
            .request(
                Method::POST,
                &format!("/v1/sessions/{session}/runs?wait=true"),
            )
            .json(&json!({"input": format!("bench turn {turn}")}))
            .timeout(TURN_TIMEOUT)
            .send()
            .await?;
        let response = expect_status(response, StatusCode::OK, "POST …/runs?wait=true").await?;
        let outcome: RunOutcome = response.json().await?;
        if outcome.status != "completed" {
            bail!(
                "a turn ended {}: {}",
                outcome.status,
                outcome.error.unwrap_or(Value::Null)
            );
        }
        Ok(())
    }

    async fn last_seq(&self, session: &str) -> anyhow::Result<i64> {
        let response = self
            .request(Method::GET, &format!("/v1/sessions/{session}"))
            .timeout(Duration::from_secs(60))
            .send()
            .await?;
        let response = expect_status(response, StatusCode::OK, "GET /v1/sessions/{id}").await?;
        Ok(response.json::<SessionView>().await?.last_seq)
    }

    async fn open_events(&self, session: &str, after: i64) -> anyhow::Result<reqwest::Response> {
        let mut request = self
            .request(Method::GET, &format!("/v1/sessions/{session}/events"))
            .header(ACCEPT, "text/event-stream");
        if after > 0 {
            request = request.header("Last-Event-ID", after.to_string());
        }
        let response = request.send().await?;
        expect_status(response, StatusCode::OK, "GET …/events (SSE)").await
    }
}

async fn expect_status(
    response: reqwest::Response,
    expected: StatusCode,
    what: &str,
) -> anyhow::Result<reqwest::Response> {
    let status = response.status();
    if status == expected {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    let body: String = body.chars().take(300).collect();
    bail!("{what}: HTTP {status}: {body}")
}

// ---- SSE subscribers -------------------------------------------------------------------------

/// What one subscriber saw.
#[derive(Debug, Default)]
struct Subscriber {
    /// The newest seq received.
    last: i64,
    /// Events received (duplicates included).
    received: u64,
    gaps: u64,
    duplicates: u64,
    reconnects: u64,
    /// Ended before the session's last event arrived.
    incomplete: bool,
    /// Delta → client latencies, in µs.
    deltas: Vec<u64>,
    buffer: Vec<u8>,
}

impl Subscriber {
    /// Consumes network bytes: complete frames are checked and counted, the rest kept.
    fn feed(&mut self, bytes: &[u8], stamps: bool) {
        let now = unix_micros();
        let mut buffer = std::mem::take(&mut self.buffer);
        buffer.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(end) = find_frame_end(&buffer[start..]) {
            self.frame(&buffer[start..start + end], now, stamps);
            start += end + 2;
        }
        buffer.drain(..start);
        self.buffer = buffer;
    }

    fn frame(&mut self, frame: &[u8], now: u64, stamps: bool) {
        let mut id = None;
        let mut kind: &[u8] = b"";
        let mut data: &[u8] = b"";
        for line in frame.split(|&b| b == b'\n') {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(v) = field(line, b"id") {
                id = std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.trim().parse::<i64>().ok());
            } else if let Some(v) = field(line, b"event") {
                kind = v;
            } else if let Some(v) = field(line, b"data") {
                data = v;
            }
        }
        let Some(seq) = id else {
            return; // a heartbeat comment
        };
        self.received += 1;
        if seq <= self.last {
            self.duplicates += 1;
            return;
        }
        if seq != self.last + 1 {
            self.gaps += 1;
        }
        self.last = seq;
        if stamps && kind == b"agent.assistant-stream" {
            if let Ok(text) = std::str::from_utf8(data) {
                self.deltas
                    .extend(parse_stamps(text).map(|sent| now.saturating_sub(sent)));
            }
        }
    }
}

fn find_frame_end(bytes: &[u8]) -> Option<usize> {
    bytes.windows(2).position(|w| w == b"\n\n")
}

/// The value of an SSE field line `name: value` (one optional space after the colon).
fn field<'a>(line: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    let rest = line.strip_prefix(name)?.strip_prefix(b":")?;
    Some(rest.strip_prefix(b" ").unwrap_or(rest))
}

enum StreamEnd {
    /// The session's last event arrived.
    Done,
    /// The server closed the stream (a client reconnects with `Last-Event-ID`).
    Closed,
    Failed(String),
    TimedOut,
}

/// Follows a session's events until its last seq (sent on `target` after the last turn)
/// arrived, reconnecting like an EventSource when the stream ends early.
async fn subscribe(
    client: Arc<Client>,
    session: String,
    ready: oneshot::Sender<()>,
    mut target: watch::Receiver<Option<i64>>,
    stamps: bool,
) -> Subscriber {
    let mut ready = Some(ready);
    let mut sub = Subscriber::default();
    loop {
        let response = match client.open_events(&session, sub.last).await {
            Ok(response) => response,
            Err(error) => {
                client.errors.record(format!("subscriber: {error:#}"));
                if sub.reconnects >= u64::from(MAX_RECONNECTS) {
                    sub.incomplete = true;
                    return sub;
                }
                sub.reconnects += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        if let Some(ready) = ready.take() {
            let _ = ready.send(());
        }
        match follow(response, &mut sub, &mut target, stamps).await {
            StreamEnd::Done => return sub,
            StreamEnd::TimedOut => {
                sub.incomplete = true;
                return sub;
            }
            StreamEnd::Closed => {}
            StreamEnd::Failed(error) => client.errors.record(format!("subscriber: {error}")),
        }
        if sub.reconnects >= u64::from(MAX_RECONNECTS) {
            sub.incomplete = true;
            return sub;
        }
        sub.reconnects += 1;
    }
}

async fn follow(
    mut response: reqwest::Response,
    sub: &mut Subscriber,
    target: &mut watch::Receiver<Option<i64>>,
    stamps: bool,
) -> StreamEnd {
    // Until the last turn ended: read, and watch for the target.
    let goal = loop {
        if let Some(goal) = *target.borrow() {
            break goal;
        }
        tokio::select! {
            chunk = response.chunk() => match chunk {
                Ok(Some(bytes)) => sub.feed(&bytes, stamps),
                Ok(None) => return StreamEnd::Closed,
                Err(error) => return StreamEnd::Failed(error.to_string()),
            },
            changed = target.changed() => {
                if changed.is_err() && target.borrow().is_none() {
                    // The session gave up without a target (its requests failed).
                    return StreamEnd::TimedOut;
                }
            }
        }
    };
    // Then: the remaining events, within the drain timeout.
    let deadline = Instant::now() + DRAIN_TIMEOUT;
    while sub.last < goal {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Err(_) => return StreamEnd::TimedOut,
            Ok(Ok(Some(bytes))) => sub.feed(&bytes, stamps),
            Ok(Ok(None)) => return StreamEnd::Closed,
            Ok(Err(error)) => return StreamEnd::Failed(error.to_string()),
        }
    }
    StreamEnd::Done
}

// ---- the turn workload -----------------------------------------------------------------------

#[derive(Default)]
struct SessionOutcome {
    /// Turn latencies, in µs.
    latencies: Vec<u64>,
    turns_end: Option<Instant>,
    last_seq: i64,
    subscribers: Vec<Subscriber>,
}

async fn drive_session(
    client: Arc<Client>,
    turns: usize,
    subscribers: usize,
    stamps: bool,
) -> SessionOutcome {
    let mut outcome = SessionOutcome::default();
    let session = match client.create_session().await {
        Ok(id) => id,
        Err(error) => {
            client.errors.record(format!("{error:#}"));
            return outcome;
        }
    };
    let (target_tx, target_rx) = watch::channel(None);
    let mut tasks = Vec::with_capacity(subscribers);
    let mut readies = Vec::with_capacity(subscribers);
    for _ in 0..subscribers {
        let (ready_tx, ready_rx) = oneshot::channel();
        tasks.push(tokio::spawn(subscribe(
            client.clone(),
            session.clone(),
            ready_tx,
            target_rx.clone(),
            stamps,
        )));
        readies.push(ready_rx);
    }
    for ready in readies {
        let _ = ready.await;
    }
    for turn in 1..=turns {
        let start = Instant::now();
        match client.run_turn(&session, turn).await {
            Ok(()) => outcome.latencies.push(micros(start.elapsed())),
            Err(error) => client.errors.record(format!("{error:#}")),
        }
    }
    outcome.turns_end = Some(Instant::now());
    match client.last_seq(&session).await {
        Ok(seq) => {
            outcome.last_seq = seq;
            let _ = target_tx.send(Some(seq));
        }
        Err(error) => client.errors.record(format!("{error:#}")),
    }
    drop(target_tx);
    for task in tasks {
        match task.await {
            Ok(sub) => {
                if sub.received as i64 != outcome.last_seq
                    || sub.gaps > 0
                    || sub.duplicates > 0
                    || sub.incomplete
                {
                    client.errors.record(format!(
                        "subscriber of session {session}: {} events for last seq {} ({} gaps, {} duplicates{})",
                        sub.received,
                        outcome.last_seq,
                        sub.gaps,
                        sub.duplicates,
                        if sub.incomplete { ", incomplete" } else { "" }
                    ));
                }
                outcome.subscribers.push(sub);
            }
            Err(error) => client.errors.record(format!("subscriber task: {error}")),
        }
    }
    outcome
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn cpu(pid: Option<u32>) -> Option<f64> {
    pid.and_then(|pid| Proc::Pid(pid).cpu_seconds().ok())
}

async fn turns(args: &BenchArgs, env: &Environment) -> anyhow::Result<Report> {
    let c = args.concurrency;
    let s = args.subscribers;
    let client = Arc::new(Client::new(
        &env.base,
        args.api_token.clone(),
        c * (s + 1) + 8,
    )?);
    let stamps = s > 0;
    if args.warmup_turns > 0 {
        drive_session(client.clone(), args.warmup_turns, 0, false).await;
    }

    let cpu_before = cpu(env.pid);
    let self_before = Proc::This.cpu_seconds().unwrap_or(0.0);
    let started = Instant::now();
    let tasks: Vec<_> = (0..c)
        .map(|_| tokio::spawn(drive_session(client.clone(), args.turns, s, stamps)))
        .collect();
    let mut outcomes = Vec::with_capacity(c);
    for task in tasks {
        match task.await {
            Ok(outcome) => outcomes.push(outcome),
            Err(error) => client.errors.record(format!("session task: {error}")),
        }
    }
    let cpu_after = cpu(env.pid);
    let self_after = Proc::This.cpu_seconds().unwrap_or(0.0);
    let ended = outcomes
        .iter()
        .filter_map(|o| o.turns_end)
        .max()
        .unwrap_or_else(Instant::now);
    let wall = ended
        .saturating_duration_since(started)
        .as_secs_f64()
        .max(1e-9);

    let mut latencies: Vec<u64> = outcomes
        .iter()
        .flat_map(|o| o.latencies.iter().copied())
        .collect();
    let mut deltas: Vec<u64> = outcomes
        .iter()
        .flat_map(|o| o.subscribers.iter().flat_map(|s| s.deltas.iter().copied()))
        .collect();
    let turns_completed = latencies.len();
    let events: i64 = outcomes.iter().map(|o| o.last_seq).sum();
    let subs = outcomes.iter().flat_map(|o| o.subscribers.iter());
    let subscriber_report = (s > 0).then(|| {
        let mut r = SubscriberReport::default();
        for sub in subs {
            r.streams += 1;
            r.events_received += sub.received;
            r.gaps += sub.gaps;
            r.duplicates += sub.duplicates;
            r.reconnects += sub.reconnects;
            r.incomplete += u64::from(sub.incomplete);
        }
        r
    });

    let mut report = Report {
        mode: "turns",
        provider: args.provider.as_str(),
        server: env.description.clone(),
        concurrency: c,
        turns_per_session: args.turns,
        subscribers_per_session: s,
        pieces: args.pieces,
        piece_delay_ms: args.piece_delay_ms,
        tool_calls: args.tool_calls,
        turns_completed,
        wall_s: wall,
        turns_per_s: turns_completed as f64 / wall,
        turn_latency: Summary::of_micros(&mut latencies),
        delta_to_client: Summary::of_micros(&mut deltas),
        events_persisted: events,
        events_per_s: events as f64 / wall,
        loadgen_cpu_s: self_after - self_before,
        fake_model_in_process: env.fake_task.is_some(),
        subscribers: subscriber_report,
        ..Report::default()
    };
    if let (Some(before), Some(after)) = (cpu_before, cpu_after) {
        report.server_cpu_s = Some(after - before);
        if turns_completed > 0 {
            report.server_cpu_ms_per_turn =
                Some((after - before) * 1000.0 / turns_completed as f64);
        }
    }
    report.server_peak_rss_kb = env
        .pid
        .and_then(|pid| Proc::Pid(pid).status_kb("VmHWM").ok());

    let floor_client_errors = Errors::default();
    if !args.no_floor && args.provider == BenchProvider::Fake {
        match &env.fake_url {
            Some(url) => {
                let floor = floor(args, url, &floor_client_errors).await?;
                if let (Some(server), Some(model)) = (&report.turn_latency, &floor.turn_latency) {
                    report.overhead_p50_ms = Some(server.p50_ms - model.p50_ms);
                    if model.p50_ms > 0.0 {
                        report.ratio_p50 = Some(server.p50_ms / model.p50_ms);
                    }
                }
                report.floor = Some(floor);
            }
            None => report
                .notes
                .push("no floor: pass --fake-model-url with --server".to_string()),
        }
    }
    report.errors = client.errors.count() + floor_client_errors.count();
    report.error_samples = client.errors.samples();
    report.error_samples.extend(floor_client_errors.samples());
    Ok(report)
}

// ---- the floor: the same workload straight to the fake model ---------------------------------

/// The tool schemas sent with every floor request (what the server offers the model).
fn floor_tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "list_files",
            "description": "List the files and directories at a path inside the workspace.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        }},
        {"type": "function", "function": {
            "name": "read_file",
            "description": "Read a text file inside the workspace.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                           "required": ["path"]},
        }},
    ])
}

/// One streamed reply, as a client reads it.
#[derive(Default)]
struct FloorReply {
    text: String,
    tool_calls: Vec<Value>,
    done: bool,
}

async fn floor(args: &BenchArgs, url: &str, errors: &Errors) -> anyhow::Result<Floor> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency + 8)
        .tcp_nodelay(true)
        .no_proxy()
        .build()?;
    let endpoint = format!("{url}/chat/completions");
    let tools = Arc::new(floor_tools());
    if args.warmup_turns > 0 {
        floor_session(&http, &endpoint, &tools, args.warmup_turns, errors).await;
    }
    let started = Instant::now();
    let sessions = futures::future::join_all(
        (0..args.concurrency).map(|_| floor_session(&http, &endpoint, &tools, args.turns, errors)),
    )
    .await;
    let wall = started.elapsed().as_secs_f64().max(1e-9);
    let mut latencies: Vec<u64> = sessions.into_iter().flatten().collect();
    Ok(Floor {
        wall_s: wall,
        turns_per_s: latencies.len() as f64 / wall,
        turn_latency: Summary::of_micros(&mut latencies),
    })
}

/// T turns of one conversation, each: tool-call replies then the text reply, with the history
/// growing as the server's would. Returns the turn latencies in µs.
async fn floor_session(
    http: &reqwest::Client,
    endpoint: &str,
    tools: &Value,
    turns: usize,
    errors: &Errors,
) -> Vec<u64> {
    let mut messages =
        vec![json!({"role": "system", "content": crate::config::DEFAULT_SYSTEM_PROMPT})];
    let mut latencies = Vec::with_capacity(turns);
    'turns: for turn in 1..=turns {
        messages.push(json!({"role": "user", "content": format!("bench turn {turn}")}));
        let start = Instant::now();
        // The server's default step limit.
        for _ in 0..20 {
            let body = json!({
                "model": "fake",
                "messages": messages,
                "stream": true,
                "stream_options": {"include_usage": true},
                "tools": tools,
            });
            let reply = match floor_request(http, endpoint, &body).await {
                Ok(reply) => reply,
                Err(error) => {
                    errors.record(format!("floor: {error:#}"));
                    continue 'turns;
                }
            };
            if reply.tool_calls.is_empty() {
                messages.push(json!({"role": "assistant", "content": reply.text}));
                latencies.push(micros(start.elapsed()));
                continue 'turns;
            }
            let ids: Vec<String> = reply
                .tool_calls
                .iter()
                .map(|c| c["id"].as_str().unwrap_or("call").to_string())
                .collect();
            messages.push(
                json!({"role": "assistant", "content": null, "tool_calls": reply.tool_calls}),
            );
            for id in ids {
                messages.push(json!({
                    "role": "tool",
                    "tool_call_id": id,
                    "content": "Cargo.toml\nREADME.md\nsrc/",
                }));
            }
        }
        errors.record("floor: a turn did not end within 20 model calls");
    }
    latencies
}

async fn floor_request(
    http: &reqwest::Client,
    endpoint: &str,
    body: &Value,
) -> anyhow::Result<FloorReply> {
    let response = http
        .post(endpoint)
        .header(AUTHORIZATION, "Bearer bench")
        .json(body)
        .timeout(TURN_TIMEOUT)
        .send()
        .await?;
    let response = expect_status(response, StatusCode::OK, "POST /chat/completions").await?;
    let mut reply = FloorReply::default();
    let mut buffer: Vec<u8> = Vec::new();
    let mut stream = response.bytes_stream();
    while let Some(bytes) = stream.next().await {
        buffer.extend_from_slice(&bytes?);
        let mut start = 0;
        while let Some(end) = find_frame_end(&buffer[start..]) {
            floor_frame(&buffer[start..start + end], &mut reply)?;
            start += end + 2;
        }
        buffer.drain(..start);
        if reply.done {
            break;
        }
    }
    if !reply.done {
        bail!("the model's stream ended without [DONE]");
    }
    Ok(reply)
}

fn floor_frame(frame: &[u8], reply: &mut FloorReply) -> anyhow::Result<()> {
    for line in frame.split(|&b| b == b'\n') {
        let Some(data) = field(line, b"data") else {
            continue;
        };
        if data == b"[DONE]" {
            reply.done = true;
            continue;
        }
        let chunk: Value = serde_json::from_slice(data)?;
        let delta = &chunk["choices"][0]["delta"];
        if let Some(text) = delta["content"].as_str() {
            reply.text.push_str(text);
        }
        if let Some(calls) = delta["tool_calls"].as_array() {
            reply.tool_calls.extend(
                calls
                    .iter()
                    .map(|c| json!({"id": c["id"], "type": "function", "function": c["function"]})),
            );
        }
    }
    Ok(())
}

// ---- idle sessions ---------------------------------------------------------------------------

async fn idle(args: &BenchArgs, env: &Environment, n: usize) -> anyhow::Result<Report> {
    let pid = env.pid.ok_or_else(|| {
        anyhow!("--idle-sessions measures the server's memory: pass --server-pid")
    })?;
    let client = Arc::new(Client::new(
        &env.base,
        args.api_token.clone(),
        args.concurrency + 8,
    )?);
    // Warm up pools, caches and the allocator with a few sessions first.
    let warm = futures::stream::iter(0..args.concurrency.max(4))
        .map(|_| drive_session(client.clone(), 1, 0, false))
        .buffer_unordered(args.concurrency)
        .collect::<Vec<_>>();
    warm.await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = Proc::Pid(pid).status_kb("VmRSS")?;
    let started = Instant::now();
    let outcomes = futures::stream::iter(0..n)
        .map(|_| drive_session(client.clone(), 1, 0, false))
        .buffer_unordered(args.concurrency)
        .collect::<Vec<_>>()
        .await;
    let elapsed = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_after = Proc::Pid(pid).status_kb("VmRSS")?;
    let mut latencies: Vec<u64> = outcomes
        .iter()
        .flat_map(|o| o.latencies.iter().copied())
        .collect();
    let mut report = Report {
        mode: "idle-sessions",
        provider: args.provider.as_str(),
        server: env.description.clone(),
        concurrency: args.concurrency,
        turns_per_session: 1,
        pieces: args.pieces,
        piece_delay_ms: args.piece_delay_ms,
        tool_calls: args.tool_calls,
        turns_completed: latencies.len(),
        wall_s: elapsed,
        turns_per_s: latencies.len() as f64 / elapsed.max(1e-9),
        turn_latency: Summary::of_micros(&mut latencies),
        events_persisted: outcomes.iter().map(|o| o.last_seq).sum(),
        server_peak_rss_kb: Proc::Pid(pid).status_kb("VmHWM").ok(),
        idle: Some(IdleReport {
            sessions: n,
            rss_before_kb: rss_before,
            rss_after_kb: rss_after,
            kb_per_session: (rss_after as f64 - rss_before as f64) / n as f64,
        }),
        ..Report::default()
    };
    report.events_per_s = report.events_persisted as f64 / elapsed.max(1e-9);
    report.errors = client.errors.count();
    report.error_samples = client.errors.samples();
    Ok(report)
}

// ---- the report ------------------------------------------------------------------------------

#[derive(Debug, Default, Serialize)]
struct Floor {
    wall_s: f64,
    turns_per_s: f64,
    turn_latency: Option<Summary>,
}

#[derive(Debug, Default, Serialize)]
struct SubscriberReport {
    streams: u64,
    events_received: u64,
    gaps: u64,
    duplicates: u64,
    incomplete: u64,
    reconnects: u64,
}

#[derive(Debug, Default, Serialize)]
struct IdleReport {
    sessions: usize,
    rss_before_kb: u64,
    rss_after_kb: u64,
    kb_per_session: f64,
}

#[derive(Debug, Default, Serialize)]
struct Report {
    mode: &'static str,
    provider: &'static str,
    server: String,
    concurrency: usize,
    turns_per_session: usize,
    subscribers_per_session: usize,
    pieces: usize,
    piece_delay_ms: u64,
    tool_calls: usize,
    turns_completed: usize,
    wall_s: f64,
    turns_per_s: f64,
    /// Client-side time of `POST …/runs?wait=true`.
    turn_latency: Option<Summary>,
    /// From a piece leaving the fake model to its `agent.assistant-stream` frame at a
    /// subscriber.
    delta_to_client: Option<Summary>,
    /// Sum over the measured sessions of their last event seq.
    events_persisted: i64,
    events_per_s: f64,
    server_cpu_s: Option<f64>,
    server_cpu_ms_per_turn: Option<f64>,
    server_peak_rss_kb: Option<u64>,
    /// CPU of this process (load generator, and the in-process fake model) during the run.
    loadgen_cpu_s: f64,
    fake_model_in_process: bool,
    floor: Option<Floor>,
    /// Server turn latency p50 − floor turn latency p50.
    overhead_p50_ms: Option<f64>,
    /// Server turn latency p50 / floor turn latency p50.
    ratio_p50: Option<f64>,
    subscribers: Option<SubscriberReport>,
    idle: Option<IdleReport>,
    /// The machine's 1-minute load average before the run, and its CPUs.
    load_average_1m: Option<f64>,
    cpus: usize,
    server_log_errors: u64,
    server_log_warnings: u64,
    errors: u64,
    error_samples: Vec<String>,
    notes: Vec<String>,
}

fn latency_line(s: &Summary) -> String {
    format!(
        "p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  max {:.2} ms  (mean {:.2} ms, n={})",
        s.p50_ms, s.p90_ms, s.p99_ms, s.max_ms, s.mean_ms, s.count
    )
}

impl Report {
    fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "tah bench — {} ({} provider)",
            self.server, self.provider
        );
        if let Some(load) = self.load_average_1m {
            let _ = writeln!(
                out,
                "machine:          {} CPUs, 1-min load average {load:.2} before the run",
                self.cpus
            );
        }
        let model = if self.provider == "mock" {
            format!("mock model, piece delay {} ms", self.piece_delay_ms)
        } else {
            format!(
                "{} tool call(s) + {} pieces per turn, piece delay {} ms",
                self.tool_calls, self.pieces, self.piece_delay_ms
            )
        };
        if let Some(idle) = &self.idle {
            let _ = writeln!(
                out,
                "workload:         {} sessions, one turn each ({model}), {} at a time",
                idle.sessions, self.concurrency
            );
            let _ = writeln!(
                out,
                "created in:       {:.2} s ({:.0} turns/s)",
                self.wall_s, self.turns_per_s
            );
            let _ = writeln!(
                out,
                "server RSS:       {} kB before → {} kB after, {:.1} kB per idle session",
                idle.rss_before_kb, idle.rss_after_kb, idle.kb_per_session
            );
        } else {
            let _ = writeln!(
                out,
                "workload:         {} session(s) × {} turns ({model}), {} SSE subscriber(s) per session",
                self.concurrency, self.turns_per_session, self.subscribers_per_session
            );
            let _ = writeln!(
                out,
                "turns:            {} completed in {:.3} s → {:.1} turns/s",
                self.turns_completed, self.wall_s, self.turns_per_s
            );
        }
        if let Some(s) = &self.turn_latency {
            let _ = writeln!(out, "turn latency:     {}", latency_line(s));
        }
        if let Some(floor) = &self.floor {
            if let Some(s) = &floor.turn_latency {
                let _ = writeln!(out, "floor (model):    {}", latency_line(s));
            }
            let _ = writeln!(
                out,
                "floor throughput: {:.1} turns/s ({:.3} s)",
                floor.turns_per_s, floor.wall_s
            );
        }
        if let (Some(overhead), Some(ratio)) = (self.overhead_p50_ms, self.ratio_p50) {
            let _ = writeln!(
                out,
                "overhead:         {overhead:+.2} ms per turn at p50 (server/floor = {ratio:.2}×)"
            );
        }
        if let Some(s) = &self.delta_to_client {
            let _ = writeln!(out, "delta → client:   {}", latency_line(s));
        }
        let _ = writeln!(
            out,
            "events persisted: {} ({:.0} events/s)",
            self.events_persisted, self.events_per_s
        );
        match (self.server_cpu_s, self.server_cpu_ms_per_turn) {
            (Some(cpu), Some(per_turn)) => {
                let _ = writeln!(
                    out,
                    "server CPU:       {cpu:.2} s → {per_turn:.3} ms per turn"
                );
            }
            (Some(cpu), None) => {
                let _ = writeln!(out, "server CPU:       {cpu:.2} s");
            }
            _ => {}
        }
        if let Some(kb) = self.server_peak_rss_kb {
            let _ = writeln!(
                out,
                "server peak RSS:  {:.1} MB (VmHWM)",
                kb as f64 / 1024.0
            );
        }
        if self.idle.is_none() {
            let _ = writeln!(
                out,
                "load generator:   {:.2} s CPU (this process{})",
                self.loadgen_cpu_s,
                if self.fake_model_in_process {
                    ", with the in-process fake model"
                } else {
                    ""
                }
            );
        }
        if let Some(s) = &self.subscribers {
            let _ = writeln!(
                out,
                "subscribers:      {} streams, {} events, {} gaps, {} duplicates, {} incomplete, {} reconnects",
                s.streams, s.events_received, s.gaps, s.duplicates, s.incomplete, s.reconnects
            );
        }
        if self.server_log_errors + self.server_log_warnings > 0 {
            let _ = writeln!(
                out,
                "server log:       {} ERROR, {} WARN lines",
                self.server_log_errors, self.server_log_warnings
            );
        }
        for note in &self.notes {
            let _ = writeln!(out, "note:             {note}");
        }
        let _ = writeln!(out, "errors:           {}", self.errors);
        for sample in &self.error_samples {
            let _ = writeln!(out, "  - {sample}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(seq: i64, kind: &str, data: &str) -> String {
        format!("id: {seq}\nevent: {kind}\ndata: {data}\n\n")
    }

    #[test]
    fn subscribers_check_seq_and_read_stamps_across_chunks() {
        let stamp = unix_micros() - 1500;
        let mut body = String::new();
        body.push_str(&frame(1, "session.created", "{}"));
        body.push_str(":heartbeat\n\n");
        body.push_str(&frame(
            2,
            "agent.assistant-stream",
            &format!(r#"{{"data":{{"text":"⏱{stamp}⏱ the "}}}}"#),
        ));
        body.push_str(&frame(2, "agent.assistant-stream", "{}"));
        body.push_str(&frame(4, "agent.finished", "{}"));
        let mut sub = Subscriber::default();
        // Split everywhere, inside the multi-byte stamp too.
        for piece in body.as_bytes().chunks(7) {
            sub.feed(piece, true);
        }
        assert_eq!(sub.received, 4);
        assert_eq!(sub.last, 4);
        assert_eq!(sub.duplicates, 1);
        assert_eq!(sub.gaps, 1);
        assert_eq!(sub.deltas.len(), 1);
        assert!(sub.deltas[0] >= 1500);
        assert!(sub.buffer.is_empty());
    }

    #[test]
    fn floor_frames_collect_text_and_tool_calls() {
        let mut reply = FloorReply::default();
        let frames = [
            r#"data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"a "}}]}"#,
            r#"data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"list_files","arguments":"{}"}}]}}]}"#,
            r#"data: {"choices":[],"usage":{"prompt_tokens":1}}"#,
            "data: [DONE]",
        ];
        for f in frames {
            floor_frame(f.as_bytes(), &mut reply).unwrap();
        }
        assert_eq!(reply.text, "a ");
        assert_eq!(reply.tool_calls.len(), 1);
        assert_eq!(reply.tool_calls[0]["id"], "c1");
        assert!(reply.done);
    }

    #[test]
    fn the_server_log_is_counted() {
        let log = ServerLog::default();
        log.line("2026-01-01T00:00:00Z  INFO tah: listening on http://127.0.0.1:1");
        log.line("2026-01-01T00:00:00Z  WARN tah: slow");
        log.line("2026-01-01T00:00:00Z ERROR tah: bad");
        assert_eq!(log.errors.load(Ordering::Relaxed), 1);
        assert_eq!(log.warnings.load(Ordering::Relaxed), 1);
        assert!(log.tail().contains("listening"));
    }
}
