//! What every session actor depends on, and how tool calls are admitted.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::agent::{AgentDeps, AgentSettings};
use crate::llm::providers::Providers;
use crate::mcp::McpServers;
use crate::store::writer::Writer;
use crate::store::{Cluster, Store};
use crate::tools::policy::{ApprovalMode, Rules};

/// How calls are admitted: the server's rules, what `ask` means without a human, and how long
/// an answer (a human's, or a client's) is waited for.
pub struct ToolPolicy {
    pub rules: Rules,
    pub mode: ApprovalMode,
    /// `None`: wait for ever.
    pub approval_timeout: Option<Duration>,
    /// How long a worker's claim on a call of a `workers` environment lasts unrenewed.
    pub worker_lease: Duration,
}

/// What every session actor depends on, shared by all of them.
pub struct SessionDeps {
    pub store: Arc<dyn Store>,
    pub writer: Writer,
    /// The model and the (built-in) tools the agent loop uses.
    pub agent: AgentDeps,
    /// The model providers agents run on (the default agent's client is `agent.model`).
    pub providers: Providers,
    /// The MCP servers, whose tools a run adds to the built-in ones.
    pub mcp: McpServers,
    /// The MCP servers agents define for themselves.
    pub agent_mcp: super::agents::AgentMcp,
    /// The tenants' secrets, which agents' MCP servers reference.
    pub vaults: crate::vault::Vaults,
    pub settings: AgentSettings,
    /// Bytes one artifact may have; a larger file a tool produced is not kept.
    pub max_artifact_bytes: u64,
    /// Cancelled at shutdown; every run's token is a child of it.
    pub shutdown: CancellationToken,
    /// Actors, so that shutdown can wait for them to checkpoint and stop.
    pub tasks: TaskTracker,
    /// Permits for runs in progress in this process (the concurrency cap).
    pub run_permits: Arc<tokio::sync::Semaphore>,
    /// The limits of each tenant (`--tenant-max-concurrent-runs`, `--tenant-max-tokens-per-day`).
    pub tenant_limits: Arc<super::TenantLimits>,
    /// Lease coordination with other replicas (PostgreSQL); `None` on a single node.
    pub cluster: Option<Arc<dyn Cluster>>,
    /// This process's id as a lease owner.
    pub replica: Uuid,
    /// How long a lease lasts without renewal.
    pub lease_ttl: Duration,
    /// Resume interrupted runs by themselves (at start, and after taking a session over).
    pub auto_resume: bool,
    pub policy: ToolPolicy,
    /// Sessions at this sub-agent depth are not offered `task`.
    pub max_subagent_depth: u32,
    /// When this process started (the default agent's time).
    pub started_at: chrono::DateTime<chrono::Utc>,
    /// Sub-agent sessions one top-level run may start, at every depth.
    pub max_subagents_per_run: u32,
    /// The recorded replays running in this process.
    pub replays: super::replay::Scripts,
}
