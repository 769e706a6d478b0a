//! The MCP server face's view of a run: what `tah_run` and `tah_answer` answer once the run
//! they follow ended or waits for answers, and the progress they report on the way.
//!
//! Pure: fed the run's events in order (from its `agent.started`), it keeps no other state.

use serde::Serialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::calls::{RunCalls, Wait};
use crate::model::{Event, EventKind, FinishReason};

/// How the followed run stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Still running (the stream ended first: the server stops, or the session was deleted).
    Running,
    /// Waits for answers only: the calls in [`RunWatch::pending`].
    Waiting,
    Finished {
        finish_reason: FinishReason,
    },
    Failed {
        error: String,
    },
    Cancelled,
}

/// A call the run waits for, as `tah_run` shows it: answer it with `tah_answer`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingCall {
    pub call_id: String,
    pub tool: String,
    /// `approval` (answer with a `decision`) or `client` (answer with an `output`).
    pub kind: &'static str,
    pub input: Value,
}

/// What one event did to the run.
#[derive(Debug, Default, PartialEq)]
pub struct Pushed {
    /// The event parked the run (check that nothing moved it on since).
    pub parked: bool,
    /// The run ended with this event.
    pub ended: bool,
    /// A line for a progress notification.
    pub progress: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct RunWatch {
    calls: RunCalls,
    run_id: Option<Uuid>,
    /// The text of the latest model reply (the answer, once the run finished).
    text: String,
    end: Option<Outcome>,
    /// A text piece of the current reply was already reported.
    writing: bool,
}

impl RunWatch {
    pub fn push(&mut self, event: &Event) -> Pushed {
        let parked = self.calls.apply(event);
        let mut pushed = Pushed {
            parked,
            ..Pushed::default()
        };
        pushed.progress = match &event.kind {
            EventKind::AgentStarted { run_id, .. } => {
                self.run_id = Some(*run_id);
                Some("run started".to_string())
            }
            EventKind::LlmStarted { .. } => {
                self.writing = false;
                Some("the model is thinking".to_string())
            }
            EventKind::AssistantStream { .. } if !self.writing => {
                self.writing = true;
                Some("the model is writing".to_string())
            }
            EventKind::LlmCompleted { message, .. } => {
                self.text = message.content.clone();
                None
            }
            EventKind::ToolStarted { call, .. } => Some(format!("calling {}", call.name)),
            EventKind::ToolFinished {
                call_id, is_error, ..
            } => Some(match is_error {
                true => format!("call {call_id} failed"),
                false => format!("call {call_id} finished"),
            }),
            EventKind::ToolApprovalRequested { tool, .. } => {
                Some(format!("{tool} waits for approval"))
            }
            EventKind::ToolClientRequested { tool, .. } => {
                Some(format!("{tool} waits for the client's output"))
            }
            EventKind::AgentFinished {
                text,
                finish_reason,
                ..
            } => {
                self.text = text.clone();
                self.end = Some(Outcome::Finished {
                    finish_reason: finish_reason.clone(),
                });
                pushed.ended = true;
                Some("run finished".to_string())
            }
            EventKind::AgentFailed { error, .. } => {
                self.end = Some(Outcome::Failed {
                    error: error.clone(),
                });
                pushed.ended = true;
                Some("run failed".to_string())
            }
            EventKind::AgentCancelled { .. } => {
                self.end = Some(Outcome::Cancelled);
                pushed.ended = true;
                Some("run cancelled".to_string())
            }
            _ => None,
        };
        pushed
    }

    pub fn calls(&self) -> &RunCalls {
        &self.calls
    }

    pub fn run_id(&self) -> Option<Uuid> {
        self.run_id
    }

    pub fn outcome(&self) -> Outcome {
        match &self.end {
            Some(end) => end.clone(),
            None if self.calls.is_parked() => Outcome::Waiting,
            None => Outcome::Running,
        }
    }

    /// The calls the run waits for now, in the order of the model's reply.
    pub fn pending(&self) -> Vec<PendingCall> {
        self.calls
            .waiting()
            .map(|call| PendingCall {
                call_id: call.id.clone(),
                tool: call.tool.clone(),
                kind: match call.wait {
                    Some(Wait::Client) => "client",
                    _ => "approval",
                },
                input: call.input.clone(),
            })
            .collect()
    }

    /// The text of the latest model reply.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The tool result's `structuredContent`: `{session_id, run_id, text, status}`, with
    /// `pending` when the run waits, `finish_reason` when it finished, `error` when it failed.
    pub fn structured(&self, session_id: Uuid) -> Value {
        let mut value = json!({
            "session_id": session_id,
            "run_id": self.run_id,
            "text": self.text,
        });
        let status = match self.outcome() {
            Outcome::Running => "running",
            Outcome::Waiting => {
                value["pending"] = json!(self.pending());
                "waiting"
            }
            Outcome::Finished { finish_reason } => {
                value["finish_reason"] = json!(finish_reason);
                "completed"
            }
            Outcome::Failed { error } => {
                value["error"] = json!(error);
                "failed"
            }
            Outcome::Cancelled => "cancelled",
        };
        value["status"] = json!(status);
        value
    }

    /// The tool result's text: the answer, or what the run waits for or why it stopped.
    pub fn summary(&self) -> String {
        match self.outcome() {
            Outcome::Finished { .. } => self.text.clone(),
            Outcome::Waiting => {
                let pending: Vec<String> = self
                    .pending()
                    .iter()
                    .map(|call| match call.kind {
                        "client" => format!(
                            "{} (call {}) waits for its output: give it with tah_answer \
                             {{call_id, output}}",
                            call.tool, call.call_id
                        ),
                        _ => format!(
                            "{} (call {}) waits for approval: answer with tah_answer \
                             {{call_id, decision: \"allow\"|\"deny\"}}",
                            call.tool, call.call_id
                        ),
                    })
                    .collect();
                pending.join("\n")
            }
            Outcome::Failed { error } => format!("the run failed: {error}"),
            Outcome::Cancelled => "the run was cancelled".to_string(),
            Outcome::Running => {
                "the run goes on; read it with tah_session when it has ended".to_string()
            }
        }
    }

    /// Whether the result is an MCP tool error (`isError`).
    pub fn is_error(&self) -> bool {
        matches!(self.outcome(), Outcome::Failed { .. } | Outcome::Cancelled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocols::calls::tests::Log;

    fn watch(log: &Log) -> (RunWatch, Vec<Pushed>) {
        let mut watch = RunWatch::default();
        let pushed = log.events.iter().map(|e| watch.push(e)).collect();
        (watch, pushed)
    }

    #[test]
    fn a_finished_run_answers_its_text_and_reported_its_progress() {
        let (log, _, _) = Log::reasoned_turn(&["hm"], &["Let me look."], &["All ", "good."]);
        let (watch, pushed) = watch(&log);
        assert!(matches!(watch.outcome(), Outcome::Finished { .. }));
        assert_eq!(watch.summary(), "All good.");
        assert!(!watch.is_error());
        let structured = watch.structured(Uuid::from_u128(1));
        assert_eq!(structured["text"], "All good.");
        assert_eq!(structured["status"], "completed");
        assert_eq!(structured["run_id"], json!(log.run_id));
        let progress: Vec<&str> = pushed
            .iter()
            .filter_map(|p| p.progress.as_deref())
            .collect();
        assert_eq!(progress.first(), Some(&"run started"));
        assert!(progress.contains(&"calling list_files"));
        assert_eq!(progress.last(), Some(&"run finished"));
        // One "writing" line per reply, not one per piece.
        assert_eq!(
            progress
                .iter()
                .filter(|p| **p == "the model is writing")
                .count(),
            2
        );
        assert!(pushed.last().unwrap().ended);
    }

    #[test]
    fn a_run_parked_on_an_approval_shows_the_pending_call() {
        let (mut log, step) = Log::first_step("", &[("c1", "write_file")]);
        log.push(EventKind::ToolApprovalRequested {
            step_id: step,
            call_id: "c1".into(),
            tool: "write_file".into(),
            input: json!({"path": "notes.md"}),
            subject: "notes.md".into(),
            expires_at: None,
        });
        let (watch, pushed) = watch(&log);
        assert!(pushed.last().unwrap().parked);
        assert_eq!(watch.outcome(), Outcome::Waiting);
        let structured = watch.structured(Uuid::from_u128(1));
        assert_eq!(structured["status"], "waiting");
        assert_eq!(structured["pending"][0]["call_id"], "c1");
        assert_eq!(structured["pending"][0]["kind"], "approval");
        assert!(watch
            .summary()
            .contains("write_file (call c1) waits for approval"));
    }
}
