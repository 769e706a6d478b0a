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

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use uuid::Uuid;

use super::command::{RunRequest, RunStarted, RunStopped};
use super::run_permit::RunPermit;
use super::sessions::Sessions;
use super::SessionError;
use crate::model::{self, RunResult, RunStatus, SessionRecord, ToolSchema};
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

/// The sub-agent sessions a top-level run and its sub-agents may still start.
#[derive(Debug)]
pub struct Tree {
    limit: u32,
    started: AtomicU32,
}

impl Tree {
    /// The tree of a top-level run, which may start `limit` sub-agents.
    pub fn new(limit: u32) -> Arc<Tree> {
        Arc::new(Tree {
            limit,
            started: AtomicU32::new(0),
        })
    }

    /// Counts one more sub-agent; false when the tree has started all it may.
    fn start_one(&self) -> bool {
        self.started
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .is_ok()
    }
}

/// A run's place in a tree of sub-agents: the tree its `task` calls count against, and the
/// run's own permit (lent to its children while it waits for them).
#[derive(Debug, Clone)]
pub struct Lineage {
    pub(super) tree: Arc<Tree>,
    pub(super) permit: Arc<RunPermit>,
}

/// The children of one run's `task` calls, shared by the run's journal (which names each child
/// when its call starts, and records how it ended) and the tool (which runs it).
pub(super) struct Children {
    by_call: Mutex<HashMap<String, Named>>,
    tree: Arc<Tree>,
}

/// What a `task` call that started was given.
#[derive(Clone, Copy)]
enum Named {
    Child(Child),
    /// No session: the tree has started all the sub-agents it may.
    OverLimit,
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
    /// The children of a run whose `task` calls count against `tree`.
    pub fn new(tree: Arc<Tree>) -> Children {
        Children {
            by_call: Mutex::default(),
            tree,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Named>> {
        // Plain data behind the lock, never held across an await.
        self.by_call.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Names the child of a `task` call that starts: `existing` if an earlier attempt of the
    /// call started one, else a new session if the tree may start one more (`None`: it may
    /// not).
    pub fn start(&self, call_id: &str, existing: Option<Uuid>) -> Option<Uuid> {
        let named = match existing {
            Some(session_id) => Named::Child(Child::of(session_id, true)),
            None if self.tree.start_one() => Named::Child(Child::of(model::new_id(), false)),
            None => Named::OverLimit,
        };
        self.lock().insert(call_id.to_string(), named);
        match named {
            Named::Child(child) => Some(child.session_id),
            Named::OverLimit => None,
        }
    }

    fn child_of(&self, call_id: &str) -> Result<Child, ToolError> {
        match self.lock().get(call_id).copied() {
            Some(Named::Child(child)) => Ok(child),
            Some(Named::OverLimit) => Err(ToolError(format!(
                "no sub-agent was started: this run and its sub-agents have started the {} \
                 sub-agents a run may start; do this part of the work yourself",
                self.tree.limit
            ))),
            None => Err(ToolError(
                "the sub-agent could not be started: its call was not recorded".to_string(),
            )),
        }
    }

    fn ended(&self, call_id: &str, status: RunStatus) {
        if let Some(Named::Child(child)) = self.lock().get_mut(call_id) {
            child.status = Some(status);
        }
    }

    /// The child of a call that finished, and how its run ended (`failed` when it never ran).
    pub fn finish(&self, call_id: &str) -> Option<(Uuid, RunStatus)> {
        match self.lock().remove(call_id)? {
            Named::Child(child) => {
                Some((child.session_id, child.status.unwrap_or(RunStatus::Failed)))
            }
            Named::OverLimit => None,
        }
    }

    /// The children whose calls never finished (the parent's run was cancelled).
    pub fn unfinished(&self) -> Vec<(String, Uuid)> {
        self.lock()
            .drain()
            .filter_map(|(call_id, named)| match named {
                Named::Child(child) => Some((call_id, child.session_id)),
                Named::OverLimit => None,
            })
            .collect()
    }
}

impl Child {
    fn of(session_id: Uuid, exists: bool) -> Child {
        Child {
            session_id,
            exists,
            status: None,
        }
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
        let call_id = ctx.call_id.as_deref().unwrap_or_default();
        let child = self.children.child_of(call_id)?;
        let child_id = child.session_id;
        if !child.exists {
            self.sessions
                .create_child(&self.parent, child_id, call_id, description)
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
