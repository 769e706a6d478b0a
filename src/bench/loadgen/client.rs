//! The load generator's HTTP client: one connection pool for every session and subscriber,
//! an optional bearer token, and a tally of every failed request (with the first few messages
//! for the report).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::bail;
use reqwest::header::{ACCEPT, AUTHORIZATION};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use super::sse::SseStream;
use super::TURN_TIMEOUT;

/// Error messages kept for the report.
const ERROR_SAMPLES: usize = 10;

/// Errors of any request, counted, with the first few messages.
#[derive(Default)]
pub struct Errors {
    count: AtomicU64,
    samples: Mutex<Vec<String>>,
}

impl Errors {
    pub fn record(&self, what: impl std::fmt::Display) {
        self.count.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut samples) = self.samples.lock() {
            if samples.len() < ERROR_SAMPLES {
                samples.push(what.to_string());
            }
        }
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn samples(&self) -> Vec<String> {
        self.samples.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

pub struct Client {
    http: reqwest::Client,
    base: String,
    /// Where SSE subscribers connect, when not to `base` (another replica).
    events_base: Option<String>,
    token: Option<String>,
    pub errors: Errors,
}

#[derive(Deserialize)]
struct Created {
    id: String,
}

#[derive(Deserialize)]
struct SessionView {
    last_seq: i64,
}

#[derive(Deserialize)]
struct RunOutcome {
    status: String,
    #[serde(default)]
    error: Option<Value>,
}

impl Client {
    pub fn new(base: &str, token: Option<String>, connections: usize) -> anyhow::Result<Client> {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(connections.max(8))
            .tcp_nodelay(true)
            .no_proxy()
            .connect_timeout(Duration::from_secs(10))
            .build()?;
        Ok(Client {
            http,
            base: base.to_string(),
            events_base: None,
            token,
            errors: Errors::default(),
        })
    }

    /// SSE subscribers connect to `base` instead (e.g. another replica of the same database).
    pub fn events_via(mut self, base: Option<String>) -> Client {
        self.events_base = base.map(|b| b.trim_end_matches('/').to_string());
        self
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.request_to(&self.base, method, path)
    }

    fn request_to(&self, base: &str, method: Method, path: &str) -> RequestBuilder {
        let request = self.http.request(method, format!("{base}{path}"));
        match &self.token {
            Some(token) => request.header(AUTHORIZATION, format!("Bearer {token}")),
            None => request,
        }
    }

    pub async fn create_session(&self) -> anyhow::Result<String> {
        let response = self
            .request(Method::POST, "/v1/sessions")
            .json(&json!({"title": "bench"}))
            .timeout(Duration::from_secs(60))
            .send()
            .await?;
        let response = expect_status(response, StatusCode::CREATED, "POST /v1/sessions").await?;
        Ok(response.json::<Created>().await?.id)
    }

    pub async fn run_turn(&self, session: &str, turn: usize) -> anyhow::Result<()> {
        let response = self
            .request(
                Method::POST,
                &format!("/v1/sessions/{session}/runs?wait=true"),
            )
            .json(&json!({"input": format!("bench turn {turn}")}))
            .timeout(TURN_TIMEOUT)
            .send()
            .await?;
        let response = expect_status(response, StatusCode::OK, "POST …/runs?wait=true").await?;
        let outcome: RunOutcome = response.json().await?;
        if outcome.status != "completed" {
            bail!(
                "a turn ended {}: {}",
                outcome.status,
                outcome.error.unwrap_or(Value::Null)
            );
        }
        Ok(())
    }

    pub async fn last_seq(&self, session: &str) -> anyhow::Result<i64> {
        let response = self
            .request(Method::GET, &format!("/v1/sessions/{session}"))
            .timeout(Duration::from_secs(60))
            .send()
            .await?;
        let response = expect_status(response, StatusCode::OK, "GET /v1/sessions/{id}").await?;
        Ok(response.json::<SessionView>().await?.last_seq)
    }

    /// A sample of the server's `/metrics` without labels, if it has it.
    pub async fn metric(&self, name: &str) -> anyhow::Result<Option<u64>> {
        let response = self
            .request(Method::GET, "/metrics")
            .timeout(Duration::from_secs(60))
            .send()
            .await?;
        let text = expect_status(response, StatusCode::OK, "GET /metrics")
            .await?
            .text()
            .await?;
        Ok(text.lines().find_map(|line| {
            let (key, value) = line.split_once(' ')?;
            (key == name)
                .then(|| value.trim().parse::<f64>().ok())?
                .map(|v| v as u64)
        }))
    }

    /// Opens an event stream (`path`, e.g. a session's events) with the subscribers' own SSE
    /// client, on the `events_via` base when there is one.
    pub async fn open_sse(&self, path: &str, after: i64) -> anyhow::Result<SseStream> {
        let base = self.events_base.as_deref().unwrap_or(&self.base);
        SseStream::open(base, path, self.token.as_deref(), after).await
    }

    pub async fn open_events(
        &self,
        session: &str,
        after: i64,
    ) -> anyhow::Result<reqwest::Response> {
        let base = self.events_base.as_deref().unwrap_or(&self.base);
        let mut request = self
            .request_to(base, Method::GET, &format!("/v1/sessions/{session}/events"))
            .header(ACCEPT, "text/event-stream");
        if after > 0 {
            request = request.header("Last-Event-ID", after.to_string());
        }
        let response = request.send().await?;
        expect_status(response, StatusCode::OK, "GET …/events (SSE)").await
    }
}

pub async fn expect_status(
    response: reqwest::Response,
    expected: StatusCode,
    what: &str,
) -> anyhow::Result<reqwest::Response> {
    let status = response.status();
    if status == expected {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    let body: String = body.chars().take(300).collect();
    bail!("{what}: HTTP {status}: {body}")
}
