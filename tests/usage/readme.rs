//! The manual's pages (README.md and the book in `docs/src/`): their checked blocks and their
//! links.
//!
//! A fenced block right after a line `<!-- checked: NAME -->` is written by a test of this
//! suite from what a real server answered: the test runs the page's requests, renders each
//! block (commands and outputs) into a [`Transcript`], and [`Transcript::check`] compares it
//! with the page's block, blind only to ids and times (see
//! [`crate::usage::shown::normalise`]) and, where the `shell` tool's sandbox does not work (see
//! [`blind_to_shell`]), to `shell` in the lists of offered tools. A scenario's blocks are on
//! one page. After a change to what the server answers, regenerate the blocks with
//!
//! ```text
//! TAH_BLESS=1 cargo test --test all usage::
//! ```
//!
//! and read the diff. A marker without a test, or a test block without a marker, fails.
//!
//! Every relative link of the pages (and of BENCHMARKS.md) names a file that exists, and its
//! `#anchor`, a heading of the page it points to; every page of the book is in its
//! `SUMMARY.md`.

use std::collections::BTreeSet;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::usage::shown::normalise;

/// The repository's root.
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The book's pages, beside its `SUMMARY.md`.
const BOOK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/src");

/// A page of the book, by file name (`"configuration.md"`).
pub fn page(name: &str) -> PathBuf {
    Path::new(BOOK).join(name)
}

/// The manual's pages: README.md, then the book's pages by name.
pub fn pages() -> Vec<PathBuf> {
    let mut book: Vec<PathBuf> = std::fs::read_dir(BOOK)
        .expect("read docs/src")
        .map(|entry| entry.expect("a docs/src entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    book.sort();
    std::iter::once(Path::new(ROOT).join("README.md"))
        .chain(book)
        .collect()
}

/// A page's path as the messages show it, from the repository's root.
fn relative(path: &Path) -> String {
    path.strip_prefix(ROOT)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Reads a page.
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", relative(path)))
}

/// Every page's text, one after the other.
pub fn manual() -> String {
    pages().iter().map(|path| read(path)).collect()
}

/// The scenarios that write checked blocks (`walkthrough.rs`, `examples.rs`, `tools.rs`); a
/// marker naming another belongs to no test.
pub const SCENARIOS: [&str; 9] = [
    "agents",
    "walkthrough",
    "conflict",
    "context",
    "auth",
    "healthcheck",
    "approval",
    "client",
    "policy",
];
const MARKER: &str = "<!-- checked: ";

/// Blessing rewrites pages; one test at a time.
static PAGES_LOCK: Mutex<()> = Mutex::new(());

/// One checked block of a page.
#[derive(Debug, Clone)]
pub struct Block {
    pub name: String,
    pub lang: String,
    pub body: String,
    /// The fence line and the body, in its page.
    span: Range<usize>,
}

/// The checked blocks of a page's text, in order.
pub fn checked_blocks(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut offset = 0;
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        offset += line.len();
        i += 1;
        let Some(name) = line
            .trim_end()
            .strip_prefix(MARKER)
            .and_then(|rest| rest.strip_suffix(" -->"))
        else {
            continue;
        };
        let fence = lines
            .get(i)
            .unwrap_or_else(|| panic!("{name}: no block after it"));
        let lang = fence
            .trim_end()
            .strip_prefix("```")
            .unwrap_or_else(|| panic!("{name}: the marker must be followed by a ``` fence"));
        let span_start = offset;
        offset += fence.len();
        i += 1;
        let mut body = String::new();
        loop {
            let line = lines
                .get(i)
                .unwrap_or_else(|| panic!("{name}: the block has no closing fence"));
            if line.trim_end() == "```" {
                break;
            }
            body.push_str(line);
            offset += line.len();
            i += 1;
        }
        blocks.push(Block {
            name: name.to_string(),
            lang: lang.to_string(),
            body,
            span: span_start..offset,
        });
    }
    blocks
}

/// What one scenario's test produced, block by block.
pub struct Transcript {
    scenario: &'static str,
    blocks: Vec<(String, String, String)>,
}

impl Transcript {
    pub fn new(scenario: &'static str) -> Transcript {
        Transcript {
            scenario,
            blocks: Vec::new(),
        }
    }

    /// Starts the block `<scenario>/<name>` with a fence of `lang`.
    pub fn block(&mut self, name: &str, lang: &str) {
        let name = format!("{}/{name}", self.scenario);
        assert!(
            self.blocks.iter().all(|(n, _, _)| *n != name),
            "two blocks named {name}"
        );
        self.blocks.push((name, lang.to_string(), String::new()));
    }

    /// Appends text to the current block.
    pub fn push(&mut self, text: &str) {
        let (name, _, body) = self.blocks.last_mut().expect("a block has been started");
        assert!(!text.contains("```"), "{name}: a fence inside a block");
        body.push_str(text);
        if !body.ends_with('\n') {
            body.push('\n');
        }
    }

    /// A command and what it printed, as a console session shows them.
    pub fn command(&mut self, command: &str, output: &str) {
        self.push(&format!("$ {command}"));
        if !output.is_empty() {
            self.push(output);
        }
    }

    /// Compares the page's blocks of this scenario with the transcript, or (`TAH_BLESS=1`)
    /// writes the transcript into them.
    pub fn check(self) {
        let _guard = PAGES_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let (path, text, ours) = scenario_blocks(self.scenario);
        let page = relative(&path);
        let names = |blocks: Vec<&String>| blocks.into_iter().cloned().collect::<Vec<_>>();
        let in_page = names(ours.iter().map(|b| &b.name).collect());
        let in_test = names(self.blocks.iter().map(|(n, _, _)| n).collect());
        assert_eq!(
            in_page, in_test,
            "{page}'s checked blocks of {:?} are not the ones its test writes, in that \
             order (add or remove `<!-- checked: NAME -->` markers)",
            self.scenario
        );
        if std::env::var("TAH_BLESS").is_ok_and(|v| v == "1") {
            let mut text = text;
            // From the end, so that earlier spans stay valid.
            for (block, (_, lang, body)) in ours.iter().zip(&self.blocks).rev() {
                text.replace_range(block.span.clone(), &format!("```{lang}\n{body}"));
            }
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {page}: {e}"));
            return;
        }
        let shown = ours
            .iter()
            .map(|b| format!("```{}\n{}", b.lang, b.body))
            .collect::<Vec<_>>();
        let real = self
            .blocks
            .iter()
            .map(|(_, lang, body)| format!("```{lang}\n{body}"))
            .collect::<Vec<_>>();
        // Ids are numbered across the whole scenario: the session created in one block is
        // the one a later block reads.
        let separator = "\n\u{0}\n";
        let shown_all = blind_to_shell(&normalise(&shown.join(separator)));
        let real_all = blind_to_shell(&normalise(&real.join(separator)));
        if shown_all == real_all {
            return;
        }
        let shown_parts: Vec<&str> = shown_all.split(separator).collect();
        let real_parts: Vec<&str> = real_all.split(separator).collect();
        for ((name, shown), real) in in_test.iter().zip(&shown_parts).zip(&real_parts) {
            if shown != real {
                let line = shown
                    .lines()
                    .zip(real.lines())
                    .position(|(a, b)| a != b)
                    .unwrap_or_else(|| shown.lines().count().min(real.lines().count()));
                panic!(
                    "{page}'s block {name} is not what the server answers (first difference \
                     on line {}; ids and times are numbered and hidden alike).\n\
                     --- {page} ---\n{shown}\n--- the server ---\n{real}\n\
                     Regenerate the blocks with TAH_BLESS=1 cargo test --test all usage::, \
                     and read the diff.",
                    line + 1
                );
            }
        }
        unreachable!("the blocks differ, so one of them does");
    }
}

/// The page that holds a scenario's checked blocks (README.md when none does), its text, and
/// those blocks in order.
fn scenario_blocks(scenario: &str) -> (PathBuf, String, Vec<Block>) {
    let prefix = format!("{scenario}/");
    let mut found = Vec::new();
    for path in pages() {
        let text = read(&path);
        let ours: Vec<Block> = checked_blocks(&text)
            .into_iter()
            .filter(|b| b.name.starts_with(&prefix))
            .collect();
        if !ours.is_empty() {
            found.push((path, text, ours));
        }
    }
    assert!(
        found.len() <= 1,
        "the checked blocks of {scenario:?} are on more than one page: {:?}",
        found
            .iter()
            .map(|(p, _, _)| relative(p))
            .collect::<Vec<_>>()
    );
    found.pop().unwrap_or_else(|| {
        let readme = pages().swap_remove(0);
        let text = read(&readme);
        (readme, text, Vec::new())
    })
}

/// The manual shows the tools a server offers where bubblewrap works, `shell` among them. Where
/// it does not (the build found no working bubblewrap: `cfg(sandbox_tests)` unset), the server
/// here does not offer `shell`, and both sides are compared without it: as a name in a
/// projection's list and as a tool definition sent to the model.
fn blind_to_shell(text: &str) -> String {
    if cfg!(sandbox_tests) {
        return text.to_string();
    }
    text.replace(r#""edit_file","shell","#, r#""edit_file","#)
        .replace(r#"{…,"name":"shell",…},"#, "")
}

#[test]
fn without_a_sandbox_shell_is_left_out_of_tool_lists_only() {
    let listed = r#"{"tools":["edit_file","shell","task"],"request":{"tools":[{…,"name":"edit_file",…},{…,"name":"shell",…},{…,"name":"task",…}]},"command":"shell"}"#;
    let blinded = blind_to_shell(listed);
    if cfg!(sandbox_tests) {
        assert_eq!(blinded, listed);
    } else {
        assert_eq!(
            blinded,
            r#"{"tools":["edit_file","task"],"request":{"tools":[{…,"name":"edit_file",…},{…,"name":"task",…}]},"command":"shell"}"#
        );
    }
}

#[test]
fn checked_blocks_are_found_with_their_spans() {
    let text = "intro\n<!-- checked: a/one -->\n```console\n$ x\ny\n```\nmore\n\
                <!-- checked: a/two -->\n```\n\n```\n";
    let blocks = checked_blocks(text);
    assert_eq!(blocks.len(), 2);
    assert_eq!(
        (blocks[0].name.as_str(), blocks[0].lang.as_str()),
        ("a/one", "console")
    );
    assert_eq!(blocks[0].body, "$ x\ny\n");
    assert_eq!(&text[blocks[0].span.clone()], "```console\n$ x\ny\n");
    assert_eq!(
        (blocks[1].name.as_str(), blocks[1].body.as_str()),
        ("a/two", "\n")
    );
}

#[test]
fn every_checked_block_of_the_manual_belongs_to_a_test() {
    let mut count = 0;
    for path in pages() {
        for block in checked_blocks(&read(&path)) {
            count += 1;
            let scenario = block.name.split('/').next().unwrap_or_default();
            assert!(
                SCENARIOS.contains(&scenario),
                "{}'s block {} belongs to no test (scenarios: {:?})",
                relative(&path),
                block.name,
                SCENARIOS
            );
        }
    }
    assert!(count > 10, "the manual has checked blocks");
}

/// The files whose links are checked: the manual's pages and BENCHMARKS.md.
fn linked_files() -> Vec<PathBuf> {
    let mut files = pages();
    files.push(Path::new(ROOT).join("BENCHMARKS.md"));
    files
}

/// The prose of a Markdown text with its line numbers: fenced blocks left out.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (None, None) => lines.push((number + 1, line)),
            _ => {}
        }
    }
    lines
}

/// A line with what is between backticks replaced by spaces.
fn blank_code(line: &str) -> String {
    line.split('`')
        .enumerate()
        .map(|(i, part)| {
            if i % 2 == 0 {
                part.to_string()
            } else {
                " ".repeat(part.len() + 2)
            }
        })
        .collect()
}

/// The targets of a line's inline links and images, `[text](target "title")`, that point
/// into the repository (no scheme); a link written as code is not a link.
fn link_targets(line: &str) -> Vec<String> {
    let line = blank_code(line);
    line.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &line[at + 2..];
            let end = rest.find([')', ' '])?;
            Some(rest[..end].trim_matches(['<', '>']))
        })
        .filter(|target| !target.contains("://") && !target.starts_with("mailto:"))
        .map(str::to_string)
        .collect()
}

/// A heading's anchor as GitHub and mdBook make it: lower case, spaces as `-`, punctuation
/// other than `-` and `_` left out.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// The anchors of a page's headings; a repeated heading gets `-1`, `-2`, … as on GitHub.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    for (_, line) in prose(text) {
        let Some(heading) = line.trim_start_matches('#').strip_prefix(' ') else {
            continue;
        };
        if !line.starts_with('#') {
            continue;
        }
        let base = slug(&heading.replace('`', ""));
        let mut anchor = base.clone();
        let mut n = 0;
        while !anchors.insert(anchor.clone()) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
    }
    anchors
}

/// What is wrong with one link of `from` (`None` when it resolves).
fn broken(from: &Path, target: &str) -> Option<String> {
    let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
    let to = if file.is_empty() {
        from.to_path_buf()
    } else {
        from.parent().expect("a page's directory").join(file)
    };
    if !to.exists() {
        return Some(format!("{} does not exist", relative(&to)));
    }
    if anchor.is_empty() {
        return None;
    }
    if to.extension().is_none_or(|e| e != "md") || !anchors(&read(&to)).contains(anchor) {
        return Some(format!("{} has no heading #{anchor}", relative(&to)));
    }
    None
}

#[test]
fn every_relative_link_of_the_manual_resolves() {
    let mut wrong = Vec::new();
    let mut count = 0;
    for path in linked_files() {
        for (number, line) in prose(&read(&path)) {
            for target in link_targets(line) {
                count += 1;
                if let Some(why) = broken(&path, &target) {
                    wrong.push(format!("{}:{number}: ({target}): {why}", relative(&path)));
                }
            }
        }
    }
    assert!(count > 50, "the manual has links ({count})");
    assert!(wrong.is_empty(), "broken links:\n{}", wrong.join("\n"));
}

#[test]
fn every_page_of_the_book_is_in_its_summary() {
    let listed: BTreeSet<String> = prose(&read(&page("SUMMARY.md")))
        .iter()
        .flat_map(|(_, line)| link_targets(line))
        .collect();
    for path in pages().iter().skip(1) {
        let name = path.file_name().expect("a page's name").to_string_lossy();
        assert!(
            name == "SUMMARY.md" || listed.contains(name.as_ref()),
            "docs/src/SUMMARY.md does not list {name}"
        );
    }
}

#[test]
fn links_and_anchors_are_read_as_github_shows_them() {
    let text = "# Front-end protocols: the AI SDK and AG-UI\n## The Vercel AI SDK (`useChat`)\n\
                ```\n# not a heading [x](nowhere.md)\n```\n## Notes\n## Notes\n\
                See [a](#notes-1), `[b](code.md)` and ![c](d.png \"title\") or [e](https://x/y).\n";
    assert_eq!(
        anchors(text).into_iter().collect::<Vec<_>>(),
        [
            "front-end-protocols-the-ai-sdk-and-ag-ui",
            "notes",
            "notes-1",
            "the-vercel-ai-sdk-usechat"
        ]
    );
    let targets: Vec<String> = prose(text)
        .iter()
        .flat_map(|(_, line)| link_targets(line))
        .collect();
    assert_eq!(targets, ["#notes-1", "d.png"]);
}
