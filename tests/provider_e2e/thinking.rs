//! A turn whose two replies think, through the real server: Anthropic with
//! `--thinking-budget` (signed `thinking` and `redacted_thinking` blocks) and an
//! OpenAI-compatible server streaming `reasoning_content`, then `reasoning`. The reasoning
//! streams as `agent.thinking-stream`, is kept in `message.thinking` (messages and
//! `llm.completed`), shows as a `thinking` step after each LLM step, and goes back in the next
//! request of the turn exactly as it came for Anthropic, never for OpenAI.

use serde_json::{json, Value};

use crate::provider_e2e::*;
use crate::support::fakes::anthropic::{blocks_reply, Block};
use crate::support::fakes::{self, FakeToolCall, Flavor, Reply};
use crate::support::{id_of, roles, run_events};

const BUDGET: u64 = 2048;

/// The default `--max-output-tokens`.
const MAX_OUTPUT_TOKENS: u64 = 8192;

const SIGNATURE: &str = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds+/Pz==";
const REDACTED: &str = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP==";
const SECOND_SIGNATURE: &str = "ErUBCkYIBRgCIkBTr1pZ==";

/// The reasoning of the first reply, in pieces split inside characters on the wire.
const FIRST_PIECES: &[&str] = &["The user asks what is here: ", "「世界」", " 🤔\nI list."];
const FIRST: &str = "The user asks what is here: 「世界」 🤔\nI list.";
const SECOND_PIECES: &[&str] = &["I have the ", "listing — done."];
const SECOND: &str = "I have the listing — done.";
const ANSWER: &str = "Here: README.md, src/ 🎉";

fn list_call() -> FakeToolCall {
    FakeToolCall::new("call_list_1", "list_files", &["{\"path\"", ": \".\"}"])
}

/// The two replies of the turn, then a plain one for the next turn, as `flavor` streams them.
fn script(flavor: Flavor) -> Vec<Reply> {
    let call = list_call();
    let (first, second) = match flavor {
        Flavor::Anthropic => (
            blocks_reply(
                &[
                    Block::Thinking {
                        pieces: FIRST_PIECES,
                        signature: SIGNATURE,
                    },
                    Block::Redacted(REDACTED),
                    Block::Tool(&call),
                ],
                "tool_use",
            ),
            blocks_reply(
                &[
                    Block::Thinking {
                        pieces: SECOND_PIECES,
                        signature: SECOND_SIGNATURE,
                    },
                    Block::Text(&["Here: ", "README.md, src/ 🎉"]),
                ],
                "end_turn",
            ),
        ),
        Flavor::OpenAi => (
            fakes::openai::reasoning_reply(
                &["reasoning_content"],
                FIRST_PIECES,
                &[],
                std::slice::from_ref(&call),
            ),
            fakes::openai::reasoning_reply(
                &["reasoning"],
                SECOND_PIECES,
                &["Here: ", "README.md, src/ 🎉"],
                &[],
            ),
        ),
    };
    vec![
        Reply::sse_chunks(fakes::split_inside_chars(&first)),
        Reply::sse_chunks(fakes::split_inside_chars(&second)),
        Reply::sse_events(&text_reply(flavor, &["Again."])),
    ]
}

/// The thinking of each assistant message as the API serves it.
fn expected_thinking(flavor: Flavor) -> [Value; 2] {
    match flavor {
        Flavor::Anthropic => [
            json!([
                {"type": "thinking", "thinking": FIRST, "signature": SIGNATURE},
                {"type": "redacted_thinking", "data": REDACTED},
            ]),
            json!([{"type": "thinking", "thinking": SECOND, "signature": SECOND_SIGNATURE}]),
        ],
        Flavor::OpenAi => [
            json!([{"type": "thinking", "thinking": FIRST}]),
            json!([{"type": "thinking", "thinking": SECOND}]),
        ],
    }
}

async fn thinking_turn(flavor: Flavor) {
    let provider = provider_name(flavor);
    let fake = fakes::start(flavor, script(flavor)).await;
    let budget = BUDGET.to_string();
    let server = start_server_with(flavor, &fake, &["--thinking-budget", &budget]).await;
    let id = server.create_session().await;

    let result = server.run_wait(&id, "What is in this workspace?").await;
    assert_eq!(result["status"], "completed", "{provider}: {result}");
    assert_eq!(result["text"], ANSWER, "{provider}: {result}");
    assert_eq!(
        result["steps"], 2,
        "{provider}: thinking steps are not LLM steps"
    );
    let run_id = result["run_id"].as_str().expect("run_id");

    // Messages: each reply keeps its thinking.
    let messages = server.messages(&id).await;
    assert_eq!(
        roles(&messages),
        ["system", "user", "assistant", "tool", "assistant"],
        "{provider}"
    );
    let [first, second] = expected_thinking(flavor);
    assert_eq!(
        messages[2]["thinking"], first,
        "{provider}: {}",
        messages[2]
    );
    assert_eq!(
        messages[4]["thinking"], second,
        "{provider}: {}",
        messages[4]
    );
    assert_eq!(messages[4]["content"], ANSWER);
    for m in [&messages[0], &messages[1], &messages[3]] {
        assert!(m.get("thinking").is_none(), "{provider}: {m}");
    }

    // Events: the reasoning streams per LLM step before its text, then `llm.completed`
    // carries it in `message.thinking`.
    let events = server.events(&id).await;
    let run = run_events(&events, run_id);
    let step_ids: Vec<&str> = of_type(run, "llm.started")
        .iter()
        .map(|e| e["data"]["step_id"].as_str().expect("step_id"))
        .collect();
    assert_eq!(step_ids.len(), 2, "{provider}");
    for (step_id, text) in step_ids.iter().zip([FIRST, SECOND]) {
        let of_step = |kind: &str| -> Vec<usize> {
            run.iter()
                .enumerate()
                .filter(|(_, e)| e["type"] == kind && e["data"]["step_id"] == *step_id)
                .map(|(at, _)| at)
                .collect()
        };
        let streamed: String = of_step("agent.thinking-stream")
            .iter()
            .map(|at| run[*at]["data"]["text"].as_str().expect("text"))
            .collect();
        assert_eq!(streamed, text, "{provider}: streamed thinking of {step_id}");
        assert!(
            of_step("agent.thinking-stream").len() >= 2,
            "{provider}: it streamed in pieces"
        );
        let last_thinking = *of_step("agent.thinking-stream").last().unwrap();
        let first_text = of_step("agent.assistant-stream").first().copied();
        assert!(first_text.is_none_or(|t| last_thinking < t), "{provider}");
        assert!(last_thinking < of_step("llm.completed")[0], "{provider}");
    }
    let completed = of_type(run, "llm.completed");
    assert_eq!(completed[0]["data"]["message"]["thinking"], first);
    assert_eq!(completed[1]["data"]["message"]["thinking"], second);

    // Steps: a thinking step after each LLM step, naming it, with the readable text.
    let steps = server.steps(&id).await;
    let types: Vec<&str> = steps.iter().filter_map(|s| s["type"].as_str()).collect();
    assert_eq!(
        types,
        ["llm", "thinking", "tool", "llm", "thinking"],
        "{provider}: {steps:#?}"
    );
    let redacted = match flavor {
        Flavor::Anthropic => 1,
        Flavor::OpenAi => 0,
    };
    for (at, text, redacted) in [(1, FIRST, redacted), (4, SECOND, 0)] {
        let step = &steps[at];
        assert_eq!(step["content"], text, "{provider}: {step}");
        assert_eq!(
            step["llm_step_id"],
            steps[at - 1]["id"],
            "{provider}: {step}"
        );
        assert_eq!(step["run_id"], run_id);
        assert_eq!(step["redacted"].as_u64().unwrap_or(0), redacted, "{step}");
        let detail = server
            .get_ok(&format!("/v1/sessions/{id}/steps/{}", id_of(step)))
            .await;
        assert_eq!(detail["content"], text, "{provider}: {detail}");
    }

    // The next turn: thinking of a finished turn is not sent back.
    let again = server.run_wait(&id, "And now?").await;
    assert_eq!(again["status"], "completed", "{provider}: {again}");
    assert_eq!(fake.request_count(), 3, "{provider}");
    let bodies: Vec<Value> = fake.requests().into_iter().map(|r| r.body).collect();
    match flavor {
        Flavor::Anthropic => assert_anthropic_requests(&bodies),
        Flavor::OpenAi => assert_openai_requests(&bodies),
    }
    assert!(fake.violations().is_empty(), "{:?}", fake.violations());
    assert_key_never_shown(&server, flavor, &id).await;
}

fn assert_anthropic_requests(bodies: &[Value]) {
    for body in bodies {
        assert_eq!(
            body["thinking"],
            json!({"type": "enabled", "budget_tokens": BUDGET}),
            "{body}"
        );
        assert_eq!(body["max_tokens"], MAX_OUTPUT_TOKENS + BUDGET, "{body}");
    }
    // The turn's second request sends the first reply back: its thinking blocks first, as
    // they came, signature included.
    let messages = bodies[1]["messages"].as_array().expect("messages");
    assert_eq!(roles(messages), ["user", "assistant", "user"]);
    assert_eq!(
        messages[1]["content"],
        json!([
            {"type": "thinking", "thinking": FIRST, "signature": SIGNATURE},
            {"type": "redacted_thinking", "data": REDACTED},
            {"type": "tool_use", "id": "call_list_1", "name": "list_files",
             "input": {"path": "."}},
        ])
    );
    assert_eq!(messages[2]["content"][0]["type"], "tool_result");
    // The next turn's request leaves the finished turn's thinking out.
    let next = bodies[2]["messages"].as_array().expect("messages");
    assert_eq!(
        roles(next),
        ["user", "assistant", "user", "assistant", "user"]
    );
    let text = bodies[2].to_string();
    for secret in [SIGNATURE, REDACTED, SECOND_SIGNATURE] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    assert_eq!(next[1]["content"][0]["type"], "tool_use", "{}", next[1]);
    assert_eq!(content_text(&next[3]["content"]), ANSWER);
}

fn assert_openai_requests(bodies: &[Value]) {
    for body in bodies {
        let text = body.to_string();
        for word in ["reasoning", "thinking", FIRST, SECOND] {
            assert!(!text.contains(word), "{word} in {text}");
        }
        for m in body["messages"].as_array().expect("messages") {
            let keys: Vec<&str> = m
                .as_object()
                .expect("object")
                .keys()
                .map(|k| k.as_str())
                .collect();
            assert!(
                keys.iter()
                    .all(|k| ["role", "content", "tool_calls", "tool_call_id"].contains(k)),
                "{m}"
            );
        }
    }
    let messages = bodies[1]["messages"].as_array().expect("messages");
    assert_eq!(roles(messages), ["system", "user", "assistant", "tool"]);
    assert_eq!(messages[2]["tool_calls"][0]["id"], "call_list_1");
}

both_providers!(thinking_turn: openai_reasoning_is_recorded_and_not_sent_back, anthropic_thinking_is_recorded_and_sent_back_within_the_turn);
