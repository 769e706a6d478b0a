//! Tools a session's client runs itself: offered to the model like any tool, but never run
//! here. The session makes a call of one wait for the client's result.

use async_trait::async_trait;
use serde_json::Value;

use super::{Tool, ToolContext, ToolError, ToolResult, ToolSource};
use crate::model::ClientTool;

pub struct ClientSide(pub ClientTool);

#[async_trait]
impl Tool for ClientSide {
    fn name(&self) -> &str {
        &self.0.name
    }

    fn description(&self) -> String {
        self.0.description.clone()
    }

    fn input_schema(&self) -> Value {
        self.0.input_schema.clone()
    }

    fn source(&self) -> ToolSource {
        ToolSource::Client
    }

    fn client_tool(&self) -> Option<&ClientTool> {
        Some(&self.0)
    }

    async fn call(&self, _ctx: &ToolContext, _input: &Value) -> Result<ToolResult, ToolError> {
        Err(ToolError(format!(
            "{} runs on the client; the server does not run it",
            self.0.name
        )))
    }
}
