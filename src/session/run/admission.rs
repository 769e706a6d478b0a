//! Admission: the policy's decision on a tool call (allow, ask, deny; a client's tool waits
//! for its result), and the record of what it decided.

//! The session's side of tool calls during a run: it admits each call (the policy, approvals,
//! the client's tools), records answers as they come (and timeouts), and records every
//! start, finish and result. What the command handlers need to check answers is shared with
//! them through [`RunCalls`].

use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::board::{lock, lock_rules};
use super::Run;
use crate::agent::Admission;
use crate::model::{
    self, Action, Decision, EventKind, ResolvedBy, SessionState, StepStatus, ToolCall,
};
use crate::session::waiting::{refusal_output, Kind, Resolution};
use crate::session::ToolPolicy;
use crate::store::{StoreError, WriteOp};
use crate::tools::policy::{self, Rules};
use crate::tools::{Subject, ToolOutput};

/// What policy says of a call of `tool` without looking at its subject; `None` when a rule for
/// the tool has a subject pattern, so that the subject decides.
fn decide_unread(
    policy: &ToolPolicy,
    session_rules: &Mutex<Rules>,
    tool: &str,
) -> Option<policy::Decision> {
    let session_rules = lock_rules(session_rules);
    if policy.rules.read_subject_of(tool) || session_rules.read_subject_of(tool) {
        return None;
    }
    Some(policy::decide(
        &policy.rules,
        &session_rules,
        policy.mode,
        tool,
        &Subject::UNREAD,
    ))
}

/// Why the policy denies a call of `tool`, as the model and the client are told.
pub(in crate::session) fn denial_reason(decision: &policy::Decision, tool: &str) -> String {
    if decision.by_approval_mode {
        return "the call needs an approval, and this server's approval mode is deny: nobody \
                can approve calls here"
            .to_string();
    }
    let Some(rule) = &decision.rule else {
        return format!("the policy denies {tool}");
    };
    format!(
        "the {} policy denies {tool} (rule {}: {})",
        serde_json::to_value(rule.origin)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        rule.index,
        serde_json::to_string(&rule.rule).unwrap_or_default()
    )
}

fn expires(timeout: Option<Duration>) -> Option<DateTime<Utc>> {
    timeout.and_then(|t| chrono::Duration::from_std(t).ok().map(|t| model::now() + t))
}

impl Run<'_> {
    fn policy(&self) -> &ToolPolicy {
        &self.sink.deps.policy
    }

    pub(in crate::session) async fn admit_call(
        &mut self,
        call: &ToolCall,
    ) -> Result<Admission, StoreError> {
        let known = lock(&self.calls.waiting).get(&call.id).cloned();
        if let Some(item) = known {
            let step_id = item.step_id;
            if item.in_transit {
                // Its answer is on the way: it is recorded when the run takes it.
                return Ok(Admission::Waits { step_id });
            }
            return Ok(match (item.kind, item.resolution, item.result) {
                (Kind::Approval, Some(r), _) if r.decision.runs() => {
                    let edited = r.input.is_some();
                    let call = with_input(call, r.input);
                    let decided = if edited {
                        self.calls
                            .tools
                            .subject(&self.calls.context, &call)
                            .await
                            .text
                    } else {
                        item.subject
                    };
                    Admission::Run {
                        step_id,
                        call,
                        decided: Some(decided),
                    }
                }
                (Kind::Approval, Some(r), _) => Admission::Refused {
                    step_id,
                    output: refusal_output(&r),
                },
                (Kind::Client, _, Some(result)) => Admission::Refused {
                    step_id,
                    output: ToolOutput {
                        output: result.output,
                        is_error: result.is_error,
                        artifacts: Vec::new(),
                    },
                },
                (_, _, _) => Admission::Waits { step_id },
            });
        }
        let step_id = model::new_id();
        let run = self.core.last_run.as_ref().filter(|r| r.id == self.run_id);
        let client = match run {
            Some(run) => {
                model::client_tools_of(&self.core.record, run).find(|t| t.name == call.name)
            }
            None => self
                .core
                .record
                .options
                .client_tools
                .iter()
                .find(|t| t.name == call.name),
        };
        if let Some(client) = client {
            let timeout = client
                .timeout_s
                .map(Duration::from_secs)
                .or(self.policy().approval_timeout);
            let kind = EventKind::ToolClientRequested {
                step_id,
                call_id: call.id.clone(),
                tool: call.name.clone(),
                input: call.arguments.clone(),
                expires_at: expires(timeout),
            };
            self.wait_for(step_id, call, kind).await?;
            return Ok(Admission::Waits { step_id });
        }
        if self.calls.tools.get(&call.name).is_none() {
            // Not a tool of this run: running it answers the model with an error.
            return Ok(Admission::Run {
                step_id,
                call: call.clone(),
                decided: None,
            });
        }
        // The subject (a path resolved in the workspace, a command) is worked out only when a
        // rule for this tool looks at it, or for a human to be asked about the call.
        // Answered in the run this one resumes: the answer stands, unless the server now
        // denies the call.
        let decided = self.calls.decided.remove(&call.id);
        let policy = &self.sink.deps.policy;
        let mut subject = None;
        let decision = match decide_unread(policy, &self.calls.session_rules, &call.name) {
            Some(decision) => decision,
            None => {
                let read =
                    subject.insert(self.calls.tools.subject(&self.calls.context, call).await);
                policy::decide(
                    &policy.rules,
                    &lock_rules(&self.calls.session_rules),
                    policy.mode,
                    &call.name,
                    read,
                )
            }
        };
        if let Some(resolution) = decided.filter(|_| decision.action != Action::Deny) {
            return Ok(as_answered(step_id, call, resolution));
        }
        match decision.action {
            Action::Allow => Ok(Admission::Run {
                step_id,
                call: call.clone(),
                decided: subject.map(|s| s.text),
            }),
            Action::Deny => {
                let reason = denial_reason(&decision, &call.name);
                let resolution = Resolution {
                    call_id: call.id.clone(),
                    decision: Decision::Deny,
                    by: ResolvedBy::Policy,
                    reason: Some(reason),
                    input: None,
                };
                self.record_resolution(&resolution);
                self.flush_now().await?;
                Ok(Admission::Refused {
                    step_id,
                    output: refusal_output(&resolution),
                })
            }
            Action::Ask => {
                let subject = match subject {
                    Some(subject) => subject,
                    None => self.calls.tools.subject(&self.calls.context, call).await,
                };
                let kind = EventKind::ToolApprovalRequested {
                    step_id,
                    call_id: call.id.clone(),
                    tool: call.name.clone(),
                    input: call.arguments.clone(),
                    subject: subject.text,
                    expires_at: expires(self.policy().approval_timeout),
                };
                self.wait_for(step_id, call, kind).await?;
                Ok(Admission::Waits { step_id })
            }
        }
    }

    /// Records that a call waits: its step (pending), the request, and the session's state.
    async fn wait_for(
        &mut self,
        step_id: Uuid,
        call: &ToolCall,
        request: EventKind,
    ) -> Result<(), StoreError> {
        let step = self.tool_step(step_id, call, StepStatus::Pending);
        self.batch.ops.push(WriteOp::UpsertStep(step));
        self.batch.state(self.core, SessionState::WaitingTool, None);
        lock(&self.calls.waiting).apply(&request);
        self.batch.event(self.core, request);
        self.flush_now().await
    }
}

/// A call whose approval was answered: it runs (with the input the answer gave), or it is
/// refused as the answer says.
fn as_answered(step_id: Uuid, call: &ToolCall, resolution: Resolution) -> Admission {
    if resolution.decision.runs() {
        Admission::Run {
            step_id,
            call: with_input(call, resolution.input),
            decided: None,
        }
    } else {
        Admission::Refused {
            step_id,
            output: refusal_output(&resolution),
        }
    }
}

fn with_input(call: &ToolCall, input: Option<Value>) -> ToolCall {
    ToolCall {
        arguments: input.unwrap_or_else(|| call.arguments.clone()),
        ..call.clone()
    }
}
