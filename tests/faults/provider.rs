//! A hostile OpenAI-compatible provider: every reply is bounded (bytes, lines, tool calls,
//! arguments, time), what it echoes of the key never reaches a log, an event or a response,
//! and a character it splits across chunks arrives whole.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::faults::hostile::{Behaviour, Hostile};
use crate::support::{ServerOptions, TestServer};

const KEY: &str = "sk-hostile-SECRET-7c2d9e41aa";

async fn start(provider: &Hostile, extra: &[&str]) -> TestServer {
    TestServer::start(
        ServerOptions::new()
            .process()
            .args(&["--provider", "openai", "--base-url", &provider.base_url])
            .args(&["--model", "hostile", "--max-steps", "3"])
            .args(extra)
            .env("OPENAI_API_KEY", KEY)
            .paged_by(500),
    )
    .await
}

/// Runs one turn and returns its result.
async fn turn(server: &TestServer) -> (String, Value) {
    let id = server.create_session().await;
    let result = server.run_wait(&id, "hello").await;
    (id, result)
}

fn failed_step_error(events: &[Value]) -> String {
    events
        .iter()
        .find(|e| e["type"] == "llm.failed")
        .map(|e| e["data"]["error"].as_str().unwrap_or("").to_string())
        .unwrap_or_else(|| panic!("no llm.failed among {} events", events.len()))
}

/// Resident memory of a process, from /proc.
fn rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

/// Bytes of the database and its WAL.
fn database_mb(server: &TestServer) -> f64 {
    let db = server.database_path();
    let size = |p: std::path::PathBuf| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let wal = db.with_extension("db-wal");
    (size(db) + size(wal)) as f64 / 1024.0 / 1024.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_stream_ends_the_step_at_the_reply_limit_with_bounded_memory() {
    let provider = Hostile::start(Behaviour::Endless {
        delay: Duration::ZERO,
    })
    .await;
    let server = start(&provider, &["--max-reply-bytes", "500000"]).await;
    let started = Instant::now();
    let (id, result) = turn(&server).await;
    let took = started.elapsed();
    assert_eq!(result["status"], "failed", "{result}");
    let error = result["error"].as_str().unwrap_or("");
    assert!(error.contains("--max-reply-bytes"), "{error}");
    let events = server.events(&id).await;
    assert!(failed_step_error(&events).contains("larger than 500000 bytes"));
    // What the provider sent stops near the limit: the connection was dropped, not drained.
    assert!(
        provider.sent() < 3_000_000,
        "sent {} bytes",
        provider.sent()
    );
    let rss = rss_mb(server.pid());
    let db = database_mb(&server);
    eprintln!(
        "endless stream: step ended after {took:?}, server RSS {rss:.1} MB, database {db:.1} MB, \
         provider sent {} bytes, {} events",
        provider.sent(),
        events.len()
    );
    assert!(rss < 200.0, "server RSS {rss:.1} MB");
    assert!(db < 50.0, "database {db:.1} MB");
    // The limit is not retried: one request.
    assert_eq!(provider.requests(), 1);
    // The token limit was sent.
    assert_eq!(provider.token_limits(), [Some(8192)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_line_is_refused_without_buffering_it() {
    let provider = Hostile::start(Behaviour::HugeLine {
        bytes: 100 * 1024 * 1024,
    })
    .await;
    let server = start(&provider, &["--max-sse-line-bytes", "65536"]).await;
    let (id, result) = turn(&server).await;
    assert_eq!(result["status"], "failed", "{result}");
    let events = server.events(&id).await;
    assert!(failed_step_error(&events).contains("--max-sse-line-bytes"));
    assert!(
        provider.sent() < 10_000_000,
        "sent {} bytes",
        provider.sent()
    );
    let rss = rss_mb(server.pid());
    assert!(rss < 200.0, "server RSS {rss:.1} MB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_tool_calls_run_none_of_them() {
    let provider = Hostile::start(Behaviour::ManyCalls { calls: 10_000 }).await;
    let server = start(&provider, &[]).await;
    let (id, result) = turn(&server).await;
    assert_eq!(result["status"], "failed", "{result}");
    let events = server.events(&id).await;
    assert!(failed_step_error(&events).contains("10000 tool calls"));
    assert!(
        !events.iter().any(|e| e["type"] == "tool.started"),
        "a tool ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_arguments_are_refused_and_not_stored() {
    let provider = Hostile::start(Behaviour::HugeArguments {
        bytes: 5 * 1024 * 1024,
    })
    .await;
    let server = start(
        &provider,
        &[
            "--max-tool-argument-bytes",
            "100000",
            "--max-sse-line-bytes",
            "10000000",
        ],
    )
    .await;
    let (id, result) = turn(&server).await;
    assert_eq!(result["status"], "failed", "{result}");
    let events = server.events(&id).await;
    assert!(failed_step_error(&events).contains("--max-tool-argument-bytes"));
    assert!(!events.iter().any(|e| e["type"] == "tool.started"));
    let stored = Value::Array(server.messages(&id).await).to_string().len();
    assert!(stored < 100_000, "{stored} bytes of messages stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickle_is_cut_by_the_call_deadline() {
    let provider = Hostile::start(Behaviour::Trickle).await;
    let server = start(&provider, &["--llm-deadline-s", "2"]).await;
    let started = Instant::now();
    let (id, result) = turn(&server).await;
    let took = started.elapsed();
    assert_eq!(result["status"], "failed", "{result}");
    assert!(
        result["error"]
            .as_str()
            .unwrap_or("")
            .contains("--llm-deadline-s"),
        "{result}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let events = server.events(&id).await;
    assert!(failed_step_error(&events).contains("did not finish within"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_character_split_across_chunks_arrives_whole() {
    // U+1F600 as two escapes, each in its own chunk; then more text.
    let provider = Hostile::start(Behaviour::Pieces(vec![
        "smile ",
        "\\ud83d",
        "\\ude00",
        " and 世界",
    ]))
    .await;
    let server = start(&provider, &[]).await;
    let (id, result) = turn(&server).await;
    assert_eq!(result["status"], "completed", "{result}");
    assert_eq!(result["text"], "smile 😀 and 世界");
    let streamed: String = server
        .events(&id)
        .await
        .iter()
        .filter(|e| e["type"] == "agent.assistant-stream")
        .filter_map(|e| e["data"]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(streamed, "smile 😀 and 世界");
}

/// Everything a client or an operator can see of a session: the log, events, messages,
/// steps, runs, and the run's result.
async fn visible(server: &TestServer, id: &str, result: &Value) -> String {
    let steps = server
        .pages(&format!("/v1/sessions/{id}/steps"), "cursor")
        .await;
    let runs = server
        .pages(&format!("/v1/sessions/{id}/runs"), "cursor")
        .await;
    format!(
        "{}\n{}\n{}\n{}\n{}\n{result}",
        server.log(),
        Value::Array(server.events(id).await),
        Value::Array(server.messages(id).await),
        Value::Array(steps),
        Value::Array(runs),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_the_provider_echoes_is_never_shown() {
    for behaviour in [Behaviour::EchoesKey, Behaviour::EchoesKeyStatus] {
        let provider = Hostile::start(behaviour.clone()).await;
        let server = start(&provider, &[]).await;
        let (id, result) = turn(&server).await;
        assert_eq!(result["status"], "failed", "{behaviour:?}: {result}");
        let seen = visible(&server, &id, &result).await;
        assert!(
            seen.contains("[redacted]"),
            "{behaviour:?}: the echo was not where expected: {result}"
        );
        assert!(
            !seen.contains(KEY),
            "{behaviour:?}: the key is shown:\n{seen}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_in_the_base_url_are_never_shown() {
    // A provider at an address nothing listens on, with credentials in its URL.
    let base = "http://tah-user:hunter2-secret@127.0.0.1:9/v1";
    let server = TestServer::start(
        ServerOptions::new()
            .process()
            .args(&[
                "--provider",
                "openai",
                "--base-url",
                base,
                "--max-steps",
                "1",
            ])
            .env("OPENAI_API_KEY", KEY)
            .paged_by(500),
    )
    .await;
    let id = server.create_session().await;
    let reply = server
        .post_json(
            &format!("/v1/sessions/{id}/runs?wait=true"),
            &json!({"input": "hello"}),
        )
        .await;
    let result = reply.body.clone();
    assert_eq!(result["status"], "failed", "{result}");
    let seen = visible(&server, &id, &result).await;
    for secret in ["hunter2-secret", "tah-user:", KEY] {
        assert!(!seen.contains(secret), "{secret} is shown:\n{seen}");
    }
}
