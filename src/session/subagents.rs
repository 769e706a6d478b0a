//! Sub-agents: the `task` tool runs a child session to the end of its run and answers the
//! child's final text. The child has its own log, its parent as `parent_id`, and its parent's
//! prompt, tools, policy and workspace; it runs under its parent's run permit. The parent's
//! log says which child each call started (`subagent.started`) and how it ended
//! (`subagent.finished`), and cancelling the parent's run cancels the children it waits for.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use uuid::Uuid;

use super::command::{RunRequest, RunStarted, RunStopped};
use super::sessions::Sessions;
use super::SessionError;
use crate::model::{self, RunStatus, SessionRecord, ToolSchema};
use crate::tools::{Tool, ToolContext, ToolError, ToolInfo, ToolResult, ToolSource};

/// `task` as the model is offered it.
pub(super) fn task_schema() -> ToolSchema {
    ToolSchema {
        name: TASK.to_string(),
        description: DESCRIPTION.to_string(),
        parameters: input_schema(),
    }
}

/// The tool's name.
pub const TASK: &str = "task";

/// The children of one run's `task` calls, shared by the run's journal (which names each child
/// when its call starts, and records how it ended) and the tool (which runs it).
#[derive(Default)]
pub(super) struct Children {
    by_call: Mutex<HashMap<String, Child>>,
}

#[derive(Clone, Copy)]
struct Child {
    session_id: Uuid,
    /// Whether the session exists already: the call runs again after an interruption, and its
    /// child is resumed rather than started anew.
    exists: bool,
    /// How its run ended, once it has.
    status: Option<RunStatus>,
}

impl Children {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Child>> {
        // Plain data behind the lock, never held across an await.
        self.by_call.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Names the child of a `task` call that starts: `existing` if an earlier attempt of the
    /// call started one, else a new session.
    pub fn start(&self, call_id: &str, existing: Option<Uuid>) -> Uuid {
        let session_id = existing.unwrap_or_else(model::new_id);
        let child = Child {
            session_id,
            exists: existing.is_some(),
            status: None,
        };
        self.lock().insert(call_id.to_string(), child);
        session_id
    }

    fn child_of(&self, call_id: &str) -> Option<Child> {
        self.lock().get(call_id).copied()
    }

    fn ended(&self, call_id: &str, status: RunStatus) {
        if let Some(child) = self.lock().get_mut(call_id) {
            child.status = Some(status);
        }
    }

    /// The child of a call that finished, and how its run ended (`failed` when it never ran).
    pub fn finish(&self, call_id: &str) -> Option<(Uuid, RunStatus)> {
        let child = self.lock().remove(call_id)?;
        Some((child.session_id, child.status.unwrap_or(RunStatus::Failed)))
    }

    /// The children whose calls never finished (the parent's run was cancelled).
    pub fn unfinished(&self) -> Vec<(String, Uuid)> {
        self.lock()
            .drain()
            .map(|(call_id, child)| (call_id, child.session_id))
            .collect()
    }
}

const DESCRIPTION: &str = "Hand a self-contained piece of work to a sub-agent: a new session \
    with the same tools, policy and workspace works on `prompt` until it is done, and its final \
    answer is returned. The sub-agent sees only `prompt`, so say everything it needs. Several \
    task calls in one reply run at the same time.";

fn input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "description": {
                "type": "string",
                "description": "A few words on what the sub-agent does, shown to people."
            },
            "prompt": {
                "type": "string",
                "description": "The whole task: all the sub-agent is told."
            }
        },
        "required": ["description", "prompt"],
        "additionalProperties": false
    })
}

/// `task` as `GET /v1/tools` lists it.
pub(super) fn task_info() -> ToolInfo {
    ToolInfo {
        name: TASK.to_string(),
        description: DESCRIPTION.to_string(),
        input_schema: input_schema(),
        source: ToolSource::Builtin,
        server: None,
        available: true,
        reason: None,
    }
}

/// The `task` tool of one run of `parent`.
pub(super) struct TaskTool {
    pub sessions: Sessions,
    pub parent: SessionRecord,
    pub children: Arc<Children>,
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
        let call_id = ctx.call_id.as_deref().unwrap_or_default();
        let Some(child) = self.children.child_of(call_id) else {
            return Err(ToolError(
                "the sub-agent could not be started: its call was not recorded".to_string(),
            ));
        };
        let child_id = child.session_id;
        let failed = |what: &str, error: &dyn std::fmt::Display| {
            ToolError(format!(
                "the sub-agent (session {child_id}) {what}: {error}"
            ))
        };
        if !child.exists {
            self.sessions
                .create_child(&self.parent, child_id, call_id, description)
                .await
                .map_err(|e| failed("could not be created", &e))?;
        }
        // From here on the child is cancelled if this call is dropped (its run cancelled).
        let guard = CancelOnDrop {
            sessions: self.sessions.clone(),
            session_id: child_id,
            armed: true,
        };
        let started = if child.exists {
            self.resume(child_id).await
        } else {
            let request = RunRequest::subagent(prompt.to_string());
            self.sessions.run(child_id, request).await
        }
        .map_err(|e| failed("could not start", &e))?;
        let result = match started {
            RunStarted::Started { result, .. } => result.await,
            RunStarted::AlreadyCompleted(result) => Ok(Ok(result)),
            // A sub-agent's run never asks to be queued.
            RunStarted::Queued(_) => Ok(Err(RunStopped::Elsewhere)),
        };
        let result = match result {
            Ok(Ok(result)) => result,
            Ok(Err(RunStopped::Elsewhere)) | Err(_) => {
                return Err(failed("was interrupted", &"the server is stopping"));
            }
            Ok(Err(RunStopped::Storage { error })) => {
                return Err(failed("stopped", &format!("storage: {error}")));
            }
        };
        drop(guard.disarm());
        self.children.ended(call_id, result.status);
        match result.status {
            RunStatus::Completed => Ok(result.text.into()),
            status => Err(failed(
                status.as_str(),
                &result.error.as_deref().unwrap_or("no reason given"),
            )),
        }
    }
}

impl TaskTool {
    /// Continues the child an interrupted attempt of the call started: its interrupted run
    /// is resumed, or its result taken if it ended. While something else still runs it (an
    /// automatic resume, another replica), this waits for that run to end; while a dead
    /// replica's lease on it has not expired yet, it waits for the lease to expire.
    async fn resume(&self, child_id: Uuid) -> Result<RunStarted, SessionError> {
        loop {
            let request = RunRequest::subagent_resume();
            match self.sessions.run(child_id, request).await {
                Err(SessionError::Conflict {
                    kind: "run-active" | "session-leased",
                    ..
                }) => {
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
