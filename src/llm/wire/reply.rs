//! Reading a reply: the [`EventParser`] a dialect implements for its events, the
//! [`ReplyDraft`] both assemble their text, usage and finish reason in, and the helpers both
//! parse with (JSON payloads, tool-call arguments, a provider's error message).

use eventsource_stream::Event;
use serde_json::Value;

use super::Failure;
use crate::llm::guard;
use crate::llm::ModelReply;
use crate::model::{ToolCall, Usage};

/// Reads one provider's SSE events into a reply. A fresh parser is made for every attempt.
pub(crate) trait EventParser: Send + 'static {
    /// Handles one event. Text to stream goes into `deltas`; returns the reply once the
    /// provider marked it complete.
    fn event(
        &mut self,
        event: &Event,
        deltas: &mut Vec<String>,
    ) -> Result<Option<ModelReply>, Failure>;

    /// Whether the provider already said why the reply stopped, so that a body ending without
    /// an end marker still carries the whole reply.
    fn is_complete(&self) -> bool;

    /// The reply assembled so far.
    fn finish(&mut self) -> ModelReply;

    /// The body ended without an end marker: the reply if what arrived is complete, otherwise
    /// a (retryable) broken-stream failure.
    fn end(&mut self) -> Result<ModelReply, Failure> {
        if self.is_complete() {
            Ok(self.finish())
        } else {
            Err(Failure::broken_stream())
        }
    }
}

/// What both dialects assemble alike while reading a reply: its text (a character the provider
/// split across two events joined again), its usage, and why it stopped.
#[derive(Default)]
pub(crate) struct ReplyDraft {
    text: String,
    joiner: guard::Utf16Joiner,
    /// Normalised to `stop`, `tool_calls`, `length`, …; `None` until the provider says.
    pub finish_reason: Option<String>,
    pub usage: Usage,
}

impl ReplyDraft {
    /// Appends a piece of streamed text; what can be shown of it goes into `deltas`.
    pub fn push_text(&mut self, text: &str, deltas: &mut Vec<String>) {
        let text = self.joiner.push(text);
        if !text.is_empty() {
            self.text.push_str(&text);
            deltas.push(text.into_owned());
        }
    }

    /// The reply with `tool_calls`. Without a finish reason from the provider it is
    /// `tool_calls` when the model called tools, `stop` otherwise.
    pub fn finish(&mut self, tool_calls: Vec<ToolCall>) -> ModelReply {
        let finish_reason = self.finish_reason.take().unwrap_or_else(|| {
            if tool_calls.is_empty() {
                "stop"
            } else {
                "tool_calls"
            }
            .to_string()
        });
        self.text.push_str(self.joiner.finish());
        ModelReply {
            text: std::mem::take(&mut self.text),
            tool_calls,
            finish_reason,
            usage: self.usage,
        }
    }
}

/// Parses an event's JSON payload, or fails with a protocol error naming the bad chunk. Lone
/// surrogate escapes (half of a character the provider split across chunks) are kept as
/// stand-ins for [`guard::Utf16Joiner`].
pub(crate) fn parse_json(data: &str) -> Result<Value, Failure> {
    serde_json::from_str(&guard::escape_lone_surrogates(data)).map_err(|e| {
        Failure::protocol(format!(
            "malformed JSON in stream chunk ({e}): {}",
            truncate(data, 200)
        ))
    })
}

/// Parses assembled tool-call arguments; text that is not JSON is kept raw as a string.
pub(crate) fn parse_arguments(raw: &str) -> Value {
    let raw = guard::join_halves(raw);
    if raw.trim().is_empty() {
        return Value::Object(Default::default());
    }
    serde_json::from_str(&raw).unwrap_or(Value::String(raw))
}

/// The first `max` characters of `text`, with an ellipsis when cut.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// The human-readable message inside a provider's error body (`{"error": {"message": …}}` and
/// the like), or the trimmed body itself.
pub(crate) fn error_message(body: &str) -> String {
    let from_json = serde_json::from_str::<Value>(body).ok().and_then(|v| {
        let err = v.get("error").unwrap_or(&v);
        err.get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| err.as_str().map(str::to_string))
            .or_else(|| v.get("message").and_then(Value::as_str).map(str::to_string))
            .or_else(|| v.get("detail").and_then(Value::as_str).map(str::to_string))
    });
    from_json.unwrap_or_else(|| body.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_are_extracted_and_truncated() {
        assert_eq!(
            error_message(r#"{"error":{"message":"bad key","type":"x"}}"#),
            "bad key"
        );
        assert_eq!(
            error_message(
                r#"{"type":"error","error":{"type":"not_found_error","message":"model: x"}}"#
            ),
            "model: x"
        );
        assert_eq!(error_message(" plain text \n"), "plain text");
        assert_eq!(truncate("héllo", 2), "hé…");
        assert_eq!(truncate("hé", 2), "hé");
    }

    #[test]
    fn arguments_keep_invalid_json_raw() {
        assert_eq!(parse_arguments(r#"{"a":1}"#), serde_json::json!({"a": 1}));
        assert_eq!(parse_arguments(""), serde_json::json!({}));
        assert_eq!(parse_arguments("{oops"), Value::String("{oops".into()));
    }
}
