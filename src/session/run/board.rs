//! The call board of a run: its calls that wait for an answer (approvals, client tools), the
//! answers taken for them and not yet acted on, the replies owed to clients, the inputs
//! queued for the next step boundary, and the session's rules as the run has them.
//!
//! Every answer goes through [`CallBoard::answer`], whether the run is driven, parked (its
//! board rebuilt from the log), or ended (a board of the session's earlier runs): a first
//! answer is taken and handed to the run, which records it before it acts on it and then
//! replies; the same answer again is a repeat, another one `already-resolved`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use serde_json::Value;
use tokio::sync::Notify;

use crate::model::waiting::Item;
use crate::model::EventKind;
use crate::session::command::ApprovalAnswer;
use crate::session::command::{Reply, RunRequest, RunStarted};
use crate::session::errors::{ConflictKind, SessionError, Unanswered};
use crate::session::waiting::{Answered, ClientResult, Resolution, Waiting};
use crate::tools::policy::{Rule, Rules};

/// An answer to a waiting call, as it was sent.
#[derive(Debug, Clone)]
pub(in crate::session) enum Response {
    Approval(ApprovalAnswer),
    Client { output: String, is_error: bool },
}

/// An answer taken by the board: a human's resolution, or a client's result.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::session) enum Given {
    Approval(Resolution),
    Client(ClientResult),
}

impl Given {
    fn json(&self) -> Value {
        match self {
            Given::Approval(resolution) => serde_json::to_value(resolution),
            Given::Client(result) => serde_json::to_value(result),
        }
        .unwrap_or(Value::Null)
    }
}

/// A first answer, waiting for the run to record it.
pub(in crate::session) struct Taken {
    pub call_id: String,
    pub given: Given,
    /// Told once the answer is durable.
    pub reply: Option<Reply<Value>>,
}

/// What [`CallBoard::answer`] did with an answer.
pub(in crate::session) enum Outcome {
    /// A first answer: the run records it, then replies.
    Taken,
    /// Replied at once: a repeat, or a refusal.
    Answered,
    /// No call of this board has this id: the reply is handed back, to look further, with
    /// the refusal to send if nobody else has the call.
    NotHere(Reply<Value>, SessionError),
}

/// Whose calls a board holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// A run that goes on (driven, or parked and continued by a first answer).
    Live,
    /// Runs that have ended: a first answer to one of their calls comes too late.
    Ended,
}

/// A new run that asked to supersede this one (`?pending=deny`, `?if_busy=interrupt`): it
/// starts when this one has ended.
pub(in crate::session) type Successor = (RunRequest, Reply<RunStarted>);

#[derive(Default)]
struct Board {
    waiting: Waiting,
    taken: VecDeque<Taken>,
    /// Replies to clients whose result is told once the call's outcome is recorded.
    replies: HashMap<String, Reply<Value>>,
    /// Inputs sent while the run is active (`?if_busy=queue`), for its next step boundary.
    queued: Vec<String>,
    /// The session's rules as they are now (an "always" adds one).
    rules: Rules,
    successor: Option<Successor>,
}

/// The calls of a run that wait, and what came for them. Shared by the run and its actor's
/// command handlers; nothing behind its lock is held across an await.
pub(in crate::session) struct CallBoard {
    phase: Phase,
    board: Mutex<Board>,
    /// Wakes the run when an answer is taken.
    wake: Notify,
}

impl CallBoard {
    /// The board of a run that goes on, with what waits already.
    pub fn live(waiting: Waiting, rules: Rules) -> CallBoard {
        CallBoard::new(Phase::Live, waiting, rules)
    }

    /// The board of runs that have ended (their calls replayed from the log).
    pub fn ended(waiting: Waiting) -> CallBoard {
        CallBoard::new(Phase::Ended, waiting, Rules::default())
    }

    fn new(phase: Phase, waiting: Waiting, rules: Rules) -> CallBoard {
        CallBoard {
            phase,
            board: Mutex::new(Board {
                waiting,
                rules,
                ..Board::default()
            }),
            wake: Notify::new(),
        }
    }

    /// What waits, once the board is no longer used (a parked run that goes on waiting).
    pub fn into_waiting(self) -> Waiting {
        let board = self.board.into_inner().unwrap_or_else(|e| e.into_inner());
        board.waiting
    }

    /// Sets the session's rules as the run starts with them.
    pub fn set_rules(&self, rules: Rules) {
        self.lock().rules = rules;
    }

    fn lock(&self) -> MutexGuard<'_, Board> {
        // Plain data, never held across an await: a panic cannot leave it torn.
        self.board.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Answers `call_id`: a first answer is taken (on an ended run's board, refused as too
    /// late), a repeat or a refusal is replied to at once, and a call this board does not
    /// hold hands the reply back. `check_input` must accept an approval's edited input.
    pub fn answer(
        &self,
        call_id: &str,
        response: &Response,
        check_input: impl Fn(&str, &Value) -> Result<(), String>,
        reply: Reply<Value>,
    ) -> Outcome {
        let checked = self.check(call_id, response, check_input);
        let given = match checked {
            Err(unknown @ SessionError::NoSuchCall(_)) => return Outcome::NotHere(reply, unknown),
            Err(error) => {
                let _ = reply.send(Err(error));
                return Outcome::Answered;
            }
            Ok(Answered::Repeat(given)) => {
                let _ = reply.send(Ok(given.json()));
                return Outcome::Answered;
            }
            Ok(Answered::Fresh(given)) => given,
        };
        if self.phase == Phase::Ended {
            let late = ConflictKind::RunEnded(Unanswered::Call(call_id.to_string()));
            let _ = reply.send(Err(SessionError::Conflict(late)));
            return Outcome::Answered;
        }
        self.lock().taken.push_back(Taken {
            call_id: call_id.to_string(),
            given,
            reply: Some(reply),
        });
        self.wake.notify_one();
        Outcome::Taken
    }

    fn check(
        &self,
        call_id: &str,
        response: &Response,
        check_input: impl Fn(&str, &Value) -> Result<(), String>,
    ) -> Result<Answered<Given>, SessionError> {
        let mut board = self.lock();
        let answered = match response {
            Response::Approval(answer) => board
                .waiting
                .answer_approval(
                    call_id,
                    answer.decision,
                    answer.reason.clone(),
                    answer.input.clone(),
                    answer.answered_by.clone(),
                    check_input,
                )
                .map(|a| map(a, Given::Approval)),
            Response::Client { output, is_error } => board
                .waiting
                .answer_client(call_id, output.clone(), *is_error)
                .map(|a| map(a, Given::Client)),
        };
        Ok(answered?)
    }

    /// The next answer taken and not yet acted on.
    pub fn next_taken(&self) -> Option<Taken> {
        self.lock().taken.pop_front()
    }

    /// Waits until an answer may have been taken since the last call.
    pub async fn taken(&self) {
        self.wake.notified().await
    }

    /// Takes one event the run records into account.
    pub fn apply(&self, kind: &EventKind) {
        self.lock().waiting.apply(kind);
    }

    /// Records a resolution as written (the server's own, or a human's answer).
    pub fn resolve(&self, resolution: Resolution) {
        self.lock().waiting.resolve(resolution)
    }

    /// Records a client call's result as the run takes it.
    pub fn settle(&self, result: ClientResult) {
        self.lock().waiting.settle(result)
    }

    /// A call of the board, as it stands.
    pub fn get(&self, call_id: &str) -> Option<Item> {
        self.lock().waiting.get(call_id).cloned()
    }

    /// Whether the call has started and not finished.
    pub fn is_open(&self, call_id: &str) -> bool {
        self.lock().waiting.is_open(call_id)
    }

    /// Whether the run can wait without anybody driving it.
    pub fn is_parked(&self) -> bool {
        self.lock().waiting.is_parked()
    }

    /// Whether any call waits for an answer.
    pub fn has_pending(&self) -> bool {
        self.lock().waiting.has_pending()
    }

    /// The calls that still wait for an answer, by call id.
    pub fn pending(&self) -> Vec<(String, Item)> {
        let board = self.lock();
        let waiting = &board.waiting;
        waiting
            .pending_ids()
            .into_iter()
            .filter_map(|id| waiting.get(&id).cloned().map(|item| (id, item)))
            .collect()
    }

    /// The earliest time an unanswered call expires.
    pub fn next_expiry(&self) -> Option<(String, DateTime<Utc>)> {
        self.lock().waiting.next_expiry()
    }

    /// Keeps a client's reply until the call's outcome is recorded.
    pub fn owe_reply(&self, call_id: String, reply: Reply<Value>) {
        self.lock().replies.insert(call_id, reply);
    }

    /// The reply owed for `call_id`, if a client waits for one.
    pub fn take_reply(&self, call_id: &str) -> Option<Reply<Value>> {
        self.lock().replies.remove(call_id)
    }

    /// Queues an input for the run's next step boundary.
    pub fn queue(&self, input: String) {
        self.lock().queued.push(input)
    }

    /// The inputs queued since the last step boundary.
    pub fn take_queued(&self) -> Vec<String> {
        std::mem::take(&mut self.lock().queued)
    }

    /// Sets the run that follows this one; a second one is handed back (boxed: a request
    /// is large).
    pub fn supersede(&self, next: Successor) -> Result<(), Box<Successor>> {
        let mut board = self.lock();
        if board.successor.is_some() {
            return Err(Box::new(next));
        }
        board.successor = Some(next);
        Ok(())
    }

    /// Sets the run that follows this one, in place of one set before.
    pub fn replace_successor(&self, next: Successor) {
        self.lock().successor = Some(next);
    }

    /// The run that follows this one, if one asked to.
    pub fn take_successor(&self) -> Option<Successor> {
        self.lock().successor.take()
    }

    /// Runs `f` with the session's rules as they are now.
    pub fn with_rules<R>(&self, f: impl FnOnce(&Rules) -> R) -> R {
        f(&self.lock().rules)
    }

    /// Adds a rule to the session's rules; false when it cannot be compiled.
    pub fn add_rule(&self, rule: Rule) -> bool {
        self.lock().rules.push(rule).is_ok()
    }
}

fn map<T>(answered: Answered<T>, f: impl Fn(T) -> Given) -> Answered<Given> {
    match answered {
        Answered::Fresh(t) => Answered::Fresh(f(t)),
        Answered::Repeat(t) => Answered::Repeat(f(t)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::waiting::tests::asked;
    use crate::model::{Decision, ResolvedBy};
    use serde_json::json;
    use tokio::sync::oneshot;
    use uuid::Uuid;

    fn client_asked(call_id: &str) -> EventKind {
        EventKind::ToolClientRequested {
            step_id: Uuid::nil(),
            call_id: call_id.into(),
            tool: "pick_color".into(),
            input: json!({}),
            expires_at: None,
            environment: None,
        }
    }

    fn board_of(phase: Phase, events: &[EventKind]) -> CallBoard {
        let mut waiting = Waiting::default();
        for kind in events {
            waiting.apply(kind);
        }
        CallBoard::new(phase, waiting, Rules::default())
    }

    fn approval(decision: Decision, input: Option<Value>) -> Response {
        Response::Approval(ApprovalAnswer {
            decision,
            reason: None,
            input,
            answered_by: None,
        })
    }

    fn client(output: &str) -> Response {
        Response::Client {
            output: output.into(),
            is_error: false,
        }
    }

    fn fits(_: &str, _: &Value) -> Result<(), String> {
        Ok(())
    }

    /// Answers on `board`; what the reply said, if it was sent at once.
    fn answer(
        board: &CallBoard,
        call_id: &str,
        response: &Response,
    ) -> (&'static str, Option<Result<Value, SessionError>>) {
        let (reply, mut told) = oneshot::channel();
        let outcome = match board.answer(call_id, response, fits, reply) {
            Outcome::Taken => "taken",
            Outcome::Answered => "answered",
            Outcome::NotHere(_, SessionError::NoSuchCall(_)) => return ("not here", None),
            Outcome::NotHere(_, _) => "not here, but why?",
        };
        (outcome, told.try_recv().ok())
    }

    #[test]
    fn a_first_answer_is_taken_for_the_run_and_replied_to_once_recorded() {
        let board = board_of(Phase::Live, &[asked("a")]);
        let (outcome, told) = answer(&board, "a", &approval(Decision::Allow, None));
        assert_eq!((outcome, told.is_none()), ("taken", true));
        let taken = board.next_taken().expect("the run finds the answer");
        assert_eq!(taken.call_id, "a");
        let Given::Approval(resolution) = &taken.given else {
            panic!("an approval was given");
        };
        assert_eq!(
            (resolution.decision, resolution.by),
            (Decision::Allow, ResolvedBy::User)
        );
        assert!(taken.reply.is_some(), "the run replies once it is recorded");
        assert!(board.next_taken().is_none());
        // Taken, not yet recorded: the run must not ask again.
        assert!(board.get("a").is_some_and(|item| item.in_transit));
    }

    #[test]
    fn the_same_answer_again_is_a_repeat_and_another_one_already_resolved() {
        let board = board_of(Phase::Live, &[asked("a")]);
        answer(&board, "a", &approval(Decision::Allow, None));
        let (outcome, told) = answer(&board, "a", &approval(Decision::Allow, None));
        assert_eq!(outcome, "answered");
        let repeat = told.expect("replied at once").expect("a repeat succeeds");
        assert_eq!(repeat["decision"], json!("allow"));
        let (_, told) = answer(&board, "a", &approval(Decision::Deny, None));
        assert!(matches!(
            told,
            Some(Err(SessionError::AlreadyResolved { .. }))
        ));
        assert!(board.next_taken().is_some());
        assert!(board.next_taken().is_none(), "only the first was taken");
    }

    #[test]
    fn a_call_the_board_does_not_hold_hands_the_reply_back() {
        let board = board_of(Phase::Live, &[asked("a")]);
        assert_eq!(
            answer(&board, "b", &approval(Decision::Allow, None)).0,
            "not here"
        );
        // An approval is no client result, and the other way round.
        assert_eq!(answer(&board, "a", &client("red")).0, "not here");
        let clients = board_of(Phase::Live, &[client_asked("c")]);
        assert_eq!(
            answer(&clients, "c", &approval(Decision::Allow, None)).0,
            "not here"
        );
    }

    #[test]
    fn a_first_answer_to_an_ended_run_comes_too_late_and_a_repeat_is_still_one() {
        let resolved = EventKind::ToolApprovalResolved {
            call_id: "a".into(),
            decision: Decision::Deny,
            by: ResolvedBy::User,
            reason: None,
            input: None,
            answered_by: None,
        };
        let board = board_of(Phase::Ended, &[asked("a"), resolved, asked("b")]);
        let (_, told) = answer(&board, "b", &approval(Decision::Allow, None));
        assert!(matches!(
            told,
            Some(Err(SessionError::Conflict(ConflictKind::RunEnded(
                Unanswered::Call(_)
            ))))
        ));
        let (_, told) = answer(&board, "a", &approval(Decision::Deny, None));
        assert!(matches!(told, Some(Ok(_))));
        let (_, told) = answer(&board, "a", &approval(Decision::Allow, None));
        assert!(matches!(
            told,
            Some(Err(SessionError::AlreadyResolved { .. }))
        ));
        assert!(board.next_taken().is_none());
    }

    #[test]
    fn a_client_result_is_taken_once_and_another_one_is_refused() {
        let board = board_of(Phase::Live, &[client_asked("c")]);
        assert_eq!(answer(&board, "c", &client("red")).0, "taken");
        let (_, told) = answer(&board, "c", &client("red"));
        assert_eq!(
            told.expect("at once").expect("a repeat")["output"],
            json!("red")
        );
        let (_, told) = answer(&board, "c", &client("blue"));
        assert!(matches!(
            told,
            Some(Err(SessionError::AlreadyResolved { .. }))
        ));
        let taken = board.next_taken().expect("taken");
        assert!(matches!(taken.given, Given::Client(ref r) if r.output == "red"));
    }

    #[test]
    fn an_edited_input_its_tool_refuses_leaves_the_call_waiting() {
        let board = board_of(Phase::Live, &[asked("a")]);
        let (reply, mut told) = oneshot::channel();
        let refuse = |_: &str, _: &Value| Err("command is required".to_string());
        let edited = approval(Decision::Allow, Some(json!({})));
        assert!(matches!(
            board.answer("a", &edited, refuse, reply),
            Outcome::Answered
        ));
        assert!(matches!(told.try_recv(), Ok(Err(SessionError::Invalid(_)))));
        assert!(board.has_pending());
        let (outcome, _) = answer(&board, "a", &approval(Decision::Allow, None));
        assert_eq!(outcome, "taken");
    }

    #[test]
    fn recorded_answers_and_results_settle_the_calls() {
        let board = board_of(Phase::Live, &[asked("a"), client_asked("c")]);
        assert_eq!(board.pending().len(), 2);
        assert!(board.is_parked());
        board.resolve(Resolution {
            call_id: "a".into(),
            decision: Decision::Deny,
            by: ResolvedBy::Timeout,
            reason: None,
            input: None,
            answered_by: None,
        });
        board.settle(ClientResult {
            call_id: "c".into(),
            output: "late".into(),
            is_error: true,
        });
        assert!(!board.has_pending());
        assert!(board.pending().is_empty());
        assert!(board.next_expiry().is_none());
        let waiting = board.into_waiting();
        assert!(!waiting.get("a").is_some_and(|item| item.in_transit));
    }

    #[test]
    fn queued_inputs_replies_and_a_successor_are_kept_for_the_run() {
        let board = board_of(Phase::Live, &[]);
        board.queue("one".into());
        board.queue("two".into());
        assert_eq!(board.take_queued(), vec!["one", "two"]);
        assert!(board.take_queued().is_empty());
        let (reply, _told) = oneshot::channel();
        board.owe_reply("c".into(), reply);
        assert!(board.take_reply("c").is_some());
        assert!(board.take_reply("c").is_none());
        let request = || RunRequest::run("next".into(), crate::session::command::Pending::Refuse);
        let (first, _) = oneshot::channel();
        assert!(board.supersede((request(), first)).is_ok());
        let (second, _) = oneshot::channel();
        assert!(board.supersede((request(), second)).is_err());
        let (third, _) = oneshot::channel();
        board.replace_successor((request(), third));
        assert!(board.take_successor().is_some());
        assert!(board.take_successor().is_none());
    }

    #[test]
    fn rules_added_by_an_always_are_the_boards_rules() {
        let board = board_of(Phase::Live, &[]);
        let rule = Rule {
            tool: "shell".into(),
            subject: Some("ls".into()),
            action: crate::model::Action::Allow,
        };
        assert!(board.add_rule(rule.clone()));
        assert_eq!(
            board.with_rules(|rules| rules.rules().cloned().collect::<Vec<_>>()),
            vec![rule]
        );
    }

    #[tokio::test]
    async fn the_run_is_woken_when_an_answer_is_taken() {
        let board = std::sync::Arc::new(board_of(Phase::Live, &[asked("a")]));
        let waiter = {
            let board = board.clone();
            tokio::spawn(async move {
                board.taken().await;
                board.next_taken().map(|taken| taken.call_id)
            })
        };
        tokio::task::yield_now().await;
        answer(&board, "a", &approval(Decision::Allow, None));
        assert_eq!(waiter.await.unwrap().as_deref(), Some("a"));
    }
}
