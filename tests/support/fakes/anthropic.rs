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
        out.push_str(&event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": {
                "type": "tool_use", "id": call.id, "name": call.name, "input": {},
            }}),
        ));
        out.push_str(&ping());
        for piece in &call.argument_pieces {
            out.push_str(&event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                       "delta": {"type": "input_json_delta", "partial_json": piece}}),
            ));
        }
        out.push_str(&block_stop(index));
        index += 1;
    }
    out.push_str(&message_delta("tool_use", super::OUTPUT_TOKENS));
    out.push_str(&message_stop());
    out
}
