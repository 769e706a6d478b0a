//! The calls of a run that wait for an answer: approvals (policy said `ask`) and calls of the
//! tools a client runs, projected from the run's events. What is pending is durable in the
//! event log, so it is rebuilt from the run's events after a restart ([`Waiting::from_log`]);
//! while a run is driven, its call board keeps one [`Waiting`] up to date with what it records
//! and checks answers against it, so that each is taken exactly once.
//!
//! Pure: events in, calls and their states out; no I/O.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::model::{Decision, Event, EventKind, ResolvedBy};

/// What a call waits for.
#[derive(Debug, Clone, PartialEq)]
pub enum Wait {
    /// A human's approval; `subject` is what the policy matched.
    Approval { subject: String },
    /// The result of a tool the client runs.
    Client,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    /// Proposed by the model, not admitted yet.
    Proposed,
    /// Waits for an answer.
    Waiting,
    /// Answered, or allowed: it runs or gets its result next.
    Going,
    Running,
    /// Its outcome is recorded.
    Done,
}

/// A call of the latest model reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub id: String,
    pub tool: String,
    pub input: Value,
    /// What it waits (or waited) for, if it had to wait.
    pub wait: Option<Wait>,
    pub expires_at: Option<DateTime<Utc>>,
    progress: Progress,
}

impl Call {
    /// The call waits for an answer now.
    pub fn is_waiting(&self) -> bool {
        self.progress == Progress::Waiting
    }
}

/// The calls of a run's latest model reply, as its events tell: which of them wait for an
/// answer, and whether the run is *parked* (every call either has its outcome or waits, and
/// at least one waits).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reply {
    calls: Vec<Call>,
    parked: bool,
}

impl Reply {
    /// Takes the next event of the run; true when this event parked the run.
    pub fn apply(&mut self, kind: &EventKind) -> bool {
        match kind {
            EventKind::LlmCompleted { message, .. } => {
                self.calls = message
                    .tool_calls
                    .iter()
                    .map(|c| Call {
                        id: c.id.clone(),
                        tool: c.name.clone(),
                        input: c.arguments.clone(),
                        wait: None,
                        expires_at: None,
                        progress: Progress::Proposed,
                    })
                    .collect();
            }
            EventKind::ToolApprovalRequested {
                call_id,
                tool,
                input,
                subject,
                expires_at,
                ..
            } => {
                let call = self.call(call_id, tool, input);
                call.wait = Some(Wait::Approval {
                    subject: subject.clone(),
                });
                call.expires_at = *expires_at;
                call.progress = Progress::Waiting;
            }
            EventKind::ToolClientRequested {
                call_id,
                tool,
                input,
                expires_at,
                ..
            } => {
                let call = self.call(call_id, tool, input);
                call.wait = Some(Wait::Client);
                call.expires_at = *expires_at;
                call.progress = Progress::Waiting;
            }
            EventKind::ToolApprovalResolved { call_id, input, .. } => {
                if let Some(call) = self.calls.iter_mut().find(|c| &c.id == call_id) {
                    call.progress = Progress::Going;
                    if let Some(input) = input {
                        call.input = input.clone();
                    }
                }
            }
            EventKind::ToolStarted { call, .. } => {
                let known = self.call(&call.id, &call.name, &call.arguments);
                known.input = call.arguments.clone();
                known.progress = Progress::Running;
            }
            EventKind::ToolFinished { call_id, .. } => {
                if let Some(call) = self.calls.iter_mut().find(|c| &c.id == call_id) {
                    call.progress = Progress::Done;
                }
            }
            kind if kind.is_terminal() => self.calls.clear(),
            _ => {}
        }
        let was = self.parked;
        self.parked = !self.calls.is_empty()
            && self.calls.iter().any(Call::is_waiting)
            && self
                .calls
                .iter()
                .all(|c| matches!(c.progress, Progress::Waiting | Progress::Done));
        self.parked && !was
    }

    /// The run waits for answers only.
    pub fn is_parked(&self) -> bool {
        self.parked
    }

    /// The calls that wait for an answer now, in the order of the model's reply.
    pub fn waiting(&self) -> impl Iterator<Item = &Call> {
        self.calls.iter().filter(|c| c.is_waiting())
    }

    /// A call of the latest reply (a resumed run may name calls of an earlier one).
    fn call(&mut self, id: &str, tool: &str, input: &Value) -> &mut Call {
        let at = match self.calls.iter().position(|c| c.id == id) {
            Some(at) => at,
            None => {
                self.calls.push(Call {
                    id: id.to_string(),
                    tool: tool.to_string(),
                    input: input.clone(),
                    wait: None,
                    expires_at: None,
                    progress: Progress::Proposed,
                });
                self.calls.len() - 1
            }
        };
        &mut self.calls[at]
    }
}

/// Why an answer to a waiting call is refused.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// No call of this kind with this id.
    NoSuchCall(String),
    /// The call has another answer already: what was stored.
    AlreadyResolved { detail: String, resolution: Value },
    /// The answer itself does not fit (an input where none may be, or one its tool rejects).
    Invalid(String),
}

/// How a call that waited for approval was resolved (the data of `tool.approval-resolved`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Resolution {
    pub call_id: String,
    pub decision: Decision,
    pub by: ResolvedBy,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The input the call runs with, when the answer replaced it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// The principal that answered, for a person's answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<String>,
}

/// What a client sent for a call of one of its tools (the data of the call's
/// `tool.finished`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClientResult {
    pub call_id: String,
    pub output: String,
    pub is_error: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Approval,
    Client,
}

/// One call that waits, or waited.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub kind: Kind,
    pub step_id: Uuid,
    pub tool: String,
    pub input: Value,
    pub subject: String,
    pub expires_at: Option<DateTime<Utc>>,
    /// For a call that waits for a worker's result: the environment whose workers run it.
    pub environment: Option<String>,
    pub resolution: Option<Resolution>,
    /// A client's result, or the result recorded when the call was refused or timed out.
    pub result: Option<ClientResult>,
    /// The call's outcome is recorded (`tool.finished`).
    pub finished: bool,
    /// An answer was taken by a command handler and is on its way to the run, not recorded
    /// yet: the run must wait for it rather than act on it.
    pub in_transit: bool,
}

impl Item {
    /// No answer yet.
    pub fn is_pending(&self) -> bool {
        match self.kind {
            Kind::Approval => self.resolution.is_none(),
            Kind::Client => self.result.is_none(),
        }
    }
}

/// A pending approval as `GET …/approvals` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingApproval {
    pub call_id: String,
    pub step_id: Uuid,
    pub tool: String,
    pub input: Value,
    pub subject: String,
    pub expires_at: Option<DateTime<Utc>>,
}

/// A call of a client tool waiting for its result, as `GET …/tool-results` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingClientCall {
    pub call_id: String,
    pub step_id: Uuid,
    pub tool: String,
    pub input: Value,
    pub expires_at: Option<DateTime<Utc>>,
    /// Set for a built-in tool's call that waits for a worker of this environment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub environment: Option<String>,
}

/// What an answer did.
#[derive(Debug, Clone, PartialEq)]
pub enum Answered<T> {
    /// The first answer: it is to be recorded, and the call goes on.
    Fresh(T),
    /// The same answer again: nothing changes.
    Repeat(T),
}

impl<T> Answered<T> {
    pub fn given(&self) -> &T {
        match self {
            Answered::Fresh(given) | Answered::Repeat(given) => given,
        }
    }
}

/// The waiting calls of one run, by call id.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Waiting {
    items: BTreeMap<String, Item>,
    /// Calls started and not finished (any tool): a run with one is not parked.
    open: Vec<String>,
    /// The calls of the latest model reply, in its order.
    reply: Reply,
}

impl Waiting {
    /// Rebuilds the waiting calls of a run from its events, in order.
    pub fn from_log<'a>(events: impl IntoIterator<Item = &'a Event>) -> Waiting {
        let mut waiting = Waiting::default();
        waiting.extend(events);
        waiting
    }

    /// Takes more of the run's events into account.
    pub fn extend<'a>(&mut self, events: impl IntoIterator<Item = &'a Event>) {
        for event in events {
            self.apply(&event.kind);
        }
    }

    /// The calls of the latest model reply, as a front end streams them.
    pub fn reply(&self) -> &Reply {
        &self.reply
    }

    /// Takes one event of the run into account; true when this event parked the latest reply.
    pub fn apply(&mut self, kind: &EventKind) -> bool {
        self.follow(kind);
        self.reply.apply(kind)
    }

    fn follow(&mut self, kind: &EventKind) {
        match kind {
            EventKind::ToolApprovalRequested {
                step_id,
                call_id,
                tool,
                input,
                subject,
                expires_at,
            } => self.request(
                Kind::Approval,
                call_id,
                *step_id,
                tool,
                input,
                subject,
                *expires_at,
            ),
            EventKind::ToolClientRequested {
                step_id,
                call_id,
                tool,
                input,
                expires_at,
                environment,
            } => {
                self.request(
                    Kind::Client,
                    call_id,
                    *step_id,
                    tool,
                    input,
                    "",
                    *expires_at,
                );
                if let Some(item) = self.items.get_mut(call_id) {
                    item.environment = environment.clone();
                }
            }
            EventKind::ToolApprovalResolved {
                call_id,
                decision,
                by,
                reason,
                input,
                answered_by,
            } => {
                if let Some(item) = self.items.get_mut(call_id) {
                    item.resolution = Some(Resolution {
                        answered_by: answered_by.clone(),
                        call_id: call_id.clone(),
                        decision: *decision,
                        by: *by,
                        reason: reason.clone(),
                        input: input.clone(),
                    });
                }
            }
            EventKind::ToolStarted { call, .. } => self.open.push(call.id.clone()),
            EventKind::ToolFinished {
                call_id,
                output,
                is_error,
                ..
            } => {
                self.open.retain(|id| id != call_id);
                if let Some(item) = self.items.get_mut(call_id) {
                    item.finished = true;
                    if item.kind == Kind::Client && item.result.is_none() {
                        item.result = Some(ClientResult {
                            call_id: call_id.clone(),
                            output: output.clone(),
                            is_error: *is_error,
                        });
                    }
                }
            }
            _ => {}
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn request(
        &mut self,
        kind: Kind,
        call_id: &str,
        step_id: Uuid,
        tool: &str,
        input: &Value,
        subject: &str,
        expires_at: Option<DateTime<Utc>>,
    ) {
        self.items.insert(
            call_id.to_string(),
            Item {
                kind,
                step_id,
                tool: tool.to_string(),
                input: input.clone(),
                subject: subject.to_string(),
                expires_at,
                environment: None,
                resolution: None,
                result: None,
                finished: false,
                in_transit: false,
            },
        );
    }

    pub fn get(&self, call_id: &str) -> Option<&Item> {
        self.items.get(call_id)
    }

    /// Whether the call has started and not finished.
    pub fn is_open(&self, call_id: &str) -> bool {
        self.open.iter().any(|id| id == call_id)
    }

    /// Whether the run can wait without anybody driving it: something waits for an answer
    /// (or has one that was not acted on yet) and no tool is running.
    pub fn is_parked(&self) -> bool {
        self.open.is_empty() && self.items.values().any(|item| !item.finished)
    }

    /// Whether any call waits for an answer.
    pub fn has_pending(&self) -> bool {
        self.items.values().any(Item::is_pending)
    }

    /// The approvals nobody has answered, in call-id order.
    pub fn pending_approvals(&self) -> Vec<PendingApproval> {
        self.items
            .iter()
            .filter(|(_, item)| item.kind == Kind::Approval && item.is_pending())
            .map(|(call_id, item)| PendingApproval {
                call_id: call_id.clone(),
                step_id: item.step_id,
                tool: item.tool.clone(),
                input: item.input.clone(),
                subject: item.subject.clone(),
                expires_at: item.expires_at,
            })
            .collect()
    }

    /// The calls of client tools whose result has not come, in call-id order.
    pub fn pending_client_calls(&self) -> Vec<PendingClientCall> {
        self.items
            .iter()
            .filter(|(_, item)| item.kind == Kind::Client && item.is_pending())
            .map(|(call_id, item)| PendingClientCall {
                call_id: call_id.clone(),
                step_id: item.step_id,
                tool: item.tool.clone(),
                input: item.input.clone(),
                expires_at: item.expires_at,
                environment: item.environment.clone(),
            })
            .collect()
    }

    /// The earliest time an unanswered call expires.
    pub fn next_expiry(&self) -> Option<(String, DateTime<Utc>)> {
        self.items
            .iter()
            .filter(|(_, item)| item.is_pending())
            .filter_map(|(id, item)| item.expires_at.map(|at| (id.clone(), at)))
            .min_by_key(|(_, at)| *at)
    }

    /// What people answered to this run's approvals, by call id: a resume of the run admits
    /// those calls as they were answered rather than ask again. An answer the server gave
    /// (a timeout, a cancel, its policy) is no person's decision.
    pub fn decisions(&self) -> HashMap<String, Resolution> {
        self.items
            .iter()
            .filter(|(_, item)| item.kind == Kind::Approval)
            .filter_map(|(id, item)| Some((id.clone(), item.resolution.clone()?)))
            .filter(|(_, resolution)| resolution.by == ResolvedBy::User)
            .collect()
    }

    /// The call ids still waiting for an answer.
    pub fn pending_ids(&self) -> Vec<String> {
        self.items
            .iter()
            .filter(|(_, item)| item.is_pending())
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Checks a human's answer to an approval and, when it is the first, records it as given
    /// (so a concurrent second answer is a repeat or a conflict). `check_input` validates an
    /// edited input against the tool's schema.
    pub fn answer_approval(
        &mut self,
        call_id: &str,
        decision: Decision,
        reason: Option<String>,
        input: Option<Value>,
        answered_by: Option<String>,
        check_input: impl Fn(&str, &Value) -> Result<(), String>,
    ) -> Result<Answered<Resolution>, Refusal> {
        let Some(item) = self.items.get_mut(call_id) else {
            return Err(no_such_call("approval", call_id));
        };
        if item.kind != Kind::Approval {
            return Err(no_such_call("approval", call_id));
        }
        if let Some(stored) = &item.resolution {
            let same = stored.by == ResolvedBy::User && stored.decision == decision;
            return if same {
                Ok(Answered::Repeat(stored.clone()))
            } else {
                Err(already_resolved(call_id, stored))
            };
        }
        if let Some(input) = &input {
            if !decision.runs() {
                return Err(Refusal::Invalid(
                    "an input replaces the call's input only when the call runs (allow or \
                     always)"
                        .to_string(),
                ));
            }
            check_input(&item.tool, input).map_err(|why| {
                Refusal::Invalid(format!("the input does not fit {}: {why}", item.tool))
            })?;
        }
        let resolution = Resolution {
            call_id: call_id.to_string(),
            decision,
            by: ResolvedBy::User,
            reason,
            input,
            answered_by,
        };
        item.resolution = Some(resolution.clone());
        item.in_transit = true;
        Ok(Answered::Fresh(resolution))
    }

    /// Checks a client's result for a call of one of its tools, recording the first.
    pub fn answer_client(
        &mut self,
        call_id: &str,
        output: String,
        is_error: bool,
    ) -> Result<Answered<ClientResult>, Refusal> {
        let Some(item) = self.items.get_mut(call_id) else {
            return Err(no_such_call("client tool call", call_id));
        };
        if item.kind != Kind::Client {
            return Err(no_such_call("client tool call", call_id));
        }
        if let Some(stored) = &item.result {
            return if stored.output == output && stored.is_error == is_error {
                Ok(Answered::Repeat(stored.clone()))
            } else {
                Err(Refusal::AlreadyResolved {
                    detail: format!("call {call_id} already has a result"),
                    resolution: serde_json::to_value(stored).unwrap_or(Value::Null),
                })
            };
        }
        let result = ClientResult {
            call_id: call_id.to_string(),
            output,
            is_error,
        };
        item.result = Some(result.clone());
        item.in_transit = true;
        Ok(Answered::Fresh(result))
    }

    /// Records a resolution as recorded in the log (the server's own: timeout, cancel,
    /// policy; or a human's answer once it is written).
    pub fn resolve(&mut self, resolution: Resolution) {
        if let Some(item) = self.items.get_mut(&resolution.call_id) {
            item.resolution = Some(resolution);
            item.in_transit = false;
        }
    }

    /// Records a client call's result as the run takes it (the client's, or a timeout's).
    pub fn settle(&mut self, result: ClientResult) {
        if let Some(item) = self.items.get_mut(&result.call_id) {
            item.result = Some(result);
            item.in_transit = false;
        }
    }
}

fn no_such_call(what: &str, call_id: &str) -> Refusal {
    Refusal::NoSuchCall(format!(
        "the session has no {what} with call_id {call_id:?}"
    ))
}

fn already_resolved(call_id: &str, stored: &Resolution) -> Refusal {
    let by = serde_json::to_value(stored.by).unwrap_or(Value::Null);
    Refusal::AlreadyResolved {
        detail: format!(
            "call {call_id} was already resolved ({} by {})",
            serde_json::to_value(stored.decision)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            by.as_str().unwrap_or("")
        ),
        resolution: serde_json::to_value(stored).unwrap_or(Value::Null),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::ToolCall;
    use serde_json::json;

    fn event(kind: EventKind) -> Event {
        Event::new(Uuid::nil(), 1, kind, crate::model::now())
    }

    /// An approval asked for a `shell` call `ls`.
    pub(crate) fn asked(call_id: &str) -> EventKind {
        EventKind::ToolApprovalRequested {
            step_id: Uuid::nil(),
            call_id: call_id.into(),
            tool: "shell".into(),
            input: json!({"command": "ls"}),
            subject: "ls".into(),
            expires_at: None,
        }
    }

    fn requested(call_id: &str) -> Event {
        event(asked(call_id))
    }

    fn started(call_id: &str) -> Event {
        event(EventKind::ToolStarted {
            step_id: Uuid::nil(),
            call: ToolCall {
                id: call_id.into(),
                name: "shell".into(),
                arguments: json!({}),
            },
        })
    }

    fn finished(call_id: &str) -> Event {
        event(EventKind::ToolFinished {
            step_id: Uuid::nil(),
            call_id: call_id.into(),
            output: "ok".into(),
            is_error: false,
        })
    }

    fn no_check(_: &str, _: &Value) -> Result<(), String> {
        Ok(())
    }

    #[test]
    fn a_run_waiting_only_for_answers_is_parked() {
        let log = [requested("a"), started("b"), finished("b")];
        let waiting = Waiting::from_log(&log);
        assert!(waiting.is_parked());
        assert_eq!(waiting.pending_approvals().len(), 1);
        // A tool still running: not parked (a restart interrupts it).
        let log = [requested("a"), started("b")];
        assert!(!Waiting::from_log(&log).is_parked());
        // Everything answered and done: nothing to wait for.
        let log = [
            requested("a"),
            event(EventKind::ToolApprovalResolved {
                call_id: "a".into(),
                decision: Decision::Allow,
                by: ResolvedBy::User,
                reason: None,
                input: None,
                answered_by: None,
            }),
            started("a"),
            finished("a"),
        ];
        let waiting = Waiting::from_log(&log);
        assert!(!waiting.is_parked());
        assert!(!waiting.has_pending());
    }

    #[test]
    fn the_decisions_are_what_people_answered() {
        let resolved = |call_id: &str, decision, by| {
            event(EventKind::ToolApprovalResolved {
                call_id: call_id.into(),
                decision,
                by,
                reason: None,
                input: None,
                answered_by: None,
            })
        };
        let log = [
            requested("a"),
            requested("b"),
            requested("c"),
            requested("d"),
            resolved("a", Decision::Allow, ResolvedBy::User),
            resolved("b", Decision::Deny, ResolvedBy::User),
            resolved("c", Decision::Deny, ResolvedBy::Timeout),
            started("a"),
        ];
        let decisions = Waiting::from_log(&log).decisions();
        let mut answered: Vec<(&str, Decision)> = decisions
            .iter()
            .map(|(id, r)| (id.as_str(), r.decision))
            .collect();
        answered.sort_by_key(|(id, _)| *id);
        assert_eq!(answered, [("a", Decision::Allow), ("b", Decision::Deny)]);
    }

    #[test]
    fn an_answer_is_taken_once_repeated_idempotently_and_a_different_one_conflicts() {
        let mut waiting = Waiting::from_log(&[requested("a")]);
        let first = waiting
            .answer_approval("a", Decision::Deny, Some("no".into()), None, None, no_check)
            .unwrap();
        assert!(matches!(first, Answered::Fresh(ref r) if r.decision == Decision::Deny));
        let again = waiting
            .answer_approval("a", Decision::Deny, None, None, None, no_check)
            .unwrap();
        assert!(matches!(again, Answered::Repeat(ref r) if r.reason.as_deref() == Some("no")));
        let other = waiting.answer_approval("a", Decision::Allow, None, None, None, no_check);
        assert!(matches!(other, Err(Refusal::AlreadyResolved { .. })));
        let unknown = waiting.answer_approval("zz", Decision::Allow, None, None, None, no_check);
        assert!(matches!(unknown, Err(Refusal::NoSuchCall(_))));
    }

    #[test]
    fn an_edited_input_is_checked_and_only_for_a_call_that_runs() {
        let mut waiting = Waiting::from_log(&[requested("a")]);
        let refuse = |_: &str, _: &Value| Err("command is required".to_string());
        let bad =
            waiting.answer_approval("a", Decision::Allow, None, Some(json!({})), None, refuse);
        assert!(matches!(bad, Err(Refusal::Invalid(_))));
        let pointless =
            waiting.answer_approval("a", Decision::Deny, None, Some(json!({})), None, no_check);
        assert!(matches!(pointless, Err(Refusal::Invalid(_))));
        // Neither answer was taken.
        assert!(waiting.has_pending());
        let edited = json!({"command": "ls -la"});
        let ok = waiting
            .answer_approval(
                "a",
                Decision::Allow,
                None,
                Some(edited.clone()),
                None,
                no_check,
            )
            .unwrap();
        assert!(matches!(ok, Answered::Fresh(ref r) if r.input == Some(edited)));
    }

    #[test]
    fn the_earliest_expiry_of_what_is_pending_comes_first() {
        let at = |s: i64| DateTime::from_timestamp(s, 0).unwrap();
        let mut log = Vec::new();
        for (id, expires) in [("a", Some(at(30))), ("b", Some(at(10))), ("c", None)] {
            log.push(event(EventKind::ToolApprovalRequested {
                step_id: Uuid::nil(),
                call_id: id.into(),
                tool: "shell".into(),
                input: json!({}),
                subject: "".into(),
                expires_at: expires,
            }));
        }
        let mut waiting = Waiting::from_log(&log);
        assert_eq!(waiting.next_expiry(), Some(("b".to_string(), at(10))));
        waiting.resolve(Resolution {
            call_id: "b".into(),
            decision: Decision::Deny,
            by: ResolvedBy::Timeout,
            reason: None,
            input: None,
            answered_by: None,
        });
        assert_eq!(waiting.next_expiry(), Some(("a".to_string(), at(30))));
    }
}
