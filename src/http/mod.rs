//! The HTTP API: an axum router over [`Sessions`], problem+json errors, and SSE streaming.
//!
//! Handlers are thin: they parse and validate input, call the session layer, and shape the
//! answer. One module per resource; `router` merges them.
//!
//! - `sessions`, `runs`, `events`, `approvals`, `artifacts`, `agents`, `vaults` (write-only
//!   secrets), `schedules`, `environments` (and their workers' claims), `replays` (a
//!   session's replay and its report): the resources.
//! - `adapters/`: the faces, front-end protocols over the same sessions (`ai_sdk`: the Vercel
//!   AI SDK's UI message stream; `ag_ui`: AG-UI), and what they share (streaming a run
//!   through an adapter of [`crate::protocols`]).
//! - `idempotency`: `Idempotency-Key` on the POST routes that make something.
//! - `auth`: API tokens and the page's sign-in cookie; `guard`: requests a web page could make
//!   without the user knowing.
//! - `ui`: the built-in web page, embedded in the binary.
//! - `extract`: typed path ids (`Ids`; a malformed id is a 404).
//! - `problem`: problem+json errors and the extractors that produce them; `params`: lenient
//!   query values; `paging`: limits, cursors and the page envelope.
//! - [`server`]: the listener loop, with the connection limits a public server needs.

mod access;
mod adapters;
mod agents;
mod approvals;
mod artifacts;
mod auth;
mod environments;
mod events;
mod extract;
mod guard;
pub mod idempotency;
pub mod jwt;
mod keys;
mod paging;
mod params;
mod problem;
mod providers;
mod replays;
mod runs;
mod schedules;
pub mod server;
mod sessions;
pub mod sse;
mod ui;
mod vaults;

use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderName, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{middleware, Json, Router};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::timeout::TimeoutLayer;
use tracing::Instrument as _;

pub use problem::{Problem, PROBLEM_JSON};
pub use server::ConnectionLimits;

use crate::principals::Principals;
use crate::runtime::EdgeRecords;
use crate::session::Sessions;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub sessions: Sessions,
    /// Cancelled when the server begins to shut down: SSE streams end, readiness fails.
    pub shutdown: CancellationToken,
}

#[derive(Clone)]
pub struct HttpOptions {
    pub max_body_bytes: usize,
    /// Accepted API tokens (operators); none = no authentication unless keys exist or JWTs
    /// are configured.
    pub api_tokens: Vec<String>,
    /// Bearer JWTs, when configured.
    pub jwt: Option<jwt::JwtVerifier>,
    /// Origins allowed by CORS; empty = no cross-origin access.
    pub cors_origins: Vec<String>,
    /// Time limit of ordinary requests (not SSE streams, not `?wait=true` runs).
    pub request_timeout: Duration,
    /// The address the server listens on (its name is answered besides the loopback names).
    pub listen: Option<SocketAddr>,
    /// Host names answered besides the loopback names and the listen address; `*` = any.
    pub allowed_hosts: Vec<String>,
    /// `GET /metrics` is served here too (false: it has a listener of its own, see
    /// [`metrics_router`], and this router answers it 404).
    pub metrics: bool,
    /// A2A push notifications may go to private addresses (`--a2a-allow-private-push`).
    pub a2a_allow_private_push: bool,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            max_body_bytes: 1024 * 1024,
            api_tokens: Vec::new(),
            jwt: None,
            cors_origins: Vec::new(),
            request_timeout: Duration::from_secs(30),
            listen: None,
            allowed_hosts: Vec::new(),
            a2a_allow_private_push: false,
            metrics: true,
        }
    }
}

pub fn router(state: AppState, options: &HttpOptions) -> Router {
    // Streaming and long-polling routes (SSE, runs, compaction) have no time limit.
    let quick = sessions::routes()
        .merge(artifacts::routes())
        .merge(providers::routes())
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            options.request_timeout,
        ));
    let tokens = auth::Tokens::new(&options.api_tokens);
    let guard = guard::RequestGuard::new(
        options.listen,
        &options.allowed_hosts,
        &options.cors_origins,
        tokens.enabled() || options.jwt.is_some(),
    );
    let principals = Principals::new(state.sessions.store().clone());
    let auth = auth::Auth::new(
        tokens,
        EdgeRecords::of(&state.sessions),
        principals.clone(),
        options.jwt.clone(),
    );
    let mut open = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/openapi.yaml", get(openapi));
    if options.metrics {
        open = open.route("/metrics", get(metrics));
    }
    open.merge(quick)
        .merge(agents::routes())
        .merge(keys::routes(principals))
        .merge(vaults::routes())
        .merge(environments::routes())
        .merge(schedules::routes())
        .merge(runs::routes())
        .merge(replays::routes())
        .merge(approvals::routes())
        .merge(events::routes())
        .merge(auth::routes(auth.clone()))
        .merge(ui::routes())
        .merge(adapters::ai_sdk::routes())
        .merge(adapters::ag_ui::routes())
        .merge(adapters::a2a::routes(adapters::a2a::Face {
            auth_required: !options.api_tokens.is_empty() || options.jwt.is_some(),
            allow_private_push: options.a2a_allow_private_push,
        }))
        .merge(adapters::anthropic::routes())
        .merge(adapters::mcp::routes())
        .merge(adapters::openai::routes())
        // After routing (it reads the matched route), before every handler.
        .route_layer(middleware::from_fn_with_state(
            access::SessionAccess {
                sessions: state.sessions.clone(),
                owners: access::SessionOwners::default(),
            },
            access::check_session,
        ))
        .fallback(not_found)
        // Inside authentication: a kept response is only answered to a client with a token.
        .layer(middleware::from_fn_with_state(
            idempotency::Keys::new(EdgeRecords::of(&state.sessions), options.max_body_bytes),
            idempotency::check,
        ))
        .layer(middleware::from_fn_with_state(auth, auth::authenticate))
        .layer(middleware::from_fn_with_state(guard, guard::check))
        .layer(middleware::from_fn(problem::problem_responses))
        // Outside the problem layer: a face's errors in its vendor's shape.
        .layer(middleware::from_fn(adapters::errors::face_errors))
        .layer(middleware::from_fn(ui::api_policy))
        .layer(cors(&options.cors_origins))
        .layer(DefaultBodyLimit::max(options.max_body_bytes))
        .layer(middleware::from_fn(trace_requests))
        .with_state(state)
}

/// A span per request around its handler, and an error logged for a `5xx` answer. Spans
/// record the path only: a query may carry an access token. The body is left unwrapped: an
/// event stream is polled for every event it sends, and a span entered at every poll would
/// cost every event of every subscriber.
async fn trace_requests(request: Request, next: Next) -> Response {
    let span = tracing::info_span!(
        "request",
        method = %request.method(),
        path = %request.uri().path()
    );
    let started = Instant::now();
    let response = next.run(request).instrument(span.clone()).await;
    let status = response.status();
    if status.is_server_error() {
        span.in_scope(|| {
            tracing::error!(
                classification = %format_args!("Status code: {status}"),
                latency = %format_args!("{} ms", started.elapsed().as_millis()),
                "response failed"
            );
        });
    }
    response
}

/// `GET /metrics` alone, for `--metrics-listen`: every other path is answered 404.
pub fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(middleware::from_fn(problem::problem_responses))
        // Outside the problem layer: a face's errors in its vendor's shape.
        .layer(middleware::from_fn(adapters::errors::face_errors))
        .with_state(state)
}

/// CORS for the configured origins only; with none, browsers get no cross-origin access.
fn cors(origins: &[String]) -> CorsLayer {
    if origins.is_empty() {
        return CorsLayer::new();
    }
    let allow_origin = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    CorsLayer::new()
        .allow_origin(allow_origin)
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::ACCEPT,
            HeaderName::from_static("last-event-id"),
            header::IF_NONE_MATCH,
            HeaderName::from_static(idempotency::IDEMPOTENCY_KEY),
        ])
        // What a page needs to read from an answer: where a new resource is, and an
        // artifact's version tag and file name.
        .expose_headers([header::LOCATION, header::ETAG, header::CONTENT_DISPOSITION])
        .max_age(Duration::from_secs(600))
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets open requests finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: ConnectionLimits,
) -> std::io::Result<()> {
    server::serve(listener, router, shutdown, limits).await
}

async fn healthz() -> impl IntoResponse {
    Json(json!({ "status": "ok" }))
}

async fn readyz(State(state): State<AppState>) -> axum::response::Response {
    if state.shutdown.is_cancelled() {
        return Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "shutting down",
        )
        .into_response();
    }
    if let Some(why) = state.sessions.write_failure() {
        return Problem::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", why).into_response();
    }
    match state.sessions.store_health().await {
        Ok(()) => Json(json!({ "status": "ready" })).into_response(),
        Err(error) => {
            tracing::warn!(%error, "readiness probe failed");
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                format!("the database cannot be used: {error}"),
            )
            .into_response()
        }
    }
}

/// The Prometheus metrics (open like `/healthz`).
async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        crate::metrics::render(state.sessions.live_count()),
    )
}

async fn openapi() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/yaml")],
        include_str!("../../openapi.yaml"),
    )
}

async fn not_found() -> Problem {
    Problem::not_found("no such route")
}
