//! The README's checked blocks. A fenced block right after a line `<!-- checked: NAME -->` is
//! written by a test of this suite from what a real server answered: the test runs the
//! README's requests, renders each block (commands and outputs) into a [`Transcript`], and
//! [`Transcript::check`] compares it with the README's block, blind only to ids and times
//! (see [`crate::shown::normalise`]) and, where the `shell` tool's sandbox does not work (see
//! [`blind_to_shell`]), to `shell` in the lists of offered tools. After a change to what the server answers, regenerate the
//! blocks with
//!
//! ```text
//! TAH_BLESS=1 cargo test --test usage
//! ```
//!
//! and read the diff. A marker without a test, or a test block without a marker, fails.

use std::ops::Range;
use std::sync::Mutex;

use crate::shown::normalise;

pub const README: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");

/// The scenarios that write checked blocks (`walkthrough.rs`, `examples.rs`, `tools.rs`); a
/// marker naming another belongs to no test.
pub const SCENARIOS: [&str; 8] = [
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

/// Blessing rewrites README.md; one test at a time.
static README_LOCK: Mutex<()> = Mutex::new(());

/// One checked block of the README.
#[derive(Debug, Clone)]
pub struct Block {
    pub name: String,
    pub lang: String,
    pub body: String,
    /// The fence line and the body, in README.md.
    span: Range<usize>,
}

/// The checked blocks of a README text, in order.
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

    /// Compares the README's blocks of this scenario with the transcript, or (`TAH_BLESS=1`)
    /// writes the transcript into them.
    pub fn check(self) {
        let _guard = README_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let text = std::fs::read_to_string(README).expect("read README.md");
        let prefix = format!("{}/", self.scenario);
        let ours: Vec<Block> = checked_blocks(&text)
            .into_iter()
            .filter(|b| b.name.starts_with(&prefix))
            .collect();
        let names = |blocks: Vec<&String>| blocks.into_iter().cloned().collect::<Vec<_>>();
        let in_readme = names(ours.iter().map(|b| &b.name).collect());
        let in_test = names(self.blocks.iter().map(|(n, _, _)| n).collect());
        assert_eq!(
            in_readme, in_test,
            "README.md's checked blocks of {:?} are not the ones its test writes, in that \
             order (add or remove `<!-- checked: NAME -->` markers)",
            self.scenario
        );
        if std::env::var("TAH_BLESS").is_ok_and(|v| v == "1") {
            let mut text = text;
            // From the end, so that earlier spans stay valid.
            for (block, (_, lang, body)) in ours.iter().zip(&self.blocks).rev() {
                text.replace_range(block.span.clone(), &format!("```{lang}\n{body}"));
            }
            std::fs::write(README, text).expect("write README.md");
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
                    "README.md's block {name} is not what the server answers (first difference \
                     on line {}; ids and times are numbered and hidden alike).\n\
                     --- README.md ---\n{shown}\n--- the server ---\n{real}\n\
                     Regenerate the blocks with TAH_BLESS=1 cargo test --test usage, and \
                     read the diff.",
                    line + 1
                );
            }
        }
        unreachable!("the blocks differ, so one of them does");
    }
}

/// The README shows the tools a server offers where bubblewrap works, `shell` among them. Where
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
fn every_checked_block_of_the_readme_belongs_to_a_test() {
    let text = std::fs::read_to_string(README).expect("read README.md");
    let blocks = checked_blocks(&text);
    assert!(blocks.len() > 10, "README.md has checked blocks");
    for block in blocks {
        let scenario = block.name.split('/').next().unwrap_or_default();
        assert!(
            SCENARIOS.contains(&scenario),
            "README.md's block {} belongs to no test (scenarios: {:?})",
            block.name,
            SCENARIOS
        );
    }
}
