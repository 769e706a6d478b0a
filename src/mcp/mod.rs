//! MCP tool servers: tah as an MCP host. The servers of `--mcp-config` are started at boot, in
//! the background, and their tools are offered as `mcp__<server>__<tool>` through the same
//! [`Tool`] trait as the built-in ones, so the policy, approvals, concurrency and cancellation
//! of every other call apply (no rule matching an MCP tool means `ask`).
//!
//! A server that fails its handshake or dies is logged, its tools are listed unavailable with
//! the reason, and it is started again with a growing wait; nothing else in tah depends on it.
//! A stdio server runs in a process group of its own, and every group is ended at shutdown.
//!
//! This module knows nothing of sessions: the session layer asks [`McpServers::tools`] for the
//! servers a session chose, when a run starts.
//!
//! - `config`: the `mcpServers` file and `${VAR}` expansion (pure).
//! - `connection`: one connection (a child process or streamable HTTP), its handshake, its end.
//! - `lines`: a stdio server's messages, each at most 16 MiB; a longer answer fails its call.
//! - `server`: a server's supervisor (restarts with backoff) and the link its tools call
//!   through.
//! - `tool`: tools as `Tool`s, and a call's result as text and artifacts.

pub mod config;
mod connection;
mod lines;
mod server;
mod tool;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::{McpConfig, McpConfigError, ServerConfig, Transport};
pub use connection::INHERITED_ENV;
pub use tool::PREFIX;

use crate::tools::Tool;
use server::Server;

/// How long a call and a handshake may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct McpSettings {
    /// One `tools/call` (`--mcp-timeout-s`); then it is cancelled and the model told so.
    pub call_timeout: Duration,
    /// Connecting, the `initialize` handshake and listing the tools
    /// (`--mcp-handshake-timeout-s`).
    pub handshake_timeout: Duration,
}

impl Default for McpSettings {
    fn default() -> McpSettings {
        McpSettings {
            call_timeout: Duration::from_secs(120),
            handshake_timeout: Duration::from_secs(30),
        }
    }
}

/// The configured servers, each kept running by its supervisor. Cheap to clone; the default
/// has no servers.
#[derive(Clone, Default)]
pub struct McpServers {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    servers: Vec<Arc<Server>>,
    stop: CancellationToken,
    tasks: TaskTracker,
}

/// Replaces the secrets a text holds (`None`: it holds none), for what servers handed secrets
/// print.
pub type LogRedactor = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

impl McpServers {
    /// Starts a supervisor for every server (within the async runtime); they connect in the
    /// background.
    pub fn start(config: &McpConfig, settings: McpSettings) -> McpServers {
        McpServers::start_redacted(config, settings, None)
    }

    /// [`McpServers::start`] for servers handed secrets: what they print on stderr, and the
    /// reasons they fail, pass through `redact` before they are logged.
    pub fn start_redacted(
        config: &McpConfig,
        settings: McpSettings,
        redact: Option<LogRedactor>,
    ) -> McpServers {
        let inner = Inner {
            servers: config
                .servers
                .iter()
                .map(|server| Arc::new(Server::new(server, settings, redact.clone())))
                .collect(),
            ..Inner::default()
        };
        for server in &inner.servers {
            inner
                .tasks
                .spawn(server.clone().supervise(inner.stop.child_token()));
        }
        if !inner.servers.is_empty() {
            tracing::info!(
                servers = inner.servers.len(),
                "starting MCP servers in the background"
            );
        }
        McpServers {
            inner: Arc::new(inner),
        }
    }

    /// Waits until every server has tried to connect once, for at most `limit`, so that the
    /// tools of servers that start quickly are there from the first request.
    pub async fn settle(&self, limit: Duration) {
        let tried = futures::future::join_all(self.inner.servers.iter().map(|s| s.tried()));
        if tokio::time::timeout(limit, tried).await.is_err() {
            tracing::info!("some MCP servers are still starting; their tools follow when ready");
        }
    }

    /// The names of the configured servers, in name order.
    pub fn names(&self) -> Vec<&str> {
        self.inner.servers.iter().map(|s| s.name()).collect()
    }

    /// The tools of the servers named in `chosen` (all when `None`), available or not: what a
    /// run is given when it starts, and what `GET /v1/tools` lists.
    pub fn tools(&self, chosen: Option<&[String]>) -> Vec<Arc<dyn Tool>> {
        self.inner
            .servers
            .iter()
            .filter(|s| chosen.is_none_or(|names| names.iter().any(|n| n == s.name())))
            .flat_map(|s| s.tools())
            .collect()
    }

    /// Ends every connection and every server process (and its group); bounded by the time a
    /// server is given to exit (a few seconds).
    pub async fn shutdown(&self) {
        self.inner.stop.cancel();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }
}
