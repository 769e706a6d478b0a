//! How a run ends, decided in one pure place: what the loop came back with, and whether the
//! server is stopping, map to the run's final record, the session's state and the run's one
//! terminal event.

use chrono::{DateTime, Utc};

use crate::agent::{AgentError, TurnOutcome};
use crate::model::{
    EventKind, FinishReason, RunRecord, RunStatus, SessionState, Usage, INTERRUPTED,
};

/// What the agent loop came back with, once a failure to record it is set apart.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::session) enum RunOutcome {
    Finished(TurnOutcome),
    Cancelled {
        usage: Usage,
        steps: i64,
    },
    Failed {
        error: String,
        usage: Usage,
        steps: i64,
    },
}

impl RunOutcome {
    /// Splits the loop's result: `Err` is the journal's failure (nothing more can be recorded).
    pub fn of<E>(result: Result<TurnOutcome, AgentError<E>>) -> Result<RunOutcome, E> {
        match result {
            Ok(outcome) => Ok(RunOutcome::Finished(outcome)),
            Err(AgentError::Cancelled { usage, steps }) => {
                Ok(RunOutcome::Cancelled { usage, steps })
            }
            Err(AgentError::Model {
                error,
                usage,
                steps,
            }) => Ok(RunOutcome::Failed {
                error: error.to_string(),
                usage,
                steps,
            }),
            Err(AgentError::NotStarted { error }) => Ok(RunOutcome::Failed {
                error,
                usage: Usage::default(),
                steps: 0,
            }),
            Err(AgentError::Journal(error)) => Err(error),
        }
    }
}

/// Where the process stands when a run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::session) enum Stopping {
    /// The server goes on.
    No,
    /// The server is shutting down, alone on its database: an interrupted run is recorded as
    /// such and stays resumable.
    Alone,
    /// The server is shutting down and replicas share the database: a run it interrupted is
    /// left as it is, for another replica to take over from its last checkpoint.
    Replicated,
}

#[derive(Debug, Clone, PartialEq)]
pub(in crate::session) enum Conclusion {
    Record(Box<Ending>),
    /// Write nothing more: another replica takes the run over.
    LeaveForTakeover,
}

/// A run's end as it is recorded.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::session) struct Ending {
    /// The run's final record.
    pub run: RunRecord,
    pub state: SessionState,
    pub terminal: EventKind,
}

impl Ending {
    /// The session's error: the run's, when the run failed.
    pub fn session_error(&self) -> Option<String> {
        match self.state {
            SessionState::Failed => self.run.error.clone(),
            _ => None,
        }
    }
}

/// How `run` ends with `outcome`.
pub(in crate::session) fn conclude(
    run: RunRecord,
    outcome: RunOutcome,
    stopping: Stopping,
    at: DateTime<Utc>,
) -> Conclusion {
    match (outcome, stopping) {
        (RunOutcome::Cancelled { .. }, Stopping::Replicated) => Conclusion::LeaveForTakeover,
        (RunOutcome::Cancelled { usage, steps }, Stopping::Alone) => record(interrupted(
            RunRecord {
                usage,
                steps,
                ..run
            },
            at,
        )),
        (RunOutcome::Cancelled { usage, steps }, Stopping::No) => {
            let run = RunRecord {
                usage,
                steps,
                status: RunStatus::Cancelled,
                finished_at: Some(at),
                ..run
            };
            let terminal = EventKind::AgentCancelled { run_id: run.id };
            Conclusion::Record(Box::new(Ending {
                run,
                state: SessionState::Cancelled,
                terminal,
            }))
        }
        (
            RunOutcome::Failed {
                error,
                usage,
                steps,
            },
            _,
        ) => record(failed(
            RunRecord {
                usage,
                steps,
                ..run
            },
            error,
            at,
        )),
        (RunOutcome::Finished(outcome), _) => record(finished(run, outcome, at)),
    }
}

fn record(ending: Ending) -> Conclusion {
    Conclusion::Record(Box::new(ending))
}

/// A run that hit a limit (`max_steps`) finishes with its text but counts as failed. The loop
/// stops exactly when its count of LLM steps reaches `max_steps`, so `steps` is the limit.
fn finished(run: RunRecord, outcome: TurnOutcome, at: DateTime<Utc>) -> Ending {
    let TurnOutcome {
        text,
        finish_reason,
        limit,
        usage,
        steps,
    } = outcome;
    let (status, state, error) = match &finish_reason {
        FinishReason::MaxSteps => (
            RunStatus::Failed,
            SessionState::Failed,
            Some(format!(
                "stopped after {steps} LLM steps (max_steps={steps})"
            )),
        ),
        FinishReason::Budget => (
            RunStatus::Failed,
            SessionState::Failed,
            Some(limit.unwrap_or_else(|| "token budget exhausted".to_string())),
        ),
        FinishReason::Model(_) => (RunStatus::Completed, SessionState::Completed, None),
    };
    let terminal = EventKind::AgentFinished {
        run_id: run.id,
        text: text.clone(),
        finish_reason: finish_reason.clone(),
        usage,
    };
    Ending {
        run: RunRecord {
            status,
            text: Some(text),
            finish_reason: Some(finish_reason),
            usage,
            steps,
            error,
            finished_at: Some(at),
            ..run
        },
        state,
        terminal,
    }
}

fn failed(run: RunRecord, error: String, at: DateTime<Utc>) -> Ending {
    let terminal = EventKind::AgentFailed {
        run_id: run.id,
        error: error.clone(),
    };
    Ending {
        run: RunRecord {
            status: RunStatus::Failed,
            error: Some(error),
            finished_at: Some(at),
            ..run
        },
        state: SessionState::Failed,
        terminal,
    }
}

/// A run a stop or a crash cut short: failed as `interrupted`, and resumable.
pub(in crate::session) fn interrupted(run: RunRecord, at: DateTime<Utc>) -> Ending {
    cut_short(run, INTERRUPTED, at)
}

/// A run found in progress by an actor that did not start it: failed with `cause`
/// (`interrupted`, or `storage` after a failed write), and resumable.
pub(in crate::session) fn cut_short(run: RunRecord, cause: &str, at: DateTime<Utc>) -> Ending {
    failed(run, cause.to_string(), at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::RunKind;
    use uuid::Uuid;

    fn running() -> RunRecord {
        RunRecord {
            id: Uuid::now_v7(),
            session_id: Uuid::now_v7(),
            kind: RunKind::Run,
            status: RunStatus::Running,
            input: Some("hi".into()),
            text: None,
            finish_reason: None,
            usage: Usage::default(),
            steps: 0,
            error: None,
            start_seq: 3,
            created_at: crate::model::now(),
            finished_at: None,
            client_tools: Vec::new(),
        }
    }

    fn usage() -> Usage {
        Usage {
            input_tokens: 10,
            output_tokens: 2,
        }
    }

    fn record(conclusion: Conclusion) -> Ending {
        match conclusion {
            Conclusion::Record(ending) => *ending,
            Conclusion::LeaveForTakeover => panic!("expected an ending"),
        }
    }

    fn finished_with(reason: FinishReason) -> RunOutcome {
        RunOutcome::Finished(TurnOutcome {
            text: "done".into(),
            finish_reason: reason,
            limit: None,
            usage: usage(),
            steps: 2,
        })
    }

    #[test]
    fn a_model_stop_completes_the_run_and_the_session() {
        let run = running();
        let at = crate::model::now();
        let ending = record(conclude(
            run.clone(),
            finished_with(FinishReason::Model("stop".into())),
            Stopping::No,
            at,
        ));
        assert_eq!(ending.state, SessionState::Completed);
        assert_eq!(ending.run.status, RunStatus::Completed);
        assert_eq!(ending.run.text.as_deref(), Some("done"));
        assert_eq!(ending.run.steps, 2);
        assert_eq!(ending.run.usage, usage());
        assert_eq!(ending.run.finished_at, Some(at));
        assert_eq!(ending.session_error(), None);
        assert_eq!(
            ending.terminal,
            EventKind::AgentFinished {
                run_id: run.id,
                text: "done".into(),
                finish_reason: FinishReason::Model("stop".into()),
                usage: usage(),
            }
        );
    }

    #[test]
    fn a_step_limit_finishes_with_its_text_but_fails_the_session() {
        let ending = record(conclude(
            running(),
            finished_with(FinishReason::MaxSteps),
            Stopping::No,
            crate::model::now(),
        ));
        assert_eq!(ending.state, SessionState::Failed);
        assert_eq!(ending.run.status, RunStatus::Failed);
        assert_eq!(ending.run.finish_reason, Some(FinishReason::MaxSteps));
        let error = "stopped after 2 LLM steps (max_steps=2)";
        assert_eq!(ending.session_error().as_deref(), Some(error));
        assert_eq!(ending.run.error.as_deref(), Some(error));
        assert!(matches!(ending.terminal, EventKind::AgentFinished { .. }));
    }

    #[test]
    fn a_cancel_cancels_unless_the_server_is_stopping() {
        let cancelled = RunOutcome::Cancelled {
            usage: usage(),
            steps: 1,
        };
        let run = running();
        let ending = record(conclude(
            run.clone(),
            cancelled.clone(),
            Stopping::No,
            crate::model::now(),
        ));
        assert_eq!(ending.state, SessionState::Cancelled);
        assert_eq!(ending.run.status, RunStatus::Cancelled);
        assert_eq!(ending.session_error(), None);
        assert_eq!(
            ending.terminal,
            EventKind::AgentCancelled { run_id: run.id }
        );

        let ending = record(conclude(
            run.clone(),
            cancelled.clone(),
            Stopping::Alone,
            crate::model::now(),
        ));
        assert_eq!(ending.state, SessionState::Failed);
        assert_eq!(ending.run.error.as_deref(), Some(INTERRUPTED));
        assert_eq!(ending.run.usage, usage());
        assert_eq!(
            ending.terminal,
            EventKind::AgentFailed {
                run_id: run.id,
                error: INTERRUPTED.into()
            }
        );

        assert_eq!(
            conclude(run, cancelled, Stopping::Replicated, crate::model::now()),
            Conclusion::LeaveForTakeover
        );
    }

    #[test]
    fn a_run_that_ended_on_its_own_is_recorded_even_while_stopping() {
        let ending = record(conclude(
            running(),
            finished_with(FinishReason::Model("stop".into())),
            Stopping::Replicated,
            crate::model::now(),
        ));
        assert_eq!(ending.state, SessionState::Completed);
    }

    #[test]
    fn a_model_failure_fails_the_run_with_its_error() {
        let run = running();
        let ending = record(conclude(
            run.clone(),
            RunOutcome::Failed {
                error: "openai: 401".into(),
                usage: usage(),
                steps: 1,
            },
            Stopping::No,
            crate::model::now(),
        ));
        assert_eq!(ending.state, SessionState::Failed);
        assert_eq!(ending.session_error().as_deref(), Some("openai: 401"));
        assert_eq!(
            ending.terminal,
            EventKind::AgentFailed {
                run_id: run.id,
                error: "openai: 401".into()
            }
        );
    }

    #[test]
    fn a_journal_failure_is_set_apart() {
        let result: Result<TurnOutcome, AgentError<&str>> = Err(AgentError::Journal("disk full"));
        assert_eq!(RunOutcome::of(result), Err("disk full"));
        let result: Result<TurnOutcome, AgentError<&str>> = Err(AgentError::Cancelled {
            usage: usage(),
            steps: 0,
        });
        assert_eq!(
            RunOutcome::of(result),
            Ok(RunOutcome::Cancelled {
                usage: usage(),
                steps: 0
            })
        );
    }
}
