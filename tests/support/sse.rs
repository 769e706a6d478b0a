//! One SSE client, on `eventsource-stream` (the parser the load generator uses too). Every
//! frame is checked against its data as it arrives — `id:` is the event's seq, `event:` its
//! type, `data:` JSON — so no test can forget to; a frame that fails is [`Next::Bad`].
//! [`Subscriber`] records a stream in the background with the instant each event arrived.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use reqwest::header::{HeaderMap, ACCEPT, CONTENT_TYPE};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::support::checks::{describe, is_terminal};
use crate::support::client::Api;

/// How long a test waits for the next SSE frame before it calls the stream stuck.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(10);

/// Where an SSE subscription starts.
#[derive(Debug, Clone, Copy)]
pub enum SseFrom {
    /// No cursor: the whole log, then live.
    Start,
    /// `?after=k`.
    After(i64),
    /// The `Last-Event-ID: k` header, as a reconnecting EventSource sends it.
    LastEventId(i64),
}

/// One SSE frame: `id:`, `event:` and the event JSON from `data:`.
#[derive(Debug, Clone, PartialEq)]
pub struct SseFrame {
    pub id: String,
    pub event: String,
    pub data: Value,
}

impl SseFrame {
    pub fn seq(&self) -> i64 {
        self.data["seq"]
            .as_i64()
            .unwrap_or_else(|| panic!("frame data has no seq: {:?}", self))
    }
}

/// What reading the next frame produced.
#[derive(Debug)]
pub enum Next {
    Frame(SseFrame),
    /// A frame arrived that is not an event of the log: data that is not JSON, or an `id:` or
    /// `event:` line that disagrees with the data. The stream goes on.
    Bad(String),
    /// The response body ended cleanly.
    End,
    /// The stream broke (transport or parse error).
    Error(String),
    Timeout,
}

type FrameStream = Pin<
    Box<
        dyn Stream<Item = Result<eventsource_stream::Event, EventStreamError<reqwest::Error>>>
            + Send,
    >,
>;

/// An open SSE response.
pub struct SseStream {
    pub status: StatusCode,
    pub headers: HeaderMap,
    what: String,
    inner: FrameStream,
}

impl SseStream {
    /// Wraps a response that must be `200 text/event-stream`.
    pub async fn from_response(
        response: reqwest::Response,
        what: &str,
    ) -> Result<SseStream, String> {
        let status = response.status();
        let headers = response.headers().clone();
        let content_type = headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        if status != StatusCode::OK || !content_type.starts_with("text/event-stream") {
            let body = response.text().await.unwrap_or_default();
            return Err(format!(
                "{what}: expected 200 text/event-stream, got {status} {content_type:?}: {body}"
            ));
        }
        Ok(SseStream {
            status,
            headers,
            what: what.to_string(),
            inner: Box::pin(response.bytes_stream().eventsource()),
        })
    }

    pub async fn next_within(&mut self, timeout: Duration) -> Next {
        match tokio::time::timeout(timeout, self.inner.next()).await {
            Err(_) => Next::Timeout,
            Ok(None) => Next::End,
            Ok(Some(Err(e))) => Next::Error(format!("{}: {e}", self.what)),
            Ok(Some(Ok(event))) => {
                let data: Value = match serde_json::from_str(&event.data) {
                    Ok(data) => data,
                    Err(e) => {
                        return Next::Bad(format!(
                            "{}: frame data is not JSON ({e}): {event:?}",
                            self.what
                        ))
                    }
                };
                let seq = data["seq"].as_i64().map(|s| s.to_string());
                if seq.as_deref() != Some(event.id.as_str())
                    || data["type"].as_str() != Some(event.event.as_str())
                {
                    return Next::Bad(format!(
                        "{}: frame id {:?} / event {:?} do not match its data {data}",
                        self.what, event.id, event.event
                    ));
                }
                Next::Frame(SseFrame {
                    id: event.id,
                    event: event.event,
                    data,
                })
            }
        }
    }

    /// The next frame; panics on a bad frame, the end, an error or a timeout.
    pub async fn next_frame(&mut self) -> SseFrame {
        match self.next_within(FRAME_TIMEOUT).await {
            Next::Frame(frame) => frame,
            other => panic!("{}: expected a frame, got {other:?}", self.what),
        }
    }

    /// Reads frames up to and including the first one that matches.
    pub async fn until(&mut self, mut done: impl FnMut(&SseFrame) -> bool) -> Vec<SseFrame> {
        let mut frames = Vec::new();
        loop {
            let frame = self.next_frame().await;
            let stop = done(&frame);
            frames.push(frame);
            if stop {
                return frames;
            }
        }
    }

    /// Reads frames up to and including the first of this type.
    pub async fn until_type(&mut self, kind: &str) -> Vec<SseFrame> {
        self.until(|f| f.event == kind).await
    }

    /// Reads exactly `n` frames.
    pub async fn take(&mut self, n: usize) -> Vec<SseFrame> {
        let mut frames = Vec::with_capacity(n);
        for _ in 0..n {
            frames.push(self.next_frame().await);
        }
        frames
    }
}

impl Api {
    /// Subscribes to a session's events over SSE; `Err` when the server does not answer
    /// `200 text/event-stream` (or at all).
    pub async fn open_events(&self, id: &str, from: SseFrom) -> Result<SseStream, String> {
        let mut path = format!("/v1/sessions/{id}/events");
        if let SseFrom::After(k) = from {
            path.push_str(&format!("?after={k}"));
        }
        // No time limit: a stream lasts as long as the test reads it.
        let mut request = self.authorized(self.http.get(self.url(&path)));
        if let SseFrom::LastEventId(k) = from {
            request = request.header("Last-Event-ID", k.to_string());
        }
        let what = format!("{} GET {path} (SSE, {from:?})", self.name);
        let response = request
            .header(ACCEPT, "text/event-stream")
            .send()
            .await
            .map_err(|e| format!("{what}: {e:#}"))?;
        SseStream::from_response(response, &what).await
    }

    /// Subscribes to a session's events over SSE; panics if that fails.
    pub async fn sse(&self, id: &str, from: SseFrom) -> SseStream {
        self.open_events(id, from)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A new session with a run of `input` under way, and a stream of its log opened before the
    /// run started (so it sees every event): `(session id, run id, stream)`.
    pub async fn watched_run(&self, input: &str) -> (String, String, SseStream) {
        let id = self.create_session().await;
        let sse = self.sse(&id, SseFrom::Start).await;
        let run = self.start_run(&id, input).await;
        (id, crate::support::checks::id_of(&run), sse)
    }

    /// `POST /runs` with `Accept: text/event-stream`: the run's events as SSE.
    pub async fn run_streaming(&self, id: &str, input: &str) -> SseStream {
        let path = format!("/v1/sessions/{id}/runs");
        let response = self
            .http
            .post(self.url(&path))
            .header(ACCEPT, "text/event-stream")
            .json(&json!({ "input": input }))
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path} (SSE) failed: {e}"));
        SseStream::from_response(response, &path)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }
}

/// One event as a subscriber received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub event: Value,
    pub at: Instant,
}

impl Seen {
    pub fn kind(&self) -> &str {
        self.event["type"].as_str().unwrap_or("")
    }

    pub fn seq(&self) -> i64 {
        self.event["seq"].as_i64().unwrap_or(-1)
    }
}

#[derive(Default)]
struct Record {
    seen: Vec<Seen>,
    /// Frames that were not events of the log (see [`Next::Bad`]).
    bad_frames: Vec<String>,
    /// Why the stream ended, if it did.
    ended: Option<String>,
}

/// An SSE subscriber to a session's events from the start of the log, recording every event
/// with the instant it arrived, until dropped.
pub struct Subscriber {
    pub label: String,
    record: Arc<Mutex<Record>>,
    changed: watch::Receiver<usize>,
    task: JoinHandle<()>,
}

impl Subscriber {
    /// Connects; returns once the server has answered (it is subscribed by then).
    pub async fn open(api: &Api, id: &str, label: &str) -> Subscriber {
        let mut stream = api
            .open_events(id, SseFrom::Start)
            .await
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        let record: Arc<Mutex<Record>> = Arc::default();
        let (tx, changed) = watch::channel(0usize);
        let task = {
            let record = record.clone();
            tokio::spawn(async move {
                loop {
                    let next = stream.next_within(Duration::from_secs(3600)).await;
                    let at = Instant::now();
                    let mut r = record.lock().unwrap_or_else(|e| e.into_inner());
                    match next {
                        Next::Frame(frame) => r.seen.push(Seen {
                            event: frame.data,
                            at,
                        }),
                        Next::Bad(why) => r.bad_frames.push(why),
                        Next::End => r.ended = Some("the server ended the stream".to_string()),
                        Next::Error(e) => r.ended = Some(format!("the stream broke: {e}")),
                        Next::Timeout => r.ended = Some("no frame for an hour".to_string()),
                    }
                    let n = r.seen.len();
                    let over = r.ended.is_some();
                    drop(r);
                    let _ = tx.send(n);
                    if over {
                        return;
                    }
                }
            })
        };
        Subscriber {
            label: label.to_string(),
            record,
            changed,
            task,
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .seen
            .clone()
    }

    pub fn events(&self) -> Vec<Value> {
        self.seen().into_iter().map(|s| s.event).collect()
    }

    /// Frames that were malformed or disagreed with their data.
    pub fn bad_frames(&self) -> Vec<String> {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .bad_frames
            .clone()
    }

    /// Waits until what was received satisfies `done`; panics after `limit` (or when the
    /// stream ends first) with what was received.
    pub async fn wait_for(
        &mut self,
        what: &str,
        limit: Duration,
        done: impl Fn(&[Seen]) -> bool,
    ) -> Vec<Seen> {
        match self.try_wait_for(limit, done).await {
            Ok(seen) => seen,
            Err((problem, seen)) => panic!(
                "{}: {problem} \"{what}\"; received {} events:\n{}",
                self.label,
                seen.len(),
                describe(&seen.into_iter().map(|s| s.event).collect::<Vec<_>>())
            ),
        }
    }

    /// Waits until what was received satisfies `done`: `Err` with why and what was received
    /// after `limit`, or when the stream ended first.
    pub async fn try_wait_for(
        &mut self,
        limit: Duration,
        done: impl Fn(&[Seen]) -> bool,
    ) -> Result<Vec<Seen>, (String, Vec<Seen>)> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let (seen, ended) = {
                let r = self.record.lock().unwrap_or_else(|e| e.into_inner());
                if done(&r.seen) {
                    return Ok(r.seen.clone());
                }
                (r.seen.clone(), r.ended.clone())
            };
            match ended {
                Some(why) => return Err((format!("{why} before"), seen)),
                None if tokio::time::Instant::now() >= deadline => {
                    return Err((format!("nothing satisfied within {limit:?}:"), seen))
                }
                None => {}
            }
            let _ = tokio::time::timeout_at(deadline, self.changed.changed()).await;
        }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// True once `seen` holds a terminal event (`agent.finished|failed|cancelled`) of any run, or
/// of `run_id` when given.
pub fn has_terminal(seen: &[Seen], run_id: Option<&str>) -> bool {
    seen.iter().any(|s| {
        is_terminal(&s.event)
            && run_id.is_none_or(|r| s.event["data"]["run_id"].as_str() == Some(r))
    })
}

/// How many token deltas (`agent.assistant-stream`) `seen` holds.
pub fn deltas(seen: &[Seen]) -> usize {
    seen.iter()
        .filter(|s| s.kind() == "agent.assistant-stream")
        .count()
}
