//! The faces: the front-end protocols over the same sessions, each parsing its own input
//! into a run request and shaping the session's events into its own frames (`ai_sdk`: the
//! Vercel AI SDK's UI message stream; `ag_ui`: AG-UI). This module is what they share:
//! streaming a run's events through a protocol adapter as SSE `data:` lines until the run
//! ends or waits for answers only; and each face's error shape (`errors`).

pub mod a2a;
pub mod ag_ui;
pub mod ai_sdk;
pub mod anthropic;
pub mod errors;
pub mod mcp;
pub mod openai;

use std::convert::Infallible;

use axum::http::{header, HeaderValue};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::http::events::HEARTBEAT;
use crate::model::Event;
use crate::protocols;
use crate::protocols::calls::RunCalls;
use crate::session::{EventStream, SessionError, Sessions};

/// Events read per query.
const PAGE: i64 = 500;

/// The query of a route that takes none: any parameter is a `400`, as everywhere.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoQuery {}

/// One protocol's adapter, as the stream driver sees it.
pub trait Frames: Send + 'static {
    /// The frames of one event, whether the run is now parked, and whether it ended.
    fn push(&mut self, event: &Event) -> (Vec<Value>, bool, bool);
    fn calls(&self) -> &RunCalls;
    /// The frames that end a stream where the run waits for answers.
    fn finish_parked(&mut self) -> Vec<Value>;
}

impl Frames for protocols::ai_sdk::UiMessageStream {
    fn push(&mut self, event: &Event) -> (Vec<Value>, bool, bool) {
        let pushed = protocols::ai_sdk::UiMessageStream::push(self, event);
        (pushed.chunks, pushed.parked, pushed.ended)
    }
    fn calls(&self) -> &RunCalls {
        protocols::ai_sdk::UiMessageStream::calls(self)
    }
    fn finish_parked(&mut self) -> Vec<Value> {
        protocols::ai_sdk::UiMessageStream::finish_parked(self)
    }
}

impl Frames for protocols::ag_ui::AgUiRun {
    fn push(&mut self, event: &Event) -> (Vec<Value>, bool, bool) {
        let pushed = protocols::ag_ui::AgUiRun::push(self, event);
        (pushed.events, pushed.parked, pushed.ended)
    }
    fn calls(&self) -> &RunCalls {
        protocols::ag_ui::AgUiRun::calls(self)
    }
    fn finish_parked(&mut self) -> Vec<Value> {
        protocols::ag_ui::AgUiRun::finish_parked(self)
    }
}

/// A run streamed through an adapter: `opening` first, then the frames of the run's events,
/// then `closing` (the AI SDK's `[DONE]`) once the run ended, or parked with nothing after
/// it in the log.
pub struct Driven<A> {
    pub opening: Vec<Value>,
    pub events: EventStream,
    pub adapter: A,
    pub sessions: Sessions,
    pub session_id: Uuid,
    pub closing: Option<&'static str>,
}

enum Phase<A> {
    Streaming(Box<Driven<A>>),
    Done,
}

impl<A: Frames> Driven<A> {
    /// The SSE `data:` texts of the stream.
    pub fn into_stream(self) -> impl Stream<Item = String> + Send {
        let opening: Vec<String> = self.opening.iter().map(Value::to_string).collect();
        let rest = futures::stream::unfold(Phase::Streaming(Box::new(self)), |phase| async move {
            let Phase::Streaming(mut driven) = phase else {
                return None;
            };
            let (frames, end) = driven.next_frames().await;
            let mut texts: Vec<String> = frames.iter().map(Value::to_string).collect();
            if end {
                texts.extend(driven.closing.map(str::to_string));
                return Some((texts, Phase::Done));
            }
            Some((texts, Phase::Streaming(driven)))
        });
        futures::stream::iter(opening).chain(rest.flat_map(futures::stream::iter))
    }

    /// The frames of the next event; true when the stream ends after them.
    async fn next_frames(&mut self) -> (Vec<Value>, bool) {
        let event = match self.events.next().await {
            Some(Ok(event)) => event,
            Some(Err(error)) => {
                tracing::warn!(%error, "a front-end stream ended by a storage error");
                return (Vec::new(), true);
            }
            // The session is gone.
            None => return (Vec::new(), true),
        };
        let (mut frames, parked, ended) = self.adapter.push(&event);
        if ended {
            return (frames, true);
        }
        if parked {
            let probe = self.adapter.calls().clone();
            match still_parked(&self.sessions, self.session_id, event.seq, probe).await {
                Ok(true) => {
                    frames.extend(self.adapter.finish_parked());
                    return (frames, true);
                }
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(%error, "a front-end stream ended by a storage error");
                    return (frames, true);
                }
            }
        }
        (frames, false)
    }
}

/// Whether the run still waits after `seq`: nothing committed since has moved it on (a replay
/// of a run that waited and went on does not stop there).
async fn still_parked(
    sessions: &Sessions,
    session_id: Uuid,
    seq: i64,
    mut probe: RunCalls,
) -> Result<bool, SessionError> {
    let later = sessions.events_page(session_id, seq, PAGE).await?;
    for event in &later {
        probe.apply(event);
    }
    Ok(probe.is_parked())
}

/// The SSE response of a front-end stream: `data:` lines only, heartbeats as comments.
pub fn sse_response(
    stream: impl Stream<Item = String> + Send + 'static,
    shutdown: CancellationToken,
    headers: &[(&'static str, &'static str)],
) -> Response {
    let frames = stream
        .map(|data| Ok::<_, Infallible>(SseEvent::default().data(data)))
        .take_until(shutdown.cancelled_owned());
    let mut response = Sse::new(frames)
        .keep_alive(KeepAlive::new().interval(HEARTBEAT).text("heartbeat"))
        .into_response();
    let all = headers.iter().chain([&("x-accel-buffering", "no")]);
    for (name, value) in all {
        response
            .headers_mut()
            .insert(*name, HeaderValue::from_static(value));
    }
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
