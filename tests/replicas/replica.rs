//! One replica under test: the real `tah serve` on 127.0.0.1:0 with the mock model, its own
//! workspace, and the shared PostgreSQL database. Its stderr is drained into a buffer that is
//! printed when the test fails; the process is killed when the value is dropped.

use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

use crate::client::Api;

const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// The lease TTL of every replica in these tests (the heartbeat renews every ttl/3).
pub const LEASE_TTL_SECS: u64 = 2;

pub const README: &str = "# Demo\n\nDemo is a small sample project. It exists for tests.\n";

pub struct Replica {
    pub name: &'static str,
    pub api: Api,
    pub pid: u32,
    child: Option<Child>,
    log: Arc<Mutex<Vec<String>>>,
    /// Holds the workspace (`ws/`) and the working directory.
    _dir: TempDir,
}

impl Replica {
    /// Starts `tah serve` on `database_url` with `--mock-delay-ms mock_delay_ms`.
    pub async fn start(name: &'static str, database_url: &str, mock_delay_ms: u64) -> Replica {
        let dir = tempfile::Builder::new()
            .prefix("tah-replica-")
            .tempdir()
            .expect("create the replica's directory");
        let workspace = dir.path().join("ws");
        std::fs::create_dir_all(workspace.join("src")).expect("create ws/src");
        std::fs::write(workspace.join("README.md"), README).expect("write README.md");
        std::fs::write(workspace.join("src/main.rs"), "fn main() {}\n").expect("write main.rs");

        let mut command = Command::new(env!("CARGO_BIN_EXE_tah"));
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("TAH_") {
                command.env_remove(key);
            }
        }
        command
            .arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--database-url")
            .arg(database_url)
            .arg("--workspace")
            .arg(&workspace)
            .arg("--mock-delay-ms")
            .arg(mock_delay_ms.to_string())
            .arg("--lease-ttl-secs")
            .arg(LEASE_TTL_SECS.to_string())
            .current_dir(dir.path())
            .env("NO_COLOR", "1")
            .env("RUST_LOG", "info")
            .env_remove("OPENAI_API_KEY")
            .env_remove("ANTHROPIC_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("spawn tah serve");
        let pid = child.id().expect("the child has a pid");
        let stderr = child.stderr.take().expect("piped stderr");
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let (tx, rx) = oneshot::channel::<String>();
        {
            let log = log.clone();
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
                    log.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                }
            });
        }
        let address = match tokio::time::timeout(STARTUP_TIMEOUT, rx).await {
            Ok(Ok(address)) => address,
            other => {
                let _ = child.start_kill();
                let status = child.wait().await;
                let log = log.lock().unwrap_or_else(|e| e.into_inner()).join("\n");
                panic!(
                    "replica {name} did not listen ({other:?}, exit {status:?}); its log:\n{log}"
                );
            }
        };
        Replica {
            name,
            api: Api::new(name, &format!("http://{address}")),
            pid,
            child: Some(child),
            log,
            _dir: dir,
        }
    }

    /// The last `n` lines the replica printed.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        let skip = log.len().saturating_sub(n);
        log[skip..].join("\n")
    }

    /// Lines of the log that contain `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        let log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        log.iter().filter(|l| l.contains(needle)).cloned().collect()
    }

    /// Sends a signal by name (`STOP`, `CONT`, `TERM`, `KILL`) with kill(1).
    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid.to_string())
            .status()
            .expect("run kill(1)");
        assert!(
            status.success(),
            "kill -{signal} {} ({}) failed",
            self.pid,
            self.name
        );
    }

    /// SIGKILL, and reaps the process.
    pub async fn kill9(&mut self) {
        let mut child = self.child.take().expect("the replica runs");
        child.kill().await.expect("kill -9 the replica");
    }

    /// SIGTERM; waits up to `limit` for the exit: the status and how long it took.
    pub async fn terminate(&mut self, limit: Duration) -> (ExitStatus, Duration) {
        let started = Instant::now();
        self.signal("TERM");
        let child = self.child.as_mut().expect("the replica runs");
        match tokio::time::timeout(limit, child.wait()).await {
            Ok(status) => {
                self.child = None;
                (status.expect("wait for the replica"), started.elapsed())
            }
            Err(_) => panic!(
                "replica {} did not exit within {limit:?} of SIGTERM; its log:\n{}",
                self.name,
                self.log_tail(200)
            ),
        }
    }

    /// Whether the process is still alive (not exited).
    pub fn alive(&mut self) -> bool {
        match self.child.as_mut() {
            None => false,
            Some(child) => matches!(child.try_wait(), Ok(None)),
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let asked = std::env::var("REPLICAS_LOGS").is_ok_and(|v| v == "1");
        if std::thread::panicking() || asked {
            eprintln!(
                "----- replica {} (pid {}) log, last 150 lines -----\n{}\n----- end of {} -----",
                self.name,
                self.pid,
                self.log_tail(150),
                self.name
            );
        }
        if let Some(child) = self.child.as_mut() {
            // SIGKILL also ends a stopped process.
            let _ = child.start_kill();
        }
    }
}
