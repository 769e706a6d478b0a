//! The binary as the manual tells a user to run it: the manual's examples against servers
//! started as it starts them, its configuration table against `tah serve --help`, boolean
//! values as people write them, and `tah healthcheck` (the container's probe).
//!
//! - `walkthrough`, `examples` and `tools`: every checked block of the manual (the curl
//!   walkthrough, a conflict, the context example, authentication and CORS, the healthcheck,
//!   a `--tool-policy` file, an approval and the other answers, a client tool) rendered from
//!   what a real server answers and compared with its page; `TAH_BLESS=1 cargo test --test
//!   all usage::` rewrites them (see `readme`).
//! - `flags`: every flag of `tah serve` is in the manual's table with its variable and
//!   default; boolean variables take true/false, 1/0, yes/no, on/off in any case; a
//!   `--cors-origin` with a trailing slash gets CORS headers for the origin browsers send.
//! - `healthcheck`: exit 0 against a ready server, 1 against a closed port or a 503, with a
//!   line saying why.
//!
//! `readme`, `shown` and `demo` are this suite's own support: the manual's checked blocks, how
//! answers are shown (key order kept, fields left out as `…`), and a server started in a
//! directory of its own with requests written as curl commands.

mod agents;
mod demo;
mod examples;
mod flags;
mod healthcheck;
mod readme;
mod shown;
mod tools;
mod walkthrough;

use tokio::process::Command;

/// The `tah` binary, without the caller's `TAH_*` variables or provider keys (the manual's
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
