//! The SSE body of an event stream, made cheap to hold and to fan out:
//!
//! - every event's frame is encoded once and shared by all its subscribers
//!   ([`Event::sse_frame`](crate::model::Event::sse_frame));
//! - the frames that are ready when a stream is polled go out as one chunk (one write);
//! - heartbeats come from one process-wide tick, not a timer per stream: an idle stream costs
//!   no timer and no CPU between two ticks.
//!
//! On the wire: `id:`, `event:` and `data:` per event, the first event also carrying the
//! stream's `retry:` field, and `: heartbeat` comments on a stream with nothing else to send.
//! The retry field rides with an event rather than in a frame of its own: a frame with no
//! data is dispatched by some clients (httpx-sse) as an empty message.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue};
use axum::response::Response;
use bytes::BytesMut;
use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::session::{EventStream, OnWake};

/// The server's shutdown, as a stream of one item.
type Shutdown = futures::stream::Once<Pin<Box<WaitForCancellationFutureOwned>>>;

/// How often the heartbeat tick beats. A stream sends a heartbeat on a tick when it sent
/// nothing since the tick before, so it is never silent for two ticks (10 s; the contract:
/// ≤ 15 s), and an idle stream beats every other tick.
const TICK: Duration = Duration::from_secs(5);
/// What a client waits before it reconnects to a stream that broke (browsers would otherwise
/// wait 3 s); sent once per stream, as the first line of its first event.
const RETRY: &[u8] = b"retry: 1000\n";
const HEARTBEAT: &[u8] = b": heartbeat\n\n";
/// Ready frames joined into one chunk at most (bytes); more wait for the next write.
const MAX_CHUNK: usize = 64 * 1024;

/// The heartbeat tick every stream of the process watches: a thread bumps it every [`TICK`]
/// (a thread, so that it outlives any one runtime, as in tests that start many servers).
fn ticks() -> watch::Receiver<u64> {
    static TICKS: OnceLock<watch::Sender<u64>> = OnceLock::new();
    TICKS
        .get_or_init(|| {
            let spawned = std::thread::Builder::new()
                .name("sse-heartbeat".into())
                .spawn(|| loop {
                    std::thread::sleep(TICK);
                    if let Some(ticks) = TICKS.get() {
                        ticks.send_modify(|n| *n = n.wrapping_add(1));
                    }
                });
            if let Err(error) = spawned {
                tracing::error!(%error, "cannot start the SSE heartbeat thread");
            }
            watch::channel(0).0
        })
        .subscribe()
}

/// One subscriber's source of frames.
struct Feed {
    events: EventStream,
    /// The heartbeat ticks, as a stream: its wait stays registered across frames, instead of
    /// being made and dropped for every event. The tick and the shutdown are shared by every
    /// stream of the process, so they are polled only when they woke (see [`OnWake`]).
    ticks: OnWake<WatchStream<u64>>,
    ticking: bool,
    shutdown: OnWake<Shutdown>,
    /// Something was sent since the last tick.
    sent: bool,
    /// The retry field is still to be sent (with the next event).
    retry_pending: bool,
    /// Counted as open until the stream is dropped.
    _open: crate::metrics::SseSubscriber,
}

impl Feed {
    /// The next frame: an event, or a heartbeat; `None` when the stream is over or the server
    /// shuts down.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            // Each branch is cancel-safe: a tick that wins over a pending read of the store
            // or the live channel loses nothing (the stream reads again from `last_sent`).
            // Events first: a stream with events ready does not touch the other two.
            tokio::select! {
                biased;
                item = self.events.next() => {
                    self.sent = true;
                    return match item? {
                        Ok(event) if std::mem::take(&mut self.retry_pending) => {
                            Some(with_retry(&event.sse_frame()))
                        }
                        Ok(event) => Some(event.sse_frame()),
                        Err(error) => {
                            tracing::warn!(%error, "event stream ended by a storage error");
                            None
                        }
                    };
                }
                _ = self.shutdown.next() => return None,
                ticked = self.ticks.next(), if self.ticking => {
                    if ticked.is_none() {
                        // The tick never stops (its sender is static); if it did, no more
                        // heartbeats, but events still flow.
                        self.ticking = false;
                        continue;
                    }
                    if !std::mem::replace(&mut self.sent, false) {
                        // The heartbeat counts as sent: an idle stream beats every other tick.
                        self.sent = true;
                        return Some(Bytes::from_static(HEARTBEAT));
                    }
                }
            }
        }
    }
}

/// `frame` preceded by the stream's retry field, in the same frame.
fn with_retry(frame: &[u8]) -> Bytes {
    let mut joined = BytesMut::with_capacity(RETRY.len() + frame.len());
    joined.extend_from_slice(RETRY);
    joined.extend_from_slice(frame);
    joined.freeze()
}

/// Joins the frames that are ready into one chunk.
struct Coalesce<S> {
    frames: Pin<Box<S>>,
    done: bool,
}

impl<S: Stream<Item = Bytes>> Stream for Coalesce<S> {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        let Some(first) = ready!(self.frames.as_mut().poll_next(cx)) else {
            self.done = true;
            return Poll::Ready(None);
        };
        let mut joined: Option<BytesMut> = None;
        while joined.as_ref().map_or(first.len(), BytesMut::len) < MAX_CHUNK {
            match self.frames.as_mut().poll_next(cx) {
                Poll::Ready(Some(next)) => {
                    let chunk = joined.get_or_insert_with(|| {
                        let mut chunk = BytesMut::with_capacity(2 * (first.len() + next.len()));
                        chunk.extend_from_slice(&first);
                        chunk
                    });
                    chunk.extend_from_slice(&next);
                }
                Poll::Ready(None) => {
                    self.done = true;
                    break;
                }
                Poll::Pending => break,
            }
        }
        Poll::Ready(Some(Ok(joined.map_or(first, BytesMut::freeze))))
    }
}

/// Streams the session's events as SSE until the stream ends or the server shuts down.
pub fn response(events: EventStream, shutdown: CancellationToken) -> Response {
    let feed = Feed {
        events,
        ticks: OnWake::new(WatchStream::from_changes(ticks())),
        ticking: true,
        shutdown: OnWake::new(futures::stream::once(Box::pin(shutdown.cancelled_owned()))),
        sent: false,
        retry_pending: true,
        _open: crate::metrics::SseSubscriber::open(),
    };
    let frames = futures::stream::unfold(feed, |mut feed| async move {
        feed.next().await.map(|frame| (frame, feed))
    });
    let body = Body::from_stream(Coalesce {
        frames: Box::pin(frames),
        done: false,
    });
    event_stream(body)
}

/// A `text/event-stream` response with `body`, not cached, and not buffered by reverse proxies.
pub fn event_stream(body: Body) -> Response {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Tell reverse proxies not to buffer the stream.
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ready_frames_are_joined_and_the_end_is_kept() {
        let frames =
            futures::stream::iter(["a", "bb", "ccc"].map(|s| Bytes::from_static(s.as_bytes())));
        let mut joined = Coalesce {
            frames: Box::pin(frames),
            done: false,
        };
        let first = joined.next().await.map(|c| c.map(|b| b.to_vec()));
        assert_eq!(first, Some(Ok(b"abbccc".to_vec())));
        assert!(joined.next().await.is_none());
        assert!(joined.next().await.is_none(), "polled again after its end");
    }
}
