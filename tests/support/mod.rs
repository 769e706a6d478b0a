//! What every black-box test suite shares: `crate::support` of the `all` test binary
//! (`tests/all.rs`), and of the MCP suite's own (`#[path = "../support/mod.rs"] mod support;`):
//!
//! - [`server`]: one launcher. `TestServer::start` runs the library's `Application` in the
//!   test's own runtime on port 0 with a fresh database and workspace; with
//!   `ServerOptions::process()` it runs the real `tah` binary instead, for tests that stop it
//!   with SIGTERM, kill it with SIGKILL or restart it on the same database. The binary's
//!   address comes from its ready line on stdout, never from its log.
//! - [`client`]: one HTTP client (`Api`, reqwest) with the API's domain requests and paging.
//! - [`sse`]: one SSE client (`eventsource-stream`) that checks every frame against its data,
//!   and a recording subscriber.
//! - [`postgres`]: one throwaway PostgreSQL: `TAH_TEST_PG_URL`, or a cluster of this test
//!   binary's own (started on first use, stopped when the process exits).
//! - [`fakes`]: fake OpenAI and Anthropic servers that answer byte for byte and check, on every
//!   request they receive, that each tool call is answered by a tool result.
//! - [`database`]: SQL on the server's own database, on either backend, for what only the
//!   tables show (copies of stored bytes, the room rows take).
//! - [`scripted`]: a server on a fake model that scripts tool calls, and helpers to read what
//!   the calls answered.
//! - [`checks`]: what the suites assert about logs and histories (seq contiguity, terminal
//!   events, tool-call pairing, percentiles), and [`fixtures`]: the workspace the mock reads.
//! - [`alone`]: the one lock of the tests that must not run beside each other (the hardening
//!   and replica tests, which measure timings).
//!
//! Tests of the support code itself are `support::tests` (`tests/support/tests.rs`) of the
//! `all` binary; they are left out of the MCP suite's binary, which has its own harness.

#![allow(dead_code, unused_imports)]

pub mod alone;
pub mod checks;
pub mod client;
pub mod database;
pub mod fakes;
pub mod fixtures;
pub mod postgres;
pub mod scripted;
pub mod server;
pub mod sse;
#[cfg(test)]
mod tests;

pub use checks::*;
pub use client::{assert_conflict, check_problem, Api, Reply};
pub use fixtures::{workspace_fixture, MOCK_TURN_ROLES, README, README_FIRST_SENTENCE};
pub use postgres::{with_database, TestDatabase};
pub use server::{is_postgres, serve_expecting_exit, Backend, ServerOptions, TestServer};
pub use sse::{
    deltas, has_terminal, Next, Seen, SseFrame, SseFrom, SseStream, Subscriber, FRAME_TIMEOUT,
};
