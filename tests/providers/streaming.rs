//! Streaming a reply: text in pieces with usage, tool calls whose arguments arrive split at odd
//! places, arguments that are not JSON, characters split across chunks, and a dropped stream
//! closing its connection.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use tah::model::ToolCall;

use crate::providers::*;
use crate::support::fakes::{self, FakeToolCall, Flavor, Reply};

for_each_provider!(
    text_reply_streams_in_pieces_with_usage,
    two_tool_calls_with_awkwardly_split_arguments,
    invalid_tool_arguments_are_kept_raw,
    multibyte_text_split_inside_characters,
    dropping_the_stream_closes_the_connection,
);

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
