//! What a new session may choose: its workspace under the server's root, its tools, rules,
//! MCP servers and client tools, checked before anything is written.

use super::lineage;
use super::sessions::Sessions;
use crate::model::{ClientTool, SessionOptions};
use crate::session::errors::SessionError;
use crate::tools::policy::Rules;
use crate::tools::ToolInfo;

impl Sessions {
    /// The directory under the server's `--workspace` root that `rel` names, created if
    /// missing, as the session options keep it: canonical and relative to the root, `None` for
    /// the root itself. Anything that leaves the root (an absolute path, `..` above it, a
    /// symlink that leads outside) is refused, saying why.
    pub async fn resolve_workspace(&self, rel: &str) -> Result<Option<String>, SessionError> {
        let root = self.deps.agent.tool_context.workspace.clone();
        let wanted = rel.to_string();
        let dir = root
            .run(move |root| root.subdir(&wanted))
            .await
            .map_err(|e| SessionError::BadInput(format!("workspace {rel:?}: {e}")))?;
        match dir.relative_to(&root).as_deref() {
            Some(".") => Ok(None),
            Some(inside) => Ok(Some(inside.to_string())),
            // `subdir` answers only directories under the root.
            None => Err(SessionError::BadInput(format!(
                "workspace {rel:?}: not under the server's workspace"
            ))),
        }
    }

    /// The tools a new session is offered, available or not.
    pub fn tools(&self) -> Vec<ToolInfo> {
        let mut tools = self.deps.agent.tools.list();
        if self.deps.max_subagent_depth > 0 {
            tools.push(lineage::task_info());
        }
        let mcp = self.deps.mcp.tools(None);
        tools.extend(mcp.iter().map(|tool| ToolInfo::of(tool.as_ref())));
        tools
    }

    /// Checks what a new session chose: its tools exist, its rules compile, its client
    /// tools are well formed and clash with nothing. Answers the options as the session keeps
    /// them: a tool named twice in `tools` is kept once, where it came first.
    pub fn check_options(
        &self,
        mut options: SessionOptions,
    ) -> Result<SessionOptions, SessionError> {
        let server = &self.deps.agent.tools;
        if let Some(tools) = &mut options.tools {
            // `task` is offered by the session layer, not the server's registry.
            let subagents = self.deps.max_subagent_depth > 0;
            let workspace_tools: Vec<&String> = tools
                .iter()
                .filter(|name| !(subagents && name.as_str() == lineage::TASK))
                .collect();
            if let Err(unknown) = server.select(&workspace_tools) {
                let mcp = if unknown.0.iter().any(|t| t.starts_with(crate::mcp::PREFIX)) {
                    "; MCP tools are chosen by server, with mcp_servers"
                } else {
                    ""
                };
                return Err(SessionError::BadInput(format!(
                    "tools names tools this server does not offer: {} (it offers {}{mcp})",
                    unknown.0.join(", "),
                    server.names().join(", ")
                )));
            }
            let mut seen = std::collections::HashSet::new();
            tools.retain(|name| seen.insert(name.clone()));
        }
        if let Some(chosen) = &options.mcp_servers {
            let known = self.deps.mcp.names();
            let mut unknown: Vec<&str> = chosen
                .iter()
                .map(String::as_str)
                .filter(|name| !known.contains(name))
                .collect();
            if !unknown.is_empty() {
                unknown.sort_unstable();
                unknown.dedup();
                let has = match known.is_empty() {
                    true => "it has none".to_string(),
                    false => format!("it has {}", known.join(", ")),
                };
                return Err(SessionError::BadInput(format!(
                    "mcp_servers names MCP servers this server does not have: {} ({has})",
                    unknown.join(", ")
                )));
            }
        }
        Rules::compile(options.tool_policy.clone())
            .map_err(|e| SessionError::BadInput(format!("tool_policy: {e}")))?;
        self.check_client_tools(&options.client_tools)?;
        Ok(options)
    }

    /// Checks the client tools a run declares for itself: well formed, and clashing with no
    /// tool of the server (a run's tool may replace a client tool of the session).
    pub fn check_run_tools(&self, tools: &[ClientTool]) -> Result<(), SessionError> {
        self.check_client_tools(tools)
    }

    fn check_client_tools(&self, tools: &[ClientTool]) -> Result<(), SessionError> {
        let server = &self.deps.agent.tools;
        let mut names = std::collections::HashSet::new();
        for tool in tools {
            let valid = !tool.name.is_empty()
                && tool.name.len() <= 64
                && tool
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !valid {
                return Err(SessionError::BadInput(format!(
                    "client tool name {:?}: use 1-64 letters, digits, _ or -",
                    tool.name
                )));
            }
            // A built-in's name stays its own even where `--tools` did not choose it: the
            // policy's defaults and a deployment's rules name tools by name.
            if server.get(&tool.name).is_some()
                || crate::tools::builtin::NAMES.contains(&tool.name.as_str())
                || tool.name == lineage::TASK
                || tool.name.starts_with(crate::mcp::PREFIX)
            {
                return Err(SessionError::BadInput(format!(
                    "client tool name {:?} clashes with a server tool of that name (the built-in tools' names are always taken)",
                    tool.name
                )));
            }
            if !names.insert(tool.name.as_str()) {
                return Err(SessionError::BadInput(format!(
                    "client tool name {:?} is given twice",
                    tool.name
                )));
            }
            if !tool.input_schema.is_object() {
                return Err(SessionError::BadInput(format!(
                    "client tool {:?}: input_schema must be a JSON schema object",
                    tool.name
                )));
            }
            if let Err(error) = crate::tools::schema::check_schema(&tool.input_schema) {
                return Err(SessionError::BadInput(format!(
                    "client tool {:?}: input_schema is not a valid JSON Schema: {error}",
                    tool.name
                )));
            }
            if tool.timeout_s == Some(0) {
                return Err(SessionError::BadInput(format!(
                    "client tool {:?}: timeout_s must be at least 1",
                    tool.name
                )));
            }
        }
        Ok(())
    }
}
