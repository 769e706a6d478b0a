//! The HTTP plumbing shared by the real providers: configuration (timeouts, retry policy,
//! headers), one pooled `reqwest::Client` per provider ([`HttpPool`]), retries with
//! exponential backoff and full jitter (honouring `Retry-After`), first-byte and idle
//! timeouts, SSE decoding and the mapping of HTTP statuses and transport failures to
//! [`LlmError`](crate::llm::LlmError)s.
//!
//! It lives apart from `openai.rs` and `anthropic.rs` so that both dialects get exactly the same
//! robustness rules: a provider only says how to build its request body and how to read its
//! events (an [`EventParser`]); the [`Transport`] turns that into a
//! [`ModelStream`](crate::llm::ModelStream) that owns the HTTP response, so dropping the stream
//! drops the connection.
//!
//! - `config`: [`HttpModelConfig`], [`Timeouts`] and the [`RetryPolicy`] (backoff with full
//!   jitter, capped, `Retry-After` first).
//! - `transport`: the `Transport` of one endpoint: client, headers, the first answer of an
//!   attempt; the [`HttpPool`] the clients of one provider share.
//! - `sse`: the call across its attempts: timed body, SSE decoding, retries.
//! - `status`: what a failed attempt means (status, `Retry-After`, transport error).
//! - `reply`: the `EventParser` a dialect implements, the `ReplyDraft` both assemble a
//!   reply in (text, thinking, usage), and the helpers both parse with.

mod config;
mod reply;
mod sse;
mod status;
mod transport;

use std::time::Duration;

use crate::llm::LlmErrorKind;

pub use config::{HttpModelConfig, RetryPolicy, Timeouts};
pub(crate) use reply::{
    error_message, parse_arguments, parse_json, truncate, EventParser, Piece, ReplyDraft,
};
pub use sse::cut_into_lines;
pub use status::parse_retry_after;
pub use transport::HttpPool;
pub(crate) use transport::{key_header, Transport};

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
