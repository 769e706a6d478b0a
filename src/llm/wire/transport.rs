//! One provider endpoint: the pooled HTTP client, the request with its headers, and what the
//! first answer of an attempt means (an event stream, or a failure read from its status and
//! body). Reading the stream across attempts is [`super::sse`]'s.

use std::sync::Arc;

use bytes::Bytes;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use reqwest::Url;
use tokio::time::Instant;

use super::config::{HttpModelConfig, RetryPolicy, Timeouts};
use super::reply::{truncate, EventParser};
use super::sse::{timed_body, Call, Events};
use super::status::{first_byte_timeout, retry_after, status_failure, transport_failure};
use super::Failure;
use crate::llm::guard::{self, ReplyLimits, Secrets};
use crate::llm::{LlmError, LlmErrorKind, ModelStream, Purpose};

/// The largest error body read from a failed response.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// A connection pool: one HTTP client with its connections, cheap to clone. The clients made
/// for one provider's models share one, so a provider keeps its own pool apart from the
/// others'.
#[derive(Debug, Clone)]
pub struct HttpPool {
    http: reqwest::Client,
}

impl HttpPool {
    /// A pool whose connections are made within `timeouts.connect`.
    pub fn new(provider: &str, timeouts: &Timeouts) -> Result<HttpPool, LlmError> {
        let http = reqwest::Client::builder()
            .connect_timeout(timeouts.connect)
            .user_agent(concat!("tah/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| {
                LlmError::new(
                    provider,
                    LlmErrorKind::Connection,
                    format!("cannot build the HTTP client: {e}"),
                )
            })?;
        Ok(HttpPool { http })
    }
}

/// One provider endpoint with its pooled client, headers, timeouts and retry policy.
pub(crate) struct Transport {
    pub(super) provider: &'static str,
    http: reqwest::Client,
    url: Url,
    /// The URL as errors may show it (no credentials).
    shown_url: String,
    headers: HeaderMap,
    pub(super) timeouts: Timeouts,
    pub(super) retry: RetryPolicy,
    pub(super) limits: ReplyLimits,
    /// What is scrubbed from anything a provider sends back or an error names.
    pub(super) secrets: Secrets,
}

impl Transport {
    /// Builds the client for `{base_url}{path}`. `headers` (the dialect's: mark the key's
    /// header sensitive) and then the configuration's are sent with every request.
    pub fn new(
        provider: &'static str,
        config: &HttpModelConfig,
        path: &str,
        mut headers: HeaderMap,
    ) -> Result<Transport, LlmError> {
        let secrets = Secrets::new(config.api_key.as_deref(), &config.base_url)
            .and_header_values(config.headers.iter().map(|(_, value)| value.as_str()));
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
        for (name, value) in &config.headers {
            let (name, value) = configured_header(name, value).map_err(invalid)?;
            headers.insert(name, value);
        }
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let pool = match &config.pool {
            Some(pool) => pool.clone(),
            None => HttpPool::new(provider, &config.timeouts)?,
        };
        Ok(Transport {
            provider,
            http: pool.http,
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
    pub fn stream<P: EventParser, B: serde::Serialize + ?Sized>(
        self: &Arc<Self>,
        body: &B,
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
        Call::new(Arc::clone(self), purpose, body, parser).into_stream()
    }

    /// Sends the request once and returns its event stream, or why that failed.
    pub(super) async fn connect(&self, body: Bytes) -> Result<Events, Failure> {
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
        status_failure(status, retry_after, &detail, &self.shown_url)
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

/// A configured header, its value marked sensitive so that it is never logged; an error names
/// the header, never its value.
fn configured_header(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), String> {
    let name = HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| format!("{name:?} is not a valid HTTP header name"))?;
    let mut value = HeaderValue::from_str(value)
        .map_err(|_| format!("the value of the header {name} is not a valid HTTP header value"))?;
    value.set_sensitive(true);
    Ok((name, value))
}

/// A header that carries the API key: marked sensitive so that it is never logged, and refused
/// (without showing the key) when the key has characters a header cannot carry.
pub(crate) fn key_header(provider: &'static str, value: &str) -> Result<HeaderValue, LlmError> {
    let mut value = HeaderValue::from_str(value).map_err(|_| {
        LlmError::new(
            provider,
            LlmErrorKind::Auth,
            "the API key contains characters not allowed in an HTTP header",
        )
    })?;
    value.set_sensitive(true);
    Ok(value)
}
