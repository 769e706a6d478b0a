//! The workspace every test server's file tools see: a README (which the mock model lists,
//! reads and quotes), `src/main.rs` and `docs/guide.md`, so that a mock turn is
//! list_files → read_file README.md → an answer that quotes the README's first sentence.

use tempfile::TempDir;

/// The README the mock model reads; its first sentence shows up in every answer.
pub const README: &str = "# Demo\n\nDemo is a small sample project. It exists for tests.\n";
pub const README_FIRST_SENTENCE: &str = "Demo is a small sample project.";

/// The roles of a session's messages after one mock turn: the system prompt, the input,
/// list_files and its result, read_file and its result, the answer.
pub const MOCK_TURN_ROLES: [&str; 7] = [
    "system",
    "user",
    "assistant",
    "tool",
    "assistant",
    "tool",
    "assistant",
];

/// A fresh workspace directory, removed when dropped.
pub fn workspace_fixture() -> TempDir {
    let dir = tempfile::Builder::new()
        .prefix("tah-workspace-")
        .tempdir()
        .expect("create the workspace dir");
    std::fs::write(dir.path().join("README.md"), README).expect("write README.md");
    std::fs::create_dir_all(dir.path().join("src")).expect("create src/");
    std::fs::write(
        dir.path().join("src/main.rs"),
        "fn main() {\n    println!(\"demo\");\n}\n",
    )
    .expect("write src/main.rs");
    std::fs::create_dir_all(dir.path().join("docs")).expect("create docs/");
    std::fs::write(dir.path().join("docs/guide.md"), "# Guide\n\nRead me.\n")
        .expect("write docs/guide.md");
    dir
}
