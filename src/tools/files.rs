//! Workspace-confined file tools (placeholder, being written).
use async_trait::async_trait;
use serde_json::Value;
use std::path::{Path, PathBuf};

use super::{Tool, ToolError};
use crate::model::ToolSchema;

#[derive(Clone)]
pub struct Workspace {
    root: PathBuf,
}
impl Workspace {
    pub fn open(root: &Path) -> std::io::Result<Workspace> {
        Ok(Workspace { root: root.canonicalize()? })
    }
}
pub struct ListFiles(Workspace);
impl ListFiles {
    pub fn new(w: Workspace) -> Self {
        ListFiles(w)
    }
}
pub struct ReadFile(Workspace);
impl ReadFile {
    pub fn new(w: Workspace) -> Self {
        ReadFile(w)
    }
}
#[async_trait]
impl Tool for ListFiles {
    fn schema(&self) -> ToolSchema {
        ToolSchema { name: "list_files".into(), description: String::new(), parameters: serde_json::json!({}) }
    }
    async fn call(&self, _a: &Value) -> Result<String, ToolError> {
        let _ = &self.0.root;
        Err(ToolError("todo".into()))
    }
}
#[async_trait]
impl Tool for ReadFile {
    fn schema(&self) -> ToolSchema {
        ToolSchema { name: "read_file".into(), description: String::new(), parameters: serde_json::json!({}) }
    }
    async fn call(&self, _a: &Value) -> Result<String, ToolError> {
        Err(ToolError("todo".into()))
    }
}
