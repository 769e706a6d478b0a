//! The built-in file tools, `list_files` and `read_file`, and the [`Workspace`] that confines
//! them. This module is the security boundary between the model and the host filesystem: every
//! path the model sends is checked here (relative only, no NUL, bounded length, no `..` or
//! symlink that leads outside the canonical root, regular files and directories only), output is
//! bounded (1000 entries, 64 KiB of text), and error messages never reveal where the workspace
//! lives. All filesystem work runs on the blocking pool so a slow disk never stalls the runtime.

use std::ffi::OsString;
use std::fs::{self, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{json, Value};

use super::{Tool, ToolError};
use crate::model::ToolSchema;

/// At most this many bytes of a file's text are returned.
const MAX_READ_BYTES: usize = 64 * 1024;
/// Extra bytes read past the limit so a multi-byte character cut by the limit can be told apart
/// from invalid UTF-8.
const READ_SLACK_BYTES: usize = 4;
/// A NUL byte within this many leading bytes marks a file as binary.
const BINARY_SNIFF_BYTES: usize = 8 * 1024;
/// At most this many directory entries are listed.
const MAX_LIST_ENTRIES: usize = 1000;
/// Longest path argument accepted (bytes), like Linux's `PATH_MAX`.
const MAX_PATH_BYTES: usize = 4096;
/// Longest echo of the model's path in an error message (characters).
const MAX_ECHO_CHARS: usize = 200;

/// `O_NONBLOCK`, so that opening a FIFO swapped in after the type check cannot hang. Regular
/// file reads ignore it. Spelled out per platform because `libc` is not a dependency.
#[cfg(all(
    any(target_os = "linux", target_os = "android"),
    any(
        target_arch = "x86",
        target_arch = "x86_64",
        target_arch = "arm",
        target_arch = "aarch64",
        target_arch = "riscv32",
        target_arch = "riscv64",
        target_arch = "powerpc",
        target_arch = "powerpc64",
        target_arch = "s390x",
        target_arch = "loongarch64"
    )
))]
const O_NONBLOCK: i32 = 0o4000;
#[cfg(any(
    target_os = "macos",
    target_os = "ios",
    target_os = "freebsd",
    target_os = "openbsd",
    target_os = "netbsd",
    target_os = "dragonfly"
))]
const O_NONBLOCK: i32 = 0x0004;
#[cfg(not(any(
    all(
        any(target_os = "linux", target_os = "android"),
        any(
            target_arch = "x86",
            target_arch = "x86_64",
            target_arch = "arm",
            target_arch = "aarch64",
            target_arch = "riscv32",
            target_arch = "riscv64",
            target_arch = "powerpc",
            target_arch = "powerpc64",
            target_arch = "s390x",
            target_arch = "loongarch64"
        )
    ),
    target_os = "macos",
    target_os = "ios",
    target_os = "freebsd",
    target_os = "openbsd",
    target_os = "netbsd",
    target_os = "dragonfly"
)))]
const O_NONBLOCK: i32 = 0;

/// The directory the file tools are confined to, canonicalized once at open.
#[derive(Clone, Debug)]
pub struct Workspace {
    root: Arc<PathBuf>,
}

impl Workspace {
    /// Opens `root` as a workspace; it must exist and be a directory.
    pub fn open(root: &Path) -> io::Result<Workspace> {
        let root = root.canonicalize()?;
        if !fs::metadata(&root)?.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the workspace root is not a directory",
            ));
        }
        Ok(Workspace {
            root: Arc::new(root),
        })
    }

    /// Runs `work` against the canonical root on the blocking pool.
    async fn run<F>(&self, rel: String, work: F) -> Result<String, ToolError>
    where
        F: FnOnce(&Path, &str) -> Result<String, ToolError> + Send + 'static,
    {
        let root = Arc::clone(&self.root);
        tokio::task::spawn_blocking(move || work(&root, &rel))
            .await
            .map_err(|_| ToolError("internal error while accessing the workspace".into()))?
    }
}

/// `list_files`: one directory's entries, not recursive.
pub struct ListFiles {
    workspace: Workspace,
}

impl ListFiles {
    pub fn new(workspace: Workspace) -> Self {
        ListFiles { workspace }
    }
}

/// `read_file`: a text file's contents, truncated to 64 KiB.
pub struct ReadFile {
    workspace: Workspace,
}

impl ReadFile {
    pub fn new(workspace: Workspace) -> Self {
        ReadFile { workspace }
    }
}

#[async_trait]
impl Tool for ListFiles {
    fn schema(&self) -> ToolSchema {
        ToolSchema {
            name: "list_files".into(),
            description: format!(
                "List the entries of a directory in the workspace (not recursive). One entry per \
                 line, sorted by name; directories end with '/'. Lines starting with '[' are \
                 notes. At most {MAX_LIST_ENTRIES} entries are shown."
            ),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "Directory to list, relative to the workspace root. \
                                        Defaults to \".\" (the root)."
                    }
                }
            }),
        }
    }

    async fn call(&self, arguments: &Value) -> Result<String, ToolError> {
        let rel = path_argument(arguments, false)?.unwrap_or_else(|| ".".to_owned());
        self.workspace.run(rel, list_blocking).await
    }
}

#[async_trait]
impl Tool for ReadFile {
    fn schema(&self) -> ToolSchema {
        ToolSchema {
            name: "read_file".into(),
            description: "Read a UTF-8 text file in the workspace. Files over 64 KiB are \
                          truncated with a note on the last line; binary files are refused."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {
                        "type": "string",
                        "description": "File to read, relative to the workspace root."
                    }
                },
                "required": ["path"]
            }),
        }
    }

    async fn call(&self, arguments: &Value) -> Result<String, ToolError> {
        let Some(rel) = path_argument(arguments, true)? else {
            return Err(ToolError("missing required argument: path".into()));
        };
        self.workspace.run(rel, read_blocking).await
    }
}

/// The `path` argument: `Ok(None)` when absent (an error if `required`).
fn path_argument(arguments: &Value, required: bool) -> Result<Option<String>, ToolError> {
    let value = match arguments {
        Value::Object(map) => map.get("path").filter(|v| !v.is_null()),
        Value::Null => None,
        _ => return Err(ToolError("arguments must be a JSON object".into())),
    };
    match value {
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ToolError("argument `path` must be a string".into())),
        None if required => Err(ToolError("missing required argument: path".into())),
        None => Ok(None),
    }
}

/// The model's path as it may appear in a message: bounded, control characters escaped.
fn echo(rel: &str) -> String {
    let mut out = printable(&rel.chars().take(MAX_ECHO_CHARS).collect::<String>());
    if rel.chars().nth(MAX_ECHO_CHARS).is_some() {
        out.push('…');
    }
    out
}

/// `s` with control characters (newlines included) escaped, so one name stays one line.
fn printable(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_owned();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// An I/O failure on `rel` as a tool error; the OS message is not used since it may carry paths.
fn io_error(rel: &str, error: &io::Error) -> ToolError {
    match error.kind() {
        io::ErrorKind::NotFound => ToolError(format!("not found: {}", echo(rel))),
        io::ErrorKind::PermissionDenied => ToolError(format!("permission denied: {}", echo(rel))),
        kind => ToolError(format!("cannot access {}: {kind}", echo(rel))),
    }
}

/// Syntactic checks before touching the filesystem.
fn check_path_syntax(rel: &str) -> Result<(), ToolError> {
    if rel.len() > MAX_PATH_BYTES {
        return Err(ToolError(format!(
            "path too long ({} bytes, limit {MAX_PATH_BYTES})",
            rel.len()
        )));
    }
    if rel.contains('\0') {
        return Err(ToolError("path contains a NUL byte".into()));
    }
    let path = Path::new(rel);
    // The path itself is not echoed: it may name the workspace's own location.
    let absolute = || {
        ToolError(
            "absolute paths are not allowed; use a path relative to the workspace root".into(),
        )
    };
    if rel.starts_with('/') || path.is_absolute() {
        return Err(absolute());
    }
    let mut depth: usize = 0;
    for component in path.components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth = depth.checked_sub(1).ok_or_else(|| outside_error(rel))?;
            }
            Component::RootDir | Component::Prefix(_) => return Err(absolute()),
        }
    }
    Ok(())
}

fn outside_error(rel: &str) -> ToolError {
    ToolError(format!("path leads outside the workspace: {}", echo(rel)))
}

/// Resolves `rel` to a canonical path inside `root`, with its (unfollowed) metadata.
fn resolve(root: &Path, rel: &str) -> Result<(PathBuf, Metadata), ToolError> {
    check_path_syntax(rel)?;
    let canonical = fs::canonicalize(root.join(rel)).map_err(|e| io_error(rel, &e))?;
    if !canonical.starts_with(root) {
        return Err(outside_error(rel));
    }
    // The canonical path holds no symlinks; `symlink_metadata` makes a symlink swapped in since
    // then show up as a non-regular file rather than be followed.
    let metadata = fs::symlink_metadata(&canonical).map_err(|e| io_error(rel, &e))?;
    Ok((canonical, metadata))
}

fn list_blocking(root: &Path, rel: &str) -> Result<String, ToolError> {
    let (dir, metadata) = resolve(root, rel)?;
    if !metadata.is_dir() {
        return Err(ToolError(format!("not a directory: {}", echo(rel))));
    }
    let mut names: Vec<OsString> = fs::read_dir(&dir)
        .map_err(|e| io_error(rel, &e))?
        .filter_map(|entry| entry.ok().map(|entry| entry.file_name()))
        .collect();
    if names.is_empty() {
        return Ok("[empty directory]".into());
    }
    names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));

    let mut lines: Vec<String> = names
        .iter()
        .take(MAX_LIST_ENTRIES)
        .map(|name| {
            let mut line = printable(&name.to_string_lossy());
            if is_listed_as_dir(root, &dir.join(name)) {
                line.push('/');
            }
            line
        })
        .collect();
    if names.len() > MAX_LIST_ENTRIES {
        lines.push(format!(
            "[... {} more entries not shown]",
            names.len() - MAX_LIST_ENTRIES
        ));
    }
    Ok(lines.join("\n"))
}

/// A directory, or a symlink to a directory inside the workspace.
fn is_listed_as_dir(root: &Path, entry: &Path) -> bool {
    match fs::symlink_metadata(entry) {
        Ok(m) if m.is_dir() => true,
        Ok(m) if m.file_type().is_symlink() => fs::canonicalize(entry)
            .ok()
            .filter(|target| target.starts_with(root))
            .and_then(|target| fs::symlink_metadata(target).ok())
            .is_some_and(|m| m.is_dir()),
        _ => false,
    }
}

fn read_blocking(root: &Path, rel: &str) -> Result<String, ToolError> {
    let (path, metadata) = resolve(root, rel)?;
    if metadata.is_dir() {
        return Err(ToolError(format!(
            "is a directory: {} (use list_files)",
            echo(rel)
        )));
    }
    if !metadata.is_file() {
        return Err(ToolError(format!("not a regular file: {}", echo(rel))));
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(O_NONBLOCK)
        .open(&path)
        .map_err(|e| io_error(rel, &e))?;
    // What was opened must be the file that was checked (no swap in between).
    let opened = file.metadata().map_err(|e| io_error(rel, &e))?;
    if !opened.is_file() || opened.dev() != metadata.dev() || opened.ino() != metadata.ino() {
        return Err(ToolError(format!(
            "file changed while being opened: {}",
            echo(rel)
        )));
    }

    let limit = MAX_READ_BYTES + READ_SLACK_BYTES;
    let mut buf = Vec::with_capacity(limit);
    file.take(limit as u64)
        .read_to_end(&mut buf)
        .map_err(|e| io_error(rel, &e))?;
    let truncated = buf.len() > MAX_READ_BYTES;

    if buf[..buf.len().min(BINARY_SNIFF_BYTES)].contains(&0) {
        return Err(ToolError(format!(
            "binary file: {} (contains NUL bytes)",
            echo(rel)
        )));
    }
    let not_text = || ToolError(format!("binary file: {} (not UTF-8 text)", echo(rel)));
    let valid_len = match std::str::from_utf8(&buf) {
        Ok(_) => buf.len(),
        // A character cut by the read limit is not an error.
        Err(e) if truncated && e.error_len().is_none() => e.valid_up_to(),
        Err(_) => return Err(not_text()),
    };
    let text = std::str::from_utf8(&buf[..valid_len]).map_err(|_| not_text())?;
    if !truncated {
        return Ok(text.to_owned());
    }
    let mut shown = MAX_READ_BYTES.min(text.len());
    while !text.is_char_boundary(shown) {
        shown -= 1;
    }
    let total = opened.len().max(buf.len() as u64);
    Ok(format!(
        "{}\n[truncated: showed the first {shown} of {total} bytes]",
        &text[..shown]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::Write;
    use std::time::Duration;

    /// A workspace with `README.md`, `src/main.rs` and `notes.txt`, plus a sibling directory
    /// outside it holding `secret.txt`.
    struct Fixture {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        outside: PathBuf,
        list: ListFiles,
        read: ReadFile,
    }

    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = tmp.path().join("ws");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(root.join("src")).expect("mkdir src");
        fs::create_dir_all(&outside).expect("mkdir outside");
        fs::write(root.join("README.md"), "# Demo\n\nA demo workspace.\n").expect("readme");
        fs::write(root.join("src/main.rs"), "fn main() {}\n").expect("main");
        fs::write(root.join("notes.txt"), "notes\n").expect("notes");
        fs::write(outside.join("secret.txt"), "TOP SECRET\n").expect("secret");
        let ws = Workspace::open(&root).expect("open");
        let root = root.canonicalize().expect("canon");
        Fixture {
            _tmp: tmp,
            outside: outside.canonicalize().expect("canon"),
            list: ListFiles::new(ws.clone()),
            read: ReadFile::new(ws),
            root,
        }
    }

    async fn read(f: &Fixture, path: &str) -> Result<String, ToolError> {
        bounded(f.read.call(&json!({ "path": path }))).await
    }

    async fn list(f: &Fixture, path: &str) -> Result<String, ToolError> {
        bounded(f.list.call(&json!({ "path": path }))).await
    }

    /// Every call must finish promptly.
    async fn bounded(
        call: impl std::future::Future<Output = Result<String, ToolError>>,
    ) -> Result<String, ToolError> {
        tokio::time::timeout(Duration::from_secs(20), call)
            .await
            .expect("tool call hung")
    }

    /// A refusal that does not leak the workspace's or the outside's location or content.
    fn assert_refused(f: &Fixture, result: Result<String, ToolError>, expect: &str) {
        let err = result.expect_err("expected a tool error");
        let msg = err.0;
        assert!(msg.contains(expect), "{msg:?} should contain {expect:?}");
        let parent = f
            .root
            .parent()
            .expect("parent")
            .to_string_lossy()
            .into_owned();
        assert!(!msg.contains(&parent), "{msg:?} leaks a host path");
        assert!(!msg.contains("SECRET"), "{msg:?} leaks content");
        assert!(msg.len() < 600, "message too long: {} bytes", msg.len());
    }

    #[test]
    fn schemas_are_well_formed() {
        let f = fixture();
        let list = f.list.schema();
        assert_eq!(list.name, "list_files");
        assert!(!list.description.is_empty());
        assert_eq!(list.parameters["type"], "object");
        assert_eq!(list.parameters["properties"]["path"]["type"], "string");
        let read = f.read.schema();
        assert_eq!(read.name, "read_file");
        assert!(!read.description.is_empty());
        assert_eq!(read.parameters["required"], json!(["path"]));
        assert_eq!(read.parameters["properties"]["path"]["type"], "string");
    }

    #[test]
    fn open_rejects_missing_and_non_directory_roots() {
        let tmp = tempfile::tempdir().expect("tempdir");
        assert!(Workspace::open(&tmp.path().join("nope")).is_err());
        let file = tmp.path().join("file");
        fs::write(&file, "x").expect("write");
        assert!(Workspace::open(&file).is_err());
    }

    #[tokio::test]
    async fn lists_root_sorted_with_dir_slashes() {
        let f = fixture();
        let out = list(&f, ".").await.expect("list");
        assert_eq!(out, "README.md\nnotes.txt\nsrc/");
        // The default path is ".", and so are an empty path and a null one.
        let default = bounded(f.list.call(&json!({}))).await.expect("list");
        assert_eq!(default, out);
        assert_eq!(list(&f, "").await.expect("list"), out);
        let null = bounded(f.list.call(&json!({ "path": null }))).await;
        assert_eq!(null.expect("list"), out);
        assert_eq!(list(&f, "src").await.expect("list"), "main.rs");
        assert_eq!(list(&f, "./src/").await.expect("list"), "main.rs");
    }

    #[tokio::test]
    async fn lists_empty_directory_with_a_note() {
        let f = fixture();
        fs::create_dir(f.root.join("empty")).expect("mkdir");
        assert_eq!(list(&f, "empty").await.expect("list"), "[empty directory]");
    }

    #[tokio::test]
    async fn list_of_a_file_or_missing_dir_is_an_error() {
        let f = fixture();
        assert_refused(&f, list(&f, "README.md").await, "not a directory");
        assert_refused(&f, list(&f, "nope").await, "not found: nope");
    }

    #[tokio::test]
    async fn reads_readme_and_multibyte_text_round_trips() {
        let f = fixture();
        let out = read(&f, "README.md").await.expect("read");
        assert_eq!(out, "# Demo\n\nA demo workspace.\n");
        let text = "héllo wörld — 日本語 🦀\nzweite Zeile ✓\n";
        fs::write(f.root.join("utf8.txt"), text).expect("write");
        assert_eq!(read(&f, "utf8.txt").await.expect("read"), text);
        assert_eq!(read(&f, "src/../utf8.txt").await.expect("read"), text);
        fs::write(f.root.join("empty.txt"), "").expect("write");
        assert_eq!(read(&f, "empty.txt").await.expect("read"), "");
    }

    #[tokio::test]
    async fn dot_dot_chains_are_refused() {
        let f = fixture();
        for path in [
            "../../etc/passwd",
            "..",
            "../",
            "./../",
            "a/../../x",
            "src/../../outside/secret.txt",
            "../outside/secret.txt",
            "src/../..",
            "./././../../../../../../../../etc/shadow",
        ] {
            assert_refused(&f, read(&f, path).await, "outside the workspace");
            assert_refused(&f, list(&f, path).await, "outside the workspace");
        }
    }

    #[tokio::test]
    async fn absolute_paths_are_refused() {
        let f = fixture();
        let inside = f.root.join("README.md").to_string_lossy().into_owned();
        for path in [
            "/etc/passwd",
            "/proc/self/environ",
            "/proc/self/cwd/README.md",
            "/",
            "//etc",
            inside.as_str(),
        ] {
            assert_refused(&f, read(&f, path).await, "absolute paths are not allowed");
            assert_refused(&f, list(&f, path).await, "absolute paths are not allowed");
        }
    }

    #[tokio::test]
    async fn symlinks_to_outside_are_refused() {
        let f = fixture();
        std::os::unix::fs::symlink(f.outside.join("secret.txt"), f.root.join("file_link"))
            .expect("symlink");
        std::os::unix::fs::symlink(&f.outside, f.root.join("dir_link")).expect("symlink");
        std::os::unix::fs::symlink("../outside", f.root.join("rel_link")).expect("symlink");
        std::os::unix::fs::symlink("/proc/self/environ", f.root.join("env_link")).expect("symlink");
        std::os::unix::fs::symlink("/etc", f.root.join("etc_link")).expect("symlink");
        std::os::unix::fs::symlink(f.outside.join("missing"), f.root.join("dangling"))
            .expect("symlink");

        for path in [
            "file_link",
            "dir_link/secret.txt",
            "rel_link/secret.txt",
            "env_link",
            "etc_link/passwd",
        ] {
            assert_refused(&f, read(&f, path).await, "outside the workspace");
        }
        for path in ["dir_link", "rel_link", "etc_link", "dir_link/."] {
            assert_refused(&f, list(&f, path).await, "outside the workspace");
        }
        // `a/..` where `a` leads outside resolves outside, too.
        assert_refused(&f, list(&f, "dir_link/..").await, "outside the workspace");
        // A dangling link is just "not found", without naming the target.
        assert_refused(&f, read(&f, "dangling").await, "not found: dangling");

        // The links are listed by name, without '/' since they do not lead to an inside dir.
        let out = list(&f, ".").await.expect("list");
        let lines: Vec<&str> = out.lines().collect();
        for name in [
            "dangling",
            "dir_link",
            "env_link",
            "etc_link",
            "file_link",
            "rel_link",
        ] {
            assert!(lines.contains(&name), "{name} missing from {out:?}");
        }
        assert!(!out.contains("secret"), "{out:?}");
    }

    #[tokio::test]
    async fn symlinks_inside_are_followed() {
        let f = fixture();
        std::os::unix::fs::symlink("README.md", f.root.join("readme_link")).expect("symlink");
        std::os::unix::fs::symlink("src", f.root.join("src_link")).expect("symlink");
        std::os::unix::fs::symlink(f.root.join("src"), f.root.join("abs_src_link"))
            .expect("symlink");
        assert_eq!(
            read(&f, "readme_link").await.expect("read"),
            "# Demo\n\nA demo workspace.\n"
        );
        assert_eq!(list(&f, "src_link").await.expect("list"), "main.rs");
        assert_eq!(
            read(&f, "abs_src_link/main.rs").await.expect("read"),
            "fn main() {}\n"
        );
        let out = list(&f, ".").await.expect("list");
        assert_eq!(
            out,
            "README.md\nabs_src_link/\nnotes.txt\nreadme_link\nsrc/\nsrc_link/"
        );
    }

    #[tokio::test]
    async fn symlink_loops_are_an_error() {
        let f = fixture();
        std::os::unix::fs::symlink("loop_b", f.root.join("loop_a")).expect("symlink");
        std::os::unix::fs::symlink("loop_a", f.root.join("loop_b")).expect("symlink");
        assert!(read(&f, "loop_a").await.is_err());
        assert!(list(&f, "loop_a").await.is_err());
        let out = list(&f, ".").await.expect("list");
        assert!(out.lines().any(|l| l == "loop_a"), "{out:?}");
    }

    #[tokio::test]
    async fn nul_bytes_and_overlong_paths_are_refused() {
        let f = fixture();
        assert_refused(&f, read(&f, "README.md\0").await, "NUL byte");
        assert_refused(&f, list(&f, "src\0/../..").await, "NUL byte");
        let long = "a".repeat(5000);
        let err = read(&f, &long).await.expect_err("too long");
        assert!(err.0.contains("path too long"), "{err}");
        assert!(err.0.len() < 100, "the path must not be echoed: {err}");
        assert!(list(&f, &long).await.is_err());
        // A component over NAME_MAX but a path under 4096 bytes: an OS error, bounded message.
        let err = read(&f, &"b".repeat(300)).await.expect_err("name too long");
        assert!(err.0.len() < 400, "{err}");
        let err = list(&f, &"c/".repeat(2000)).await.expect_err("missing");
        assert!(err.0.len() < 400, "{err}");
    }

    #[tokio::test]
    async fn control_characters_are_escaped() {
        let f = fixture();
        fs::write(f.root.join("evil\nREADME.md"), "x").expect("write");
        let out = list(&f, ".").await.expect("list");
        assert!(out.lines().any(|l| l == "evil\\nREADME.md"), "{out:?}");
        assert_eq!(out.lines().filter(|l| *l == "README.md").count(), 1);
        let err = read(&f, "missing\nfile").await.expect_err("missing");
        assert!(!err.0.contains('\n'), "{err:?}");
    }

    #[tokio::test]
    async fn non_utf8_names_are_listed_lossily() {
        let f = fixture();
        let name = std::ffi::OsStr::from_bytes(b"caf\xe9.txt");
        fs::write(f.root.join(name), "bonjour").expect("write");
        let out = list(&f, ".").await.expect("list");
        assert!(
            out.lines().any(|l| l == "caf\u{fffd}.txt"),
            "lossy name missing from {out:?}"
        );
        assert_refused(&f, read(&f, "caf\u{fffd}.txt").await, "not found");
    }

    #[tokio::test]
    async fn large_file_is_truncated_with_a_note() {
        let f = fixture();
        let size = 5 * 1024 * 1024;
        let mut file = File::create(f.root.join("big.txt")).expect("create");
        let line = "0123456789abcdef".repeat(4) + "\n";
        let mut written = 0;
        while written < size {
            file.write_all(line.as_bytes()).expect("write");
            written += line.len();
        }
        drop(file);
        let out = read(&f, "big.txt").await.expect("read");
        let note = format!("\n[truncated: showed the first {MAX_READ_BYTES} of {written} bytes]");
        assert!(out.ends_with(&note), "{:?}", &out[out.len() - 80..]);
        assert_eq!(out.len(), MAX_READ_BYTES + note.len());
    }

    #[tokio::test]
    async fn truncation_respects_char_boundaries() {
        let f = fixture();
        // 3-byte characters: 64 KiB is not a multiple of 3, so the cut falls mid-character.
        let text = "€".repeat(30_000);
        fs::write(f.root.join("euro.txt"), &text).expect("write");
        let out = read(&f, "euro.txt").await.expect("read");
        let shown = MAX_READ_BYTES / 3 * 3;
        let note = format!(
            "\n[truncated: showed the first {shown} of {} bytes]",
            text.len()
        );
        assert!(out.ends_with(&note), "{:?}", &out[out.len() - 80..]);
        assert_eq!(&out[..shown], &text[..shown]);
        // Exactly 64 KiB is not truncated.
        let exact = "x".repeat(MAX_READ_BYTES);
        fs::write(f.root.join("exact.txt"), &exact).expect("write");
        assert_eq!(read(&f, "exact.txt").await.expect("read"), exact);
    }

    #[tokio::test]
    async fn binary_files_are_refused() {
        let f = fixture();
        let mut bin = b"\x7fELF\x02\x01\x01".to_vec();
        bin.extend_from_slice(&[0u8; 64]);
        fs::write(f.root.join("prog"), &bin).expect("write");
        assert_refused(&f, read(&f, "prog").await, "binary file: prog");
        fs::write(f.root.join("latin1.txt"), b"caf\xe9 au lait").expect("write");
        assert_refused(&f, read(&f, "latin1.txt").await, "binary file: latin1.txt");
        // A truncated final character is invalid in a file that fits entirely.
        fs::write(f.root.join("cut.txt"), &"€".as_bytes()[..2]).expect("write");
        assert_refused(&f, read(&f, "cut.txt").await, "binary file");
        // Invalid UTF-8 in a large file, within the part read.
        let mut big = "a".repeat(10_000).into_bytes();
        big.push(0xff);
        big.extend_from_slice(&[b'a'; 100_000]);
        fs::write(f.root.join("big_bad.txt"), &big).expect("write");
        assert_refused(&f, read(&f, "big_bad.txt").await, "binary file");
    }

    #[tokio::test]
    async fn reading_a_directory_is_an_error() {
        let f = fixture();
        assert_refused(&f, read(&f, "src").await, "is a directory");
        assert_refused(&f, read(&f, ".").await, "is a directory");
        assert_refused(&f, read(&f, "README.md/x").await, "README.md/x");
    }

    #[tokio::test]
    async fn deep_tree_is_listed_and_read() {
        let f = fixture();
        let deep = vec!["d"; 200].join("/");
        fs::create_dir_all(f.root.join(&deep)).expect("mkdir deep");
        fs::write(f.root.join(&deep).join("leaf.txt"), "leaf").expect("write");
        assert_eq!(list(&f, &deep).await.expect("list"), "leaf.txt");
        assert_eq!(
            read(&f, &format!("{deep}/leaf.txt")).await.expect("read"),
            "leaf"
        );
        let up = format!("{deep}/{}", vec![".."; 201].join("/"));
        assert_refused(&f, list(&f, &up).await, "outside the workspace");
    }

    #[tokio::test]
    async fn huge_directory_is_capped() {
        let f = fixture();
        let dir = f.root.join("many");
        fs::create_dir(&dir).expect("mkdir");
        for i in 0..100_000 {
            File::create(dir.join(format!("f{i:06}"))).expect("create");
        }
        let started = std::time::Instant::now();
        let out = list(&f, "many").await.expect("list");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), MAX_LIST_ENTRIES + 1);
        assert_eq!(lines[0], "f000000");
        assert_eq!(lines[MAX_LIST_ENTRIES - 1], "f000999");
        assert_eq!(
            lines[MAX_LIST_ENTRIES],
            "[... 99000 more entries not shown]"
        );
        assert!(started.elapsed() < Duration::from_secs(15));
    }

    #[tokio::test]
    async fn fifo_is_refused_without_hanging() {
        let f = fixture();
        let status = std::process::Command::new("mkfifo")
            .arg(f.root.join("pipe"))
            .status()
            .expect("run mkfifo");
        assert!(status.success());
        std::os::unix::fs::symlink("pipe", f.root.join("pipe_link")).expect("symlink");
        let five = Duration::from_secs(5);
        let (pipe, pipe_link) = (json!({ "path": "pipe" }), json!({ "path": "pipe_link" }));
        let result = tokio::time::timeout(five, f.read.call(&pipe))
            .await
            .expect("read_file on a FIFO hung");
        assert_refused(&f, result, "not a regular file: pipe");
        let result = tokio::time::timeout(five, f.read.call(&pipe_link))
            .await
            .expect("read_file on a FIFO link hung");
        assert_refused(&f, result, "not a regular file");
        let result = tokio::time::timeout(five, f.list.call(&pipe))
            .await
            .expect("list_files on a FIFO hung");
        assert_refused(&f, result, "not a directory");
        let out = list(&f, ".").await.expect("list");
        assert!(out.lines().any(|l| l == "pipe"), "{out:?}");
    }

    #[tokio::test]
    async fn device_files_are_refused() {
        let f = fixture();
        std::os::unix::fs::symlink("/dev/zero", f.root.join("zero")).expect("symlink");
        assert_refused(&f, read(&f, "zero").await, "outside the workspace");
    }

    #[tokio::test]
    async fn bad_arguments_are_errors() {
        let f = fixture();
        let missing = bounded(f.read.call(&json!({}))).await;
        assert_refused(&f, missing, "missing required argument: path");
        let null = bounded(f.read.call(&Value::Null)).await;
        assert_refused(&f, null, "missing required argument: path");
        for args in [
            json!({ "path": 42 }),
            json!({ "path": ["README.md"] }),
            json!({ "path": { "p": "x" } }),
            json!({ "path": true }),
        ] {
            let r = bounded(f.read.call(&args)).await;
            assert_refused(&f, r, "must be a string");
            let l = bounded(f.list.call(&args)).await;
            assert_refused(&f, l, "must be a string");
        }
        for args in [json!("README.md"), json!([1, 2]), json!(3)] {
            let r = bounded(f.read.call(&args)).await;
            assert_refused(&f, r, "must be a JSON object");
            let l = bounded(f.list.call(&args)).await;
            assert_refused(&f, l, "must be a JSON object");
        }
        // Unknown extra arguments are ignored.
        let extra = bounded(f.read.call(&json!({ "path": "notes.txt", "x": 1 }))).await;
        assert_eq!(extra.expect("read"), "notes\n");
    }

    #[tokio::test]
    async fn registry_runs_the_builtin_tools() {
        let f = fixture();
        let registry = crate::tools::ToolRegistry::builtin(&f.root).expect("registry");
        let names: Vec<String> = registry.schemas().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["list_files", "read_file"]);
    }
}
