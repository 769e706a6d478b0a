//! A2A v1.0 (the Agent2Agent protocol, as `@a2a-js/sdk` 1.3.0 and `a2a-sdk` 1.3.0 speak it):
//! a tah run is an A2A Task (task id = the run's id), its session is the task's `contextId`.
//! This module is the pure mapping from a run's log to A2A's objects, in their ProtoJSON form
//! (camelCase fields, enums as `TASK_STATE_…` / `ROLE_…` names, `oneof`s as the member's name).
//!
//! One log event gives at most one stream frame (`StreamResponse`), so a frame's position is
//! the event's `seq`: it is both the SSE `id:` and the frame's `metadata.tah_seq`.
//!
//! | tah's log                                        | A2A                                              |
//! |--------------------------------------------------|--------------------------------------------------|
//! | `agent.started`                                  | `task` (the Task, `TASK_STATE_WORKING`)           |
//! | `llm.completed` with text and no tool calls      | `artifactUpdate` (`text-<step_id>`, text part)    |
//! | `artifact.created`                               | `artifactUpdate` (the artifact's id, a url part)  |
//! | `tool.approval-requested`, `tool.client-requested` once every call waits | `statusUpdate` `TASK_STATE_INPUT_REQUIRED`, the calls as data parts |
//! | the answer that lets the run go on               | `statusUpdate` `TASK_STATE_WORKING`               |
//! | `agent.finished` / `agent.failed` / `agent.cancelled` | `statusUpdate` `COMPLETED` / `FAILED` / `CANCELED` |

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Map, Value};
use uuid::Uuid;

use crate::model::{Event, EventKind, RunRecord};
use crate::protocols::calls::{RunCalls, Wait};

/// The protocol version tah speaks (`AgentInterface.protocolVersion`, `A2A-Version`).
pub const PROTOCOL_VERSION: &str = "1.0";

/// A name that is not a task state's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownState;

/// A task's state, as tah's runs can be in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    Submitted,
    Working,
    InputRequired,
    Completed,
    Failed,
    Canceled,
}

impl TaskState {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Submitted => "TASK_STATE_SUBMITTED",
            TaskState::Working => "TASK_STATE_WORKING",
            TaskState::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            TaskState::Completed => "TASK_STATE_COMPLETED",
            TaskState::Failed => "TASK_STATE_FAILED",
            TaskState::Canceled => "TASK_STATE_CANCELED",
        }
    }

    /// A state's name as a filter names it; `Ok(None)` for the states tah's tasks are never
    /// in (`REJECTED`, `AUTH_REQUIRED`): a filter on them matches nothing.
    pub fn parse(name: &str) -> Result<Option<TaskState>, UnknownState> {
        Ok(Some(match name {
            "TASK_STATE_SUBMITTED" => TaskState::Submitted,
            "TASK_STATE_WORKING" => TaskState::Working,
            "TASK_STATE_INPUT_REQUIRED" => TaskState::InputRequired,
            "TASK_STATE_COMPLETED" => TaskState::Completed,
            "TASK_STATE_FAILED" => TaskState::Failed,
            "TASK_STATE_CANCELED" => TaskState::Canceled,
            "TASK_STATE_REJECTED" | "TASK_STATE_AUTH_REQUIRED" => return Ok(None),
            _ => return Err(UnknownState),
        }))
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Canceled
        )
    }
}

fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn seq_metadata(seq: i64) -> Value {
    json!({ "tah_seq": seq })
}

/// A run as an A2A Task, built from the run's record and fed the run's events in order.
#[derive(Debug, Clone)]
pub struct TaskView {
    task_id: Uuid,
    context_id: Uuid,
    /// Where the server is reached (`http://host:port`), for artifacts' URLs.
    base_url: String,
    state: TaskState,
    status_message: Option<Value>,
    status_at: DateTime<Utc>,
    calls: RunCalls,
    artifacts: Vec<Value>,
    input: Option<String>,
    output: Option<String>,
    last_seq: i64,
}

impl TaskView {
    /// The task of `run` before any of its events: `SUBMITTED`.
    pub fn new(run: &RunRecord, base_url: &str) -> TaskView {
        TaskView {
            task_id: run.id,
            context_id: run.session_id,
            base_url: base_url.trim_end_matches('/').to_string(),
            state: TaskState::Submitted,
            status_message: None,
            status_at: run.created_at,
            calls: RunCalls::default(),
            artifacts: Vec::new(),
            input: run.input.clone(),
            output: None,
            last_seq: run.start_seq - 1,
        }
    }

    pub fn task_id(&self) -> Uuid {
        self.task_id
    }

    pub fn state(&self) -> TaskState {
        self.state
    }

    /// The `seq` of the last event taken.
    pub fn last_seq(&self) -> i64 {
        self.last_seq
    }

    /// The task's calls (which of them wait for an answer).
    pub fn calls(&self) -> &RunCalls {
        &self.calls
    }

    /// Takes the run's next event; answers the stream frame it gives, if any.
    pub fn push(&mut self, event: &Event) -> Option<Value> {
        self.last_seq = event.seq;
        let parked_now = self.calls.apply(event);
        let meta = seq_metadata(event.seq);
        match &event.kind {
            EventKind::AgentStarted { run_id, .. } if *run_id == self.task_id => {
                self.set_state(TaskState::Working, None, event.created_at);
                let mut task = self.task(None, true);
                task["metadata"] = meta;
                Some(json!({ "task": task }))
            }
            EventKind::LlmCompleted {
                step_id, message, ..
            } if message.tool_calls.is_empty() && !message.content.is_empty() => {
                let artifact = json!({
                    "artifactId": format!("text-{step_id}"),
                    "name": "response",
                    "parts": [{ "text": message.content }],
                });
                Some(self.artifact_frame(artifact, meta))
            }
            EventKind::ArtifactCreated { artifact } => {
                let filename = artifact.path.rsplit('/').next().unwrap_or(&artifact.path);
                let url = format!(
                    "{}/v1/sessions/{}/artifacts/{}/content",
                    self.base_url, self.context_id, artifact.id
                );
                let artifact = json!({
                    "artifactId": artifact.id.to_string(),
                    "name": artifact.path,
                    "parts": [{
                        "url": url,
                        "filename": filename,
                        "mediaType": artifact.media_type,
                    }],
                    "metadata": {
                        "path": artifact.path,
                        "version": artifact.version,
                        "size": artifact.size,
                        "sha256": artifact.sha256,
                    },
                });
                Some(self.artifact_frame(artifact, meta))
            }
            EventKind::AgentFinished { run_id, text, .. } if *run_id == self.task_id => {
                self.output = Some(text.clone());
                let message = self.agent_message(event.seq, vec![json!({ "text": text })]);
                Some(self.status_frame(TaskState::Completed, Some(message), event, meta))
            }
            EventKind::AgentFailed { run_id, error } if *run_id == self.task_id => {
                let message = self.agent_message(event.seq, vec![json!({ "text": error })]);
                Some(self.status_frame(TaskState::Failed, Some(message), event, meta))
            }
            EventKind::AgentCancelled { run_id } if *run_id == self.task_id => {
                Some(self.status_frame(TaskState::Canceled, None, event, meta))
            }
            _ if parked_now => {
                let message = self.waiting_message(event.seq);
                Some(self.status_frame(TaskState::InputRequired, Some(message), event, meta))
            }
            _ if self.state == TaskState::InputRequired && !self.calls.is_parked() => {
                Some(self.status_frame(TaskState::Working, None, event, meta))
            }
            _ => None,
        }
    }

    fn set_state(&mut self, state: TaskState, message: Option<Value>, at: DateTime<Utc>) {
        self.state = state;
        self.status_message = message;
        self.status_at = at;
    }

    fn status(&self) -> Value {
        let mut status = json!({
            "state": self.state.as_str(),
            "timestamp": timestamp(self.status_at),
        });
        if let Some(message) = &self.status_message {
            status["message"] = message.clone();
        }
        status
    }

    fn status_frame(
        &mut self,
        state: TaskState,
        message: Option<Value>,
        event: &Event,
        meta: Value,
    ) -> Value {
        self.set_state(state, message, event.created_at);
        json!({
            "statusUpdate": {
                "taskId": self.task_id.to_string(),
                "contextId": self.context_id.to_string(),
                "status": self.status(),
                "metadata": meta,
            }
        })
    }

    fn artifact_frame(&mut self, artifact: Value, meta: Value) -> Value {
        self.artifacts.push(artifact.clone());
        json!({
            "artifactUpdate": {
                "taskId": self.task_id.to_string(),
                "contextId": self.context_id.to_string(),
                "artifact": artifact,
                "append": false,
                "lastChunk": true,
                "metadata": meta,
            }
        })
    }

    fn message(&self, id: String, role: &str, parts: Vec<Value>) -> Value {
        json!({
            "messageId": id,
            "contextId": self.context_id.to_string(),
            "taskId": self.task_id.to_string(),
            "role": role,
            "parts": parts,
        })
    }

    fn agent_message(&self, seq: i64, parts: Vec<Value>) -> Value {
        self.message(format!("{}:{seq}", self.task_id), "ROLE_AGENT", parts)
    }

    /// The status message of a task that waits: a line per waiting call, and each call as a
    /// data part (`call_id`, `tool`, `kind`, `input`) that names what answers it.
    fn waiting_message(&self, seq: i64) -> Value {
        let mut lines = Vec::new();
        let mut parts = Vec::new();
        for call in self.calls.waiting() {
            let (kind, answer) = match &call.wait {
                Some(Wait::Approval { .. }) => (
                    "approval",
                    "answer with a data part {call_id, decision: \"allow\"|\"deny\", reason?}",
                ),
                _ => ("client_tool", "answer with a data part {call_id, output}"),
            };
            lines.push(format!(
                "{} ({}) waits for {}: {answer}",
                call.tool,
                call.id,
                match kind {
                    "approval" => "an approval",
                    _ => "the client's result",
                }
            ));
            let mut data = Map::new();
            data.insert("call_id".into(), json!(call.id));
            data.insert("tool".into(), json!(call.tool));
            data.insert("kind".into(), json!(kind));
            data.insert("input".into(), call.input.clone());
            parts.push(json!({ "data": Value::Object(data) }));
        }
        let mut all = vec![json!({ "text": lines.join("\n") })];
        all.extend(parts);
        self.agent_message(seq, all)
    }

    /// The Task: its status, its artifacts (when `include_artifacts`), and its history (the
    /// run's input, then its answer once it has one), the last `history_length` messages of it.
    pub fn task(&self, history_length: Option<usize>, include_artifacts: bool) -> Value {
        let mut history = Vec::new();
        if let Some(input) = &self.input {
            history.push(self.message(
                format!("{}:input", self.task_id),
                "ROLE_USER",
                vec![json!({ "text": input })],
            ));
        }
        if let Some(output) = &self.output {
            history.push(self.message(
                format!("{}:output", self.task_id),
                "ROLE_AGENT",
                vec![json!({ "text": output })],
            ));
        }
        if let Some(keep) = history_length {
            let drop = history.len().saturating_sub(keep);
            history.drain(..drop);
        }
        json!({
            "id": self.task_id.to_string(),
            "contextId": self.context_id.to_string(),
            "status": self.status(),
            "artifacts": if include_artifacts { self.artifacts.clone() } else { Vec::new() },
            "history": history,
            "metadata": { "tah_seq": self.last_seq },
        })
    }

    /// Whether the run, as far as its events went, is over or waits for answers only: where a
    /// blocking send answers and a stream ends.
    pub fn settled(&self) -> bool {
        self.state.is_terminal() || self.state == TaskState::InputRequired
    }
}

/// What a user message's parts carry: its text (the text parts, joined), and its answers (the
/// data parts).
#[derive(Debug, Default, PartialEq)]
pub struct Input {
    pub text: Option<String>,
    pub answers: Vec<Answer>,
}

/// An answer to a call that waits.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Decision {
        call_id: String,
        allow: bool,
        reason: Option<String>,
    },
    Output {
        call_id: String,
        output: String,
    },
}

impl Answer {
    pub fn call_id(&self) -> &str {
        match self {
            Answer::Decision { call_id, .. } | Answer::Output { call_id, .. } => call_id,
        }
    }
}

/// Why a message's parts are refused: bad parameters, or a content type tah does not take.
#[derive(Debug, PartialEq)]
pub enum PartsError {
    Invalid(String),
    ContentType(String),
}

/// Reads a user message's `parts`.
pub fn read_parts(parts: &Value) -> Result<Input, PartsError> {
    let invalid = |m: &str| PartsError::Invalid(m.to_string());
    let Some(parts) = parts.as_array() else {
        return Err(invalid("message.parts must be an array"));
    };
    if parts.is_empty() {
        return Err(invalid("message.parts must not be empty"));
    }
    let mut texts = Vec::new();
    let mut answers = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let Some(object) = part.as_object() else {
            return Err(PartsError::Invalid(format!(
                "message.parts[{i}] must be an object"
            )));
        };
        if let Some(text) = object.get("text") {
            let Some(text) = text.as_str() else {
                return Err(PartsError::Invalid(format!(
                    "message.parts[{i}].text must be a string"
                )));
            };
            texts.push(text.to_string());
        } else if let Some(data) = object.get("data") {
            answers.push(read_answer(i, data)?);
        } else if object.contains_key("url") || object.contains_key("raw") {
            return Err(PartsError::ContentType(format!(
                "message.parts[{i}]: file parts (url, raw) are not supported; send text, or a \
                 data part that answers a call"
            )));
        } else {
            return Err(PartsError::Invalid(format!(
                "message.parts[{i}] has none of text, data, url, raw"
            )));
        }
    }
    let text = (!texts.is_empty()).then(|| texts.join("\n"));
    Ok(Input { text, answers })
}

fn read_answer(i: usize, data: &Value) -> Result<Answer, PartsError> {
    let invalid = |m: String| PartsError::Invalid(format!("message.parts[{i}].data: {m}"));
    let Some(data) = data.as_object() else {
        return Err(invalid(
            "must be an object {call_id, decision|output}".into(),
        ));
    };
    let Some(call_id) = data.get("call_id").and_then(Value::as_str) else {
        return Err(invalid("call_id (a string) is required".into()));
    };
    let call_id = call_id.to_string();
    for key in data.keys() {
        if !["call_id", "decision", "reason", "output"].contains(&key.as_str()) {
            return Err(invalid(format!(
                "{key:?} is not supported (call_id, decision, reason, output)"
            )));
        }
    }
    match (data.get("decision"), data.get("output")) {
        (Some(decision), None) => {
            let allow = match decision.as_str() {
                Some("allow") => true,
                Some("deny") => false,
                _ => return Err(invalid("decision must be \"allow\" or \"deny\"".into())),
            };
            let reason = match data.get("reason") {
                None | Some(Value::Null) => None,
                Some(Value::String(reason)) => Some(reason.clone()),
                Some(_) => return Err(invalid("reason must be a string".into())),
            };
            Ok(Answer::Decision {
                call_id,
                allow,
                reason,
            })
        }
        (None, Some(output)) => {
            if data.contains_key("reason") {
                return Err(invalid("reason goes with a decision, not an output".into()));
            }
            let output = match output {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            Ok(Answer::Output { call_id, output })
        }
        (Some(_), Some(_)) => Err(invalid("give a decision or an output, not both".into())),
        (None, None) => Err(invalid("a decision or an output is required".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Decision, ResolvedBy, RunKind};
    use crate::protocols::calls::tests::Log;

    fn run_of(log: &Log) -> RunRecord {
        let mut run = RunRecord::started(Uuid::from_u128(1), RunKind::Run, Some("hi".into()), 10);
        run.id = log.run_id;
        run
    }

    fn frames(log: &Log) -> (TaskView, Vec<Value>) {
        let mut view = TaskView::new(&run_of(log), "http://h");
        let frames = log.events.iter().filter_map(|e| view.push(e)).collect();
        (view, frames)
    }

    #[test]
    fn a_turn_is_a_task_then_its_answer_as_an_artifact_then_completed() {
        let (log, _, second) = Log::reasoned_turn(&["hm"], &[], &["all ", "done"]);
        let (view, frames) = frames(&log);
        assert_eq!(frames.len(), 3, "{frames:#?}");
        assert_eq!(frames[0]["task"]["status"]["state"], "TASK_STATE_WORKING");
        assert_eq!(frames[0]["task"]["metadata"]["tah_seq"], 10);
        let artifact = &frames[1]["artifactUpdate"]["artifact"];
        assert_eq!(artifact["artifactId"], format!("text-{second}"));
        assert_eq!(artifact["parts"][0]["text"], "all done");
        let status = &frames[2]["statusUpdate"]["status"];
        assert_eq!(status["state"], "TASK_STATE_COMPLETED");
        assert_eq!(status["message"]["parts"][0]["text"], "all done");
        let seqs: Vec<i64> = frames
            .iter()
            .map(|f| {
                let inner = f.as_object().unwrap().values().next().unwrap();
                inner["metadata"]["tah_seq"].as_i64().unwrap()
            })
            .collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
        let task = view.task(None, true);
        assert_eq!(task["history"].as_array().unwrap().len(), 2);
        assert_eq!(task["history"][0]["role"], "ROLE_USER");
        assert_eq!(task["artifacts"].as_array().unwrap().len(), 1);
        assert_eq!(
            view.task(Some(1), false)["history"][0]["role"],
            "ROLE_AGENT"
        );
        assert_eq!(view.task(Some(0), false)["history"], json!([]));
    }

    #[test]
    fn a_call_that_waits_is_input_required_and_its_answer_working_again() {
        let mut log = Log::new();
        let step = log.step(1);
        log.completed(step, "", &[("c1", "write_file")]);
        log.ask("c1");
        let (view, frames) = frames(&log);
        let last = &frames.last().unwrap()["statusUpdate"]["status"];
        assert_eq!(last["state"], "TASK_STATE_INPUT_REQUIRED");
        let data = &last["message"]["parts"][1]["data"];
        assert_eq!(data["call_id"], "c1");
        assert_eq!(data["tool"], "write_file");
        assert_eq!(data["kind"], "approval");
        assert!(view.settled());
        log.resolve("c1", Decision::Allow, ResolvedBy::User);
        let (view, frames) = self::frames(&log);
        assert_eq!(
            frames.last().unwrap()["statusUpdate"]["status"]["state"],
            "TASK_STATE_WORKING"
        );
        assert!(!view.settled());
    }

    #[test]
    fn parts_are_text_or_answers_and_nothing_else() {
        let input = read_parts(&json!([{"text": "a"}, {"text": "b"}])).unwrap();
        assert_eq!(input.text.as_deref(), Some("a\nb"));
        let input = read_parts(&json!([
            {"data": {"call_id": "c1", "decision": "deny", "reason": "no"}},
            {"data": {"call_id": "c2", "output": {"x": 1}}},
        ]))
        .unwrap();
        assert_eq!(
            input.answers,
            vec![
                Answer::Decision {
                    call_id: "c1".into(),
                    allow: false,
                    reason: Some("no".into())
                },
                Answer::Output {
                    call_id: "c2".into(),
                    output: "{\"x\":1}".into()
                }
            ]
        );
        assert!(matches!(
            read_parts(&json!([{"url": "http://x"}])),
            Err(PartsError::ContentType(_))
        ));
        for bad in [
            json!([]),
            json!({}),
            json!([{"data": {"decision": "allow"}}]),
            json!([{"data": {"call_id": "c", "decision": "maybe"}}]),
            json!([{"data": {"call_id": "c", "decision": "allow", "output": "x"}}]),
            json!([{"data": {"call_id": "c", "extra": 1, "output": "x"}}]),
            json!([{"text": 3}]),
            json!([{}]),
        ] {
            assert!(
                matches!(read_parts(&bad), Err(PartsError::Invalid(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn state_names_parse_and_the_unused_ones_match_nothing() {
        assert_eq!(
            TaskState::parse("TASK_STATE_WORKING"),
            Ok(Some(TaskState::Working))
        );
        assert_eq!(TaskState::parse("TASK_STATE_REJECTED"), Ok(None));
        assert!(TaskState::parse("working").is_err());
    }
}
