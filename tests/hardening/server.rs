//! The server under test: the real `tah` binary started on 127.0.0.1:0 with its own SQLite
//! file and workspace (stopped with SIGTERM, killed with SIGKILL, restarted on the same
//! database), and `Api`, a small HTTP client for it.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Plain requests; `?wait=true` runs get `RUN_TIMEOUT`.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
/// Lines of the server's stderr kept for failure reports.
const LOG_LINES: usize = 4_000;

pub const README: &str = "# Demo\n\nDemo is a small sample project. It exists for tests.\n";

pub struct Server {
    pub base: String,
    child: Option<Child>,
    args: Vec<String>,
    data: TempDir,
    workspace: TempDir,
    log: Arc<Mutex<VecDeque<String>>>,
}

fn workspace() -> TempDir {
    let dir = tempfile::Builder::new()
        .prefix("tah-hardening-ws-")
        .tempdir()
        .expect("create the workspace");
    std::fs::write(dir.path().join("README.md"), README).expect("write README.md");
    std::fs::create_dir_all(dir.path().join("src")).expect("create src/");
    std::fs::write(dir.path().join("src/main.rs"), "fn main() {}\n").expect("write src/main.rs");
    dir
}

impl Server {
    /// Starts `tah serve` with these extra arguments.
    pub async fn start(args: &[&str]) -> Server {
        let mut server = Server {
            base: String::new(),
            child: None,
            args: args.iter().map(|a| a.to_string()).collect(),
            data: tempfile::Builder::new()
                .prefix("tah-hardening-db-")
                .tempdir()
                .expect("create the data dir"),
            workspace: workspace(),
            log: Arc::default(),
        };
        server.spawn().await;
        server
    }

    pub fn db_path(&self) -> PathBuf {
        self.data.path().join("d.db")
    }

    /// A fresh client (no pooled connection to an earlier process).
    pub fn api(&self) -> Api {
        Api::new(&self.base)
    }

    /// The last `n` lines the server printed (across restarts).
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let skip = log.len().saturating_sub(n);
        log.iter()
            .skip(skip)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Starts the process (again) on the same database and workspace.
    pub async fn spawn(&mut self) {
        assert!(self.child.is_none(), "the server already runs");
        let mut command = Command::new(env!("CARGO_BIN_EXE_tah"));
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("TAH_") {
                command.env_remove(name);
            }
        }
        command
            .arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--database-url")
            .arg(format!("sqlite://{}", self.db_path().display()))
            .arg("--workspace")
            .arg(self.workspace.path())
            .args(&self.args)
            .current_dir(self.data.path())
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("OPENAI_API_KEY")
            .env_remove("ANTHROPIC_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("spawn tah");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = oneshot::channel::<String>();
        let log = self.log.clone();
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            let mut tx = Some(tx);
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(at) = line.find("listening on http://") {
                    let address: String = line[at + "listening on http://".len()..]
                        .chars()
                        .take_while(|c| !c.is_whitespace() && *c != '"')
                        .collect();
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(address);
                    }
                }
                let mut log = log.lock().unwrap_or_else(|e| e.into_inner());
                if log.len() == LOG_LINES {
                    log.pop_front();
                }
                log.push_back(line);
            }
        });
        match tokio::time::timeout(STARTUP_TIMEOUT, rx).await {
            Ok(Ok(address)) => self.base = format!("http://{address}"),
            other => {
                let _ = child.start_kill();
                let status = child.wait().await;
                panic!(
                    "tah did not listen ({other:?}, exit {status:?}); its log:\n{}",
                    self.log_tail(200)
                );
            }
        }
        self.child = Some(child);
    }

    /// SIGKILL: no chance to clean up.
    pub async fn kill9(&mut self) {
        let mut child = self.child.take().expect("the server runs");
        child.kill().await.expect("kill -9 tah");
    }

    /// SIGTERM; waits up to `limit` for the exit. Returns the status and how long it took.
    pub async fn terminate(&mut self, limit: Duration) -> (ExitStatus, Duration) {
        let mut child = self.child.take().expect("the server runs");
        let pid = child.id().expect("the child has a pid");
        let started = Instant::now();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill -TERM");
        assert!(sent.success(), "kill -TERM {pid} failed");
        match tokio::time::timeout(limit, child.wait()).await {
            Ok(status) => (status.expect("wait for tah"), started.elapsed()),
            Err(_) => {
                let _ = child.kill().await;
                panic!(
                    "tah did not exit within {limit:?} of SIGTERM; its log:\n{}",
                    self.log_tail(200)
                );
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.start_kill();
        }
    }
}

/// What a request produced: a status and the body (JSON, or the text as a JSON string).
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: StatusCode,
    pub body: Value,
}

#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub http: reqwest::Client,
}

impl Api {
    pub fn new(base: &str) -> Api {
        Api {
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

    /// One request; `Err` is a transport error (no HTTP answer).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Reply, String> {
        let timeout = if path.contains("wait=true") {
            RUN_TIMEOUT
        } else {
            REQUEST_TIMEOUT
        };
        let mut request = self
            .http
            .request(method.clone(), self.url(path))
            .timeout(timeout);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| format!("{method} {path}: {e:#}"))?;
        let status = response.status();
        let bytes = response
            .bytes()
            .await
            .map_err(|e| format!("{method} {path}: reading the body: {e:#}"))?;
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        Ok(Reply { status, body })
    }

    /// A request that must answer `expected`; panics otherwise.
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
                "{method} {path}: expected {expected}, got {} {}",
                reply.status, reply.body
            ),
            Err(e) => panic!("{e}"),
        }
    }

    pub async fn get(&self, path: &str) -> Value {
        self.expect(Method::GET, path, None, StatusCode::OK).await
    }

    pub async fn create_session(&self) -> Result<Reply, String> {
        self.call(Method::POST, "/v1/sessions", Some(&json!({})))
            .await
    }

    /// Every item of a paged list (pages of 500), following `next_cursor`.
    pub async fn pages(&self, path: &str, cursor_param: &str) -> Vec<Value> {
        let sep = if path.contains('?') { '&' } else { '?' };
        let mut out = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..100_000 {
            let url = match &cursor {
                None => format!("{path}{sep}limit=500"),
                Some(c) => format!("{path}{sep}limit=500&{cursor_param}={c}"),
            };
            let page = self.get(&url).await;
            out.extend(
                page["data"]
                    .as_array()
                    .unwrap_or_else(|| panic!("{url}: no data array: {page}"))
                    .iter()
                    .cloned(),
            );
            match &page["next_cursor"] {
                Value::String(next) => {
                    assert_ne!(
                        cursor.as_deref(),
                        Some(next.as_str()),
                        "{url}: cursor repeats"
                    );
                    cursor = Some(next.clone());
                }
                Value::Null => return out,
                other => panic!("{url}: next_cursor is not a string: {other}"),
            }
        }
        panic!("{path}: paging does not end")
    }

    pub async fn sessions(&self) -> Vec<Value> {
        self.pages("/v1/sessions", "cursor").await
    }

    pub async fn session(&self, id: &str) -> Value {
        self.get(&format!("/v1/sessions/{id}")).await
    }

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
}
