//! [`Sessions::start`]: subscribe, run, then follow the run, in one place for every face
//! (REST, the AI SDK's chat, AG-UI). A face parses its input into a [`RunRequest`], says what
//! it wants back ([`Follow`]), and shapes the [`Started`] it gets.

use uuid::Uuid;

use super::command::{IfBusy, RunRequest, RunStarted, RunStopped};
use super::stream::EventStream;
use super::{ConflictKind, SessionError, Sessions, Subscription};
use crate::model::{RunRecord, RunResult, RunStatus};

/// What the caller of [`Sessions::start`] wants back of the run it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Follow {
    /// The run's record only (the run goes on).
    Record,
    /// The run's end: [`StartedRun::end`] is set once the run ended (or this server stopped
    /// following it).
    End,
    /// The run's events from its start, then live until its terminal event
    /// ([`StartedRun::events`]).
    Events,
}

/// What [`Sessions::start`] started.
pub enum Started {
    /// A run started, or the input joined the active run (`queued`).
    Run(Box<StartedRun>),
    /// The request repeats one whose run has completed: its result.
    Completed(RunResult),
}

/// A run that [`Sessions::start`] started or joined.
pub struct StartedRun {
    pub run: RunRecord,
    /// The input was queued for the active run (`IfBusy::Queue`), which is `run`.
    pub queued: bool,
    /// With [`Follow::Events`]: the run's events, from its first, ending after its last.
    pub events: Option<EventStream>,
    /// With [`Follow::End`]: how the run ended.
    pub end: Option<RunEnd>,
}

/// How a run that was waited for ended, as this server saw it.
#[derive(Debug)]
pub enum RunEnd {
    /// The run ended: its result.
    Ended(RunResult),
    /// The database refused a write; the run is recorded as failed (`storage`) once writes
    /// succeed again, and can then be resumed.
    Storage { error: String },
    /// The run did not end on this server (it stopped first, or the session's runs are
    /// continued by another replica): follow the session's events for its end.
    Elsewhere,
    /// A queued input's run was not seen to end here (its stream ended first).
    NotSeen,
}

impl Started {
    /// The run, for a face that streams a run and has nothing to show for a completed one:
    /// a completed repeat is a conflict (no run in progress).
    pub fn into_run(self) -> Result<Box<StartedRun>, SessionError> {
        match self {
            Started::Run(run) => Ok(run),
            Started::Completed(_) => Err(SessionError::Conflict(ConflictKind::NoRunInProgress)),
        }
    }

    /// The run and its events, for what [`Sessions::start`] returned with [`Follow::Events`];
    /// a completed repeat is a conflict, as for [`Started::into_run`].
    pub fn into_events(self) -> Result<(RunRecord, EventStream), SessionError> {
        let StartedRun { run, events, .. } = *self.into_run()?;
        let events = events.expect("a run started with Follow::Events has its events");
        Ok((run, events))
    }
}

/// An input that both answers the run in progress (`answers`) and starts a new one
/// (`new_input`) is refused: the answers go first, then the new input.
pub fn one_input_one_purpose(
    active: Option<&RunRecord>,
    answers: bool,
    new_input: bool,
) -> Result<(), SessionError> {
    match active {
        Some(_) if answers && new_input => {
            Err(SessionError::Conflict(ConflictKind::AnswersAndNewInput))
        }
        _ => Ok(()),
    }
}

impl Sessions {
    /// Starts a run (or a resume, or queues an input for the active run) and follows it as
    /// `follow` asks. For a stream, the session's live events are subscribed to before the run
    /// starts, so the stream misses nothing of it.
    pub async fn start(
        &self,
        id: Uuid,
        request: RunRequest,
        follow: Follow,
    ) -> Result<Started, SessionError> {
        // A queued input's waiting client is answered with the active run's result, which
        // only its events tell.
        let live = match follow {
            Follow::Events => Some(self.subscribe(id)?),
            Follow::End if request.if_busy == IfBusy::Queue => Some(self.subscribe(id)?),
            Follow::End | Follow::Record => None,
        };
        let (run, queued, result) = match self.run(id, request).await? {
            RunStarted::AlreadyCompleted(result) => return Ok(Started::Completed(result)),
            RunStarted::Started { run, result } => (run, false, Some(result)),
            RunStarted::Queued(run) => (run, true, None),
        };
        let mut started = StartedRun {
            run,
            queued,
            events: None,
            end: None,
        };
        match (follow, live) {
            (Follow::Events, Some(live)) => {
                started.events = Some(self.run_stream(id, &started.run, live));
            }
            (Follow::End, live) => {
                let end = match (result, live) {
                    (Some(result), _) => match result.await {
                        Ok(Ok(result)) => RunEnd::Ended(result),
                        Ok(Err(RunStopped::Storage { error })) => RunEnd::Storage { error },
                        // The actor stopped (shutdown, takeover): what is stored tells.
                        Ok(Err(RunStopped::Elsewhere)) | Err(_) => self
                            .ended_run(id, started.run.id)
                            .await?
                            .map_or(RunEnd::Elsewhere, RunEnd::Ended),
                    },
                    (None, Some(live)) => {
                        let mut events = self.run_stream(id, &started.run, live);
                        while let Some(event) = events.next().await {
                            event?;
                        }
                        self.ended_run(id, started.run.id)
                            .await?
                            .map_or(RunEnd::NotSeen, RunEnd::Ended)
                    }
                    (None, None) => RunEnd::NotSeen,
                };
                started.end = Some(end);
            }
            _ => {}
        }
        Ok(Started::Run(Box::new(started)))
    }

    /// A run's events from its first, then live until its terminal event; `live` was
    /// subscribed to before this is read (see [`Sessions::subscribe`]).
    pub fn run_stream(&self, id: Uuid, run: &RunRecord, live: Subscription) -> EventStream {
        self.stream_from(id, run.start_seq - 1, live, Some(run.id))
    }

    /// The result of a run as stored, once it is no longer running.
    async fn ended_run(&self, id: Uuid, run_id: Uuid) -> Result<Option<RunResult>, SessionError> {
        Ok(match self.deps.store.run(id, run_id).await? {
            Some(stored) if stored.status != RunStatus::Running => Some(RunResult::from(&stored)),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{self, RunKind};

    fn running() -> RunRecord {
        RunRecord::started(model::new_id(), RunKind::Run, Some("hi".into()), 2)
    }

    fn conflict(outcome: Result<impl std::fmt::Debug, SessionError>) -> Option<ConflictKind> {
        match outcome {
            Err(SessionError::Conflict(kind)) => Some(kind),
            Err(other) => panic!("not a conflict: {other:?}"),
            Ok(_) => None,
        }
    }

    #[test]
    fn an_input_may_answer_the_active_run_or_start_one_but_not_both() {
        let active = running();
        assert_eq!(
            conflict(one_input_one_purpose(Some(&active), true, true)),
            Some(ConflictKind::AnswersAndNewInput)
        );
        for (answers, new_input) in [(true, false), (false, true), (false, false)] {
            assert_eq!(
                conflict(one_input_one_purpose(Some(&active), answers, new_input)),
                None,
                "answers {answers}, new input {new_input}"
            );
        }
        // Without an active run, the answers go to a parked run and the input starts the next.
        assert_eq!(conflict(one_input_one_purpose(None, true, true)), None);
    }

    #[test]
    fn a_completed_repeat_has_no_run_to_follow() {
        let run = running();
        let completed = Started::Completed(RunResult::from(&run));
        assert_eq!(
            conflict(completed.into_run().map(|run| run.run.id)),
            Some(ConflictKind::NoRunInProgress)
        );
        let started = Started::Run(Box::new(StartedRun {
            run: run.clone(),
            queued: false,
            events: None,
            end: None,
        }));
        let followed = started.into_run().expect("a started run");
        assert_eq!(followed.run.id, run.id);
        assert!(!followed.queued);
    }
}
