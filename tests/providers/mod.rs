//! Black-box tests of the real providers (OpenAI-compatible and Anthropic) against the fake
//! provider server in `support::fakes`, most of them once per provider
//! (`<module>::openai::<case>`, `<module>::anthropic::<case>`):
//!
//! - `streaming`: text in pieces, tool-call assembly, UTF-8 across chunk boundaries, usage,
//!   cancellation by drop.
//! - `retries`: what is retried and how (backoff, `Retry-After`, broken streams).
//! - `errors`: protocol, auth and request errors, and invalid configurations.
//! - `timeouts`: first-byte and idle timeouts.
//! - `requests`: the exact shape of the requests sent.
//! - `thinking`: Anthropic's thinking blocks and the reasoning deltas of OpenAI-compatible
//!   servers, streamed and kept, and what of them each request sends back.
//! - `file`: the `--providers` file: `GET /v1/providers`, two configured providers serving at
//!   once with their own URLs, models and headers, and the refusals of a bad file.

use std::time::Duration;

use crate::support::fakes::{self, FakeServer, FakeToolCall, Flavor, Reply};
use futures::StreamExt;
use tah::llm::anthropic::AnthropicClient;
use tah::llm::openai::OpenAiClient;
use tah::llm::wire::{HttpModelConfig, RetryPolicy, Timeouts};
use tah::llm::{
    LlmError, LlmErrorKind, ModelClient, ModelReply, ModelRequest, Purpose, StreamItem,
};
use tah::model::{Message, Role, Usage};

const KEY: &str = "sk-test-SECRET-key-0123456789";

fn config(base_url: &str, retries: u32) -> HttpModelConfig {
    HttpModelConfig {
        base_url: base_url.to_string(),
        api_key: Some(KEY.to_string()),
        model: "test-model".to_string(),
        max_tokens: 1024,
        thinking_budget: None,
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
        headers: Vec::new(),
        pool: None,
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

/// An error body as OpenAI-compatible servers send it.
fn error_body(message: &str) -> String {
    serde_json::json!({ "error": { "message": message } }).to_string()
}

fn request(text: &str) -> ModelRequest<'static> {
    ModelRequest::owned(
        vec![
            Message::new(Role::System, "be brief"),
            Message::new(Role::User, text),
        ],
        vec![],
        Purpose::Turn,
    )
}

type Items = Vec<Result<StreamItem, LlmError>>;

async fn run(client: &dyn ModelClient, request: ModelRequest<'_>) -> Items {
    tokio::time::timeout(Duration::from_secs(20), client.stream(request).collect())
        .await
        .expect("the stream finishes")
}

/// The request a client of `flavor` sends for `request` (the fake answers `ok`), with its
/// configuration changed by `configure` first. Nothing is retried: the request sent is the
/// first one.
async fn request_sent(
    flavor: Flavor,
    configure: impl FnOnce(&mut HttpModelConfig),
    request: ModelRequest<'_>,
) -> crate::support::fakes::Recorded {
    let server = fake(flavor, vec![Reply::sse(text_reply(flavor, &["ok"]))]).await;
    let mut cfg = config(&server.base_url, 0);
    configure(&mut cfg);
    done(&run(&*client_with(flavor, cfg), request).await);
    assert!(server.violations().is_empty(), "{:?}", server.violations());
    server.requests().remove(0)
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

mod errors;
mod file;
mod requests;
mod retries;
mod streaming;
mod thinking;
mod timeouts;
