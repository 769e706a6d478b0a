//! Answers to calls that wait: a human's answer to an approval request, and a client's result
//! for a call of one of its tools. While the run is driven its handlers check the answer
//! against what waits and hand it to the run; a run that waited with nobody driving it (after
//! a restart or a takeover) is continued with the answer. An answer to a call of an earlier
//! run is looked up in that run's events: the same answer again is a repeat, another one a
//! conflict with the stored answer, and only a call the session never made is unknown. A
//! human's edited input is checked against the policy first, as the call was when it was
//! admitted: one that a rule denies is refused, and the approval goes on waiting.

use std::sync::Arc;

use serde_json::Value;
use uuid::Uuid;

use super::run::Begin;
use super::{Phase, SessionActor, Stop};
use crate::model::{Action, ToolCall};
use crate::session::command::{ApprovalAnswer, Reply};
use crate::session::live::Inbox;
use crate::session::run::board::{self as calls, AnswerMsg, Given};
use crate::session::waiting::{self, Answered, ClientResult, Kind, Waiting};
use crate::session::{SessionError, ToolPolicy};
use crate::store::Store;
use crate::tools::policy::{self, Rules};
use crate::tools::{SubjectKind, ToolContext, ToolRegistry};

/// How an answer is checked against a set of calls (the active run's, or earlier runs').
type Check = Box<dyn FnMut(&mut Waiting) -> Result<Answered<Given>, SessionError> + Send>;

/// Where an answer that is not for the active run's calls is looked up while a run or a
/// compaction is active: the events of the session's runs before it.
pub(super) struct EarlierCalls {
    pub store: Arc<dyn Store>,
    pub session_id: Uuid,
    /// The first event of the active run (`i64::MAX` while a compaction is active: every
    /// run has ended).
    pub before: i64,
}

impl EarlierCalls {
    /// Answers from the earlier runs' events, read in a task of its own so that the active
    /// run is not held up meanwhile (those events no longer change).
    fn answer(&self, call_id: String, mut check: Check, reply: Reply<Value>) {
        let store = self.store.clone();
        let (session_id, before) = (self.session_id, self.before);
        tokio::spawn(async move {
            let answered = match waiting::of_earlier_runs(store.as_ref(), session_id, before).await
            {
                Ok(mut earlier) => waiting::answer_to_ended(&call_id, check(&mut earlier))
                    .map(|answered| calls::given_json(answered.given())),
                Err(error) => Err(error.into()),
            };
            let _ = reply.send(answered);
        });
    }
}

/// The answer to an earlier run's call: an ended run's call is never run again, so its
/// input is not checked.
fn approval_check(call_id: &str, answer: &ApprovalAnswer) -> Check {
    checked_approval(call_id, answer, |_, _| Ok(()))
}

/// The answer to a call, whose replaced input (if any) `check_input` must accept.
fn checked_approval(
    call_id: &str,
    answer: &ApprovalAnswer,
    check_input: impl Fn(&str, &Value) -> Result<(), String> + Send + 'static,
) -> Check {
    let (call_id, answer) = (call_id.to_string(), answer.clone());
    Box::new(move |waiting: &mut Waiting| {
        waiting
            .answer_approval(
                &call_id,
                answer.decision,
                answer.reason.clone(),
                answer.input.clone(),
                &check_input,
            )
            .map(|a| calls::map(a, Given::Approval))
            .map_err(SessionError::from)
    })
}

fn client_check(call_id: &str, output: &str, is_error: bool) -> Check {
    let (call_id, output) = (call_id.to_string(), output.to_string());
    Box::new(move |waiting: &mut Waiting| {
        waiting
            .answer_client(&call_id, output.clone(), is_error)
            .map(|a| calls::map(a, Given::Client))
            .map_err(SessionError::from)
    })
}

pub(super) async fn approve(
    phase: Phase<'_>,
    call_id: String,
    answer: ApprovalAnswer,
    reply: Reply<Value>,
) -> Result<(), Stop> {
    match phase {
        Phase::Busy(activity) => {
            let Some(calls) = &activity.calls else {
                activity
                    .earlier
                    .answer(call_id.clone(), approval_check(&call_id, &answer), reply);
                return Ok(());
            };
            let edit = edit_to_check(&calls.waiting(), &call_id, &answer, &calls.tools);
            if let Some((tool, input)) = edit {
                let rules = calls.session_rules();
                let deps = &calls.deps;
                let context = &deps.agent.tool_context;
                let checked =
                    check_edited_input(&deps.policy, &rules, &calls.tools, context, &tool, &input)
                        .await;
                if let Err(refused) = checked {
                    let _ = reply.send(Err(refused));
                    return Ok(());
                }
            }
            match calls.check_approval(&call_id, &answer) {
                Err(SessionError::NoSuchCall(_)) => {
                    let check = approval_check(&call_id, &answer);
                    activity.earlier.answer(call_id, check, reply);
                }
                checked => calls.pass_on(call_id, checked, reply),
            }
            Ok(())
        }
        Phase::Idle(actor, inbox) => {
            if let Err(refused) = actor.check_parked_edit(&call_id, &answer).await {
                let _ = reply.send(Err(refused));
                return Ok(());
            }
            let tools = actor.deps.agent.tools.clone();
            let parked = checked_approval(&call_id, &answer, move |tool, input| {
                tools.validate_input(tool, input).map_err(|e| e.to_string())
            });
            let earlier = approval_check(&call_id, &answer);
            let checked = actor.with_parked(&call_id, parked, earlier).await;
            actor.answer_parked(call_id, checked, reply, inbox).await
        }
    }
}

pub(super) async fn client_result(
    phase: Phase<'_>,
    result: ClientResult,
    reply: Reply<Value>,
) -> Result<(), Stop> {
    let ClientResult {
        call_id,
        output,
        is_error,
    } = result;
    match phase {
        Phase::Busy(activity) => {
            let checked = activity.calls.as_ref().map(|calls| {
                (
                    calls,
                    calls.check_client(&call_id, output.clone(), is_error),
                )
            });
            match checked {
                Some((calls, checked)) if !matches!(checked, Err(SessionError::NoSuchCall(_))) => {
                    calls.pass_on(call_id, checked, reply)
                }
                _ => {
                    let check = client_check(&call_id, &output, is_error);
                    activity.earlier.answer(call_id, check, reply);
                }
            }
            Ok(())
        }
        Phase::Idle(actor, inbox) => {
            let parked = client_check(&call_id, &output, is_error);
            let earlier = client_check(&call_id, &output, is_error);
            let checked = actor.with_parked(&call_id, parked, earlier).await;
            actor.answer_parked(call_id, checked, reply, inbox).await
        }
    }
}

impl SessionActor {
    /// Checks an edited input of an answer to the parked run's approval against the policy
    /// (see [`check_edited_input`]). A session that cannot be had is left to
    /// [`SessionActor::with_parked`] to report.
    async fn check_parked_edit(
        &mut self,
        call_id: &str,
        answer: &ApprovalAnswer,
    ) -> Result<(), SessionError> {
        let tools = self.deps.agent.tools.clone();
        let Ok(core) = self.claim_with_history().await else {
            return Ok(());
        };
        let Some(parked) = core.parked.as_ref() else {
            return Ok(());
        };
        let Some((tool, input)) = edit_to_check(parked, call_id, answer, &tools) else {
            return Ok(());
        };
        let rules = Rules::compile(core.record.options.tool_policy.clone()).unwrap_or_default();
        let deps = &self.deps;
        check_edited_input(
            &deps.policy,
            &rules,
            &tools,
            &deps.agent.tool_context,
            &tool,
            &input,
        )
        .await
    }

    /// Checks an answer against what the session's parked run waits for (`parked`), and an
    /// answer to no call of it against the calls of the runs before (`earlier`). `Err` also
    /// when the session cannot be had.
    async fn with_parked(
        &mut self,
        call_id: &str,
        mut parked: Check,
        mut earlier: Check,
    ) -> Result<Result<Answered<Given>, SessionError>, super::access::Refusal> {
        let core = self.claim_with_history().await?;
        let mut before = i64::MAX;
        if let Some(waiting) = core.parked.as_mut() {
            match parked(waiting) {
                Err(SessionError::NoSuchCall(_)) => {}
                checked => return Ok(checked),
            }
            // The parked run is the last one; its calls were looked at.
            if let Some(run) = &core.last_run {
                before = run.start_seq;
            }
        }
        let mut calls = waiting::of_earlier_runs(self.deps.store.as_ref(), self.id, before).await?;
        Ok(waiting::answer_to_ended(call_id, earlier(&mut calls)))
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
                let _ = reply.send(Ok(calls::given_json(&given)));
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

/// The waiting approval whose edited input is to be checked against the policy, and that
/// input: a first answer that runs the call with an input that fits its tool. Anything else
/// is left to the answer's own checks (an unknown call, a repeat, a conflict, a bad input).
fn edit_to_check(
    waiting: &Waiting,
    call_id: &str,
    answer: &ApprovalAnswer,
    tools: &ToolRegistry,
) -> Option<(String, Value)> {
    let input = answer.input.as_ref().filter(|_| answer.decision.runs())?;
    let item = waiting
        .get(call_id)
        .filter(|item| item.kind == Kind::Approval && item.is_pending())?;
    tools.validate_input(&item.tool, input).ok()?;
    Some((item.tool.clone(), input.clone()))
}

/// Checks an input a human edited in an approval against the policy, as the call was checked
/// when it was admitted (the server's rules and the session's, the most restrictive winning):
/// a rule that denies the edited call refuses the answer, and the approval goes on waiting.
/// What the policy would ask about is what the human is answering, so an `ask` lets it run.
async fn check_edited_input(
    policy: &ToolPolicy,
    session_rules: &Rules,
    tools: &ToolRegistry,
    context: &ToolContext,
    tool: &str,
    input: &Value,
) -> Result<(), SessionError> {
    let call = ToolCall {
        id: String::new(),
        name: tool.to_string(),
        arguments: input.clone(),
    };
    let subject = tools.subject(context, &call).await;
    let decision = policy::decide(&policy.rules, session_rules, policy.mode, tool, &subject);
    if decision.action != Action::Deny || decision.by_approval_mode {
        return Ok(());
    }
    let what = match subject.kind {
        SubjectKind::Path => format!(" (path {:?})", subject.text),
        SubjectKind::Command => format!(" (command {:?})", subject.text),
        // An input's JSON is what the client just sent.
        SubjectKind::Input => String::new(),
    };
    Err(SessionError::EditedInputDenied(format!(
        "the edited input{what} is denied: {}; the call still waits for an answer (answer it \
         with another input, or deny it)",
        crate::session::run::denial_reason(&decision, tool)
    )))
}
