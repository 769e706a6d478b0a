//! Reasoning: Anthropic's `thinking` and `redacted_thinking` blocks (streamed, kept with their
//! signatures, asked for with a budget and sent back as they came), and the `reasoning_content`
//! and `reasoning` deltas of OpenAI-compatible servers (streamed, kept, never sent back); both
//! split across chunks and inside characters.

use serde_json::{json, Value};
use tah::llm::wire::HttpModelConfig;
use tah::model::{ThinkingBlock, ToolCall};

use crate::providers::*;
use crate::support::fakes::anthropic::{blocks_reply, Block};
use crate::support::fakes::{self, FakeToolCall, Flavor, Reply};

/// The reasoning streamed, in order.
fn thinking(items: &Items) -> Vec<String> {
    items
        .iter()
        .filter_map(|i| match i {
            Ok(StreamItem::Thinking(t)) => Some(t.clone()),
            _ => None,
        })
        .collect()
}

/// Asserts that every piece of reasoning streamed before the first piece of text.
fn assert_thinking_first(items: &Items) {
    let first_text = items
        .iter()
        .position(|i| matches!(i, Ok(StreamItem::Delta(_))))
        .unwrap_or(items.len());
    let last_thinking = items
        .iter()
        .rposition(|i| matches!(i, Ok(StreamItem::Thinking(_))))
        .expect("some thinking streamed");
    assert!(last_thinking < first_text, "{items:?}");
}

fn signed(text: &str, signature: &str) -> ThinkingBlock {
    ThinkingBlock::Thinking {
        thinking: text.into(),
        signature: Some(signature.into()),
    }
}

const SIGNATURE: &str = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds+/Pz==";
const REDACTED: &str = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP==";

fn list_call() -> FakeToolCall {
    FakeToolCall::new("toolu_01", "list_files", &["{\"path\"", ": \".\"}"])
}

#[tokio::test]
async fn anthropic_thinking_and_redacted_blocks_stream_and_keep_their_signatures() {
    let call = list_call();
    let body = blocks_reply(
        &[
            Block::Thinking {
                pieces: &["The user wants", " the files: ", "世界 🤔"],
                signature: SIGNATURE,
            },
            Block::Redacted(REDACTED),
            Block::Thinking {
                pieces: &["Then list."],
                signature: "sig-2",
            },
            Block::Text(&["Look", "ing."]),
            Block::Tool(&call),
        ],
        "tool_use",
    );
    // Network chunks of 5 bytes: events, JSON strings and characters cut anywhere.
    let server = fake(
        Flavor::Anthropic,
        vec![Reply::sse_chunks(fakes::split_bytes(&body, 5))],
    )
    .await;
    let items = run(&*client(Flavor::Anthropic, &server), request("list")).await;
    assert_thinking_first(&items);
    let reply = done(&items);
    assert_eq!(
        reply.thinking,
        [
            signed("The user wants the files: 世界 🤔", SIGNATURE),
            ThinkingBlock::RedactedThinking {
                data: REDACTED.into()
            },
            signed("Then list.", "sig-2"),
        ]
    );
    // What streams is the readable text: the blocks' text, a blank line between them.
    assert_eq!(
        thinking(&items).concat(),
        "The user wants the files: 世界 🤔\n\nThen list."
    );
    assert_eq!(reply.text, "Looking.");
    assert_eq!(deltas(&items).concat(), "Looking.");
    assert_eq!(
        reply.tool_calls,
        [ToolCall {
            id: "toolu_01".into(),
            name: "list_files".into(),
            arguments: json!({"path": "."}),
        }]
    );
    assert_eq!(reply.finish_reason, "tool_calls");
    assert_eq!(reply.usage, USAGE);
}

/// Stand-ins for the two halves of U+1F914 (🤔), put in a body as JSON escapes after it is
/// built, so that each half arrives in its own event.
const HIGH: char = '\u{E000}';
const LOW: char = '\u{E001}';

fn with_split_surrogates(body: &str) -> String {
    body.replace(HIGH, "\\ud83e").replace(LOW, "\\udd14")
}

#[tokio::test]
async fn anthropic_thinking_split_inside_characters_arrives_whole() {
    let pieces = [
        "héllo ",
        "世",
        &format!("界 {HIGH}"),
        &format!("{LOW} done"),
    ];
    let refs: Vec<&str> = pieces.iter().map(|p| p.as_ref()).collect();
    let body = with_split_surrogates(&blocks_reply(
        &[
            Block::Thinking {
                pieces: &refs,
                signature: SIGNATURE,
            },
            Block::Text(&["ok 🎉"]),
        ],
        "end_turn",
    ));
    let chunks = fakes::split_inside_chars(&body);
    assert!(chunks.len() > 8);
    let server = fake(Flavor::Anthropic, vec![Reply::sse_chunks(chunks)]).await;
    let items = run(&*client(Flavor::Anthropic, &server), request("utf8")).await;
    let text = "héllo 世界 🤔 done";
    assert_eq!(thinking(&items).concat(), text);
    assert!(
        thinking(&items).iter().all(|t| !t.contains('\u{FFFD}')),
        "{items:?}"
    );
    let reply = done(&items);
    assert_eq!(reply.thinking, [signed(text, SIGNATURE)]);
    assert_eq!(reply.text, "ok 🎉");
    assert_eq!(reply.finish_reason, "stop");
}

fn call(id: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: "list_files".into(),
        arguments: json!({"path": "."}),
    }
}

/// An earlier turn whose answer came with thinking, then the current turn in its tool-use
/// cycle: a reply that thought (signed, redacted, and reasoning without a signature) and
/// called a tool, and the tool's result.
fn history_with_thinking() -> ModelRequest<'static> {
    ModelRequest::owned(
        vec![
            Message::new(Role::System, "be brief"),
            Message::new(Role::User, "first"),
            Message::assistant("old answer", vec![]).with_thinking(vec![signed("old", "sig-old")]),
            Message::new(Role::User, "what is here?"),
            Message::assistant("Looking.", vec![call("toolu_01")]).with_thinking(vec![
                signed("Let me think: \"世界\" 🤔\n", SIGNATURE),
                ThinkingBlock::RedactedThinking {
                    data: REDACTED.into(),
                },
                ThinkingBlock::Thinking {
                    thinking: "unsigned".into(),
                    signature: None,
                },
            ]),
            Message::tool_result("toolu_01", "README.md"),
        ],
        vec![],
        Purpose::Turn,
    )
}

#[tokio::test]
async fn anthropic_with_a_budget_asks_for_thinking_and_sends_the_cycle_s_blocks_back_verbatim() {
    let sent = request_sent(
        Flavor::Anthropic,
        |cfg| cfg.thinking_budget = Some(2048),
        history_with_thinking(),
    )
    .await;
    assert_eq!(
        sent.body,
        json!({
            "model": "test-model",
            "max_tokens": 1024 + 2048,
            "stream": true,
            "system": "be brief",
            "thinking": {"type": "enabled", "budget_tokens": 2048},
            "messages": [
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": [{"type": "text", "text": "old answer"}]},
                {"role": "user", "content": "what is here?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Let me think: \"世界\" 🤔\n",
                     "signature": SIGNATURE},
                    {"type": "redacted_thinking", "data": REDACTED},
                    {"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "toolu_01", "name": "list_files",
                     "input": {"path": "."}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01", "content": "README.md"},
                ]},
            ],
        })
    );
}

#[tokio::test]
async fn anthropic_without_a_budget_neither_asks_for_thinking_nor_sends_it() {
    let sent = request_sent(Flavor::Anthropic, |_| {}, history_with_thinking()).await;
    assert_eq!(sent.body["max_tokens"], 1024);
    assert!(sent.body.get("thinking").is_none(), "{}", sent.body);
    let text = sent.body.to_string();
    assert!(
        !text.contains(SIGNATURE) && !text.contains(REDACTED) && !text.contains("\"thinking\""),
        "{text}"
    );
}

#[tokio::test]
async fn anthropic_with_a_budget_asks_for_thinking_in_a_new_turn() {
    let sent = request_sent(
        Flavor::Anthropic,
        |cfg| cfg.thinking_budget = Some(1024),
        request("hi"),
    )
    .await;
    assert_eq!(
        sent.body["thinking"],
        json!({"type": "enabled", "budget_tokens": 1024})
    );
    assert_eq!(sent.body["max_tokens"], 2048);
    assert_eq!(
        sent.body["messages"],
        json!([{"role": "user", "content": "hi"}])
    );
}

/// The reasoning keys of the servers that stream it: DeepSeek and llama.cpp, OpenRouter and
/// newer vLLM, and the vLLM versions that send both with the same text.
const REASONING_KEYS: [&[&str]; 3] = [
    &["reasoning_content"],
    &["reasoning"],
    &["reasoning", "reasoning_content"],
];

#[tokio::test]
async fn openai_reasoning_deltas_stream_as_thinking_and_are_kept() {
    for keys in REASONING_KEYS {
        let body = fakes::openai::reasoning_reply(
            keys,
            &["Hmm, ", "the user ", "says hi 🤔"],
            &["Hel", "lo!"],
            &[],
        );
        let server = fake(
            Flavor::OpenAi,
            vec![Reply::sse_chunks(fakes::split_bytes(&body, 7))],
        )
        .await;
        let items = run(&*client(Flavor::OpenAi, &server), request("hi")).await;
        assert_thinking_first(&items);
        assert_eq!(
            thinking(&items),
            ["Hmm, ", "the user ", "says hi 🤔"],
            "{keys:?}"
        );
        let reply = done(&items);
        assert_eq!(
            reply.thinking,
            [ThinkingBlock::Thinking {
                thinking: "Hmm, the user says hi 🤔".into(),
                signature: None,
            }],
            "{keys:?}: one unsigned block, each piece once"
        );
        assert_eq!(reply.text, "Hello!");
        assert_eq!(reply.finish_reason, "stop");
        assert_eq!(reply.usage, USAGE);
    }
}

#[tokio::test]
async fn openai_reasoning_split_inside_characters_arrives_whole_before_tool_calls() {
    for keys in REASONING_KEYS {
        let pieces = ["世", &format!("界 {HIGH}"), &format!("{LOW} é")];
        let refs: Vec<&str> = pieces.iter().map(|p| p.as_ref()).collect();
        let call = list_call();
        let body = with_split_surrogates(&fakes::openai::reasoning_reply(
            keys,
            &refs,
            &[],
            std::slice::from_ref(&call),
        ));
        let server = fake(
            Flavor::OpenAi,
            vec![Reply::sse_chunks(fakes::split_inside_chars(&body))],
        )
        .await;
        let items = run(&*client(Flavor::OpenAi, &server), request("utf8")).await;
        assert_eq!(thinking(&items).concat(), "世界 🤔 é", "{keys:?}");
        let reply = done(&items);
        assert_eq!(reply.thinking[0].text(), "世界 🤔 é");
        assert_eq!(reply.tool_calls.len(), 1);
        assert_eq!(reply.tool_calls[0].arguments, json!({"path": "."}));
        assert_eq!(reply.finish_reason, "tool_calls");
    }
}

#[tokio::test]
async fn openai_reasoning_is_never_sent_back() {
    let with = history_with_thinking();
    let mut without = with.clone();
    for m in &mut without.messages {
        m.to_mut().thinking.clear();
    }
    // A thinking budget is Anthropic's: an OpenAI-compatible request ignores it.
    let budget = |cfg: &mut HttpModelConfig| cfg.thinking_budget = Some(2048);
    let sent = request_sent(Flavor::OpenAi, budget, with).await;
    let plain = request_sent(Flavor::OpenAi, |_| {}, without).await;
    assert_eq!(sent.body, plain.body);
    let text = sent.body.to_string();
    for word in ["reasoning", "thinking", SIGNATURE, REDACTED, "unsigned"] {
        assert!(!text.contains(word), "{word} in {text}");
    }
    assert_eq!(sent.body["max_tokens"], 1024);
    let assistant: Vec<&Value> = sent.body["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["role"] == "assistant")
        .collect();
    assert_eq!(assistant[0]["content"], "old answer");
    assert_eq!(assistant[1]["content"], "Looking.");
}
