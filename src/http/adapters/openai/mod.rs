//! OpenAI's face, under `/openai/v1`, so that `openai` (node, Python) works with its base URL
//! set there: the Responses API ([`responses`]) over tah's sessions and runs. Its pure
//! mapping from the log is [`crate::protocols::openai`]; errors take OpenAI's shape
//! ([`super::errors`]).

pub mod agents;
pub mod responses;

use std::convert::Infallible;

use axum::http::{header, HeaderValue};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::http::events::HEARTBEAT;
use crate::http::AppState;
use crate::protocols::openai::Frame;

pub fn routes() -> Router<AppState> {
    responses::routes().merge(agents::routes())
}

/// The SSE response of a stream of `response.*` events: `event:` the type, `id:` the
/// sequence number, `data:` the event's JSON; heartbeats as comments.
pub fn sse(
    stream: impl Stream<Item = Frame> + Send + 'static,
    shutdown: CancellationToken,
) -> Response {
    let frames = stream
        .map(|frame| {
            Ok::<_, Infallible>(
                SseEvent::default()
                    .event(frame.kind)
                    .id(frame.sequence_number.to_string())
                    .data(frame.data.to_string()),
            )
        })
        .take_until(shutdown.cancelled_owned());
    let mut response = Sse::new(frames)
        .keep_alive(KeepAlive::new().interval(HEARTBEAT).text("heartbeat"))
        .into_response();
    let headers = response.headers_mut();
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
