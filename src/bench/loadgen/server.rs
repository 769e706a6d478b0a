//! The server under test: a spawned `tah serve` on 127.0.0.1:0 (its address read from the
//! ready line it writes to stdout, its stderr counted for errors and warnings) with the fake
//! model behind it — in-process, or with subscribers in a process of its own, so that the
//! subscribers' process is nothing but the clients — or a server someone else started
//! (`--server`).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context as _};
use tah::app::ReadyLine;
use tah::cli::{BenchArgs, BenchProvider};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::bench::fake_model::{self, unix_micros, FakeKnobs};

/// A temporary directory removed on drop.
pub struct TempDir(PathBuf);

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
pub struct ServerLog {
    tail: Mutex<VecDeque<String>>,
    pub errors: AtomicU64,
    pub warnings: AtomicU64,
}

impl ServerLog {
    pub fn line(&self, line: &str) {
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

    pub fn tail(&self) -> String {
        self.tail
            .lock()
            .map(|t| t.iter().cloned().collect::<Vec<_>>().join("\n"))
            .unwrap_or_default()
    }
}

pub struct LogCounts {
    pub errors: u64,
    pub warnings: u64,
}

/// The server under test and the fake model behind it.
pub struct Environment {
    /// `http://host:port`, without a trailing slash.
    pub base: String,
    /// The server process, for `/proc`.
    pub pid: Option<u32>,
    /// The fake model's base URL (`http://addr/v1`) for the floor, when known.
    pub fake_url: Option<String>,
    /// How the server was obtained, for the report.
    pub description: String,
    child: Option<Child>,
    fake_task: Option<JoinHandle<std::io::Result<()>>>,
    /// The fake model's own process, when it has one.
    fake_child: Option<Child>,
    log: Arc<ServerLog>,
    tempdir: Option<TempDir>,
}

impl Environment {
    pub async fn start(args: &BenchArgs) -> anyhow::Result<Environment> {
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
                fake_child: None,
                log: Arc::new(ServerLog::default()),
                tempdir: None,
            });
        }
        let tempdir = TempDir::new().context("cannot create a temporary directory")?;
        let workspace = tempdir.path().join("workspace");
        write_workspace(&workspace).context("cannot write the bench workspace")?;
        let (fake_url, fake_task, fake_child) = match args.provider {
            BenchProvider::Fake if args.subscribers > 0 => {
                // A piece's stamp is its send time; a model in the subscribers' process would
                // delay their reads, and the other way round.
                let (child, addr) = spawn_fake_model_process(args).await?;
                (Some(format!("http://{addr}/v1")), None, Some(child))
            }
            BenchProvider::Fake => {
                let addr = "127.0.0.1:0".parse().map_err(|e| anyhow!("{e}"))?;
                let (addr, task) = fake_model::spawn_fake_model(addr, FakeKnobs::from(args))
                    .await
                    .context("cannot start the fake model")?;
                (Some(format!("http://{addr}/v1")), Some(task), None)
            }
            BenchProvider::Mock => (None, None, None),
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
                    .arg(args.reply.piece_delay_ms.to_string());
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
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().context("cannot start `tah serve`")?;
        let pid = child.id();
        let (stdout, stderr) = match (child.stdout.take(), child.stderr.take()) {
            (Some(stdout), Some(stderr)) => (stdout, stderr),
            _ => bail!("no stdout or stderr from the server"),
        };
        let log = Arc::new(ServerLog::default());
        tokio::spawn(drain_stderr(stderr, log.clone()));
        let address =
            match tokio::time::timeout(Duration::from_secs(60), ReadyLine::read(stdout)).await {
                Ok(Some(ready)) => ready.listening,
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
            fake_child,
            log,
            tempdir: Some(tempdir),
        })
    }

    /// Whether the fake model runs in this process (its CPU counts as the load generator's).
    pub fn fake_model_in_process(&self) -> bool {
        self.fake_task.is_some()
    }

    /// The fake model's process, when it runs in one of its own.
    pub fn fake_model_pid(&self) -> Option<u32> {
        self.fake_child.as_ref().and_then(Child::id)
    }

    /// Stops what was spawned (the server gracefully if it can) and removes the temporary
    /// directory.
    pub async fn stop(mut self) -> LogCounts {
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
        if let Some(mut child) = self.fake_child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
        self.tempdir.take();
        LogCounts {
            errors: self.log.errors.load(Ordering::Relaxed),
            warnings: self.log.warnings.load(Ordering::Relaxed),
        }
    }
}

/// `tah fake-model` in a process of its own on 127.0.0.1:0, with the workload's replies and
/// every piece stamped; its address comes from its ready line.
pub async fn spawn_fake_model_process(args: &BenchArgs) -> anyhow::Result<(Child, SocketAddr)> {
    let exe = std::env::current_exe().context("cannot find the tah executable")?;
    let mut child = tokio::process::Command::new(exe)
        .args([
            "fake-model",
            "--listen",
            "127.0.0.1:0",
            "--stamp-every-piece",
        ])
        .args(["--pieces", &args.reply.pieces.to_string()])
        .args(["--piece-delay-ms", &args.reply.piece_delay_ms.to_string()])
        .args(["--tool-calls", &args.reply.tool_calls.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start `tah fake-model`")?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("no stdout from the fake model"))?;
    match tokio::time::timeout(Duration::from_secs(30), ReadyLine::read(stdout)).await {
        Ok(Some(ready)) => Ok((child, ready.listening)),
        _ => bail!("`tah fake-model` did not report its address"),
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

async fn drain_stderr(stderr: tokio::process::ChildStderr, log: Arc<ServerLog>) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
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

#[cfg(test)]
mod tests {
    use super::*;

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
