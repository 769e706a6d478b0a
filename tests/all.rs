//! The black-box test suites of tah, one module each, in one test binary, so that the shared
//! support (`support`) and the suites are built and linked once. A suite is chosen by its
//! module path, e.g. `cargo test --test all api::` (the names of its tests start with it).
//!
//! - `api`: the HTTP and SSE API on the mock model (both backends, `TAH_TEST_BACKEND`).
//! - `agents`: agents as versioned resources, sessions on them, several providers at once.
//! - `anthropic`: the Claude Managed Agents face: bad input, tenants, session tokens, resume.
//! - `faults`: storage faults, hostile providers, hostile pages and slow clients.
//! - `principals`: keys, tenants, owners and session tokens on every route (a walk over
//!   `openapi.yaml`'s operations), and the `tah keys` CLI.
//! - `jwt`: bearer JWTs verified against a JWKS, end to end.
//! - `hardening`: crash safety under kill -9, reconnect chaos, load, shutdown under load.
//! - `limits`: per-tenant limits (runs at once, tokens per day) and their `429`s.
//! - `openai`: OpenAI's face: bad input, tenants and session tokens, exact stream resume.
//! - `replay`: replays of recorded sessions (`recorded` and `live`) and their reports.
//! - `replicas`: several processes on one PostgreSQL database.
//! - `sandbox`: the `shell` sandbox's backends (bubblewrap, Landlock) and the limits on a call.
//! - `schedules`: schedules, their fires, overlap and misfire policies, across restarts and
//!   replicas.
//! - `store`: the store conformance suite, on SQLite and PostgreSQL.
//! - `tools`: the built-in tools, the policy, approvals, client tools, artifacts, workspaces.
//! - `providers` and `provider_e2e`: the OpenAI and Anthropic clients against fakes.
//! - `usage`: the manual, checked against real servers.
//! - `ui`: the web page's files and its sign-in.
//! - `vaults`: write-only secrets, sealed at rest; who may use them; a provider key from one.
//! - `workers`: remote environments and `tah worker`: calls run on workers, leases, kills.
//! - `support`: what the suites share, and its own tests (`support::tests`).
//!
//! The MCP suite (`tests/mcp`) is a binary of its own: it runs its own harness and is also the
//! MCP server it tests.

mod support;

mod a2a;
mod agents;
mod anthropic;
mod api;
mod faults;
mod hardening;
mod jwt;
mod limits;
mod mcp_server;
mod openai;
mod principals;
mod provider_e2e;
mod providers;
mod replay;
mod replicas;
mod sandbox;
mod schedules;
mod store;
mod tools;
mod ui;
mod usage;
mod vaults;
mod workers;
