//! `write_file` and `edit_file`: the tools that change the workspace. Both write through the
//! [`Workspace`] (a temporary file renamed over the target, never through a symlink that leads
//! outside) and answer the file's new bytes as an [`Artifact`] for the session to keep.

use std::io::Read;
use std::path::Path;

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::{json, Value};

use super::{bool_arg, path_property, path_subject, required_string};
use crate::tools::workspace::{display, echo, io_error, FileId, Workspace};
use crate::tools::{Artifact, Subject, Tool, ToolContext, ToolError, ToolResult};

/// Largest file these tools write or edit (bytes), as large as an artifact may be by default.
pub const MAX_FILE_BYTES: usize = 10 * 1024 * 1024;

/// `write_file`: create or overwrite a file.
pub struct WriteFile;

/// `edit_file`: replace an exact string in a file.
pub struct EditFile;

#[async_trait]
impl Tool for WriteFile {
    fn name(&self) -> &str {
        "write_file"
    }

    fn description(&self) -> String {
        "Create a file in the workspace, or overwrite it, with `content` (UTF-8 text). Missing \
         parent directories are created. To change part of a file, use edit_file."
            .into()
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": path_property("File to write", None),
                "content": { "type": "string", "description": "The whole new content." }
            },
            "required": ["path", "content"]
        })
    }

    async fn subject(&self, ctx: &ToolContext, input: &Value) -> Subject {
        path_subject(ctx, input, None).await
    }

    async fn call(&self, ctx: &ToolContext, input: &Value) -> Result<ToolResult, ToolError> {
        let rel = required_string(input, "path")?;
        let content = required_string(input, "content")?;
        if content.len() > MAX_FILE_BYTES {
            return Err(too_large(content.len()));
        }
        ctx.workspace
            .run(move |ws| {
                let written = ws.write(&rel, content.as_bytes())?;
                let path = display(&written.path);
                let verb = if written.created {
                    "created"
                } else {
                    "overwrote"
                };
                Ok(ToolResult {
                    output: format!("{verb} {path} ({} bytes)", content.len()),
                    artifacts: vec![artifact(&written.path, content.into_bytes())],
                })
            })
            .await
    }
}

#[async_trait]
impl Tool for EditFile {
    fn name(&self) -> &str {
        "edit_file"
    }

    fn description(&self) -> String {
        "Replace an exact string in a text file of the workspace. `old_string` must appear in \
         the file exactly once (include enough surrounding lines to make it unique), or set \
         `replace_all` to replace every occurrence. Whitespace and line breaks must match \
         exactly; read the file first."
            .into()
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": path_property("File to edit", None),
                "old_string": { "type": "string", "description": "The exact text to replace." },
                "new_string": { "type": "string", "description": "The text to put instead." },
                "replace_all": {
                    "type": "boolean",
                    "description": "Replace every occurrence (default false)."
                }
            },
            "required": ["path", "old_string", "new_string"]
        })
    }

    async fn subject(&self, ctx: &ToolContext, input: &Value) -> Subject {
        path_subject(ctx, input, None).await
    }

    async fn call(&self, ctx: &ToolContext, input: &Value) -> Result<ToolResult, ToolError> {
        let edit = Edit {
            rel: required_string(input, "path")?,
            old: required_string(input, "old_string")?,
            new: required_string(input, "new_string")?,
            replace_all: bool_arg(input, "replace_all")?.unwrap_or(false),
        };
        if edit.old.is_empty() {
            return Err(ToolError(
                "old_string must not be empty (use write_file to create a file)".into(),
            ));
        }
        if edit.old == edit.new {
            return Err(ToolError("old_string and new_string are the same".into()));
        }
        ctx.workspace.run(move |ws| edit_blocking(ws, &edit)).await
    }
}

struct Edit {
    rel: String,
    old: String,
    new: String,
    replace_all: bool,
}

fn edit_blocking(ws: &Workspace, edit: &Edit) -> Result<ToolResult, ToolError> {
    let rel = edit.rel.as_str();
    let (canon, file) = ws.open_file(rel)?;
    let id = FileId::of(&file).map_err(|e| io_error(rel, &e))?;
    if id.size > MAX_FILE_BYTES as u64 {
        return Err(too_large(id.size as usize));
    }
    let mut bytes = Vec::with_capacity(id.size as usize);
    file.take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(rel, &e))?;
    if bytes.len() > MAX_FILE_BYTES {
        return Err(too_large(bytes.len()));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| ToolError(format!("binary file: {} (not UTF-8 text)", echo(rel))))?;
    let count = text.matches(edit.old.as_str()).count();
    let path = display(&canon);
    match count {
        0 => {
            return Err(ToolError(format!(
                "old_string was not found in {path}; read the file and copy the text exactly"
            )))
        }
        n if n > 1 && !edit.replace_all => {
            return Err(ToolError(format!(
                "old_string was found {n} times in {path}; include more context to make it \
                 unique, or set replace_all"
            )))
        }
        _ => {}
    }
    // Matches exist, so `find` answers `Some`; the fallback is never used.
    let first = text.find(edit.old.as_str()).unwrap_or(0);
    let line = text[..first].matches('\n').count() + 1;
    let edited = if edit.replace_all {
        text.replace(edit.old.as_str(), &edit.new)
    } else {
        text.replacen(edit.old.as_str(), &edit.new, 1)
    };
    if edited.len() > MAX_FILE_BYTES {
        return Err(too_large(edited.len()));
    }
    ws.replace_at(&canon, Some(id), edited.as_bytes(), rel)?;
    let what = if count == 1 {
        format!("1 occurrence at line {line}")
    } else {
        format!("{count} occurrences, the first at line {line}")
    };
    Ok(ToolResult {
        output: format!("edited {path}: replaced {what}"),
        artifacts: vec![artifact(&canon, edited.into_bytes())],
    })
}

fn too_large(len: usize) -> ToolError {
    ToolError(format!(
        "the file would be {len} bytes; at most {MAX_FILE_BYTES} are written"
    ))
}

fn artifact(canon: &Path, content: Vec<u8>) -> Artifact {
    let path = display(canon);
    Artifact {
        media_type: media_type(&path).to_owned(),
        path,
        content: Bytes::from(content),
    }
}

/// The media type of a text file, by its extension.
fn media_type(path: &str) -> &'static str {
    let extension = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match extension.as_deref() {
        Some("md" | "markdown") => "text/markdown; charset=utf-8",
        Some("html" | "htm") => "text/html; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("csv") => "text/csv; charset=utf-8",
        Some("js" | "mjs" | "cjs") => "text/javascript; charset=utf-8",
        Some("json") => "application/json",
        Some("xml") => "application/xml",
        Some("svg") => "image/svg+xml",
        Some("yaml" | "yml") => "application/yaml",
        Some("toml") => "application/toml",
        _ => "text/plain; charset=utf-8",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    use crate::tools::builtin::TestWorkspace as Fixture;

    fn fixture() -> Fixture {
        Fixture::new(
            &["src"],
            &[("src/lib.rs", "fn a() {}\nfn b() {}\nfn a() {}\n")],
        )
    }

    async fn write(f: &Fixture, path: &str, content: &str) -> Result<ToolResult, ToolError> {
        let args = json!({"path": path, "content": content});
        WriteFile.call(&f.ctx, &args).await
    }

    async fn edit(f: &Fixture, args: Value) -> Result<ToolResult, ToolError> {
        EditFile.call(&f.ctx, &args).await
    }

    #[tokio::test]
    async fn write_creates_parents_and_records_an_artifact() {
        let f = fixture();
        let out = write(&f, "docs/notes/today.md", "# Today\n")
            .await
            .expect("write");
        assert_eq!(out.output, "created docs/notes/today.md (8 bytes)");
        assert_eq!(
            fs::read_to_string(f.root.join("docs/notes/today.md")).expect("read"),
            "# Today\n"
        );
        assert_eq!(
            out.artifacts,
            [Artifact {
                path: "docs/notes/today.md".into(),
                media_type: "text/markdown; charset=utf-8".into(),
                content: Bytes::from_static(b"# Today\n"),
            }]
        );
        // `..` inside the workspace is fine; the artifact names the real path.
        let out = write(&f, "docs/../src/./new.rs", "").await.expect("write");
        assert_eq!(out.output, "created src/new.rs (0 bytes)");
        assert_eq!(out.artifacts[0].path, "src/new.rs");
        // No temporary file is left behind.
        let names: Vec<_> = fs::read_dir(f.root.join("src"))
            .expect("ls")
            .flatten()
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[tokio::test]
    async fn overwrite_keeps_permissions_and_replaces_the_inode() {
        let f = fixture();
        let path = f.root.join("run.sh");
        fs::write(&path, "old").expect("write");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o751)).expect("chmod");
        // A hard link elsewhere keeps the old content: the write does not go through it.
        fs::hard_link(&path, f.root.join("link.sh")).expect("hard link");
        let out = write(&f, "run.sh", "#!/bin/sh\n").await.expect("write");
        assert_eq!(out.output, "overwrote run.sh (10 bytes)");
        assert_eq!(fs::read_to_string(&path).expect("read"), "#!/bin/sh\n");
        let mode = fs::metadata(&path).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o751);
        assert_eq!(
            fs::read_to_string(f.root.join("link.sh")).expect("read"),
            "old"
        );
    }

    #[tokio::test]
    async fn writes_land_where_an_inside_symlink_leads() {
        let f = fixture();
        std::os::unix::fs::symlink("src", f.root.join("code")).expect("symlink");
        std::os::unix::fs::symlink("src/lib.rs", f.root.join("lib_link")).expect("symlink");
        let out = write(&f, "code/x.rs", "x").await.expect("write");
        assert_eq!(out.artifacts[0].path, "src/x.rs");
        let out = write(&f, "lib_link", "fn c() {}\n").await.expect("write");
        assert_eq!(out.output, "overwrote src/lib.rs (10 bytes)");
        assert!(fs::symlink_metadata(f.root.join("lib_link"))
            .expect("stat")
            .is_symlink());
        assert_eq!(
            fs::read_to_string(f.root.join("src/lib.rs")).expect("read"),
            "fn c() {}\n"
        );
    }

    #[tokio::test]
    async fn bad_writes_are_errors() {
        let f = fixture();
        for (path, expect) in [
            ("src", "is a directory: src"),
            (".", "not a file path"),
            ("src/..", "not a file path"),
            ("src/lib.rs/x", "not a directory: src/lib.rs/x"),
            ("", "not a file path"),
        ] {
            let err = write(&f, path, "x").await.expect_err(path);
            assert!(err.0.contains(expect), "{path}: {err}");
        }
        let err = WriteFile
            .call(&f.ctx, &json!({"path": "a.txt"}))
            .await
            .expect_err("no content");
        assert_eq!(err.0, "missing required argument: content");
        std::os::unix::fs::symlink("missing.txt", f.root.join("dangling")).expect("symlink");
        let err = write(&f, "dangling", "x").await.expect_err("dangling");
        assert!(
            err.0.contains("symlink to something that does not exist"),
            "{err}"
        );
        // A missing directory that is only passed through (`a/..`) is not created, as the
        // kernel would not walk it either.
        let err = write(&f, "made/../b.txt", "x").await.expect_err("missing");
        assert_eq!(err.0, "not found: made/../b.txt");
        assert!(!f.root.join("made").exists());
    }

    #[tokio::test]
    async fn edit_replaces_one_exact_occurrence() {
        let f = fixture();
        let out = edit(
            &f,
            json!({"path": "src/lib.rs", "old_string": "fn b() {}", "new_string": "fn b() { 1 }"}),
        )
        .await
        .expect("edit");
        assert_eq!(
            out.output,
            "edited src/lib.rs: replaced 1 occurrence at line 2"
        );
        let text = "fn a() {}\nfn b() { 1 }\nfn a() {}\n";
        assert_eq!(
            fs::read_to_string(f.root.join("src/lib.rs")).expect("read"),
            text
        );
        assert_eq!(out.artifacts[0].content, Bytes::from(text));
        assert_eq!(out.artifacts[0].media_type, "text/plain; charset=utf-8");
    }

    #[tokio::test]
    async fn ambiguous_or_missing_strings_are_errors_and_change_nothing() {
        let f = fixture();
        let before = fs::read_to_string(f.root.join("src/lib.rs")).expect("read");
        let cases = [
            (
                json!({"old_string": "fn a() {}", "new_string": "x"}),
                "found 2 times",
            ),
            (
                json!({"old_string": "fn z()", "new_string": "x"}),
                "was not found in src/lib.rs",
            ),
            (
                json!({"old_string": "", "new_string": "x"}),
                "must not be empty",
            ),
            (
                json!({"old_string": "fn a", "new_string": "fn a"}),
                "are the same",
            ),
            (
                json!({"old_string": "fn a", "replace_all": "yes", "new_string": "x"}),
                "true or false",
            ),
        ];
        for (mut args, expect) in cases {
            args["path"] = json!("src/lib.rs");
            let err = edit(&f, args.clone()).await.expect_err("refused");
            assert!(err.0.contains(expect), "{args}: {err}");
        }
        let after = fs::read_to_string(f.root.join("src/lib.rs")).expect("read");
        assert_eq!(before, after);
        let out = edit(
            &f,
            json!({"path": "src/lib.rs", "old_string": "fn a", "new_string": "fn c", "replace_all": true}),
        )
        .await
        .expect("edit");
        assert_eq!(
            out.output,
            "edited src/lib.rs: replaced 2 occurrences, the first at line 1"
        );
        assert_eq!(
            fs::read_to_string(f.root.join("src/lib.rs")).expect("read"),
            "fn c() {}\nfn b() {}\nfn c() {}\n"
        );
    }

    #[tokio::test]
    async fn edits_refuse_binary_missing_and_special_files() {
        let f = fixture();
        fs::write(f.root.join("bin"), b"\xff\xfe").expect("write");
        let args = |path: &str| json!({"path": path, "old_string": "a", "new_string": "b"});
        let err = edit(&f, args("bin")).await.expect_err("binary");
        assert!(err.0.contains("binary file: bin"), "{err}");
        let err = edit(&f, args("nope.rs")).await.expect_err("missing");
        assert_eq!(err.0, "not found: nope.rs");
        let err = edit(&f, args("src")).await.expect_err("directory");
        assert!(err.0.contains("is a directory"), "{err}");
    }
}
