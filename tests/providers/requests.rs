//! The exact requests each dialect sends: path, headers and body for a history with tool calls
//! and tool results, without a key or tools, and with a base URL that ends in `/v1`.

use std::borrow::Cow;

use serde_json::{json, Value};
use tah::model::{ToolCall, ToolSchema};

use tah::llm::wire::HttpModelConfig;
use tah::llm::ModelRequest;

use crate::providers::*;
use crate::support::fakes::Flavor;

/// The history of the request-shape tests: system, user, assistant with two tool calls, two
/// tool results, user.
fn shaped_request() -> ModelRequest<'static> {
    ModelRequest::owned(
        vec![
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
        vec![ToolSchema {
            name: "list_files".into(),
            description: "List files.".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        }],
        Purpose::Turn,
    )
}

/// A request body: what both dialects send of the model, the reply's token limit and
/// streaming, and `rest`.
fn body_with(rest: Value) -> Value {
    let mut body = json!({"model": "test-model", "max_tokens": 1024, "stream": true});
    if let (Some(body), Value::Object(rest)) = (body.as_object_mut(), rest) {
        body.extend(rest);
    }
    body
}

#[tokio::test]
async fn openai_request_shape() {
    let sent = request_sent(Flavor::OpenAi, |_| {}, shaped_request()).await;
    assert_eq!(sent.path, "/v1/chat/completions");
    assert_eq!(sent.headers["authorization"], format!("Bearer {KEY}"));
    assert_eq!(sent.headers["content-type"], "application/json");
    assert_eq!(
        sent.body,
        body_with(json!({
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
        }))
    );

    // Without a key no Authorization header is sent; without tools no `tools` field; an
    // assistant message with only tool calls has `content: null`.
    let mut req = shaped_request();
    req.tools.clear();
    req.messages[2].to_mut().content.clear();
    let sent = request_sent(Flavor::OpenAi, |cfg| cfg.api_key = None, req).await;
    assert!(!sent.headers.contains_key("authorization"));
    assert!(sent.body.get("tools").is_none());
    // The reply's token limit is always sent (a compatible server otherwise has none).
    assert_eq!(sent.body["max_tokens"], 1024);
    assert_eq!(sent.body["messages"][2]["content"], Value::Null);
}

#[tokio::test]
async fn anthropic_request_shape() {
    let sent = request_sent(Flavor::Anthropic, |_| {}, shaped_request()).await;
    assert_eq!(sent.path, "/v1/messages");
    assert_eq!(sent.headers["x-api-key"], KEY);
    assert_eq!(sent.headers["anthropic-version"], "2023-06-01");
    assert_eq!(sent.headers["content-type"], "application/json");
    assert!(!sent.headers.contains_key("authorization"));
    assert_eq!(
        sent.body,
        body_with(json!({
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
        }))
    );
    let roles: Vec<&str> = sent.body["messages"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["role"].as_str()).collect())
        .unwrap_or_default();
    assert!(roles.windows(2).all(|w| w[0] != w[1]), "{roles:?}");

    // Several system messages (a compaction summary) are joined; non-object arguments become
    // `{}`; no tools means no `tools` field.
    let mut req = shaped_request();
    req.tools.clear();
    req.messages
        .insert(1, Cow::Owned(Message::new(Role::System, "Summary.")));
    req.messages[3].to_mut().tool_calls[0].arguments = Value::String("{broken".into());
    req.messages[3].to_mut().content.clear();
    let body = &request_sent(Flavor::Anthropic, |_| {}, req).await.body;
    assert_eq!(body["system"], "You are helpful.\n\nSummary.");
    assert!(body.get("tools").is_none());
    assert_eq!(
        body["messages"][1]["content"][0],
        json!({"type": "tool_use", "id": "call_1", "name": "list_files", "input": {}})
    );
}

#[tokio::test]
async fn anthropic_base_url_with_v1_suffix_works() {
    let with_v1 = |cfg: &mut HttpModelConfig| cfg.base_url = format!("{}/v1/", cfg.base_url);
    let sent = request_sent(Flavor::Anthropic, with_v1, request("hi")).await;
    assert_eq!(sent.path, "/v1/messages");
}
