//! The binary as a user runs it: `tah healthcheck` (the container's probe).
//!
//! - `healthcheck`: exit 0 against a ready server, 1 against a closed port or a 503, with a
//!   line saying why.

#[path = "../support/mod.rs"]
mod support;

mod healthcheck;

use tokio::process::Command;

/// The `tah` binary, without the caller's `TAH_*` variables or provider keys (the README's
/// reader has none: the mock model answers).
pub fn tah() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_tah"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("TAH_") {
            command.env_remove(name);
        }
    }
    command
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env("NO_COLOR", "1")
        .kill_on_drop(true);
    command
}
