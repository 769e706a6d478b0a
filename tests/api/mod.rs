//! Black-box tests of `tah serve`: the server on port 0 with a fresh database and a small
//! workspace, driven through HTTP and SSE only (the mock model). It runs in-process (the
//! library's `Application`) unless a test stops, kills or restarts it: then it is the real
//! binary. See `tests/support`.
//!
//! The backend is SQLite by default; `TAH_TEST_BACKEND=postgres` runs the same tests against
//! PostgreSQL (a fresh database per server, on `TAH_TEST_PG_URL` or on a throwaway cluster the
//! suite starts itself):
//!
//! ```text
//! TAH_TEST_BACKEND=postgres cargo test --test all api::
//! ```
//!
//! - `turns`: one turn and its messages, steps and events; run modes; session lists.
//! - `streaming`: SSE replay after any id, live hand-off, run streams, many subscribers.
//! - `durability`: restarts (SIGTERM and kill -9) keep everything, byte for byte.
//! - `bad_input`: every kind of bad request is a 4xx problem and changes nothing.
//! - `lifecycle`: cancel, resume after a crash, fork, conflicts, max_steps, configuration
//!   changes, graceful shutdown, and the storage of a long session's steps.
//! - `operations`: token budgets, steering a running turn (`?if_busy=`), idempotent requests.
//! - `compaction`: `--context-chars`: automatic and manual compaction, trimming, every
//!   rebuilt request within the budget, forks before a summary.
//! - `subagents`: the `task` tool's child sessions: their logs, concurrency, cancellation,
//!   run permits, the depth limit and `?parent_id=`.
//! - `ai_sdk`: the AI SDK face's history (`…/ai-sdk/messages`): the stream's ids, a run that
//!   waits, bad requests.
//! - `thinking`: the mock's reasoning when asked to think: streamed, kept in
//!   `message.thinking`, shown as thinking steps, durable across a restart, copied by a fork.

mod ai_sdk;
mod bad_input;
mod compaction;
mod durability;
mod lifecycle;
mod operations;
mod streaming;
mod subagents;
mod thinking;
mod turns;
