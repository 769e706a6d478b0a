//! SSE bodies in the Anthropic Messages streaming format.

use serde_json::{json, Value};

use super::FakeToolCall;

/// One typed event.
pub fn event(name: &str, data: Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

pub fn ping() -> String {
    event("ping", json!({"type": "ping"}))
}

pub fn message_start(input_tokens: u64) -> String {
    event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake",
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1},
        }}),
    )
}

pub fn text_start(index: usize) -> String {
    event(
        "content_block_start",
        json!({"type": "content_block_start", "index": index,
               "content_block": {"type": "text", "text": ""}}),
    )
}

pub fn text_delta(index: usize, text: &str) -> String {
    event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": index,
               "delta": {"type": "text_delta", "text": text}}),
    )
}

/// Opens a `tool_use` block; its input follows in [`input_delta`] pieces.
fn tool_start(index: usize, call: &FakeToolCall) -> String {
    event(
        "content_block_start",
        json!({"type": "content_block_start", "index": index, "content_block": {
            "type": "tool_use", "id": call.id, "name": call.name, "input": {},
        }}),
    )
}

fn input_delta(index: usize, piece: &str) -> String {
    event(
        "content_block_delta",
        json!({"type": "content_block_delta", "index": index,
               "delta": {"type": "input_json_delta", "partial_json": piece}}),
    )
}

pub fn block_stop(index: usize) -> String {
    event(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": index}),
    )
}

pub fn message_delta(stop_reason: &str, output_tokens: u64) -> String {
    event(
        "message_delta",
        json!({"type": "message_delta",
               "delta": {"stop_reason": stop_reason, "stop_sequence": null},
               "usage": {"output_tokens": output_tokens}}),
    )
}

pub fn message_stop() -> String {
    event("message_stop", json!({"type": "message_stop"}))
}

pub fn error(kind: &str, message: &str) -> String {
    event(
        "error",
        json!({"type": "error", "error": {"type": kind, "message": message}}),
    )
}

/// A text reply streamed in `pieces`, with a ping, ending with `end_turn`.
pub fn text_reply(pieces: &[&str]) -> String {
    let mut out = message_start(super::INPUT_TOKENS);
    out.push_str(&text_start(0));
    out.push_str(&ping());
    for piece in pieces {
        out.push_str(&text_delta(0, piece));
    }
    out.push_str(&block_stop(0));
    out.push_str(&message_delta("end_turn", super::OUTPUT_TOKENS));
    out.push_str(&message_stop());
    out
}

/// A reply with optional text then `tool_use` blocks whose input arrives as
/// `input_json_delta` pieces, ending with `tool_use`.
pub fn tool_calls_reply(text: &str, calls: &[FakeToolCall]) -> String {
    let mut out = message_start(super::INPUT_TOKENS);
    let mut index = 0;
    if !text.is_empty() {
        out.push_str(&text_start(0));
        out.push_str(&text_delta(0, text));
        out.push_str(&block_stop(0));
        index = 1;
    }
    for call in calls {
        out.push_str(&tool_start(index, call));
        out.push_str(&ping());
        for piece in &call.argument_pieces {
            out.push_str(&input_delta(index, piece));
        }
        out.push_str(&block_stop(index));
        index += 1;
    }
    out.push_str(&message_delta("tool_use", super::OUTPUT_TOKENS));
    out.push_str(&message_stop());
    out
}

/// A content block of a scripted reply with extended thinking.
#[derive(Debug, Clone, Copy)]
pub enum Block<'a> {
    /// A `thinking` block: its text in `thinking_delta` pieces, then one `signature_delta`.
    Thinking {
        pieces: &'a [&'a str],
        signature: &'a str,
    },
    /// A `redacted_thinking` block: its opaque `data` arrives whole in `content_block_start`.
    Redacted(&'a str),
    /// A `text` block in `text_delta` pieces.
    Text(&'a [&'a str]),
    /// A `tool_use` block whose input arrives in `input_json_delta` pieces.
    Tool(&'a FakeToolCall),
}

/// A reply of `blocks` as the API streams it with thinking enabled (a thinking block opens
/// with empty `thinking` and `signature`), ending with `stop_reason`.
pub fn blocks_reply(blocks: &[Block<'_>], stop_reason: &str) -> String {
    let mut out = message_start(super::INPUT_TOKENS);
    for (index, block) in blocks.iter().enumerate() {
        match block {
            Block::Thinking { pieces, signature } => {
                out.push_str(&event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": index,
                           "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
                ));
                for piece in *pieces {
                    out.push_str(&event(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": index,
                               "delta": {"type": "thinking_delta", "thinking": piece}}),
                    ));
                }
                out.push_str(&event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": index,
                           "delta": {"type": "signature_delta", "signature": signature}}),
                ));
            }
            Block::Redacted(data) => out.push_str(&event(
                "content_block_start",
                json!({"type": "content_block_start", "index": index,
                       "content_block": {"type": "redacted_thinking", "data": data}}),
            )),
            Block::Text(pieces) => {
                out.push_str(&text_start(index));
                for piece in *pieces {
                    out.push_str(&text_delta(index, piece));
                }
            }
            Block::Tool(call) => {
                out.push_str(&tool_start(index, call));
                for piece in &call.argument_pieces {
                    out.push_str(&input_delta(index, piece));
                }
            }
        }
        out.push_str(&block_stop(index));
        if index == 0 {
            out.push_str(&ping());
        }
    }
    out.push_str(&message_delta(stop_reason, super::OUTPUT_TOKENS));
    out.push_str(&message_stop());
    out
}

/// What breaks the API's rules for extended thinking in a request body, if anything: the
/// budget is at least 1024 tokens and below `max_tokens`; a thinking block sent back has its
/// text and a signature, a redacted one its data; and with thinking enabled, the last
/// assistant message, when the request answers its tool calls, starts with a thinking block.
pub fn thinking_violation(body: &Value) -> Option<String> {
    let messages = body["messages"].as_array()?;
    for (i, m) in messages.iter().enumerate() {
        for block in m["content"].as_array().into_iter().flatten() {
            let broken = match block["type"].as_str() {
                Some("thinking") => {
                    !block["thinking"].is_string()
                        || block["signature"].as_str().is_none_or(str::is_empty)
                }
                Some("redacted_thinking") => block["data"].as_str().is_none_or(str::is_empty),
                _ => false,
            };
            if broken {
                return Some(format!(
                    "messages.{i}: a thinking block is not as sent: {block}"
                ));
            }
        }
    }
    let thinking = &body["thinking"];
    if thinking.is_null() {
        return None;
    }
    let budget = thinking["budget_tokens"].as_u64().unwrap_or(0);
    if thinking["type"] != "enabled" || budget < 1024 {
        return Some(format!(
            "thinking: {thinking} is not enabled with at least 1024 tokens"
        ));
    }
    let max_tokens = body["max_tokens"].as_u64().unwrap_or(0);
    if max_tokens <= budget {
        return Some(format!(
            "`max_tokens` ({max_tokens}) must be greater than `thinking.budget_tokens` ({budget})"
        ));
    }
    let answers_tools = messages.last().is_some_and(|m| {
        m["role"] == "user"
            && m["content"]
                .as_array()
                .is_some_and(|c| c.iter().any(|b| b["type"] == "tool_result"))
    });
    let assistant = messages.iter().rposition(|m| m["role"] == "assistant");
    if let (true, Some(at)) = (answers_tools, assistant) {
        let first = &messages[at]["content"][0]["type"];
        if first != "thinking" && first != "redacted_thinking" {
            return Some(format!(
                "messages.{at}.content.0.type: Expected `thinking` or `redacted_thinking`, but \
                 found {first}. When `thinking` is enabled, a final `assistant` message must \
                 start with a thinking block"
            ));
        }
    }
    None
}
