//! Tools the agent can call: the `Tool` trait, the registry, and the workspace-confined file
//! tools. Tools never touch sessions or the store; a tool's failure is data for the model
//! (`is_error`), never a failure of the server.

pub mod files;

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use crate::model::{ToolCall, ToolSchema};

/// A tool's own error: shown to the model as `{"error": "..."}`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct ToolError(pub String);

#[async_trait]
pub trait Tool: Send + Sync {
    fn schema(&self) -> ToolSchema;
    /// Runs the tool. Long blocking work must not block the runtime (use `spawn_blocking`);
    /// the caller drops the future on cancellation.
    async fn call(&self, arguments: &Value) -> Result<String, ToolError>;
}

/// The outcome of one tool call as recorded in the history.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub output: String,
    pub is_error: bool,
}

impl ToolOutput {
    pub fn error(message: impl std::fmt::Display) -> ToolOutput {
        ToolOutput {
            output: serde_json::json!({ "error": message.to_string() }).to_string(),
            is_error: true,
        }
    }
}

#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: Vec<Arc<dyn Tool>>,
}

impl ToolRegistry {
    pub fn new(tools: Vec<Arc<dyn Tool>>) -> ToolRegistry {
        ToolRegistry { tools }
    }

    /// The registry of built-in tools confined to `workspace`.
    pub fn builtin(workspace: &std::path::Path) -> std::io::Result<ToolRegistry> {
        let root = files::Workspace::open(workspace)?;
        Ok(ToolRegistry::new(vec![
            Arc::new(files::ListFiles::new(root.clone())),
            Arc::new(files::ReadFile::new(root)),
        ]))
    }

    pub fn schemas(&self) -> Vec<ToolSchema> {
        self.tools.iter().map(|t| t.schema()).collect()
    }

    /// Runs one call; unknown tools and tool errors become error outputs for the model.
    pub async fn execute(&self, call: &ToolCall) -> ToolOutput {
        let Some(tool) = self.tools.iter().find(|t| t.schema().name == call.name) else {
            return ToolOutput::error(format!("unknown tool: {}", call.name));
        };
        match tool.call(&call.arguments).await {
            Ok(output) => ToolOutput {
                output,
                is_error: false,
            },
            Err(e) => ToolOutput::error(e),
        }
    }
}
