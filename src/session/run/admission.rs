//! Admission: the policy's decision on a tool call, as a pure [`admit`] (a client's tool
//! waits for its result; a tool the run does not have runs, to answer the model with an
//! error; otherwise the server's rules and the session's decide between allow, ask and deny,
//! and an answer given to the run a resume continues stands unless the policy now denies),
//! and apart from it, the record of what it decided.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use uuid::Uuid;

use super::Run;
use crate::agent::Admission;
use crate::model::waiting::Item;
use crate::model::{
    self, Action, ClientTool, Decision, EnvironmentKind, EventKind, ResolvedBy, SessionState,
    StepStatus, ToolCall, LOCAL_ENVIRONMENT,
};
use crate::session::deps::ToolPolicy;
use crate::session::waiting::{refusal_output, Kind, Resolution};
use crate::store::{StoreError, WriteOp};
use crate::tools::policy::{self, Rules};
use crate::tools::{Subject, ToolOutput};

/// Where a call runs.
enum Runs {
    /// On this server.
    Here,
    /// On a worker of this (`workers`) environment.
    Workers(String),
    /// The session's environment was deleted.
    Gone(String),
}

/// What admission decided of a call nobody asked about yet.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::session) enum Admit {
    /// A client's tool: the call waits for the client's result, for this long at most.
    Client { timeout: Option<Duration> },
    /// Not a tool of this run: running it answers the model with an error.
    Unknown,
    /// The policy allows it.
    Run,
    /// A human is asked.
    Ask,
    /// The policy denies it, for this reason.
    Deny(String),
    /// Answered in the run this one resumes: the answer stands.
    Answered(Resolution),
}

/// The call to admit, as the policy sees it.
pub(in crate::session) struct Proposed<'a> {
    pub tool: &'a str,
    /// The client's tool of that name, if a client runs it.
    pub client: Option<&'a ClientTool>,
    /// Whether the run has a tool of that name.
    pub known: bool,
    /// The call's subject, when the rules look at it ([`reads_subject`]).
    pub subject: Option<&'a Subject>,
    /// A person's answer to the same call in the run this one resumes.
    pub answered: Option<Resolution>,
}

/// Whether the rules for `tool` look at a call's subject (a path, a command), which is then
/// worked out before [`admit`] is asked.
pub(in crate::session) fn reads_subject(policy: &ToolPolicy, session: &Rules, tool: &str) -> bool {
    policy.rules.read_subject_of(tool) || session.read_subject_of(tool)
}

/// The policy's decision on a call: pure, nothing is recorded.
pub(in crate::session) fn admit(policy: &ToolPolicy, session: &Rules, call: Proposed<'_>) -> Admit {
    if let Some(client) = call.client {
        let timeout = client
            .timeout_s
            .map(Duration::from_secs)
            .or(policy.approval_timeout);
        return Admit::Client { timeout };
    }
    if !call.known {
        return Admit::Unknown;
    }
    let unread = Subject::UNREAD;
    let subject = call.subject.unwrap_or(&unread);
    let decision = policy::decide(&policy.rules, session, policy.mode, call.tool, subject);
    if let Some(resolution) = call.answered.filter(|_| decision.action != Action::Deny) {
        return Admit::Answered(resolution);
    }
    match decision.action {
        Action::Allow => Admit::Run,
        Action::Ask => Admit::Ask,
        Action::Deny => Admit::Deny(denial_reason(&decision, call.tool)),
    }
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
    pub(in crate::session) async fn admit_call(
        &mut self,
        call: &ToolCall,
    ) -> Result<Admission, StoreError> {
        if let Some(item) = self.board.get(&call.id) {
            return Ok(self.admit_known(call, item).await);
        }
        let step_id = model::new_id();
        let client = self.client_tool(&call.name);
        let known = self.calls.tools.get(&call.name).is_some();
        let policy = &self.sink.deps.policy;
        // The subject (a path resolved in the workspace, a command) is worked out only when a
        // rule for this tool looks at it, or for a human to be asked about the call.
        let reads = client.is_none()
            && known
            && self
                .board
                .with_rules(|rules| reads_subject(policy, rules, &call.name));
        let mut subject = match reads {
            true => Some(self.calls.tools.subject(&self.calls.context, call).await),
            false => None,
        };
        // Answered in the run this one resumes: the answer stands, unless the server now
        // denies the call.
        let answered = match (&client, known) {
            (None, true) => self.calls.decided.remove(&call.id),
            _ => None,
        };
        let proposed = Proposed {
            tool: &call.name,
            client: client.as_ref(),
            known,
            subject: subject.as_ref(),
            answered,
        };
        let admitted = self
            .board
            .with_rules(|rules| admit(policy, rules, proposed));
        let call = call.clone();
        let admitted = match (admitted, self.runs_on(&call.name).await?) {
            (admitted, Runs::Here) => admitted,
            (Admit::Deny(reason), _) => Admit::Deny(reason),
            (_, Runs::Gone(environment)) => {
                return Ok(Admission::Refused {
                    step_id,
                    output: ToolOutput::error(format!(
                        "the session's environment {environment:?} does not exist (any more): \
                         its built-in tools cannot run"
                    )),
                })
            }
            (Admit::Ask, Runs::Workers(_)) => Admit::Deny(
                "the call needs an approval, and approvals are not taken for the calls of a \
                 workers environment: allow or deny the tool in the policy"
                    .to_string(),
            ),
            (Admit::Answered(resolution), Runs::Workers(_)) if !resolution.decision.runs() => {
                Admit::Answered(resolution)
            }
            (_, Runs::Workers(environment)) => {
                let timeout = policy.approval_timeout;
                let expires_at = expires(timeout);
                let kind = EventKind::ToolClientRequested {
                    step_id,
                    call_id: call.id.clone(),
                    tool: call.name.clone(),
                    input: call.arguments.clone(),
                    expires_at,
                    environment: Some(environment.clone()),
                };
                self.wait_for(step_id, &call, kind).await?;
                crate::session::environments::queue_call(
                    self.sink.deps.store.as_ref(),
                    &self.core.record,
                    &environment,
                    &call,
                    expires_at,
                )
                .await?;
                return Ok(Admission::Waits { step_id });
            }
        };
        match admitted {
            Admit::Client { timeout } => {
                let kind = EventKind::ToolClientRequested {
                    step_id,
                    call_id: call.id.clone(),
                    tool: call.name.clone(),
                    input: call.arguments.clone(),
                    expires_at: expires(timeout),
                    environment: None,
                };
                self.wait_for(step_id, &call, kind).await?;
                Ok(Admission::Waits { step_id })
            }
            Admit::Unknown => Ok(Admission::Run {
                step_id,
                call,
                decided: None,
            }),
            Admit::Answered(resolution) => Ok(as_answered(step_id, &call, resolution)),
            Admit::Run => Ok(Admission::Run {
                step_id,
                call,
                decided: subject.map(|s| s.text),
            }),
            Admit::Deny(reason) => self.deny(step_id, &call.id, reason).await,
            Admit::Ask => self.ask(step_id, &call, subject.take()).await,
        }
    }

    /// Where a call of `tool` runs: a built-in tool's call of a session in a `workers`
    /// environment runs on one of its workers; everything else here.
    async fn runs_on(&self, tool: &str) -> Result<Runs, StoreError> {
        let record = &self.core.record;
        let name = match record.options.environment.as_deref() {
            Some(name) if name != LOCAL_ENVIRONMENT => name,
            _ => return Ok(Runs::Here),
        };
        if !crate::tools::builtin::NAMES.contains(&tool) || self.calls.tools.get(tool).is_none() {
            return Ok(Runs::Here);
        }
        let Some(store) = self.sink.deps.store.environments() else {
            return Ok(Runs::Here);
        };
        Ok(match store.environment(&record.tenant, name).await? {
            None => Runs::Gone(name.to_string()),
            Some(row) if row.kind == EnvironmentKind::Workers.as_str() => Runs::Workers(row.name),
            Some(_) => Runs::Here,
        })
    }

    /// Records that a human is asked about a call (about its subject, worked out now if the
    /// rules did not look at it).
    async fn ask(
        &mut self,
        step_id: Uuid,
        call: &ToolCall,
        subject: Option<Subject>,
    ) -> Result<Admission, StoreError> {
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
            expires_at: expires(self.sink.deps.policy.approval_timeout),
        };
        self.wait_for(step_id, call, kind).await?;
        Ok(Admission::Waits { step_id })
    }

    /// Records the policy's denial of a call, durable before the model is told.
    async fn deny(
        &mut self,
        step_id: Uuid,
        call_id: &str,
        reason: String,
    ) -> Result<Admission, StoreError> {
        let resolution = Resolution {
            call_id: call_id.to_string(),
            decision: Decision::Deny,
            by: ResolvedBy::Policy,
            reason: Some(reason),
            input: None,
            answered_by: None,
        };
        self.record_resolution(&resolution);
        self.flush_now().await?;
        Ok(Admission::Refused {
            step_id,
            output: refusal_output(&resolution),
        })
    }

    /// The client's tool of that name, if a client runs it: the run's own, or the session's,
    /// or the agent's (offered to the model among the run's tools).
    fn client_tool(&self, name: &str) -> Option<ClientTool> {
        let run = self.core.last_run.as_ref().filter(|r| r.id == self.run_id);
        match run {
            Some(run) => model::client_tools_of(&self.core.record, run).find(|t| t.name == name),
            None => self
                .core
                .record
                .options
                .client_tools
                .iter()
                .find(|t| t.name == name),
        }
        .or_else(|| self.calls.tools.get(name).and_then(|t| t.client_tool()))
        .cloned()
    }

    /// A call the board knows already (a continued run admits its calls again): it goes on as
    /// its answer says, or waits for one.
    async fn admit_known(&mut self, call: &ToolCall, item: Item) -> Admission {
        let step_id = item.step_id;
        if item.in_transit {
            // Its answer is on the way: it is recorded when the run takes it.
            return Admission::Waits { step_id };
        }
        match (item.kind, item.resolution, item.result) {
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
        self.board.apply(&request);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Rule;
    use crate::tools::policy::ApprovalMode;
    use crate::tools::SubjectKind;
    use serde_json::json;

    fn rule(tool: &str, subject: Option<&str>, action: Action) -> Rule {
        Rule {
            tool: tool.into(),
            subject: subject.map(str::to_string),
            action,
        }
    }

    fn policy(rules: Vec<Rule>, mode: ApprovalMode) -> ToolPolicy {
        ToolPolicy {
            rules: Rules::compile(rules).unwrap(),
            mode,
            approval_timeout: Some(Duration::from_secs(60)),
            worker_lease: Duration::from_secs(30),
        }
    }

    fn call(tool: &str) -> Proposed<'_> {
        Proposed {
            tool,
            client: None,
            known: true,
            subject: None,
            answered: None,
        }
    }

    fn command(text: &str) -> Subject {
        Subject {
            kind: SubjectKind::Command,
            text: text.into(),
        }
    }

    fn answered(decision: Decision) -> Resolution {
        Resolution {
            call_id: "a".into(),
            decision,
            by: ResolvedBy::User,
            reason: None,
            input: None,
            answered_by: None,
        }
    }

    #[test]
    fn without_rules_reading_tools_run_and_the_others_ask() {
        let server = policy(vec![], ApprovalMode::Ask);
        let none = Rules::default();
        assert_eq!(admit(&server, &none, call("read_file")), Admit::Run);
        assert_eq!(admit(&server, &none, call("shell")), Admit::Ask);
    }

    #[test]
    fn where_nobody_may_answer_an_ask_is_a_denial_that_says_so() {
        let server = policy(vec![], ApprovalMode::Deny);
        let Admit::Deny(reason) = admit(&server, &Rules::default(), call("shell")) else {
            panic!("denied");
        };
        assert!(reason.contains("approval mode is deny"), "{reason}");
    }

    #[test]
    fn the_most_restrictive_rule_wins_and_the_denial_names_it() {
        let server = policy(vec![rule("shell", None, Action::Allow)], ApprovalMode::Ask);
        let session = Rules::compile(vec![rule("shell", None, Action::Deny)]).unwrap();
        let Admit::Deny(reason) = admit(&server, &session, call("shell")) else {
            panic!("denied");
        };
        assert!(reason.contains("session policy denies shell"), "{reason}");
        assert_eq!(admit(&server, &Rules::default(), call("shell")), Admit::Run);
    }

    #[test]
    fn a_rule_with_a_pattern_reads_the_subject_and_decides_by_it() {
        let server = policy(
            vec![rule("shell", Some("rm *"), Action::Deny)],
            ApprovalMode::Ask,
        );
        let none = Rules::default();
        assert!(reads_subject(&server, &none, "shell"));
        assert!(!reads_subject(&server, &none, "read_file"));
        let rm = command("rm -rf /");
        let ls = command("ls");
        let with = |subject| Proposed {
            subject: Some(subject),
            ..call("shell")
        };
        assert!(matches!(admit(&server, &none, with(&rm)), Admit::Deny(_)));
        assert_eq!(admit(&server, &none, with(&ls)), Admit::Ask);
    }

    #[test]
    fn a_clients_tool_waits_for_its_result_as_long_as_it_says() {
        let server = policy(vec![rule("*", None, Action::Deny)], ApprovalMode::Ask);
        let tool = |timeout_s| ClientTool {
            name: "pick_color".into(),
            description: String::new(),
            input_schema: json!({"type": "object"}),
            timeout_s,
        };
        fn asked(tool: &ClientTool) -> Proposed<'_> {
            Proposed {
                client: Some(tool),
                known: false,
                ..call("pick_color")
            }
        }
        assert_eq!(
            admit(&server, &Rules::default(), asked(&tool(Some(5)))),
            Admit::Client {
                timeout: Some(Duration::from_secs(5))
            }
        );
        assert_eq!(
            admit(&server, &Rules::default(), asked(&tool(None))),
            Admit::Client {
                timeout: Some(Duration::from_secs(60))
            }
        );
    }

    #[test]
    fn a_tool_the_run_does_not_have_runs_to_answer_the_model_with_an_error() {
        let server = policy(vec![rule("*", None, Action::Deny)], ApprovalMode::Ask);
        let unknown = Proposed {
            known: false,
            ..call("nope")
        };
        assert_eq!(admit(&server, &Rules::default(), unknown), Admit::Unknown);
    }

    #[test]
    fn an_answer_from_the_resumed_run_stands_unless_the_policy_now_denies() {
        let server = policy(vec![], ApprovalMode::Ask);
        let resumed = |decision| Proposed {
            answered: Some(answered(decision)),
            ..call("shell")
        };
        assert_eq!(
            admit(&server, &Rules::default(), resumed(Decision::Allow)),
            Admit::Answered(answered(Decision::Allow))
        );
        assert_eq!(
            admit(&server, &Rules::default(), resumed(Decision::Deny)),
            Admit::Answered(answered(Decision::Deny))
        );
        let denying = policy(vec![rule("shell", None, Action::Deny)], ApprovalMode::Ask);
        assert!(matches!(
            admit(&denying, &Rules::default(), resumed(Decision::Allow)),
            Admit::Deny(_)
        ));
    }

    #[test]
    fn an_answered_call_runs_with_the_input_the_answer_gave_or_is_refused() {
        let call = ToolCall {
            id: "a".into(),
            name: "shell".into(),
            arguments: json!({"command": "ls"}),
        };
        let step_id = Uuid::nil();
        let edited = Resolution {
            input: Some(json!({"command": "ls -la"})),
            ..answered(Decision::Allow)
        };
        let Admission::Run { call: ran, .. } = as_answered(step_id, &call, edited) else {
            panic!("it runs");
        };
        assert_eq!(ran.arguments, json!({"command": "ls -la"}));
        let Admission::Refused { output, .. } =
            as_answered(step_id, &call, answered(Decision::Deny))
        else {
            panic!("it is refused");
        };
        assert!(output.is_error);
    }
}
