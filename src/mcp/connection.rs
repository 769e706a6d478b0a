//! One connection to an MCP server: a child process spoken to over its pipes (in a process
//! group of its own, so that ending it ends whatever it started), or a streamable HTTP
//! endpoint; the `initialize` handshake; and how the connection ends, by itself or when tah
//! closes it.
//!
//! An HTTP server has no process to watch and rmcp's transport outlives failed requests, so a
//! connection to one is pinged every [`PING_EVERY`]: one that fails to answer (refused, or not
//! within the handshake timeout) has ended.
//!
//! A child gets a small environment (the variables below and its configured `env`), never
//! tah's own: tah's environment holds provider keys and API tokens that are no server's
//! business. Its stderr is logged line by line under the server's name.

use std::collections::HashMap;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::{ClientCapabilities, ClientConfig, ClientRequest, Implementation, PingRequest};
use rmcp::service::{
    NotificationContext, Peer, QuitReason, RoleClient, RunningService, ServiceExt,
};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ClientHandler;
use rustix::process::{kill_process_group, Pid, Signal};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};
use tokio::sync::Notify;

use super::config::Transport;
use super::LogRedactor;

/// The variables of tah's environment a stdio server inherits (what MCP hosts commonly pass:
/// enough to find programs, a home and a locale).
pub const INHERITED_ENV: &[&str] = &[
    "HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LANG", "TMPDIR",
];

/// How long a child has to exit once its stdin is closed, and again after SIGTERM.
const EXIT_GRACE: Duration = Duration::from_millis(1500);
/// How often an HTTP server is pinged to see that it is still there.
const PING_EVERY: Duration = Duration::from_secs(5);
/// Longest stderr line logged; the rest is cut.
const MAX_LOG_LINE: usize = 2048;

/// A live connection: the client service and, for stdio, the child process.
pub struct Connection {
    service: RunningService<RoleClient, Host>,
    child: Option<ChildProcess>,
    /// How long a ping may take (the handshake's timeout).
    answer_within: Duration,
}

/// How a connection ended.
#[derive(Debug)]
pub enum Ended {
    /// By itself: the process exited or the server closed the connection (why, in words).
    Lost(String),
    /// tah stopped it.
    Stopped,
}

impl Connection {
    /// Connects and completes the handshake within `handshake_timeout`. A child started for a
    /// handshake that fails is ended before this returns.
    pub async fn open(
        server: &str,
        transport: &Transport,
        handshake_timeout: Duration,
        redact: Option<LogRedactor>,
    ) -> Result<Connection, String> {
        match transport {
            Transport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                let mut cmd = Command::new(command);
                cmd.args(args)
                    .env_clear()
                    .envs(
                        INHERITED_ENV
                            .iter()
                            .filter_map(|name| std::env::var_os(name).map(|value| (*name, value))),
                    )
                    .envs(env)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .process_group(0)
                    .kill_on_drop(true);
                crate::tools::sandbox::unshielded(&mut cmd);
                if let Some(cwd) = cwd {
                    cmd.current_dir(cwd);
                }
                let mut child = cmd
                    .spawn()
                    .map_err(|e| format!("cannot start {command:?}: {e}"))?;
                let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
                    return Err("its pipes could not be opened".into());
                };
                if let Some(stderr) = child.stderr.take() {
                    tokio::spawn(log_stderr(server.to_string(), stderr, redact));
                }
                let mut child = ChildProcess::new(child);
                let stdout = super::lines::Limited::new(server, stdout);
                let handshake = Host::new().serve((stdout, stdin));
                match tokio::time::timeout(handshake_timeout, handshake).await {
                    Ok(Ok(service)) => Ok(Connection {
                        service,
                        child: Some(child),
                        answer_within: handshake_timeout,
                    }),
                    Ok(Err(error)) => {
                        // The reason is clearer from how the process ended, when it did.
                        let exit = child.exited_within(Duration::from_millis(300)).await;
                        child.end().await;
                        Err(match exit {
                            Some(status) => format!("it {} during the handshake", describe(status)),
                            None => format!("the handshake failed: {error}"),
                        })
                    }
                    Err(_) => {
                        child.end().await;
                        Err(no_answer(handshake_timeout))
                    }
                }
            }
            Transport::Http { url, headers } => {
                let mut custom = HashMap::new();
                for (name, value) in headers {
                    let name = HeaderName::try_from(name.as_str())
                        .map_err(|_| format!("header name {name:?} is not valid"))?;
                    let value = HeaderValue::try_from(value.as_str())
                        .map_err(|_| format!("the value of header {name} is not valid"))?;
                    custom.insert(name, value);
                }
                install_crypto_provider();
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(custom);
                let transport = StreamableHttpClientTransport::from_config(config);
                match tokio::time::timeout(handshake_timeout, Host::new().serve(transport)).await {
                    Ok(Ok(service)) => Ok(Connection {
                        service,
                        child: None,
                        answer_within: handshake_timeout,
                    }),
                    Ok(Err(error)) => Err(format!("the handshake with {url} failed: {error}")),
                    Err(_) => Err(no_answer(handshake_timeout)),
                }
            }
        }
    }

    /// Where calls are sent; it stays usable (failing) once the connection is gone.
    pub fn peer(&self) -> Peer<RoleClient> {
        self.service.peer().clone()
    }

    /// Notified when the server says its tools changed (`notifications/tools/list_changed`).
    pub fn tools_changed(&self) -> Arc<Notify> {
        self.service.service().tools_changed.clone()
    }

    /// The server's name and version from its handshake.
    pub fn server_info(&self) -> Option<String> {
        let info = self.service.peer().peer_info()?;
        let server = info.server_info.as_ref()?;
        Some(format!("{} {}", server.name, server.version))
    }

    /// Runs until the connection ends by itself or `stop` resolves, then ends the child (and
    /// its group) and says how it ended.
    pub async fn run_until(self, stop: impl std::future::Future<Output = ()>) -> Ended {
        let Connection {
            service,
            child,
            answer_within,
        } = self;
        let Some(mut child) = child else {
            let peer = service.peer().clone();
            let ended = tokio::select! {
                quit = service.waiting() => Ended::Lost(closed(quit)),
                why = unanswered_ping(&peer, answer_within) => Ended::Lost(why),
                _ = stop => Ended::Stopped,
            };
            return ended;
        };
        let ended = tokio::select! {
            quit = service.waiting() => {
                // The pipe closed; the exit status says more, if the process ended too.
                let why = match child.exited_within(Duration::from_millis(300)).await {
                    Some(status) => format!("it {}", describe(status)),
                    None => closed(quit),
                };
                Ended::Lost(why)
            }
            status = child.wait() => Ended::Lost(match status {
                Some(status) => format!("it {}", describe(status)),
                None => "its process could not be waited for".to_string(),
            }),
            _ = stop => Ended::Stopped,
        };
        // The service (dropped above when it did not end by itself) closed the child's stdin:
        // a well-behaved server exits on that.
        child.end().await;
        ended
    }
}

/// Pings the server every [`PING_EVERY`] until a ping fails; answers why it failed.
async fn unanswered_ping(peer: &Peer<RoleClient>, within: Duration) -> String {
    loop {
        tokio::time::sleep(PING_EVERY).await;
        let ping = peer.send_request(ClientRequest::PingRequest(PingRequest::default()));
        match tokio::time::timeout(within, ping).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => return format!("it did not answer a ping: {error}"),
            Err(_) => return format!("it did not answer a ping within {} s", within.as_secs_f64()),
        }
    }
}

/// tah's side of a connection: what it tells the server about itself in the handshake, and
/// what it does with the server's notifications (it notes that the tools changed).
pub struct Host {
    info: ClientConfig,
    tools_changed: Arc<Notify>,
}

impl Host {
    fn new() -> Host {
        Host {
            info: ClientConfig::new(
                ClientCapabilities::default(),
                Implementation::new("tah", env!("CARGO_PKG_VERSION")),
            ),
            tools_changed: Arc::new(Notify::new()),
        }
    }
}

impl ClientHandler for Host {
    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.tools_changed.notify_one();
    }
}

fn no_answer(timeout: Duration) -> String {
    format!(
        "no answer to the MCP handshake within {} s",
        timeout.as_secs_f64()
    )
}

fn closed(quit: Result<QuitReason, tokio::task::JoinError>) -> String {
    match quit {
        Ok(QuitReason::Closed) => "it closed the connection".to_string(),
        Ok(reason) => format!("the connection ended ({reason:?})"),
        Err(error) => format!("the connection failed: {error}"),
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => "ended".to_string(),
    }
}

/// rustls needs a process-wide crypto provider for the HTTP transport's client: the ring one,
/// which the provider clients already use. Installing it twice is harmless.
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

async fn log_stderr(server: String, stderr: ChildStderr, redact: Option<LogRedactor>) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(mut line)) = lines.next_line().await {
        if let Some(clean) = redact.as_ref().and_then(|redact| redact(&line)) {
            line = clean;
        }
        if line.len() > MAX_LOG_LINE {
            let mut cut = MAX_LOG_LINE;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
            line.push('…');
        }
        tracing::info!(server = %server, "mcp server stderr: {line}");
    }
}

/// A server's process, leader of its own process group.
struct ChildProcess {
    child: Child,
    group: Option<Pid>,
    status: Option<ExitStatus>,
}

impl ChildProcess {
    fn new(child: Child) -> ChildProcess {
        let group = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(Pid::from_raw);
        ChildProcess {
            child,
            group,
            status: None,
        }
    }

    /// Waits for the process to exit (`None` if it cannot be waited for).
    async fn wait(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.wait().await.ok();
        }
        self.status
    }

    async fn exited_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        tokio::time::timeout(limit, self.wait())
            .await
            .ok()
            .flatten()
    }

    /// Ends the process and everything left in its group: it has [`EXIT_GRACE`] to exit after
    /// its stdin closed, as much again after SIGTERM, then the group is killed.
    async fn end(mut self) {
        // Dropped first: a server that reads stdin sees its end.
        drop(self.child.stdin.take());
        if self.exited_within(EXIT_GRACE).await.is_none() {
            self.signal(Signal::TERM);
            if self.exited_within(EXIT_GRACE).await.is_none() {
                self.signal(Signal::KILL);
                let _ = self.wait().await;
            }
        }
        // What the server started and left behind in its group.
        self.signal(Signal::KILL);
        self.group = None;
    }

    fn signal(&self, signal: Signal) {
        if let Some(group) = self.group {
            // The group may be gone already; there is nothing else to do then.
            let _ = kill_process_group(group, signal);
        }
    }
}

impl Drop for ChildProcess {
    /// Should a connection be dropped without being ended (a runtime torn down), its group is
    /// killed all the same.
    fn drop(&mut self) {
        self.signal(Signal::KILL);
    }
}
