//! Sessions as live objects: the per-session actor that owns a session and drives its runs,
//! the registry of live sessions, and the replay-then-live event stream.
//!
//! Only a session's actor mutates it; everything else talks to the actor through
//! its mailbox. Reads that need no owner (lists, pages of events or messages) go straight to
//! the store, through [`Sessions`] (`reads`), so that the faces never touch the store.
//!
//! - [`Sessions`] (`sessions`): the API the HTTP layer uses; it sends commands to actors.
//! - `agents`: agents created, versioned, archived, chosen by sessions and captured by runs;
//!   `agent_secrets`: the vault references in their own MCP servers, checked and resolved.
//! - `deps`: what every session actor depends on ([`SessionDeps`], [`ToolPolicy`]).
//! - `errors`: what a session refuses ([`SessionError`], [`ConflictKind`]).
//! - `command`: the commands an actor takes, and their answers.
//! - `actor/`: the actor, one handler per command family.
//! - `core`: a session's state as its actor holds it.
//! - `run/`: a run being driven: the agent loop's journal, its call board, admission, its end.
//! - `live`: the map of live sessions (mailboxes, live channels, leases).
//! - `log`: a session's whole log as of one moment, read page by page.
//! - `options`: what a new session may choose (workspace, tools, rules, client tools), checked.
//! - `reads`: what the faces read through [`Sessions`] (pages, runs, artifacts).
//! - `run_permit`: a run's place among `--max-concurrent-runs`, lent while it waits for its
//!   sub-agents.
//! - `lease`: the one copy of a session's lease (scale-out).
//! - `coordination`: heartbeat, takeover sweep and notifications (scale-out).
//! - `start`: [`Sessions::start`], subscribe-run-follow for every face.
//! - `replay`: replays of a session's turns (`recorded`: served from its log; `live`) and
//!   their reports.
//! - `steps`: rebuilding an LLM step's exact request.
//! - `stream`: replay-then-live event streams.
//! - `lineage`: a run's tree of sub-agents and the children of its `task` calls.
//! - `subagents`: the `task` tool, which runs a child session for a call.
//! - `tenant_limits`: a tenant's runs in progress and tokens of the day, checked when a run
//!   is asked for.
//! - `waiting`: the calls of a run that wait for an answer (approvals, client tools).

mod actor;
mod agent_secrets;
mod agents;
mod command;
mod coordination;
mod core;
mod cost;
mod deps;
mod environments;
mod errors;
mod lease;
mod lineage;
mod live;
mod log;
mod options;
mod reads;
pub mod replay;
mod run;
mod run_permit;
mod sessions;
mod start;
mod steps;
mod stream;
mod subagents;
mod tenant_limits;
mod waiting;

pub use crate::store::agents::AgentQuery;
/// The store's read queries and its error, as the faces name them through the session layer.
pub use crate::store::{ArtifactQuery, ArtifactVersions, SessionQuery, StoreError};
pub use agents::{AgentBody, AgentMcp, RunAgent};
pub use command::{
    ApprovalAnswer, CancelOutcome, Compacted, IfBusy, Pending, RunRequest, RunStarted, RunStopped,
};
pub use deps::{SessionDeps, ToolPolicy};
pub use environments::{start_sweeper as start_worker_sweeper, WorkerClaim};
pub use errors::{ConflictKind, SessionError, Unanswered};
pub use sessions::{NewSession, Sessions, Subscription};
pub use start::{one_input_one_purpose, Follow, RunEnd, Started, StartedRun};
pub use stream::{EventStream, OnWake};
pub use tenant_limits::TenantLimits;
pub use waiting::{ClientResult, PendingApproval, PendingClientCall, Resolution};
