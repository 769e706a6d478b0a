//! Messages: the model-visible history of a session, append-only and indexed from 0.

use std::sync::OnceLock;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "system" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            _ => return None,
        })
    }
}

/// A tool call requested by the model. `arguments` is the parsed JSON object the model sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

/// A piece of the reasoning a model produced before its answer, as the provider sent it.
///
/// Anthropic signs each `thinking` block and encrypts some reasoning as `redacted_thinking`;
/// both must go back to it unchanged (text, signature, order) in the later requests of a turn
/// with tool use, and the signature is what makes a block fit to be sent back. Reasoning from
/// OpenAI-compatible servers (`reasoning_content`, `reasoning`) has no signature and is never
/// sent back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ThinkingBlock {
    Thinking {
        thinking: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// Reasoning the provider encrypted: `data` is opaque and only goes back to it.
    RedactedThinking { data: String },
}

impl ThinkingBlock {
    /// The readable text of the block (none for a redacted one).
    pub fn text(&self) -> &str {
        match self {
            ThinkingBlock::Thinking { thinking, .. } => thinking,
            ThinkingBlock::RedactedThinking { .. } => "",
        }
    }

    /// True for a block the provider can check again: a signed or a redacted one.
    pub fn is_signed(&self) -> bool {
        match self {
            ThinkingBlock::Thinking { signature, .. } => {
                signature.as_deref().is_some_and(|s| !s.is_empty())
            }
            ThinkingBlock::RedactedThinking { .. } => true,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub index: i64,
    pub role: Role,
    pub content: String,
    /// The reasoning that came with an assistant message, in the order it was produced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thinking: Vec<ThinkingBlock>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    pub created_at: DateTime<Utc>,
    /// [`Message::size_chars`], counted once: a history is measured at every step of the loop,
    /// and most of it never changes. A message built from another one with a different
    /// `content` or `tool_calls` takes a fresh `SizeCache::default()`.
    #[serde(skip)]
    pub size: SizeCache,
}

/// A message's size once counted. It is not part of the message's value: messages compare
/// equal whatever their caches hold, and it is never serialised.
#[derive(Default)]
pub struct SizeCache(OnceLock<usize>);

impl Clone for SizeCache {
    fn clone(&self) -> SizeCache {
        match self.0.get() {
            Some(&size) => SizeCache(OnceLock::from(size)),
            None => SizeCache::default(),
        }
    }
}

impl PartialEq for SizeCache {
    fn eq(&self, _: &SizeCache) -> bool {
        true
    }
}

impl std::fmt::Debug for SizeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SizeCache")
    }
}

/// The prefix that marks a compaction summary (a `system` message inside the history).
pub const SUMMARY_PREFIX: &str = "[Summary of the earlier conversation]";

/// What starts a user message's line in the transcript a summariser is given (and nothing
/// else starts a line with it there).
pub const TRANSCRIPT_USER_MARKER: &str = "user: ";

/// So that functions over messages take owned and borrowed ones (`Cow<Message>`) alike.
impl AsRef<Message> for Message {
    fn as_ref(&self) -> &Message {
        self
    }
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Message {
        Message {
            index: 0,
            role,
            content: content.into(),
            thinking: Vec::new(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            created_at: super::now(),
            size: SizeCache::default(),
        }
    }

    pub fn assistant(content: impl Into<String>, tool_calls: Vec<ToolCall>) -> Message {
        Message {
            tool_calls,
            ..Message::new(Role::Assistant, content)
        }
    }

    /// The message with the reasoning that came with it.
    pub fn with_thinking(self, thinking: Vec<ThinkingBlock>) -> Message {
        Message { thinking, ..self }
    }

    /// The readable reasoning of the message: the text of its thinking blocks, one paragraph
    /// per block.
    pub fn thinking_text(&self) -> String {
        let texts: Vec<&str> = self
            .thinking
            .iter()
            .map(ThinkingBlock::text)
            .filter(|t| !t.is_empty())
            .collect();
        texts.join("\n\n")
    }

    pub fn tool_result(call_id: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            tool_call_id: Some(call_id.into()),
            ..Message::new(Role::Tool, content)
        }
    }

    /// True for a compaction summary: a system message that starts with [`SUMMARY_PREFIX`].
    pub fn is_summary(&self) -> bool {
        self.role == Role::System && self.content.starts_with(SUMMARY_PREFIX)
    }

    /// The size that counts against a context budget: characters of the content plus the JSON
    /// of the tool calls. Counted at the first call, then kept.
    pub fn size_chars(&self) -> usize {
        *self.size.0.get_or_init(|| self.count_chars())
    }

    fn count_chars(&self) -> usize {
        let calls = if self.tool_calls.is_empty() {
            0
        } else {
            // Counted as it is written, without building the string.
            let mut counter = CharCounter(0);
            match serde_json::to_writer(&mut counter, &self.tool_calls) {
                Ok(()) => counter.0,
                Err(_) => 0,
            }
        };
        self.content.chars().count() + calls
    }
}

/// Counts the characters of the UTF-8 written to it.
struct CharCounter(usize);

impl std::io::Write for CharCounter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // Every byte but a continuation byte (0b10xx_xxxx) starts a character.
        self.0 += buf.iter().filter(|&&b| (b as i8) >= -0x40).count();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A tool as the model sees it: a name, a description and a JSON Schema for its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSchema {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_size_counts_characters_of_the_content_and_the_calls_as_json() {
        let calls = vec![ToolCall {
            id: "c1".into(),
            name: "write_file".into(),
            arguments: serde_json::json!({"path": "é.txt", "content": "日本語 🎉 \"q\"\n"}),
        }];
        let message = Message::assistant("héllo", calls.clone());
        let json = serde_json::to_string(&calls).unwrap();
        assert_eq!(message.size_chars(), 5 + json.chars().count());
        assert_ne!(
            json.chars().count(),
            json.len(),
            "the case has multi-byte characters"
        );
    }

    #[test]
    fn a_counted_size_is_kept_by_clones_and_left_out_of_the_value() {
        let message = Message::new(Role::User, "héllo");
        assert_eq!(message.size_chars(), 5);
        let copy = message.clone();
        assert_eq!(copy.size.0.get(), Some(&5), "the clone keeps the count");
        let changed = Message {
            content: "a longer text".into(),
            size: SizeCache::default(),
            ..message.clone()
        };
        assert_eq!(changed.size_chars(), 13);
        let uncounted = Message {
            size: SizeCache::default(),
            ..message.clone()
        };
        assert_eq!(uncounted, message, "caches do not take part in equality");
        let json = serde_json::to_value(&message).unwrap();
        assert!(json.get("size").is_none(), "{json}");
        let back: Message = serde_json::from_value(json).unwrap();
        assert_eq!(back.size_chars(), 5);
    }
}
