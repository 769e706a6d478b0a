//! `glob` and `grep`: finding files by name and lines by regex, with ripgrep's crates. Both walk
//! a directory of the workspace from descriptor to descriptor (`openat` with `O_NOFOLLOW`),
//! never following a symlink nor resolving a path again, so a walk cannot loop or leave the
//! workspace even while directories are swapped for symlinks under it. They skip `.git`, go at
//! most 64 levels down, and respect `.gitignore` (and `.ignore`) files from the workspace root
//! down, read the same way — never those above it, nor the host user's global excludes.
//! `grep` holds at most 8 MiB of one file: a file with a longer line is named as skipped.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use globset::{GlobBuilder, GlobMatcher};
use grep_regex::RegexMatcherBuilder;
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkMatch};
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::Match;
use rustix::fs::{openat, statat, AtFlags, FileType, Mode, OFlags, Stat};
use serde_json::{json, Value};

use super::files::read_names;
use super::{
    bool_arg, cut_at_char, dir_arg, int_arg, path_property, path_subject, required_string,
    string_arg, BoundedText,
};
use crate::tools::workspace::{display, echo, open_regular_in, Entry, Workspace};
use crate::tools::{Subject, Tool, ToolContext, ToolError, ToolResult};

/// At most this many paths are listed by `glob`.
const MAX_GLOB_RESULTS: usize = 1000;
/// At most this many matching lines are shown by `grep`.
const MAX_GREP_MATCHES: usize = 500;
/// Context lines around a match at most.
const MAX_CONTEXT: u64 = 10;
/// A walk stops after this many files, so a huge tree cannot hold a call forever.
const MAX_WALK_FILES: usize = 200_000;
/// Longest line `grep` shows (characters); longer ones end with `…`.
const MAX_LINE_CHARS: usize = 500;
/// Most memory `grep`'s searcher holds for one file (bytes): a longer line skips the file.
const MAX_GREP_LINE_BYTES: usize = 8 * 1024 * 1024;
/// Deepest directory a walk enters, counted from the walked one.
const MAX_WALK_DEPTH: usize = 64;
/// Largest ignore file read (bytes).
const MAX_IGNORE_BYTES: u64 = 1024 * 1024;
/// Longest pattern accepted (bytes).
const MAX_PATTERN_BYTES: usize = 4096;

/// `glob`: paths matching a glob, newest first.
pub struct Glob;

/// `grep`: lines matching a regex.
pub struct Grep;

#[async_trait]
impl Tool for Glob {
    fn name(&self) -> &str {
        "glob"
    }

    fn description(&self) -> String {
        format!(
            "Find files whose path matches a glob, relative to `path` (default the workspace \
             root): `*` and `?` stay within one directory, `**` crosses directories, `{{a,b}}` \
             and `[ab]` choose. Example: `**/*.rs`. Paths are relative to the workspace root, \
             newest first; files ignored by .gitignore are left out. At most \
             {MAX_GLOB_RESULTS} paths."
        )
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "pattern": { "type": "string", "description": "The glob, e.g. \"src/**/*.ts\"." },
                "path": path_property("Directory to search", Some("the root"))
            },
            "required": ["pattern"]
        })
    }

    async fn subject(&self, ctx: &ToolContext, input: &Value) -> Subject {
        path_subject(ctx, input, Some(".")).await
    }

    async fn call(&self, ctx: &ToolContext, input: &Value) -> Result<ToolResult, ToolError> {
        let pattern = required_string(input, "pattern")?;
        let rel = dir_arg(input)?;
        let matcher = glob_matcher(&pattern, /*literal_separator*/ true)?;
        let listed = ctx
            .workspace
            .run(move |ws| glob_blocking(ws, &rel, &matcher))
            .await?;
        Ok(listed.into())
    }
}

#[async_trait]
impl Tool for Grep {
    fn name(&self) -> &str {
        "grep"
    }

    fn description(&self) -> String {
        format!(
            "Search file contents with a regular expression (Rust regex syntax) under `path` \
             (a directory or a file; default the workspace root). Prints `path:line:text` for \
             each matching line (context lines as `path-line-text`, groups separated by `--`). \
             Files ignored by .gitignore and binary files are skipped. `glob` limits the files \
             searched (`*.rs` matches by file name, a pattern with `/` by path). At most \
             {MAX_GREP_MATCHES} matches."
        )
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "pattern": { "type": "string", "description": "The regular expression." },
                "path": path_property("File or directory to search", Some("the root")),
                "glob": { "type": "string", "description": "Only files matching this glob." },
                "ignore_case": { "type": "boolean", "description": "Match case-insensitively." },
                "context": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": MAX_CONTEXT,
                    "description": "Lines of context before and after each match."
                }
            },
            "required": ["pattern"]
        })
    }

    async fn subject(&self, ctx: &ToolContext, input: &Value) -> Subject {
        path_subject(ctx, input, Some(".")).await
    }

    async fn call(&self, ctx: &ToolContext, input: &Value) -> Result<ToolResult, ToolError> {
        let pattern = required_string(input, "pattern")?;
        if pattern.len() > MAX_PATTERN_BYTES {
            return Err(ToolError(format!(
                "pattern too long (limit {MAX_PATTERN_BYTES} bytes)"
            )));
        }
        let search = GrepSearch {
            rel: dir_arg(input)?,
            filter: match string_arg(input, "glob")? {
                Some(glob) if glob.contains('/') => FileFilter::Path(glob_matcher(&glob, true)?),
                Some(glob) => FileFilter::Name(glob_matcher(&glob, true)?),
                None => FileFilter::All,
            },
            ignore_case: bool_arg(input, "ignore_case")?.unwrap_or(false),
            context: int_arg(input, "context", 0, MAX_CONTEXT)?.unwrap_or(0) as usize,
            pattern,
        };
        let found = ctx
            .workspace
            .run(move |ws| grep_blocking(ws, &search))
            .await?;
        Ok(found.into())
    }
}

fn glob_matcher(pattern: &str, literal_separator: bool) -> Result<GlobMatcher, ToolError> {
    if pattern.is_empty() || pattern.len() > MAX_PATTERN_BYTES || pattern.contains('\0') {
        return Err(ToolError(format!(
            "a glob must be 1 to {MAX_PATTERN_BYTES} bytes without NUL"
        )));
    }
    if pattern.starts_with('/')
        || Path::new(pattern)
            .components()
            .any(|c| c.as_os_str() == "..")
    {
        return Err(ToolError(
            "a glob must be relative and must not contain `..`; use `path` to choose where to \
             search"
                .into(),
        ));
    }
    let glob = GlobBuilder::new(pattern)
        .literal_separator(literal_separator)
        .build()
        .map_err(|e| ToolError(format!("invalid glob {}: {}", echo(pattern), e.kind())))?;
    Ok(glob.compile_matcher())
}

/// A regular file the walk found.
struct WalkFile<'a> {
    /// The directory it is in.
    dir: &'a OwnedFd,
    name: &'a OsStr,
    /// Its canonical path relative to the root.
    canon: &'a Path,
    /// Its path relative to the walked directory.
    relative: &'a Path,
    stat: &'a Stat,
}

/// A directory being walked: its descriptor, canonical path and the names left to visit.
struct Level {
    fd: OwnedFd,
    canon: PathBuf,
    names: std::vec::IntoIter<OsString>,
    /// Whether its own ignore file is on the stack of ignores.
    ignores: bool,
}

/// How a walk ended short of the whole tree.
#[derive(Default)]
struct WalkCut {
    /// After [`MAX_WALK_FILES`] files.
    files: bool,
    /// Directories deeper than [`MAX_WALK_DEPTH`] were not entered.
    depth: bool,
}

/// Calls `visit` for each regular file under the directory `fd` (at `base` under the root),
/// in name order, until it answers `false`. The walk goes from descriptor to descriptor
/// (`openat` with `O_NOFOLLOW`): it never follows a symlink, nor resolves a path again, so a
/// directory swapped for a symlink meanwhile is skipped, not followed out.
fn walk_files(
    ws: &Workspace,
    fd: OwnedFd,
    base: &Path,
    mut visit: impl FnMut(&WalkFile) -> bool,
) -> WalkCut {
    let mut cut = WalkCut::default();
    let mut ignores = ancestor_ignores(ws, base);
    let Some(top) = level(fd, base.to_path_buf(), &mut ignores) else {
        return cut;
    };
    let mut stack = vec![top];
    let mut files = 0;
    loop {
        let depth = stack.len();
        let Some(current) = stack.last_mut() else {
            break;
        };
        let Some(name) = current.names.next() else {
            if stack.pop().is_some_and(|done| done.ignores) {
                ignores.pop();
            }
            continue;
        };
        if name == ".git" {
            continue;
        }
        // Entries that cannot be read are skipped: errors could name host paths.
        let Ok(stat) = statat(&current.fd, &name, AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        let canon = current.canon.join(&name);
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory if !ignored_by(&ignores, &canon, true) => {
                if depth >= MAX_WALK_DEPTH {
                    cut.depth = true;
                    continue;
                }
                let Ok(child) = openat(&current.fd, &name, dir_flags(), Mode::empty()) else {
                    continue;
                };
                if let Some(next) = level(child, canon, &mut ignores) {
                    stack.push(next);
                }
            }
            FileType::RegularFile if !ignored_by(&ignores, &canon, false) => {
                files += 1;
                if files > MAX_WALK_FILES {
                    cut.files = true;
                    return cut;
                }
                let relative = canon.strip_prefix(base).unwrap_or(&canon);
                let file = WalkFile {
                    dir: &current.fd,
                    name: &name,
                    canon: &canon,
                    relative,
                    stat: &stat,
                };
                if !visit(&file) {
                    return cut;
                }
            }
            _ => {}
        }
    }
    cut
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// The directory `fd` at `canon` as a level of the walk, its ignore file pushed on `ignores`.
fn level(fd: OwnedFd, canon: PathBuf, ignores: &mut Vec<(PathBuf, Gitignore)>) -> Option<Level> {
    let names = read_names(&fd).ok()?;
    let own = ignore_file(&fd);
    let has = own.is_some();
    if let Some(own) = own {
        ignores.push((canon.clone(), own));
    }
    Some(Level {
        fd,
        canon,
        names: names.into_iter(),
        ignores: has,
    })
}

/// The ignore rules of the directory `dir`: its `.gitignore`, then its `.ignore` (whose rules
/// win, as ripgrep has it), read without following symlinks.
fn ignore_file(dir: &OwnedFd) -> Option<Gitignore> {
    let mut builder = GitignoreBuilder::new(".");
    let mut any = false;
    for name in [".gitignore", ".ignore"] {
        let Ok(file) = open_regular_in(dir, OsStr::new(name)) else {
            continue;
        };
        let Ok(text) = std::io::read_to_string(file.take(MAX_IGNORE_BYTES)) else {
            continue;
        };
        for line in text.lines() {
            any |= builder.add_line(None, line).is_ok();
        }
    }
    any.then(|| builder.build().ok()).flatten()
}

/// The ignore rules of the directories from the workspace root down to (not including)
/// `base`, root first.
fn ancestor_ignores(ws: &Workspace, base: &Path) -> Vec<(PathBuf, Gitignore)> {
    let mut dir = PathBuf::new();
    let mut found = Vec::new();
    for component in base.components() {
        if let Some(ignore) = ws.dir_at(&dir).ok().and_then(|fd| ignore_file(&fd)) {
            found.push((dir.clone(), ignore));
        }
        dir.push(component);
    }
    found
}

/// Whether the deepest ignore file with an opinion on `canon` ignores it.
fn ignored_by(ignores: &[(PathBuf, Gitignore)], canon: &Path, is_dir: bool) -> bool {
    for (dir, ignore) in ignores.iter().rev() {
        let Ok(relative) = canon.strip_prefix(dir) else {
            continue;
        };
        match ignore.matched(relative, is_dir) {
            Match::Ignore(_) => return true,
            Match::Whitelist(_) => return false,
            Match::None => {}
        }
    }
    false
}

fn glob_blocking(ws: &Workspace, rel: &str, matcher: &GlobMatcher) -> Result<String, ToolError> {
    let (base, fd) = ws.open_dir(rel)?;
    let mut found: Vec<(SystemTime, String)> = Vec::new();
    let cut = walk_files(ws, fd, &base, |file| {
        if matcher.is_match(file.relative) {
            found.push((modified(file.stat), display(file.canon)));
        }
        true
    });
    let cut_short = cut.files;
    if found.is_empty() && !cut_short {
        return Ok("[no files match]".into());
    }
    found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let mut out = BoundedText::new();
    for (_, path) in found.iter().take(MAX_GLOB_RESULTS) {
        if !out.line(path) {
            break;
        }
    }
    let mut notes = Vec::new();
    if found.len() > MAX_GLOB_RESULTS {
        notes.push(format!(
            "[... {} more files not shown; narrow the pattern or path]",
            found.len() - MAX_GLOB_RESULTS
        ));
    }
    notes.extend(walk_notes(&cut));
    Ok(out.finish(&notes))
}

/// When a file was last modified, from its status.
fn modified(stat: &Stat) -> SystemTime {
    let since_epoch = Duration::new(
        u64::try_from(stat.st_mtime).unwrap_or(0),
        u32::try_from(stat.st_mtime_nsec).unwrap_or(0),
    );
    SystemTime::UNIX_EPOCH + since_epoch
}

/// The notes that say where a walk stopped short.
fn walk_notes(cut: &WalkCut) -> Vec<String> {
    let mut notes = Vec::new();
    if cut.files {
        notes.push(format!(
            "[stopped after {MAX_WALK_FILES} files; narrow the path]"
        ));
    }
    if cut.depth {
        notes.push(format!(
            "[directories deeper than {MAX_WALK_DEPTH} levels were not searched; search from \
             deeper]"
        ));
    }
    notes
}

struct GrepSearch {
    pattern: String,
    rel: String,
    filter: FileFilter,
    ignore_case: bool,
    context: usize,
}

enum FileFilter {
    All,
    /// Matched against the file name.
    Name(GlobMatcher),
    /// Matched against the path relative to the searched directory.
    Path(GlobMatcher),
}

impl FileFilter {
    fn admits(&self, relative: &Path) -> bool {
        match self {
            FileFilter::All => true,
            FileFilter::Name(m) => relative.file_name().is_some_and(|n| m.is_match(n)),
            FileFilter::Path(m) => m.is_match(relative),
        }
    }
}

fn grep_blocking(ws: &Workspace, search: &GrepSearch) -> Result<String, ToolError> {
    let matcher = RegexMatcherBuilder::new()
        .case_insensitive(search.ignore_case)
        .line_terminator(Some(b'\n'))
        .build(&search.pattern)
        .map_err(|e| ToolError(format!("invalid regex: {e}")))?;
    let mut searcher = SearcherBuilder::new()
        .binary_detection(BinaryDetection::quit(0))
        .heap_limit(Some(MAX_GREP_LINE_BYTES))
        .line_number(true)
        .before_context(search.context)
        .after_context(search.context)
        .build();
    let mut found = Found {
        out: BoundedText::new(),
        matches: 0,
        separate: search.context > 0,
        skipped: Vec::new(),
    };
    let cut = match ws.open_entry(&search.rel)? {
        Entry::Dir(base, fd) => walk_files(ws, fd, &base, |file| {
            if search.filter.admits(file.relative) {
                if let Ok(opened) = open_regular_in(file.dir, file.name) {
                    found.search(&mut searcher, &matcher, &opened, &display(file.canon));
                }
            }
            !found.full()
        }),
        Entry::File(canon, file) => {
            found.search(&mut searcher, &matcher, &file, &display(&canon));
            WalkCut::default()
        }
    };
    if found.matches == 0 && !cut.files && found.skipped.is_empty() {
        return Ok("[no matches]".into());
    }
    let mut notes = Vec::new();
    if found.matches >= MAX_GREP_MATCHES {
        notes.push(format!(
            "[stopped at {MAX_GREP_MATCHES} matches; narrow the pattern, path or glob]"
        ));
    }
    notes.extend(walk_notes(&cut));
    if !found.skipped.is_empty() {
        notes.push(skipped_note(&found.skipped));
    }
    Ok(found.out.finish(&notes))
}

/// The note that names the files `grep` could not search to their end.
fn skipped_note(skipped: &[String]) -> String {
    const NAMED: usize = 5;
    let mut names = skipped[..skipped.len().min(NAMED)].join(", ");
    if skipped.len() > NAMED {
        names.push_str(&format!(" and {} more", skipped.len() - NAMED));
    }
    format!(
        "[skipped {} file(s) not searched to the end (a line longer than {} MiB, or a read \
         error): {names}]",
        skipped.len(),
        MAX_GREP_LINE_BYTES / (1024 * 1024)
    )
}

/// What `grep` found so far.
struct Found {
    out: BoundedText,
    matches: usize,
    /// Groups of lines with context are separated by `--`.
    separate: bool,
    /// Files not searched to their end (a line too long to hold, or a read error).
    skipped: Vec<String>,
}

impl Found {
    fn full(&self) -> bool {
        self.matches >= MAX_GREP_MATCHES || self.out.cut
    }

    fn search(
        &mut self,
        searcher: &mut Searcher,
        matcher: &grep_regex::RegexMatcher,
        file: &std::fs::File,
        path: &str,
    ) {
        let mut sink = FileSink {
            found: self,
            path,
            first: true,
        };
        // A line longer than the searcher may hold, or a read error, ends this file's search;
        // what was found stays, and the file is named as skipped.
        if searcher.search_file(matcher, file, &mut sink).is_err() {
            self.skipped.push(path.to_owned());
        }
    }
}

struct FileSink<'a> {
    found: &'a mut Found,
    path: &'a str,
    first: bool,
}

impl FileSink<'_> {
    fn line(&mut self, separator: char, number: Option<u64>, bytes: &[u8]) -> bool {
        if std::mem::take(&mut self.first) && self.found.separate && !self.found.out.text.is_empty()
        {
            self.found.out.line("--");
        }
        let text = String::from_utf8_lossy(bytes);
        let text = text.trim_end_matches(['\n', '\r']);
        let mut shown = cut_at_char(
            text,
            text.char_indices()
                .nth(MAX_LINE_CHARS)
                .map_or(text.len(), |(i, _)| i),
        )
        .to_owned();
        if shown.len() < text.len() {
            shown.push('…');
        }
        let number = number.unwrap_or(0);
        self.found.out.line(&format!(
            "{}{separator}{number}{separator}{shown}",
            self.path
        ))
    }
}

impl Sink for FileSink<'_> {
    type Error = std::io::Error;

    fn matched(&mut self, _: &Searcher, m: &SinkMatch<'_>) -> Result<bool, Self::Error> {
        if self.found.full() {
            return Ok(false);
        }
        self.found.matches += 1;
        Ok(self.line(':', m.line_number(), m.bytes()) && !self.found.full())
    }

    fn context(&mut self, _: &Searcher, c: &SinkContext<'_>) -> Result<bool, Self::Error> {
        Ok(self.line('-', c.line_number(), c.bytes()))
    }

    fn context_break(&mut self, _: &Searcher) -> Result<bool, Self::Error> {
        Ok(self.found.out.line("--"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::time::{Duration, SystemTime};

    use crate::tools::builtin::TestWorkspace as Fixture;

    /// A workspace with sources, a `.gitignore` that ignores `target/` and `*.log`, a `.git`
    /// directory and a hidden file.
    fn fixture() -> Fixture {
        let dirs = ["src/net", "target/debug", ".git", "docs"];
        let files = [
            (".gitignore", "target/\n*.log\n"),
            ("src/main.rs", "fn main() {\n    serve();\n}\n"),
            (
                "src/net/http.rs",
                "pub fn serve() {\n    // TODO: serve HTTP\n}\n",
            ),
            ("src/net/Notes.TXT", "todo: more\n"),
            ("target/debug/out.rs", "fn serve() {}\n"),
            ("build.log", "serve failed\n"),
            (".git/config", "serve = true\n"),
            (".env", "SERVE_KEY=1\n"),
            ("docs/guide.md", "How to serve.\n"),
        ];
        Fixture::new(&dirs, &files)
    }

    async fn glob(f: &Fixture, args: Value) -> Result<String, ToolError> {
        Glob.call(&f.ctx, &args).await.map(|r| r.output)
    }

    async fn grep(f: &Fixture, args: Value) -> Result<String, ToolError> {
        Grep.call(&f.ctx, &args).await.map(|r| r.output)
    }

    fn touch(f: &Fixture, path: &str, seconds_ago: u64) {
        let when = SystemTime::now() - Duration::from_secs(seconds_ago);
        let file = fs::File::options()
            .append(true)
            .open(f.root.join(path))
            .expect("open");
        file.set_modified(when).expect("set mtime");
    }

    #[tokio::test]
    async fn glob_lists_matches_newest_first_and_respects_gitignore() {
        let f = fixture();
        touch(&f, "src/main.rs", 300);
        touch(&f, "src/net/http.rs", 100);
        touch(&f, "target/debug/out.rs", 0);
        let out = glob(&f, json!({"pattern": "**/*.rs"})).await.expect("glob");
        assert_eq!(out, "src/net/http.rs\nsrc/main.rs");
        // `*` stays in one directory; paths stay relative to the workspace root.
        let out = glob(&f, json!({"pattern": "*.rs", "path": "src"}))
            .await
            .expect("glob");
        assert_eq!(out, "src/main.rs");
        // The root's .gitignore applies below it; .git is never searched; hidden files are.
        let out = glob(&f, json!({"pattern": "*", "path": "src/net"}))
            .await
            .expect("glob");
        assert_eq!(out.lines().count(), 2, "{out}");
        let out = glob(&f, json!({"pattern": "**"})).await.expect("glob");
        assert!(out.lines().any(|l| l == ".env"), "{out}");
        assert!(
            !out.contains("target/") && !out.contains("build.log"),
            "{out}"
        );
        assert!(!out.contains(".git/"), "{out}");
        let out = glob(&f, json!({"pattern": "**/*.{md,TXT}"}))
            .await
            .expect("glob");
        assert_eq!(out.lines().count(), 2, "{out}");
        assert_eq!(
            glob(&f, json!({"pattern": "*.py"})).await.expect("glob"),
            "[no files match]"
        );
    }

    #[tokio::test]
    async fn glob_is_capped_at_a_thousand_paths() {
        let f = fixture();
        fs::create_dir(f.root.join("many")).expect("mkdir");
        for i in 0..1005 {
            fs::write(f.root.join(format!("many/{i:04}.txt")), "").expect("write");
        }
        let out = glob(&f, json!({"pattern": "many/*.txt"}))
            .await
            .expect("glob");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), MAX_GLOB_RESULTS + 1);
        assert_eq!(
            lines[MAX_GLOB_RESULTS],
            "[... 5 more files not shown; narrow the pattern or path]"
        );
    }

    #[tokio::test]
    async fn bad_globs_are_errors() {
        let f = fixture();
        for (pattern, expect) in [
            ("", "1 to 4096 bytes"),
            ("a[", "invalid glob a["),
            ("../*", "must not contain `..`"),
            ("src/../../*", "must not contain `..`"),
            ("/etc/*", "must be relative"),
        ] {
            let err = glob(&f, json!({"pattern": pattern}))
                .await
                .expect_err(pattern);
            assert!(err.0.contains(expect), "{pattern}: {err}");
        }
        let err = glob(&f, json!({})).await.expect_err("missing");
        assert_eq!(err.0, "missing required argument: pattern");
        let err = glob(&f, json!({"pattern": "*", "path": "src/main.rs"}))
            .await
            .expect_err("a file");
        assert_eq!(err.0, "not a directory: src/main.rs");
    }

    #[tokio::test]
    async fn grep_prints_path_line_text_and_skips_ignored_files() {
        let f = fixture();
        let out = grep(&f, json!({"pattern": "serve"})).await.expect("grep");
        let mut lines: Vec<&str> = out.lines().collect();
        lines.sort();
        assert_eq!(
            lines,
            [
                "docs/guide.md:1:How to serve.",
                "src/main.rs:2:    serve();",
                "src/net/http.rs:1:pub fn serve() {",
                "src/net/http.rs:2:    // TODO: serve HTTP",
            ]
        );
        let out = grep(
            &f,
            json!({"pattern": "serve", "ignore_case": true, "glob": "*.md"}),
        )
        .await
        .expect("grep");
        assert_eq!(out, "docs/guide.md:1:How to serve.");
        let out = grep(&f, json!({"pattern": "^serve", "path": "src/net/http.rs"}))
            .await
            .expect("grep");
        assert_eq!(out, "[no matches]");
        let out = grep(
            &f,
            json!({"pattern": "todo", "ignore_case": true, "glob": "src/net/*"}),
        )
        .await
        .expect("grep");
        assert_eq!(out.lines().count(), 2, "{out}");
        // An explicitly named ignored file is searched.
        let out = grep(&f, json!({"pattern": "serve", "path": "build.log"}))
            .await
            .expect("grep");
        assert_eq!(out, "build.log:1:serve failed");
    }

    #[tokio::test]
    async fn grep_shows_context_in_groups() {
        let f = fixture();
        let text: String = (1..=20).map(|i| format!("l{i}\n")).collect();
        fs::write(f.root.join("docs/lines.txt"), text).expect("write");
        let out = grep(
            &f,
            json!({"pattern": "^l(5|15)$", "path": "docs/lines.txt", "context": 1}),
        )
        .await
        .expect("grep");
        assert_eq!(
            out,
            "docs/lines.txt-4-l4\ndocs/lines.txt:5:l5\ndocs/lines.txt-6-l6\n--\n\
             docs/lines.txt-14-l14\ndocs/lines.txt:15:l15\ndocs/lines.txt-16-l16"
        );
    }

    #[tokio::test]
    async fn grep_is_capped_skips_binary_files_and_cuts_long_lines() {
        let f = fixture();
        let text = "hit\n".repeat(700);
        fs::write(f.root.join("docs/hits.txt"), text).expect("write");
        let out = grep(&f, json!({"pattern": "hit", "path": "docs"}))
            .await
            .expect("grep");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), MAX_GREP_MATCHES + 1);
        assert_eq!(
            lines[MAX_GREP_MATCHES],
            "[stopped at 500 matches; narrow the pattern, path or glob]"
        );
        fs::write(f.root.join("docs/bin.dat"), b"needle\0\x01\x02").expect("write");
        let out = grep(&f, json!({"pattern": "needle"})).await.expect("grep");
        assert_eq!(out, "[no matches]");
        fs::write(
            f.root.join("docs/long.txt"),
            format!("{}\n", "é".repeat(2000)),
        )
        .expect("write");
        let out = grep(&f, json!({"pattern": "é", "path": "docs/long.txt"}))
            .await
            .expect("grep");
        assert_eq!(
            out,
            format!("docs/long.txt:1:{}…", "é".repeat(MAX_LINE_CHARS))
        );
    }

    #[tokio::test]
    async fn bad_grep_arguments_are_errors() {
        let f = fixture();
        let err = grep(&f, json!({"pattern": "("}))
            .await
            .expect_err("bad regex");
        assert!(err.0.starts_with("invalid regex"), "{err}");
        let err = grep(&f, json!({"pattern": "x", "context": 11}))
            .await
            .expect_err("too much context");
        assert!(err.0.contains("from 0 to 10"), "{err}");
        let err = grep(&f, json!({"pattern": "x", "path": "nope"}))
            .await
            .expect_err("missing");
        assert_eq!(err.0, "not found: nope");
        let err = grep(&f, json!({"pattern": "x", "ignore_case": "yes"}))
            .await
            .expect_err("not a bool");
        assert!(err.0.contains("true or false"), "{err}");
    }
}
