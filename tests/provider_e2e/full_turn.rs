//! A full turn with tool calls (streamed multi-byte text, usage, messages, events), then the
//! next turn's request, which replays that history in the provider's own format.

use serde_json::{json, Value};

use crate::provider_e2e::*;
use crate::support::fakes::{self, FakeToolCall, Flavor, Reply};
use crate::support::{roles, run_events, README};

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

/// The text content of a tool result block (a string or text blocks).
fn tool_result_text(block: &Value) -> String {
    content_text(&block["content"])
}

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
