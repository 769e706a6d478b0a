//! One model call as a stream: the response body under its first-byte and idle timeouts and
//! size limits, decoded as SSE, read by the dialect's parser, and retried from scratch (a
//! `Retry` item first) when an attempt fails in a way another attempt may help.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use eventsource_stream::{EventStream, EventStreamError};
use futures::future::Either;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use tokio::time::Instant;

use super::config::Timeouts;
use super::reply::EventParser;
use super::status::{first_byte_timeout, secs, transport_failure};
use super::transport::Transport;
use super::Failure;
use crate::llm::guard::{BodyMeter, ReplyLimits};
use crate::llm::{LlmError, LlmErrorKind, ModelStream, Purpose, StreamItem};

/// An error of the timed body stream.
#[derive(Debug)]
pub(super) enum BodyError {
    FirstByte(Duration),
    Idle(Duration),
    Transport(reqwest::Error),
    /// The body broke one of the [`ReplyLimits`].
    TooLarge(String),
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyError::FirstByte(d) => write!(f, "first-byte timeout after {}", secs(*d)),
            BodyError::Idle(d) => write!(f, "idle timeout after {}", secs(*d)),
            BodyError::Transport(e) => write!(f, "{e}"),
            BodyError::TooLarge(why) => f.write_str(why),
        }
    }
}

pub(super) type Events = EventStream<BoxStream<'static, Result<Bytes, BodyError>>>;

/// The response body as a stream of chunks: the first must arrive before `deadline`, each later
/// one within `idle` of the previous, and the whole stays within `limits`. It ends after the
/// first error. Owning the response, it closes the connection when dropped. Each chunk is
/// handed on cut into its [`lines`].
pub(super) fn timed_body(
    response: reqwest::Response,
    deadline: Instant,
    idle: Duration,
    limits: ReplyLimits,
) -> BoxStream<'static, Result<Bytes, BodyError>> {
    let first_byte = deadline.saturating_duration_since(Instant::now());
    let state = (Some(response), true, BodyMeter::default());
    let body = futures::stream::unfold(state, move |(response, first, mut meter)| {
        let limits = limits.clone();
        async move {
            let mut response = response?;
            let read = if first {
                tokio::time::timeout_at(deadline, response.chunk()).await
            } else {
                tokio::time::timeout(idle, response.chunk()).await
            };
            let end = |error| Some((Err(error), (None, false, BodyMeter::default())));
            match read {
                Err(_) if first => end(BodyError::FirstByte(first_byte)),
                Err(_) => end(BodyError::Idle(idle)),
                Ok(Err(e)) => end(BodyError::Transport(e)),
                Ok(Ok(None)) => None,
                Ok(Ok(Some(chunk))) => match meter.add(&chunk, &limits) {
                    Ok(()) => Some((Ok(chunk), (Some(response), false, meter))),
                    Err(why) => end(BodyError::TooLarge(why)),
                },
            }
        }
    });
    cut_into_lines(body).boxed()
}

/// A body's chunks, each cut into its [`lines`]; an error passes as it is.
pub fn cut_into_lines<E>(
    body: impl Stream<Item = Result<Bytes, E>>,
) -> impl Stream<Item = Result<Bytes, E>> {
    body.flat_map(|read| match read {
        Ok(chunk) => Either::Left(futures::stream::iter(lines(chunk).map(Ok))),
        Err(error) => Either::Right(futures::stream::iter([Err(error)])),
    })
}

/// A chunk of the body cut after each line feed, sharing its bytes. The SSE decoder keeps what
/// it has not parsed yet in a buffer and copies the rest of that buffer after each line it
/// parses: fed a whole chunk of many events (a fast reply arrives in a few reads), it copied
/// the chunk again at every line, quadratic in the chunk's size; fed line by line, its buffer
/// holds one line.
fn lines(mut rest: Bytes) -> impl Iterator<Item = Bytes> {
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let end = memchr::memchr(b'\n', &rest).map_or(rest.len(), |i| i + 1);
        Some(rest.split_to(end))
    })
}

fn sse_failure(e: EventStreamError<BodyError>, timeouts: &Timeouts) -> Failure {
    match e {
        EventStreamError::Transport(BodyError::FirstByte(_)) => {
            first_byte_timeout(timeouts.first_byte)
        }
        EventStreamError::Transport(BodyError::Idle(d)) => Failure::retryable(
            LlmErrorKind::Timeout,
            format!("the stream stalled for {} (idle timeout)", secs(d)),
        ),
        EventStreamError::Transport(BodyError::TooLarge(why)) => Failure::protocol(why),
        EventStreamError::Transport(BodyError::Transport(e)) => {
            let mut failure = transport_failure(&e);
            failure.message = format!("the stream broke: {}", failure.message);
            failure
        }
        EventStreamError::Utf8(e) => {
            Failure::protocol(format!("the event stream is not valid UTF-8: {e}"))
        }
        EventStreamError::Parser(e) => {
            Failure::protocol(format!("the event stream is malformed: {e}"))
        }
    }
}

enum State<P> {
    /// Send the request, after waiting `delay` (a retry's backoff).
    Connect {
        delay: Option<Duration>,
    },
    /// Read events of the current attempt.
    Reading {
        events: Events,
        parser: P,
    },
    Finished,
}

/// One model call across its attempts; the state behind the returned stream.
pub(super) struct Call<P> {
    transport: Arc<Transport>,
    /// When the whole call must be over, set when it is first polled.
    deadline: Option<Instant>,
    /// Named in the log of a retry.
    purpose: Purpose,
    body: Bytes,
    new_parser: fn() -> P,
    retries: u32,
    state: State<P>,
    queue: VecDeque<Result<StreamItem, LlmError>>,
}

impl<P: EventParser> Call<P> {
    /// A call that POSTs `body` and reads each attempt with a fresh parser from `new_parser`.
    pub(super) fn new(
        transport: Arc<Transport>,
        purpose: Purpose,
        body: Bytes,
        new_parser: fn() -> P,
    ) -> Call<P> {
        Call {
            transport,
            deadline: None,
            purpose,
            body,
            new_parser,
            retries: 0,
            state: State::Connect { delay: None },
            queue: VecDeque::new(),
        }
    }

    /// The call as the stream its client returns; nothing happens until it is polled.
    pub(super) fn into_stream(self) -> ModelStream {
        futures::stream::unfold(self, |mut call| async move {
            let item = call.next().await?;
            Some((item, call))
        })
        .boxed()
    }

    /// The next item, within the call's overall deadline.
    async fn next(&mut self) -> Option<Result<StreamItem, LlmError>> {
        let Some(total) = self.transport.timeouts.total else {
            return self.advance().await;
        };
        let deadline = *self.deadline.get_or_insert_with(|| Instant::now() + total);
        match tokio::time::timeout_at(deadline, self.advance()).await {
            Ok(item) => item,
            Err(_) => {
                // The attempt in flight was dropped with the future: its connection is closed.
                self.state = State::Finished;
                self.queue.clear();
                Some(Err(LlmError::new(
                    self.transport.provider,
                    LlmErrorKind::Timeout,
                    format!(
                        "the model call did not finish within {} (--llm-deadline-s)",
                        secs(total)
                    ),
                )))
            }
        }
    }

    async fn advance(&mut self) -> Option<Result<StreamItem, LlmError>> {
        loop {
            if let Some(item) = self.queue.pop_front() {
                return Some(item);
            }
            match std::mem::replace(&mut self.state, State::Finished) {
                State::Finished => return None,
                State::Connect { delay } => {
                    if let Some(delay) = delay.filter(|d| !d.is_zero()) {
                        tokio::time::sleep(delay).await;
                    }
                    let transport = Arc::clone(&self.transport);
                    match transport.connect(self.body.clone()).await {
                        Ok(events) => {
                            self.state = State::Reading {
                                events,
                                parser: (self.new_parser)(),
                            }
                        }
                        Err(failure) => self.fail(failure),
                    }
                }
                State::Reading {
                    mut events,
                    mut parser,
                } => {
                    let outcome = match events.next().await {
                        Some(Ok(event)) => {
                            let mut pieces = Vec::new();
                            match parser.event(&event, &mut pieces) {
                                Ok(done) => Ok((pieces, done)),
                                Err(failure) => Err(failure),
                            }
                        }
                        Some(Err(e)) => Err(sse_failure(e, &self.transport.timeouts)),
                        None => parser.end().map(|reply| (Vec::new(), Some(reply))),
                    };
                    match outcome {
                        Ok((pieces, done)) => {
                            self.queue.extend(
                                pieces
                                    .into_iter()
                                    .filter(|p| !p.is_empty())
                                    .map(|p| Ok(p.into_item())),
                            );
                            match done {
                                Some(reply) => match self.transport.limits.check(&reply) {
                                    Ok(()) => self.queue.push_back(Ok(StreamItem::Done(reply))),
                                    Err(why) => self.fail(Failure::protocol(why)),
                                },
                                None => self.state = State::Reading { events, parser },
                            }
                        }
                        Err(failure) => {
                            drop(events);
                            self.fail(failure);
                        }
                    }
                }
            }
        }
    }

    /// Schedules a retry (announced by a `Retry` item) or ends the call with an error.
    fn fail(&mut self, failure: Failure) {
        let transport = &self.transport;
        if failure.retryable && self.retries < transport.retry.max_retries {
            self.retries += 1;
            let delay = transport.retry.delay(self.retries, failure.retry_after);
            tracing::warn!(
                provider = transport.provider,
                purpose = self.purpose.as_str(),
                attempt = self.retries,
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                error = %transport.secrets.scrub(&failure.message),
                "model call failed; retrying"
            );
            self.queue.push_back(Ok(StreamItem::Retry {
                attempt: self.retries,
                error: transport.secrets.scrub(&failure.short),
            }));
            self.state = State::Connect { delay: Some(delay) };
            return;
        }
        let mut message = failure.message;
        if failure.retryable && self.retries > 0 {
            message.push_str(&format!(" (after {} retries)", self.retries));
        }
        let message = transport.secrets.scrub(&message);
        self.queue.push_back(Err(LlmError::new(
            transport.provider,
            failure.kind,
            message,
        )));
        self.state = State::Finished;
    }
}

#[cfg(test)]
mod tests {
    use eventsource_stream::Eventsource;

    use super::*;

    /// An event's type and data.
    type Decoded = Vec<(String, String)>;

    /// Decodes `chunks` as one body, each chunk fed whole or cut into its lines first.
    async fn decode(chunks: &[&[u8]], cut: bool) -> Decoded {
        let chunks: Vec<Result<Bytes, BodyError>> = chunks
            .iter()
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let body = futures::stream::iter(chunks);
        let body = if cut {
            cut_into_lines(body).boxed()
        } else {
            body.boxed()
        };
        body.eventsource()
            .map(|e| e.map(|e| (e.event, e.data)).expect("a well-formed stream"))
            .collect()
            .await
    }

    #[test]
    fn a_chunk_is_cut_after_each_line_feed_and_loses_nothing() {
        let cut: Vec<Bytes> =
            lines(Bytes::from_static(b"data: a\n\ndata: b\r\n\r\npart")).collect();
        assert_eq!(
            cut,
            ["data: a\n", "\n", "data: b\r\n", "\r\n", "part"].map(Bytes::from)
        );
        assert_eq!(lines(Bytes::new()).count(), 0);
    }

    #[tokio::test]
    async fn lines_decode_to_the_same_events_as_whole_chunks() {
        let event = |event: &str, data: &str| (event.to_string(), data.to_string());
        let bodies: [(&[&[u8]], Decoded); 3] = [
            // Many events in one read, as a fast reply arrives.
            (
                &[b"data: {\"a\":1}\n\ndata: 2\n\nevent: ping\ndata: x\ndata: y\n\ndata: [DONE]\n\n"],
                vec![
                    event("message", "{\"a\":1}"),
                    event("message", "2"),
                    event("ping", "x\ny"),
                    event("message", "[DONE]"),
                ],
            ),
            // Events and lines split across reads, in the middle of a line and of a character.
            (
                &[
                    b"data: {\"a\":",
                    b"1}\n",
                    b"\nevent: pi",
                    b"ng\ndata: \xc3",
                    b"\xa9t\xc3\xa9\n\n: comment\n\n",
                ],
                vec![event("message", "{\"a\":1}"), event("ping", "\u{e9}t\u{e9}")],
            ),
            // CRLF line ends, one of them split between two reads.
            (
                &[b"data: one\r", b"\n\r\ndata: two\r\n\r\n"],
                vec![event("message", "one"), event("message", "two")],
            ),
        ];
        for (body, events) in bodies {
            assert_eq!(decode(body, false).await, events, "{body:?} whole");
            assert_eq!(decode(body, true).await, events, "{body:?} cut into lines");
        }
    }
}
