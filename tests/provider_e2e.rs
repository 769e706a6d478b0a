//! End-to-end tests of the real `tah` binary against fake LLM providers (`support::fakes`):
//! `tah serve --provider openai|anthropic --base-url <fake>` is driven over its HTTP API only,
//! and the fake records exactly what the server sent. The binary rather than the in-process
//! application, because the tests read the process's log (the API key must never be in it).
//!
//! For each provider: a full turn with tool calls (streamed multi-byte text, usage, messages,
//! events), the replay of that turn into the next request in the provider's own format, the
//! API key sent but never logged or leaked, 429/500 retried, 401 failing cleanly, a broken
//! stream retried without duplicated text, cancel during a slow stream, and a measurement of
//! the server's overhead per model request.

mod support;

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};
use support::fakes::{self, FakeServer, FakeToolCall, Flavor, Reply};
use support::{is_terminal, percentile, roles, run_events, ServerOptions, TestServer, README};

const OPENAI_KEY: &str = "sk-e2e-SECRET-openai-5b1f0c9e77a2";
const ANTHROPIC_KEY: &str = "sk-ant-e2e-SECRET-anthropic-93d4c1aa08";
const MODEL: &str = "e2e-model";
const SYSTEM_PROMPT: &str = "You are the e2e test assistant.";

/// The README as `read_file` shows it: lines numbered as `cat -n` does.
fn readme_as_read() -> String {
    README
        .split_inclusive('\n')
        .enumerate()
        .map(|(i, line)| format!("{:>6}\t{line}", i + 1))
        .collect()
}
const FINAL_TEXT: &str = "Done: héllo 世界 🎉";
const FINAL_PIECES: &[&str] = &["Done: h", "é", "llo 世", "界 🎉"];

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

// ---- the server under test ----------------------------------------------------------------

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

// ---- helpers ------------------------------------------------------------------------------

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

/// The two tool calls of the first step, their arguments split awkwardly.
fn two_tool_calls() -> Vec<FakeToolCall> {
    vec![
        FakeToolCall::new("call_list_1", "list_files", &["{\"pa", "th\": ", "\".\"}"]),
        FakeToolCall::new(
            "call_read_2",
            "read_file",
            &["", "{\"path\":\"REA", "DME.md\"", "}"],
        ),
    ]
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

/// The text content of a tool result block (a string or text blocks).
fn tool_result_text(block: &Value) -> String {
    content_text(&block["content"])
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

// ---- a full turn with tool calls, then its replay into the next request ---------------------

async fn full_turn_and_replay(flavor: Flavor) {
    let provider = provider_name(flavor);
    let final_body = text_reply(flavor, FINAL_PIECES);
    let fake = fakes::start(
        flavor,
        vec![
            Reply::sse_events(&tool_calls_reply(flavor, &two_tool_calls())),
            // Network chunks split inside every multi-byte character.
            Reply::sse_chunks(fakes::split_inside_chars(&final_body)),
            Reply::sse_events(&text_reply(flavor, &["Second ", "answer."])),
        ],
    )
    .await;
    let server = start_server(flavor, &fake).await;
    let id = server.create_session().await;

    // Turn 1: list_files + read_file, then the streamed text.
    let result = server.run_wait(&id, "What is in this workspace?").await;
    assert_eq!(result["status"], "completed", "{provider}: {result}");
    assert_eq!(result["text"], FINAL_TEXT, "{provider}: {result}");
    assert_eq!(result["finish_reason"], "stop", "{provider}: {result}");
    let two_steps = usage(2 * fakes::INPUT_TOKENS, 2 * fakes::OUTPUT_TOKENS);
    assert_eq!(
        result["usage"], two_steps,
        "{provider}: run usage: {result}"
    );
    assert_eq!(fake.request_count(), 2, "{provider}: requests of turn 1");

    let messages = server.messages(&id).await;
    let roles = roles(&messages);
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "tool", "assistant"],
        "{provider}: messages: {}",
        Value::Array(messages.clone())
    );
    assert_eq!(messages[0]["content"], SYSTEM_PROMPT);
    assert_eq!(messages[1]["content"], "What is in this workspace?");
    let calls = messages[2]["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 2, "{provider}: {}", messages[2]);
    assert_eq!(calls[0]["id"], "call_list_1");
    assert_eq!(calls[0]["name"], "list_files");
    assert_eq!(calls[0]["arguments"], json!({"path": "."}));
    assert_eq!(calls[1]["id"], "call_read_2");
    assert_eq!(calls[1]["name"], "read_file");
    assert_eq!(calls[1]["arguments"], json!({"path": "README.md"}));
    assert_eq!(
        messages[2]["content"].as_str().unwrap_or(""),
        "",
        "{provider}: the tool-call message has no text"
    );
    assert_eq!(messages[3]["tool_call_id"], "call_list_1");
    let listing = messages[3]["content"].as_str().expect("listing");
    let entries: Vec<&str> = listing.lines().collect();
    assert!(
        entries.contains(&"README.md") && entries.iter().any(|e| e.trim_end_matches('/') == "src"),
        "{provider}: list_files output: {listing:?}"
    );
    assert_eq!(messages[4]["tool_call_id"], "call_read_2");
    assert_eq!(
        messages[4]["content"],
        readme_as_read(),
        "{provider}: read_file output"
    );
    assert_eq!(messages[5]["content"], FINAL_TEXT);
    assert!(
        messages[5]["tool_calls"]
            .as_array()
            .is_none_or(|c| c.is_empty()),
        "{provider}: {}",
        messages[5]
    );

    // Events of turn 1.
    let events = server.events(&id).await;
    let run_id = result["run_id"].as_str().expect("run_id");
    let run = run_events(&events, run_id);
    let deltas: String = of_type(run, "agent.assistant-stream")
        .iter()
        .map(|e| e["data"]["text"].as_str().expect("delta text"))
        .collect();
    assert_eq!(deltas, FINAL_TEXT, "{provider}: streamed deltas");
    let completed = of_type(run, "llm.completed");
    assert_eq!(completed.len(), 2, "{provider}: llm.completed events");
    let mut sum = (0u64, 0u64);
    for event in &completed {
        assert_eq!(
            event["data"]["usage"],
            usage(fakes::INPUT_TOKENS, fakes::OUTPUT_TOKENS),
            "{provider}: llm.completed usage: {event}"
        );
        sum.0 += event["data"]["usage"]["input_tokens"].as_u64().unwrap();
        sum.1 += event["data"]["usage"]["output_tokens"].as_u64().unwrap();
    }
    assert_eq!(result["usage"], usage(sum.0, sum.1));
    assert_eq!(completed[0]["data"]["finish_reason"], "tool_calls");
    assert_eq!(completed[1]["data"]["finish_reason"], "stop");
    let tools_finished = of_type(run, "tool.finished");
    assert_eq!(tools_finished.len(), 2, "{provider}: tool.finished events");
    assert!(tools_finished
        .iter()
        .all(|e| e["data"]["is_error"] == false));
    let finished = of_type(run, "agent.finished");
    assert_eq!(finished.len(), 1);
    assert_eq!(finished[0]["data"]["text"], FINAL_TEXT);
    assert_eq!(finished[0]["data"]["usage"], two_steps);
    assert!(
        of_type(run, "llm.retry").is_empty(),
        "{provider}: no retries"
    );

    let session = server.session(&id).await;
    assert_eq!(session["state"], "completed");
    assert_eq!(session["usage"], two_steps, "{provider}: session usage");

    // The request of turn 1's second step carries the tool results.
    let second = fake.body(1);
    let second_text = second.to_string();
    assert!(second_text.contains("Demo is a small sample project."));

    // Turn 2: a plain reply; its request replays the whole history.
    let result2 = server.run_wait(&id, "And now?").await;
    assert_eq!(result2["status"], "completed", "{provider}: {result2}");
    assert_eq!(result2["text"], "Second answer.");
    assert_eq!(
        result2["usage"],
        usage(fakes::INPUT_TOKENS, fakes::OUTPUT_TOKENS)
    );
    assert_eq!(fake.request_count(), 3);
    let session = server.session(&id).await;
    assert_eq!(
        session["usage"],
        usage(3 * fakes::INPUT_TOKENS, 3 * fakes::OUTPUT_TOKENS),
        "{provider}: session usage after turn 2"
    );

    let recorded = fake.requests();
    for r in &recorded {
        match flavor {
            Flavor::OpenAi => {
                assert_eq!(r.path, "/v1/chat/completions");
                assert_eq!(
                    r.headers.get("authorization").map(String::as_str),
                    Some(format!("Bearer {OPENAI_KEY}").as_str()),
                    "the OpenAI key header"
                );
            }
            Flavor::Anthropic => {
                assert_eq!(r.path, "/v1/messages");
                assert_eq!(
                    r.headers.get("x-api-key").map(String::as_str),
                    Some(ANTHROPIC_KEY),
                    "the Anthropic key header"
                );
                assert!(r.headers.contains_key("anthropic-version"));
            }
        }
        assert_eq!(r.body["model"], MODEL);
        assert_eq!(r.body["stream"], true);
        let tools = r.body["tools"].as_array().expect("tools are sent");
        let names: Vec<String> = tools
            .iter()
            .map(|t| {
                t["name"]
                    .as_str()
                    .or(t["function"]["name"].as_str())
                    .unwrap_or("?")
                    .to_string()
            })
            .collect();
        assert!(
            names.contains(&"list_files".to_string()) && names.contains(&"read_file".to_string()),
            "tools sent: {names:?}"
        );
    }
    let replay = &recorded[2].body;
    match flavor {
        Flavor::OpenAi => assert_openai_replay(replay),
        Flavor::Anthropic => assert_anthropic_replay(replay),
    }

    assert_key_never_shown(&server, flavor, &id).await;
}

fn assert_openai_replay(body: &Value) {
    let messages = body["messages"].as_array().expect("messages");
    let roles = roles(messages);
    assert_eq!(
        roles,
        [
            "system",
            "user",
            "assistant",
            "tool",
            "tool",
            "assistant",
            "user"
        ],
        "replayed messages: {body}"
    );
    assert_eq!(messages[0]["content"], SYSTEM_PROMPT);
    assert_eq!(messages[1]["content"], "What is in this workspace?");
    let assistant = &messages[2];
    assert!(
        assistant["content"].is_null() || assistant["content"] == "",
        "the tool-call message's content must be null or empty: {assistant}"
    );
    let calls = assistant["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 2, "{assistant}");
    let expected = [
        ("call_list_1", "list_files", json!({"path": "."})),
        ("call_read_2", "read_file", json!({"path": "README.md"})),
    ];
    for (call, (id, name, args)) in calls.iter().zip(expected.iter()) {
        assert_eq!(call["id"], *id);
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], *name);
        let raw = call["function"]["arguments"]
            .as_str()
            .unwrap_or_else(|| panic!("arguments must be a JSON string: {call}"));
        let parsed: Value = serde_json::from_str(raw).expect("arguments parse as JSON");
        assert_eq!(&parsed, args);
    }
    assert_eq!(messages[3]["tool_call_id"], "call_list_1");
    assert!(messages[3]["content"]
        .as_str()
        .expect("tool content is a string")
        .contains("README.md"));
    assert_eq!(messages[4]["tool_call_id"], "call_read_2");
    assert_eq!(messages[4]["content"], readme_as_read());
    assert_eq!(messages[5]["content"], FINAL_TEXT);
    assert!(messages[5]
        .get("tool_calls")
        .is_none_or(|c| c.is_null() || c.as_array().is_some_and(|a| a.is_empty())));
    assert_eq!(messages[6]["content"], "And now?");
}

fn assert_anthropic_replay(body: &Value) {
    assert_eq!(
        content_text(&body["system"]),
        SYSTEM_PROMPT,
        "the system field: {body}"
    );
    let max_tokens = body["max_tokens"].as_u64().expect("max_tokens is present");
    assert!(max_tokens > 0);
    let messages = body["messages"].as_array().expect("messages");
    assert!(
        messages.iter().all(|m| m["role"] != "system"),
        "no system role in messages: {body}"
    );
    let roles = roles(messages);
    assert_eq!(
        roles,
        ["user", "assistant", "user", "assistant", "user"],
        "roles must alternate: {body}"
    );
    assert_eq!(
        content_text(&messages[0]["content"]),
        "What is in this workspace?"
    );
    let blocks = messages[1]["content"].as_array().expect("assistant blocks");
    let tool_uses: Vec<&Value> = blocks.iter().filter(|b| b["type"] == "tool_use").collect();
    assert_eq!(tool_uses.len(), 2, "tool_use blocks: {}", messages[1]);
    assert!(
        blocks
            .iter()
            .all(|b| b["type"] != "text" || !b["text"].as_str().unwrap_or("").is_empty()),
        "no empty text block: {}",
        messages[1]
    );
    assert_eq!(tool_uses[0]["id"], "call_list_1");
    assert_eq!(tool_uses[0]["name"], "list_files");
    assert_eq!(tool_uses[0]["input"], json!({"path": "."}));
    assert_eq!(tool_uses[1]["id"], "call_read_2");
    assert_eq!(tool_uses[1]["name"], "read_file");
    assert_eq!(tool_uses[1]["input"], json!({"path": "README.md"}));
    let results = messages[2]["content"]
        .as_array()
        .expect("tool_result blocks");
    let results: Vec<&Value> = results
        .iter()
        .filter(|b| b["type"] == "tool_result")
        .collect();
    assert_eq!(
        results.len(),
        2,
        "both results in one user message: {}",
        messages[2]
    );
    assert_eq!(results[0]["tool_use_id"], tool_uses[0]["id"]);
    assert_eq!(results[1]["tool_use_id"], tool_uses[1]["id"]);
    assert!(tool_result_text(results[0]).contains("README.md"));
    assert_eq!(tool_result_text(results[1]), readme_as_read());
    assert!(results.iter().all(|r| r["is_error"] != true));
    assert_eq!(content_text(&messages[3]["content"]), FINAL_TEXT);
    assert_eq!(content_text(&messages[4]["content"]), "And now?");
}

both_providers!(full_turn_and_replay: openai_full_turn_with_tools_and_replay, anthropic_full_turn_with_tools_and_replay);

// ---- retries ------------------------------------------------------------------------------

async fn retried_then_completes(flavor: Flavor, first: Reply, code: &str) {
    let provider = provider_name(flavor);
    let fake = fakes::start(
        flavor,
        vec![
            first,
            Reply::sse_events(&text_reply(flavor, &["After ", "retry."])),
        ],
    )
    .await;
    let server = start_server(flavor, &fake).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "hello").await;
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
    let assistants: Vec<&Value> = messages
        .iter()
        .filter(|m| m["role"] == "assistant")
        .collect();
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

// ---- 401 fails cleanly --------------------------------------------------------------------

async fn unauthorized_fails_cleanly(flavor: Flavor) {
    let provider = provider_name(flavor);
    let key = key_of(flavor);
    // A provider that echoes the key it was given (as some do): it must still not leak.
    let body = match flavor {
        Flavor::OpenAi => format!(
            r#"{{"error":{{"message":"Incorrect API key provided: {key}.","type":"invalid_request_error","code":"invalid_api_key"}}}}"#
        ),
        Flavor::Anthropic => format!(
            r#"{{"type":"error","error":{{"type":"authentication_error","message":"invalid x-api-key {key}"}}}}"#
        ),
    };
    let fake = fakes::start(flavor, vec![Reply::status(401, body)]).await;
    let server = start_server(flavor, &fake).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "hello").await;
    assert_eq!(result["status"], "failed", "{provider}: {result}");
    assert_eq!(fake.request_count(), 1, "{provider}: a 401 is not retried");
    let error = result["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error: {result}"));
    assert!(
        !error.contains(key),
        "{provider}: the key leaks into the run error: {error}"
    );

    let events = server.events(&id).await;
    let failed = of_type(&events, "agent.failed");
    assert_eq!(failed.len(), 1, "{provider}: agent.failed");
    let error = failed[0]["data"]["error"]
        .as_str()
        .expect("agent.failed error");
    assert!(
        error.contains(provider),
        "{provider}: the error should name the provider: {error:?}"
    );
    assert!(
        error.to_lowercase().contains("authentication failed"),
        "{provider}: the error should say authentication failed: {error:?}"
    );
    assert!(!error.contains(key), "{provider}: the key leaks: {error}");
    assert!(of_type(&events, "agent.finished").is_empty());

    let session = server.session(&id).await;
    assert_eq!(session["state"], "failed", "{provider}: {session}");
    let messages = server.messages(&id).await;
    let roles = roles(&messages);
    assert_eq!(
        roles,
        ["system", "user"],
        "{provider}: no half assistant message"
    );
    assert_key_never_shown(&server, flavor, &id).await;
}

both_providers!(unauthorized_fails_cleanly: openai_401_fails_cleanly, anthropic_401_fails_cleanly);

// ---- a broken stream is retried without duplicated text ------------------------------------

async fn cut_stream_then_success(flavor: Flavor) {
    let provider = provider_name(flavor);
    let broken = text_reply(flavor, &["Partial ", "answer "]);
    let events = fakes::split_events(&broken);
    let last = events
        .iter()
        .rposition(|e| e.contains("answer "))
        .expect("the second piece");
    let cut = Reply::cut(events[..=last].to_vec());
    let fake = fakes::start(
        flavor,
        vec![
            cut,
            Reply::sse_events(&text_reply(flavor, &["Complete ", "answer."])),
        ],
    )
    .await;
    let server = start_server(flavor, &fake).await;
    let id = server.create_session().await;
    let result = server.run_wait(&id, "hello").await;
    assert_eq!(result["status"], "completed", "{provider}: {result}");
    assert_eq!(result["text"], "Complete answer.", "{provider}: {result}");
    assert_eq!(fake.request_count(), 2);

    let messages = server.messages(&id).await;
    let assistants: Vec<&Value> = messages
        .iter()
        .filter(|m| m["role"] == "assistant")
        .collect();
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

// ---- cancel during a slow stream -----------------------------------------------------------

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

both_providers!(cancel_during_slow_stream: openai_cancel_during_slow_stream, anthropic_cancel_during_slow_stream);

// ---- overhead per request ------------------------------------------------------------------

async fn overhead(flavor: Flavor) {
    const TURNS: usize = 20;
    let provider = provider_name(flavor);
    let fake = fakes::start(
        flavor,
        vec![Reply::sse(text_reply(flavor, &["Short ", "reply."]))],
    )
    .await;

    // The fake alone: the same reply fetched directly, body read to the end.
    let direct = reqwest::Client::new();
    let url = match flavor {
        Flavor::OpenAi => format!("{}/chat/completions", fake.base_url),
        Flavor::Anthropic => format!("{}/v1/messages", fake.base_url),
    };
    let mut alone = Vec::new();
    for _ in 0..TURNS + 1 {
        let started = Instant::now();
        let response = direct
            .post(&url)
            .json(&json!({"model": MODEL, "stream": true, "messages": []}))
            .send()
            .await
            .expect("call the fake");
        assert!(response.status().is_success());
        let body = response.bytes().await.expect("the fake's body");
        assert!(!body.is_empty());
        alone.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    alone.remove(0); // connection set-up
    alone.sort_by(f64::total_cmp);
    let fake_median = percentile(&alone, 50.0);
    let direct_requests = fake.request_count();

    let server = start_server(flavor, &fake).await;
    let id = server.create_session().await;
    let mut overheads = Vec::new();
    for turn in 0..TURNS {
        let started = Instant::now();
        let result = server.run_wait(&id, &format!("turn {turn}")).await;
        let took = started.elapsed().as_secs_f64() * 1000.0;
        assert_eq!(
            result["status"], "completed",
            "{provider} turn {turn}: {result}"
        );
        assert_eq!(result["text"], "Short reply.");
        overheads.push(took - fake_median);
    }
    assert_eq!(fake.request_count() - direct_requests, TURNS);
    overheads.sort_by(f64::total_cmp);
    eprintln!(
        "provider overhead per request: {provider} median {:.2} ms p90 {:.2} ms \
         (fake alone: median {:.2} ms; {TURNS} turns of POST /runs?wait=true, one model call each)",
        percentile(&overheads, 50.0),
        percentile(&overheads, 90.0),
        fake_median,
    );
}

both_providers!(overhead: openai_overhead_per_request, anthropic_overhead_per_request);
