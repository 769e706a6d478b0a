//! tah — an agent session server: long-running LLM agent sessions over REST and Server-Sent
//! Events, persisted so that they survive crashes, can be resumed, forked and cancelled.
//!
//! # Layout
//!
//! - [`model`]: the domain vocabulary (messages, events, sessions, runs, steps); no I/O.
//! - [`cli`]: the binary's command line (clap types only: `serve`, `bench`, `fake-model`).
//! - [`config`]: `tah serve`'s flags parsed once into validated [`config::Settings`].
//! - [`store`]: the `Store` trait, its SQLite and PostgreSQL implementations and the
//!   group-commit writer.
//! - [`llm`]: the `ModelClient` trait and the providers (mock, OpenAI-compatible, Anthropic).
//! - [`tools`]: the `Tool` trait and the workspace-confined file tools.
//! - [`agent`]: the agent loop and context projection; reaches a session only through the
//!   small `Journal` interface it defines.
//! - [`session`]: the per-session actor that owns a session and drives the loop, its handle,
//!   and the registry of live actors.
//! - [`runtime`]: ties store, model, tools and settings together; usable without HTTP.
//! - [`http`]: the axum router, problem+json errors and SSE streaming.
//! - [`app`]: the [`app::Application`] — runtime and router on a bound listener, served until
//!   stopped; what `tah serve` runs and what the black-box tests start in-process.
//!
//! The binary (`src/main.rs`) adds the load generator and the fake model (`tah bench`,
//! `tah fake-model`), which are not part of the library.
//!
//! Imports point one way: `http → session → agent → {llm, tools}`, `session → store`, and every
//! module may use `model`; `app → {runtime, http, config}`, `config → cli`, and nothing imports
//! `app`.

pub mod agent;
pub mod app;
pub mod cli;
pub mod config;
pub mod http;
pub mod llm;
pub mod model;
pub mod runtime;
pub mod session;
pub mod store;
pub mod tools;
