//! How a real provider client is configured: where to call, with which key and model, how long
//! to wait at each stage of a call, and how often (and after how long) to retry.

use std::time::Duration;

use rand::Rng;

use super::HttpPool;
use crate::llm::guard::{self, ReplyLimits};

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

/// What a real provider client needs: where to call, with which key, headers and model, how
/// patiently, and through which connection pool.
#[derive(Clone)]
pub struct HttpModelConfig {
    pub base_url: String,
    /// `None` for local servers that need no key; never logged or put into an error.
    pub api_key: Option<String>,
    pub model: String,
    /// The reply's token limit, sent with every request.
    pub max_tokens: u32,
    /// Anthropic extended thinking: the tokens the model may think with before it answers
    /// (`None`: no thinking asked for). The other providers ignore it.
    pub thinking_budget: Option<u32>,
    pub timeouts: Timeouts,
    pub retry: RetryPolicy,
    pub limits: ReplyLimits,
    /// Sent with every request besides the dialect's own (a gateway's organisation or route,
    /// say): they may replace the dialect's headers but not `Content-Type`. Their values are
    /// treated as secrets: never logged, shown or put into an error.
    pub headers: Vec<(String, String)>,
    /// The connection pool requests go through (`None`: a pool of the client's own). The
    /// clients of one provider share one, so its models reuse its connections; the pool's
    /// connect timeout is the one it was made with.
    pub pool: Option<HttpPool>,
}

/// Shows where a configuration calls and what it carries, never a key, a header's value or
/// the credentials of a base URL.
impl std::fmt::Debug for HttpModelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let base_url = reqwest::Url::parse(self.base_url.trim())
            .map(|url| guard::shown_url(&url))
            .unwrap_or_else(|_| "<not a URL>".to_string());
        let headers: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("HttpModelConfig")
            .field("base_url", &base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("max_tokens", &self.max_tokens)
            .field("thinking_budget", &self.thinking_budget)
            .field("timeouts", &self.timeouts)
            .field("retry", &self.retry)
            .field("limits", &self.limits)
            .field("headers", &headers)
            .field("pool", &self.pool.is_some())
            .finish()
    }
}

impl HttpModelConfig {
    /// A configuration with default timeouts, retries, a `max_tokens` of 8192 and no thinking.
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
            thinking_budget: None,
            timeouts: Timeouts::default(),
            retry: RetryPolicy::default(),
            limits: ReplyLimits::default(),
            headers: Vec::new(),
            pool: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn debug_output_shows_no_secret() {
        let mut config = HttpModelConfig::new(
            "https://bob:pa55word@llm.example/v1",
            Some("sk-secret-key".to_string()),
            "m",
        );
        config.headers = vec![("x-org".to_string(), "org-secret-value".to_string())];
        let shown = format!("{config:?}");
        for secret in ["sk-secret-key", "org-secret-value", "pa55word", "bob"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(
            shown.contains("x-org") && shown.contains("llm.example"),
            "{shown}"
        );
    }
}
