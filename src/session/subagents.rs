//! Sub-agents: the `task` tool runs a child session to the end of its run and answers the
//! child's final text. The child has its own log, its parent as `parent_id`, and its parent's
//! prompt, tools, policy and workspace. The parent's log says which child each call started
//! (`subagent.started`) and how it ended (`subagent.finished`), and cancelling the parent's
//! run cancels the children it waits for.
//!
//! A top-level run and its sub-agents at every depth are one tree, which may start
//! `--max-subagents-per-run` sessions; past that `task` answers the model with an error. Each
//! child's run counts against `--max-concurrent-runs` with a permit of its own, which its
//! parent lends while it waits (see `run_permit`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use uuid::Uuid;

use super::command::{RunRequest, RunStarted, RunStopped};
use super::lineage::{input_schema, Child, Children, Lineage, DESCRIPTION, TASK};
use super::run_permit::RunPermit;
use super::sessions::Sessions;
use crate::model::{AgentId, AgentRecord, RunResult, RunStatus, SessionAgent, SessionRecord};
use crate::session::errors::SessionError;
use crate::tools::{Tool, ToolContext, ToolError, ToolResult};

/// The `task` tool of one run of `parent`.
pub(super) struct TaskTool {
    pub sessions: Sessions,
    pub parent: SessionRecord,
    /// The agents (ids) the parent's agent may delegate to, besides a copy of itself.
    pub subagents: Vec<Uuid>,
    pub children: Arc<Children>,
    /// The run's permit, lent to its children while it waits for them.
    pub permit: Arc<RunPermit>,
}

#[async_trait]
impl Tool for TaskTool {
    fn name(&self) -> &str {
        TASK
    }

    fn description(&self) -> String {
        DESCRIPTION.to_string()
    }

    fn input_schema(&self) -> Value {
        input_schema()
    }

    async fn call(&self, ctx: &ToolContext, input: &Value) -> Result<ToolResult, ToolError> {
        let text = |field: &str| {
            input
                .get(field)
                .and_then(Value::as_str)
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .ok_or_else(|| ToolError(format!("{field} must be a non-empty string")))
        };
        let (description, prompt) = (text("description")?, text("prompt")?);
        let agent = match input.get("agent") {
            None | Some(Value::Null) => None,
            Some(Value::String(name)) => Some(self.subagent(name.trim()).await?),
            Some(_) => return Err(ToolError("agent must be a string".to_string())),
        };
        let call_id = ctx.call_id.as_deref().unwrap_or_default();
        let child = self.children.child_of(call_id)?;
        let child_id = child.session_id;
        if !child.exists {
            self.sessions
                .create_child(&self.parent, child_id, call_id, description, agent)
                .await
                .map_err(|e| failed(child_id, "could not be created", &e))?;
        }
        // From here on the child is cancelled if this call is dropped (its run cancelled).
        let guard = CancelOnDrop {
            sessions: self.sessions.clone(),
            session_id: child_id,
            armed: true,
        };
        // The parent only waits now: its permit goes to the child, or back in line.
        let mut loan = self.permit.lend();
        let result = match loan.child_permit().await {
            Ok(permit) => self.run_child(child, prompt, permit).await,
            Err(_) => Err(failed(
                child_id,
                "was interrupted",
                &"the server is stopping",
            )),
        };
        loan.end().await;
        let result = result?;
        drop(guard.disarm());
        self.children.ended(call_id, result.status);
        match result.status {
            RunStatus::Completed => Ok(result.text.into()),
            status => Err(failed(
                child_id,
                status.as_str(),
                &result.error.as_deref().unwrap_or("no reason given"),
            )),
        }
    }
}

/// The error a `task` call answers when its sub-agent did not end well.
fn failed(child_id: Uuid, what: &str, error: &dyn std::fmt::Display) -> ToolError {
    ToolError(format!(
        "the sub-agent (session {child_id}) {what}: {error}"
    ))
}

impl TaskTool {
    /// The sub-agent `wanted` (a name or an id) names among the parent agent's, at its
    /// latest version.
    async fn subagent(&self, wanted: &str) -> Result<(SessionAgent, AgentRecord), ToolError> {
        let mut names = Vec::new();
        for id in &self.subagents {
            let Ok(agent) = self.sessions.agent(AgentId::Stored(*id), None).await else {
                continue;
            };
            if agent.spec.name == wanted || id.to_string() == wanted {
                let chosen = SessionAgent {
                    tag: agent.tag(),
                    follows_latest: false,
                };
                return Ok((chosen, agent));
            }
            names.push(agent.spec.name);
        }
        Err(ToolError(match names.is_empty() {
            true => format!(
                "agent {wanted:?}: this agent has no sub-agents; leave agent out to hand the work to a copy of this agent"
            ),
            false => format!(
                "agent {wanted:?} is not one of this agent's sub-agents ({})",
                names.join(", ")
            ),
        }))
    }

    /// Runs the child (or continues the one an interrupted attempt started) with its own
    /// permit, to the end of its run.
    async fn run_child(
        &self,
        child: Child,
        prompt: &str,
        permit: Arc<RunPermit>,
    ) -> Result<RunResult, ToolError> {
        let child_id = child.session_id;
        let lineage = Lineage {
            tree: self.children.tree.clone(),
            permit,
        };
        let started = if child.exists {
            self.resume(child_id, lineage).await
        } else {
            let request = RunRequest::subagent(prompt.to_string(), lineage);
            self.sessions.run(child_id, request).await
        }
        .map_err(|e| failed(child_id, "could not start", &e))?;
        let result = match started {
            RunStarted::Started { result, .. } => result.await,
            RunStarted::AlreadyCompleted(result) => Ok(Ok(result)),
            // A sub-agent's run never asks to be queued.
            RunStarted::Queued(_) => Ok(Err(RunStopped::Elsewhere)),
        };
        match result {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(RunStopped::Elsewhere)) | Err(_) => Err(failed(
                child_id,
                "was interrupted",
                &"the server is stopping",
            )),
            Ok(Err(RunStopped::Storage { error })) => {
                Err(failed(child_id, "stopped", &format!("storage: {error}")))
            }
        }
    }

    /// Continues the child an interrupted attempt of the call started: its interrupted run
    /// is resumed, or its result taken if it ended. While something else still runs it (an
    /// automatic resume, another replica), this waits for that run to end; while a dead
    /// replica's lease on it has not expired yet, it waits for the lease to expire.
    async fn resume(&self, child_id: Uuid, lineage: Lineage) -> Result<RunStarted, SessionError> {
        loop {
            let request = RunRequest::subagent_resume(lineage.clone());
            match self.sessions.run(child_id, request).await {
                Err(SessionError::Conflict(kind)) if kind.is_transient() => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => return other,
            }
        }
    }
}

/// Cancels a child whose parent's call is dropped before the child ended.
struct CancelOnDrop {
    sessions: Sessions,
    session_id: Uuid,
    armed: bool,
}

impl CancelOnDrop {
    fn disarm(mut self) -> Self {
        self.armed = false;
        self
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        // At shutdown the child's run is interrupted with its parent's, to be resumed.
        if !self.armed || self.sessions.deps().shutdown.is_cancelled() {
            return;
        }
        let (sessions, id) = (self.sessions.clone(), self.session_id);
        tokio::spawn(async move {
            if let Err(error) = sessions.cancel(id).await {
                tracing::warn!(session_id = %id, %error, "could not cancel a sub-agent");
            }
        });
    }
}
