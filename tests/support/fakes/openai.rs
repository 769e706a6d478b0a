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

/// A reply of reasoning models behind OpenAI-compatible servers: the `pieces` of reasoning
/// under each of `keys` (`reasoning_content` for DeepSeek and llama.cpp, `reasoning` for
/// OpenRouter, both with the same text for some vLLM versions) with `content: null`, then the
/// text in `text` pieces and the tool calls as [`tool_calls_reply`] sends them.
pub fn reasoning_reply(
    keys: &[&str],
    pieces: &[&str],
    text: &[&str],
    calls: &[FakeToolCall],
) -> String {
    let mut out = String::new();
    let opening = |first: &str| {
        let mut delta = json!({"role": "assistant", "content": null});
        for key in keys {
            delta[*key] = json!(first);
        }
        delta
    };
    out.push_str(&chunk(opening(""), None));
    for piece in pieces {
        let mut delta = json!({"content": null});
        for key in keys {
            delta[*key] = json!(piece);
        }
        out.push_str(&chunk(delta, None));
    }
    for piece in text {
        let mut delta = json!({"content": piece});
        for key in keys {
            delta[*key] = Value::Null;
        }
        out.push_str(&chunk(delta, None));
    }
    // The rest is an ordinary reply without its opening chunk.
    let rest = if calls.is_empty() {
        text_reply(&[])
    } else {
        tool_calls_reply("", calls)
    };
    let rest = rest.split_once("\n\n").map_or("", |(_, rest)| rest);
    out.push_str(rest);
    out
}
