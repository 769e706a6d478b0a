//! The HTTP plumbing shared by the real providers: configuration (timeouts, retry policy),
//! one pooled `reqwest::Client` per provider client, retries with exponential backoff and full
//! jitter (honouring `Retry-After`), first-byte and idle timeouts, SSE decoding and the mapping
//! of HTTP statuses and transport failures to [`LlmError`]s.
//!
//! It lives apart from `openai.rs` and `anthropic.rs` so that both dialects get exactly the same
//! robustness rules: a provider only says how to build its request body and how to read its
//! events (an [`EventParser`]); the [`Transport`] turns that into a [`ModelStream`] that owns the
//! HTTP response, so dropping the stream drops the connection.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use eventsource_stream::{Event, EventStream, EventStreamError, Eventsource};
use futures::stream::BoxStream;
use futures::StreamExt;
use rand::Rng;
use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use serde_json::Value;
use tokio::time::Instant;

use super::guard::{self, BodyMeter, ReplyLimits, Secrets};
use super::{LlmError, LlmErrorKind, ModelReply, ModelStream, Purpose, StreamItem};

/// How long to wait at each stage of a call.
#[derive(Debug, Clone)]
pub struct Timeouts {
    /// Establishing the TCP/TLS connection.
    pub connect: Duration,
    /// From sending the request until the response headers and the first body chunk arrived.
    pub first_byte: Duration,
    /// Between two body chunks once the stream is flowing.
    pub idle: Duration,
    /// The whole call, retries included (`None`: no limit but the others).
    pub total: Option<Duration>,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            connect: Duration::from_secs(10),
            first_byte: Duration::from_secs(120),
            idle: Duration::from_secs(120),
            total: Some(Duration::from_secs(300)),
        }
    }
}

/// Retries of 429s, 5xx, connection errors, timeouts and broken streams.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    /// Retries after the first attempt (so at most `max_retries + 1` requests).
    pub max_retries: u32,
    /// The backoff cap of the first retry; it doubles with each retry.
    pub base_delay: Duration,
    /// The largest delay, also the cap on a provider's `Retry-After`.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_retries: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The delay before retry number `attempt` (1-based): `Retry-After` when the provider sent
    /// one (capped at `max_delay`), otherwise exponential backoff with full jitter.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(after) = retry_after {
            return after.min(self.max_delay);
        }
        let factor = 1u32
            .checked_shl(attempt.saturating_sub(1))
            .unwrap_or(u32::MAX);
        let cap = self
            .base_delay
            .checked_mul(factor)
            .unwrap_or(self.max_delay)
            .min(self.max_delay);
        let cap_ms = u64::try_from(cap.as_millis()).unwrap_or(u64::MAX);
        if cap_ms == 0 {
            return Duration::ZERO;
        }
        Duration::from_millis(rand::thread_rng().gen_range(0..=cap_ms))
    }
}

/// What a real provider client needs: where to call, with which key and model, and how
/// patiently.
#[derive(Debug, Clone)]
pub struct HttpModelConfig {
    pub base_url: String,
    /// `None` for local servers that need no key; never logged or put into an error.
    pub api_key: Option<String>,
    pub model: String,
    /// The reply's token limit, sent with every request.
    pub max_tokens: u32,
    pub timeouts: Timeouts,
    pub retry: RetryPolicy,
    pub limits: ReplyLimits,
}

impl HttpModelConfig {
    /// A configuration with default timeouts, retries and a `max_tokens` of 8192.
    pub fn new(
        base_url: impl Into<String>,
        api_key: Option<String>,
        model: impl Into<String>,
    ) -> HttpModelConfig {
        HttpModelConfig {
            base_url: base_url.into(),
            api_key,
            model: model.into(),
            max_tokens: 8192,
            timeouts: Timeouts::default(),
            retry: RetryPolicy::default(),
            limits: ReplyLimits::default(),
        }
    }
}

/// Why one attempt failed, and whether another attempt may help.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    /// The error kind if this ends the call.
    pub kind: LlmErrorKind,
    /// The full message for the final error.
    pub message: String,
    /// A short text for the `Retry` item (`HTTP 429 Too Many Requests`).
    pub short: String,
    pub retryable: bool,
    pub retry_after: Option<Duration>,
}

impl Failure {
    /// A failure that ends the call at once.
    pub fn fatal(kind: LlmErrorKind, message: impl Into<String>) -> Failure {
        let message = message.into();
        Failure {
            kind,
            short: message.clone(),
            message,
            retryable: false,
            retry_after: None,
        }
    }

    /// A failure worth retrying; `kind` is used when the retries run out.
    pub fn retryable(kind: LlmErrorKind, message: impl Into<String>) -> Failure {
        Failure {
            retryable: true,
            ..Failure::fatal(kind, message)
        }
    }

    /// Malformed data from the provider: never retried.
    pub fn protocol(message: impl Into<String>) -> Failure {
        Failure::fatal(LlmErrorKind::Protocol, message)
    }

    /// The body ended before the reply was complete.
    pub fn broken_stream() -> Failure {
        Failure::retryable(
            LlmErrorKind::Connection,
            "the stream ended before the reply was complete",
        )
    }
}

/// Reads one provider's SSE events into a reply. A fresh parser is made for every attempt.
pub(crate) trait EventParser: Send + 'static {
    /// Handles one event. Text to stream goes into `deltas`; returns the reply once the
    /// provider marked it complete.
    fn event(
        &mut self,
        event: &Event,
        deltas: &mut Vec<String>,
    ) -> Result<Option<ModelReply>, Failure>;

    /// The body ended without an end marker: the reply if what arrived is complete, otherwise
    /// a (retryable) broken-stream failure.
    fn end(&mut self) -> Result<ModelReply, Failure>;
}

/// Parses an event's JSON payload, or fails with a protocol error naming the bad chunk. Lone
/// surrogate escapes (half of a character the provider split across chunks) are kept as
/// stand-ins for [`guard::Utf16Joiner`].
pub(crate) fn parse_json(data: &str) -> Result<Value, Failure> {
    serde_json::from_str(&guard::escape_lone_surrogates(data)).map_err(|e| {
        Failure::protocol(format!(
            "malformed JSON in stream chunk ({e}): {}",
            truncate(data, 200)
        ))
    })
}

/// Parses assembled tool-call arguments; text that is not JSON is kept raw as a string.
pub(crate) fn parse_arguments(raw: &str) -> Value {
    let raw = guard::join_halves(raw);
    if raw.trim().is_empty() {
        return Value::Object(Default::default());
    }
    serde_json::from_str(&raw).unwrap_or(Value::String(raw))
}

/// The first `max` characters of `text`, with an ellipsis when cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// The human-readable message inside a provider's error body (`{"error": {"message": …}}` and
/// the like), or the trimmed body itself.
pub(crate) fn error_message(body: &str) -> String {
    let from_json = serde_json::from_str::<Value>(body).ok().and_then(|v| {
        let err = v.get("error").unwrap_or(&v);
        err.get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| err.as_str().map(str::to_string))
            .or_else(|| v.get("message").and_then(Value::as_str).map(str::to_string))
            .or_else(|| v.get("detail").and_then(Value::as_str).map(str::to_string))
    });
    from_json.unwrap_or_else(|| body.trim().to_string())
}

/// The largest error body read from a failed response.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// One provider endpoint with its pooled client, headers, timeouts and retry policy.
pub(crate) struct Transport {
    provider: &'static str,
    http: reqwest::Client,
    url: Url,
    /// The URL as errors may show it (no credentials).
    shown_url: String,
    headers: HeaderMap,
    timeouts: Timeouts,
    retry: RetryPolicy,
    limits: ReplyLimits,
    /// What is scrubbed from anything a provider sends back or an error names.
    secrets: Secrets,
}

impl Transport {
    /// Builds the client for `{base_url}{path}`. `headers` are sent with every request (mark
    /// the key's header sensitive).
    pub fn new(
        provider: &'static str,
        config: &HttpModelConfig,
        path: &str,
        mut headers: HeaderMap,
    ) -> Result<Transport, LlmError> {
        let secrets = Secrets::new(config.api_key.as_deref(), &config.base_url);
        let invalid = |message: String| {
            LlmError::new(provider, LlmErrorKind::Rejected, secrets.scrub(&message))
        };
        let base = config.base_url.trim().trim_end_matches('/');
        let url = Url::parse(&format!("{base}{path}"))
            .map_err(|e| invalid(format!("invalid base URL {:?}: {e}", config.base_url)))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid(format!(
                "invalid base URL {:?}: the scheme must be http or https",
                config.base_url
            )));
        }
        if config.model.trim().is_empty() {
            return Err(invalid("no model configured".to_string()));
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let http = reqwest::Client::builder()
            .connect_timeout(config.timeouts.connect)
            .user_agent(concat!("tah/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| {
                LlmError::new(
                    provider,
                    LlmErrorKind::Connection,
                    format!("cannot build the HTTP client: {e}"),
                )
            })?;
        Ok(Transport {
            provider,
            http,
            shown_url: guard::shown_url(&url),
            url,
            headers,
            timeouts: config.timeouts.clone(),
            retry: config.retry.clone(),
            limits: config.limits.clone(),
            secrets,
        })
    }

    /// Starts a call that POSTs `body` (retrying it as the policy allows) and reads the reply
    /// with parsers made by `parser`. Nothing happens until the stream is polled.
    pub fn stream<P: EventParser>(
        self: &Arc<Self>,
        body: &Value,
        purpose: Purpose,
        parser: fn() -> P,
    ) -> ModelStream {
        let body = match serde_json::to_vec(body) {
            Ok(bytes) => Bytes::from(bytes),
            Err(e) => {
                let err = LlmError::new(
                    self.provider,
                    LlmErrorKind::Protocol,
                    format!("cannot encode the request: {e}"),
                );
                return futures::stream::once(async move { Err(err) }).boxed();
            }
        };
        let call = Call {
            transport: Arc::clone(self),
            deadline: None,
            purpose,
            body,
            new_parser: parser,
            retries: 0,
            state: State::Connect { delay: None },
            queue: VecDeque::new(),
        };
        futures::stream::unfold(call, |mut call| async move {
            let item = call.next().await?;
            Some((item, call))
        })
        .boxed()
    }

    /// Sends the request once and returns its event stream, or why that failed.
    async fn connect(&self, body: Bytes) -> Result<Events, Failure> {
        let deadline = Instant::now() + self.timeouts.first_byte;
        let request = self
            .http
            .post(self.url.clone())
            .headers(self.headers.clone())
            .body(body);
        let response = match tokio::time::timeout_at(deadline, request.send()).await {
            Err(_) => return Err(first_byte_timeout(self.timeouts.first_byte)),
            Ok(Err(e)) => return Err(transport_failure(&e)),
            Ok(Ok(response)) => response,
        };
        let status = response.status();
        if !status.is_success() {
            return Err(self.status_failure(response).await);
        }
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_ascii_lowercase())
            .unwrap_or_default();
        if content_type.starts_with("text/html") {
            return Err(Failure::protocol(format!(
                "expected an event stream from {}, got an HTML page — check --base-url",
                self.shown_url
            )));
        }
        if content_type.starts_with("application/json") {
            let text = self.read_error_body(response).await;
            return Err(Failure::protocol(format!(
                "expected an event stream, got JSON: {}",
                truncate(&text, 500)
            )));
        }
        Ok(timed_body(response, deadline, self.timeouts.idle, self.limits.clone()).eventsource())
    }

    /// Maps a non-success response to a failure, reading the provider's message.
    async fn status_failure(&self, response: reqwest::Response) -> Failure {
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let detail = self.read_error_body(response).await;
        let detail = truncate(&error_message(&detail), 500);
        let with_detail = |text: String| {
            if detail.is_empty() {
                text
            } else {
                format!("{text}: {detail}")
            }
        };
        let code = status.as_u16();
        let short = status_text(status);
        let mut failure = match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Failure::fatal(
                LlmErrorKind::Auth,
                with_detail(format!("authentication failed (HTTP {code})")),
            ),
            StatusCode::NOT_FOUND => Failure::fatal(
                LlmErrorKind::NotFound,
                with_detail(format!(
                    "{} not found (HTTP 404) — check --base-url and --model",
                    self.shown_url
                )),
            ),
            StatusCode::TOO_MANY_REQUESTS => {
                Failure::retryable(LlmErrorKind::RateLimited, with_detail(short.clone()))
            }
            s if s.is_server_error() => {
                Failure::retryable(LlmErrorKind::Server, with_detail(short.clone()))
            }
            s if s.is_client_error() => Failure::fatal(
                LlmErrorKind::Rejected,
                with_detail(format!("request rejected ({short})")),
            ),
            _ => Failure::fatal(
                LlmErrorKind::Protocol,
                with_detail(format!("unexpected response ({short})")),
            ),
        };
        if failure.retryable {
            failure.short = short;
            failure.retry_after = retry_after;
        }
        failure
    }

    /// Reads (a bounded prefix of) a failed response's body, scrubbing the key from it.
    async fn read_error_body(&self, mut response: reqwest::Response) -> String {
        let mut bytes = Vec::new();
        while bytes.len() < MAX_ERROR_BODY {
            match tokio::time::timeout(self.timeouts.idle, response.chunk()).await {
                Ok(Ok(Some(chunk))) => bytes.extend_from_slice(&chunk),
                _ => break,
            }
        }
        let text = String::from_utf8_lossy(&bytes);
        self.secrets.scrub(&text)
    }
}

fn status_text(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("HTTP {} {reason}", status.as_u16()),
        None if status.as_u16() == 529 => "HTTP 529 Overloaded".to_string(),
        None => format!("HTTP {}", status.as_u16()),
    }
}

/// `Retry-After` (delta-seconds or HTTP-date) or OpenAI's `retry-after-ms`.
pub(crate) fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    if let Some(ms) = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    parse_retry_after(headers.get(RETRY_AFTER)?.to_str().ok()?)
}

/// Parses a `Retry-After` value: delta-seconds, or an HTTP-date (a past date means now).
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    if let Ok(secs) = value.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Some(Duration::from_secs_f64(secs));
        }
    }
    let date = chrono::DateTime::parse_from_rfc2822(value).ok()?;
    let wait = date.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(wait.to_std().unwrap_or(Duration::ZERO))
}

fn first_byte_timeout(after: Duration) -> Failure {
    Failure::retryable(
        LlmErrorKind::Timeout,
        format!("no response within {} (first-byte timeout)", secs(after)),
    )
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Maps a reqwest error (connect, send or body) to a retryable failure.
fn transport_failure(e: &reqwest::Error) -> Failure {
    let mut message = e.to_string();
    let mut innermost = message.clone();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        innermost = text;
        source = cause.source();
    }
    let (kind, label) = if e.is_timeout() {
        (LlmErrorKind::Timeout, "timeout")
    } else {
        (LlmErrorKind::Connection, "connection error")
    };
    let mut failure = Failure::retryable(kind, message);
    failure.short = format!("{label}: {innermost}");
    failure
}

/// An error of the timed body stream.
#[derive(Debug)]
enum BodyError {
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

type Events = EventStream<BoxStream<'static, Result<Bytes, BodyError>>>;

/// The response body as a stream of chunks: the first must arrive before `deadline`, each later
/// one within `idle` of the previous, and the whole stays within `limits`. It ends after the
/// first error. Owning the response, it closes the connection when dropped.
fn timed_body(
    response: reqwest::Response,
    deadline: Instant,
    idle: Duration,
    limits: ReplyLimits,
) -> BoxStream<'static, Result<Bytes, BodyError>> {
    let first_byte = deadline.saturating_duration_since(Instant::now());
    let state = (Some(response), true, BodyMeter::default());
    futures::stream::unfold(state, move |(response, first, mut meter)| {
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
    })
    .boxed()
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
struct Call<P> {
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
                            let mut deltas = Vec::new();
                            match parser.event(&event, &mut deltas) {
                                Ok(done) => Ok((deltas, done)),
                                Err(failure) => Err(failure),
                            }
                        }
                        Some(Err(e)) => Err(sse_failure(e, &self.transport.timeouts)),
                        None => parser.end().map(|reply| (Vec::new(), Some(reply))),
                    };
                    match outcome {
                        Ok((deltas, done)) => {
                            self.queue.extend(
                                deltas
                                    .into_iter()
                                    .filter(|d| !d.is_empty())
                                    .map(|d| Ok(StreamItem::Delta(d))),
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
    use super::*;

    #[test]
    fn retry_after_accepts_seconds_and_dates() {
        assert_eq!(parse_retry_after("0"), Some(Duration::ZERO));
        assert_eq!(parse_retry_after(" 7 "), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"),
            Some(Duration::ZERO)
        );
        let future = (chrono::Utc::now() + chrono::Duration::seconds(100))
            .format("%a, %d %b %Y %H:%M:%S GMT")
            .to_string();
        let wait = parse_retry_after(&future).unwrap();
        assert!(wait > Duration::from_secs(90) && wait <= Duration::from_secs(100));
        assert_eq!(parse_retry_after("soon"), None);
    }

    #[test]
    fn backoff_is_capped_and_honours_retry_after() {
        let policy = RetryPolicy {
            max_retries: 10,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        };
        for attempt in 1..40 {
            let cap =
                Duration::from_millis(100 * (1u64 << (attempt - 1).min(20))).min(policy.max_delay);
            assert!(policy.delay(attempt, None) <= cap);
        }
        assert_eq!(
            policy.delay(1, Some(Duration::from_secs(60))),
            Duration::from_secs(1)
        );
        assert_eq!(policy.delay(3, Some(Duration::ZERO)), Duration::ZERO);
    }

    #[test]
    fn error_messages_are_extracted_and_truncated() {
        assert_eq!(
            error_message(r#"{"error":{"message":"bad key","type":"x"}}"#),
            "bad key"
        );
        assert_eq!(
            error_message(
                r#"{"type":"error","error":{"type":"not_found_error","message":"model: x"}}"#
            ),
            "model: x"
        );
        assert_eq!(error_message(" plain text \n"), "plain text");
        assert_eq!(truncate("héllo", 2), "hé…");
        assert_eq!(truncate("hé", 2), "hé");
    }

    #[test]
    fn arguments_keep_invalid_json_raw() {
        assert_eq!(parse_arguments(r#"{"a":1}"#), serde_json::json!({"a": 1}));
        assert_eq!(parse_arguments(""), serde_json::json!({}));
        assert_eq!(parse_arguments("{oops"), Value::String("{oops".into()));
    }
}
