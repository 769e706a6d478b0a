//! The built-in tools and what they share: reading the model's arguments, the subject a file
//! tool shows to policy, and output bounded to what one call may return.

pub mod edit;
pub mod files;
pub mod search;
pub mod shell;

use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::workspace::{self, display, normalize};
use super::{SandboxStatus, Subject, SubjectKind, Tool, ToolContext, ToolError};

/// What one built-in tool call returns at most (bytes of text, notes included).
pub const MAX_OUTPUT_BYTES: usize = 64 * 1024;
/// Room kept under [`MAX_OUTPUT_BYTES`] for the notes that close an output.
const NOTE_ROOM: usize = 256;

/// Every built-in tool's name, in the order they are offered.
pub use crate::model::BUILTIN_TOOLS as NAMES;

/// The built-in tools; `shell` runs in `sandbox` (unavailable when the probe failed).
pub fn all(shell: shell::ShellSettings, sandbox: SandboxStatus) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(files::ListFiles),
        Arc::new(files::ReadFile),
        Arc::new(search::Glob),
        Arc::new(search::Grep),
        Arc::new(edit::WriteFile),
        Arc::new(edit::EditFile),
        Arc::new(shell::Shell::new(shell, sandbox)),
    ]
}

/// The arguments object; `null` counts as `{}`.
fn arguments(input: &Value) -> Result<Option<&Map<String, Value>>, ToolError> {
    match input {
        Value::Object(map) => Ok(Some(map)),
        Value::Null => Ok(None),
        _ => Err(ToolError("arguments must be a JSON object".into())),
    }
}

/// An argument's value; absent and `null` are the same.
fn argument<'a>(input: &'a Value, name: &str) -> Result<Option<&'a Value>, ToolError> {
    Ok(arguments(input)?.and_then(|map| map.get(name).filter(|v| !v.is_null())))
}

fn string_arg(input: &Value, name: &str) -> Result<Option<String>, ToolError> {
    match argument(input, name)? {
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ToolError(format!("argument `{name}` must be a string"))),
        None => Ok(None),
    }
}

fn required_string(input: &Value, name: &str) -> Result<String, ToolError> {
    string_arg(input, name)?.ok_or_else(|| ToolError(format!("missing required argument: {name}")))
}

fn bool_arg(input: &Value, name: &str) -> Result<Option<bool>, ToolError> {
    match argument(input, name)? {
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ToolError(format!(
            "argument `{name}` must be true or false"
        ))),
        None => Ok(None),
    }
}

/// The `path` argument of a tool that walks a directory: the workspace root when absent.
fn dir_arg(input: &Value) -> Result<String, ToolError> {
    Ok(string_arg(input, "path")?.unwrap_or_else(|| ".".to_owned()))
}

/// The schema of a `path` argument: `what` it names, relative to the workspace root, and what
/// it defaults to (`None` where it is required).
fn path_property(what: &str, default: Option<&str>) -> Value {
    let mut description = format!("{what}, relative to the workspace root.");
    if let Some(default) = default {
        description.push_str(&format!(" Defaults to {default}."));
    }
    json!({ "type": "string", "description": description })
}

/// An integer argument within `min..=max` (a whole float such as `2.0` counts).
fn int_arg(input: &Value, name: &str, min: u64, max: u64) -> Result<Option<u64>, ToolError> {
    let Some(value) = argument(input, name)? else {
        return Ok(None);
    };
    let number = value
        .as_u64()
        .or_else(|| {
            value
                .as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                .map(|f| f as u64)
        })
        .filter(|_| value.is_number());
    match number {
        Some(n) if (min..=max).contains(&n) => Ok(Some(n)),
        _ if max == u64::MAX => Err(ToolError(format!(
            "argument `{name}` must be an integer of at least {min}"
        ))),
        _ => Err(ToolError(format!(
            "argument `{name}` must be an integer from {min} to {max}"
        ))),
    }
}

/// The subject of a file tool's call: the path it would touch, canonical where it exists (its
/// parent where only that exists, lexically normalised otherwise), or as written when it leads
/// nowhere valid (the tool will refuse it).
async fn path_subject(ctx: &ToolContext, input: &Value, default: Option<&str>) -> Subject {
    let rel = string_arg(input, "path")
        .ok()
        .flatten()
        .or_else(|| default.map(str::to_owned))
        .unwrap_or_default();
    let resolved = rel.clone();
    let text = ctx
        .workspace
        .run(move |ws| Ok(resolve_subject(ws, &resolved)))
        .await
        .ok()
        .flatten()
        .unwrap_or(rel);
    Subject {
        kind: SubjectKind::Path,
        text,
    }
}

fn resolve_subject(ws: &workspace::Workspace, rel: &str) -> Option<String> {
    if let Some(canon) = ws.planned(rel) {
        return Some(display(&canon));
    }
    workspace::check_path_syntax(rel).ok()?;
    normalize(rel)
}

/// Text bounded to a byte budget, cut at a line boundary with a note.
struct BoundedText {
    text: String,
    budget: usize,
    cut: bool,
}

impl BoundedText {
    fn new() -> BoundedText {
        BoundedText {
            text: String::new(),
            budget: MAX_OUTPUT_BYTES - NOTE_ROOM,
            cut: false,
        }
    }

    /// Appends `line` and a newline; `false` once the budget is spent.
    fn line(&mut self, line: &str) -> bool {
        if self.cut || self.text.len() + line.len() + 1 > self.budget {
            self.cut = true;
            return false;
        }
        self.text.push_str(line);
        self.text.push('\n');
        true
    }

    /// The text with its closing notes, without a trailing newline.
    fn finish(mut self, notes: &[String]) -> String {
        if self.cut {
            self.text.push_str(&format!(
                "[output cut at {} KiB; narrow the request]\n",
                MAX_OUTPUT_BYTES / 1024
            ));
        }
        for note in notes {
            self.text.push_str(note);
            self.text.push('\n');
        }
        self.text.pop();
        self.text
    }
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn cut_at_char(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// What one character of a tool's output costs in a model request (bytes).
pub(crate) type Cost = fn(char) -> usize;

/// A character of an output, in the JSON string a request carries it in (as serde_json writes
/// it): control characters are escaped, most as `\u00XX`, six bytes for one; so are `"` and `\`.
pub(crate) fn in_json(c: char) -> usize {
    match c {
        '"' | '\\' | '\u{8}' | '\u{c}' | '\n' | '\r' | '\t' => 2,
        '\0'..='\u{1f}' => 6,
        _ => c.len_utf8(),
    }
}

/// A character of an error, which is JSON (`{"error": …}`) carried in a JSON string: escaped
/// twice.
pub(crate) fn in_error_json(c: char) -> usize {
    match c {
        '"' | '\\' => 4,
        '\u{8}' | '\u{c}' | '\n' | '\r' | '\t' => 3,
        '\0'..='\u{1f}' => 7,
        _ => c.len_utf8(),
    }
}

/// What `s` costs in a model request.
pub(crate) fn cost_of(s: &str, cost: Cost) -> usize {
    s.chars().map(cost).sum()
}

/// The longest start of `s` that costs at most `max` bytes in a model request.
pub(crate) fn cut_to_cost(s: &str, max: usize, cost: Cost) -> &str {
    let mut used = 0;
    for (at, c) in s.char_indices() {
        used += cost(c);
        if used > max {
            return &s[..at];
        }
    }
    s
}

/// A workspace in a temporary directory, for the tools' unit tests.
#[cfg(test)]
struct TestWorkspace {
    _tmp: tempfile::TempDir,
    /// The workspace root, canonical.
    root: std::path::PathBuf,
    ctx: ToolContext,
}

#[cfg(test)]
impl TestWorkspace {
    /// A workspace holding the directories `dirs` and the `files` (path, text) written in them.
    fn new(dirs: &[&str], files: &[(&str, &str)]) -> TestWorkspace {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("ws");
        std::fs::create_dir_all(&root).expect("mkdir");
        for dir in dirs {
            std::fs::create_dir_all(root.join(dir)).expect("mkdir");
        }
        for (path, text) in files {
            std::fs::write(root.join(path), text).expect("write");
        }
        let ws = workspace::Workspace::open(&root).expect("workspace");
        TestWorkspace {
            root: ws.root().to_path_buf(),
            ctx: ToolContext::new(ws),
            _tmp: tmp,
        }
    }
}
