//! tah — an agent session server: long-running LLM agent sessions over REST and Server-Sent
//! Events, persisted so that they survive crashes, can be resumed, forked and cancelled.
//!
//! # Layout
//!
//! - [`model`]: the domain vocabulary, no I/O: `ids` (typed ids), `message`, `event` (an
//!   [`model::Event`] keeps its typed kind), `published` (an event on its way out, its wire
//!   form rendered once), `waiting` (the one replay of a log into the calls that wait for an
//!   answer), `session` (sessions, runs, steps, checkpoints as stored), `step` (the LLM step
//!   descriptor and finish reasons), `artifact` (the files a session produced), `environment`
//!   (where a session's built-in tools run).
//! - [`cli`]: the binary's command line (clap types only: `serve`, `bench`, `fake-model`).
//! - [`config`]: `tah serve`'s flags parsed once into validated [`config::Settings`], in groups
//!   (HTTP, store, model, run, tools, policy, webhooks, telemetry).
//! - [`store`]: the `Store` trait and its backends: `sqlite/{read, write, lock}` (the embedded
//!   store), `postgres/{read, write, cluster}` (scale-out: leases, fencing, notifications),
//!   `rows` (the column lists and row decoding both share) and `writer` (group commit).
//! - [`llm`]: the `ModelClient` trait and the providers (`mock`, `openai`, `anthropic`);
//!   `wire/` is the HTTP plumbing both real providers share (timeouts, retries, SSE) and
//!   `guard` what their replies are held to (size limits, secrets scrubbed).
//! - [`tools`]: the `Tool` trait; `builtin/` (files, search, edit, shell), the `workspace`
//!   that confines them, the bubblewrap `sandbox`, the `registry` that runs calls, `schema`,
//!   and the pure `policy`.
//! - [`mcp`]: MCP tool servers: the `--mcp-config` file (`config`), one connection to a server
//!   (`connection`: a child process in its own group, or streamable HTTP), its supervisor that
//!   restarts it (`server`), and its tools as `Tool`s (`tool`).
//! - [`agent`]: the agent loop (`turn`, `calls`), context projection (`context`, pure) and
//!   `compaction`; it reaches a session only through the small `Journal` interface it defines
//!   in `journal` (with `AgentError`, how a run fails).
//! - [`session`]: sessions as live objects: `actor/` (the per-session actor: its mailbox
//!   loop and one handler per command family), `run/` (a run being driven: the agent loop's
//!   `Journal`, its `CallBoard`, a pure `admit`, the write batch, its end), `command`,
//!   `errors` (`SessionError`, `ConflictKind`), `sessions` (the API every face uses), `start`
//!   (subscribe-run-follow for every face), `reads` (what the faces read), `live` (the live
//!   sessions of this process), `lease`, `stream` (replay-then-live), `steps` (rebuilding a
//!   step's request), `subagents` and `lineage` (the `task` tool and a run's children) and
//!   `coordination` (scale-out background tasks).
//! - [`schedules`]: agent runs on a cron in an IANA time zone: `timing` (the cron, the
//!   pure misfire plan), `scheduler` (the task that claims due fires once across replicas),
//!   and the fire itself (overlap, the run through `Sessions`, the fires log).
//! - [`metrics`]: the process's Prometheus metrics, counted where things happen.
//! - [`telemetry`]: OpenTelemetry traces of runs, LLM calls and tool calls (GenAI
//!   conventions), exported over OTLP when the standard `OTEL_*` variables ask for it.
//! - [`protocols`]: the front-end protocols as pure views of a session's log: `ai_sdk` (the
//!   Vercel AI SDK's UI message stream), `ag_ui` (AG-UI), and `calls` (their view of the calls
//!   that wait for an answer, over `model::waiting`).
//! - [`vault`]: the tenants' secrets: the master key, sealing and opening a value, the
//!   `${vault:VAULT/NAME}` references.
//! - [`runtime`]: ties store, model, tools and settings together; usable without HTTP.
//! - [`worker`]: `tah worker`, which dials a server and runs a `workers` environment's
//!   built-in tool calls in its own workspace and sandbox, under leases.
//! - [`http`]: the axum router, one module per resource (`sessions`, `runs`, `events`,
//!   `artifacts`, `approvals`), the faces in `adapters/` (`ai_sdk`, `ag_ui`), `extract`
//!   (typed path ids), `auth`, `guard` (requests a web page could forge), `problem` (problem+json), `paging`,
//!   `params` and `server` (the listener loop and its connection limits).
//! - [`app`]: the [`app::Application`] — runtime and router on a bound listener, served until
//!   stopped; what `tah serve` runs and what the black-box tests start in-process.
//!
//! The binary (`src/main.rs`) adds `src/bench/`: the fake model (`fake_model`, `tah
//! fake-model`) and the load generator (`loadgen/`, `tah bench`), which are not part of the
//! library.
//!
//! Imports point one way: `http → session → agent → {llm, tools}`, `session → {store, mcp}`,
//! `mcp → tools`, `http → protocols`, `{session, agent} → telemetry → {llm, tools}`, and every
//! module may use `model`; `http → runtime` only for the edge's own records
//! (`runtime::EdgeRecords`: idempotency keys, sign-ins); `app → {runtime, http, config}`,
//! `config → cli`, and nothing imports `app`.

pub mod acp;
pub mod agent;
pub mod app;
pub mod cli;
pub mod config;
pub mod http;
pub mod llm;
pub mod mcp;
pub mod metrics;
pub mod model;
pub mod principals;
pub mod protocols;
pub mod runtime;
pub mod schedules;
pub mod session;
pub mod store;
pub mod telemetry;
pub mod tools;
pub mod vault;
pub mod webhooks;
pub mod worker;
