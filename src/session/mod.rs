//! Sessions as live objects: the per-session actor that owns a session and drives its runs,
//! the registry of live sessions, and the replay-then-live event stream.
//!
//! Only a session's actor mutates it; everything else talks to the actor through
//! its mailbox. Reads that need no owner (lists, pages of events or messages) go straight to
//! the store.
//!
//! - [`Sessions`] (`sessions`): the API the HTTP layer uses; it sends commands to actors.
//! - `errors`: what a session refuses ([`SessionError`], [`ConflictKind`]).
//! - `command`: the commands an actor takes, and their answers.
//! - `actor/`: the actor, one handler per command family.
//! - `core`: a session's state as its actor holds it.
//! - `run/`: a run being driven: the agent loop's journal, its call board, admission, its end.
//! - `live`: the map of live sessions (mailboxes, live channels, leases).
//! - `log`: a session's whole log as of one moment, read page by page.
//! - `options`: what a new session may choose (workspace, tools, rules, client tools), checked.
//! - `run_permit`: a run's place among `--max-concurrent-runs`, lent while it waits for its
//!   sub-agents.
//! - `lease`: the one copy of a session's lease (scale-out).
//! - `coordination`: heartbeat, takeover sweep and notifications (scale-out).
//! - `steps`: rebuilding an LLM step's exact request.
//! - `stream`: replay-then-live event streams.
//! - `lineage`: a run's tree of sub-agents and the children of its `task` calls.
//! - `subagents`: the `task` tool, which runs a child session for a call.
//! - `waiting`: the calls of a run that wait for an answer (approvals, client tools).

mod actor;
mod command;
mod coordination;
mod core;
mod errors;
mod lease;
mod lineage;
mod live;
mod log;
mod options;
mod run;
mod run_permit;
mod sessions;
mod steps;
mod stream;
mod subagents;
mod waiting;

pub use command::{
    ApprovalAnswer, CancelOutcome, Compacted, IfBusy, Pending, RunRequest, RunStarted, RunStopped,
};
pub use errors::{ConflictKind, SessionError, Unanswered};
pub use sessions::{NewSession, Sessions, Subscription};
pub use stream::{EventStream, OnWake};
pub use waiting::{ClientResult, PendingApproval, PendingClientCall, Resolution};

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::agent::{AgentDeps, AgentSettings};
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
}

/// What every session actor depends on, shared by all of them.
pub struct SessionDeps {
    pub store: Arc<dyn Store>,
    pub writer: Writer,
    /// The model and the (built-in) tools the agent loop uses.
    pub agent: AgentDeps,
    /// The MCP servers, whose tools a run adds to the built-in ones.
    pub mcp: McpServers,
    pub settings: AgentSettings,
    /// Bytes one artifact may have; a larger file a tool produced is not kept.
    pub max_artifact_bytes: u64,
    /// Cancelled at shutdown; every run's token is a child of it.
    pub shutdown: CancellationToken,
    /// Actors, so that shutdown can wait for them to checkpoint and stop.
    pub tasks: TaskTracker,
    /// Permits for runs in progress in this process (the concurrency cap).
    pub run_permits: Arc<tokio::sync::Semaphore>,
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
    /// Sub-agent sessions one top-level run may start, at every depth.
    pub max_subagents_per_run: u32,
}
