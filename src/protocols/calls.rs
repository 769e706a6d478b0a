//! What a run's log says about the tool calls of its latest model reply: which of them wait for
//! an answer (a human's approval, a client's result), and whether the run is *parked*: every
//! call either has its outcome or waits, and at least one waits. A front end's stream of such
//! a run ends there, since nothing more happens until someone answers.
//!
//! Pure: fed the run's events in order, it keeps no other state. A view over the one
//! projection of waiting calls, [`crate::model::waiting`].

use crate::model::waiting::Waiting;
pub use crate::model::waiting::{Call, Wait};
use crate::model::Event;

/// The calls of a run's latest model reply, as its events tell.
#[derive(Debug, Clone, Default)]
pub struct RunCalls {
    waiting: Waiting,
}

impl RunCalls {
    /// Takes the next event of the run; true when this event parked the run.
    pub fn apply(&mut self, event: &Event) -> bool {
        self.waiting.apply(&event.kind)
    }

    /// The run waits for answers only.
    pub fn is_parked(&self) -> bool {
        self.waiting.reply().is_parked()
    }

    /// The calls that wait for an answer now, in the order of the model's reply.
    pub fn waiting(&self) -> impl Iterator<Item = &Call> {
        self.waiting.reply().waiting()
    }
}

/// The `seq` of the last point at which the run was parked, among `events` (its log so far).
pub fn last_park(events: &[Event]) -> Option<i64> {
    let mut calls = RunCalls::default();
    let mut last = None;
    for event in events {
        if calls.apply(event) {
            last = Some(event.seq);
        }
    }
    last
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::{
        Decision, EventKind, FinishReason, Message, ResolvedBy, RunKind, ToolCall, Usage,
    };
    use crate::protocols::ag_ui::AgUiRun;
    use crate::protocols::ai_sdk::UiMessageStream;
    use serde_json::{json, Value};
    use uuid::Uuid;

    /// Builds a run's log: each call appends one event with the next `seq`.
    pub struct Log {
        pub events: Vec<Event>,
        pub run_id: Uuid,
    }

    impl Log {
        pub fn new() -> Log {
            let mut log = Log {
                events: Vec::new(),
                run_id: Uuid::from_u128(7),
            };
            log.push(EventKind::AgentStarted {
                run_id: log.run_id,
                kind: RunKind::Run,
            });
            log
        }

        pub fn push(&mut self, kind: EventKind) -> &Event {
            let seq = self.events.len() as i64 + 10;
            let at = chrono::DateTime::from_timestamp(0, 0).unwrap();
            self.events
                .push(Event::new(Uuid::from_u128(1), seq, kind, at));
            self.events.last().unwrap()
        }

        /// A log whose first step completed with `text` and `calls` (ids and tools).
        pub fn first_step(text: &str, calls: &[(&str, &str)]) -> (Log, Uuid) {
            let mut log = Log::new();
            let step = log.step(1);
            log.completed(step, text, calls);
            (log, step)
        }

        /// A turn of two steps: the first reasons in `thinking` pieces (then streams
        /// `first_text`) and calls `list_files` as `c1`, which runs; the second answers in
        /// `answer` pieces, and the run finishes with that answer.
        pub fn reasoned_turn(
            thinking: &[&str],
            first_text: &[&str],
            answer: &[&str],
        ) -> (Log, Uuid, Uuid) {
            let mut log = Log::new();
            let first = log.step(1);
            for piece in thinking {
                log.thinking(first, piece);
            }
            for piece in first_text {
                log.text(first, piece);
            }
            log.completed(first, "", &[("c1", "list_files")]);
            log.ran("c1", "list_files", "README.md");
            let second = log.step(2);
            for piece in answer {
                log.text(second, piece);
            }
            let text = answer.concat();
            log.completed(second, &text, &[]);
            log.done(&text);
            (log, first, second)
        }

        /// A call that ran and answered `output`.
        pub fn ran(&mut self, call: &str, tool: &str, output: &str) {
            self.started(call, tool);
            self.finished(call, output, false);
        }

        pub fn step(&mut self, n: u128) -> Uuid {
            let step = Uuid::from_u128(100 + n);
            self.push(EventKind::LlmStarted { step_id: step });
            step
        }

        pub fn text(&mut self, step: Uuid, text: &str) {
            self.push(EventKind::AssistantStream {
                step_id: step,
                text: text.into(),
            });
        }

        pub fn thinking(&mut self, step: Uuid, text: &str) {
            self.push(EventKind::ThinkingStream {
                step_id: step,
                text: text.into(),
            });
        }

        pub fn completed(&mut self, step: Uuid, text: &str, calls: &[(&str, &str)]) {
            let calls = calls
                .iter()
                .map(|(id, name)| ToolCall {
                    id: id.to_string(),
                    name: name.to_string(),
                    arguments: json!({"path": "notes.md"}),
                })
                .collect();
            self.push(EventKind::LlmCompleted {
                step_id: step,
                message: Message::assistant(text, calls),
                finish_reason: FinishReason::Model("stop".into()),
                usage: Usage::default(),
                cost_usd: None,
            });
        }

        pub fn ask(&mut self, call: &str) {
            self.push(EventKind::ToolApprovalRequested {
                step_id: Uuid::from_u128(900),
                call_id: call.into(),
                tool: "write_file".into(),
                input: json!({"path": "notes.md"}),
                subject: "notes.md".into(),
                expires_at: None,
            });
        }

        pub fn client(&mut self, call: &str, tool: &str) {
            self.push(EventKind::ToolClientRequested {
                step_id: Uuid::from_u128(901),
                call_id: call.into(),
                tool: tool.into(),
                input: json!({"question": "?"}),
                expires_at: None,
                environment: None,
            });
        }

        pub fn resolve(&mut self, call: &str, decision: Decision, by: ResolvedBy) {
            self.push(EventKind::ToolApprovalResolved {
                call_id: call.into(),
                decision,
                by,
                reason: None,
                input: None,
                answered_by: None,
            });
        }

        pub fn started(&mut self, call: &str, tool: &str) {
            self.push(EventKind::ToolStarted {
                step_id: Uuid::from_u128(902),
                call: ToolCall {
                    id: call.into(),
                    name: tool.into(),
                    arguments: json!({"path": "notes.md"}),
                },
            });
        }

        pub fn finished(&mut self, call: &str, output: &str, is_error: bool) {
            self.push(EventKind::ToolFinished {
                step_id: Uuid::from_u128(903),
                call_id: call.into(),
                output: output.into(),
                is_error,
            });
        }

        pub fn done(&mut self, text: &str) {
            self.push(EventKind::AgentFinished {
                run_id: self.run_id,
                text: text.into(),
                finish_reason: FinishReason::Model("stop".into()),
                usage: Usage {
                    input_tokens: 3,
                    output_tokens: 4,
                },
            });
        }
    }

    /// What a protocol adapter makes of each event: its output, and whether the run parked.
    pub trait Adapter {
        fn adapt(&mut self, event: &Event) -> (Vec<Value>, bool);
    }

    impl Adapter for AgUiRun {
        fn adapt(&mut self, event: &Event) -> (Vec<Value>, bool) {
            let pushed = self.push(event);
            (pushed.events, pushed.parked)
        }
    }

    impl Adapter for UiMessageStream {
        fn adapt(&mut self, event: &Event) -> (Vec<Value>, bool) {
            let pushed = self.push(event);
            (pushed.chunks, pushed.parked)
        }
    }

    /// What `adapter` makes of the whole log, and the seqs at which the run parked.
    pub fn adapt_log(adapter: &mut impl Adapter, log: &Log) -> (Vec<Value>, Vec<i64>) {
        let mut out = Vec::new();
        let mut parks = Vec::new();
        for event in &log.events {
            let (pushed, parked) = adapter.adapt(event);
            out.extend(pushed);
            if parked {
                parks.push(event.seq);
            }
        }
        (out, parks)
    }

    /// The `type` of each output.
    pub fn types(out: &[Value]) -> Vec<&str> {
        out.iter().map(|c| c["type"].as_str().unwrap()).collect()
    }

    /// The types of `out` in order, separated by spaces.
    pub fn type_list(out: &[Value]) -> String {
        types(out).join(" ")
    }

    fn parks(log: &Log) -> Vec<i64> {
        let mut calls = RunCalls::default();
        log.events
            .iter()
            .filter(|e| calls.apply(e))
            .map(|e| e.seq)
            .collect()
    }

    #[test]
    fn a_run_parks_once_every_call_has_its_outcome_or_waits() {
        let (mut log, _) = Log::first_step("", &[("a", "write_file"), ("b", "list_files")]);
        log.ask("a");
        // b is allowed: the run is not parked while b has not run.
        log.ran("b", "list_files", "README.md");
        let parked_at = log.events.last().unwrap().seq;
        log.resolve("a", Decision::Allow, ResolvedBy::User);
        log.ran("a", "write_file", "wrote");
        let step = log.step(2);
        log.completed(step, "done", &[]);
        log.done("done");
        assert_eq!(parks(&log), vec![parked_at]);
        assert_eq!(last_park(&log.events), Some(parked_at));
    }

    #[test]
    fn waiting_calls_are_listed_with_what_they_wait_for() {
        let (mut log, _) = Log::first_step("", &[("a", "write_file"), ("c", "ask_user")]);
        log.ask("a");
        log.client("c", "ask_user");
        let mut calls = RunCalls::default();
        for event in &log.events {
            calls.apply(event);
        }
        assert!(calls.is_parked());
        let waiting: Vec<_> = calls
            .waiting()
            .map(|c| (c.id.as_str(), c.wait.clone()))
            .collect();
        assert_eq!(
            waiting,
            vec![
                (
                    "a",
                    Some(Wait::Approval {
                        subject: "notes.md".into()
                    })
                ),
                ("c", Some(Wait::Client)),
            ]
        );
        // A denial is an outcome on its way: no longer parked.
        log.resolve("a", Decision::Deny, ResolvedBy::User);
        calls.apply(log.events.last().unwrap());
        assert!(!calls.is_parked());
    }

    #[test]
    fn a_run_without_calls_that_wait_never_parks() {
        let (mut log, _) = Log::first_step("", &[("a", "list_files")]);
        log.ran("a", "list_files", "x");
        log.done("x");
        assert!(parks(&log).is_empty());
    }
}
