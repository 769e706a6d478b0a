//! `glob` and `grep`: finding files by name and lines by regex, with ripgrep's crates. Both walk
//! a directory of the workspace without following symlinks (so a walk cannot loop or leave
//! the workspace), skip `.git`, and respect `.gitignore` files from the workspace root down —
//! never those above it, nor the host user's global excludes. `grep` opens every file through
//! the [`Workspace`] so a file swapped for a symlink during the walk is skipped, not followed.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use async_trait::async_trait;
use globset::{GlobBuilder, GlobMatcher};
use grep_regex::RegexMatcherBuilder;
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkMatch};
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::{Match, WalkBuilder};
use serde_json::{json, Value};

use super::{
    bool_arg, cut_at_char, dir_arg, int_arg, path_property, path_subject, required_string,
    string_arg, BoundedText,
};
use crate::tools::workspace::{display, echo, Workspace};
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

/// The directory `rel` to walk, checked and canonical.
fn search_dir(ws: &Workspace, rel: &str) -> Result<PathBuf, ToolError> {
    let (canon, _dir) = ws.open_dir(rel)?;
    Ok(canon)
}

/// Calls `visit(canonical path, path relative to the walked directory, entry)` for each
/// regular file under `base`, until it answers `false`. Answers whether the walk was cut short
/// by [`MAX_WALK_FILES`].
fn walk_files(
    ws: &Workspace,
    base: &Path,
    mut visit: impl FnMut(&Path, &Path, &ignore::DirEntry) -> bool,
) -> bool {
    let root = ws.root().to_path_buf();
    let top = root.join(base);
    let ancestors = ancestor_ignores(ws, base);
    let mut walker = WalkBuilder::new(&top);
    walker
        .hidden(false)
        .parents(false)
        .git_global(false)
        .require_git(false)
        .follow_links(false)
        .filter_entry(move |entry| {
            entry.file_name() != ".git"
                && (entry.depth() == 0
                    || !ignored_by(
                        &ancestors,
                        entry.path(),
                        entry.file_type().is_some_and(|t| t.is_dir()),
                    ))
        });
    let mut files = 0;
    // Walk errors (unreadable directories, bad ignore files) are skipped: their messages could
    // name host paths.
    for entry in walker.build().flatten() {
        if !entry.file_type().is_some_and(|t| t.is_file()) {
            continue;
        }
        let (Ok(canon), Ok(relative)) = (
            entry.path().strip_prefix(&root),
            entry.path().strip_prefix(&top),
        ) else {
            continue;
        };
        files += 1;
        if files > MAX_WALK_FILES {
            return true;
        }
        if !visit(canon, relative, &entry) {
            break;
        }
    }
    false
}

/// The `.gitignore` files of the directories from the workspace root down to (not including)
/// `base`, deepest first, read through the workspace (never through a symlink).
fn ancestor_ignores(ws: &Workspace, base: &Path) -> Vec<Gitignore> {
    let mut dirs = vec![PathBuf::new()];
    let mut dir = PathBuf::new();
    for component in base.components() {
        dir.push(component);
        dirs.push(dir.clone());
    }
    dirs.pop();
    dirs.iter()
        .rev()
        .filter_map(|dir| {
            let text =
                std::io::read_to_string(ws.open_file_at(&dir.join(".gitignore")).ok()?).ok()?;
            let mut builder = GitignoreBuilder::new(ws.root().join(dir));
            for line in text.lines() {
                let _ = builder.add_line(None, line);
            }
            builder.build().ok()
        })
        .collect()
}

/// Whether the deepest ancestor `.gitignore` with an opinion on `path` ignores it.
fn ignored_by(ancestors: &[Gitignore], path: &Path, is_dir: bool) -> bool {
    for ignore in ancestors {
        match ignore.matched(path, is_dir) {
            Match::Ignore(_) => return true,
            Match::Whitelist(_) => return false,
            Match::None => {}
        }
    }
    false
}

fn glob_blocking(ws: &Workspace, rel: &str, matcher: &GlobMatcher) -> Result<String, ToolError> {
    let base = search_dir(ws, rel)?;
    let mut found: Vec<(SystemTime, String)> = Vec::new();
    let cut_short = walk_files(ws, &base, |canon, relative, entry| {
        if matcher.is_match(relative) {
            let modified = entry
                .metadata()
                .ok()
                .and_then(|m| m.modified().ok())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            found.push((modified, display(canon)));
        }
        true
    });
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
    if cut_short {
        notes.push(walk_note());
    }
    Ok(out.finish(&notes))
}

fn walk_note() -> String {
    format!("[stopped after {MAX_WALK_FILES} files; narrow the path]")
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
        .line_number(true)
        .before_context(search.context)
        .after_context(search.context)
        .build();
    let mut found = Found {
        out: BoundedText::new(),
        matches: 0,
        separate: search.context > 0,
    };
    let canon = ws.locate(&search.rel)?;
    let is_dir = std::fs::symlink_metadata(ws.root().join(&canon)).is_ok_and(|m| m.is_dir());
    let mut cut_short = false;
    if is_dir {
        let base = search_dir(ws, &search.rel)?;
        cut_short = walk_files(ws, &base, |canon, relative, _| {
            if search.filter.admits(relative) {
                if let Ok(file) = ws.open_file_at(canon) {
                    found.search(&mut searcher, &matcher, &file, &display(canon));
                }
            }
            !found.full()
        });
    } else {
        let (canon, file) = ws.open_file(&search.rel)?;
        found.search(&mut searcher, &matcher, &file, &display(&canon));
    }
    if found.matches == 0 && !cut_short {
        return Ok("[no matches]".into());
    }
    let mut notes = Vec::new();
    if found.matches >= MAX_GREP_MATCHES {
        notes.push(format!(
            "[stopped at {MAX_GREP_MATCHES} matches; narrow the pattern, path or glob]"
        ));
    }
    if cut_short {
        notes.push(walk_note());
    }
    Ok(found.out.finish(&notes))
}

/// What `grep` found so far.
struct Found {
    out: BoundedText,
    matches: usize,
    /// Groups of lines with context are separated by `--`.
    separate: bool,
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
        // A read error ends this file's search; what was found stays.
        let _ = searcher.search_file(matcher, file, &mut sink);
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
