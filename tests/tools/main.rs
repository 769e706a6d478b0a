//! Tools that do real work, through HTTP: the built-in tools called by a scripted model, the
//! policy, human approvals (every outcome, across a restart), the tools a client runs, and
//! the routes that list tools and take answers.
//!
//! The model is the fake OpenAI-compatible server of `support::fakes`, which replies with the
//! tool calls a test scripts (and checks on every request that each call has its result).

#[path = "../support/mod.rs"]
mod support;

mod approvals;
mod builtin;
mod client;
mod routes;

// The helpers of the tools suites, shared with the MCP suite.
pub use support::scripted::*;
