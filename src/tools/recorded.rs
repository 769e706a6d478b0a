//! Recorded tools: a tool that stands for another one in a replay of a recorded session. It
//! offers the same name and schema and answers the policy the same subject, so the policy
//! decides as it would on the real tool, but a call returns the result the source's log
//! recorded for the same call (by its id, name and input) and runs nothing.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use super::{Availability, Subject, Tool, ToolContext, ToolError, ToolResult, ToolSource};

/// A call of the source and the result it got.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedCall {
    pub name: String,
    pub input: Value,
    /// The output as recorded (for an error, the `{"error": …}` the model was shown).
    pub output: String,
    pub is_error: bool,
}

/// The source's calls, by call id.
pub type RecordedCalls = Arc<HashMap<String, RecordedCall>>;

/// `inner`, answered from `calls`.
pub struct RecordedTool {
    pub inner: Arc<dyn Tool>,
    pub calls: RecordedCalls,
}

#[async_trait]
impl Tool for RecordedTool {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn description(&self) -> String {
        self.inner.description()
    }

    fn input_schema(&self) -> Value {
        self.inner.input_schema()
    }

    fn source(&self) -> ToolSource {
        // A client's tool is answered here too: nobody waits for a client.
        match self.inner.source() {
            ToolSource::Client => ToolSource::Builtin,
            source => source,
        }
    }

    fn server(&self) -> Option<&str> {
        self.inner.server()
    }

    fn availability(&self) -> Availability {
        Availability::Available
    }

    async fn subject(&self, ctx: &ToolContext, input: &Value) -> Subject {
        self.inner.subject(ctx, input).await
    }

    async fn call(&self, ctx: &ToolContext, input: &Value) -> Result<ToolResult, ToolError> {
        let id = ctx.call_id.as_deref().unwrap_or_default();
        let Some(recorded) = self.calls.get(id) else {
            return Err(ToolError(format!(
                "replay: the source has no result for call {id} of {}",
                self.name()
            )));
        };
        if recorded.name != self.name() || recorded.input != *input {
            return Err(ToolError(format!(
                "replay: call {id} differs from the source's ({} with {})",
                recorded.name, recorded.input
            )));
        }
        if recorded.is_error {
            // Wrapped again as it was: `{"error": …}`.
            let message = serde_json::from_str::<Value>(&recorded.output)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or_else(|| recorded.output.clone());
            return Err(ToolError(message));
        }
        Ok(ToolResult::from(recorded.output.clone()))
    }
}
