//! The HTTP API: an axum router over [`Sessions`], problem+json errors, and SSE streaming.
//!
//! Handlers are thin: they parse and validate input, call the session layer, and shape the
//! answer. One module per resource; `router` merges them.

mod events;
mod problem;
mod runs;
mod sessions;

use std::future::Future;
use std::net::SocketAddr;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{middleware, Json, Router};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower_http::trace::TraceLayer;

pub use problem::{Problem, PROBLEM_JSON};

use crate::session::Sessions;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub sessions: Sessions,
    /// Cancelled when the server begins to shut down: SSE streams end, readiness fails.
    pub shutdown: CancellationToken,
}

#[derive(Debug, Clone)]
pub struct HttpOptions {
    pub max_body_bytes: usize,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            max_body_bytes: 1024 * 1024,
        }
    }
}

pub fn router(state: AppState, options: &HttpOptions) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/openapi.yaml", get(openapi))
        .merge(sessions::routes())
        .merge(runs::routes())
        .merge(events::routes())
        .fallback(not_found)
        .layer(middleware::from_fn(problem::problem_responses))
        .layer(DefaultBodyLimit::max(options.max_body_bytes))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets open requests finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
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
    match state.sessions.store().last_seq(uuid::Uuid::nil()).await {
        Ok(_) => Json(json!({ "status": "ready" })).into_response(),
        Err(error) => {
            tracing::warn!(%error, "readiness probe failed");
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the database is not reachable",
            )
            .into_response()
        }
    }
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
