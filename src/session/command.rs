//! The commands a session's actor takes from its mailbox, and what they answer.
//!
//! Plain data: how each command is handled lives with the actor (`actor/`), one handler per
//! command, and nothing else matches on a command.

use serde::Serialize;
use serde_json::Value;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::lineage::Lineage;
use super::waiting::ClientResult;
use crate::model::{
    ClientTool, Decision, RunKind, RunRecord, RunResult, SessionRecord, SessionState,
};
use crate::session::errors::SessionError;

/// Where an actor sends a command's answer.
pub(super) type Reply<T> = oneshot::Sender<Result<T, SessionError>>;

pub(super) enum Command {
    /// Starts a run or a resume.
    Run {
        request: RunRequest,
        reply: Reply<RunStarted>,
    },
    /// Cancels the active run or compaction (here, or on the replica that runs it).
    Cancel {
        reply: Reply<CancelOutcome>,
    },
    /// Another replica asks to cancel this session's run (only acts while one is active).
    RemoteCancel,
    /// Summarises all turns so far; `None` when there is nothing to compact.
    Compact {
        reply: Reply<Option<Compacted>>,
    },
    Delete {
        reply: Reply<()>,
    },
    /// Sets the session's own cap in money (`None`: clears it); answers the session.
    SetCostCap {
        max_cost_usd: Option<f64>,
        reply: Reply<SessionRecord>,
    },
    /// Records a run left in progress by a dead process or replica as interrupted (taking
    /// the session's lease first when replicas share the database); answers whether it was.
    TakeOver {
        reply: Reply<bool>,
    },
    /// The heartbeat found this replica no longer holds the session's lease.
    LeaseLost,
    /// An earlier actor of the session stopped because a write failed: record its run, if one
    /// was left in progress, as failed (`storage`).
    Recover {
        reply: Reply<()>,
    },
    /// A human's answer to a call waiting for approval.
    Approve {
        call_id: String,
        answer: ApprovalAnswer,
        reply: Reply<Value>,
    },
    /// A client's result for a call of one of its tools.
    ClientResult {
        result: ClientResult,
        reply: Reply<Value>,
    },
}

/// What a human answers to an approval request.
#[derive(Debug, Clone)]
pub struct ApprovalAnswer {
    pub decision: Decision,
    pub reason: Option<String>,
    /// Replaces the call's input (checked against the tool's schema).
    pub input: Option<Value>,
    /// The principal that answers.
    pub answered_by: Option<String>,
}

/// What a new run does about calls of the active run that wait for an answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Pending {
    /// Refuse the new run (409).
    #[default]
    Refuse,
    /// Deny every waiting call ("superseded by a new message"), end that run, start this one.
    Deny,
}

/// What a new run does while another run of the session is active (`?if_busy=`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IfBusy {
    /// Refuse it (409).
    #[default]
    Reject,
    /// Append its input as a user message at the next step boundary of the active run.
    Queue,
    /// Cancel the active run (as `/cancel` does), then start this one.
    Interrupt,
}

#[derive(Debug, Clone)]
pub struct RunRequest {
    pub kind: RunKind,
    /// The user's input; `None` for a resume.
    pub input: Option<String>,
    pub pending: Pending,
    pub if_busy: IfBusy,
    /// A sub-agent's run: the tree it belongs to, and the permit its parent's call took for
    /// it (`None`: a top-level run, which takes a permit of its own or is refused).
    pub subagent: Option<Lineage>,
    /// Tools the client runs, for this run only (checked with
    /// [`Sessions::check_run_tools`](super::Sessions::check_run_tools)).
    pub client_tools: Vec<ClientTool>,
    /// The trace span the run's span is a child of (a sub-agent's: its parent's `task` call);
    /// none for a root.
    pub trace_parent: tracing::Span,
    /// US dollars this run may spend (a schedule's fire: the schedule's `max_cost_usd`).
    pub max_cost_usd: Option<f64>,
}

impl RunRequest {
    /// A new run with the user's input.
    pub fn run(input: String, pending: Pending) -> RunRequest {
        RunRequest {
            kind: RunKind::Run,
            input: Some(input),
            pending,
            if_busy: IfBusy::Reject,
            subagent: None,
            client_tools: Vec::new(),
            trace_parent: tracing::Span::none(),
            max_cost_usd: None,
        }
    }

    /// A resume of the interrupted run.
    pub fn resume() -> RunRequest {
        RunRequest {
            kind: RunKind::Resume,
            input: None,
            pending: Pending::Refuse,
            if_busy: IfBusy::Reject,
            subagent: None,
            client_tools: Vec::new(),
            trace_parent: tracing::Span::none(),
            max_cost_usd: None,
        }
    }

    /// The run with client tools of its own, beside the session's.
    pub fn with_client_tools(self, client_tools: Vec<ClientTool>) -> RunRequest {
        RunRequest {
            client_tools,
            ..self
        }
    }

    /// The run bounded to spend at most `max_cost_usd` US dollars itself.
    pub fn max_cost_usd(self, max_cost_usd: Option<f64>) -> RunRequest {
        RunRequest {
            max_cost_usd,
            ..self
        }
    }

    /// What it does while another run is active.
    pub fn if_busy(self, if_busy: IfBusy) -> RunRequest {
        RunRequest { if_busy, ..self }
    }

    /// A sub-agent's resume of its interrupted run, in its parent's tree with the permit taken
    /// for it (and, in traces, under the span of the parent's call, the current one).
    pub fn subagent_resume(lineage: Lineage) -> RunRequest {
        RunRequest {
            subagent: Some(lineage),
            trace_parent: tracing::Span::current(),
            ..RunRequest::resume()
        }
    }

    /// A sub-agent's run of `prompt`, in its parent's tree with the permit taken for it (and,
    /// in traces, under the span of the parent's call, the current one).
    pub fn subagent(prompt: String, lineage: Lineage) -> RunRequest {
        RunRequest {
            subagent: Some(lineage),
            trace_parent: tracing::Span::current(),
            ..RunRequest::run(prompt, Pending::Refuse)
        }
    }
}

/// A run that has started (its start is durable), or the result of a completed session that a
/// resume returned as is.
pub enum RunStarted {
    Started {
        run: RunRecord,
        result: oneshot::Receiver<Result<RunResult, RunStopped>>,
    },
    AlreadyCompleted(RunResult),
    /// The input was queued for the active run (`?if_busy=queue`), which is answered.
    Queued(RunRecord),
}

/// Why a run ended without a result from this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunStopped {
    /// The database refused a write; the run is recorded as failed (`storage`) once writes
    /// succeed again.
    Storage { error: String },
    /// Another replica took the session over, or continues the run after this one stopped.
    Elsewhere,
}

#[derive(Debug, Clone, Serialize)]
pub struct CancelOutcome {
    /// True when a run (or compaction) was in progress and has been asked to stop.
    pub cancelled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<Uuid>,
    pub state: SessionState,
}

/// What a manual compaction did.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Compacted {
    pub turns: u64,
    pub chars: u64,
}
