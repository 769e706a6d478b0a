//! Black-box tests of `tah serve`: the real binary, started on port 0 with a fresh SQLite
//! database and a small workspace, driven through HTTP and SSE only (the mock model).
//!
//! - `harness`: starting, stopping and killing the server; requests, pages and SSE frames.
//! - `turns`: one turn and its messages, steps and events; run modes; session lists.
//! - `streaming`: SSE replay after any id, live hand-off, run streams, many subscribers.
//! - `durability`: restarts (SIGTERM and kill -9) keep everything, byte for byte.
//! - `bad_input`: every kind of bad request is a 4xx problem and changes nothing.
//! - `lifecycle`: cancel, resume after a crash, fork, conflicts, max_steps, configuration
//!   changes and graceful shutdown.

mod bad_input;
mod durability;
mod harness;
mod lifecycle;
mod streaming;
mod turns;
