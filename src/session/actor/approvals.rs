//! Answers to calls that wait: a human's answer to an approval request, and a client's result
//! for a call of one of its tools. While the run is driven its handlers check the answer
//! against what waits and hand it to the run; a run that waited with nobody driving it (after
//! a restart or a takeover) is continued with the answer.

use serde_json::Value;

use super::calls::{AnswerMsg, Given};
use super::run::Begin;
use super::{Phase, SessionActor, Stop};
use crate::session::command::{ApprovalAnswer, Reply};
use crate::session::live::Inbox;
use crate::session::waiting::Answered;
use crate::session::SessionError;

pub(super) async fn approve(
    phase: Phase<'_>,
    call_id: String,
    answer: ApprovalAnswer,
    reply: Reply<Value>,
) -> Result<(), Stop> {
    match phase {
        Phase::Busy(activity) => {
            match &activity.calls {
                Some(calls) => calls.approve(call_id, answer, reply),
                None => drop(reply.send(Err(nothing_waits(&call_id)))),
            }
            Ok(())
        }
        Phase::Idle(actor, inbox) => {
            let tools = actor.deps.agent.tools.clone();
            let checked = actor
                .with_parked(|waiting| {
                    waiting
                        .answer_approval(
                            &call_id,
                            answer.decision,
                            answer.reason,
                            answer.input,
                            |tool, input| {
                                tools.validate_input(tool, input).map_err(|e| e.to_string())
                            },
                        )
                        .map(|a| match a {
                            Answered::Fresh(r) => Answered::Fresh(Given::Approval(r)),
                            Answered::Repeat(r) => Answered::Repeat(Given::Approval(r)),
                        })
                })
                .await;
            actor.answer_parked(call_id, checked, reply, inbox).await
        }
    }
}

pub(super) async fn client_result(
    phase: Phase<'_>,
    call_id: String,
    output: String,
    is_error: bool,
    reply: Reply<Value>,
) -> Result<(), Stop> {
    match phase {
        Phase::Busy(activity) => {
            match &activity.calls {
                Some(calls) => calls.client_result(call_id, output, is_error, reply),
                None => drop(reply.send(Err(nothing_waits(&call_id)))),
            }
            Ok(())
        }
        Phase::Idle(actor, inbox) => {
            let checked = actor
                .with_parked(|waiting| {
                    waiting
                        .answer_client(&call_id, output, is_error)
                        .map(|a| match a {
                            Answered::Fresh(r) => Answered::Fresh(Given::Client(r)),
                            Answered::Repeat(r) => Answered::Repeat(Given::Client(r)),
                        })
                })
                .await;
            actor.answer_parked(call_id, checked, reply, inbox).await
        }
    }
}

fn no_run_waits() -> SessionError {
    SessionError::NoSuchCall("the session has no run that waits for answers".to_string())
}

fn nothing_waits(call_id: &str) -> SessionError {
    SessionError::NoSuchCall(format!(
        "nothing in the session waits for an answer to call_id {call_id:?}"
    ))
}

impl SessionActor {
    /// Checks an answer against what the session's parked run waits for. `Err` also when the
    /// session cannot be had or no run waits.
    async fn with_parked<T>(
        &mut self,
        check: impl FnOnce(&mut crate::session::waiting::Waiting) -> Result<Answered<T>, SessionError>,
    ) -> Result<Result<Answered<T>, SessionError>, super::access::Refusal> {
        let core = self.claim_with_history().await?;
        if let Some(waiting) = core.parked.as_mut() {
            return Ok(check(waiting));
        }
        // No run waits: the same answer to a call of the last run is a repeat, another one a
        // conflict, and nothing else can be answered any more.
        let Some(run) = core.last_run.clone() else {
            return Ok(Err(no_run_waits()));
        };
        let mut waiting =
            crate::session::waiting::of_run(self.deps.store.as_ref(), self.id, run.start_seq)
                .await?;
        Ok(match check(&mut waiting) {
            Ok(Answered::Fresh(_)) => Err(no_run_waits()),
            other => other,
        })
    }

    /// Acts on a checked answer to the parked run: a first answer continues the run (which
    /// replies once the answer is recorded), a repeat is answered at once.
    async fn answer_parked(
        &mut self,
        call_id: String,
        checked: Result<Result<Answered<Given>, SessionError>, super::access::Refusal>,
        reply: Reply<Value>,
        inbox: &mut Inbox,
    ) -> Result<(), Stop> {
        let checked = match checked {
            Ok(checked) => checked,
            Err(refusal) => return refusal.answer(self.id, reply),
        };
        match checked {
            Err(error) => {
                let _ = reply.send(Err(error));
                Ok(())
            }
            Ok(Answered::Repeat(given)) => {
                let _ = reply.send(Ok(match given {
                    Given::Approval(r) => serde_json::to_value(r),
                    Given::Client(r) => serde_json::to_value(r),
                }
                .unwrap_or(Value::Null)));
                Ok(())
            }
            Ok(Answered::Fresh(given)) => {
                let waiting = self
                    .core
                    .as_mut()
                    .and_then(|core| core.parked.take())
                    .unwrap_or_default();
                let mut begin = Begin::resumed(waiting);
                begin.answer = Some(AnswerMsg {
                    call_id,
                    given,
                    reply: Some(reply),
                });
                let mut next = self.continue_run(begin, inbox).await?;
                while let Some((request, reply)) = next.take() {
                    next = self.start_run(request, reply, inbox).await?;
                }
                Ok(())
            }
        }
    }
}
