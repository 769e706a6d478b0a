//! A 429 with `Retry-After` and a 500 retried until the turn completes, and a stream cut
//! mid-reply retried without duplicated text.

use serde_json::Value;

use crate::provider_e2e::*;
use crate::support::fakes::{self, FakeServer, Flavor, Reply};
use crate::support::TestServer;

/// A turn on a fresh session whose first model request is answered with `first` and whose
/// next one streams `pieces`: the fake, the server, the session's id and the run's result.
async fn turn_answered_after(
    flavor: Flavor,
    first: Reply,
    pieces: &[&str],
) -> (FakeServer, TestServer, String, Value) {
    let fake = fakes::start(
        flavor,
        vec![first, Reply::sse_events(&text_reply(flavor, pieces))],
    )
    .await;
    let server = start_server(flavor, &fake).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "hello").await;
    (fake, server, id, result)
}

/// The assistant messages of a history.
fn assistant_messages(messages: &[Value]) -> Vec<&Value> {
    messages
        .iter()
        .filter(|m| m["role"] == "assistant")
        .collect()
}

async fn retried_then_completes(flavor: Flavor, first: Reply, code: &str) {
    let provider = provider_name(flavor);
    let (fake, server, id, result) =
        turn_answered_after(flavor, first, &["After ", "retry."]).await;
    assert_eq!(result["status"], "completed", "{provider} {code}: {result}");
    assert_eq!(result["text"], "After retry.");
    assert_eq!(
        result["usage"],
        usage(fakes::INPUT_TOKENS, fakes::OUTPUT_TOKENS)
    );
    assert_eq!(fake.request_count(), 2, "{provider} {code}: one retry");
    let events = server.events(&id).await;
    let retries = of_type(&events, "llm.retry");
    assert_eq!(retries.len(), 1, "{provider} {code}: llm.retry events");
    let data = &retries[0]["data"];
    assert_eq!(data["attempt"], 1, "{provider} {code}: {data}");
    assert!(data["step_id"].is_string(), "{data}");
    let error = data["error"].as_str().expect("llm.retry error");
    assert!(
        error.contains(code),
        "{provider}: the retry error should name HTTP {code}: {error:?}"
    );
    let messages = server.messages(&id).await;
    let assistants = assistant_messages(&messages);
    assert_eq!(
        assistants.len(),
        1,
        "{provider} {code}: one assistant message"
    );
    assert_eq!(assistants[0]["content"], "After retry.");
    assert_key_never_shown(&server, flavor, &id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_429_with_retry_after_is_retried() {
    let reply = Reply::status(
        429,
        r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
    )
    .with_header("retry-after", "0");
    retried_then_completes(Flavor::OpenAi, reply, "429").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_429_with_retry_after_is_retried() {
    let reply = Reply::status(
        429,
        r#"{"type":"error","error":{"type":"rate_limit_error","message":"Rate limited"}}"#,
    )
    .with_header("retry-after", "0");
    retried_then_completes(Flavor::Anthropic, reply, "429").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_500_once_is_retried() {
    let reply = Reply::status(500, r#"{"error":{"message":"The server had an error"}}"#);
    retried_then_completes(Flavor::OpenAi, reply, "500").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_500_once_is_retried() {
    let reply = Reply::status(
        500,
        r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
    );
    retried_then_completes(Flavor::Anthropic, reply, "500").await;
}

async fn cut_stream_then_success(flavor: Flavor) {
    let provider = provider_name(flavor);
    let broken = text_reply(flavor, &["Partial ", "answer "]);
    let events = fakes::split_events(&broken);
    let last = events
        .iter()
        .rposition(|e| e.contains("answer "))
        .expect("the second piece");
    let cut = Reply::cut(events[..=last].to_vec());
    let (fake, server, id, result) =
        turn_answered_after(flavor, cut, &["Complete ", "answer."]).await;
    assert_eq!(result["status"], "completed", "{provider}: {result}");
    assert_eq!(result["text"], "Complete answer.", "{provider}: {result}");
    assert_eq!(fake.request_count(), 2);

    let messages = server.messages(&id).await;
    let assistants = assistant_messages(&messages);
    assert_eq!(
        assistants.len(),
        1,
        "{provider}: {}",
        Value::Array(messages.clone())
    );
    assert_eq!(
        assistants[0]["content"], "Complete answer.",
        "{provider}: the persisted message is the second attempt's text only"
    );

    let events = server.events(&id).await;
    let retries = of_type(&events, "llm.retry");
    assert_eq!(retries.len(), 1, "{provider}: llm.retry");
    let retry_seq = retries[0]["seq"].as_i64().unwrap();
    let after: String = events
        .iter()
        .filter(|e| e["type"] == "agent.assistant-stream" && e["seq"].as_i64().unwrap() > retry_seq)
        .map(|e| e["data"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        after, "Complete answer.",
        "{provider}: deltas after llm.retry"
    );
    let completed = of_type(&events, "llm.completed");
    assert_eq!(completed.len(), 1);
    assert_eq!(
        completed[0]["data"]["message"]["content"],
        "Complete answer."
    );
    let finished = of_type(&events, "agent.finished");
    assert_eq!(finished[0]["data"]["text"], "Complete answer.");
    assert_key_never_shown(&server, flavor, &id).await;
}

both_providers!(cut_stream_then_success: openai_cut_stream_is_retried_without_duplicates, anthropic_cut_stream_is_retried_without_duplicates);
