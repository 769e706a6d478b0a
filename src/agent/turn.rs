//! One run of the default agent loop, with `max_steps` and cancellation.

use std::borrow::Cow;
use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use tokio_util::sync::CancellationToken;

use super::budget::TokenBudget;
use super::calls::run_calls;
#[cfg(test)]
use super::calls::Verdict;
use super::compaction::{self, CompactError};
use super::context;
use super::journal::{AgentError, Completion, Journal};
use crate::llm::providers::ModelRef;
use crate::llm::{LlmError, ModelClient, ModelRequest, Purpose, StreamItem};
use crate::model::{AgentTag, FinishReason, LlmRequestDescriptor, Message, Role, ToolCall, Usage};
use crate::telemetry;
use crate::tools::{ToolContext, ToolRegistry};

/// The configuration in force for a run: always the server's current one, also for sessions
/// created under an earlier one.
#[derive(Debug, Clone)]
pub struct AgentSettings {
    pub system_prompt: String,
    /// LLM calls per run at most; `None` = unlimited.
    pub max_steps: Option<u32>,
    /// Character budget of each request; `None` = send the full history.
    pub context_chars: Option<usize>,
    /// Calls of one reply that run at once at most.
    pub tool_concurrency: usize,
    /// Token budgets: the server's defaults here, the run's own once its session is known.
    pub budget: TokenBudget,
    /// The agent version the run runs, and its model: what each step's descriptor records.
    pub agent: AgentTag,
    pub model: ModelRef,
}

/// What the loop needs besides the session.
#[derive(Clone)]
pub struct AgentDeps {
    pub model: Arc<dyn ModelClient>,
    pub tools: ToolRegistry,
    /// The workspace tool calls run in.
    pub tool_context: ToolContext,
}

/// How a run ended without error.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutcome {
    pub text: String,
    /// The model's last finish reason, or `max_steps` or `budget`.
    pub finish_reason: FinishReason,
    /// For a run a budget stopped: the limit it reached, in words.
    pub limit: Option<String>,
    pub usage: Usage,
    pub steps: i64,
}

/// Runs the loop until the model answers without tool calls. With `input` (a new turn), the
/// user message is appended first, after compacting the earlier turns when the turn's first
/// request would be over budget. Tool calls of the current turn that have no result yet (an
/// interrupted turn being resumed) are run before the next model call.
pub async fn run_turn<J: Journal>(
    journal: &mut J,
    deps: &AgentDeps,
    settings: &AgentSettings,
    input: Option<String>,
    cancel: &CancellationToken,
) -> Result<TurnOutcome, AgentError<J::Error>> {
    let mut usage = Usage::default();
    let mut steps: i64 = 0;
    let mut last_text = String::new();
    if let Some(input) = input {
        if let Some(budget) = settings.context_chars {
            auto_compact(journal, deps, settings, &input, budget, cancel, &mut usage).await?;
        }
        journal.user_message(input).await?;
    }
    loop {
        let calls = pending_calls(journal.history());
        if !calls.is_empty() {
            let concurrency = settings.tool_concurrency;
            run_calls(journal, deps, concurrency, calls, cancel, (usage, steps)).await?;
        }
        if cancel.is_cancelled() {
            return Err(AgentError::Cancelled { usage, steps });
        }
        // A step boundary: what the user sent meanwhile joins the turn.
        for input in journal.take_queued() {
            journal.queued_message(input).await?;
        }
        if settings
            .max_steps
            .is_some_and(|max| steps >= i64::from(max))
        {
            return Ok(TurnOutcome {
                text: last_text,
                finish_reason: FinishReason::MaxSteps,
                limit: None,
                usage,
                steps,
            });
        }
        let limit = match settings.budget.exceeded(usage) {
            Some(limit) => Some(limit),
            None => journal.spend_limit().await?,
        };
        if let Some(limit) = limit {
            return Ok(TurnOutcome {
                text: last_text,
                finish_reason: FinishReason::Budget,
                limit: Some(limit),
                usage,
                steps,
            });
        }

        // The request borrows the history: the client encodes it into the stream it returns
        // (nothing is sent before the stream is polled), and the step is recorded after that.
        let history = journal.history();
        let (messages, stats) =
            context::prepare_context(history, &settings.system_prompt, settings.context_chars);
        let tools = deps.tools.schemas();
        let descriptor = LlmRequestDescriptor {
            upto: history.len(),
            system_prompt: settings.system_prompt.clone(),
            budget: settings.context_chars,
            model: settings.model.model.clone(),
            provider: settings.model.provider.clone(),
            agent: Some(settings.agent.clone()),
            tools: tools.iter().map(|t| t.name.clone()).collect(),
            trim: stats.clone(),
        };
        let (provider, model) = (deps.model.name(), settings.model.model.as_str());
        let span = telemetry::chat_span(
            journal.session_id(),
            (provider, model, &settings.agent.name),
            &messages,
        );
        let mut stream = deps.model.stream(ModelRequest {
            messages,
            tools: tools.into_iter().map(Cow::Borrowed).collect(),
            purpose: Purpose::Turn,
        });
        let step_id = journal.llm_started(descriptor).await?;
        if stats.trimmed() {
            journal.context_trimmed(step_id, &stats).await?;
        }
        steps += 1;
        let mut timer = crate::metrics::LlmRequestTimer::start(provider, &settings.agent.name);
        let outcome = loop {
            // The pieces already received are taken at once; before waiting for more, what
            // was recorded of them is handed on. `None`: cancelled while waiting.
            let mut next = stream.next().now_or_never();
            if next.is_none() {
                journal.waiting().await?;
                next = tokio::select! {
                    item = stream.next() => Some(item),
                    _ = cancel.cancelled() => None,
                };
            }
            let item = match next {
                Some(item) if !cancel.is_cancelled() => item,
                _ => {
                    drop(stream);
                    timer.finish("cancelled", None);
                    telemetry::chat_cancelled(&span);
                    journal.llm_failed(step_id, "cancelled".to_string()).await?;
                    return Err(AgentError::Cancelled { usage, steps });
                }
            };
            if let Some(Ok(StreamItem::Delta(_) | StreamItem::Thinking(_))) = &item {
                timer.piece();
            }
            match item {
                Some(Ok(StreamItem::Delta(text))) => journal.llm_delta(step_id, text).await?,
                Some(Ok(StreamItem::Thinking(text))) => journal.llm_thinking(step_id, text).await?,
                Some(Ok(StreamItem::Retry { attempt, error })) => {
                    journal.llm_retry(step_id, attempt, error).await?
                }
                Some(Ok(StreamItem::Done(reply))) => break Ok(reply),
                Some(Err(error)) => break Err(error),
                None => {
                    break Err(LlmError::new(
                        deps.model.name(),
                        crate::llm::LlmErrorKind::Protocol,
                        "the reply ended without completing",
                    ))
                }
            }
        };
        let reply = match outcome {
            Ok(reply) => {
                timer.finish("ok", Some(reply.usage));
                telemetry::chat_done(&span, &reply);
                reply
            }
            Err(error) => {
                timer.finish("error", None);
                telemetry::chat_failed(&span, &error);
                journal.llm_failed(step_id, error.to_string()).await?;
                return Err(AgentError::Model {
                    error,
                    usage,
                    steps,
                });
            }
        };
        usage.add(reply.usage);
        let done = reply.tool_calls.is_empty();
        last_text = reply.text.clone();
        let message =
            Message::assistant(reply.text, reply.tool_calls).with_thinking(reply.thinking);
        let finish_reason = FinishReason::Model(reply.finish_reason);
        let completion = Completion {
            message,
            finish_reason: finish_reason.clone(),
            usage: reply.usage,
        };
        journal.llm_completed(step_id, completion).await?;
        // The model is done, unless the user sent more meanwhile: then it answers that too.
        let queued = if done {
            journal.take_queued()
        } else {
            Vec::new()
        };
        for input in &queued {
            journal.queued_message(input.clone()).await?;
        }
        if done && queued.is_empty() {
            return Ok(TurnOutcome {
                text: last_text,
                finish_reason,
                limit: None,
                usage,
                steps,
            });
        }
    }
}

/// Compacts the earlier turns when the turn's first request would exceed the budget: one
/// attempt; on failure the turn goes on and trimming does the rest.
async fn auto_compact<J: Journal>(
    journal: &mut J,
    deps: &AgentDeps,
    settings: &AgentSettings,
    input: &str,
    budget: usize,
    cancel: &CancellationToken,
    usage: &mut Usage,
) -> Result<(), AgentError<J::Error>> {
    let history = journal.history();
    if compaction::compactable_turns(history) == 0 {
        return Ok(());
    }
    let (messages, _) = context::prepare_context(history, &settings.system_prompt, None);
    let first_request =
        context::context_chars(&messages) + Message::new(Role::User, input).size_chars();
    if first_request <= budget {
        return Ok(());
    }
    // The summary is a model call: what was recorded (the run's start) is handed on first.
    journal.waiting().await?;
    match compaction::summarize(deps, journal.history(), cancel).await {
        Ok(summary) => {
            usage.add(summary.usage);
            journal.summary_appended(summary, true).await?;
        }
        Err(CompactError::Cancelled) => {
            return Err(AgentError::Cancelled {
                usage: *usage,
                steps: 0,
            })
        }
        Err(CompactError::Model(error)) => journal.compact_failed(error.to_string()).await?,
    }
    Ok(())
}

/// Tool calls of the current turn (after the last user message) that have no result yet.
fn pending_calls(history: &[Message]) -> Vec<ToolCall> {
    let start = history
        .iter()
        .rposition(|m| m.role == Role::User)
        .unwrap_or(0);
    context::dangling_tool_calls(&history[start..])
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use async_trait::async_trait;
    use uuid::Uuid;

    use super::*;
    use crate::agent::compaction::Summary;
    use crate::agent::context::TrimStats;
    use crate::agent::{Admission, Answer};
    use crate::llm::mock::MockModel;
    use crate::tools::ToolOutput;

    /// A journal that keeps the history in memory and logs what the loop reported.
    #[derive(Default)]
    struct MemoryJournal {
        history: Vec<Message>,
        log: Vec<String>,
        /// Refuse to record this fact (by its log name).
        refuse: Option<&'static str>,
        admissions: std::collections::HashMap<String, Scripted>,
        answers: std::collections::VecDeque<Answer>,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("the journal refused to record {0}")]
    struct Refused(&'static str);

    impl MemoryJournal {
        fn note(&mut self, what: &'static str, detail: String) -> Result<(), Refused> {
            if self.refuse == Some(what) {
                return Err(Refused(what));
            }
            self.log.push(if detail.is_empty() {
                what.to_string()
            } else {
                format!("{what} {detail}")
            });
            Ok(())
        }

        fn push(&mut self, mut message: Message) {
            message.index = self.history.len() as i64;
            self.history.push(message);
        }

        /// The log without the text deltas, which depend on how the mock splits its text.
        fn facts(&self) -> Vec<&str> {
            self.log
                .iter()
                .map(String::as_str)
                .filter(|l| !l.starts_with("delta"))
                .collect()
        }
    }

    #[async_trait]
    impl Journal for MemoryJournal {
        type Error = Refused;

        fn history(&self) -> &[Message] {
            &self.history
        }

        async fn llm_started(&mut self, request: LlmRequestDescriptor) -> Result<Uuid, Refused> {
            self.note("llm_started", format!("upto={}", request.upto))?;
            Ok(Uuid::now_v7())
        }

        async fn llm_delta(&mut self, _: Uuid, text: String) -> Result<(), Refused> {
            self.note("delta", text)
        }

        async fn llm_thinking(&mut self, _: Uuid, text: String) -> Result<(), Refused> {
            self.note("thinking", text)
        }

        async fn llm_retry(&mut self, _: Uuid, attempt: u32, _: String) -> Result<(), Refused> {
            self.note("llm_retry", attempt.to_string())
        }

        async fn llm_completed(&mut self, _: Uuid, reply: Completion) -> Result<(), Refused> {
            self.note("llm_completed", reply.finish_reason.to_string())?;
            self.push(reply.message);
            Ok(())
        }

        async fn llm_failed(&mut self, _: Uuid, error: String) -> Result<(), Refused> {
            self.note("llm_failed", error)
        }

        async fn context_trimmed(&mut self, _: Uuid, _: &TrimStats) -> Result<(), Refused> {
            self.note("context_trimmed", String::new())
        }

        async fn user_message(&mut self, input: String) -> Result<(), Refused> {
            self.note("user_message", String::new())?;
            self.push(Message::new(Role::User, input));
            Ok(())
        }

        async fn summary_appended(&mut self, summary: Summary, _: bool) -> Result<(), Refused> {
            self.note("summary_appended", String::new())?;
            self.push(Message::new(Role::System, summary.content));
            Ok(())
        }

        async fn compact_failed(&mut self, error: String) -> Result<(), Refused> {
            self.note("compact_failed", error)
        }

        async fn admit(&mut self, call: &ToolCall) -> Result<Admission, Refused> {
            let step_id = Uuid::now_v7();
            Ok(match self.admissions.remove(&call.id) {
                Some(Scripted::Refuse(text)) => Admission::Refused {
                    step_id,
                    output: ToolOutput::error(text),
                },
                Some(Scripted::Wait) => {
                    self.note("waits", call.id.clone())?;
                    Admission::Waits { step_id }
                }
                None => Admission::Run {
                    step_id,
                    call: call.clone(),
                    decided: None,
                },
            })
        }

        async fn next_answer(&mut self) -> Result<Answer, Refused> {
            match self.answers.pop_front() {
                Some(answer) => Ok(answer),
                None => std::future::pending().await,
            }
        }

        async fn tool_started(&mut self, _: Uuid, call: &ToolCall) -> Result<(), Refused> {
            self.note("tool_started", call.name.clone())
        }

        async fn tool_finished(
            &mut self,
            _: Uuid,
            call: &ToolCall,
            output: &ToolOutput,
        ) -> Result<(), Refused> {
            let detail = format!("{} error={}", call.name, output.is_error);
            self.note("tool_finished", detail)
        }

        async fn tool_results(
            &mut self,
            results: &[(ToolCall, ToolOutput)],
            done: bool,
        ) -> Result<(), Refused> {
            let ids: Vec<&str> = results.iter().map(|(c, _)| c.id.as_str()).collect();
            self.note("tool_results", format!("{} done={done}", ids.join(",")))?;
            for (call, output) in results {
                self.push(Message::tool_result(&call.id, &output.output));
            }
            Ok(())
        }
    }

    /// How the journal admits a call, by id (unlisted calls run).
    enum Scripted {
        Refuse(&'static str),
        Wait,
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        deps: AgentDeps,
        settings: AgentSettings,
    }

    /// The mock model over a workspace with a README and a directory.
    fn fixture(max_steps: Option<u32>) -> Fixture {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("README.md"), "A tiny project. More here.").unwrap();
        std::fs::create_dir(dir.path().join("src")).unwrap();
        let workspace = crate::tools::Workspace::open(dir.path()).expect("workspace");
        let tools = ToolRegistry::builtin(
            &crate::tools::ToolSettings::default(),
            crate::tools::SandboxStatus::Unavailable("not needed here".into()),
        );
        Fixture {
            _dir: dir,
            deps: AgentDeps {
                model: Arc::new(MockModel::new(Duration::ZERO)),
                tools,
                tool_context: ToolContext::new(workspace),
            },
            settings: AgentSettings {
                system_prompt: "be brief".into(),
                max_steps,
                context_chars: None,
                tool_concurrency: 4,
                budget: TokenBudget::default(),
                agent: AgentTag::default(),
                model: ModelRef {
                    provider: "default".into(),
                    model: "mock".into(),
                },
            },
        }
    }

    impl Fixture {
        /// One turn over `journal` with `input` (`None`: a resume), cancelled only by `cancel`.
        async fn turn_until(
            &self,
            journal: &mut MemoryJournal,
            input: Option<&str>,
            cancel: &CancellationToken,
        ) -> Result<TurnOutcome, AgentError<Refused>> {
            let input = input.map(str::to_owned);
            run_turn(journal, &self.deps, &self.settings, input, cancel).await
        }

        /// One turn over `journal` with `input` (`None`: a resume), never cancelled.
        async fn turn(
            &self,
            journal: &mut MemoryJournal,
            input: Option<&str>,
        ) -> Result<TurnOutcome, AgentError<Refused>> {
            self.turn_until(journal, input, &CancellationToken::new())
                .await
        }
    }

    /// What a turn with input records first: the user's message, then a step in which the mock
    /// model lists the files.
    const OPENING: [&str; 6] = [
        "user_message",
        "llm_started upto=2",
        "llm_completed tool_calls",
        "tool_started list_files",
        "tool_finished list_files error=false",
        "tool_results call_2_0 done=true",
    ];

    /// A history of the system prompt alone.
    fn journal() -> MemoryJournal {
        let mut journal = MemoryJournal::default();
        journal.push(Message::new(Role::System, "be brief"));
        journal
    }

    /// A history that ends with the user's "look" and a reply asking for `calls`, none of them
    /// answered yet (as a resume finds it).
    fn journal_asking(calls: Vec<ToolCall>) -> MemoryJournal {
        let mut journal = journal();
        journal.push(Message::new(Role::User, "look"));
        journal.push(Message::assistant("", calls));
        journal
    }

    fn tool_call(id: &str, name: &str, arguments: serde_json::Value) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments,
        }
    }

    /// The first turn of a new session on the mock model, with `input`.
    async fn first_turn(max_steps: Option<u32>, input: &str) -> (TurnOutcome, MemoryJournal) {
        let f = fixture(max_steps);
        let mut journal = journal();
        let outcome = f
            .turn(&mut journal, Some(input))
            .await
            .expect("the turn ends");
        (outcome, journal)
    }

    #[tokio::test]
    async fn a_turn_runs_the_tools_the_model_asks_for_and_ends_with_its_answer() {
        let (outcome, journal) = first_turn(Some(20), "what is here?").await;
        assert_eq!(outcome.finish_reason, FinishReason::Model("stop".into()));
        assert_eq!(outcome.steps, 3);
        assert!(outcome.text.contains("what is here?"), "{}", outcome.text);
        assert!(outcome.text.contains("A tiny project."), "{}", outcome.text);
        assert_eq!(
            journal.facts(),
            [
                &OPENING[..],
                &[
                    "llm_started upto=4",
                    "llm_completed tool_calls",
                    "tool_started read_file",
                    "tool_finished read_file error=false",
                    "tool_results call_4_1 done=true",
                    "llm_started upto=6",
                    "llm_completed stop",
                ],
            ]
            .concat()
        );
        let streamed: String = journal
            .log
            .iter()
            .filter_map(|l| l.strip_prefix("delta "))
            .collect();
        assert_eq!(streamed, outcome.text);
        assert!(context::dangling_tool_calls(&journal.history).is_empty());
    }

    #[tokio::test]
    async fn thinking_streams_before_each_reply_and_stays_with_its_message() {
        let f = fixture(Some(20));
        let mut journal = journal();
        let input = Some("think about what is here".to_string());
        let cancel = CancellationToken::new();
        run_turn(&mut journal, &f.deps, &f.settings, input, &cancel)
            .await
            .expect("the turn ends");
        let replies: Vec<&Message> = journal
            .history
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .collect();
        assert_eq!(replies.len(), 3);
        assert!(replies.iter().all(|m| !m.thinking.is_empty()));
        // Each reply's thinking streams after its step starts and before it completes.
        let mut streamed = String::new();
        let mut per_step = Vec::new();
        for line in &journal.log {
            if line.starts_with("llm_started") {
                streamed.clear();
            } else if let Some(piece) = line.strip_prefix("thinking ") {
                streamed.push_str(piece);
            } else if line.starts_with("llm_completed") {
                per_step.push(streamed.clone());
            }
        }
        let kept: Vec<String> = replies.iter().map(|m| m.thinking_text()).collect();
        assert_eq!(per_step, kept);
    }

    #[tokio::test]
    async fn max_steps_ends_the_run_after_the_tools_of_its_last_step() {
        let (outcome, journal) = first_turn(Some(1), "hi").await;
        assert_eq!(outcome.finish_reason, FinishReason::MaxSteps);
        assert_eq!(outcome.steps, 1);
        assert_eq!(journal.facts(), OPENING);
    }

    #[tokio::test]
    async fn a_resume_runs_the_calls_left_without_a_result_first() {
        let f = fixture(Some(20));
        let call = tool_call("call_2_0", "list_files", serde_json::json!({"path": "."}));
        let mut journal = journal_asking(vec![call]);
        let outcome = f.turn(&mut journal, None).await.expect("the turn ends");
        assert_eq!(outcome.steps, 2);
        assert_eq!(
            &journal.facts()[..2],
            [
                "tool_started list_files",
                "tool_finished list_files error=false"
            ]
        );
        assert!(!journal.facts().contains(&"user_message"));
    }

    #[tokio::test]
    async fn a_cancelled_run_stops_before_calling_the_model() {
        let f = fixture(Some(20));
        let mut journal = journal();
        let cancel = CancellationToken::new();
        cancel.cancel();
        let result = f.turn_until(&mut journal, Some("hi"), &cancel).await;
        assert!(matches!(
            result,
            Err(AgentError::Cancelled { steps: 0, .. })
        ));
        assert_eq!(journal.facts(), ["user_message"]);
    }

    #[tokio::test]
    async fn a_fact_the_journal_cannot_record_ends_the_run_with_its_error() {
        let f = fixture(Some(20));
        let mut journal = journal();
        journal.refuse = Some("tool_results");
        let result = f.turn(&mut journal, Some("hi")).await;
        match result {
            Err(AgentError::Journal(Refused(what))) => assert_eq!(what, "tool_results"),
            other => panic!("expected the journal's error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn calls_run_as_admitted_and_their_results_join_in_call_order() {
        let f = fixture(Some(1));
        let call = |id: &str, name: &str| tool_call(id, name, serde_json::json!({"path": "."}));
        let mut journal = journal_asking(vec![
            call("a", "list_files"),
            call("b", "list_files"),
            call("c", "read_file"),
        ]);
        journal.admissions.insert("b".into(), Scripted::Wait);
        journal
            .admissions
            .insert("c".into(), Scripted::Refuse("not allowed"));
        journal.answers.push_back(Answer {
            call_id: "b".into(),
            verdict: Verdict::Run {
                call: call("b", "list_files"),
                decided: None,
            },
        });
        f.turn(&mut journal, None).await.expect("the turn ends");
        let facts = journal.facts();
        // The refused call is done at once; the approved one starts beside the allowed one.
        assert_eq!(
            facts[..4],
            [
                "waits b",
                "tool_finished read_file error=true",
                "tool_started list_files",
                "tool_started list_files",
            ][..],
            "{facts:?}"
        );
        let finished = facts
            .iter()
            .filter(|f| f.starts_with("tool_finished"))
            .count();
        assert_eq!(finished, 3, "{facts:?}");
        // However they finished, the results are in the order of the calls, all of them.
        let results: Vec<&str> = facts
            .iter()
            .filter_map(|f| f.strip_prefix("tool_results "))
            .collect();
        let joined: Vec<&str> = results
            .iter()
            .flat_map(|r| r.split(' ').next().unwrap_or("").split(','))
            .collect();
        assert_eq!(joined, ["a", "b", "c"], "{results:?}");
        assert!(results.last().unwrap().ends_with("done=true"));
        let tool_ids: Vec<&str> = journal
            .history
            .iter()
            .filter_map(|m| m.tool_call_id.as_deref())
            .collect();
        assert_eq!(tool_ids, ["a", "b", "c"]);
    }

    #[tokio::test]
    async fn a_call_that_waits_is_cancelled_with_the_run() {
        let f = fixture(Some(5));
        let call = tool_call("w", "shell", serde_json::json!({"command": "ls"}));
        let mut journal = journal_asking(vec![call]);
        journal.admissions.insert("w".into(), Scripted::Wait);
        let cancel = CancellationToken::new();
        let canceller = {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                cancel.cancel();
            })
        };
        let result = f.turn_until(&mut journal, None, &cancel).await;
        canceller.await.unwrap();
        assert!(
            matches!(result, Err(AgentError::Cancelled { .. })),
            "{result:?}"
        );
        assert_eq!(journal.facts(), ["waits w"]);
    }
}
