//! The [`ToolRegistry`]: the tools a server (or one session) offers, chosen by name, described
//! for `GET /v1/tools`, and run one call at a time against the caller's workspace. Every call's
//! output is bounded here, whatever the tool, so no tool can flood the history: by the bytes
//! it takes in the model's request, JSON escapes included.

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use serde::Serialize;
use serde_json::Value;

use super::builtin::{
    self, cost_of, cut_to_cost, in_error_json, in_json, shell::ShellSettings, Cost,
    MAX_OUTPUT_BYTES,
};
use super::schema::{self, SchemaError};
use super::{
    Availability, SandboxStatus, Subject, SubjectKind, Tool, ToolContext, ToolOutput, ToolSource,
};
use crate::model::{ToolCall, ToolSchema};

/// How the registry and its built-in tools behave on this server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolSettings {
    /// Bytes of output kept per call, for any tool; the rest is cut with a note.
    pub max_output_bytes: usize,
    pub shell: ShellSettings,
}

impl Default for ToolSettings {
    fn default() -> ToolSettings {
        ToolSettings {
            max_output_bytes: MAX_OUTPUT_BYTES,
            shell: ShellSettings::default(),
        }
    }
}

/// Names that match no tool (for `--tools` and a session's `tools`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown tools: {}", .0.join(", "))]
pub struct UnknownTools(pub Vec<String>);

/// A second tool with a name already taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("two tools are named {0}")]
pub struct DuplicateTool(pub String);

/// Why an input does not fit a tool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    #[error("unknown tool: {0}")]
    UnknownTool(String),
    #[error(transparent)]
    Invalid(#[from] SchemaError),
}

/// One tool as `GET /v1/tools` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolInfo {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub source: ToolSource,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    pub available: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The sandbox `shell` runs in: `bwrap` or `landlock`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
}

impl ToolInfo {
    /// How `tool` is listed now.
    pub fn of(tool: &dyn Tool) -> ToolInfo {
        let reason = match tool.availability() {
            Availability::Available => None,
            Availability::Unavailable { reason } => Some(reason),
        };
        ToolInfo {
            name: tool.name().to_owned(),
            description: tool.description(),
            input_schema: tool.input_schema(),
            source: tool.source(),
            server: tool.server().map(str::to_owned),
            available: reason.is_none(),
            reason,
            sandbox: tool.sandbox().map(str::to_owned),
        }
    }
}

#[derive(Clone)]
pub struct ToolRegistry {
    tools: Vec<Entry>,
    max_output_bytes: usize,
}

/// A tool and its schema, built at most once: the model is offered the schemas at every step,
/// and a tool's schema never changes. Registries made from this one share the built schemas.
#[derive(Clone)]
struct Entry {
    tool: Arc<dyn Tool>,
    schema: Arc<OnceLock<ToolSchema>>,
}

impl Entry {
    fn new(tool: Arc<dyn Tool>) -> Entry {
        Entry {
            tool,
            schema: Arc::default(),
        }
    }

    fn schema(&self) -> &ToolSchema {
        self.schema.get_or_init(|| self.tool.schema())
    }
}

impl Default for ToolRegistry {
    fn default() -> ToolRegistry {
        ToolRegistry {
            tools: Vec::new(),
            max_output_bytes: MAX_OUTPUT_BYTES,
        }
    }
}

impl ToolRegistry {
    /// A registry of `tools`, in the order they are offered; names must be unique.
    pub fn new(
        tools: Vec<Arc<dyn Tool>>,
        max_output_bytes: usize,
    ) -> Result<ToolRegistry, DuplicateTool> {
        refuse_duplicates(std::iter::empty(), &tools)?;
        Ok(ToolRegistry {
            tools: tools.into_iter().map(Entry::new).collect(),
            max_output_bytes,
        })
    }

    /// Every built-in tool; `shell` is listed unavailable unless `sandbox` is ready.
    pub fn builtin(settings: &ToolSettings, sandbox: SandboxStatus) -> ToolRegistry {
        ToolRegistry {
            tools: builtin::all(settings.shell.clone(), sandbox)
                .into_iter()
                .map(Entry::new)
                .collect(),
            max_output_bytes: settings.max_output_bytes,
        }
    }

    /// These tools and `more` (MCP or client tools); names must stay unique.
    pub fn with(&self, more: Vec<Arc<dyn Tool>>) -> Result<ToolRegistry, DuplicateTool> {
        refuse_duplicates(self.names(), &more)?;
        let tools = self
            .tools
            .iter()
            .cloned()
            .chain(more.into_iter().map(Entry::new))
            .collect();
        Ok(ToolRegistry {
            tools,
            max_output_bytes: self.max_output_bytes,
        })
    }

    /// The tools named in `names` (in this registry's order); every unknown name is an error.
    pub fn select<S: AsRef<str>>(&self, names: &[S]) -> Result<ToolRegistry, UnknownTools> {
        let mut unknown: Vec<String> = names
            .iter()
            .map(AsRef::as_ref)
            .filter(|name| self.get(name).is_none())
            .map(str::to_owned)
            .collect();
        if !unknown.is_empty() {
            unknown.sort();
            unknown.dedup();
            return Err(UnknownTools(unknown));
        }
        Ok(self.keep(names))
    }

    /// The tools of these names that are here, without complaint about the others.
    pub fn keep<S: AsRef<str>>(&self, names: &[S]) -> ToolRegistry {
        let wanted: HashSet<&str> = names.iter().map(AsRef::as_ref).collect();
        ToolRegistry {
            tools: self
                .tools
                .iter()
                .filter(|e| wanted.contains(e.tool.name()))
                .cloned()
                .collect(),
            max_output_bytes: self.max_output_bytes,
        }
    }

    /// These tools, each replaced by what `wrap` makes of it (same name; the schemas built so
    /// far are kept).
    pub fn map(&self, wrap: impl Fn(&Arc<dyn Tool>) -> Arc<dyn Tool>) -> ToolRegistry {
        ToolRegistry {
            tools: self
                .tools
                .iter()
                .map(|e| Entry {
                    tool: wrap(&e.tool),
                    schema: e.schema.clone(),
                })
                .collect(),
            max_output_bytes: self.max_output_bytes,
        }
    }

    pub fn names(&self) -> Vec<&str> {
        self.tools.iter().map(|e| e.tool.name()).collect()
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools
            .iter()
            .find(|e| e.tool.name() == name)
            .map(|e| &e.tool)
    }

    /// Every tool, available or not.
    pub fn list(&self) -> Vec<ToolInfo> {
        self.tools
            .iter()
            .map(|e| ToolInfo::of(e.tool.as_ref()))
            .collect()
    }

    /// What the model is offered: the available tools.
    pub fn schemas(&self) -> Vec<&ToolSchema> {
        self.tools
            .iter()
            .filter(|e| e.tool.availability() == Availability::Available)
            .map(|e| e.schema())
            .collect()
    }

    pub fn input_schema(&self, name: &str) -> Option<Value> {
        self.get(name).map(|t| t.input_schema())
    }

    /// Checks `input` against the tool's schema (for an input edited in an approval).
    pub fn validate_input(&self, name: &str, input: &Value) -> Result<(), InputError> {
        let tool = self
            .get(name)
            .ok_or_else(|| InputError::UnknownTool(name.to_owned()))?;
        Ok(schema::validate(&tool.input_schema(), input)?)
    }

    /// What policy rules match `call` against; an unknown tool's subject is its input's JSON.
    pub async fn subject(&self, ctx: &ToolContext, call: &ToolCall) -> Subject {
        match self.get(&call.name) {
            Some(tool) => tool.subject(ctx, &call.arguments).await,
            None => Subject {
                kind: SubjectKind::Input,
                text: call.arguments.to_string(),
            },
        }
    }

    /// Runs one call in `ctx`'s workspace; unknown or unavailable tools and tool errors become
    /// error outputs for the model. The output is cut to the registry's bound.
    pub async fn execute(&self, ctx: &ToolContext, call: &ToolCall) -> ToolOutput {
        let Some(tool) = self.get(&call.name) else {
            return ToolOutput::error(format!("unknown tool: {}", call.name));
        };
        if let Availability::Unavailable { reason } = tool.availability() {
            return ToolOutput::error(format!("{} is not available: {reason}", call.name));
        }
        match tool.call(ctx, &call.arguments).await {
            Ok(result) => ToolOutput {
                output: bound(result.output, self.max_output_bytes, in_json),
                is_error: false,
                artifacts: result.artifacts,
            },
            Err(e) => {
                let wrapping = cost_of(&ToolOutput::error("").output, in_json);
                let room = self.max_output_bytes.saturating_sub(wrapping);
                ToolOutput::error(bound(e.0, room, in_error_json))
            }
        }
    }
}

/// Fails on the first of `tools` whose name is in `taken` or earlier in `tools`.
fn refuse_duplicates<'a>(
    taken: impl IntoIterator<Item = &'a str>,
    tools: &[Arc<dyn Tool>],
) -> Result<(), DuplicateTool> {
    let mut seen: HashSet<&str> = taken.into_iter().collect();
    match tools.iter().find(|t| !seen.insert(t.name())) {
        Some(dup) => Err(DuplicateTool(dup.name().to_owned())),
        None => Ok(()),
    }
}

/// `text` cut, on a character boundary, to what costs at most `max` bytes in a model request
/// (note included): control characters count as the escapes they become there.
fn bound(text: String, max: usize, cost: Cost) -> String {
    if cost_of(&text, cost) <= max {
        return text;
    }
    let note = |kept: usize| format!("\n[output cut: kept {kept} of {} bytes]", text.len());
    // The note for all of `text` is at least as long as the one for any part of it.
    let room = max.saturating_sub(cost_of(&note(text.len()), cost));
    let kept = cut_to_cost(&text, room, cost);
    let mut out = kept.to_owned();
    out.push_str(&note(kept.len()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{ToolError, ToolResult, Workspace};
    use async_trait::async_trait;
    use serde_json::json;

    /// A tool that answers `size` bytes of `x`.
    struct Loud {
        size: usize,
    }

    #[async_trait]
    impl Tool for Loud {
        fn name(&self) -> &str {
            "loud"
        }
        fn description(&self) -> String {
            "talks a lot".into()
        }
        fn input_schema(&self) -> Value {
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
        }
        fn source(&self) -> ToolSource {
            ToolSource::Mcp
        }
        fn server(&self) -> Option<&str> {
            Some("noisy")
        }
        async fn call(&self, _: &ToolContext, _: &Value) -> Result<ToolResult, ToolError> {
            Ok("é".repeat(self.size / 2).into())
        }
    }

    fn unavailable() -> SandboxStatus {
        SandboxStatus::Unavailable("no bwrap in this test".into())
    }

    fn ctx() -> (tempfile::TempDir, ToolContext) {
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = Workspace::open(dir.path()).expect("workspace");
        (dir, ToolContext::new(ws))
    }

    fn call(name: &str, arguments: Value) -> ToolCall {
        ToolCall {
            id: "call_1".into(),
            name: name.into(),
            arguments,
        }
    }

    #[test]
    fn builtin_lists_every_tool_and_offers_only_available_ones() {
        let registry = ToolRegistry::builtin(&ToolSettings::default(), unavailable());
        assert_eq!(registry.names(), builtin::NAMES);
        let listed = registry.list();
        let shell = listed.iter().find(|t| t.name == "shell").expect("shell");
        assert!(!shell.available);
        assert_eq!(shell.reason.as_deref(), Some("no bwrap in this test"));
        let json = serde_json::to_value(shell).expect("serialise");
        assert_eq!(json["source"], "builtin");
        assert_eq!(json["available"], false);
        assert!(json.get("server").is_none());
        assert!(listed
            .iter()
            .filter(|t| t.name != "shell")
            .all(|t| t.available));
        let offered: Vec<String> = registry
            .schemas()
            .into_iter()
            .map(|s| s.name.clone())
            .collect();
        assert_eq!(offered, builtin::NAMES[..6]);
    }

    #[tokio::test]
    async fn an_unavailable_tool_is_refused_when_called() {
        let (_dir, ctx) = ctx();
        let registry = ToolRegistry::builtin(&ToolSettings::default(), unavailable());
        let out = registry
            .execute(&ctx, &call("shell", json!({"command": "true"})))
            .await;
        assert!(out.is_error);
        assert!(
            out.output.contains("shell is not available"),
            "{}",
            out.output
        );
        let out = registry.execute(&ctx, &call("nope", json!({}))).await;
        assert!(out.is_error && out.output.contains("unknown tool: nope"));
    }

    #[test]
    fn select_keeps_the_registry_order_and_names_every_unknown_tool() {
        let registry = ToolRegistry::builtin(&ToolSettings::default(), unavailable());
        let picked = registry
            .select(&["grep", "read_file", "grep"])
            .expect("known");
        assert_eq!(picked.names(), ["read_file", "grep"]);
        let err = registry
            .select(&["read_file", "rm_rf", "bash", "rm_rf"])
            .err()
            .expect("unknown names");
        assert_eq!(err, UnknownTools(vec!["bash".into(), "rm_rf".into()]));
        assert_eq!(err.to_string(), "unknown tools: bash, rm_rf");
        // An unavailable tool can be chosen; it stays listed and unoffered.
        let shell = registry.select(&["shell"]).expect("known");
        assert_eq!(shell.list().len(), 1);
        assert!(shell.schemas().is_empty());
        assert!(registry
            .select::<&str>(&[])
            .expect("empty")
            .names()
            .is_empty());
    }

    #[test]
    fn names_are_unique() {
        let registry = ToolRegistry::builtin(&ToolSettings::default(), unavailable());
        let err = registry
            .with(vec![Arc::new(Loud { size: 1 }), Arc::new(Loud { size: 2 })])
            .err()
            .expect("duplicate");
        assert_eq!(err, DuplicateTool("loud".into()));
        let more = registry
            .with(vec![Arc::new(Loud { size: 1 })])
            .expect("unique");
        let loud = more.list().pop().expect("listed");
        assert_eq!(loud.source, ToolSource::Mcp);
        assert_eq!(loud.server.as_deref(), Some("noisy"));
    }

    #[tokio::test]
    async fn every_output_is_bounded_with_a_note() {
        let (_dir, ctx) = ctx();
        let registry =
            ToolRegistry::new(vec![Arc::new(Loud { size: 10_000 })], 1000).expect("registry");
        let out = registry.execute(&ctx, &call("loud", json!({"n": 1}))).await;
        assert!(out.output.len() <= 1000, "{}", out.output.len());
        assert!(out.output.ends_with("of 10000 bytes]"), "{}", out.output);
        assert!(out.output.contains("[output cut: kept "), "{}", out.output);
        let small = ToolRegistry::new(vec![Arc::new(Loud { size: 10 })], 1000).expect("registry");
        let out = small.execute(&ctx, &call("loud", json!({"n": 1}))).await;
        assert_eq!(out.output, "ééééé");
    }

    /// A tool that fails with `size` control characters.
    struct Garbled {
        size: usize,
    }

    #[async_trait]
    impl Tool for Garbled {
        fn name(&self) -> &str {
            "garbled"
        }
        fn description(&self) -> String {
            "fails in control characters".into()
        }
        fn input_schema(&self) -> Value {
            json!({"type": "object"})
        }
        async fn call(&self, _: &ToolContext, _: &Value) -> Result<ToolResult, ToolError> {
            Err(ToolError("\u{1}\"\n".repeat(self.size / 3)))
        }
    }

    #[tokio::test]
    async fn errors_are_bounded_by_their_size_in_the_model_request() {
        let (_dir, ctx) = ctx();
        let max = MAX_OUTPUT_BYTES;
        let registry =
            ToolRegistry::new(vec![Arc::new(Garbled { size: max })], max).expect("registry");
        let out = registry.execute(&ctx, &call("garbled", json!({}))).await;
        assert!(out.is_error);
        // What a model request carries: the error's JSON, in a JSON string.
        let request = serde_json::to_string(&out.output).expect("json").len() - 2;
        eprintln!(
            "an error of {max} bytes of control characters: {} bytes kept, {request} in the \
             model request",
            out.output.len()
        );
        assert!(request <= max, "{request}");
        assert!(request > max - 20, "{request}");
        let error: Value = serde_json::from_str(&out.output).expect("still JSON");
        let message = error["error"].as_str().expect("a message");
        assert!(message.starts_with("\u{1}\"\n"), "{message:?}");
        assert!(message.contains("\n[output cut: kept "), "{message:?}");
        assert!(message.ends_with(" of 65535 bytes]"), "{message:?}");
        // Within the bound in the request, nothing is cut.
        let fits = ToolRegistry::new(vec![Arc::new(Garbled { size: 300 })], 1500).expect("fits");
        let out = fits.execute(&ctx, &call("garbled", json!({}))).await;
        assert_eq!(
            out.output,
            ToolOutput::error("\u{1}\"\n".repeat(100)).output
        );
    }

    #[test]
    fn inputs_are_checked_against_the_tool_schema() {
        let registry = ToolRegistry::builtin(&ToolSettings::default(), unavailable());
        let ok = json!({"path": "a.txt", "old_string": "a", "new_string": "b"});
        assert_eq!(registry.validate_input("edit_file", &ok), Ok(()));
        let bad = json!({"path": "a.txt", "old_string": 1, "new_string": "b"});
        let err = registry.validate_input("edit_file", &bad).expect_err("bad");
        assert!(err.to_string().contains("old_string"), "{err}");
        let deep = json!({"path": ".", "depth": 9});
        assert!(registry.validate_input("list_files", &deep).is_err());
        assert_eq!(
            registry.validate_input("nope", &json!({})),
            Err(InputError::UnknownTool("nope".into()))
        );
        assert_eq!(
            registry.input_schema("write_file").expect("schema")["required"],
            json!(["path", "content"])
        );
    }

    #[tokio::test]
    async fn subjects_are_what_policy_matches() {
        let (dir, ctx) = ctx();
        std::fs::create_dir(dir.path().join("src")).expect("mkdir");
        std::os::unix::fs::symlink("src", dir.path().join("code")).expect("symlink");
        let registry = ToolRegistry::builtin(&ToolSettings::default(), unavailable());
        let subject = |name: &'static str, args: Value| {
            let registry = registry.clone();
            let ctx = ctx.clone();
            async move { registry.subject(&ctx, &call(name, args)).await }
        };
        let s = subject(
            "write_file",
            json!({"path": "./src/../src/new.rs", "content": ""}),
        )
        .await;
        assert_eq!((s.kind, s.text.as_str()), (SubjectKind::Path, "src/new.rs"));
        // Through a symlink, the subject is where the write would land.
        let s = subject("write_file", json!({"path": "code/x.rs", "content": ""})).await;
        assert_eq!(s.text, "src/x.rs");
        let s = subject("edit_file", json!({"path": "a/b/../c.txt"})).await;
        assert_eq!(s.text, "a/c.txt");
        let s = subject("list_files", json!({})).await;
        assert_eq!(s.text, ".");
        let s = subject("grep", json!({"pattern": "x", "path": "code"})).await;
        assert_eq!(s.text, "src");
        let s = subject("shell", json!({"command": "ls -la"})).await;
        assert_eq!((s.kind, s.text.as_str()), (SubjectKind::Command, "ls -la"));
        let s = subject("other", json!({"a": 1})).await;
        assert_eq!(
            (s.kind, s.text.as_str()),
            (SubjectKind::Input, r#"{"a":1}"#)
        );
        // A path that leaves the workspace keeps its text; the tool will refuse it.
        let s = subject("read_file", json!({"path": "../etc/passwd"})).await;
        assert_eq!(s.text, "../etc/passwd");
    }
}
