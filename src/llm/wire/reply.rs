//! Reading a reply: the [`EventParser`] a dialect implements for its events, and the helpers
//! both dialects parse with (JSON payloads, tool-call arguments, a provider's error message).

use eventsource_stream::Event;
use serde_json::Value;

use super::Failure;
use crate::llm::guard;
use crate::llm::ModelReply;

/// Reads one provider's SSE events into a reply. A fresh parser is made for every attempt.
pub(crate) trait EventParser: Send + 'static {
    /// Handles one event. Text to stream goes into `deltas`; returns the reply once the
    /// provider marked it complete.
    fn event(
        &mut self,
        event: &Event,
        deltas: &mut Vec<String>,
    ) -> Result<Option<ModelReply>, Failure>;

    /// The body ended without an end marker: the reply if what arrived is complete, otherwise
    /// a (retryable) broken-stream failure.
    fn end(&mut self) -> Result<ModelReply, Failure>;
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
