//! `/v1/sessions/{id}/events`: a JSON page of the log, or Server-Sent Events that replay after
//! `Last-Event-ID` / `?after=` and then follow the session live.

use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::extract::Ids;
use super::paging::{page_limit, session_page};
use super::problem::{ApiQuery, Problem};
use super::AppState;
use crate::model::SessionId;
use crate::session::EventStream;

/// Heartbeat comments keep proxies from closing an idle stream (the contract: ≤ 15 s); the
/// protocol fronts use it (the event log's own streams beat from [`super::sse`]'s tick).
pub(super) const HEARTBEAT: Duration = Duration::from_secs(10);

pub fn routes() -> Router<AppState> {
    Router::new().route("/v1/sessions/{id}/events", get(events))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EventsQuery {
    after: Option<i64>,
    limit: Option<i64>,
    /// Checked by the auth layer (EventSource cannot send headers); never used here.
    #[serde(default, rename = "access_token")]
    _access_token: Option<String>,
}

pub fn wants_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"))
}

async fn events(
    State(state): State<AppState>,
    Ids(SessionId(id)): Ids<SessionId>,
    ApiQuery(q): ApiQuery<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    if q.after.is_some_and(|a| a < 0) {
        return Err(Problem::bad_request(
            "after must be a non-negative event seq",
        ));
    }
    if wants_event_stream(&headers) {
        let last_event_id = match headers.get("last-event-id") {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .ok()
                    .and_then(|s| s.trim().parse::<i64>().ok())
                    .filter(|n| *n >= 0)
                    .ok_or_else(|| {
                        Problem::bad_request(
                            "Last-Event-ID must be an event seq (a non-negative integer)",
                        )
                    })?,
            ),
        };
        // The header is what a reconnecting EventSource sends; it wins over the query.
        let after = last_event_id.or(q.after).unwrap_or(0);
        let stream = state.sessions.follow(id, after, None).await?;
        return Ok(sse_response(stream, state.shutdown.clone()));
    }
    let limit = page_limit(q.limit)?;
    let after = q.after.unwrap_or(0);
    let read = |id, after, limit| state.sessions.events_page(id, after, limit);
    let page = session_page(&state, id, limit, after, read, |e| e.seq.to_string()).await?;
    Ok(page.into_response())
}

/// Streams events as SSE frames until the stream ends or the server shuts down.
pub fn sse_response(stream: EventStream, shutdown: CancellationToken) -> Response {
    super::sse::response(stream, shutdown)
}
