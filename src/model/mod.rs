//! The domain vocabulary shared by every layer: sessions, messages, steps, runs and events.
//!
//! Plain data with serde derives and pure helpers; no I/O lives here, so every other module
//! may depend on it without pulling in a runtime.
//!
//! - `agent`: agents and their versions, and how sessions choose and record them.
//! - `environment`: where a session's built-in tools run (`local`, or a `workers` one).
//! - `artifact`: the files a session produced, as versions of a path.
//! - `message`: messages, tool calls and thinking blocks, the model-visible history.
//! - `ids`: typed ids ([`SessionId`], [`RunId`], [`CallId`] …), serde-transparent.
//! - `event`: [`Event`] and its typed [`EventKind`].
//! - `principal`: who makes a request ([`Principal`]), tenants, roles and what they reach.
//! - `published`: an event on its way out ([`Published`]): its wire JSON and SSE frame,
//!   rendered once for the store, every subscriber and every webhook.
//! - `session`: sessions, runs, steps and checkpoints as stored and served, and their states.
//! - `step`: the typed LLM step descriptor and [`FinishReason`].
//! - `tool`: policy rules, client tools, how a waiting call was resolved, and the built-in
//!   tools' names.
//! - `waiting`: the calls of a run that wait for an answer, projected from its events.

mod agent;
mod artifact;
mod environment;
mod event;
mod ids;
mod message;
mod principal;
mod published;
mod session;
mod step;
mod tool;
pub mod waiting;

pub use agent::{
    AgentChoice, AgentId, AgentMcpServer, AgentRecord, AgentSpec, AgentTag, InlineMcpServer,
    SessionAgent, VersionChoice, DEFAULT_AGENT,
};
pub use artifact::ArtifactRecord;
pub use environment::{
    rerun_safe, valid_environment_name, Environment, EnvironmentKind, LOCAL_ENVIRONMENT,
};
pub use event::{CharsBeforeAfter, Event, EventKind};
pub use ids::{ArtifactId, CallId, PathId, RunId, SessionId, StepId, MAX_CALL_ID_CHARS};
pub use message::{
    Message, Role, SizeCache, ThinkingBlock, ToolCall, ToolSchema, SUMMARY_PREFIX,
    TRANSCRIPT_USER_MARKER,
};
pub use principal::{
    valid_tenant, Denied, Principal, SessionNeed, TenantRole, TokenScope, DEFAULT_TENANT,
    MAX_TENANT_BYTES, OPERATOR_ID,
};
pub use published::{Published, UncutEvent};
pub use session::{
    client_tools_of, Checkpoint, RunKind, RunRecord, RunResult, RunStatus, SessionOptions,
    SessionRecord, SessionState, StepKind, StepRecord, StepStatus, Usage, INTERRUPTED,
    STORAGE_FAILED,
};
pub use step::{thinking_step_parts, AgentStep, FinishReason, LlmRequestDescriptor, TrimStats};
pub use tool::{Action, ClientTool, Decision, ResolvedBy, Rule, BUILTIN_TOOLS};

use chrono::{DateTime, SubsecRound, Utc};
use uuid::Uuid;

/// A fresh time-ordered id (UUID v7) for sessions, runs, steps and checkpoints.
pub fn new_id() -> Uuid {
    Uuid::now_v7()
}

/// The current time, rounded to microseconds so it survives a round trip through either store.
pub fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(6)
}
