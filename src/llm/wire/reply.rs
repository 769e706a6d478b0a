//! Reading a reply: the [`EventParser`] a dialect implements for its events, the
//! [`ReplyDraft`] both assemble their text, thinking, usage and finish reason in, and the
//! helpers both parse with (JSON payloads, tool-call arguments, a provider's error message).

use eventsource_stream::Event;
use serde_json::Value;

use super::Failure;
use crate::llm::guard;
use crate::llm::{ModelReply, StreamItem};
use crate::model::{ThinkingBlock, ToolCall, Usage};

/// A piece of a reply to stream as soon as it is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    Text(String),
    Thinking(String),
}

impl Piece {
    pub fn is_empty(&self) -> bool {
        match self {
            Piece::Text(text) | Piece::Thinking(text) => text.is_empty(),
        }
    }

    pub fn into_item(self) -> StreamItem {
        match self {
            Piece::Text(text) => StreamItem::Delta(text),
            Piece::Thinking(text) => StreamItem::Thinking(text),
        }
    }
}

/// Reads one provider's SSE events into a reply. A fresh parser is made for every attempt.
pub(crate) trait EventParser: Send + 'static {
    /// Handles one event. What is to be streamed goes into `pieces`; returns the reply once
    /// the provider marked it complete.
    fn event(
        &mut self,
        event: &Event,
        pieces: &mut Vec<Piece>,
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

/// What both dialects assemble alike while reading a reply: its text and the text of each
/// thinking block (a character the provider split across two events joined again), its usage,
/// and why it stopped.
#[derive(Default)]
pub(crate) struct ReplyDraft {
    text: String,
    joiner: guard::Utf16Joiner,
    thinking: Vec<ThinkingDraft>,
    /// Normalised to `stop`, `tool_calls`, `length`, …; `None` until the provider says.
    pub finish_reason: Option<String>,
    pub usage: Usage,
}

/// A thinking block being read, with the joiner of its own text.
struct ThinkingDraft {
    block: ThinkingBlock,
    joiner: guard::Utf16Joiner,
}

impl ReplyDraft {
    /// Appends a piece of streamed text; what can be shown of it goes into `pieces`.
    pub fn push_text(&mut self, text: &str, pieces: &mut Vec<Piece>) {
        let text = self.joiner.push(text);
        if !text.is_empty() {
            self.text.push_str(&text);
            pieces.push(Piece::Text(text.into_owned()));
        }
    }

    /// Starts a thinking block with the text and signature it opens with; returns its
    /// position for [`ReplyDraft::push_thinking`] and [`ReplyDraft::push_signature`].
    pub fn start_thinking(
        &mut self,
        text: &str,
        signature: &str,
        pieces: &mut Vec<Piece>,
    ) -> usize {
        self.thinking.push(ThinkingDraft {
            block: ThinkingBlock::Thinking {
                thinking: String::new(),
                signature: None,
            },
            joiner: guard::Utf16Joiner::default(),
        });
        let at = self.thinking.len() - 1;
        self.push_thinking(at, text, pieces);
        self.push_signature(at, signature);
        at
    }

    /// Appends streamed reasoning to the thinking block at `at`. The first piece of a block
    /// after one with text streams after a blank line, so that what streams is the readable
    /// text of the reply's thinking ([`crate::model::Message::thinking_text`]).
    pub fn push_thinking(&mut self, at: usize, text: &str, pieces: &mut Vec<Piece>) {
        let follows_text = self.thinking[..at.min(self.thinking.len())]
            .iter()
            .any(|d| !d.block.text().is_empty());
        let Some(draft) = self.thinking.get_mut(at) else {
            return;
        };
        let text = draft.joiner.push(text);
        if let (ThinkingBlock::Thinking { thinking, .. }, false) =
            (&mut draft.block, text.is_empty())
        {
            let piece = if thinking.is_empty() && follows_text {
                format!("\n\n{text}")
            } else {
                text.to_string()
            };
            thinking.push_str(&text);
            pieces.push(Piece::Thinking(piece));
        }
    }

    /// Appends to the signature of the thinking block at `at`.
    pub fn push_signature(&mut self, at: usize, piece: &str) {
        if piece.is_empty() {
            return;
        }
        if let Some(ThinkingDraft {
            block: ThinkingBlock::Thinking { signature, .. },
            ..
        }) = self.thinking.get_mut(at)
        {
            signature.get_or_insert_with(String::new).push_str(piece);
        }
    }

    /// Appends streamed reasoning to the reply's one unsigned block (OpenAI-compatible
    /// `reasoning_content` / `reasoning`), started on the first piece.
    pub fn push_reasoning(&mut self, text: &str, pieces: &mut Vec<Piece>) {
        if text.is_empty() {
            return;
        }
        match self.thinking.len() {
            0 => {
                self.start_thinking(text, "", pieces);
            }
            n => self.push_thinking(n - 1, text, pieces),
        }
    }

    /// Adds a block of reasoning the provider encrypted.
    pub fn push_redacted(&mut self, data: &str) {
        self.thinking.push(ThinkingDraft {
            block: ThinkingBlock::RedactedThinking {
                data: data.to_string(),
            },
            joiner: guard::Utf16Joiner::default(),
        });
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
        let thinking = std::mem::take(&mut self.thinking)
            .into_iter()
            .map(|mut draft| {
                if let ThinkingBlock::Thinking { thinking, .. } = &mut draft.block {
                    thinking.push_str(draft.joiner.finish());
                }
                draft.block
            })
            .collect();
        ModelReply {
            text: std::mem::take(&mut self.text),
            thinking,
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

    #[test]
    fn thinking_blocks_are_assembled_in_order_with_their_signatures() {
        let mut draft = ReplyDraft::default();
        let mut pieces = Vec::new();
        let stand_in = |json: &str| {
            let value = parse_json(json).expect("valid");
            value["t"].as_str().expect("text").to_string()
        };
        let at = draft.start_thinking("", "", &mut pieces);
        draft.push_thinking(at, &stand_in(r#"{"t":"hm \ud83e"}"#), &mut pieces);
        draft.push_thinking(at, &stand_in(r#"{"t":"\udd14 ok"}"#), &mut pieces);
        draft.push_signature(at, "sig");
        draft.push_signature(at, "-1");
        draft.push_redacted("opaque");
        draft.push_text("answer", &mut pieces);
        let reply = draft.finish(Vec::new());
        assert_eq!(
            reply.thinking,
            [
                ThinkingBlock::Thinking {
                    thinking: "hm 🤔 ok".into(),
                    signature: Some("sig-1".into()),
                },
                ThinkingBlock::RedactedThinking {
                    data: "opaque".into()
                },
            ]
        );
        assert_eq!(
            pieces,
            [
                Piece::Thinking("hm ".into()),
                Piece::Thinking("🤔 ok".into()),
                Piece::Text("answer".into()),
            ]
        );
    }

    #[test]
    fn reasoning_without_blocks_is_one_unsigned_block() {
        let mut draft = ReplyDraft::default();
        let mut pieces = Vec::new();
        draft.push_reasoning("", &mut pieces);
        draft.push_reasoning("one ", &mut pieces);
        draft.push_reasoning("two", &mut pieces);
        let reply = draft.finish(Vec::new());
        assert_eq!(
            reply.thinking,
            [ThinkingBlock::Thinking {
                thinking: "one two".into(),
                signature: None,
            }]
        );
        assert_eq!(pieces.len(), 2);
    }
}
