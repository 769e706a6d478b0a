//! Hardening tests of `tah serve`, black-box: the server on 127.0.0.1 with a fresh SQLite
//! database and the mock model, driven over HTTP and SSE only — the real binary where it is
//! killed or stopped with a signal (`crash_safety`, `shutdown_under_load`), the library's
//! `Application` in-process elsewhere (see `tests/support`).
//!
//! - `crash_safety`: concurrent clients, five kill -9 cycles, then every session's log, runs
//!   and messages are whole and consistent, interrupted runs resume, and SQLite is intact.
//! - `reconnect_chaos`: SSE clients that drop and reconnect (`Last-Event-ID` / `?after=`) at
//!   random moments rebuild each session's log exactly, event for event.
//! - `load`: hundreds of concurrent sessions and SSE subscribers, with no error and no lost or
//!   duplicated event.
//! - `shutdown_under_load`: SIGTERM with 50 runs in flight exits promptly with status 0, and
//!   every run is afterwards completed or interrupted and resumable.
//!
//! The tests run one at a time (`support::alone`, a lock shared with the replica tests), so
//! their timings do not disturb each other on a small machine. Each prints its figures with
//! `eprintln!` (see `--nocapture`). The random choices of `crash_safety` and `reconnect_chaos`
//! come from a seed that is printed; `HARDENING_SEED=<n>` replays it.

mod checks;
mod crash_safety;
mod load;
mod reconnect_chaos;
mod shutdown_under_load;
mod sse;

use crate::support::alone::run as run_alone;

/// The seed of a test's random choices: `HARDENING_SEED`, or the clock.
pub fn seed(name: &str) -> u64 {
    let seed = std::env::var("HARDENING_SEED")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("[{name}] seed {seed} (replay with HARDENING_SEED={seed})");
    seed
}

#[test]
fn crash_safety() {
    run_alone("crash_safety", crash_safety::run());
}

#[test]
fn reconnect_chaos() {
    run_alone("reconnect_chaos", reconnect_chaos::run());
}

#[test]
fn load() {
    run_alone("load", load::run());
}

#[test]
fn shutdown_under_load() {
    run_alone("shutdown_under_load", shutdown_under_load::run());
}
