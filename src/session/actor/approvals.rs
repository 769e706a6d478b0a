//! Answers to calls that wait: a human's answer to an approval request, and a client's result
//! for a call of one of its tools. Every answer takes one path: find the board that holds the
//! call, then [`CallBoard::answer`]. The board is the driven run's; or the parked run's (after
//! a restart or a takeover), rebuilt from the log, which a first answer continues; or that of
//! the session's ended runs, read from their events, where the same answer again is a repeat,
//! another one a conflict with the stored answer, a first one too late, and only a call the
//! session never made is unknown. A human's edited input is checked against the policy first,
//! as the call was when it was admitted: one that a rule denies is refused, and the approval
//! goes on waiting.

use std::sync::Arc;

use serde_json::Value;
use uuid::Uuid;

use super::drive::Begin;
use super::{Phase, SessionActor, Stop};
use crate::model::waiting::Item;
use crate::model::{Action, ToolCall};
use crate::session::command::{ApprovalAnswer, Reply};
use crate::session::deps::{SessionDeps, ToolPolicy};
use crate::session::errors::SessionError;
use crate::session::live::Inbox;
use crate::session::run::board::{CallBoard, Outcome, Response};
use crate::session::waiting::{self, ClientResult, Kind};
use crate::store::Store;
use crate::tools::policy::{self, Rules};
use crate::tools::{SubjectKind, ToolContext, ToolRegistry};

/// The board of the session's runs before the active one (`i64::MAX` while a compaction is
/// active: every run has ended), read from their events.
pub(super) struct EarlierCalls {
    pub store: Arc<dyn Store>,
    pub session_id: Uuid,
    /// The first event of the active run.
    pub before: i64,
}

impl EarlierCalls {
    /// Answers from the earlier runs' board, read in a task of its own so that the active
    /// run is not held up meanwhile (those events no longer change).
    fn answer(&self, call_id: String, response: Response, reply: Reply<Value>) {
        let store = self.store.clone();
        let (session_id, before) = (self.session_id, self.before);
        tokio::spawn(async move {
            match waiting::of_earlier_runs(store.as_ref(), session_id, before).await {
                Ok(earlier) => answer_ended(earlier, &call_id, &response, reply),
                Err(error) => drop(reply.send(Err(error.into()))),
            }
        });
    }
}

/// Answers on the board of ended runs: the last place a call is looked for. An ended run's
/// call is never run again, so an edited input is not checked.
fn answer_ended(
    earlier: waiting::Waiting,
    call_id: &str,
    response: &Response,
    reply: Reply<Value>,
) {
    let board = CallBoard::ended(earlier);
    if let Outcome::NotHere(reply, unknown) = board.answer(call_id, response, no_check, reply) {
        let _ = reply.send(Err(unknown));
    }
}

fn no_check(_: &str, _: &Value) -> Result<(), String> {
    Ok(())
}

/// What a run that goes on answers with: its board, its tools (an edited input must fit its
/// tool's schema), and the server's policy.
pub(super) struct Driven {
    pub board: Arc<CallBoard>,
    pub tools: ToolRegistry,
    pub deps: Arc<SessionDeps>,
    /// The run, as a queued input is answered with it.
    pub run: crate::model::RunRecord,
}

pub(super) async fn approve(
    phase: Phase<'_>,
    call_id: String,
    answer: ApprovalAnswer,
    reply: Reply<Value>,
) -> Result<(), Stop> {
    answer_call(phase, call_id, Response::Approval(answer), reply).await
}

pub(super) async fn client_result(
    phase: Phase<'_>,
    result: ClientResult,
    reply: Reply<Value>,
) -> Result<(), Stop> {
    let response = Response::Client {
        output: result.output,
        is_error: result.is_error,
    };
    answer_call(phase, result.call_id, response, reply).await
}

/// Finds the board that holds `call_id` and answers on it.
async fn answer_call(
    phase: Phase<'_>,
    call_id: String,
    response: Response,
    reply: Reply<Value>,
) -> Result<(), Stop> {
    match phase {
        Phase::Busy(activity) => {
            let reply = match &activity.driven {
                Some(driven) => match driven.answer(&call_id, &response, reply).await {
                    Some(reply) => reply,
                    None => return Ok(()),
                },
                None => reply,
            };
            activity.earlier.answer(call_id, response, reply);
            Ok(())
        }
        Phase::Idle(actor, inbox) => actor.answer_parked(call_id, response, reply, inbox).await,
    }
}

impl Driven {
    /// Answers on the driven run's board; the reply back when the board does not hold the call.
    async fn answer(
        &self,
        call_id: &str,
        response: &Response,
        reply: Reply<Value>,
    ) -> Option<Reply<Value>> {
        let item = self.board.get(call_id);
        if let Some((tool, input)) = edit_to_check(item, response, &self.tools) {
            let rules = self.board.with_rules(Rules::clone);
            let context = &self.deps.agent.tool_context;
            let policy = &self.deps.policy;
            let checked =
                check_edited_input(policy, &rules, &self.tools, context, &tool, &input).await;
            if let Err(refused) = checked {
                let _ = reply.send(Err(refused));
                return None;
            }
        }
        let tools = &self.tools;
        let check_input = |tool: &str, input: &Value| {
            tools.validate_input(tool, input).map_err(|e| e.to_string())
        };
        match self.board.answer(call_id, response, check_input, reply) {
            Outcome::NotHere(reply, _) => Some(reply),
            Outcome::Taken | Outcome::Answered => None,
        }
    }
}

impl SessionActor {
    /// Answers with nothing active: on the parked run's board (a first answer continues the
    /// run, which replies once the answer is recorded), else on the ended runs' board.
    async fn answer_parked(
        &mut self,
        call_id: String,
        response: Response,
        reply: Reply<Value>,
        inbox: &mut Inbox,
    ) -> Result<(), Stop> {
        let tools = self.deps.agent.tools.clone();
        let core = match self.claim_with_history().await {
            Ok(core) => core,
            Err(refusal) => return refusal.answer(self.id, reply),
        };
        let mut before = i64::MAX;
        let mut reply = reply;
        if let Some(parked) = core.parked.take() {
            let rules = Rules::compile(core.record.options.tool_policy.clone()).unwrap_or_default();
            let item = parked.get(&call_id).cloned();
            if let Some((tool, input)) = edit_to_check(item, &response, &tools) {
                let deps = &self.deps;
                let context = &deps.agent.tool_context;
                let checked =
                    check_edited_input(&deps.policy, &rules, &tools, context, &tool, &input).await;
                if let Err(refused) = checked {
                    if let Some(core) = self.core.as_mut() {
                        core.parked = Some(parked);
                    }
                    let _ = reply.send(Err(refused));
                    return Ok(());
                }
            }
            let board = CallBoard::live(parked, rules);
            let check_input = |tool: &str, input: &Value| {
                tools.validate_input(tool, input).map_err(|e| e.to_string())
            };
            let outcome = board.answer(&call_id, &response, check_input, reply);
            if let Outcome::Taken = outcome {
                return self.continue_answered(board, inbox).await;
            }
            let core = self.core.as_mut().ok_or(Stop::Gone)?;
            core.parked = Some(board.into_waiting());
            let Outcome::NotHere(back, _) = outcome else {
                return Ok(());
            };
            reply = back;
            // The parked run is the last one; its calls were looked at.
            if let Some(run) = &core.last_run {
                before = run.start_seq;
            }
        }
        match waiting::of_earlier_runs(self.deps.store.as_ref(), self.id, before).await {
            Ok(earlier) => answer_ended(earlier, &call_id, &response, reply),
            Err(error) => return super::access::Refusal::from(error).answer(self.id, reply),
        }
        Ok(())
    }

    /// Continues the parked run with the answer its board took, then the runs that follow.
    async fn continue_answered(&mut self, board: CallBoard, inbox: &mut Inbox) -> Result<(), Stop> {
        let mut next = self.continue_run(Begin::answered(board), inbox).await?;
        while let Some((request, reply)) = next.take() {
            next = self.start_run(request, reply, inbox).await?;
        }
        Ok(())
    }
}

/// The waiting approval whose edited input is to be checked against the policy, and that
/// input: a first answer that runs the call with an input that fits its tool. Anything else
/// is left to the answer's own checks (an unknown call, a repeat, a conflict, a bad input).
fn edit_to_check(
    item: Option<Item>,
    response: &Response,
    tools: &ToolRegistry,
) -> Option<(String, Value)> {
    let Response::Approval(answer) = response else {
        return None;
    };
    let input = answer.input.as_ref().filter(|_| answer.decision.runs())?;
    let item = item.filter(|item| item.kind == Kind::Approval && item.is_pending())?;
    tools.validate_input(&item.tool, input).ok()?;
    Some((item.tool, input.clone()))
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
