//! What a session refuses, typed: HTTP and the other faces shape these into their own errors
//! and never build them.

use uuid::Uuid;

use crate::model::waiting::Refusal;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("session not found")]
    NotFound,
    /// No such agent, or no such version of it.
    #[error("{0}")]
    AgentNotFound(String),
    /// No environment of that id or name in the tenant.
    #[error("{0}")]
    EnvironmentNotFound(String),
    /// A conditional update made from a version that is no longer the latest.
    #[error("the agent's latest version is {latest}, not the one this update was made from; read it and try again")]
    AgentStale { latest: u32 },
    /// The session's state does not allow the request (a run is active, nothing to resume…).
    #[error("{}", .0.detail())]
    Conflict(ConflictKind),
    /// The request is not valid for this server (an unknown tool name, a bad rule…).
    #[error("{0}")]
    BadInput(String),
    /// An answer that does not fit (an edited input against the tool's schema).
    #[error("{0}")]
    Invalid(String),
    /// An approval's edited input that the policy denies; the approval still waits.
    #[error("{0}")]
    EditedInputDenied(String),
    /// No call of this id in the session.
    #[error("{0}")]
    NoSuchCall(String),
    /// The call was answered already, differently; `resolution` is the stored answer.
    #[error("{detail}")]
    AlreadyResolved {
        detail: String,
        resolution: serde_json::Value,
    },
    /// The model provider failed (a compaction's summary request).
    #[error(transparent)]
    Upstream(crate::llm::LlmError),
    /// The process runs as many runs as it may; retry later.
    #[error("{0}")]
    TooBusy(String),
    /// The session's tenant is at one of its limits; `retry_after` is in seconds.
    #[error("{detail}")]
    TenantLimit { detail: String, retry_after: u64 },
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The session's last run stopped on a failed write, and recording it as failed fails
    /// too: what needs that record (its event stream) waits until writes succeed.
    #[error("the session's last run is not recorded yet: {0}")]
    Unrecorded(StoreError),
}

impl From<Refusal> for SessionError {
    fn from(refusal: Refusal) -> SessionError {
        match refusal {
            Refusal::NoSuchCall(detail) => SessionError::NoSuchCall(detail),
            Refusal::AlreadyResolved { detail, resolution } => {
                SessionError::AlreadyResolved { detail, resolution }
            }
            Refusal::Invalid(detail) => SessionError::Invalid(detail),
        }
    }
}

/// Why the session's state refuses a request (`409`, with [`ConflictKind::code`] as the
/// problem's type).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConflictKind {
    /// A run is active; `before` is what the client tried ("fork the session", …).
    RunActive { run_id: Uuid, before: &'static str },
    /// A fork of every turn while one is in progress.
    ForkWhileRunning,
    /// One input that both answers the run in progress and starts a new one (AG-UI).
    AnswersAndNewInput,
    /// A compaction is in progress; `before` as for `RunActive`.
    CompactionActive { before: &'static str },
    /// Another replica runs the session.
    RunningElsewhere,
    /// Another replica took the session over while this one worked on it.
    LeaseLost,
    /// Nothing to resume: no run was interrupted.
    NothingToResume,
    /// A stream asked to resume a run, and none is in progress.
    NoRunInProgress,
    /// An assistant message to continue that no run of the session wrote.
    NothingToContinue,
    /// The last run waits for answers, and a new run was asked for without `?pending=`.
    ApprovalsPending,
    /// The run ended before the answer to one of its calls was recorded.
    RunEnded(Unanswered),
    /// A manual compaction was cancelled.
    CompactionCancelled,
    /// New sessions (and updates) on an archived agent.
    AgentArchived(crate::model::AgentId),
    /// The default agent follows the server's flags: it is not changed through the API.
    DefaultAgent,
    /// The tenant has an environment of that name already (or it is the built-in `local`).
    EnvironmentExists(String),
}

/// The answer that came too late for [`ConflictKind::RunEnded`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unanswered {
    /// An approval, sent while the run ended.
    Approval,
    /// A client tool's result, sent while the run ended.
    Result,
    /// A call an earlier run left unanswered.
    Call(String),
}

impl ConflictKind {
    /// The problem type's last segment (`…/problems/run-active`).
    pub fn code(&self) -> &'static str {
        match self {
            ConflictKind::RunActive { .. }
            | ConflictKind::ForkWhileRunning
            | ConflictKind::AnswersAndNewInput => "run-active",
            ConflictKind::CompactionActive { .. } => "compaction-active",
            ConflictKind::RunningElsewhere | ConflictKind::LeaseLost => "session-leased",
            ConflictKind::NothingToResume | ConflictKind::NoRunInProgress => "nothing-to-resume",
            ConflictKind::NothingToContinue => "nothing-to-continue",
            ConflictKind::ApprovalsPending => "approvals-pending",
            ConflictKind::RunEnded(_) => "run-ended",
            ConflictKind::CompactionCancelled => "compaction-cancelled",
            ConflictKind::AgentArchived(_) => "agent-archived",
            ConflictKind::DefaultAgent => "default-agent",
            ConflictKind::EnvironmentExists(_) => "environment-exists",
        }
    }

    /// What a person reads: what refused the request, and what to do.
    pub fn detail(&self) -> String {
        match self {
            ConflictKind::RunActive { run_id, before } => format!(
                "run {run_id} is active; cancel it or wait for it to end before you {before}"
            ),
            ConflictKind::ForkWhileRunning => "the session is running, and a fork of all its \
                turns would copy the one in progress; wait for the run to end, cancel it, or \
                fork the turns that have ended with `turns`"
                .to_string(),
            ConflictKind::AnswersAndNewInput => "this input both answers the run in progress \
                and starts a new one; send the answers (resume, tool results) first, then the \
                new message"
                .to_string(),
            ConflictKind::CompactionActive { before } => {
                format!("a compaction is in progress; wait for it or cancel it before you {before}")
            }
            ConflictKind::RunningElsewhere => {
                "the session is running on another replica; cancel it or wait for it to end"
                    .to_string()
            }
            ConflictKind::LeaseLost => "another replica took the session over".to_string(),
            ConflictKind::NothingToResume => "the session has no run to resume".to_string(),
            ConflictKind::NoRunInProgress => "the session has no run in progress".to_string(),
            ConflictKind::NothingToContinue => {
                "the session has no run for this assistant message to continue".to_string()
            }
            ConflictKind::ApprovalsPending => "the session's run waits for answers to tool \
                calls; answer them, cancel the run, or start the new run with ?pending=deny to \
                deny them"
                .to_string(),
            ConflictKind::RunEnded(Unanswered::Approval) => {
                "the run ended before the answer was recorded".to_string()
            }
            ConflictKind::RunEnded(Unanswered::Result) => {
                "the run ended before the result was recorded".to_string()
            }
            ConflictKind::RunEnded(Unanswered::Call(call_id)) => format!(
                "the run of call {call_id:?} ended before anybody answered it: it cannot be \
                 answered any more"
            ),
            ConflictKind::CompactionCancelled => {
                "the compaction was cancelled; nothing was written".to_string()
            }
            ConflictKind::AgentArchived(id) => format!(
                "agent {id} is archived: sessions already on it go on, new ones cannot start on it"
            ),
            ConflictKind::DefaultAgent => "the default agent follows the server's flags                 (--model, --system-prompt, --tools, …); change them, or create an agent"
                .to_string(),
            ConflictKind::EnvironmentExists(name) => format!(
                "the tenant has an environment named {name:?} already (local is built in)"
            ),
        }
    }

    /// Another run or replica holds the session for now: the same request may succeed later.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ConflictKind::RunActive { .. }
                | ConflictKind::RunningElsewhere
                | ConflictKind::LeaseLost
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_problem_code_and_a_detail() {
        let run_id = Uuid::nil();
        let kinds = [
            (
                ConflictKind::RunActive {
                    run_id,
                    before: "fork",
                },
                "run-active",
            ),
            (ConflictKind::ForkWhileRunning, "run-active"),
            (ConflictKind::AnswersAndNewInput, "run-active"),
            (
                ConflictKind::CompactionActive { before: "fork" },
                "compaction-active",
            ),
            (ConflictKind::RunningElsewhere, "session-leased"),
            (ConflictKind::LeaseLost, "session-leased"),
            (ConflictKind::NothingToResume, "nothing-to-resume"),
            (ConflictKind::NoRunInProgress, "nothing-to-resume"),
            (ConflictKind::NothingToContinue, "nothing-to-continue"),
            (ConflictKind::ApprovalsPending, "approvals-pending"),
            (ConflictKind::RunEnded(Unanswered::Approval), "run-ended"),
            (ConflictKind::RunEnded(Unanswered::Result), "run-ended"),
            (
                ConflictKind::RunEnded(Unanswered::Call("c1".into())),
                "run-ended",
            ),
            (ConflictKind::CompactionCancelled, "compaction-cancelled"),
            (
                ConflictKind::AgentArchived(crate::model::AgentId::Default),
                "agent-archived",
            ),
            (ConflictKind::DefaultAgent, "default-agent"),
        ];
        for (kind, code) in kinds {
            assert_eq!(kind.code(), code, "{kind:?}");
            let error = SessionError::Conflict(kind.clone());
            assert_eq!(error.to_string(), kind.detail());
            assert!(!kind.detail().is_empty());
        }
        assert!(ConflictKind::RunActive {
            run_id,
            before: "fork"
        }
        .detail()
        .contains("before you fork"));
        assert!(ConflictKind::RunEnded(Unanswered::Call("c1".into()))
            .detail()
            .contains("\"c1\""));
    }
}
