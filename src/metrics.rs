//! The server's Prometheus metrics: one process-wide registry, counted where things happen
//! (runs end in the session actor, LLM requests and tool calls in the agent loop, commits in
//! the writer, SSE streams in the HTTP layer) and rendered by `GET /metrics`.
//!
//! Counting is a few atomic adds per event: no locks on the hot path beyond the label
//! families' read lock, and nothing is allocated for a metric without labels.

use std::sync::atomic::AtomicU64;
use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

type Labels = Vec<(&'static str, String)>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// Every metric the server keeps.
pub struct Metrics {
    registry: Registry,
    runs: Family<Labels, Counter>,
    run_duration: Histogram,
    llm_requests: Family<Labels, Counter>,
    llm_duration: HistogramFamily,
    llm_first_token: HistogramFamily,
    tokens: Family<Labels, Counter>,
    tool_calls: Family<Labels, Counter>,
    tool_duration: HistogramFamily,
    approvals_pending: Gauge<i64, std::sync::atomic::AtomicI64>,
    live_sessions: Gauge<i64, std::sync::atomic::AtomicI64>,
    sse_subscribers: Gauge<i64, std::sync::atomic::AtomicI64>,
    commit_duration: Histogram,
    commit_batch: Histogram,
    commits: Counter<u64, AtomicU64>,
}

/// Seconds, from a millisecond to about half an hour.
fn seconds_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 22))
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("tah");
        let runs = Family::<Labels, Counter>::default();
        registry.register(
            "runs",
            "Runs ended, by status (completed, failed, cancelled)",
            runs.clone(),
        );
        let run_duration = seconds_buckets();
        registry.register_with_unit(
            "run_duration",
            "How long runs took, from start to end",
            Unit::Seconds,
            run_duration.clone(),
        );
        let llm_requests = Family::<Labels, Counter>::default();
        registry.register(
            "llm_requests",
            "LLM requests, by provider and outcome (ok, error, cancelled)",
            llm_requests.clone(),
        );
        let llm_duration = HistogramFamily::new_with_constructor(seconds_buckets);
        registry.register_with_unit(
            "llm_request_duration",
            "How long LLM requests took, retries included, by provider",
            Unit::Seconds,
            llm_duration.clone(),
        );
        let llm_first_token = HistogramFamily::new_with_constructor(seconds_buckets);
        registry.register_with_unit(
            "llm_time_to_first_token",
            "Time from an LLM request to its first streamed piece, by provider",
            Unit::Seconds,
            llm_first_token.clone(),
        );
        let tokens = Family::<Labels, Counter>::default();
        registry.register(
            "llm_tokens",
            "Tokens used, by provider and direction (input, output)",
            tokens.clone(),
        );
        let tool_calls = Family::<Labels, Counter>::default();
        registry.register(
            "tool_calls",
            "Tool calls executed, by tool and outcome (ok, error)",
            tool_calls.clone(),
        );
        let tool_duration = HistogramFamily::new_with_constructor(seconds_buckets);
        registry.register_with_unit(
            "tool_duration",
            "How long tool calls took, by tool",
            Unit::Seconds,
            tool_duration.clone(),
        );
        let approvals_pending = Gauge::default();
        registry.register(
            "approvals_pending",
            "Tool calls waiting for a human's approval (asked in this process)",
            approvals_pending.clone(),
        );
        let live_sessions = Gauge::default();
        registry.register(
            "live_sessions",
            "Sessions held in memory by this process",
            live_sessions.clone(),
        );
        let sse_subscribers = Gauge::default();
        registry.register(
            "sse_subscribers",
            "Open SSE event streams",
            sse_subscribers.clone(),
        );
        let commit_duration = seconds_buckets();
        registry.register_with_unit(
            "store_commit_duration",
            "How long the store took to commit a batch",
            Unit::Seconds,
            commit_duration.clone(),
        );
        let commit_batch = Histogram::new(exponential_buckets(1.0, 2.0, 12));
        registry.register(
            "store_commit_batch_size",
            "Sessions' commits grouped in one store transaction",
            commit_batch.clone(),
        );
        let commits = Counter::default();
        registry.register("store_commits", "Store transactions", commits.clone());
        Metrics {
            registry,
            runs,
            run_duration,
            llm_requests,
            llm_duration,
            llm_first_token,
            tokens,
            tool_calls,
            tool_duration,
            approvals_pending,
            live_sessions,
            sse_subscribers,
            commit_duration,
            commit_batch,
            commits,
        }
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

fn metrics() -> &'static Metrics {
    &METRICS
}

/// A run of `agent` (its name) ended with `status` after `took`.
pub fn run_ended(status: &str, agent: &str, took: Duration) {
    let m = metrics();
    m.runs
        .get_or_create(&vec![
            ("status", status.to_string()),
            ("agent", agent.to_string()),
        ])
        .inc();
    m.run_duration.observe(took.as_secs_f64());
}

/// An LLM request of `agent` ended (`outcome`: ok, error, cancelled).
pub fn llm_request(provider: &str, agent: &str, outcome: &str, took: Duration) {
    let m = metrics();
    m.llm_requests
        .get_or_create(&vec![
            ("provider", provider.to_string()),
            ("outcome", outcome.to_string()),
            ("agent", agent.to_string()),
        ])
        .inc();
    m.llm_duration
        .get_or_create(&vec![("provider", provider.to_string())])
        .observe(took.as_secs_f64());
}

/// The first piece of an LLM reply arrived `after` the request.
pub fn llm_first_token(provider: &str, after: Duration) {
    metrics()
        .llm_first_token
        .get_or_create(&vec![("provider", provider.to_string())])
        .observe(after.as_secs_f64());
}

/// Tokens an LLM reply of `agent` reported.
pub fn llm_tokens(provider: &str, agent: &str, input: u64, output: u64) {
    let m = metrics();
    for (direction, n) in [("input", input), ("output", output)] {
        m.tokens
            .get_or_create(&vec![
                ("provider", provider.to_string()),
                ("direction", direction.to_string()),
                ("agent", agent.to_string()),
            ])
            .inc_by(n);
    }
}

/// Times one LLM request: its first piece and its end.
pub struct LlmRequestTimer {
    provider: String,
    agent: String,
    started: std::time::Instant,
    first_seen: bool,
}

impl LlmRequestTimer {
    pub fn start(provider: &str, agent: &str) -> LlmRequestTimer {
        LlmRequestTimer {
            provider: provider.to_string(),
            agent: agent.to_string(),
            started: std::time::Instant::now(),
            first_seen: false,
        }
    }

    /// A piece of the reply (text or reasoning) arrived.
    pub fn piece(&mut self) {
        if !self.first_seen {
            self.first_seen = true;
            llm_first_token(&self.provider, self.started.elapsed());
        }
    }

    /// The request ended (`ok`, `error`, `cancelled`); a reply's usage counts its tokens.
    pub fn finish(self, outcome: &str, usage: Option<crate::model::Usage>) {
        llm_request(&self.provider, &self.agent, outcome, self.started.elapsed());
        if let Some(usage) = usage {
            llm_tokens(
                &self.provider,
                &self.agent,
                usage.input_tokens,
                usage.output_tokens,
            );
        }
    }
}

/// A tool call ran.
pub fn tool_call(tool: &str, is_error: bool, took: Duration) {
    let m = metrics();
    let outcome = if is_error { "error" } else { "ok" };
    m.tool_calls
        .get_or_create(&vec![
            ("tool", tool.to_string()),
            ("outcome", outcome.to_string()),
        ])
        .inc();
    m.tool_duration
        .get_or_create(&vec![("tool", tool.to_string())])
        .observe(took.as_secs_f64());
}

/// An approval was asked for (`+1`) or resolved (`-1`).
pub fn approvals_pending(delta: i64) {
    metrics().approvals_pending.inc_by(delta);
}

/// The store committed `groups` sessions' commits in one transaction.
pub fn store_commit(groups: usize, took: Duration) {
    let m = metrics();
    m.commits.inc();
    m.commit_batch.observe(groups as f64);
    m.commit_duration.observe(took.as_secs_f64());
}

/// Counts an open SSE stream while it lives.
pub struct SseSubscriber(());

impl SseSubscriber {
    pub fn open() -> SseSubscriber {
        metrics().sse_subscribers.inc();
        SseSubscriber(())
    }
}

impl Drop for SseSubscriber {
    fn drop(&mut self) {
        metrics().sse_subscribers.dec();
    }
}

/// The metrics in the text exposition format, with `live_sessions` as of now.
pub fn render(live_sessions: usize) -> String {
    let m = metrics();
    m.live_sessions
        .set(i64::try_from(live_sessions).unwrap_or(i64::MAX));
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = encode(&mut out, &m.registry);
    out
}

/// The content type of [`render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_follow_prometheus_conventions() {
        run_ended("completed", "default", Duration::from_millis(5));
        tool_call("read_file", false, Duration::from_millis(1));
        let text = render(3);
        for name in [
            "tah_runs_total{status=\"completed\",agent=\"default\"}",
            "tah_run_duration_seconds_count",
            "tah_tool_calls_total{tool=\"read_file\",outcome=\"ok\"}",
            "tah_tool_duration_seconds_bucket",
            "tah_live_sessions 3",
            "# EOF",
        ] {
            assert!(text.contains(name), "{name} in\n{text}");
        }
    }
}
