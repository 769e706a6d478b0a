//! The session's side of tool calls during a run: it admits each call (the policy, approvals,
//! the client's tools), records answers as they come (and timeouts), and records every
//! start, finish and result. What the command handlers need to check answers is shared with
//! them through [`RunCalls`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;

use super::Run;
use crate::agent::{Answer, Verdict};
use crate::model::{self, Decision, EventKind, ResolvedBy, ToolCall};
use crate::session::command::{Reply, RunRequest, RunStarted};
use crate::session::subagents::Children;
use crate::session::waiting::{
    refusal_output, unanswered_output, Answered, ClientResult, Kind, Resolution, Waiting,
};
use crate::session::{ApprovalAnswer, ConflictKind, SessionDeps, SessionError, Unanswered};
use crate::store::{StoreError, WriteOp};
use crate::tools::policy::{self, Rules};
use crate::tools::{Subject, SubjectKind, ToolContext, ToolOutput, ToolRegistry};

/// An answer on its way from a command handler to the run.
pub(in crate::session) struct AnswerMsg {
    pub call_id: String,
    pub given: Given,
    /// Told once the answer is durable.
    pub reply: Option<Reply<Value>>,
}

pub(in crate::session) enum Given {
    Approval(Resolution),
    Client(ClientResult),
}

/// What the handlers of a driven run share with it.
pub(in crate::session) struct RunCalls {
    pub waiting: Arc<Mutex<Waiting>>,
    pub answers: mpsc::UnboundedSender<AnswerMsg>,
    /// The run's tools, to check an edited input against its tool's schema.
    pub tools: ToolRegistry,
    /// The session's rules as they are now (an "always" adds one), shared with the run: an
    /// edited input is checked against them.
    pub session_rules: Arc<Mutex<Rules>>,
    /// The server's policy and the tools' context, to check an edited input.
    pub deps: Arc<SessionDeps>,
    /// A new run that asked to supersede this one (`?pending=deny`): it starts when this one
    /// has ended.
    pub superseded_by: Mutex<Option<(RunRequest, Reply<RunStarted>)>>,
    /// The run, as a queued input is answered with it.
    pub run: crate::model::RunRecord,
    /// Inputs queued for the run's next step boundary.
    pub queued: Queued,
}

impl RunCalls {
    pub fn waiting(&self) -> MutexGuard<'_, Waiting> {
        lock(&self.waiting)
    }

    pub fn session_rules(&self) -> Rules {
        lock_rules(&self.session_rules).clone()
    }

    /// Checks a human's answer against the run's calls, taking a first one as given.
    pub fn check_approval(
        &self,
        call_id: &str,
        answer: &ApprovalAnswer,
    ) -> Result<Answered<Given>, SessionError> {
        self.waiting()
            .answer_approval(
                call_id,
                answer.decision,
                answer.reason.clone(),
                answer.input.clone(),
                |tool, input| {
                    self.tools
                        .validate_input(tool, input)
                        .map_err(|e| e.to_string())
                },
            )
            .map(|a| map(a, Given::Approval))
            .map_err(SessionError::from)
    }

    /// Checks a client's result against the run's calls, as [`RunCalls::check_approval`] does.
    pub fn check_client(
        &self,
        call_id: &str,
        output: String,
        is_error: bool,
    ) -> Result<Answered<Given>, SessionError> {
        self.waiting()
            .answer_client(call_id, output, is_error)
            .map(|a| map(a, Given::Client))
            .map_err(SessionError::from)
    }

    /// Hands a first answer to the run (which replies once it is recorded); a repeat or a
    /// refusal is answered at once.
    pub fn pass_on(
        &self,
        call_id: String,
        checked: Result<Answered<Given>, SessionError>,
        reply: Reply<Value>,
    ) {
        match checked {
            Ok(Answered::Fresh(given)) => {
                let msg = AnswerMsg {
                    call_id,
                    given,
                    reply: Some(reply),
                };
                // The run ended meanwhile: its successor answers from the log.
                if let Err(mpsc::error::SendError(msg)) = self.answers.send(msg) {
                    if let Some(reply) = msg.reply {
                        let _ = reply.send(Err(SessionError::Conflict(ConflictKind::RunEnded(
                            Unanswered::Approval,
                        ))));
                    }
                }
            }
            Ok(Answered::Repeat(given)) => {
                let _ = reply.send(Ok(given_json(&given)));
            }
            Err(error) => {
                let _ = reply.send(Err(error));
            }
        }
    }
}

pub(in crate::session) fn map<T>(answered: Answered<T>, f: impl Fn(T) -> Given) -> Answered<Given> {
    match answered {
        Answered::Fresh(t) => Answered::Fresh(f(t)),
        Answered::Repeat(t) => Answered::Repeat(f(t)),
    }
}

pub(in crate::session) fn given_json(given: &Given) -> Value {
    match given {
        Given::Approval(resolution) => serde_json::to_value(resolution),
        Given::Client(result) => serde_json::to_value(result),
    }
    .unwrap_or(Value::Null)
}

pub(in crate::session) fn lock_superseded(
    calls: &RunCalls,
) -> MutexGuard<'_, Option<(RunRequest, Reply<RunStarted>)>> {
    // An `Option` behind the lock: a panic cannot leave it torn.
    calls
        .superseded_by
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

pub(in crate::session) fn lock<T>(data: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data behind the lock, never held across an await: a panic cannot leave it torn.
    data.lock().unwrap_or_else(|e| e.into_inner())
}

pub(in crate::session) fn lock_rules(rules: &Mutex<Rules>) -> MutexGuard<'_, Rules> {
    // Rules are only read or pushed to, never held across an await: a panic cannot leave
    // them torn.
    rules.lock().unwrap_or_else(|e| e.into_inner())
}

/// Inputs sent while a run is active (`?if_busy=queue`), for its next step boundary.
pub(in crate::session) type Queued = Arc<Mutex<Vec<String>>>;

/// What the journal of a run needs to admit its calls.
pub(in crate::session) struct CallDesk {
    pub waiting: Arc<Mutex<Waiting>>,
    pub answers: mpsc::UnboundedReceiver<AnswerMsg>,
    pub tools: ToolRegistry,
    pub context: ToolContext,
    pub session_rules: Arc<Mutex<Rules>>,
    /// Replies to clients whose result is told once the call's outcome is recorded.
    pub replies: HashMap<String, Reply<Value>>,
    /// Calls started and not finished.
    pub running: usize,
    /// The sub-agents of the run's `task` calls.
    pub children: Arc<Children>,
    /// What the result of a call says beyond the tool's output (artifacts not kept), by call
    /// id: from its `tool.finished` until its result joins the history.
    pub notes: HashMap<String, String>,
    /// Inputs queued for the run's next step boundary.
    pub queued: Queued,
    /// What people answered to the approvals of the run this one resumes, for its calls
    /// that run again: admitted as answered, not asked about again.
    pub decided: HashMap<String, Resolution>,
}

impl CallDesk {
    /// Whether the run waits only for answers (nothing runs): it may then be left as it is.
    pub fn is_parked(&self) -> bool {
        self.running == 0 && lock(&self.waiting).is_parked()
    }
}

impl Run<'_> {
    pub(in crate::session) async fn next_call_answer(&mut self) -> Result<Answer, StoreError> {
        loop {
            let expiry = lock(&self.calls.waiting).next_expiry();
            let sleep = async {
                match &expiry {
                    Some((_, at)) => {
                        let wait = (*at - model::now()).to_std().unwrap_or(Duration::ZERO);
                        tokio::time::sleep(wait).await
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                msg = self.calls.answers.recv() => match msg {
                    Some(msg) => {
                        if let Some(answer) = self.take_answer(msg).await? {
                            return Ok(answer);
                        }
                    }
                    // Every sender is gone: only expiries can answer now.
                    None => {
                        if expiry.is_none() {
                            std::future::pending::<()>().await;
                        }
                    }
                },
                _ = sleep => {
                    if let Some((call_id, _)) = expiry {
                        return self.expire(&call_id).await;
                    }
                }
            }
        }
    }

    pub(super) async fn take_answer(
        &mut self,
        msg: AnswerMsg,
    ) -> Result<Option<Answer>, StoreError> {
        let item = lock(&self.calls.waiting).get(&msg.call_id).cloned();
        let Some(item) = item else {
            return Ok(None);
        };
        match msg.given {
            Given::Approval(resolution) => {
                self.record_resolution(&resolution);
                // What the human decided on: the subject asked about, or the one the human's
                // input makes.
                let subject = match &resolution.input {
                    Some(input) => {
                        let call = ToolCall {
                            id: msg.call_id.clone(),
                            name: item.tool.clone(),
                            arguments: input.clone(),
                        };
                        self.calls.tools.subject(&self.calls.context, &call).await
                    }
                    None => Subject {
                        kind: SubjectKind::Input,
                        text: item.subject.clone(),
                    },
                };
                if resolution.decision == Decision::Always {
                    // The rule matches exactly the subject of the call that runs.
                    let rule = policy::always_allow(&item.tool, &subject);
                    let added = lock_rules(&self.calls.session_rules).push(rule.clone());
                    if added.is_ok() {
                        self.core.record.options.tool_policy.push(rule.clone());
                        self.core.record.updated_at = model::now();
                        self.batch
                            .ops
                            .push(WriteOp::UpdateSession(self.core.record.clone()));
                        self.batch
                            .event(self.core, EventKind::ToolPolicyUpdated { rule });
                    }
                }
                self.flush_now().await?;
                if let Some(reply) = msg.reply {
                    let _ =
                        reply.send(Ok(serde_json::to_value(&resolution).unwrap_or(Value::Null)));
                }
                let call = ToolCall {
                    id: msg.call_id.clone(),
                    name: item.tool.clone(),
                    arguments: resolution.input.clone().unwrap_or(item.input.clone()),
                };
                let verdict = if resolution.decision.runs() {
                    Verdict::Run {
                        call,
                        decided: Some(subject.text),
                    }
                } else {
                    Verdict::Result(refusal_output(&resolution))
                };
                Ok(Some(Answer {
                    call_id: msg.call_id,
                    verdict,
                }))
            }
            Given::Client(result) => {
                lock(&self.calls.waiting).settle(result.clone());
                if let Some(reply) = msg.reply {
                    self.calls.replies.insert(msg.call_id.clone(), reply);
                }
                Ok(Some(Answer {
                    call_id: msg.call_id,
                    verdict: Verdict::Result(ToolOutput {
                        output: result.output,
                        is_error: result.is_error,
                        artifacts: Vec::new(),
                    }),
                }))
            }
        }
    }

    /// Nobody answered `call_id` in time.
    async fn expire(&mut self, call_id: &str) -> Result<Answer, StoreError> {
        let kind = lock(&self.calls.waiting).get(call_id).map(|item| item.kind);
        let output = match kind {
            Some(Kind::Client) => {
                let output = unanswered_output(Kind::Client);
                lock(&self.calls.waiting).settle(ClientResult {
                    call_id: call_id.to_string(),
                    output: output.output.clone(),
                    is_error: true,
                });
                output
            }
            _ => {
                let resolution = Resolution {
                    call_id: call_id.to_string(),
                    decision: Decision::Deny,
                    by: ResolvedBy::Timeout,
                    reason: Some("nobody answered in time".to_string()),
                    input: None,
                };
                self.record_resolution(&resolution);
                self.flush_now().await?;
                refusal_output(&resolution)
            }
        };
        Ok(Answer {
            call_id: call_id.to_string(),
            verdict: Verdict::Result(output),
        })
    }

    pub(super) fn record_resolution(&mut self, resolution: &Resolution) {
        lock(&self.calls.waiting).resolve(resolution.clone());
        self.batch.event(
            self.core,
            EventKind::ToolApprovalResolved {
                call_id: resolution.call_id.clone(),
                decision: resolution.decision,
                by: resolution.by,
                reason: resolution.reason.clone(),
                input: resolution.input.clone(),
            },
        );
    }
}
