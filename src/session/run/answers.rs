//! How the run takes the answers its board holds: each is recorded (and, for an approval
//! answered "always", the session's new rule) before the run acts on it; a call nobody
//! answered in time gets its timeout.

use std::time::Duration;

use serde_json::Value;

use super::board::{Given, Taken};
use super::Run;
use crate::agent::{Answer, Verdict};
use crate::model::{self, Decision, EventKind, ResolvedBy, ToolCall};
use crate::session::waiting::{refusal_output, unanswered_output, ClientResult, Kind, Resolution};
use crate::store::{StoreError, WriteOp};
use crate::tools::policy;
use crate::tools::{Subject, SubjectKind, ToolOutput};

impl Run<'_> {
    pub(in crate::session) async fn next_call_answer(&mut self) -> Result<Answer, StoreError> {
        loop {
            if let Some(taken) = self.board.next_taken() {
                if let Some(answer) = self.take_answer(taken).await? {
                    return Ok(answer);
                }
                continue;
            }
            let expiry = self.board.next_expiry();
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
                () = self.board.taken() => {}
                _ = sleep => {
                    if let Some((call_id, _)) = expiry {
                        return self.expire(&call_id).await;
                    }
                }
            }
        }
    }

    async fn take_answer(&mut self, msg: Taken) -> Result<Option<Answer>, StoreError> {
        let item = self.board.get(&msg.call_id);
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
                    if self.board.add_rule(rule.clone()) {
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
                self.board.settle(result.clone());
                if let Some(reply) = msg.reply {
                    self.board.owe_reply(msg.call_id.clone(), reply);
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
        let item = self.board.get(call_id);
        let kind = item.as_ref().map(|item| item.kind);
        let environment = item.and_then(|item| item.environment);
        let output = match kind {
            Some(Kind::Client) => {
                let output = match environment {
                    Some(environment) => ToolOutput::error(
                        crate::session::environments::no_worker_output(&environment),
                    ),
                    None => unanswered_output(Kind::Client),
                };
                self.board.settle(ClientResult {
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
                    answered_by: None,
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

    pub(super) fn record_resolution(&mut self, resolution: &Resolution) {
        self.board.resolve(resolution.clone());
        self.batch.event(
            self.core,
            EventKind::ToolApprovalResolved {
                call_id: resolution.call_id.clone(),
                decision: resolution.decision,
                by: resolution.by,
                reason: resolution.reason.clone(),
                input: resolution.input.clone(),
                answered_by: resolution.answered_by.clone(),
            },
        );
    }
}
