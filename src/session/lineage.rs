//! A run's lineage among sub-agents: the tree of sub-agent sessions a top-level run and its
//! sub-agents may still start, the children of one run's `task` calls, and `task` as the model
//! and `GET /v1/tools` see it. The tool itself, which runs a child session, is `subagents`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{json, Value};
use uuid::Uuid;

use super::run_permit::RunPermit;
use crate::model::{self, RunStatus, ToolSchema};
use crate::tools::{ToolError, ToolInfo, ToolSource};

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
    pub(super) fn start_one(&self) -> bool {
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
    pub(super) tree: Arc<Tree>,
}

/// What a `task` call that started was given.
#[derive(Clone, Copy)]
enum Named {
    Child(Child),
    /// No session: the tree has started all the sub-agents it may.
    OverLimit,
}

#[derive(Clone, Copy)]
pub(super) struct Child {
    pub(super) session_id: Uuid,
    /// Whether the session exists already: the call runs again after an interruption, and its
    /// child is resumed rather than started anew.
    pub(super) exists: bool,
    /// How its run ended, once it has.
    pub(super) status: Option<RunStatus>,
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

    pub(super) fn child_of(&self, call_id: &str) -> Result<Child, ToolError> {
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

    pub(super) fn ended(&self, call_id: &str, status: RunStatus) {
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

pub(super) const DESCRIPTION: &str =
    "Hand a self-contained piece of work to a sub-agent: a new session \
    with the same tools, policy and workspace works on `prompt` until it is done, and its final \
    answer is returned. The sub-agent sees only `prompt`, so say everything it needs. Several \
    task calls in one reply run at the same time.";

pub(super) fn input_schema() -> Value {
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
            },
            "agent": {
                "type": "string",
                "description": "Optional: the name of one of this agent's sub-agents to hand the work to (by default a copy of this agent does it)."
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
        sandbox: None,
    }
}
