//! One configured server over its life: the supervisor that connects, lists the tools (again
//! whenever the server says they changed), watches the connection and restarts it with a
//! growing wait when it fails or ends; and the
//! [`Link`] its tools share, which says whether the server can take calls now and sends them.

use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{Peer, RoleClient, ServiceError};
use serde_json::Value;
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use super::config::{ServerConfig, Transport};
use super::connection::{Connection, Ended};
use super::lines;
use super::tool::{self, Placeholder};
use super::LogRedactor;
use super::McpSettings;
use crate::tools::{Availability, Tool, ToolError};

/// The wait before the first restart; it doubles after each failure up to the longest, and
/// starts again from the first once a connection has stayed up for [`STABLE`].
const FIRST_RETRY: Duration = Duration::from_millis(500);
const LONGEST_RETRY: Duration = Duration::from_secs(60);
const STABLE: Duration = Duration::from_secs(30);

/// Whether a server takes calls, and where they go.
pub struct Link {
    server: String,
    call_timeout: Duration,
    state: Mutex<LinkState>,
}

enum LinkState {
    /// Connecting; `after` says why the previous connection ended, on a restart.
    Starting {
        after: Option<String>,
    },
    Up(Peer<RoleClient>),
    Down(String),
}

impl Link {
    fn state(&self) -> MutexGuard<'_, LinkState> {
        // A poisoned lock only means a panic elsewhere; the state itself is always whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(&self, state: LinkState) {
        *self.state() = state;
    }

    pub fn server(&self) -> &str {
        &self.server
    }

    pub fn availability(&self) -> Availability {
        let reason = match &*self.state() {
            LinkState::Up(_) => return Availability::Available,
            LinkState::Starting { after: None } => {
                format!("MCP server {} is starting", self.server)
            }
            LinkState::Starting { after: Some(why) } => {
                format!("MCP server {} is restarting ({why})", self.server)
            }
            LinkState::Down(why) => format!("MCP server {} is not running: {why}", self.server),
        };
        Availability::Unavailable { reason }
    }

    /// Calls the server's tool `remote` (`name` is what the model called it); dropping the
    /// future (the run was cancelled) or the timeout sends `notifications/cancelled`.
    pub async fn call(
        &self,
        name: &str,
        remote: &str,
        input: &Value,
    ) -> Result<CallToolResult, ToolError> {
        let peer = match &*self.state() {
            LinkState::Up(peer) => peer.clone(),
            _ => {
                let reason = match self.availability() {
                    Availability::Unavailable { reason } => reason,
                    Availability::Available => String::new(),
                };
                return Err(ToolError(format!("{name} is not available: {reason}")));
            }
        };
        let arguments = match input {
            Value::Object(map) => Some(map.clone()),
            Value::Null => None,
            _ => {
                return Err(ToolError(format!(
                    "the input of {name} must be a JSON object"
                )))
            }
        };
        let mut params = CallToolRequestParams::new(remote.to_string());
        params.arguments = arguments;
        match tokio::time::timeout(self.call_timeout, peer.call_tool(params)).await {
            Ok(Ok(result)) => Ok(result),
            Err(_) => Err(ToolError(format!(
                "{name} did not answer within {} s; the call was cancelled",
                self.call_timeout.as_secs_f64()
            ))),
            Ok(Err(ServiceError::TransportClosed)) => Err(ToolError(format!(
                "MCP server {} closed the connection before {name} answered; tah restarts it",
                self.server
            ))),
            Ok(Err(ServiceError::McpError(error))) => {
                Err(ToolError(match lines::too_long(&error) {
                    Some(bytes) => format!(
                    "MCP server {} answered {name} with a line of {bytes} bytes, more than the \
                     {} bytes (16 MiB) tah reads in one MCP message; the call failed",
                    self.server,
                    lines::MAX_MESSAGE
                ),
                    None => format!(
                        "MCP server {} refused the call: {}",
                        self.server, error.message
                    ),
                }))
            }
            Ok(Err(error)) => Err(ToolError(format!(
                "MCP server {} failed the call: {error}",
                self.server
            ))),
        }
    }
}

/// A configured server: its link, its last listed tools, and whether its first connection
/// attempt is over (for the wait at start).
pub struct Server {
    link: Arc<Link>,
    transport: Transport,
    handshake_timeout: Duration,
    /// Takes the secrets out of what it prints and of its failures, before they are logged.
    redact: Option<LogRedactor>,
    /// `None` until the server has listed its tools once.
    tools: Mutex<Option<Vec<Arc<dyn Tool>>>>,
    tried: watch::Sender<bool>,
}

impl Server {
    pub fn new(
        config: &ServerConfig,
        settings: McpSettings,
        redact: Option<LogRedactor>,
    ) -> Server {
        Server {
            link: Arc::new(Link {
                server: config.name.clone(),
                call_timeout: settings.call_timeout,
                state: Mutex::new(LinkState::Starting { after: None }),
            }),
            transport: config.transport.clone(),
            handshake_timeout: settings.handshake_timeout,
            redact,
            tools: Mutex::new(None),
            tried: watch::Sender::new(false),
        }
    }

    pub fn name(&self) -> &str {
        self.link.server()
    }

    /// `text` without the secrets this server was handed.
    fn redacted<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
        match self.redact.as_ref().and_then(|redact| redact(text)) {
            Some(clean) => std::borrow::Cow::Owned(clean),
            None => std::borrow::Cow::Borrowed(text),
        }
    }

    /// Its tools as last listed (available while it runs), or, before it ever listed them, one
    /// unavailable placeholder that says why.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        let listed = self.tools.lock().unwrap_or_else(|e| e.into_inner());
        match &*listed {
            Some(tools) => tools.clone(),
            None => vec![Arc::new(Placeholder::new(self.link.clone()))],
        }
    }

    /// Resolves once the first connection attempt is over, whatever its outcome.
    pub async fn tried(&self) {
        let mut tried = self.tried.subscribe();
        let _ = tried.wait_for(|tried| *tried).await;
    }

    /// Connects, serves, and reconnects after every failure, until `stop`.
    pub async fn supervise(self: Arc<Server>, stop: CancellationToken) {
        let name = self.name().to_string();
        let mut retry = FIRST_RETRY;
        loop {
            let began = Instant::now();
            let opened = tokio::select! {
                opened = Connection::open(&name, &self.transport, self.handshake_timeout, self.redact.clone()) => opened,
                _ = stop.cancelled() => return self.stopped(),
            };
            let failure = match opened {
                Ok(connection) => match self.serve(connection, began, &stop).await {
                    Some(why) => why,
                    None => return self.stopped(),
                },
                Err(why) => {
                    tracing::warn!(server = %name, reason = %self.redacted(&why), "MCP server failed to start");
                    why
                }
            };
            self.tried.send_replace(true);
            if began.elapsed() >= STABLE {
                retry = FIRST_RETRY;
            }
            self.link.set(LinkState::Down(format!(
                "{failure}; tah starts it again in {} s",
                retry.as_secs_f64()
            )));
            tokio::select! {
                _ = tokio::time::sleep(retry) => {}
                _ = stop.cancelled() => return self.stopped(),
            }
            self.link.set(LinkState::Starting {
                after: Some(failure),
            });
            retry = (retry * 2).min(LONGEST_RETRY);
        }
    }

    /// Lists the tools of a fresh connection and serves calls until it ends: why it ended, or
    /// `None` when tah stopped it.
    async fn serve(
        &self,
        connection: Connection,
        began: Instant,
        stop: &CancellationToken,
    ) -> Option<String> {
        let name = self.name();
        let handshake = began.elapsed();
        let peer = connection.peer();
        let listed = match tokio::time::timeout(self.handshake_timeout, peer.list_all_tools()).await
        {
            Ok(Ok(listed)) => listed,
            failed => {
                let why = match failed {
                    Ok(Err(error)) => format!("listing its tools failed: {error}"),
                    _ => "it did not list its tools in time".to_string(),
                };
                tracing::warn!(server = %name, reason = %self.redacted(&why), "MCP server failed to start");
                connection.run_until(std::future::ready(())).await;
                return Some(why);
            }
        };
        let tools = tool::from_listing(&self.link, listed);
        tracing::info!(
            server = %name,
            info = connection.server_info().unwrap_or_default(),
            tools = tools.len(),
            handshake_ms = handshake.as_millis() as u64,
            "MCP server ready"
        );
        *self.tools.lock().unwrap_or_else(|e| e.into_inner()) = Some(tools);
        self.link.set(LinkState::Up(peer.clone()));
        self.tried.send_replace(true);
        let changed = connection.tools_changed();
        let ended = tokio::select! {
            ended = connection.run_until(stop.cancelled()) => ended,
            never = self.follow_changes(&peer, &changed) => match never {},
        };
        match ended {
            Ended::Stopped => None,
            Ended::Lost(why) => {
                tracing::warn!(server = %name, reason = %self.redacted(&why), "MCP server stopped");
                Some(why)
            }
        }
    }

    /// Lists the tools again each time the server says they changed (a run that has started
    /// keeps the tools it was given); on failure the tools listed before stay.
    async fn follow_changes(&self, peer: &Peer<RoleClient>, changed: &Notify) -> Infallible {
        loop {
            changed.notified().await;
            self.relist(peer).await;
        }
    }

    async fn relist(&self, peer: &Peer<RoleClient>) {
        let name = self.name();
        match tokio::time::timeout(self.handshake_timeout, peer.list_all_tools()).await {
            Ok(Ok(listed)) => {
                let tools = tool::from_listing(&self.link, listed);
                tracing::info!(server = %name, tools = tools.len(), "MCP server changed its tools");
                *self.tools.lock().unwrap_or_else(|e| e.into_inner()) = Some(tools);
            }
            Ok(Err(error)) => {
                tracing::warn!(server = %name, %error, "MCP server's changed tools could not be listed")
            }
            Err(_) => {
                tracing::warn!(server = %name, "MCP server did not list its changed tools in time")
            }
        }
    }

    fn stopped(&self) {
        self.link
            .set(LinkState::Down("tah is shutting down".to_string()));
        self.tried.send_replace(true);
    }
}
