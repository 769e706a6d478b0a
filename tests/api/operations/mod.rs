//! Operating the server: token budgets, steering a running turn, idempotent requests.
//!
//! - `budgets`: `max_tokens` and `max_run_tokens` per session, `--max-session-tokens` and
//!   `--max-run-tokens` by default; a step that would start over budget ends the run `failed`
//!   with `finish_reason: budget` and an error naming the limit.
//! - `steering`: `POST /runs?if_busy=reject|queue|interrupt` while a run is active.
//! - `idempotency`: `Idempotency-Key`: replays, conflicts, concurrency, restarts, replicas.
//! - `metrics`: `GET /metrics` parsed after known work, and on its own `--metrics-listen`.
//! - `webhooks`: signed deliveries, retries, a kill -9, and the start-up checks.
//! - `traces`: OpenTelemetry spans over OTLP/HTTP, decoded by a receiver of the test's own.

mod budgets;
mod idempotency;
mod metrics;
mod steering;
mod traces;
mod webhooks;
