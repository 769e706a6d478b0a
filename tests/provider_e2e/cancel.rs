//! Cancel during a slow stream: the run ends cancelled within a second, the provider's
//! connection is dropped, and no half assistant message is stored.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::provider_e2e::*;
use crate::support::fakes::{self, Flavor, Reply};
use crate::support::{is_terminal, TestServer};

async fn cancel_during_slow_stream(flavor: Flavor) {
    let provider = provider_name(flavor);
    let pieces: Vec<String> = (0..30).map(|i| format!("word{i} ")).collect();
    let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let slow =
        Reply::sse_events(&text_reply(flavor, &pieces)).with_delay(Duration::from_millis(300));
    let fake = fakes::start(flavor, vec![slow]).await;
    let server = start_server(flavor, &fake).await;
    let id = server.create_session().await;
    let reply = server
        .post_json(
            &format!("/v1/sessions/{id}/runs"),
            &json!({"input": "go slowly"}),
        )
        .await;
    let (status, run) = (reply.status, reply.body);
    assert_eq!(status, StatusCode::ACCEPTED, "{provider}: {run}");
    let run_id = run["id"]
        .as_str()
        .or(run["run_id"].as_str())
        .expect("the run's id")
        .to_string();

    // Wait until the stream is under way.
    wait_for_event(&server, &id, Duration::from_secs(10), |events| {
        events.iter().any(|e| e["type"] == "agent.assistant-stream")
    })
    .await;

    let started = Instant::now();
    let cancel = format!("/v1/sessions/{id}/cancel");
    let reply = server.post_empty(&cancel).await;
    let (status, body) = (reply.status, reply.body);
    assert!(status.is_success(), "{provider}: cancel: {status} {body}");
    let events = wait_for_event(&server, &id, Duration::from_secs(5), |events| {
        events
            .iter()
            .any(|e| e["type"] == "agent.cancelled" && e["data"]["run_id"] == run_id.as_str())
    })
    .await;
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(1),
        "{provider}: agent.cancelled took {elapsed:?}"
    );
    assert!(
        fake.wait_aborted(Duration::from_secs(2)).await,
        "{provider}: the fake did not see the connection dropped"
    );
    let terminal: Vec<&Value> = events.iter().filter(|e| is_terminal(e)).collect();
    assert_eq!(terminal.len(), 1, "{provider}: exactly one terminal event");
    assert_no_partial_assistant(&server.messages(&id).await);
    let session = server.session(&id).await;
    assert_eq!(session["state"], "cancelled", "{provider}: {session}");
    let run = server
        .get_ok(&format!("/v1/sessions/{id}/runs/{run_id}"))
        .await;
    assert_eq!(run["status"], "cancelled", "{provider}: {run}");
    eprintln!("{provider}: cancel during a slow stream took {elapsed:?}");
    assert_key_never_shown(&server, flavor, &id).await;
}

async fn wait_for_event(
    server: &TestServer,
    id: &str,
    within: Duration,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + within;
    loop {
        let events = server.events(id).await;
        if done(&events) {
            return events;
        }
        assert!(
            Instant::now() < deadline,
            "the awaited event did not come within {within:?}; events: {}; log:\n{}",
            Value::Array(events),
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn assert_no_partial_assistant(messages: &[Value]) {
    for m in messages {
        if m["role"] == "assistant" {
            let calls = m["tool_calls"].as_array().map(Vec::len).unwrap_or(0);
            assert!(
                !m["content"].as_str().unwrap_or("").is_empty() || calls > 0,
                "an empty (half) assistant message was stored: {m}"
            );
        }
    }
}

both_providers!(cancel_during_slow_stream: openai_cancel_during_slow_stream, anthropic_cancel_during_slow_stream);
