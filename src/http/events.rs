//! `/v1/sessions/{id}/events`: a JSON page of the log, or Server-Sent Events that replay after
//! `Last-Event-ID` / `?after=` and then follow the session live.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures::StreamExt;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::paging::{one_more, page_limit, Page};
use super::problem::{parse_id, ApiQuery, Problem};
use super::AppState;
use crate::model::Event;
use crate::session::EventStream;

pub fn routes() -> Router<AppState> {
    Router::new().route("/v1/sessions/{id}/events", get(events))
}

/// Heartbeat comments keep proxies from closing an idle stream (the contract: ≤ 15 s).
pub(super) const HEARTBEAT: Duration = Duration::from_secs(10);

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
    Path(id): Path<String>,
    ApiQuery(q): ApiQuery<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let id = parse_id(&id, "session")?;
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
    state.sessions.get(id).await?;
    let data = state
        .sessions
        .store()
        .events(id, q.after.unwrap_or(0), one_more(limit))
        .await?;
    Ok(Json(Page::new(data, limit, |e| e.seq.to_string())).into_response())
}

fn frame(event: &Event) -> SseEvent {
    SseEvent::default()
        .id(event.seq.to_string())
        .event(event.type_name())
        .data(&*event.json())
}

/// Streams events as SSE frames until the stream ends or the server shuts down.
/// How long a client waits before it reconnects to a stream that broke (the `retry:` field).
const RECONNECT_AFTER: Duration = Duration::from_millis(1000);

pub fn sse_response(stream: EventStream, shutdown: CancellationToken) -> Response {
    let frames = stream
        .into_stream()
        .take_while(|item| {
            if let Err(error) = item {
                tracing::warn!(%error, "event stream ended by a storage error");
            }
            std::future::ready(item.is_ok())
        })
        .filter_map(|item| std::future::ready(item.ok().map(|e| Ok::<_, Infallible>(frame(&e)))));
    // Once per stream: browsers would otherwise wait 3 s before they reconnect.
    let retry = SseEvent::default().retry(RECONNECT_AFTER);
    let subscriber = crate::metrics::SseSubscriber::open();
    let frames = futures::stream::once(std::future::ready(Ok(retry)))
        .chain(frames)
        .take_until(shutdown.cancelled_owned())
        // Counted as open until the stream is dropped.
        .map(move |frame| {
            let _ = &subscriber;
            frame
        });
    let mut response = Sse::new(frames)
        .keep_alive(KeepAlive::new().interval(HEARTBEAT).text("heartbeat"))
        .into_response();
    // Tell reverse proxies not to buffer the stream.
    response
        .headers_mut()
        .insert("x-accel-buffering", header::HeaderValue::from_static("no"));
    response
}
