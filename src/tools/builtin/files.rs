//! `list_files` and `read_file`: what is in the workspace, and a text file's lines. Every path
//! goes through the [`Workspace`](crate::tools::Workspace), which confines it; output is bounded
//! (1,000 entries; 64 KiB of text, numbered lines included) and all filesystem work runs on the
//! blocking pool so a slow disk never stalls the runtime.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use async_trait::async_trait;
use rustix::fs::{openat, statat, AtFlags, Dir, FileType, Mode, OFlags};
use serde_json::{json, Value};

use super::{
    cut_at_char, dir_arg, int_arg, path_property, path_subject, required_string, MAX_OUTPUT_BYTES,
    NOTE_ROOM,
};
use crate::tools::workspace::{echo, escape_name, io_error, Workspace};
use crate::tools::{Subject, Tool, ToolContext, ToolError, ToolResult};

/// At most this many directory entries are listed.
const MAX_LIST_ENTRIES: usize = 1000;
/// Deepest listing `depth` accepted.
const MAX_LIST_DEPTH: u64 = 5;
/// Lines `read_file` shows when the call names no `limit`.
const DEFAULT_READ_LINES: u64 = 2000;
/// Bytes of numbered text `read_file` shows at most, before its closing note.
const READ_BUDGET: usize = MAX_OUTPUT_BYTES - NOTE_ROOM;
/// A NUL byte within this many leading bytes marks a file as binary.
const BINARY_SNIFF_BYTES: usize = 8 * 1024;

/// `list_files`: a directory's entries, `depth` levels down.
pub struct ListFiles;

/// `read_file`: a text file's lines, numbered.
pub struct ReadFile;

#[async_trait]
impl Tool for ListFiles {
    fn name(&self) -> &str {
        "list_files"
    }

    fn description(&self) -> String {
        format!(
            "List the entries of a directory in the workspace. One entry per line, sorted by \
             name; directories end with '/'. With depth > 1, the entries of subdirectories \
             follow their directory, as paths relative to the listed one. Lines starting with \
             '[' are notes. At most {MAX_LIST_ENTRIES} entries are shown."
        )
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": path_property("Directory to list", Some("\".\" (the root)")),
                "depth": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_LIST_DEPTH,
                    "description": "How many levels to list: 1 (the default) lists only the \
                                    directory's own entries."
                }
            }
        })
    }

    async fn subject(&self, ctx: &ToolContext, input: &Value) -> Subject {
        path_subject(ctx, input, Some(".")).await
    }

    async fn call(&self, ctx: &ToolContext, input: &Value) -> Result<ToolResult, ToolError> {
        let rel = dir_arg(input)?;
        let depth = int_arg(input, "depth", 1, MAX_LIST_DEPTH)?.unwrap_or(1) as usize;
        let listed = ctx
            .workspace
            .run(move |ws| list_blocking(ws, &rel, depth))
            .await?;
        Ok(listed.into())
    }
}

#[async_trait]
impl Tool for ReadFile {
    fn name(&self) -> &str {
        "read_file"
    }

    fn description(&self) -> String {
        format!(
            "Read a UTF-8 text file in the workspace. Lines are numbered as `cat -n` does \
             (number, tab, line). Shows at most `limit` lines (default {DEFAULT_READ_LINES}) \
             from line `offset` (1-based, default 1) and at most {} KiB; a note on the last line \
             says when more lines follow and which offset reads on. Binary files are refused.",
            MAX_OUTPUT_BYTES / 1024
        )
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": path_property("File to read", None),
                "offset": {
                    "type": "integer",
                    "minimum": 1,
                    "description": "First line to show (1-based). Defaults to 1."
                },
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "description": format!("Most lines to show. Defaults to {DEFAULT_READ_LINES}.")
                }
            },
            "required": ["path"]
        })
    }

    async fn subject(&self, ctx: &ToolContext, input: &Value) -> Subject {
        path_subject(ctx, input, None).await
    }

    async fn call(&self, ctx: &ToolContext, input: &Value) -> Result<ToolResult, ToolError> {
        let rel = required_string(input, "path")?;
        let offset = int_arg(input, "offset", 1, u64::MAX)?.unwrap_or(1);
        let limit = int_arg(input, "limit", 1, u64::MAX)?.unwrap_or(DEFAULT_READ_LINES);
        let text = ctx
            .workspace
            .run(move |ws| read_blocking(ws, &rel, offset, limit))
            .await?;
        Ok(text.into())
    }
}

/// A listing being built, bounded to [`MAX_LIST_ENTRIES`] lines.
#[derive(Default)]
struct Listing {
    lines: Vec<String>,
    /// Entries seen but not shown.
    hidden: usize,
    /// Directories below the cut were not read, so `hidden` is a lower bound.
    partial: bool,
}

fn list_blocking(ws: &Workspace, rel: &str, depth: usize) -> Result<String, ToolError> {
    let (canon, dir) = ws.open_dir(rel)?;
    let mut listing = Listing::default();
    let names = read_names(&dir).map_err(|e| io_error(rel, &e))?;
    if names.is_empty() {
        return Ok("[empty directory]".into());
    }
    list_into(ws, &dir, &canon, names, "", depth, &mut listing);
    if listing.hidden > 0 {
        let at_least = if listing.partial { "at least " } else { "" };
        listing.lines.push(format!(
            "[... {at_least}{} more entries not shown]",
            listing.hidden
        ));
    }
    Ok(listing.lines.join("\n"))
}

/// Lists `names` (the entries of `dir`, at `canon` under the root) into `listing`, each line
/// prefixed with `prefix`, descending `depth - 1` more levels into real directories (never
/// through a symlink, so a listing cannot loop or leave the workspace).
fn list_into(
    ws: &Workspace,
    dir: &OwnedFd,
    canon: &Path,
    names: Vec<OsString>,
    prefix: &str,
    depth: usize,
    listing: &mut Listing,
) {
    let count = names.len();
    for (i, name) in names.into_iter().enumerate() {
        if listing.lines.len() >= MAX_LIST_ENTRIES {
            listing.hidden += count - i;
            listing.partial |= depth > 1;
            return;
        }
        let kind = statat(dir, &name, AtFlags::SYMLINK_NOFOLLOW)
            .map(|stat| FileType::from_raw_mode(stat.st_mode))
            .ok();
        let is_dir = match kind {
            Some(FileType::Directory) => true,
            Some(FileType::Symlink) => ws.link_leads_to_dir(dir, canon, &name),
            _ => false,
        };
        let mut line = format!("{prefix}{}", escape_name(name.as_bytes()));
        if is_dir {
            line.push('/');
        }
        listing.lines.push(line.clone());
        if depth > 1 && kind == Some(FileType::Directory) {
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            // A subdirectory that cannot be read is listed without its entries.
            if let Ok(child) = openat(dir, &name, flags, Mode::empty()) {
                if let Ok(names) = read_names(&child) {
                    let canon = canon.join(&name);
                    list_into(ws, &child, &canon, names, &line, depth - 1, listing);
                }
            }
        }
    }
}

/// A directory's entry names, sorted by their bytes.
pub(super) fn read_names(dir: &OwnedFd) -> io::Result<Vec<OsString>> {
    let mut names = Vec::new();
    for entry in Dir::read_from(dir)? {
        let entry = entry?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name != "." && name != ".." {
            names.push(name.to_owned());
        }
    }
    names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok(names)
}

fn read_blocking(ws: &Workspace, rel: &str, offset: u64, limit: u64) -> Result<String, ToolError> {
    let (_, file) = ws.open_file(rel)?;
    let total = file.metadata().map_err(|e| io_error(rel, &e))?.len();
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let io = |e: io::Error| io_error(rel, &e);
    let head = reader.fill_buf().map_err(io)?;
    if head[..head.len().min(BINARY_SNIFF_BYTES)].contains(&0) {
        return Err(ToolError(format!(
            "binary file: {} (contains NUL bytes)",
            echo(rel)
        )));
    }
    let not_text = || ToolError(format!("binary file: {} (not UTF-8 text)", echo(rel)));

    for skipped in 1..offset {
        if !skip_line(&mut reader).map_err(io)? {
            return Err(past_end(rel, offset, skipped - 1));
        }
    }
    let mut out = String::new();
    let mut line = Vec::new();
    let mut number = offset;
    let mut shown_bytes: u64 = 0;
    let note = loop {
        if number - offset == limit {
            let more = !reader.fill_buf().map_err(io)?.is_empty();
            break more.then(|| {
                format!(
                    "[showed lines {offset}-{}; more lines follow: read on with offset={number}]",
                    number - 1
                )
            });
        }
        let prefix = format!("{number:>6}\t");
        let room = READ_BUDGET.saturating_sub(out.len() + prefix.len());
        let Some(read) = read_line(&mut reader, room, &mut line).map_err(io)? else {
            if number == offset && offset > 1 {
                return Err(past_end(rel, offset, offset - 1));
            }
            break None;
        };
        if let Read::Whole { newline } = read {
            let text = std::str::from_utf8(&line).map_err(|_| not_text())?;
            out.push_str(&prefix);
            out.push_str(text);
            if newline {
                out.push('\n');
            }
            shown_bytes += line.len() as u64 + u64::from(newline);
            number += 1;
            continue;
        }
        // The line does not fit: show it cut only when it is the first, else stop before it.
        if number > offset {
            break Some(format!(
                "[truncated: showed {}{shown_bytes} of {total} bytes (lines {offset}-{}); more \
                 lines follow: read on with offset={number}]",
                if offset == 1 { "the first " } else { "" },
                number - 1
            ));
        }
        let valid = match std::str::from_utf8(&line) {
            Ok(text) => text,
            // A character cut by the read is not an error.
            Err(e) if e.error_len().is_none() => {
                std::str::from_utf8(&line[..e.valid_up_to()]).map_err(|_| not_text())?
            }
            Err(_) => return Err(not_text()),
        };
        let text = cut_at_char(valid, room);
        out.push_str(&prefix);
        out.push_str(text);
        break Some(format!(
            "[truncated: line {number} is too long; showed its first {} bytes (the file has \
             {total}); read on with offset={}]",
            text.len(),
            number + 1
        ));
    };
    if let Some(note) = note {
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&note);
    }
    Ok(out)
}

/// How [`read_line`] found the line.
enum Read {
    Whole {
        newline: bool,
    },
    /// Longer than the room: the buffer holds its first bytes.
    Cut,
}

/// Reads the next line (without its `\n`) into `line`, at most `room` bytes of it. `None` at
/// the end of the file. A cut line is not consumed further.
fn read_line(
    reader: &mut BufReader<File>,
    room: usize,
    line: &mut Vec<u8>,
) -> io::Result<Option<Read>> {
    line.clear();
    let mut any = false;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(any.then_some(Read::Whole { newline: false }));
        }
        any = true;
        let end = buf.iter().position(|&b| b == b'\n');
        let chunk = &buf[..end.unwrap_or(buf.len())];
        if line.len() + chunk.len() > room {
            // Up to 3 bytes past the room tell a character cut there from invalid UTF-8.
            let fits = room - line.len();
            line.extend_from_slice(&chunk[..fits + (chunk.len() - fits).min(3)]);
            return Ok(Some(Read::Cut));
        }
        line.extend_from_slice(chunk);
        let used = chunk.len() + usize::from(end.is_some());
        reader.consume(used);
        if end.is_some() {
            return Ok(Some(Read::Whole { newline: true }));
        }
    }
}

fn past_end(rel: &str, offset: u64, lines: u64) -> ToolError {
    ToolError(format!(
        "offset {offset} is past the end of {} ({lines} lines)",
        echo(rel)
    ))
}

/// Consumes one line; `false` at the end of the file.
fn skip_line(reader: &mut BufReader<File>) -> io::Result<bool> {
    let mut any = false;
    loop {
        let buf = reader.fill_buf()?;
        if buf.is_empty() {
            return Ok(any);
        }
        any = true;
        match buf.iter().position(|&b| b == b'\n') {
            Some(end) => {
                reader.consume(end + 1);
                return Ok(true);
            }
            None => {
                let len = buf.len();
                reader.consume(len);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::{self, File};
    use std::io::Write;
    use std::path::PathBuf;
    use std::time::Duration;

    /// A workspace with `README.md`, `src/main.rs` and `notes.txt`, plus a sibling directory
    /// outside it holding `secret.txt`.
    struct Fixture {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        outside: PathBuf,
        list: Bound<ListFiles>,
        read: Bound<ReadFile>,
    }

    /// A tool bound to the fixture's workspace, so tests read as calls with arguments only.
    struct Bound<T> {
        tool: T,
        ctx: ToolContext,
    }

    impl<T: Tool> Bound<T> {
        async fn call(&self, args: &Value) -> Result<String, ToolError> {
            self.tool.call(&self.ctx, args).await.map(|r| r.output)
        }

        fn schema(&self) -> crate::model::ToolSchema {
            self.tool.schema()
        }
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
            list: Bound {
                tool: ListFiles,
                ctx: ToolContext::new(ws.clone()),
            },
            read: Bound {
                tool: ReadFile,
                ctx: ToolContext::new(ws),
            },
            root,
        }
    }

    async fn read(f: &Fixture, path: &str) -> Result<String, ToolError> {
        bounded(f.read.call(&json!({ "path": path }))).await
    }

    async fn list(f: &Fixture, path: &str) -> Result<String, ToolError> {
        bounded(f.list.call(&json!({ "path": path }))).await
    }

    /// `text` numbered as `cat -n` does.
    fn numbered(text: &str) -> String {
        text.split_inclusive('\n')
            .enumerate()
            .map(|(i, line)| format!("{:>6}\t{line}", i + 1))
            .collect()
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
        assert_eq!(out, "     1\t# Demo\n     2\t\n     3\tA demo workspace.\n");
        let text = "héllo wörld — 日本語 🦀\nzweite Zeile ✓\n";
        fs::write(f.root.join("utf8.txt"), text).expect("write");
        assert_eq!(read(&f, "utf8.txt").await.expect("read"), numbered(text));
        assert_eq!(
            read(&f, "src/../utf8.txt").await.expect("read"),
            numbered(text)
        );
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
        // A dangling link that would lead outside is refused so, without naming the target.
        assert_refused(
            &f,
            read(&f, "dangling").await,
            "outside the workspace: dangling",
        );

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
            numbered("# Demo\n\nA demo workspace.\n")
        );
        assert_eq!(list(&f, "src_link").await.expect("list"), "main.rs");
        assert_eq!(
            read(&f, "abs_src_link/main.rs").await.expect("read"),
            numbered("fn main() {}\n")
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
    async fn odd_names_are_listed_escaped_and_read_by_what_was_shown() {
        let f = fixture();
        let name = std::ffi::OsStr::from_bytes(b"caf\xe9.txt");
        fs::write(f.root.join(name), "bonjour").expect("write");
        fs::write(f.root.join("report\u{202e}fdp.exe"), "x").expect("write");
        let out = list(&f, ".").await.expect("list");
        assert!(out.lines().any(|l| l == "caf\\xe9.txt"), "{out:?}");
        assert!(
            out.lines().any(|l| l == "report\\u{202e}fdp.exe"),
            "{out:?}"
        );
        assert!(!out.contains('\u{202e}'), "{out:?}");
        assert_eq!(
            read(&f, "caf\\xe9.txt").await.expect("read"),
            numbered("bonjour")
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
        assert!(out.len() <= MAX_OUTPUT_BYTES, "{} bytes", out.len());
        assert!(out.starts_with(&format!("     1\t{}", &line[..line.len() - 1])));
        // Whole numbered lines up to the budget, then a note that says how to read on.
        let shown = out.lines().count() - 1;
        assert!(shown > 900, "{shown} lines");
        let note = format!(
            "\n[truncated: showed the first {} of {written} bytes (lines 1-{shown}); more lines \
             follow: read on with offset={}]",
            shown * line.len(),
            shown + 1
        );
        assert!(out.ends_with(&note), "{:?}", &out[out.len() - 160..]);
        let next = bounded(
            f.read
                .call(&json!({ "path": "big.txt", "offset": shown + 1, "limit": 1 })),
        )
        .await
        .expect("read on");
        assert!(
            next.starts_with(&format!("{:>6}\t0123", shown + 1)),
            "{next:?}"
        );
    }

    #[tokio::test]
    async fn truncation_respects_char_boundaries() {
        let f = fixture();
        // 3-byte characters in one long line: the cut falls mid-character.
        let text = "€".repeat(30_000);
        fs::write(f.root.join("euro.txt"), &text).expect("write");
        let out = read(&f, "euro.txt").await.expect("read");
        let prefix = "     1\t";
        let shown = (READ_BUDGET - prefix.len()) / 3 * 3;
        let note = format!(
            "\n[truncated: line 1 is too long; showed its first {shown} bytes (the file has {}); \
             read on with offset=2]",
            text.len()
        );
        assert!(out.ends_with(&note), "{:?}", &out[out.len() - 80..]);
        assert_eq!(&out[prefix.len()..prefix.len() + shown], &text[..shown]);
        // A line that fills the budget exactly is not truncated; one byte more is.
        let exact = "x".repeat(READ_BUDGET - prefix.len());
        fs::write(f.root.join("exact.txt"), &exact).expect("write");
        assert_eq!(
            read(&f, "exact.txt").await.expect("read"),
            format!("{prefix}{exact}")
        );
        fs::write(f.root.join("over.txt"), format!("{exact}x")).expect("write");
        assert!(read(&f, "over.txt")
            .await
            .expect("read")
            .contains("[truncated: line 1"));
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
            numbered("leaf")
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
        assert_eq!(extra.expect("read"), numbered("notes\n"));
    }

    #[tokio::test]
    async fn registry_runs_the_builtin_tools() {
        let f = fixture();
        let sandbox = crate::tools::SandboxStatus::Unavailable("not probed in this test".into());
        let settings = crate::tools::ToolSettings::default();
        let registry = crate::tools::ToolRegistry::builtin(&settings, sandbox);
        let names: Vec<String> = registry
            .schemas()
            .into_iter()
            .map(|s| s.name.clone())
            .collect();
        assert_eq!(names[..2], ["list_files", "read_file"]);
        let call = crate::model::ToolCall {
            id: "call_1".into(),
            name: "read_file".into(),
            arguments: json!({ "path": "notes.txt" }),
        };
        let output = registry.execute(&f.read.ctx, &call).await;
        assert_eq!(output.output, "     1\tnotes\n");
        assert!(!output.is_error);
    }

    async fn read_with(f: &Fixture, args: Value) -> Result<String, ToolError> {
        bounded(f.read.call(&args)).await
    }

    #[tokio::test]
    async fn offset_and_limit_choose_lines_and_say_what_follows() {
        let f = fixture();
        let text: String = (1..=10).map(|i| format!("line {i}\n")).collect();
        fs::write(f.root.join("ten.txt"), &text).expect("write");
        let out = read_with(&f, json!({"path": "ten.txt", "offset": 3, "limit": 2}))
            .await
            .expect("read");
        assert_eq!(
            out,
            "     3\tline 3\n     4\tline 4\n[showed lines 3-4; more lines follow: read on with \
             offset=5]"
        );
        // Reaching the end exactly: no note.
        let out = read_with(&f, json!({"path": "ten.txt", "offset": 9, "limit": 2}))
            .await
            .expect("read");
        assert_eq!(out, "     9\tline 9\n    10\tline 10\n");
        let out = read_with(&f, json!({"path": "ten.txt", "offset": 10}))
            .await
            .expect("read");
        assert_eq!(out, "    10\tline 10\n");
        // The default limit is 2,000 lines.
        let many: String = (1..=2500).map(|i| format!("{i}\n")).collect();
        fs::write(f.root.join("many.txt"), &many).expect("write");
        let out = read(&f, "many.txt").await.expect("read");
        assert_eq!(out.lines().count(), 2001);
        assert!(out.ends_with("[showed lines 1-2000; more lines follow: read on with offset=2001]"));
        // A last line without a newline stays without one, as with `cat -n`.
        fs::write(f.root.join("open.txt"), "a\nb").expect("write");
        assert_eq!(
            read(&f, "open.txt").await.expect("read"),
            "     1\ta\n     2\tb"
        );
    }

    #[tokio::test]
    async fn offsets_past_the_end_and_bad_numbers_are_errors() {
        let f = fixture();
        fs::write(f.root.join("three.txt"), "a\nb\nc\n").expect("write");
        for offset in [4, 5, 1000] {
            let err = read_with(&f, json!({"path": "three.txt", "offset": offset}))
                .await
                .expect_err("past the end");
            assert_eq!(
                err.0,
                format!("offset {offset} is past the end of three.txt (3 lines)")
            );
        }
        for args in [
            json!({"path": "three.txt", "offset": 0}),
            json!({"path": "three.txt", "limit": 0}),
            json!({"path": "three.txt", "offset": -1}),
            json!({"path": "three.txt", "offset": 1.5}),
            json!({"path": "three.txt", "limit": "10"}),
        ] {
            let err = read_with(&f, args.clone()).await.expect_err("bad number");
            assert!(
                err.0.contains("must be an integer of at least 1"),
                "{args}: {err}"
            );
        }
        // A whole float counts as an integer.
        let out = read_with(&f, json!({"path": "three.txt", "offset": 3.0}))
            .await
            .expect("read");
        assert_eq!(out, "     3\tc\n");
    }

    #[tokio::test]
    async fn depth_lists_subdirectories_below_their_directory() {
        let f = fixture();
        fs::create_dir_all(f.root.join("src/a/b/c")).expect("mkdir");
        fs::write(f.root.join("src/a/x.rs"), "").expect("write");
        fs::write(f.root.join("src/a/b/c/deep.rs"), "").expect("write");
        std::os::unix::fs::symlink("src", f.root.join("zlink")).expect("symlink");
        let args = |depth: u64| json!({"path": ".", "depth": depth});
        let two = bounded(f.list.call(&args(2))).await.expect("list");
        assert_eq!(
            two,
            "README.md\nnotes.txt\nsrc/\nsrc/a/\nsrc/main.rs\nzlink/"
        );
        let five = bounded(f.list.call(&args(5))).await.expect("list");
        assert_eq!(
            five,
            "README.md\nnotes.txt\nsrc/\nsrc/a/\nsrc/a/b/\nsrc/a/b/c/\nsrc/a/b/c/deep.rs\n\
             src/a/x.rs\nsrc/main.rs\nzlink/"
        );
        // Depth counts from the listed directory; a symlinked directory is not descended.
        let sub = bounded(f.list.call(&json!({"path": "src/a", "depth": 2})))
            .await
            .expect("list");
        assert_eq!(sub, "b/\nb/c/\nx.rs");
        for depth in [json!(0), json!(6), json!("2"), json!(true)] {
            let err = bounded(f.list.call(&json!({"depth": depth})))
                .await
                .expect_err("bad depth");
            assert!(
                err.0.contains("`depth` must be an integer from 1 to 5"),
                "{err}"
            );
        }
    }

    #[tokio::test]
    async fn deep_listings_are_capped_with_a_lower_bound() {
        let f = fixture();
        for d in 0..3 {
            let dir = f.root.join(format!("d{d}"));
            fs::create_dir(&dir).expect("mkdir");
            for i in 0..600 {
                File::create(dir.join(format!("f{i:03}"))).expect("create");
            }
        }
        let out = bounded(f.list.call(&json!({"depth": 2})))
            .await
            .expect("list");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), MAX_LIST_ENTRIES + 1);
        assert_eq!(lines[..3], ["README.md", "d0/", "d0/f000"]);
        assert_eq!(lines[MAX_LIST_ENTRIES - 1], "d1/f396");
        // README.md, d0/, its 600, d1/ and 397 of its files are shown; the other 203 of d1 and
        // d2/, notes.txt and src/ are known to be hidden, d2's and src's entries are not counted.
        assert_eq!(
            lines[MAX_LIST_ENTRIES],
            "[... at least 206 more entries not shown]"
        );
    }
}
