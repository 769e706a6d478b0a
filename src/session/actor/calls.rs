//! The session's side of tool calls during a run: it admits each call (the policy, approvals,
//! the client's tools), records answers as they come (and timeouts), and records every
//! start, finish and result. What the command handlers need to check answers is shared with
//! them through [`RunCalls`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use uuid::Uuid;

use super::journal::RunJournal;
use crate::agent::{Admission, Answer, Verdict};
use crate::model::{
    self, Action, Decision, EventKind, Message, ResolvedBy, SessionState, StepStatus, ToolCall,
};
use crate::session::command::{Reply, RunRequest, RunStarted};
use crate::session::subagents::{Children, TASK};
use crate::session::waiting::{
    denied_output, refusal_output, unanswered_output, Answered, ClientResult, Kind, Resolution,
    Waiting,
};
use crate::session::{
    ApprovalAnswer, ConflictKind, SessionDeps, SessionError, ToolPolicy, Unanswered,
};
use crate::store::{StoreError, WriteOp};
use crate::tools::policy::{self, Rules};
use crate::tools::{Subject, SubjectKind, ToolContext, ToolOutput, ToolRegistry};

/// An answer on its way from a command handler to the run.
pub(super) struct AnswerMsg {
    pub call_id: String,
    pub given: Given,
    /// Told once the answer is durable.
    pub reply: Option<Reply<Value>>,
}

pub(super) enum Given {
    Approval(Resolution),
    Client(ClientResult),
}

/// What the handlers of a driven run share with it.
pub(super) struct RunCalls {
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

pub(super) fn map<T>(answered: Answered<T>, f: impl Fn(T) -> Given) -> Answered<Given> {
    match answered {
        Answered::Fresh(t) => Answered::Fresh(f(t)),
        Answered::Repeat(t) => Answered::Repeat(f(t)),
    }
}

pub(super) fn given_json(given: &Given) -> Value {
    match given {
        Given::Approval(resolution) => serde_json::to_value(resolution),
        Given::Client(result) => serde_json::to_value(result),
    }
    .unwrap_or(Value::Null)
}

pub(super) fn lock_superseded(
    calls: &RunCalls,
) -> MutexGuard<'_, Option<(RunRequest, Reply<RunStarted>)>> {
    // An `Option` behind the lock: a panic cannot leave it torn.
    calls
        .superseded_by
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

pub(super) fn lock<T>(data: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data behind the lock, never held across an await: a panic cannot leave it torn.
    data.lock().unwrap_or_else(|e| e.into_inner())
}

/// What policy says of a call of `tool` without looking at its subject; `None` when a rule for
/// the tool has a subject pattern, so that the subject decides.
fn decide_unread(
    policy: &ToolPolicy,
    session_rules: &Mutex<Rules>,
    tool: &str,
) -> Option<policy::Decision> {
    let session_rules = lock_rules(session_rules);
    if policy.rules.read_subject_of(tool) || session_rules.read_subject_of(tool) {
        return None;
    }
    Some(policy::decide(
        &policy.rules,
        &session_rules,
        policy.mode,
        tool,
        &Subject::UNREAD,
    ))
}

fn lock_rules(rules: &Mutex<Rules>) -> MutexGuard<'_, Rules> {
    // Rules are only read or pushed to, never held across an await: a panic cannot leave
    // them torn.
    rules.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why the policy denies a call of `tool`, as the model and the client are told.
pub(super) fn denial_reason(decision: &policy::Decision, tool: &str) -> String {
    if decision.by_approval_mode {
        return "the call needs an approval, and this server's approval mode is deny: nobody \
                can approve calls here"
            .to_string();
    }
    let Some(rule) = &decision.rule else {
        return format!("the policy denies {tool}");
    };
    format!(
        "the {} policy denies {tool} (rule {}: {})",
        serde_json::to_value(rule.origin)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        rule.index,
        serde_json::to_string(&rule.rule).unwrap_or_default()
    )
}

/// Inputs sent while a run is active (`?if_busy=queue`), for its next step boundary.
pub(super) type Queued = Arc<Mutex<Vec<String>>>;

/// What the journal of a run needs to admit its calls.
pub(super) struct CallDesk {
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

fn expires(timeout: Option<Duration>) -> Option<DateTime<Utc>> {
    timeout.and_then(|t| chrono::Duration::from_std(t).ok().map(|t| model::now() + t))
}

impl RunJournal<'_> {
    fn policy(&self) -> &ToolPolicy {
        &self.sink.deps.policy
    }

    pub(super) async fn admit_call(&mut self, call: &ToolCall) -> Result<Admission, StoreError> {
        let known = lock(&self.calls.waiting).get(&call.id).cloned();
        if let Some(item) = known {
            let step_id = item.step_id;
            if item.in_transit {
                // Its answer is on the way: it is recorded when the run takes it.
                return Ok(Admission::Waits { step_id });
            }
            return Ok(match (item.kind, item.resolution, item.result) {
                (Kind::Approval, Some(r), _) if r.decision.runs() => {
                    let edited = r.input.is_some();
                    let call = with_input(call, r.input);
                    let decided = if edited {
                        self.calls
                            .tools
                            .subject(&self.calls.context, &call)
                            .await
                            .text
                    } else {
                        item.subject
                    };
                    Admission::Run {
                        step_id,
                        call,
                        decided: Some(decided),
                    }
                }
                (Kind::Approval, Some(r), _) => Admission::Refused {
                    step_id,
                    output: refusal_output(&r),
                },
                (Kind::Client, _, Some(result)) => Admission::Refused {
                    step_id,
                    output: ToolOutput {
                        output: result.output,
                        is_error: result.is_error,
                        artifacts: Vec::new(),
                    },
                },
                (_, _, _) => Admission::Waits { step_id },
            });
        }
        let step_id = model::new_id();
        let run = self.core.last_run.as_ref().filter(|r| r.id == self.run_id);
        let client = match run {
            Some(run) => {
                model::client_tools_of(&self.core.record, run).find(|t| t.name == call.name)
            }
            None => self
                .core
                .record
                .options
                .client_tools
                .iter()
                .find(|t| t.name == call.name),
        };
        if let Some(client) = client {
            let timeout = client
                .timeout_s
                .map(Duration::from_secs)
                .or(self.policy().approval_timeout);
            let kind = EventKind::ToolClientRequested {
                step_id,
                call_id: call.id.clone(),
                tool: call.name.clone(),
                input: call.arguments.clone(),
                expires_at: expires(timeout),
            };
            self.wait_for(step_id, call, kind).await?;
            return Ok(Admission::Waits { step_id });
        }
        if self.calls.tools.get(&call.name).is_none() {
            // Not a tool of this run: running it answers the model with an error.
            return Ok(Admission::Run {
                step_id,
                call: call.clone(),
                decided: None,
            });
        }
        // The subject (a path resolved in the workspace, a command) is worked out only when a
        // rule for this tool looks at it, or for a human to be asked about the call.
        // Answered in the run this one resumes: the answer stands, unless the server now
        // denies the call.
        let decided = self.calls.decided.remove(&call.id);
        let policy = &self.sink.deps.policy;
        let mut subject = None;
        let decision = match decide_unread(policy, &self.calls.session_rules, &call.name) {
            Some(decision) => decision,
            None => {
                let read =
                    subject.insert(self.calls.tools.subject(&self.calls.context, call).await);
                policy::decide(
                    &policy.rules,
                    &lock_rules(&self.calls.session_rules),
                    policy.mode,
                    &call.name,
                    read,
                )
            }
        };
        if let Some(resolution) = decided.filter(|_| decision.action != Action::Deny) {
            return Ok(as_answered(step_id, call, resolution));
        }
        match decision.action {
            Action::Allow => Ok(Admission::Run {
                step_id,
                call: call.clone(),
                decided: subject.map(|s| s.text),
            }),
            Action::Deny => {
                let reason = denial_reason(&decision, &call.name);
                let resolution = Resolution {
                    call_id: call.id.clone(),
                    decision: Decision::Deny,
                    by: ResolvedBy::Policy,
                    reason: Some(reason),
                    input: None,
                };
                self.record_resolution(&resolution);
                self.flush_now().await?;
                Ok(Admission::Refused {
                    step_id,
                    output: refusal_output(&resolution),
                })
            }
            Action::Ask => {
                let subject = match subject {
                    Some(subject) => subject,
                    None => self.calls.tools.subject(&self.calls.context, call).await,
                };
                let kind = EventKind::ToolApprovalRequested {
                    step_id,
                    call_id: call.id.clone(),
                    tool: call.name.clone(),
                    input: call.arguments.clone(),
                    subject: subject.text,
                    expires_at: expires(self.policy().approval_timeout),
                };
                self.wait_for(step_id, call, kind).await?;
                Ok(Admission::Waits { step_id })
            }
        }
    }

    /// Records that a call waits: its step (pending), the request, and the session's state.
    async fn wait_for(
        &mut self,
        step_id: Uuid,
        call: &ToolCall,
        request: EventKind,
    ) -> Result<(), StoreError> {
        let step = self.tool_step(step_id, call, StepStatus::Pending);
        self.batch.ops.push(WriteOp::UpsertStep(step));
        self.batch.state(self.core, SessionState::WaitingTool, None);
        lock(&self.calls.waiting).apply(&request);
        self.batch.event(self.core, request);
        self.flush_now().await
    }

    fn record_resolution(&mut self, resolution: &Resolution) {
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

    pub(super) async fn next_call_answer(&mut self) -> Result<Answer, StoreError> {
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

    async fn take_answer(&mut self, msg: AnswerMsg) -> Result<Option<Answer>, StoreError> {
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

    pub(super) async fn call_started(
        &mut self,
        step_id: Uuid,
        call: &ToolCall,
    ) -> Result<(), StoreError> {
        let step = self.tool_step(step_id, call, StepStatus::Running);
        self.batch.ops.push(WriteOp::UpsertStep(step));
        self.batch.state(self.core, SessionState::WaitingTool, None);
        let kind = EventKind::ToolStarted {
            step_id,
            call: call.clone(),
        };
        lock(&self.calls.waiting).apply(&kind);
        self.batch.event(self.core, kind);
        if call.name == TASK {
            self.child_started(&call.id).await?;
        }
        self.calls.running += 1;
        // Durable before the tool runs: a crash mid-tool shows the call as started.
        self.flush_now().await
    }

    pub(super) async fn call_finished(
        &mut self,
        step_id: Uuid,
        call: &ToolCall,
        output: &ToolOutput,
    ) -> Result<(), StoreError> {
        let started = lock(&self.calls.waiting).is_open(&call.id);
        if started {
            self.calls.running = self.calls.running.saturating_sub(1);
        }
        let status = if output.is_error {
            StepStatus::Failed
        } else {
            StepStatus::Completed
        };
        // Its artifacts commit with its outcome, in this batch, announced right after it.
        let mut keeping = self.keep_artifacts(step_id, &output.artifacts).await?;
        let text = match &keeping.note {
            Some(note) => format!("{}\n{note}", output.output),
            None => output.output.clone(),
        };
        if let Some(note) = keeping.note.take() {
            self.calls.notes.insert(call.id.clone(), note);
        }
        let mut step = self.tool_step(step_id, call, status);
        step.response = Some(json!({ "output": text, "is_error": output.is_error }).to_string());
        step.finished_at = Some(model::now());
        self.batch.ops.push(WriteOp::UpsertStep(step));
        let kind = EventKind::ToolFinished {
            step_id,
            call_id: call.id.clone(),
            output: text.clone(),
            is_error: output.is_error,
        };
        lock(&self.calls.waiting).apply(&kind);
        self.batch.event(self.core, kind);
        self.child_finished(&call.id);
        self.record_artifacts(keeping);
        let Some(reply) = self.calls.replies.remove(&call.id) else {
            // Nobody waits on it: handed on when the loop next waits, durable before the run
            // ends.
            return Ok(());
        };
        // A client's answer is acknowledged once it is durable.
        self.flush_now().await?;
        let result = ClientResult {
            call_id: call.id.clone(),
            output: text,
            is_error: output.is_error,
        };
        let _ = reply.send(Ok(serde_json::to_value(result).unwrap_or(Value::Null)));
        Ok(())
    }

    pub(super) async fn call_results(
        &mut self,
        results: &[(ToolCall, ToolOutput)],
        done: bool,
    ) -> Result<(), StoreError> {
        for (call, output) in results {
            let content = match self.calls.notes.remove(&call.id) {
                Some(note) => format!("{}\n{note}", output.output),
                None => output.output.clone(),
            };
            self.batch
                .message(self.core, Message::tool_result(&call.id, &content));
        }
        if done {
            self.batch.state(self.core, SessionState::Running, None);
        }
        self.batch.checkpoint(self.core, self.run_id, None);
        // The model call that follows has no effect to protect: queued with it, when the loop
        // waits for the model.
        Ok(())
    }

    /// Ends every call that still waits, as `by` says (a cancel, or a new message that
    /// superseded the run): each gets its resolution and a result, so nothing is left
    /// dangling for the next run.
    pub(super) fn settle_waiting(&mut self, by: ResolvedBy, reason: Option<&str>) {
        let pending: Vec<(String, crate::session::waiting::Item)> = {
            let waiting = lock(&self.calls.waiting);
            waiting
                .pending_ids()
                .into_iter()
                .filter_map(|id| waiting.get(&id).cloned().map(|item| (id, item)))
                .collect()
        };
        for (call_id, item) in pending {
            let output = match item.kind {
                Kind::Approval => {
                    let resolution = Resolution {
                        call_id: call_id.clone(),
                        decision: Decision::Deny,
                        by,
                        reason: reason.map(str::to_string),
                        input: None,
                    };
                    self.record_resolution(&resolution);
                    refusal_output(&resolution)
                }
                Kind::Client => match by {
                    ResolvedBy::User => denied_output(reason),
                    _ => ToolOutput::error("the run was cancelled before the client answered"),
                },
            };
            let call = ToolCall {
                id: call_id.clone(),
                name: item.tool.clone(),
                arguments: item.input.clone(),
            };
            let mut step = self.tool_step(item.step_id, &call, StepStatus::Failed);
            step.response = Some(json!({ "output": output.output, "is_error": true }).to_string());
            step.finished_at = Some(model::now());
            self.batch.ops.push(WriteOp::UpsertStep(step));
            let kind = EventKind::ToolFinished {
                step_id: item.step_id,
                call_id: call_id.clone(),
                output: output.output.clone(),
                is_error: true,
            };
            lock(&self.calls.waiting).apply(&kind);
            self.batch.event(self.core, kind);
            self.batch
                .message(self.core, Message::tool_result(&call_id, &output.output));
            if let Some(reply) = self.calls.replies.remove(&call_id) {
                let _ = reply.send(Err(SessionError::Conflict(ConflictKind::RunEnded(
                    Unanswered::Result,
                ))));
            }
        }
    }
}

/// A call whose approval was answered: it runs (with the input the answer gave), or it is
/// refused as the answer says.
fn as_answered(step_id: Uuid, call: &ToolCall, resolution: Resolution) -> Admission {
    if resolution.decision.runs() {
        Admission::Run {
            step_id,
            call: with_input(call, resolution.input),
            decided: None,
        }
    } else {
        Admission::Refused {
            step_id,
            output: refusal_output(&resolution),
        }
    }
}

fn with_input(call: &ToolCall, input: Option<Value>) -> ToolCall {
    ToolCall {
        arguments: input.unwrap_or_else(|| call.arguments.clone()),
        ..call.clone()
    }
}
