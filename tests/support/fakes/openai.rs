//! SSE bodies in the OpenAI Chat Completions streaming format.

use serde_json::{json, Value};

use super::FakeToolCall;

pub const DONE: &str = "data: [DONE]\n\n";

/// One `data:` chunk with a choice carrying `delta` and `finish_reason`.
pub fn chunk(delta: Value, finish_reason: Option<&str>) -> String {
    data(json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "fake",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        "usage": null,
    }))
}

/// The final usage chunk (`choices: []`).
pub fn usage_chunk(prompt_tokens: u64, completion_tokens: u64) -> String {
    data(json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "fake",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }))
}

pub fn data(value: Value) -> String {
    format!("data: {value}\n\n")
}

/// A text reply streamed in `pieces`, then `stop`, the usage chunk and `[DONE]`.
pub fn text_reply(pieces: &[&str]) -> String {
    let mut out = chunk(json!({"role": "assistant", "content": ""}), None);
    for piece in pieces {
        out.push_str(&chunk(json!({"content": piece}), None));
    }
    out.push_str(&chunk(json!({}), Some("stop")));
    out.push_str(&usage_chunk(super::INPUT_TOKENS, super::OUTPUT_TOKENS));
    out.push_str(DONE);
    out
}

/// A reply with optional text and tool calls: the first fragment of each call carries its
/// id and name, later ones the argument pieces; then `tool_calls`, usage and `[DONE]`.
pub fn tool_calls_reply(text: &str, calls: &[FakeToolCall]) -> String {
    let mut out = chunk(json!({"role": "assistant", "content": null}), None);
    if !text.is_empty() {
        out.push_str(&chunk(json!({"content": text}), None));
    }
    for (index, call) in calls.iter().enumerate() {
        out.push_str(&chunk(
            json!({"tool_calls": [{
                "index": index,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }]}),
            None,
        ));
        for piece in &call.argument_pieces {
            out.push_str(&chunk(
                json!({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}),
                None,
            ));
        }
    }
    out.push_str(&chunk(json!({}), Some("tool_calls")));
    out.push_str(&usage_chunk(super::INPUT_TOKENS, super::OUTPUT_TOKENS));
    out.push_str(DONE);
    out
}
