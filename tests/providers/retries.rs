//! What is retried, and how: 429 with `Retry-After`, 5xx (also 529), a reply cut mid-stream or
//! ended before it is complete (retried from scratch), an overloaded error event, a refused
//! connection; and the error once the retries run out.

use std::time::Duration;

use crate::providers::*;
use crate::support::fakes::{self, Flavor, Reply};

for_each_provider!(
    rate_limit_with_retry_after_then_success,
    server_error_forever_fails_after_retries,
    overloaded_529_is_retried,
    cut_mid_reply_is_retried_from_scratch,
    cut_mid_reply_forever_fails_cleanly,
    stream_ending_before_the_reply_is_complete_is_retried,
);

async fn rate_limit_with_retry_after_then_success(flavor: Flavor) {
    let server = fake(
        flavor,
        vec![
            Reply::status(429, error_body("slow down")).with_header("retry-after", "0"),
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
    let server = fake(flavor, vec![Reply::status(500, error_body("boom"))]).await;
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

/// The first half of a reply's events, for cutting the connection mid-reply.
fn first_half(flavor: Flavor) -> Vec<String> {
    let events = fakes::split_events(&text_reply(
        flavor,
        &["Partial ", "text ", "that ", "breaks"],
    ));
    events[..events.len() / 2].to_vec()
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
