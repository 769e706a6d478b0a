//! `GET /metrics`: the Prometheus exposition, parsed and checked against known work. The
//! server runs as its own process, so that no other test's work is counted.

use std::collections::HashMap;

use reqwest::StatusCode;
use serde_json::Value;

use crate::support::*;

/// Samples by `name{labels}` (labels as the server wrote them), and the metric types.
struct Exposition {
    samples: HashMap<String, f64>,
    types: HashMap<String, String>,
}

fn parse(text: &str) -> Exposition {
    let mut samples = HashMap::new();
    let mut types = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            types.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("a number in {line:?}"));
        samples.insert(series.to_string(), value);
    }
    Exposition { samples, types }
}

impl Exposition {
    fn value(&self, series: &str) -> f64 {
        *self
            .samples
            .get(series)
            .unwrap_or_else(|| panic!("no sample {series}; have {:?}", self.names()))
    }

    fn names(&self) -> Vec<&String> {
        let mut names: Vec<&String> = self.samples.keys().collect();
        names.sort();
        names
    }
}

fn total(usage: &Value, field: &str) -> f64 {
    usage[field].as_u64().unwrap_or(0) as f64
}

#[tokio::test]
async fn metrics_count_the_work_done() {
    let server = TestServer::start(ServerOptions::new().process()).await;
    let id = server.create_session().await;
    let mut input = 0.0;
    let mut output = 0.0;
    for n in 0..2 {
        let result = server.run_wait(&id, &format!("turn {n}")).await;
        assert_eq!(result["status"], "completed", "{result}");
        input += total(&result["usage"], "input_tokens");
        output += total(&result["usage"], "output_tokens");
    }
    let steps = server.steps(&id).await;
    let llm_steps = steps.iter().filter(|s| s["type"] == "llm").count() as f64;
    let mut tools: HashMap<String, f64> = HashMap::new();
    for step in steps.iter().filter(|s| s["type"] == "tool") {
        let name = step["tool"]
            .as_str()
            .or_else(|| step["call"]["name"].as_str())
            .or_else(|| step["name"].as_str())
            .unwrap_or_else(|| panic!("a tool step names its tool: {step}"));
        *tools.entry(name.to_string()).or_default() += 1.0;
    }
    assert!(!tools.is_empty(), "the mock calls tools: {steps:?}");
    // One SSE subscriber is open while the metrics are read.
    let _sse = server.sse(&id, SseFrom::After(1_000_000)).await;

    let reply = server.get("/metrics").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert!(
        reply.content_type().contains("text"),
        "a text format: {}",
        reply.content_type()
    );
    let text = reply.text();
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
    let m = parse(&text);

    assert_eq!(
        m.value("tah_runs_total{status=\"completed\",agent=\"default\"}"),
        2.0
    );
    assert_eq!(m.value("tah_run_duration_seconds_count"), 2.0);
    assert!(m.value("tah_run_duration_seconds_sum") > 0.0);
    assert_eq!(
        m.value("tah_llm_requests_total{provider=\"mock\",outcome=\"ok\",agent=\"default\"}"),
        llm_steps
    );
    assert_eq!(
        m.value("tah_llm_request_duration_seconds_count{provider=\"mock\"}"),
        llm_steps
    );
    assert_eq!(
        m.value("tah_llm_time_to_first_token_seconds_count{provider=\"mock\"}"),
        2.0,
        "the replies that streamed text: each turn's answer (tool-call replies have none)"
    );
    assert_eq!(
        m.value("tah_llm_tokens_total{provider=\"mock\",direction=\"input\",agent=\"default\"}"),
        input
    );
    assert_eq!(
        m.value("tah_llm_tokens_total{provider=\"mock\",direction=\"output\",agent=\"default\"}"),
        output
    );
    for (tool, calls) in &tools {
        assert_eq!(
            m.value(&format!(
                "tah_tool_calls_total{{tool=\"{tool}\",outcome=\"ok\"}}"
            )),
            *calls,
            "{tool}"
        );
        assert_eq!(
            m.value(&format!(
                "tah_tool_duration_seconds_count{{tool=\"{tool}\"}}"
            )),
            *calls
        );
    }
    assert_eq!(m.value("tah_approvals_pending"), 0.0);
    assert!(m.value("tah_live_sessions") >= 1.0);
    assert_eq!(m.value("tah_sse_subscribers"), 1.0);
    let commits = m.value("tah_store_commits_total");
    assert!(commits >= 1.0, "{commits}");
    assert_eq!(m.value("tah_store_commit_duration_seconds_count"), commits);
    assert_eq!(m.value("tah_store_commit_batch_size_count"), commits);
    // A histogram's buckets are cumulative and end with +Inf = count.
    assert_eq!(m.value("tah_run_duration_seconds_bucket{le=\"+Inf\"}"), 2.0);
    for (name, kind) in [
        ("tah_runs", "counter"),
        ("tah_run_duration_seconds", "histogram"),
        ("tah_llm_requests", "counter"),
        ("tah_tool_calls", "counter"),
        ("tah_approvals_pending", "gauge"),
        ("tah_live_sessions", "gauge"),
        ("tah_sse_subscribers", "gauge"),
        ("tah_store_commit_duration_seconds", "histogram"),
        ("tah_store_commit_batch_size", "histogram"),
    ] {
        assert_eq!(m.types.get(name).map(String::as_str), Some(kind), "{name}");
    }
}

#[tokio::test]
async fn metrics_are_open_like_healthz() {
    let token = "a-token-of-sixteen-chars";
    let server = TestServer::start(ServerOptions::new().arg("--api-token").arg(token)).await;
    let open = reqwest::get(server.url("/metrics"))
        .await
        .expect("GET /metrics");
    assert_eq!(open.status(), StatusCode::OK);
    let guarded = reqwest::get(server.url("/v1/sessions")).await.expect("GET");
    assert_eq!(guarded.status(), StatusCode::UNAUTHORIZED);
}

/// A free port on 127.0.0.1 (the server binds it a moment later).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a port");
    listener.local_addr().expect("its address").port()
}

#[tokio::test]
async fn metrics_listen_serves_metrics_apart_from_the_api() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let server = TestServer::start(ServerOptions::new().args(&["--metrics-listen", &addr])).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "count me").await;
    assert_eq!(result["status"], "completed", "{result}");

    let apart = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .expect("GET /metrics on --metrics-listen");
    assert_eq!(apart.status(), StatusCode::OK);
    let text = apart.text().await.unwrap();
    assert!(
        text.contains("tah_runs_total{status=\"completed\",agent=\"default\"}"),
        "{text}"
    );
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
    let elsewhere = reqwest::get(format!("http://{addr}/v1/sessions"))
        .await
        .expect("GET /v1/sessions on --metrics-listen");
    assert_eq!(
        elsewhere.status(),
        StatusCode::NOT_FOUND,
        "only /metrics there"
    );

    let on_api = server.get("/metrics").await;
    assert_eq!(on_api.status, StatusCode::NOT_FOUND, "{}", on_api.text());
    check_problem(&on_api).expect("a problem+json 404");
    assert_eq!(server.get("/healthz").await.status, StatusCode::OK);
}

/// `tah serve --metrics-listen ADDR`: its exit status and stderr.
fn serve_with_metrics_listen(addr: &str) -> (std::process::ExitStatus, String) {
    serve_expecting_exit(&["--metrics-listen", addr], &[])
}

#[test]
fn a_bad_metrics_listen_address_fails_the_start() {
    let (status, log) = serve_with_metrics_listen("not-an-address");
    assert!(!status.success(), "it started: {log}");
    assert!(log.contains("--metrics-listen"), "{log}");
    assert!(log.contains("not-an-address"), "{log}");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (status, log) = serve_with_metrics_listen(&addr);
    assert!(!status.success(), "it started on a taken port: {log}");
    let says = format!("cannot listen on {addr} (--metrics-listen)");
    assert!(log.contains(&says), "{log}");
}
