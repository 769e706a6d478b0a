//! Black-box tests of the real providers (OpenAI-compatible and Anthropic) against the fake
//! provider server in `support::fakes`: streaming, tool-call assembly, UTF-8 across chunk boundaries,
//! usage, retries and backoff, broken streams, protocol and auth errors, cancellation by drop,
//! and the exact shape of the requests sent.

mod support;

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use support::fakes::{self, FakeServer, FakeToolCall, Flavor, Reply};
use tah::llm::anthropic::AnthropicClient;
use tah::llm::openai::OpenAiClient;
use tah::llm::wire::{HttpModelConfig, RetryPolicy, Timeouts};
use tah::llm::{
    LlmError, LlmErrorKind, ModelClient, ModelReply, ModelRequest, Purpose, StreamItem,
};
use tah::model::{Message, Role, ToolCall, ToolSchema, Usage};

const KEY: &str = "sk-test-SECRET-key-0123456789";

fn config(base_url: &str, retries: u32) -> HttpModelConfig {
    HttpModelConfig {
        base_url: base_url.to_string(),
        api_key: Some(KEY.to_string()),
        model: "test-model".to_string(),
        max_tokens: 1024,
        timeouts: Timeouts {
            connect: Duration::from_secs(5),
            first_byte: Duration::from_secs(5),
            idle: Duration::from_secs(5),
            total: Some(Duration::from_secs(60)),
        },
        retry: RetryPolicy {
            max_retries: retries,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(10),
        },
        limits: Default::default(),
    }
}

async fn fake(flavor: Flavor, script: Vec<Reply>) -> FakeServer {
    fakes::start(flavor, script).await
}

fn client_with(flavor: Flavor, config: HttpModelConfig) -> Box<dyn ModelClient> {
    match flavor {
        Flavor::OpenAi => Box::new(OpenAiClient::new(config).expect("openai client")),
        Flavor::Anthropic => Box::new(AnthropicClient::new(config).expect("anthropic client")),
    }
}

fn client(flavor: Flavor, server: &FakeServer) -> Box<dyn ModelClient> {
    client_with(flavor, config(&server.base_url, 3))
}

fn provider(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::OpenAi => "openai",
        Flavor::Anthropic => "anthropic",
    }
}

fn text_reply(flavor: Flavor, pieces: &[&str]) -> String {
    match flavor {
        Flavor::OpenAi => fakes::openai::text_reply(pieces),
        Flavor::Anthropic => fakes::anthropic::text_reply(pieces),
    }
}

fn tool_calls_reply(flavor: Flavor, text: &str, calls: &[FakeToolCall]) -> String {
    match flavor {
        Flavor::OpenAi => fakes::openai::tool_calls_reply(text, calls),
        Flavor::Anthropic => fakes::anthropic::tool_calls_reply(text, calls),
    }
}

fn request(text: &str) -> ModelRequest {
    ModelRequest {
        messages: vec![
            Message::new(Role::System, "be brief"),
            Message::new(Role::User, text),
        ],
        tools: vec![],
        purpose: Purpose::Turn,
    }
}

type Items = Vec<Result<StreamItem, LlmError>>;

async fn run(client: &dyn ModelClient, request: ModelRequest) -> Items {
    tokio::time::timeout(Duration::from_secs(20), client.stream(request).collect())
        .await
        .expect("the stream finishes")
}

fn deltas(items: &[Result<StreamItem, LlmError>]) -> Vec<String> {
    items
        .iter()
        .filter_map(|i| match i {
            Ok(StreamItem::Delta(d)) => Some(d.clone()),
            _ => None,
        })
        .collect()
}

fn retries(items: &Items) -> Vec<(u32, String)> {
    items
        .iter()
        .filter_map(|i| match i {
            Ok(StreamItem::Retry { attempt, error }) => Some((*attempt, error.clone())),
            _ => None,
        })
        .collect()
}

/// The reply of a stream that must end with exactly one `Done`.
fn done(items: &Items) -> ModelReply {
    let dones: Vec<&ModelReply> = items
        .iter()
        .filter_map(|i| match i {
            Ok(StreamItem::Done(r)) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(dones.len(), 1, "exactly one Done: {items:?}");
    assert!(
        matches!(items.last(), Some(Ok(StreamItem::Done(_)))),
        "Done comes last: {items:?}"
    );
    dones[0].clone()
}

/// The error of a stream that must end with an error and contain no `Done`.
fn failure(items: &Items) -> LlmError {
    assert!(
        !items.iter().any(|i| matches!(i, Ok(StreamItem::Done(_)))),
        "no Done on failure: {items:?}"
    );
    match items.last() {
        Some(Err(e)) => e.clone(),
        other => panic!("the stream must end with an error, ended with {other:?}"),
    }
}

/// Text streamed after the last `Retry` (what the consumer keeps).
fn text_after_last_retry(items: &Items) -> String {
    let start = items
        .iter()
        .rposition(|i| matches!(i, Ok(StreamItem::Retry { .. })))
        .map(|p| p + 1)
        .unwrap_or(0);
    deltas(&items[start..]).concat()
}

const USAGE: Usage = Usage {
    input_tokens: fakes::INPUT_TOKENS,
    output_tokens: fakes::OUTPUT_TOKENS,
};

async fn text_reply_streams_in_pieces_with_usage(flavor: Flavor) {
    let mut body = text_reply(flavor, &["Hello", ", wor", "ld!"]);
    // Keep-alive comments (OpenRouter) and pings (Anthropic) are ignored.
    body.insert_str(0, ": keep-alive\n\n");
    let server = fake(flavor, vec![Reply::sse_events(&body)]).await;
    let items = run(&*client(flavor, &server), request("hi")).await;
    assert_eq!(deltas(&items), vec!["Hello", ", wor", "ld!"]);
    let reply = done(&items);
    assert_eq!(reply.text, "Hello, world!");
    assert!(reply.tool_calls.is_empty());
    assert_eq!(reply.finish_reason, "stop");
    assert_eq!(reply.usage, USAGE);
    assert_eq!(server.request_count(), 1);
}

async fn two_tool_calls_with_awkwardly_split_arguments(flavor: Flavor) {
    let calls = [
        // Split mid-key, mid-string and mid-escape (`\"` and `\u00e9`).
        FakeToolCall::new(
            "call_a",
            "read_file",
            &[
                r#"{"pa"#,
                r#"th": "src/ma"#,
                r#"in.rs", "note": "say \"#,
                r#""hi\"#,
                r#"" caf\u00"#,
                r#"e9"}"#,
            ],
        ),
        FakeToolCall::new("call_b", "list_files", &["{", r#""path"#, r#"": "."}"#]),
    ];
    let body = tool_calls_reply(flavor, "Looking.", &calls);
    // Also split the bytes at odd places, not at event boundaries.
    let server = fake(
        flavor,
        vec![Reply::sse_chunks(fakes::split_bytes(&body, 7))],
    )
    .await;
    let items = run(&*client(flavor, &server), request("read it")).await;
    let reply = done(&items);
    assert_eq!(reply.text, "Looking.");
    assert_eq!(deltas(&items).concat(), "Looking.");
    assert_eq!(reply.finish_reason, "tool_calls");
    assert_eq!(
        reply.tool_calls,
        vec![
            ToolCall {
                id: "call_a".into(),
                name: "read_file".into(),
                arguments: json!({"path": "src/main.rs", "note": "say \"hi\" café"}),
            },
            ToolCall {
                id: "call_b".into(),
                name: "list_files".into(),
                arguments: json!({"path": "."}),
            },
        ]
    );
    assert_eq!(reply.usage, USAGE);
}

async fn invalid_tool_arguments_are_kept_raw(flavor: Flavor) {
    let calls = [FakeToolCall::new(
        "call_x",
        "read_file",
        &[r#"{"path": "#, "oops"],
    )];
    let server = fake(
        flavor,
        vec![Reply::sse(tool_calls_reply(flavor, "", &calls))],
    )
    .await;
    let reply = done(&run(&*client(flavor, &server), request("x")).await);
    assert_eq!(reply.tool_calls.len(), 1);
    assert_eq!(
        reply.tool_calls[0].arguments,
        Value::String(r#"{"path": oops"#.into())
    );
}

async fn multibyte_text_split_inside_characters(flavor: Flavor) {
    let text = "héllo 世界 🎉";
    let body = text_reply(flavor, &["hé", "llo 世", "界 🎉"]);
    let chunks = fakes::split_inside_chars(&body);
    assert!(chunks.len() > 8);
    let server = fake(
        flavor,
        vec![Reply::sse_chunks(chunks).with_delay(Duration::from_millis(2))],
    )
    .await;
    let items = run(&*client(flavor, &server), request("utf8")).await;
    assert_eq!(deltas(&items).concat(), text);
    assert_eq!(done(&items).text, text);
}

async fn rate_limit_with_retry_after_then_success(flavor: Flavor) {
    let server = fake(
        flavor,
        vec![
            Reply::status(429, r#"{"error":{"message":"slow down"}}"#)
                .with_header("retry-after", "0"),
            Reply::sse_events(&text_reply(flavor, &["ok"])),
        ],
    )
    .await;
    // A large base delay: only Retry-After: 0 keeps this test fast.
    let mut cfg = config(&server.base_url, 3);
    cfg.retry.base_delay = Duration::from_secs(20);
    cfg.retry.max_delay = Duration::from_secs(20);
    let started = std::time::Instant::now();
    let items = run(&*client_with(flavor, cfg), request("hi")).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(&items[0], Ok(StreamItem::Retry { attempt: 1, error }) if error.contains("429")),
        "{items:?}"
    );
    assert_eq!(retries(&items).len(), 1);
    assert_eq!(done(&items).text, "ok");
    assert_eq!(server.request_count(), 2);
}

async fn server_error_forever_fails_after_retries(flavor: Flavor) {
    let server = fake(
        flavor,
        vec![Reply::status(500, r#"{"error":{"message":"boom"}}"#)],
    )
    .await;
    let items = run(&*client(flavor, &server), request("hi")).await;
    let err = failure(&items);
    assert_eq!(err.kind, LlmErrorKind::Server, "{err}");
    assert!(err.to_string().contains("500"), "{err}");
    let retries = retries(&items);
    assert_eq!(
        retries.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert!(
        retries.iter().all(|r| r.1.contains("HTTP 500")),
        "{retries:?}"
    );
    assert_eq!(server.request_count(), 4);
}

async fn overloaded_529_is_retried(flavor: Flavor) {
    let server = fake(
        flavor,
        vec![
            Reply::status(
                529,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            ),
            Reply::sse(text_reply(flavor, &["fine"])),
        ],
    )
    .await;
    let items = run(&*client(flavor, &server), request("hi")).await;
    assert_eq!(retries(&items).len(), 1);
    assert!(retries(&items)[0].1.contains("529"));
    assert_eq!(done(&items).text, "fine");
}

/// The first half of a reply's events, for cutting the connection mid-reply.
fn first_half(flavor: Flavor) -> Vec<String> {
    let events = fakes::split_events(&text_reply(
        flavor,
        &["Partial ", "text ", "that ", "breaks"],
    ));
    events[..events.len() / 2].to_vec()
}

async fn cut_mid_reply_is_retried_from_scratch(flavor: Flavor) {
    let server = fake(
        flavor,
        vec![
            Reply::cut(first_half(flavor)),
            Reply::sse_events(&text_reply(flavor, &["Whole ", "reply"])),
        ],
    )
    .await;
    let items = run(&*client(flavor, &server), request("hi")).await;
    let retries = retries(&items);
    assert_eq!(retries.len(), 1, "{items:?}");
    assert_eq!(retries[0].0, 1);
    // Text of the broken attempt came before the Retry; the reply has only the new text.
    assert!(deltas(&items).concat().starts_with("Partial "), "{items:?}");
    assert_eq!(text_after_last_retry(&items), "Whole reply");
    assert_eq!(done(&items).text, "Whole reply");
    assert_eq!(server.request_count(), 2);
}

async fn cut_mid_reply_forever_fails_cleanly(flavor: Flavor) {
    let server = fake(flavor, vec![Reply::cut(first_half(flavor))]).await;
    let items = run(&*client(flavor, &server), request("hi")).await;
    let err = failure(&items);
    assert_eq!(err.kind, LlmErrorKind::Connection, "{err}");
    assert_eq!(retries(&items).len(), 3);
    assert_eq!(server.request_count(), 4);
}

async fn stream_ending_before_the_reply_is_complete_is_retried(flavor: Flavor) {
    // A clean end of the body without [DONE] / message_stop and without a finish reason.
    let server = fake(
        flavor,
        vec![
            Reply::sse_chunks(first_half(flavor)),
            Reply::sse(text_reply(flavor, &["again"])),
        ],
    )
    .await;
    let items = run(&*client(flavor, &server), request("hi")).await;
    assert_eq!(retries(&items).len(), 1, "{items:?}");
    assert_eq!(done(&items).text, "again");
}

async fn malformed_json_is_a_protocol_error(flavor: Flavor) {
    let mut events = fakes::split_events(&text_reply(flavor, &["fine so far"]));
    let bad = match flavor {
        Flavor::OpenAi => "data: {\"choices\": [{\"delta\": {\"content\": \"x\"\n\n".to_string(),
        Flavor::Anthropic => "event: content_block_delta\ndata: {\"type\": \"content_block_delta\", \"index\": 0,\n\n".to_string(),
    };
    events.insert(3, bad);
    let server = fake(flavor, vec![Reply::sse_chunks(events)]).await;
    let items = run(&*client(flavor, &server), request("hi")).await;
    let err = failure(&items);
    assert_eq!(err.kind, LlmErrorKind::Protocol, "{err}");
    assert!(retries(&items).is_empty());
    assert_eq!(server.request_count(), 1);
}

async fn html_page_is_a_protocol_error(flavor: Flavor) {
    let page = Reply::Respond {
        status: 200,
        headers: vec![("content-type".into(), "text/html; charset=utf-8".into())],
        chunks: vec![fakes::Chunk::new("<html><body>Welcome</body></html>")],
    };
    let server = fake(flavor, vec![page]).await;
    let err = failure(&run(&*client(flavor, &server), request("hi")).await);
    assert_eq!(err.kind, LlmErrorKind::Protocol, "{err}");
    assert!(err.message.contains("--base-url"), "{err}");
    assert_eq!(server.request_count(), 1);
}

async fn unauthorized_is_an_auth_error_without_the_key(flavor: Flavor) {
    let server = fake(
        flavor,
        vec![Reply::status(
            401,
            format!(r#"{{"error":{{"type":"authentication_error","message":"Incorrect API key provided: {KEY}"}}}}"#),
        )],
    )
    .await;
    let items = run(&*client(flavor, &server), request("hi")).await;
    let err = failure(&items);
    assert_eq!(err.kind, LlmErrorKind::Auth);
    let text = err.to_string();
    assert!(
        text.starts_with(&format!("{}: ", provider(flavor))),
        "{text}"
    );
    assert!(text.contains("authentication failed (HTTP 401)"), "{text}");
    assert!(text.contains("Incorrect API key provided"), "{text}");
    assert!(!text.contains(KEY), "{text}");
    assert!(!format!("{err:?}").contains(KEY));
    assert!(retries(&items).is_empty());
    assert_eq!(server.request_count(), 1);
}

async fn not_found_and_bad_request_are_not_retried(flavor: Flavor) {
    let server = fake(
        flavor,
        vec![
            Reply::status(
                404,
                r#"{"error":{"message":"model test-model does not exist"}}"#,
            ),
            Reply::status(
                400,
                format!(r#"{{"error":{{"message":"{}"}}}}"#, "x".repeat(2000)),
            ),
        ],
    )
    .await;
    let c = client(flavor, &server);
    let err = failure(&run(&*c, request("hi")).await);
    assert_eq!(err.kind, LlmErrorKind::NotFound);
    assert!(
        err.message.contains("check --base-url and --model"),
        "{err}"
    );
    let err = failure(&run(&*c, request("hi")).await);
    assert_eq!(err.kind, LlmErrorKind::Rejected);
    assert!(err.message.contains("HTTP 400"), "{err}");
    assert!(err.message.chars().count() < 600, "{err}");
    assert_eq!(server.request_count(), 2);
}

async fn idle_timeout_is_retried_then_fails(flavor: Flavor) {
    let events = fakes::split_events(&text_reply(flavor, &["slow"]));
    let server = fake(
        flavor,
        vec![Reply::sse_chunks(events).with_delay(Duration::from_millis(800))],
    )
    .await;
    let mut cfg = config(&server.base_url, 1);
    cfg.timeouts.idle = Duration::from_millis(100);
    let items = run(&*client_with(flavor, cfg), request("hi")).await;
    let err = failure(&items);
    assert_eq!(err.kind, LlmErrorKind::Timeout, "{err}");
    assert_eq!(retries(&items).len(), 1);
    assert_eq!(server.request_count(), 2);
}

async fn first_byte_timeout_is_retried(flavor: Flavor) {
    let server = fake(
        flavor,
        vec![
            Reply::sse(text_reply(flavor, &["late"])).with_first_delay(Duration::from_millis(800)),
            Reply::sse(text_reply(flavor, &["on time"])),
        ],
    )
    .await;
    let mut cfg = config(&server.base_url, 1);
    cfg.timeouts.first_byte = Duration::from_millis(150);
    let items = run(&*client_with(flavor, cfg), request("hi")).await;
    assert_eq!(retries(&items).len(), 1, "{items:?}");
    assert_eq!(done(&items).text, "on time");
}

async fn dropping_the_stream_closes_the_connection(flavor: Flavor) {
    let pieces: Vec<String> = (0..50).map(|i| format!("word{i} ")).collect();
    let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let events = fakes::split_events(&text_reply(flavor, &refs));
    let server = fake(
        flavor,
        vec![Reply::sse_chunks(events).with_delay(Duration::from_millis(200))],
    )
    .await;
    let c = client(flavor, &server);
    let mut stream = c.stream(request("hi"));
    let mut got = 0;
    while got < 2 {
        match tokio::time::timeout(Duration::from_secs(5), stream.next()).await {
            Ok(Some(Ok(StreamItem::Delta(_)))) => got += 1,
            Ok(Some(Ok(other))) => panic!("unexpected {other:?}"),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(server.aborted_count(), 0);
    drop(stream);
    assert!(
        server.wait_aborted(Duration::from_secs(2)).await,
        "the fake saw the connection close"
    );
    assert_eq!(server.request_count(), 1);
}

/// The history of the request-shape tests: system, user, assistant with two tool calls, two
/// tool results, user.
fn shaped_request() -> ModelRequest {
    ModelRequest {
        messages: vec![
            Message::new(Role::System, "You are helpful."),
            Message::new(Role::User, "What is in here?"),
            Message::assistant(
                "Let me look.",
                vec![
                    ToolCall {
                        id: "call_1".into(),
                        name: "list_files".into(),
                        arguments: json!({"path": "."}),
                    },
                    ToolCall {
                        id: "call_2".into(),
                        name: "read_file".into(),
                        arguments: json!({"path": "README.md"}),
                    },
                ],
            ),
            Message::tool_result("call_1", "README.md\nsrc/"),
            Message::tool_result("call_2", r#"{"error":"too large"}"#),
            Message::new(Role::User, "Thanks. Summarise."),
        ],
        tools: vec![ToolSchema {
            name: "list_files".into(),
            description: "List files.".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        }],
        purpose: Purpose::Turn,
    }
}

#[tokio::test]
async fn openai_request_shape() {
    let server = fake(
        Flavor::OpenAi,
        vec![Reply::sse(text_reply(Flavor::OpenAi, &["ok"]))],
    )
    .await;
    done(&run(&*client(Flavor::OpenAi, &server), shaped_request()).await);
    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(sent.headers["authorization"], format!("Bearer {KEY}"));
    assert_eq!(sent.headers["content-type"], "application/json");
    assert_eq!(
        sent.body,
        json!({
            "model": "test-model",
            "max_tokens": 1024,
            "stream": true,
            "stream_options": {"include_usage": true},
            "messages": [
                {"role": "system", "content": "You are helpful."},
                {"role": "user", "content": "What is in here?"},
                {"role": "assistant", "content": "Let me look.", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "list_files", "arguments": "{\"path\":\".\"}"}},
                    {"id": "call_2", "type": "function",
                     "function": {"name": "read_file", "arguments": "{\"path\":\"README.md\"}"}},
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "README.md\nsrc/"},
                {"role": "tool", "tool_call_id": "call_2", "content": "{\"error\":\"too large\"}"},
                {"role": "user", "content": "Thanks. Summarise."},
            ],
            "tools": [{"type": "function", "function": {
                "name": "list_files",
                "description": "List files.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            }}],
        })
    );

    // Without a key no Authorization header is sent; without tools no `tools` field; an
    // assistant message with only tool calls has `content: null`.
    let server = fake(
        Flavor::OpenAi,
        vec![Reply::sse(text_reply(Flavor::OpenAi, &["ok"]))],
    )
    .await;
    let mut cfg = config(&server.base_url, 0);
    cfg.api_key = None;
    let mut req = shaped_request();
    req.tools.clear();
    req.messages[2].content.clear();
    done(&run(&*client_with(Flavor::OpenAi, cfg), req).await);
    let sent = &server.requests()[0];
    assert!(!sent.headers.contains_key("authorization"));
    assert!(sent.body.get("tools").is_none());
    // The reply's token limit is always sent (a compatible server otherwise has none).
    assert_eq!(sent.body["max_tokens"], 1024);
    assert_eq!(sent.body["messages"][2]["content"], Value::Null);
}

#[tokio::test]
async fn anthropic_request_shape() {
    let server = fake(
        Flavor::Anthropic,
        vec![Reply::sse(text_reply(Flavor::Anthropic, &["ok"]))],
    )
    .await;
    done(&run(&*client(Flavor::Anthropic, &server), shaped_request()).await);
    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.headers["x-api-key"], KEY);
    assert_eq!(sent.headers["anthropic-version"], "2023-06-01");
    assert_eq!(sent.headers["content-type"], "application/json");
    assert!(!sent.headers.contains_key("authorization"));
    assert_eq!(
        sent.body,
        json!({
            "model": "test-model",
            "max_tokens": 1024,
            "stream": true,
            "system": "You are helpful.",
            "messages": [
                {"role": "user", "content": "What is in here?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "call_1", "name": "list_files", "input": {"path": "."}},
                    {"type": "tool_use", "id": "call_2", "name": "read_file", "input": {"path": "README.md"}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "README.md\nsrc/"},
                    {"type": "tool_result", "tool_use_id": "call_2",
                     "content": "{\"error\":\"too large\"}", "is_error": true},
                    {"type": "text", "text": "Thanks. Summarise."},
                ]},
            ],
            "tools": [{
                "name": "list_files",
                "description": "List files.",
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
            }],
        })
    );
    let roles: Vec<&str> = sent.body["messages"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["role"].as_str()).collect())
        .unwrap_or_default();
    assert!(roles.windows(2).all(|w| w[0] != w[1]), "{roles:?}");

    // Several system messages (a compaction summary) are joined; non-object arguments become
    // `{}`; no tools means no `tools` field.
    let server = fake(
        Flavor::Anthropic,
        vec![Reply::sse(text_reply(Flavor::Anthropic, &["ok"]))],
    )
    .await;
    let mut req = shaped_request();
    req.tools.clear();
    req.messages
        .insert(1, Message::new(Role::System, "Summary."));
    req.messages[3].tool_calls[0].arguments = Value::String("{broken".into());
    req.messages[3].content.clear();
    done(&run(&*client(Flavor::Anthropic, &server), req).await);
    let body = &server.requests()[0].body;
    assert_eq!(body["system"], "You are helpful.\n\nSummary.");
    assert!(body.get("tools").is_none());
    assert_eq!(
        body["messages"][1]["content"][0],
        json!({"type": "tool_use", "id": "call_1", "name": "list_files", "input": {}})
    );
}

#[tokio::test]
async fn anthropic_overloaded_error_event_is_retried() {
    let mut events = fakes::split_events(&fakes::anthropic::text_reply(&["Part"]));
    events.truncate(4);
    events.push(fakes::anthropic::error("overloaded_error", "Overloaded"));
    let server = fake(
        Flavor::Anthropic,
        vec![
            Reply::sse_chunks(events),
            Reply::sse(fakes::anthropic::text_reply(&["Recovered"])),
        ],
    )
    .await;
    let items = run(&*client(Flavor::Anthropic, &server), request("hi")).await;
    assert_eq!(retries(&items).len(), 1, "{items:?}");
    assert!(retries(&items)[0].1.contains("overloaded_error"));
    assert_eq!(done(&items).text, "Recovered");
}

#[tokio::test]
async fn anthropic_invalid_request_error_event_is_not_retried() {
    let body = format!(
        "{}{}",
        fakes::anthropic::message_start(3),
        fakes::anthropic::error("invalid_request_error", "prompt is too long")
    );
    let server = fake(Flavor::Anthropic, vec![Reply::sse(body)]).await;
    let items = run(&*client(Flavor::Anthropic, &server), request("hi")).await;
    let err = failure(&items);
    assert_eq!(err.kind, LlmErrorKind::Rejected);
    assert!(err.message.contains("prompt is too long"));
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn anthropic_base_url_with_v1_suffix_works() {
    let server = fake(
        Flavor::Anthropic,
        vec![Reply::sse(text_reply(Flavor::Anthropic, &["ok"]))],
    )
    .await;
    let cfg = config(&format!("{}/v1/", server.base_url), 0);
    done(&run(&*client_with(Flavor::Anthropic, cfg), request("hi")).await);
    assert_eq!(server.requests()[0].path, "/v1/messages");
}

#[tokio::test]
async fn connection_refused_is_retried_then_a_connection_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let c = client_with(Flavor::OpenAi, config(&format!("http://{addr}/v1"), 2));
    let items = run(&*c, request("hi")).await;
    let err = failure(&items);
    assert_eq!(err.kind, LlmErrorKind::Connection, "{err}");
    assert_eq!(retries(&items).len(), 2);
}

#[tokio::test]
async fn invalid_configuration_is_refused() {
    let mut cfg = config("not a url", 0);
    assert!(OpenAiClient::new(cfg.clone()).is_err());
    cfg.base_url = "http://127.0.0.1:1".into();
    cfg.api_key = Some("bad\nkey".into());
    let err = AnthropicClient::new(cfg.clone()).err().expect("refused");
    assert_eq!(err.kind, LlmErrorKind::Auth);
    assert!(!err.to_string().contains("bad\nkey"));
    cfg.api_key = None;
    cfg.max_tokens = 0;
    assert!(AnthropicClient::new(cfg).is_err());
}

macro_rules! for_each_provider {
    ($($name:ident),* $(,)?) => {
        mod openai {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(Flavor::OpenAi).await
                }
            )*
        }
        mod anthropic {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(Flavor::Anthropic).await
                }
            )*
        }
    };
}

for_each_provider!(
    text_reply_streams_in_pieces_with_usage,
    two_tool_calls_with_awkwardly_split_arguments,
    invalid_tool_arguments_are_kept_raw,
    multibyte_text_split_inside_characters,
    rate_limit_with_retry_after_then_success,
    server_error_forever_fails_after_retries,
    overloaded_529_is_retried,
    cut_mid_reply_is_retried_from_scratch,
    cut_mid_reply_forever_fails_cleanly,
    stream_ending_before_the_reply_is_complete_is_retried,
    malformed_json_is_a_protocol_error,
    html_page_is_a_protocol_error,
    unauthorized_is_an_auth_error_without_the_key,
    not_found_and_bad_request_are_not_retried,
    idle_timeout_is_retried_then_fails,
    first_byte_timeout_is_retried,
    dropping_the_stream_closes_the_connection,
);
