//! Sessions, runs, steps and checkpoints as stored and as served.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::{ClientTool, FinishReason, Rule};

/// The six session states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    Idle,
    Running,
    WaitingTool,
    Completed,
    Failed,
    Cancelled,
}

impl SessionState {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionState::Idle => "idle",
            SessionState::Running => "running",
            SessionState::WaitingTool => "waiting_tool",
            SessionState::Completed => "completed",
            SessionState::Failed => "failed",
            SessionState::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<SessionState> {
        Some(match s {
            "idle" => SessionState::Idle,
            "running" => SessionState::Running,
            "waiting_tool" => SessionState::WaitingTool,
            "completed" => SessionState::Completed,
            "failed" => SessionState::Failed,
            "cancelled" => SessionState::Cancelled,
            _ => return None,
        })
    }

    /// A run is in progress: the loop is calling the model or waiting for a tool.
    pub fn is_active(self) -> bool {
        matches!(self, SessionState::Running | SessionState::WaitingTool)
    }
}

/// Token usage of one LLM step, or summed over a run or a session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl Usage {
    pub fn add(&mut self, other: Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
    }
}

/// The error recorded for a run that a dead (or stopping) process left unfinished; such a
/// run is resumable.
pub const INTERRUPTED: &str = "interrupted";

/// The error recorded for a run stopped because the database refused a write; it is recorded
/// once writes succeed again, and the run is resumable.
pub const STORAGE_FAILED: &str = "storage";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionRecord {
    pub id: Uuid,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_id: Option<Uuid>,
    pub title: Option<String>,
    pub metadata: Value,
    /// The session's own system prompt, when it was created with one; otherwise the server's
    /// current configured prompt is used.
    pub system_prompt: Option<String>,
    pub state: SessionState,
    /// Why the last run failed (`interrupted` after a crash), when it did.
    pub error: Option<String>,
    pub message_count: i64,
    /// The `seq` of the newest event.
    pub last_seq: i64,
    pub usage: Usage,
    pub last_run_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The tenant it belongs to (SPEC §17); forks and sub-agents' sessions keep their
    /// parent's.
    #[serde(default = "default_tenant")]
    pub tenant: String,
    /// The principal that made it (a key's id, `jwt:<sub>`, `operator`); none for sessions
    /// made before principals existed.
    #[serde(default)]
    pub owner: Option<String>,
    /// Served beside the other fields.
    #[serde(flatten)]
    pub options: SessionOptions,
}

fn default_tenant() -> String {
    super::DEFAULT_TENANT.to_string()
}

/// What a session chose at creation beyond its prompt (a fork inherits it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SessionOptions {
    /// The built-in tools it is offered; `None`: all the server offers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// The MCP servers whose tools it is offered; `None`: every configured server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_servers: Option<Vec<String>>,
    /// Its own policy rules, applied with the server's; `always` answers add to them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_policy: Vec<Rule>,
    /// Tools its client runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_tools: Vec<ClientTool>,
    /// The directory under the server's `--workspace` its tools are confined to, canonical and
    /// relative to that root; `None` (not shown): the root itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// How deep among sub-agents: 0 for a session a client created, its parent's depth plus
    /// one for a sub-agent's.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub depth: u32,
    /// For a sub-agent: the parent's `task` call it works for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_call_id: Option<String>,
    /// Tokens (input + output) the session may use over all its runs; `None`: the server's
    /// default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Tokens one of its runs may use; `None`: the server's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_run_tokens: Option<u64>,
    /// US dollars its LLM steps may cost over all its runs; `None`: its agent's cap, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<f64>,
    /// The agent it runs (the default agent for a session made before agents were).
    #[serde(default)]
    pub agent: super::SessionAgent,
    /// The environment its built-in tools run in (by name): its own choice at creation, else
    /// its agent's, else `local`; not shown for a session made before environments were
    /// (which runs them locally).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl SessionRecord {
    /// A session as it is before anything was written to it: idle, no messages, no events, no
    /// metadata (`{}`), made at `at`.
    pub fn new(id: Uuid, parent_id: Option<Uuid>, at: DateTime<Utc>) -> SessionRecord {
        SessionRecord {
            id,
            parent_id,
            title: None,
            metadata: Value::Object(Default::default()),
            system_prompt: None,
            state: SessionState::Idle,
            error: None,
            message_count: 0,
            last_seq: 0,
            usage: Usage::default(),
            last_run_id: None,
            created_at: at,
            updated_at: at,
            tenant: default_tenant(),
            owner: None,
            options: SessionOptions::default(),
        }
    }

    /// The last run was cut short by a stop or a crash (and can be resumed).
    pub fn is_interrupted(&self) -> bool {
        self.state == SessionState::Failed && self.error.as_deref() == Some(INTERRUPTED)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunKind {
    Run,
    Resume,
}

impl RunKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RunKind::Run => "run",
            RunKind::Resume => "resume",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<RunStatus> {
        Some(match s {
            "running" => RunStatus::Running,
            "completed" => RunStatus::Completed,
            "failed" => RunStatus::Failed,
            "cancelled" => RunStatus::Cancelled,
            _ => return None,
        })
    }
}

/// One turn (`run`) or continuation (`resume`) and, once it has ended, its result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: Uuid,
    pub session_id: Uuid,
    pub kind: RunKind,
    pub status: RunStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    pub text: Option<String>,
    pub finish_reason: Option<FinishReason>,
    pub usage: Usage,
    /// LLM calls made by this run.
    pub steps: i64,
    pub error: Option<String>,
    /// The `seq` of this run's `agent.started` event.
    pub start_seq: i64,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Tools the client runs, declared for this run only (beside the session's own): what an
    /// AG-UI client sends as `RunAgentInput.tools`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_tools: Vec<ClientTool>,
}

/// The tools the client runs in `run` of `session`: the run's own, then the session's that
/// the run's do not replace (same name).
pub fn client_tools_of<'a>(
    session: &'a SessionRecord,
    run: &'a RunRecord,
) -> impl Iterator<Item = &'a ClientTool> {
    let own = run.client_tools.iter();
    let kept = session
        .options
        .client_tools
        .iter()
        .filter(move |t| !run.client_tools.iter().any(|r| r.name == t.name));
    own.chain(kept)
}

impl RunRecord {
    /// A run of `kind` that starts now: running, with a new id and no result yet; its
    /// `agent.started` event will be `start_seq`.
    pub fn started(
        session_id: Uuid,
        kind: RunKind,
        input: Option<String>,
        start_seq: i64,
    ) -> RunRecord {
        RunRecord {
            id: super::new_id(),
            session_id,
            kind,
            status: RunStatus::Running,
            input,
            text: None,
            finish_reason: None,
            usage: Usage::default(),
            steps: 0,
            error: None,
            start_seq,
            created_at: super::now(),
            finished_at: None,
            client_tools: Vec::new(),
        }
    }
}

/// What `?wait=true` returns: a run's result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    pub run_id: Uuid,
    pub session_id: Uuid,
    pub status: RunStatus,
    pub text: String,
    pub finish_reason: Option<FinishReason>,
    pub usage: Usage,
    pub steps: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl From<&RunRecord> for RunResult {
    fn from(run: &RunRecord) -> RunResult {
        RunResult {
            run_id: run.id,
            session_id: run.session_id,
            status: run.status,
            text: run.text.clone().unwrap_or_default(),
            finish_reason: run.finish_reason.clone(),
            usage: run.usage,
            steps: run.steps,
            error: run.error.clone(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    Llm,
    Tool,
    Thinking,
}

impl StepKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Llm => "llm",
            StepKind::Tool => "tool",
            StepKind::Thinking => "thinking",
        }
    }

    pub fn parse(s: &str) -> Option<StepKind> {
        Some(match s {
            "llm" => StepKind::Llm,
            "tool" => StepKind::Tool,
            "thinking" => StepKind::Thinking,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Pending,
    Streaming,
    Running,
    Completed,
    Failed,
}

impl StepStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            StepStatus::Pending => "pending",
            StepStatus::Streaming => "streaming",
            StepStatus::Running => "running",
            StepStatus::Completed => "completed",
            StepStatus::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<StepStatus> {
        Some(match s {
            "pending" => StepStatus::Pending,
            "streaming" => StepStatus::Streaming,
            "running" => StepStatus::Running,
            "completed" => StepStatus::Completed,
            "failed" => StepStatus::Failed,
            _ => return None,
        })
    }
}

/// An AgentStep. For an LLM step, `request` holds the projection descriptor (what is needed to
/// rebuild the exact request, not a copy of it) and `response` the assistant message; for a
/// tool step, `request` is the tool call and `response` its output.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepRecord {
    pub id: Uuid,
    pub session_id: Uuid,
    pub run_id: Uuid,
    pub kind: StepKind,
    pub status: StepStatus,
    pub request: Value,
    pub response: Option<Value>,
    pub usage: Option<Usage>,
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// A resumable point, written atomically with the step that completes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Checkpoint {
    pub id: Uuid,
    pub session_id: Uuid,
    pub run_id: Uuid,
    pub step_id: Option<Uuid>,
    /// Messages in the history at this point.
    pub message_count: i64,
    /// The `seq` of the last event committed with this checkpoint.
    pub seq: i64,
    pub created_at: DateTime<Utc>,
}
