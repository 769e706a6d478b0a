//! tah — an agent session server: long-running LLM agent sessions over REST and Server-Sent
//! Events, persisted so that they survive crashes, can be resumed, forked and cancelled.
//!
//! # Layout
//!
//! - [`model`]: the domain vocabulary (messages, events, sessions, runs, steps); no I/O.
//! - [`config`]: command-line flags with environment fallbacks, validated once.
//! - [`store`]: the `Store` trait, its SQLite implementation and the group-commit writer.
//! - [`llm`]: the `ModelClient` trait and the providers (mock, OpenAI-compatible, Anthropic).
//! - [`tools`]: the `Tool` trait and the workspace-confined file tools.
//! - [`agent`]: the agent loop and context projection; reaches a session only through the
//!   small `Journal` interface it defines.
//! - [`session`]: the per-session actor that owns a session and drives the loop, its handle,
//!   and the registry of live actors.
//! - [`runtime`]: ties store, model, tools and settings together; usable without HTTP.
//! - [`http`]: the axum router, problem+json errors and SSE streaming.
//! - [`bench`]: a fake OpenAI-compatible model server and a load generator, for measuring.
//!
//! Imports point one way: `http → session → agent → {llm, tools}`, `session → store`, and every
//! module may use `model`.

pub mod agent;
pub mod bench;
pub mod config;
pub mod http;
pub mod llm;
pub mod model;
pub mod runtime;
pub mod session;
pub mod store;
pub mod tools;
