//! What a failed attempt means: an HTTP status, a `Retry-After` header or a transport error
//! mapped to a [`Failure`] that says whether another attempt may help.

use std::time::Duration;

use reqwest::header::{HeaderMap, RETRY_AFTER};
use reqwest::StatusCode;

use super::reply::{error_message, truncate};
use super::Failure;
use crate::llm::LlmErrorKind;

/// Maps a non-success status to a failure. `detail` is the body of the response (the key
/// already scrubbed from it), `shown_url` the endpoint as errors may show it.
pub(super) fn status_failure(
    status: StatusCode,
    retry_after: Option<Duration>,
    detail: &str,
    shown_url: &str,
) -> Failure {
    let detail = truncate(&error_message(detail), 500);
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
                shown_url
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

pub(super) fn first_byte_timeout(after: Duration) -> Failure {
    Failure::retryable(
        LlmErrorKind::Timeout,
        format!("no response within {} (first-byte timeout)", secs(after)),
    )
}

pub(super) fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Maps a reqwest error (connect, send or body) to a retryable failure.
pub(super) fn transport_failure(e: &reqwest::Error) -> Failure {
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
}
