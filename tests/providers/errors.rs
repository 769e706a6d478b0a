//! What fails at once, and how it reads: malformed JSON and HTML pages are protocol errors, a 401
//! is an auth error that never shows the key, 404 and 400 are not retried, an invalid request
//! error event is not retried, and an invalid configuration is refused.

use crate::providers::*;
use crate::support::fakes::{self, Flavor, Reply};

for_each_provider!(
    malformed_json_is_a_protocol_error,
    html_page_is_a_protocol_error,
    unauthorized_is_an_auth_error_without_the_key,
    not_found_and_bad_request_are_not_retried,
);

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
            Reply::status(404, error_body("model test-model does not exist")),
            Reply::status(400, error_body(&"x".repeat(2000))),
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
