//! Running the tool calls of one model reply. Each call is first admitted by the journal
//! (the session decides: run it, refuse it, or make it wait for a human's approval or a
//! client's result). Admitted calls run concurrently, at most `tool_concurrency` at once;
//! answers to waiting calls arrive as they come. Every start and finish is recorded when it
//! happens, and the results join the history in the order of the calls.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use uuid::Uuid;

use super::journal::{AgentError, Journal, Redactor};
use super::turn::AgentDeps;
use crate::model::{ToolCall, Usage};
use crate::tools::ToolOutput;

/// What the session decided about a call.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// Run it now, with this call (an approval may have replaced its input). `decided` is the
    /// subject the policy or a human decided on, when one was read: a file tool refuses a path
    /// that leads elsewhere by the time it runs.
    Run {
        step_id: Uuid,
        call: ToolCall,
        decided: Option<String>,
    },
    /// It does not run; this is its result.
    Refused { step_id: Uuid, output: ToolOutput },
    /// It waits for an answer, which [`Journal::next_answer`] gives.
    Waits { step_id: Uuid },
}

/// The answer to a call that waited.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub call_id: String,
    pub verdict: Verdict,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Approved: run it (with this call), as decided on `decided` (see [`Admission::Run`]).
    Run {
        call: ToolCall,
        decided: Option<String>,
    },
    /// Its result: a denial, a timeout, or what a client sent.
    Result(ToolOutput),
}

type Running<'a> = Pin<Box<dyn Future<Output = (usize, Uuid, ToolCall, ToolOutput)> + Send + 'a>>;

/// Runs `calls` (the calls of one reply still without a result) to their results.
pub(super) async fn run_calls<J: Journal>(
    journal: &mut J,
    deps: &AgentDeps,
    concurrency: usize,
    calls: Vec<ToolCall>,
    cancel: &CancellationToken,
    (usage, steps): (Usage, i64),
) -> Result<(), AgentError<J::Error>> {
    let cancelled = || AgentError::Cancelled { usage, steps };
    let redactor = journal.redactor();
    let mut results: Vec<Option<ToolOutput>> = vec![None; calls.len()];
    let mut ready: VecDeque<(usize, Uuid, ToolCall, Option<String>)> = VecDeque::new();
    // Calls that wait for an answer, by call id: their position and step.
    let mut waiting: HashMap<String, (usize, Uuid)> = HashMap::new();
    for (index, call) in calls.iter().enumerate() {
        if cancel.is_cancelled() {
            return Err(cancelled());
        }
        match journal.admit(call).await? {
            Admission::Run {
                step_id,
                call,
                decided,
            } => ready.push_back((index, step_id, call, decided)),
            Admission::Refused { step_id, output } => {
                let output = redacted(redactor.as_ref(), output);
                journal.tool_finished(step_id, call, &output).await?;
                results[index] = Some(output);
            }
            Admission::Waits { step_id } => {
                waiting.insert(call.id.clone(), (index, step_id));
            }
        }
    }
    let mut appended = 0;
    let mut running: FuturesUnordered<Running<'_>> = FuturesUnordered::new();
    loop {
        appended = append_ready(journal, &calls, &results, appended).await?;
        while running.len() < concurrency.max(1) {
            let Some((index, step_id, call, decided)) = ready.pop_front() else {
                break;
            };
            if cancel.is_cancelled() {
                return Err(cancelled());
            }
            journal.tool_started(step_id, &call).await?;
            let tools = &deps.tools;
            let context = deps.tool_context.for_call(&call.id, decided.as_deref());
            let span = crate::telemetry::tool_span(journal.session_id(), &call);
            let redactor = redactor.clone();
            running.push(Box::pin(async move {
                let started = std::time::Instant::now();
                let output = tools
                    .execute(&context, &call)
                    .instrument(span.clone())
                    .await;
                // Before anything sees it: the trace, the journal, the model.
                let output = redacted(redactor.as_ref(), output);
                crate::metrics::tool_call(&call.name, output.is_error, started.elapsed());
                crate::telemetry::tool_finished(&span, &output);
                (index, step_id, call, output)
            }));
        }
        if running.is_empty() && waiting.is_empty() {
            break;
        }
        journal.waiting().await?;
        tokio::select! {
            Some((index, step_id, call, output)) = running.next(), if !running.is_empty() => {
                journal.tool_finished(step_id, &call, &output).await?;
                results[index] = Some(output);
            }
            answer = journal.next_answer(), if !waiting.is_empty() => {
                let Answer { call_id, verdict } = answer?;
                let Some((index, step_id)) = waiting.remove(&call_id) else {
                    continue;
                };
                match verdict {
                    Verdict::Run { call, decided } => {
                        ready.push_back((index, step_id, call, decided))
                    }
                    Verdict::Result(output) => {
                        let output = redacted(redactor.as_ref(), output);
                        journal.tool_finished(step_id, &calls[index], &output).await?;
                        results[index] = Some(output);
                    }
                }
            }
            _ = cancel.cancelled() => return Err(cancelled()),
        }
    }
    append_ready(journal, &calls, &results, appended).await?;
    Ok(())
}

/// `output` with the secrets `redactor` knows taken out.
fn redacted(redactor: Option<&Redactor>, mut output: ToolOutput) -> ToolOutput {
    if let Some(clean) = redactor.and_then(|redact| redact(&output.output)) {
        output.output = clean;
    }
    output
}

/// Appends the results that are ready and follow every earlier call's; returns how many calls
/// have their result in the history now.
async fn append_ready<J: Journal>(
    journal: &mut J,
    calls: &[ToolCall],
    results: &[Option<ToolOutput>],
    appended: usize,
) -> Result<usize, J::Error> {
    let upto = appended
        + results[appended..]
            .iter()
            .take_while(|r| r.is_some())
            .count();
    if upto > appended {
        let batch: Vec<(ToolCall, ToolOutput)> = calls[appended..upto]
            .iter()
            .zip(results[appended..upto].iter().flatten())
            .map(|(call, output)| (call.clone(), output.clone()))
            .collect();
        journal.tool_results(&batch, upto == calls.len()).await?;
    }
    Ok(upto)
}
