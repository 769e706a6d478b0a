//! End-to-end tests of the real `tah` binary against fake LLM providers (`support::fakes`):
//! `tah serve --provider openai|anthropic --base-url <fake>` is driven over its HTTP API only,
//! and the fake records exactly what the server sent. The binary rather than the in-process
//! application, because the tests read the process's log (the API key must never be in it).
//!
//! For each provider, one module per flow:
//!
//! - `full_turn`: a full turn with tool calls (streamed multi-byte text, usage, messages,
//!   events), and the replay of that turn into the next request in the provider's own format.
//! - `retries`: 429/500 retried, and a broken stream retried without duplicated text.
//! - `unauthorized`: a 401 failing cleanly.
//! - `cancel`: cancel during a slow stream.
//! - `overhead`: a measurement of the server's overhead per model request.
//! - `thinking`: a turn whose replies think (Anthropic with `--thinking-budget`, reasoning
//!   deltas for OpenAI-compatible servers): streamed, stored, shown as steps, and sent back in
//!   the next request as each API requires.
//!
//! In every flow the API key is sent but never logged or leaked.

use crate::support::fakes::{self, FakeServer, FakeToolCall, Flavor};
use crate::support::{ServerOptions, TestServer};
use serde_json::{json, Value};

const OPENAI_KEY: &str = "sk-e2e-SECRET-openai-5b1f0c9e77a2";

const ANTHROPIC_KEY: &str = "sk-ant-e2e-SECRET-anthropic-93d4c1aa08";

const MODEL: &str = "e2e-model";

const SYSTEM_PROMPT: &str = "You are the e2e test assistant.";

/// A test per provider of one body taking the provider's flavor.
macro_rules! both_providers {
    ($body:ident: $openai:ident, $anthropic:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $openai() {
            $body(Flavor::OpenAi).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $anthropic() {
            $body(Flavor::Anthropic).await;
        }
    };
}

fn provider_name(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::OpenAi => "openai",
        Flavor::Anthropic => "anthropic",
    }
}

fn key_of(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::OpenAi => OPENAI_KEY,
        Flavor::Anthropic => ANTHROPIC_KEY,
    }
}

fn key_env(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::OpenAi => "OPENAI_API_KEY",
        Flavor::Anthropic => "ANTHROPIC_API_KEY",
    }
}

/// Starts `tah serve` against `fake` with the provider's key in its environment variable.
async fn start_server(flavor: Flavor, fake: &FakeServer) -> TestServer {
    start_server_with(flavor, fake, &[]).await
}

/// [`start_server`] with more arguments.
async fn start_server_with(flavor: Flavor, fake: &FakeServer, more: &[&str]) -> TestServer {
    TestServer::start(
        ServerOptions::new()
            .process()
            .args(&[
                "--provider",
                provider_name(flavor),
                "--base-url",
                &fake.base_url,
            ])
            .args(&[
                "--model",
                MODEL,
                "--system-prompt",
                SYSTEM_PROMPT,
                "--max-steps",
                "10",
            ])
            .args(more)
            .rust_log("info,tah=debug")
            .env(key_env(flavor), key_of(flavor))
            .paged_by(100),
    )
    .await
}

/// Asserts that the key appears nowhere the server shows: its log, events, messages,
/// steps (and each step's recorded request) and runs.
async fn assert_key_never_shown(server: &TestServer, flavor: Flavor, id: &str) {
    let key = key_of(flavor);
    let log = server.log();
    assert!(
        log.contains("listening on http://"),
        "the server's log was not captured:\n{log}"
    );
    assert!(
        !log.contains(key),
        "the API key appears in the server's log:\n{log}"
    );
    let events = Value::Array(server.events(id).await).to_string();
    assert!(
        !events.contains(key),
        "the API key appears in an event: {events}"
    );
    let messages = Value::Array(server.messages(id).await).to_string();
    assert!(!messages.contains(key), "the API key appears in a message");
    let steps = server
        .pages(&format!("/v1/sessions/{id}/steps"), "cursor")
        .await;
    for step in &steps {
        if let Some(step_id) = step["id"].as_str() {
            let detail = server
                .get_ok(&format!("/v1/sessions/{id}/steps/{step_id}"))
                .await;
            assert!(
                !detail.to_string().contains(key),
                "the API key appears in step {step_id}: {detail}"
            );
        }
    }
    let runs = server
        .pages(&format!("/v1/sessions/{id}/runs"), "cursor")
        .await;
    assert!(
        !Value::Array(runs).to_string().contains(key),
        "the API key appears in a run"
    );
    let session = server.session(id).await;
    assert!(!session.to_string().contains(key));
}

fn text_reply(flavor: Flavor, pieces: &[&str]) -> String {
    match flavor {
        Flavor::OpenAi => fakes::openai::text_reply(pieces),
        Flavor::Anthropic => fakes::anthropic::text_reply(pieces),
    }
}

fn tool_calls_reply(flavor: Flavor, calls: &[FakeToolCall]) -> String {
    match flavor {
        Flavor::OpenAi => fakes::openai::tool_calls_reply("", calls),
        Flavor::Anthropic => fakes::anthropic::tool_calls_reply("", calls),
    }
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

fn usage(input: u64, output: u64) -> Value {
    json!({"input_tokens": input, "output_tokens": output})
}

/// The text of a message content: a string, or an array of `text` blocks.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter(|b| b["type"] == "text")
            .filter_map(|b| b["text"].as_str())
            .collect(),
        _ => String::new(),
    }
}

mod cancel;
mod full_turn;
mod overhead;
mod retries;
mod thinking;
mod unauthorized;
